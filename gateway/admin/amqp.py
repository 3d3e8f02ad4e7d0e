"""``/admin/v2/amqp``: each AMQP vhost's exchanges, queues (messages ready and
unacknowledged, consumers) and bindings, as the AMQP handler holds them. The vhost is one
path segment (``/`` sent as ``%2F``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.routing import Route

from ._common import RestError, endpoint

__all__ = ["routes"]


def routes(broker: Any) -> list[Route]:
    def view() -> Any:
        v = broker.protocol_views.get("amqp")
        if v is None:
            raise RestError(404, "AMQP is not served: messagingProtocols does not name amqp")
        return v

    def vhost_of(request: Request) -> str:
        name = unquote(request.path_params["vhost"])
        if name not in view().vhosts:
            raise RestError(404, f"Vhost {name} not found")
        return name

    @endpoint
    async def vhosts(request: Request) -> Any:
        return sorted(view().vhosts)

    @endpoint
    async def exchanges(request: Request) -> Any:
        return view().admin_exchanges(vhost_of(request))

    @endpoint
    async def queues(request: Request) -> Any:
        return view().admin_queues(vhost_of(request))

    @endpoint
    async def bindings(request: Request) -> Any:
        return view().admin_bindings(vhost_of(request))

    base = "/admin/v2/amqp/vhosts"
    return [
        Route(base, vhosts, methods=["GET"]),
        Route(base + "/{vhost}/exchanges", exchanges, methods=["GET"]),
        Route(base + "/{vhost}/queues", queues, methods=["GET"]),
        Route(base + "/{vhost}/bindings", bindings, methods=["GET"]),
    ]
