"""A consumer and its subscription as :class:`core.messaging.Subscriber` sees them, keeping
what it is told: the acknowledgements (each call's, and every position), the redeliveries
and the permits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from core.naming import TopicName
from core.storage import Position


class FakeSubscription:
    def __init__(self, topic: TopicName) -> None:
        self.topic = SimpleNamespace(name=topic)
        self.calls: list[list[tuple[Position, Any]]] = []  # each ack_individual's acks
        self.acked: list[Position] = []
        self.redelivered: list[Position] = []

    def ack_individual(self, consumer: Any, acks: list[tuple[Position, Any]]) -> None:
        self.calls.append(list(acks))
        self.acked += [p for p, _ in acks]

    def redeliver(self, consumer: Any, positions: list[Position]) -> None:
        self.redelivered += positions


class FakeConsumer:
    def __init__(self, topic: TopicName, sink: Any = None) -> None:
        self.subscription = FakeSubscription(topic)
        self.permits = 0
        self.sink = sink

    def flow(self, n: int) -> None:
        self.permits += n
