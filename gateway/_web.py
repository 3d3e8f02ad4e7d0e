"""The web service on ``webServicePort``: the admin REST API under ``/admin/v2`` and
Prometheus metrics under ``/metrics``, served by hypercorn's trio worker."""

from __future__ import annotations

import logging
import socket
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["WebService", "build_app"]

log = logging.getLogger(__name__)


def build_app(config: Any, broker: Any) -> Starlette:
    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/admin/v2/brokers/health", health)])


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
        sock.bind((host, int(self.config.get("webServicePort"))))
        port = sock.getsockname()[1]
        hc = HypercornConfig()
        hc.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket now
        hc.accesslog = None
        hc.errorlog = logging.getLogger("hypercorn.error")
        url = f"http://{self.config.get('advertisedAddress') or host}:{port}"
        self.broker.web_service_url = url
        app = _without_lifespan(build_app(self.config, self.broker))
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, app, hc)  # type: ignore[arg-type]
            task_status.started([url])
