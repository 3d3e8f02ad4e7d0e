"""SASL/PLAIN authentication of a Kafka connection, with Pulsar tokens as passwords.

Theory of operation
-------------------
With ``authenticationEnabled``, a Kafka connection must authenticate before anything
else is served, as on a Kafka broker's SASL listener (``SaslServerAuthenticator``):

1. ApiVersions may come first; then SaslHandshake (KIP-43), whose mechanism must be
   ``PLAIN`` (else UNSUPPORTED_SASL_MECHANISM, with the mechanisms served, and the
   connection closes);
2. the PLAIN token (RFC 4616: ``authzid NUL username NUL password``) comes in a
   SaslAuthenticate request after a v1 handshake, unframed after a v0 one. The password
   is ``token:<jwt>``, the convention of Kafka-on-Pulsar (KoP); the token's role becomes
   the connection's principal. The username is free-form (KoP clients put the
   tenant/namespace there) and is logged. A wrong token is answered
   SASL_AUTHENTICATION_FAILED (58) with the reason, and the connection closes;
3. any other request before that ends the connection unanswered, as Kafka ends it
   ("Unexpected Kafka request of type ... during SASL handshake").

While authentication is off, SaslHandshake and SaslAuthenticate are answered
ILLEGAL_SASL_STATE, as a Kafka broker answers them on a PLAINTEXT listener.

:class:`SaslServer` is the state machine; it does no I/O.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from core.auth import AuthenticationError
from handlers.kafka._codec import Data, RequestReceived, SaslTokenReceived
from handlers.kafka._errors import ErrorCode

__all__ = ["MECHANISMS", "SaslReply", "SaslServer", "handle_sasl_disabled"]

log = logging.getLogger(__name__)

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
#: The mechanisms served.
MECHANISMS = ["PLAIN"]
#: The password prefix of KoP's convention: ``token:<jwt>``.
TOKEN_PREFIX = "token:"


class _State(enum.Enum):
    HANDSHAKE = "handshake"  # ApiVersions or SaslHandshake expected
    AUTHENTICATE = "authenticate"  # SaslAuthenticate expected (after a v1 handshake)
    TOKEN = "token"  # an unframed token expected (after a v0 handshake)
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class SaslReply:
    """What the session does with an event before authentication: ``serve`` it as any
    request (ApiVersions), or answer ``body`` (a response body; bytes: an unframed
    token) and then ``close`` the connection or not. ``body`` None with ``close``: close
    without an answer."""

    serve: bool = False
    body: Data | bytes | None = None
    close: bool = False


def handle_sasl_disabled(h: Any, req: RequestReceived) -> Data:
    """SaslHandshake or SaslAuthenticate on a connection that needs none (authentication
    off, or done): ILLEGAL_SASL_STATE."""
    if req.api_key == SASL_HANDSHAKE:
        return Data(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=MECHANISMS)
    return Data(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                error_message="SaslAuthenticate request received on a connection that does "
                              "not authenticate", auth_bytes=b"", session_lifetime_ms=0)


def parse_plain(token: bytes) -> tuple[str, str]:
    """The username and password of a PLAIN token (RFC 4616); ValueError for another
    shape."""
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the PLAIN token is not UTF-8") from None
    parts = text.split("\0")
    if len(parts) != 3 or not parts[1]:
        raise ValueError("the PLAIN token is not authzid NUL username NUL password")
    return parts[1], parts[2]


class SaslServer:
    """One connection's SASL state (see the module docs). ``auth`` is the broker's
    :class:`core.auth.AuthService`; ``peer`` names the client in the log."""

    def __init__(self, auth: Any, peer: str = ""):
        self.auth = auth
        self.peer = peer
        self._state = _State.HANDSHAKE
        #: The authenticated role, once authenticated.
        self.principal: str | None = None

    @property
    def authenticated(self) -> bool:
        return self._state is _State.AUTHENTICATED

    @property
    def expects_token(self) -> bool:
        """Whether the next frame is an unframed token (a v0 handshake was answered)."""
        return self._state is _State.TOKEN

    def receive(self, event: RequestReceived | SaslTokenReceived) -> SaslReply:
        """What to do with ``event``, received before authentication completed."""
        if isinstance(event, SaslTokenReceived):
            if self._state is not _State.TOKEN:
                return self._fail_closed("an unframed SASL token out of turn")
            ok, _ = self._authenticate(event.token)
            return SaslReply(body=b"", close=False) if ok else SaslReply(close=True)
        if self._state is _State.HANDSHAKE and event.api_key == API_VERSIONS:
            return SaslReply(serve=True)
        if self._state is _State.HANDSHAKE and event.api_key == SASL_HANDSHAKE:
            mechanism = event.body.mechanism
            if mechanism not in MECHANISMS:
                log.warning("kafka: %s asked for SASL mechanism %r; only %s is served", self.peer,
                            mechanism, ", ".join(MECHANISMS))
                self._state = _State.FAILED
                return SaslReply(body=Data(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                           mechanisms=MECHANISMS), close=True)
            self._state = _State.AUTHENTICATE if event.api_version >= 1 else _State.TOKEN
            return SaslReply(body=Data(error_code=ErrorCode.NONE, mechanisms=MECHANISMS))
        if self._state is _State.AUTHENTICATE and event.api_key == SASL_AUTHENTICATE:
            ok, reason = self._authenticate(event.body.auth_bytes)
            if ok:
                return SaslReply(body=Data(error_code=ErrorCode.NONE, error_message=None,
                                           auth_bytes=b"", session_lifetime_ms=0))
            return SaslReply(body=Data(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
                                       error_message=reason, auth_bytes=b"",
                                       session_lifetime_ms=0), close=True)
        return self._fail_closed(f"Unexpected Kafka request of type {event.api_name} during "
                                 "SASL handshake")

    def _fail_closed(self, why: str) -> SaslReply:
        log.warning("kafka: closing %s: %s", self.peer, why)
        self._state = _State.FAILED
        return SaslReply(close=True)

    def _authenticate(self, plain: bytes) -> tuple[bool, str]:
        """Check a PLAIN token; (True, "") and authenticated, or (False, why)."""
        try:
            username, password = parse_plain(plain)
            if not password.startswith(TOKEN_PREFIX):
                raise AuthenticationError("the password must be token:<jwt>")
            identity = self.auth.authenticate("token", password[len(TOKEN_PREFIX):])
        except (ValueError, AuthenticationError) as exc:
            reason = f"Authentication failed: {exc}"
            log.warning("kafka: %s: %s", self.peer, reason)
            self._state = _State.FAILED
            return False, reason
        self._state = _State.AUTHENTICATED
        self.principal = identity.role
        log.info("kafka: %s authenticated as %r with role %s", self.peer, username, identity.role)
        return True, ""
