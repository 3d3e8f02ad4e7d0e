"""The native Pulsar binary protocol: a sans-IO codec and the trio session over it."""

from handlers.pulsar._handler import PulsarProtocolHandler

__all__ = ["PulsarProtocolHandler"]
