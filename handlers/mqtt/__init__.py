"""MQTT 3.1.1 and 5.0 for Magnetar: the codec, and the protocol handler on the core."""

from handlers.mqtt._handler import MQTTProtocolHandler

__all__ = ["MQTTProtocolHandler"]
