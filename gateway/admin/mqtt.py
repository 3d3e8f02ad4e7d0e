"""``/admin/v2/mqtt``: the MQTT handler's sessions (connected or not, persistent, session
expiry, subscriptions with their QoS, messages queued while offline) and its retained
topics (with the retained payload's size), as the handler holds them."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from ._common import RestError, endpoint

__all__ = ["routes"]


def routes(broker: Any) -> list[Route]:
    def view() -> Any:
        v = broker.protocol_views.get("mqtt")
        if v is None:
            raise RestError(404, "MQTT is not served: messagingProtocols does not name mqtt")
        return v

    @endpoint
    async def sessions(request: Request) -> Any:
        return view().admin_sessions()

    @endpoint
    async def retained(request: Request) -> Any:
        return view().admin_retained()

    return [
        Route("/admin/v2/mqtt/sessions", sessions, methods=["GET"]),
        Route("/admin/v2/mqtt/retained", retained, methods=["GET"]),
    ]
