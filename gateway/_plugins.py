"""Protocol plugins: the built-in ones (Pulsar, Kafka, MQTT) and a user's own.

A protocol handler is a class constructed as ``Handler(config, broker)`` with an
``async def serve(self, task_status)`` that opens its listeners, calls
``task_status.started(addresses)`` once they accept connections, and serves until
cancelled. ``messagingProtocols`` names them: a built-in name, an entry point in the
``magnetar.protocols`` group, or ``module:Class``.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import trio

__all__ = ["ProtocolHandler", "load_protocol", "BUILTIN_PROTOCOLS", "UnknownProtocolError"]

BUILTIN_PROTOCOLS = {
    "pulsar": "handlers.pulsar:PulsarProtocolHandler",
    "kafka": "handlers.kafka:KafkaProtocolHandler",
    "mqtt": "handlers.mqtt:MQTTProtocolHandler",
    "amqp": "handlers.amqp:AMQPProtocolHandler",
}


class UnknownProtocolError(ValueError):
    pass


class ProtocolHandler(Protocol):
    name: str

    def __init__(self, config: Any, broker: Any) -> None: ...

    async def serve(self, task_status: trio.TaskStatus[list[str]] = ...) -> None: ...


def _import(spec: str) -> type:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def load_protocol(name: str) -> type:
    if name in BUILTIN_PROTOCOLS:
        return _import(BUILTIN_PROTOCOLS[name])
    # Only a name that is not built in reads the installed distributions' entry points
    # (importlib.metadata alone takes about 15 ms to load).
    from importlib.metadata import entry_points

    for ep in entry_points(group="magnetar.protocols"):
        if ep.name == name:
            return ep.load()  # type: ignore[no-any-return]
    if ":" in name:
        try:
            return _import(name)
        except (ImportError, AttributeError) as exc:
            raise UnknownProtocolError(f"messagingProtocols: cannot load {name!r}: {exc}") from exc
    known = ", ".join(sorted(BUILTIN_PROTOCOLS))
    raise UnknownProtocolError(
        f"messagingProtocols: unknown protocol {name!r} (built in: {known}; or an entry point "
        "in group magnetar.protocols, or module:Class)")
