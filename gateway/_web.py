"""The web service on ``webServicePort``: the admin REST API under ``/admin/v2``,
Prometheus metrics under ``/metrics`` and, with ``webSocketServiceEnabled``, Pulsar's
WebSocket API under ``/ws`` (:mod:`handlers.websocket`), served by hypercorn's trio worker,
behind Pulsar's authentication and authorization (:func:`gateway.admin.guard`).

The handlers run on the broker's own trio loop, so they read and change live topics and
subscriptions directly. Unknown paths and methods answer with Pulsar's error shape
(``{"reason": ...}``).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from handlers._serve import listen_error

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["WebService", "build_app"]

log = logging.getLogger(__name__)


def build_app(config: Any, broker: Any) -> Any:
    """The ASGI app: admin routes, ``/metrics``, Pulsar-shaped errors."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import Response
    from starlette.routing import Route

    from gateway._metrics import CONTENT_TYPE_LATEST, metrics_registry, render_metrics
    from gateway.admin import Rates, admin_routes, error_response, guard

    rates = Rates()
    registry = metrics_registry(broker, rates)

    async def metrics(request: Request) -> Response:
        return Response(render_metrics(registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        reason = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, reason)

    app = Starlette(
        routes=[
            Route("/metrics", metrics, methods=["GET"]),
            Route("/metrics/", metrics, methods=["GET"]),
            *admin_routes(broker, rates),
        ],
        exception_handlers={HTTPException: http_error},
    )
    return _websockets(config, broker, _count_requests(broker, _keep_encoded_slashes(guard(broker, app))))


def _websockets(config: Any, broker: Any, app: Any) -> Any:
    """Hand WebSocket requests to Pulsar's WebSocket API, or, when
    ``webSocketServiceEnabled`` is off, refuse them as a path that is not served (404)."""
    from handlers.websocket import WebSocketService, deny

    service = WebSocketService(config, broker) if config.get("webSocketServiceEnabled") else None

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await app(scope, receive, send)
        elif service is not None:
            await service(scope, receive, send)
        elif (await receive())["type"] == "websocket.connect":
            await deny(scope, send, 404, "Not found")

    return wrapped


def _count_requests(broker: Any, app: Any) -> Any:
    """Count admin/metrics requests as the ``http`` protocol's requests."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            broker.stats.record_request("http")
        await app(scope, receive, send)

    return wrapped


def _keep_encoded_slashes(app: Any) -> Any:
    """Route on the raw path, one segment per name: a topic's local name may contain
    ``/`` (MQTT topic names do) or ``%``, sent percent-encoded inside one segment. Each
    segment is decoded once and re-encoded with only ``%`` and ``/`` escaped, so routing
    sees the segments the client sent and handlers decode each path parameter exactly
    once (:func:`gateway.admin._common.topic_of`)."""
    from urllib.parse import unquote

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            text = raw.decode("latin-1").split("?", 1)[0]
            parts = [unquote(p).replace("%", "%25").replace("/", "%2F") for p in text.split("/")]
            scope = dict(scope, path="/".join(parts))
        await app(scope, receive, send)

    return wrapped


def _built_at_first_request(build: Callable[[], Any]) -> Any:
    """The app ``build`` makes, made when the first request (HTTP or WebSocket) comes rather
    than at start: its hundreds of admin routes (a compiled pattern each), the metrics
    registry and the WebSocket API take about 100 ms to set up, which the broker's start,
    and its Pulsar and Kafka clients, need not wait for. The first request waits for it
    instead, once."""
    app: Any = None

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        nonlocal app
        if app is None:
            app = build()
        await app(scope, receive, send)

    return wrapped


def _without_lifespan(app: Any) -> Any:
    """Answer ASGI lifespan events here: the app has no startup or shutdown work, and a
    cancelled broker must stop the server without a lifespan error."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    return wrapped


class WebService:
    name = "web"

    def __init__(self, config: Any, broker: Any):
        self.config = config
        self.broker = broker

    async def serve(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        host = str(self.config.get("bindAddress"))
        # Bind here (port 0 allowed) and hand hypercorn the bound socket, so the address
        # reported is the one served, with no window for another process to take it.
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port = int(self.config.get("webServicePort"))
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise listen_error(exc, host, port, "webServicePort") from exc
        port = sock.getsockname()[1]
        hc = HypercornConfig()
        hc.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket now
        hc.accesslog = None
        hc.websocket_max_message_size = int(self.config.get("webSocketMaxTextFrameSize"))
        hc.errorlog = logging.getLogger("hypercorn.error")
        url = f"http://{self.config.get('advertisedAddress') or host}:{port}"
        self.broker.web_service_url = url
        app = _without_lifespan(_built_at_first_request(lambda: build_app(self.config, self.broker)))
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, app, hc)  # type: ignore[arg-type]
            task_status.started([url])
