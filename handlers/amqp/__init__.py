"""AMQP 0-9-1 for Magnetar: the codec, the model of exchanges and queues, and the
protocol handler on the core."""

from handlers.amqp._handler import AMQPProtocolHandler

__all__ = ["AMQPProtocolHandler"]
