"""Receiving with the official client until a consumer goes quiet, and waiting on a
condition the broker reports, with a bound."""

from __future__ import annotations

import time

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


def nack_redelivery_counts(consumer, times: int, *, receive_ms: int = 10_000) -> list[int]:
    """Receive and negatively acknowledge ``times`` times; the redelivery count of each
    message received."""
    counts = []
    for _ in range(times):
        msg = consumer.receive(timeout_millis=receive_ms)
        counts.append(msg.redelivery_count())
        consumer.negative_acknowledge(msg)
    return counts


def wait_until(condition, timeout: float = 15.0) -> None:
    """Poll ``condition()`` until it is true; fail once ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
