"""The admin REST API: Pulsar's ``/admin/v2/...`` paths, verbs, JSON shapes and status
codes over the broker's live state, one module per resource.

>>> from gateway.admin import admin_routes      # doctest: +SKIP
>>> app = Starlette(routes=admin_routes(broker))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from starlette.routing import BaseRoute, Route

from . import amqp, bookies, brokers, clusters, namespaces, schemas, subscriptions, tenants, topics
from ._access import guard
from ._common import RestError, error_response, limit_body
from ._stats import Rates
from .mqtt import routes as mqtt_routes

__all__ = ["admin_routes", "RestError", "Rates", "error_response", "guard"]


def admin_routes(broker: Any, rates: Rates | None = None) -> list[BaseRoute]:
    """Every admin route, served against `broker` (a :class:`core.broker.BrokerService`);
    `rates` is shared with the metrics collector so both see the same rate windows. Each
    route's request body is bounded in size and in time (:func:`limit_body`)."""
    rates = rates or Rates()
    out: list[BaseRoute] = []
    out += clusters.routes(broker)
    out += brokers.routes(broker)
    out += bookies.routes(broker)
    out += tenants.routes(broker)
    out += namespaces.routes(broker)
    out += subscriptions.routes(broker)
    out += topics.routes(broker, rates)
    out += schemas.routes(broker)
    out += amqp.routes(broker)
    out += mqtt_routes(broker)
    for route in out:
        if isinstance(route, Route):
            route.app = limit_body(route.app, broker)
    return out
