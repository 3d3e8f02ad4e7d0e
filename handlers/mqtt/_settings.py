"""The MQTT protocol's configuration keys (``MQTTProtocolHandler.config_keys``).

Kept apart from the handler, and importing nothing of it, so that a configuration is
read without loading the protocol.
"""

from __future__ import annotations

from gateway.config import Key, int_key, listeners_key, str_key

__all__ = ["CONFIG_KEYS"]

CONFIG_KEYS: tuple[Key, ...] = (
    listeners_key("mqttListeners", ("mqtt://127.0.0.1:1883",),
                  "MQTT 3.1.1 and 5 listener URLs (with messagingProtocols including mqtt).",
                  "mqtt"),
    str_key("mqttTenant", "public", "Tenant that MQTT topics live in."),
    str_key("mqttNamespace", "default", "Namespace that MQTT topics live in."),
    # the largest packet MQTT's four-byte remaining length allows (MQTT 5 §1.5.5), with
    # its fixed header
    int_key("mqttMaxPacketSize", 1048576,
            "Largest MQTT packet a client may send, in bytes; a larger one ends its connection "
            "(MQTT 5: DISCONNECT 0x95).", 16, 268435460),
    int_key("mqttReceiveMaximum", 1024,
            "QoS 2 publishes an MQTT client may have unanswered at once (the CONNACK's receive "
            "maximum); one more ends its connection (0x93).", 1, 65535),
    int_key("mqttTopicAliasMaximum", 10,
            "Topic aliases an MQTT 5 client may set up (0: none).", 0, 65535),
    int_key("mqttMaxQueuedMessages", 1000,
            "Messages a persistent MQTT session keeps while its client is away; past it the "
            "oldest QoS 0 one is dropped, or, when none is left, the oldest QoS 1 or 2 one.", 1),
)
