"""AMQP 0-9-1 for Magnetar: the codec, the model of exchanges and queues, and the
protocol handler on the core.

``CONFIG_KEYS`` are the protocol's configuration keys (``AMQPProtocolHandler.config_keys``);
the handler is imported when first used, so that reading a configuration, which needs only
the keys, does not load the protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from handlers.amqp._settings import CONFIG_KEYS

if TYPE_CHECKING:
    from handlers.amqp._handler import AMQPProtocolHandler

__all__ = ["AMQPProtocolHandler", "CONFIG_KEYS"]


def __getattr__(name: str) -> Any:
    if name != "AMQPProtocolHandler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from handlers.amqp._handler import AMQPProtocolHandler

    return AMQPProtocolHandler
