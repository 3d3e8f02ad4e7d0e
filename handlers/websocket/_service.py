"""The ASGI app that takes every WebSocket request of the web service: it answers the
upgrade (an HTTP error when the path names no endpoint, or the producer, consumer or reader
cannot be created, as Pulsar's handlers answer it) and runs the session."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs

from starlette.datastructures import Headers

from core.auth import AuthenticationError
from core.broker import NamespaceNotFoundError
from handlers.websocket._codec import Endpoint, InvalidParams, Kind, parse_endpoint
from handlers.websocket._consumer import ConsumerSession, ReaderSession
from handlers.websocket._producer import ProducerSession
from handlers.websocket._session import Receive, Send, Session, handshake_message, handshake_status

__all__ = ["SESSIONS", "WebSocketService", "deny", "open_session"]

log = logging.getLogger(__name__)

SESSIONS: dict[Kind, type[Session]] = {
    Kind.producer: ProducerSession,
    Kind.consumer: ConsumerSession,
    Kind.reader: ReaderSession,
}
"""The session class of each endpoint served."""


async def open_session(broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                       send: Send) -> Session:
    """The session an endpoint names, opened (its producer, consumer or reader created);
    raises what :func:`handshake_status` maps to the upgrade's answer. A v1 topic's
    namespace (``tenant/cluster/namespace``) is one this broker cannot hold: not found,
    as Pulsar answers a topic of a namespace that does not exist."""
    if endpoint.v1_topic is not None:
        namespace = endpoint.v1_topic.split("://", 1)[1].rsplit("/", 1)[0]
        raise NamespaceNotFoundError(f"Namespace {namespace} does not exist")
    session = SESSIONS[endpoint.kind](broker, config, scope, endpoint, send)
    await session.open()
    return session


async def deny(scope: dict[str, Any], send: Send, status: int, message: str) -> None:
    """Refuse a WebSocket upgrade with ``status`` and ``message`` as its body (the ASGI
    WebSocket denial response, which hypercorn serves; without it, a bare refusal)."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    body = message.encode()
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "websocket.http.response.body", "body": body})


class WebSocketService:
    def __init__(self, config: Any, broker: Any):
        self.config = config
        self.broker = broker

    def _access_refusal(self, scope: dict[str, Any], endpoint: Endpoint) -> str | None:
        """Why the upgrade is refused (401) under ``authenticationEnabled``, or None: the
        token comes as ``Authorization: Bearer <token>`` or, for browsers, which cannot
        set headers on a WebSocket, as the ``token`` query parameter, as Pulsar's
        WebSocket service takes it. With ``authorizationEnabled`` a producer needs
        ``produce`` on the topic, a reader ``consume``, and a consumer what a subscribe
        needs (its subscription's permissions and auth mode included)."""
        auth = self.broker.auth
        if not auth.authentication_enabled:
            return None
        header = Headers(scope=scope).get("authorization")
        if header is None:
            token = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get("token")
            if token:
                header = f"Bearer {token[0]}"
        try:
            role = auth.authenticate_http(header).role
        except AuthenticationError as exc:
            log.warning("websocket: %s refused: %s", endpoint.kind.value, exc)
            return "Authentication required"
        topic = endpoint.topic
        if topic is None:
            # a v1 topic: no permission can be granted on a namespace under a cluster, so
            # only the tenant's admins (and super-users) get as far as its "not found"
            assert endpoint.v1_topic is not None
            tenant = endpoint.v1_topic.split("://", 1)[1].split("/", 1)[0]
            if not auth.authorization_enabled or auth.is_tenant_admin(tenant, role):
                return None
            log.warning("websocket: role %s may not %s on %s", role, endpoint.kind.value, endpoint.v1_topic)
            return "Client is not authorized to perform operation"
        if endpoint.kind is Kind.producer:
            allowed = auth.can_produce(topic, role)
        elif endpoint.kind is Kind.reader:
            allowed = auth.can_consume(topic, role)
        else:
            reason = auth.subscribe_refusal(topic, role, endpoint.subscription)
            if reason is not None:
                log.warning("websocket: role %s refused on %s: %s", role, topic, reason)
            return reason
        if allowed:
            return None
        log.warning("websocket: role %s may not %s on %s", role, endpoint.kind.value, topic)
        return "Client is not authorized to perform operation"

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        assert scope["type"] == "websocket"
        if (await receive())["type"] != "websocket.connect":
            return
        raw = scope.get("raw_path") or scope["path"].encode()
        try:
            endpoint = parse_endpoint(raw.decode("latin-1"))
        except InvalidParams as exc:
            await deny(scope, send, 400, f"Invalid query params: {exc}")
            return
        if endpoint is None or endpoint.kind not in (*SESSIONS, Kind.pingpong):
            await deny(scope, send, 404, "Not found")
            return
        if endpoint.kind is Kind.pingpong:
            # the WebSocket's own pings are answered by the server underneath
            await send({"type": "websocket.accept"})
            while (await receive())["type"] != "websocket.disconnect":
                pass
            return
        refusal = self._access_refusal(scope, endpoint)
        if refusal is not None:
            await deny(scope, send, 401, refusal)
            return
        try:
            session = await open_session(self.broker, self.config, scope, endpoint, send)
        except Exception as exc:
            status = handshake_status(endpoint.kind, exc)
            log.info("websocket: refusing %s on %s: %s", endpoint.kind.value, endpoint.topic, exc)
            await deny(scope, send, status, handshake_message(endpoint.kind, exc))
            return
        try:
            await send({"type": "websocket.accept"})
        except BaseException:
            session.release()
            raise
        with self.broker.stats.connection("websocket"):
            await session.run(receive)
