"""``/admin/v2/bookies``: the bookies registered in the metadata store, with their
read-write / read-only state (BookKeeper's ``available`` and ``available/readonly``)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from core.autorecovery import bookies

from ._common import endpoint

__all__ = ["routes", "bookies"]


def routes(broker: Any) -> list[Route]:
    @endpoint
    async def all_bookies(request: Request) -> Any:
        found = bookies(broker.metadata)
        return {"bookies": [{"bookieId": b} for b in sorted(found["readWrite"] + found["readOnly"])]}

    @endpoint
    async def by_state(request: Request) -> Any:
        return bookies(broker.metadata)

    @endpoint
    async def racks(request: Request) -> Any:
        found = bookies(broker.metadata)
        return {"default": {b: {"rack": "/default-rack", "hostname": b.rsplit(":", 1)[0]}
                            for b in sorted(found["readWrite"] + found["readOnly"])}}

    return [
        Route("/admin/v2/bookies/all", all_bookies, methods=["GET"]),
        Route("/admin/v2/bookies/state", by_state, methods=["GET"]),
        Route("/admin/v2/bookies/racks-info", racks, methods=["GET"]),
    ]
