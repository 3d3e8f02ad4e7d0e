"""Protocol plugins: the built-in ones (Pulsar, Kafka, AMQP, MQTT) and a user's own.

A protocol handler is a class constructed as ``Handler(config, broker)`` with an
``async def serve(self, task_status)`` that opens its listeners, calls
``task_status.started(addresses)`` once they accept connections, and serves until
cancelled. ``messagingProtocols`` names them: a built-in name, an entry point in the
``magnetar.protocols`` group, or ``module:Class``.

A handler declares the configuration keys it reads in an optional class attribute
``config_keys`` (see :mod:`gateway.config`); :func:`protocol_keys` reads them, and the
configuration loader takes them as keys of its own for the protocols it loads. A built-in
protocol's keys are read from its package's ``CONFIG_KEYS`` (what its class declares), so
that loading a configuration does not import the protocol's implementation: a bookie,
which serves no protocol, starts without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway._config import ConfigError, Key

if TYPE_CHECKING:
    import trio

__all__ = ["ProtocolHandler", "load_protocol", "protocol_keys", "BUILTIN_PROTOCOLS",
           "UnknownProtocolError"]

BUILTIN_PROTOCOLS = {
    "pulsar": "handlers.pulsar:PulsarProtocolHandler",
    "kafka": "handlers.kafka:KafkaProtocolHandler",
    "mqtt": "handlers.mqtt:MQTTProtocolHandler",
    "amqp": "handlers.amqp:AMQPProtocolHandler",
}

#: Where each built-in protocol that has keys of its own declares them.
_BUILTIN_KEYS = {
    "kafka": "handlers.kafka:CONFIG_KEYS",
    "mqtt": "handlers.mqtt:CONFIG_KEYS",
    "amqp": "handlers.amqp:CONFIG_KEYS",
}


class UnknownProtocolError(ConfigError):
    """A name in ``messagingProtocols`` that names no protocol that can be loaded."""


class ProtocolHandler(Protocol):
    """What a protocol handler class provides. It may also declare the configuration keys
    it reads as a class attribute ``config_keys: Sequence[Key]`` (see :mod:`gateway.config`);
    one that declares none reads core keys only."""

    name: str

    def __init__(self, config: Any, broker: Any) -> None: ...

    async def serve(self, task_status: trio.TaskStatus[list[str]] = ...) -> None: ...


def _import(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_protocol(name: str) -> type:
    """The handler class ``name`` in ``messagingProtocols`` stands for; raises
    :class:`UnknownProtocolError` when there is none."""
    if name in BUILTIN_PROTOCOLS:
        return _import(BUILTIN_PROTOCOLS[name])  # type: ignore[no-any-return]
    # Only a name that is not built in reads the installed distributions' entry points
    # (importlib.metadata alone takes about 15 ms to load).
    from importlib.metadata import entry_points

    for ep in entry_points(group="magnetar.protocols"):
        if ep.name == name:
            return ep.load()  # type: ignore[no-any-return]
    if ":" in name:
        try:
            return _import(name)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as exc:
            raise UnknownProtocolError(f"messagingProtocols: cannot load {name!r}: {exc}") from exc
    known = ", ".join(sorted(BUILTIN_PROTOCOLS))
    raise UnknownProtocolError(
        f"messagingProtocols: unknown protocol {name!r} (built in: {known}; or an entry point "
        "in group magnetar.protocols, or module:Class)")


def protocol_keys(name: str) -> tuple[Key, ...]:
    """The configuration keys the protocol ``name`` declares (its handler's
    ``config_keys``), in its order; raises :class:`UnknownProtocolError` for a protocol
    that cannot be loaded, :class:`~gateway._config.ConfigError` for a declaration that is
    not a sequence of :class:`~gateway._config.Key`."""
    if name in BUILTIN_PROTOCOLS:
        declared = _import(_BUILTIN_KEYS[name]) if name in _BUILTIN_KEYS else ()
    else:
        declared = getattr(load_protocol(name), "config_keys", ())
    if isinstance(declared, (str, bytes)) or not isinstance(declared, Sequence) \
            or not all(isinstance(key, Key) for key in declared):
        raise ConfigError(f"messagingProtocols: protocol {name!r} declares config_keys that "
                          "are not a sequence of gateway.config.Key")
    return tuple(declared)
