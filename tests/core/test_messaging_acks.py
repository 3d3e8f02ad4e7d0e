"""Acknowledging many decoded messages at once: one call into each subscription, the
batch members of an entry folded into one ack set, and a permit back for each."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from core.format import Message, ack_set
from core.messaging import Received, Subscriber
from core.naming import TopicName
from core.storage import Position
from tests.core._subscriber_fakes import FakeConsumer

TOPIC = TopicName.parse("persistent://public/default/acks")


def _received(consumer: FakeConsumer, entry: int, index: int = -1, size: int = 0) -> Received:
    return Received(TOPIC, Message(payload=b"x"), Position(1, entry), index, size, 0, consumer)  # type: ignore[arg-type]


def test_ack_many_makes_one_call_per_consumer_and_gives_a_permit_each() -> None:
    sub = Subscriber(SimpleNamespace(), "s", lambda r: None)
    a, b = FakeConsumer(TOPIC), FakeConsumer(TOPIC)
    batch = [_received(a, 7, i, 4) for i in (0, 2)]
    sub.ack_many([*batch, _received(a, 8), _received(b, 9)], flow=True)
    assert len(a.subscription.calls) == 1 and len(b.subscription.calls) == 1
    assert a.permits == 3 and b.permits == 1
    acks = a.subscription.calls[0]
    assert (Position(1, 8), None) in acks and b.subscription.calls[0] == [(Position(1, 9), None)]
    # what the subscription folds: indexes 1 and 3 of entry 7 still to acknowledge
    sets = [s for p, s in acks if p == Position(1, 7)]
    folded = [x & y for x, y in zip(*sets, strict=True)]
    assert folded == ack_set({1, 3}, 4)


def test_ack_many_without_flow_gives_no_permit() -> None:
    sub = Subscriber(SimpleNamespace(), "s", lambda r: None)
    a = FakeConsumer(TOPIC)
    sub.ack_many([_received(a, 1), _received(a, 2)])
    assert a.permits == 0 and a.subscription.calls == [[(Position(1, 1), None), (Position(1, 2), None)]]


async def test_settle_later_applies_once_the_task_lets_the_run_loop_go_on() -> None:
    import trio

    sub = Subscriber(SimpleNamespace(), "s", lambda r: None)
    a = FakeConsumer(TOPIC)
    a.sink = sub
    applied = trio.Event()
    record = a.subscription.ack_individual

    def ack_individual(consumer: Any, acks: list[tuple[Position, Any]]) -> None:
        record(consumer, acks)
        applied.set()

    a.subscription.ack_individual = ack_individual  # type: ignore[method-assign]
    sub.settle_later(_received(a, 1))
    sub.settle_later(_received(a, 2))
    assert a.subscription.calls == []  # not while this task runs
    with trio.fail_after(5):
        await applied.wait()
    assert a.subscription.calls == [[(Position(1, 1), None), (Position(1, 2), None)]] and a.permits == 2


def test_what_a_delivery_settles_is_applied_at_its_end_in_one_call() -> None:
    from core.format import entry_from_messages
    from core.storage import Entry
    from core.subscription import Delivery

    settled: list[Received] = []

    def deliver(r: Received) -> None:
        sub.settle_later(r)  # as a QoS 0 delivery is done with once sent
        settled.append(r)
        assert a.subscription.calls == []

    sub = Subscriber(SimpleNamespace(), "s", deliver)
    a = FakeConsumer(TOPIC)
    a.sink = sub
    entry = entry_from_messages([Message(payload=b"a"), Message(payload=b"b")], producer_name="p",
                                sequence_id=1, publish_time=1)
    sub.send_messages(a, [Delivery(Entry(Position(1, 5), 0, 1, 2, entry), 0)])  # type: ignore[arg-type]
    assert len(settled) == 2 and len(a.subscription.calls) == 1 and a.permits == 2
