"""MQTT 3.1.1 and 5.0 for Magnetar: the codec, and the protocol handler on the core.

``CONFIG_KEYS`` are the protocol's configuration keys (``MQTTProtocolHandler.config_keys``);
the handler is imported when first used, so that reading a configuration, which needs only
the keys, does not load the protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from handlers.mqtt._settings import CONFIG_KEYS

if TYPE_CHECKING:
    from handlers.mqtt._handler import MQTTProtocolHandler

__all__ = ["CONFIG_KEYS", "MQTTProtocolHandler"]


def __getattr__(name: str) -> Any:
    if name != "MQTTProtocolHandler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from handlers.mqtt._handler import MQTTProtocolHandler

    return MQTTProtocolHandler
