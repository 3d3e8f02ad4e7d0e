"""The AMQP 0-9-1 protocol's configuration keys (``AMQPProtocolHandler.config_keys``).

Kept apart from the handler, and importing nothing of it, so that a configuration is
read without loading the protocol.
"""

from __future__ import annotations

from gateway.config import Key, int_key, listeners_key, str_key

__all__ = ["CONFIG_KEYS"]

CONFIG_KEYS: tuple[Key, ...] = (
    listeners_key("amqpListeners", ("amqp://127.0.0.1:5672",),
                  "AMQP 0-9-1 listener URLs (with messagingProtocols including amqp).", "amqp"),
    str_key("amqpTenant", "public",
            "Tenant of the AMQP vhosts: vhost / is {amqpTenant}/default, vhost v is "
            "{amqpTenant}/v."),
    # frame-max may not be below AMQP 0-9-1's frame-min-size, 4096
    int_key("amqpFrameMax", 131072,
            "Largest AMQP frame, in bytes, offered in connection.tune; a larger frame ends the "
            "connection with FRAME_ERROR (501).", 4096),
    int_key("amqpChannelMax", 2047,
            "Channels an AMQP connection may open (connection.tune).", 1, 65535),
    int_key("amqpHeartbeat", 60,
            "AMQP heartbeat interval offered, in seconds (0: none); a client silent for two "
            "intervals is disconnected.", 0, 65535),
    int_key("amqpMaxConnectionsPerVhost", 0,
            "AMQP connections a vhost accepts at once (0: no limit); one more is refused with "
            "NOT_ALLOWED (530).", 0),
    int_key("amqpMaxMessageSize", 134217728,
            "Largest AMQP message body, in bytes; a larger publish closes its channel with "
            "PRECONDITION_FAILED (406). A body over maxMessageSize is stored as a chunked "
            "message.", 1),
    int_key("amqpPublishWindow", 20000,
            "Publishes of an AMQP channel not yet stored past which its connection reads "
            "nothing more, saying connection.blocked to a client that takes it, until half "
            "are stored.", 1),
    str_key("amqpDefaultUser", "guest",
            "The AMQP user accepted when authentication is off (RabbitMQ's default_user)."),
    str_key("amqpDefaultPassword", "guest",
            "That user's password (RabbitMQ's default_pass)."),
)
