"""Pulsar's token authentication (JWT) and its authorization of roles, for every protocol.

Theory of operation
-------------------
Authentication turns what a client presents into a *role*. As Pulsar's
``AuthenticationProviderToken``, a token is a signed JWT: checked with the broker's secret
key (``tokenSecretKey``, HMAC) or public key (``tokenPublicKey``, RSA or EC), its expiry
(``exp``) honoured, its audience checked when ``tokenAudienceClaim`` is set, and its role
read from ``tokenAuthClaim`` (``sub``). Keys are given as Pulsar gives them: ``file:///path``
(the key's bytes), ``data:;base64,...`` (a data URL), or the key's bytes in base64. A
secret key is raw bytes, as ``pulsar tokens create-secret-key --output`` writes it; a
public or private key is DER (X.509 SubjectPublicKeyInfo, PKCS#8), as ``create-key-pair``
writes them (PEM is accepted too).

Authorization answers what a role may do, as Pulsar's ``PulsarAuthorizationProvider``:
a super-user (``superUserRoles``) may do anything; a tenant's admin (its ``adminRoles``)
anything within the tenant; any other role what the namespace's permissions
(``namespaces grant-permission``) or the topic's (``topics grant-permission``) grant it:
``produce``, ``consume``, and a lookup with either; a subscription granted to roles
(``grant-subscription-permission``) is theirs alone, and a namespace whose
``subscription_auth_mode`` is Prefix lets a role use only subscriptions named after it.

The handlers and the web service call :class:`AuthService`; nothing here knows a protocol.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.naming import NamespaceName, TopicName, is_valid_name

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

# PyJWT and cryptography are imported where tokens are made or checked: a broker without
# authentication never loads them, which spares its start about 70 ms.

__all__ = [
    "AuthConfigError",
    "AuthService",
    "AuthenticationError",
    "Identity",
    "TOKEN_PROVIDER",
    "TokenVerifier",
    "create_key_pair",
    "create_secret_key",
    "create_token",
    "parse_relative_time",
    "read_key",
    "show_token",
]

log = logging.getLogger("magnetar.auth")

#: The one authentication provider Magnetar has (Pulsar's class name, as operators write it).
TOKEN_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
#: The ``auth_method_name`` a Pulsar client sends with a token.
TOKEN_METHOD = "token"

HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
#: The curve of each EC algorithm (a key pair created for it), by its name in cryptography.
_EC_CURVES = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}
#: HMAC key sizes, as jjwt's ``Keys.secretKeyFor``: the hash's output length.
_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}


class AuthenticationError(Exception):
    """What a client presented does not authenticate it; the message says why (logged;
    clients are told only what Pulsar tells them)."""


class AuthConfigError(ValueError):
    """The authentication configuration cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated client: its role, and when its credentials expire (None: never)."""

    role: str
    expires_at: float | None = None


# --------------------------------------------------------------------------------------
# Keys and tokens


def read_key(url: str) -> bytes:
    """A key as Pulsar's ``AuthTokenUtils.readKeyFromUrl`` reads it: ``file:`` URLs and
    paths give the file's bytes, ``data:`` URLs their (base64-decoded) content, ``env:NAME``
    an environment variable's value, and anything else is the key's bytes in base64.
    Raises ValueError for a key that cannot be read."""
    url = url.strip()
    if url.startswith("file:"):
        path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if url.startswith("data:"):
        meta, sep, payload = url[5:].partition(",")
        if not sep:
            raise ValueError("a data: URL needs a ',' before its content")
        if meta.endswith(";base64"):
            return _b64decode(payload)
        return urllib.parse.unquote_to_bytes(payload)
    if url.startswith("env:"):
        value = os.environ.get(url[4:])
        if value is None:
            raise ValueError(f"environment variable {url[4:]} is not set")
        return value.encode()
    return _b64decode(url)


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise ValueError("is not base64") from None


def create_secret_key(algorithm: str = "HS256") -> bytes:
    """A new random secret key for ``algorithm`` (HS256, HS384, HS512)."""
    if algorithm not in _SECRET_BYTES:
        raise ValueError(f"{algorithm} is not one of {', '.join(_SECRET_BYTES)}")
    return secrets.token_bytes(_SECRET_BYTES[algorithm])


def _ec_curve(algorithm: str) -> ec.EllipticCurve:
    """The curve an EC algorithm signs on (its class is named as the curve, in capitals)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    curve: ec.EllipticCurve = getattr(ec, _EC_CURVES[algorithm].upper())()
    return curve


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A new (private, public) key pair for ``algorithm``, DER-encoded (PKCS#8, X.509)
    as Pulsar writes them."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm in RSA_ALGORITHMS:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm in _EC_CURVES:
        key = ec.generate_private_key(_ec_curve(algorithm))
    else:
        raise ValueError(f"{algorithm} is not one of {', '.join(RSA_ALGORITHMS + EC_ALGORITHMS)}")
    private = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def _load_private_key(data: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization

    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_private_key(data, password=None)
        return serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"is not a private key: {exc}") from None


def _load_public_key(data: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization

    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_public_key(data)
        return serialization.load_der_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"is not a public key: {exc}") from None


def _asymmetric_algorithms(key: Any) -> tuple[str, ...]:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return RSA_ALGORITHMS
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return EC_ALGORITHMS
    raise ValueError("is neither an RSA nor an EC key")


_RELATIVE_TIME = re.compile(r"^\s*(\d+)\s*([smhdwy]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_relative_time(text: str) -> int:
    """Seconds in a relative time as Pulsar's ``RelativeTimeUtil`` reads it: a number with
    an optional unit s, m, h, d, w or y (``1y``, ``30m``)."""
    m = _RELATIVE_TIME.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a relative time such as 30s, 10m, 1h, 3d, 2w, 1y")
    return int(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def create_token(key: bytes, subject: str, *, private_key: bool = False,
                 algorithm: str | None = None, expires_in: float | None = None,
                 claims: dict[str, Any] | None = None) -> str:
    """A token for ``subject`` signed with ``key`` (a secret key's bytes, or a private key
    when ``private_key``), expiring ``expires_in`` seconds from now (None: never), as
    ``pulsar tokens create`` makes one."""
    import jwt

    payload: dict[str, Any] = {"sub": subject, **(claims or {})}
    if expires_in is not None:
        payload["exp"] = int(time.time() + expires_in)
    if private_key:
        signing = _load_private_key(key)
        allowed = _asymmetric_algorithms(signing)
        alg = algorithm or allowed[0]
        if alg not in allowed:
            raise ValueError(f"{alg} does not sign with this key (use one of {', '.join(allowed)})")
        if alg in _EC_CURVES and signing.curve.name != _EC_CURVES[alg]:
            alg = next(a for a, c in _EC_CURVES.items() if c == signing.curve.name)
        return jwt.encode(payload, signing, algorithm=alg)
    alg = algorithm or "HS256"
    if alg not in HMAC_ALGORITHMS:
        raise ValueError(f"{alg} is not one of {', '.join(HMAC_ALGORITHMS)}")
    try:
        return jwt.encode(payload, key, algorithm=alg)
    except jwt.PyJWTError as exc:
        raise ValueError(f"the key cannot sign {alg} tokens: {exc}") from None


def show_token(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A token's header and claims, unverified (``pulsar tokens show``)."""
    import jwt

    try:
        return jwt.get_unverified_header(token), jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise ValueError(f"not a token: {exc}") from None


class TokenVerifier:
    """Verifies tokens with one key: a secret (HMAC) or a public key (RSA, EC) of the
    family of ``public_alg`` when given (a token signed by any algorithm of that family
    passes)."""

    def __init__(self, *, secret_key: bytes | None = None, public_key: bytes | None = None,
                 public_alg: str | None = None, role_claim: str = "sub", audience_claim: str = "",
                 audience: str = ""):
        if secret_key is not None:
            if len(secret_key) < 32:
                # jjwt's Keys.hmacShaKeyFor: an HMAC-SHA key needs at least 256 bits.
                raise ValueError(f"is {len(secret_key) * 8} bits; a secret key needs at least 256")
            self._key: Any = secret_key
            self._algorithms: tuple[str, ...] = HMAC_ALGORITHMS
        elif public_key is not None:
            self._key = _load_public_key(public_key)
            self._algorithms = _asymmetric_algorithms(self._key)
            if public_alg is not None and public_alg not in self._algorithms:
                raise ValueError(f"is not a key for {public_alg} (tokenPublicAlg)")
        else:
            raise ValueError("no key to verify tokens with")
        self.role_claim = role_claim or "sub"
        self.audience_claim = audience_claim
        self.audience = audience

    def verify(self, token: str) -> Identity:
        """The identity ``token`` proves; raises :class:`AuthenticationError` for a blank,
        malformed, wrongly signed or expired token, one for another audience, or one
        without the role claim."""
        import jwt

        token = token.strip()
        if not token:
            raise AuthenticationError("Blank token found")
        try:
            claims = jwt.decode(token, self._key, algorithms=list(self._algorithms),
                                options={"verify_aud": False, "require": []})
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"Failed to authentication token: {exc}") from None
        if self.audience_claim:
            got = claims.get(self.audience_claim)
            audiences = got if isinstance(got, list) else [got] if isinstance(got, str) else None
            if audiences is None:
                raise AuthenticationError(
                    f"Failed to authentication token: Found null Audience in token, for claimed "
                    f"field: {self.audience_claim}")
            if self.audience not in audiences:
                raise AuthenticationError(f"Audiences in token: [{', '.join(map(str, audiences))}] "
                                          f"not contains this broker: {self.audience}")
        role = claims.get(self.role_claim)
        if not isinstance(role, str) or not role:
            raise AuthenticationError(f"The token has no role in its claim {self.role_claim!r}")
        exp = claims.get("exp")
        return Identity(role, float(exp) if isinstance(exp, (int, float)) else None)


# --------------------------------------------------------------------------------------
# The service


def _names(value: Any) -> list[str]:
    """A list key's value: as the configuration parsed it, or a comma-separated string."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return list(value or ())


def _key_from_config(name: str, value: str) -> bytes:
    try:
        return read_key(value)
    except ValueError as exc:
        raise AuthConfigError(f"{name}: {exc}") from None


class AuthService:
    """The broker's authentication and authorization, from its configuration (Pulsar's
    keys) and the policies in the metadata store (``policies``: a
    :class:`core.policies.PolicyStore`). Raises :class:`AuthConfigError` for a
    configuration that cannot be served."""

    def __init__(self, config: Any, policies: Any):
        self.policies = policies
        self.authentication_enabled = bool(config.get("authenticationEnabled", False))
        self.authorization_enabled = bool(config.get("authorizationEnabled", False))
        self.super_users = frozenset(_names(config.get("superUserRoles")))
        self.anonymous_role = str(config.get("anonymousUserRole") or "") or None
        self.verifier: TokenVerifier | None = None
        if self.authorization_enabled and not self.authentication_enabled:
            raise AuthConfigError("authorizationEnabled: authorization needs authenticationEnabled=true "
                                  "(roles come from authentication)")
        if not self.authentication_enabled:
            return
        for provider in _names(config.get("authenticationProviders")):
            if provider != TOKEN_PROVIDER:
                raise AuthConfigError(
                    f"authenticationProviders: {provider} is not available; only token "
                    f"authentication is ({TOKEN_PROVIDER})")
        secret, public = str(config.get("tokenSecretKey") or ""), str(config.get("tokenPublicKey") or "")
        audience_claim = str(config.get("tokenAudienceClaim") or "")
        audience = str(config.get("tokenAudience") or "")
        if audience_claim and not audience:
            raise AuthConfigError(f"tokenAudience: tokenAudienceClaim ({audience_claim}) is set, "
                                  "but not the audience that stands for this broker")
        if not secret and not public:
            raise AuthConfigError("authenticationEnabled: token authentication needs a key to "
                                  "verify tokens with: set tokenSecretKey or tokenPublicKey")
        name, value = ("tokenSecretKey", secret) if secret else ("tokenPublicKey", public)
        key = _key_from_config(name, value)
        try:
            self.verifier = TokenVerifier(
                secret_key=key if secret else None, public_key=None if secret else key,
                public_alg=str(config.get("tokenPublicAlg") or "RS256"),
                role_claim=str(config.get("tokenAuthClaim") or "sub"),
                audience_claim=audience_claim, audience=audience)
        except ValueError as exc:
            raise AuthConfigError(f"{name}: {value!r} {exc}") from None

    # -- authentication -----------------------------------------------------------------

    def authenticate(self, method: str | None, data: bytes | str | None) -> Identity:
        """The identity of a client that sent ``method`` (Pulsar's ``auth_method_name``)
        and ``data``. No method: the anonymous role when there is one. Raises
        :class:`AuthenticationError`."""
        if not method or method == "none":
            if self.anonymous_role is not None:
                return Identity(self.anonymous_role)
            raise AuthenticationError(f"Unsupported authentication mode: {method or 'none'}")
        if method != TOKEN_METHOD:
            raise AuthenticationError(f"Unsupported authentication mode: {method}")
        assert self.verifier is not None
        if isinstance(data, (bytes, bytearray)):
            try:
                data = bytes(data).decode("utf-8")
            except UnicodeDecodeError:
                raise AuthenticationError("The token is not UTF-8 text") from None
        return self.verifier.verify(data or "")

    def authenticate_http(self, authorization: str | None) -> Identity:
        """The identity behind an HTTP ``Authorization`` header (``Bearer <token>``, RFC
        6750), or the anonymous role for a request without one."""
        if authorization is None:
            return self.authenticate(None, None)
        if not authorization.startswith("Bearer "):
            raise AuthenticationError("Invalid HTTP Authorization header")
        return self.authenticate(TOKEN_METHOD, authorization[len("Bearer "):])

    # -- authorization ------------------------------------------------------------------

    def is_super_user(self, role: str | None) -> bool:
        return role is not None and role in self.super_users

    def is_tenant_admin(self, tenant: str, role: str | None) -> bool:
        """Whether ``role`` administers ``tenant``: a super-user, or one of its adminRoles."""
        if self.is_super_user(role):
            return True
        if role is None or not is_valid_name(tenant):
            return False  # no such tenant can exist: nothing to look up
        info = self.policies.get_tenant(tenant) or {}
        return role in (info.get("adminRoles") or ())

    def _granted(self, topic: TopicName, role: str) -> set[str]:
        """The actions the namespace's and the topic's permissions grant ``role``."""
        pol = self.policies.get_namespace(topic.namespace_name) or {}
        auth = pol.get("auth_policies") or {}
        actions = set((auth.get("namespace_auth") or {}).get(role) or ())
        per_topic = auth.get("destination_auth") or {}
        for name in {str(topic), str(topic.partitioned_topic)}:
            actions.update((per_topic.get(name) or {}).get(role) or ())
        return actions

    def allows(self, topic: TopicName, role: str | None, *actions: str) -> bool:
        """Whether ``role`` may do one of ``actions`` (``produce``, ``consume``) on
        ``topic``: always when authorization is off; a super-user or the tenant's admin
        may do anything."""
        if not self.authorization_enabled:
            return True
        if role is None:
            return False
        if self.is_tenant_admin(topic.tenant, role):
            return True
        granted = self._granted(topic, role)
        return any(a in granted for a in actions)

    def can_list_topics(self, ns: NamespaceName, role: str | None) -> bool:
        """Whether ``role`` may list ``ns``'s topics: its tenant's admin, or a role the
        namespace grants produce or consume (Pulsar's GET_TOPICS)."""
        if not self.authorization_enabled:
            return True
        if role is None:
            return False
        if self.is_tenant_admin(ns.tenant, role):
            return True
        pol = self.policies.get_namespace(ns) or {}
        granted = ((pol.get("auth_policies") or {}).get("namespace_auth") or {}).get(role) or ()
        return "produce" in granted or "consume" in granted

    def can_produce(self, topic: TopicName, role: str | None) -> bool:
        return self.allows(topic, role, "produce")

    def can_consume(self, topic: TopicName, role: str | None) -> bool:
        return self.allows(topic, role, "consume")

    def subscribe_refusal(self, topic: TopicName, role: str | None, subscription: str) -> str | None:
        """Why ``role`` may not consume ``topic`` with ``subscription`` (Pulsar's words),
        or None when it may: it needs ``consume``; a subscription granted to some roles
        (``grant-subscription-permission``) only to them; in a namespace whose
        ``subscription_auth_mode`` is Prefix, a subscription named after the role."""
        if not self.authorization_enabled:
            return None
        if not self.can_consume(topic, role):
            return "Client is not authorized to subscribe"
        assert role is not None
        if self.is_tenant_admin(topic.tenant, role):
            return None
        pol = self.policies.get_namespace(topic.namespace_name) or {}
        roles = ((pol.get("auth_policies") or {}).get("subscription_auth_roles") or {}).get(subscription)
        if roles and role not in roles:
            return "Client is not authorized to subscribe"
        if pol.get("subscription_auth_mode") == "Prefix" and not subscription.startswith(role):
            return (f"Failed to create consumer - The subscription name needs to be prefixed by "
                    f"the authentication role, like {role}-xxxx for topic: {topic}")
        return None

    def can_lookup(self, topic: TopicName, role: str | None) -> bool:
        """A lookup (and a topic's metadata) needs either produce or consume, as Pulsar's
        ``canLookup``."""
        return self.allows(topic, role, "produce", "consume")
