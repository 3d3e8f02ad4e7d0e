"""Receiving with the official client until a consumer goes quiet."""

from __future__ import annotations

import pulsar

IDLE_MS = 1500


def receive_until_idle(consumer, *, idle_ms: int = IDLE_MS, ack: bool = True) -> list:
    """Every message the consumer receives until none comes for ``idle_ms``, acknowledged
    unless ``ack`` is false."""
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=idle_ms)
        except pulsar.Timeout:
            return got
        got.append(msg)
        if ack:
            consumer.acknowledge(msg)
