"""Large messages through the protocol-neutral core: :func:`core.messaging.publish` splits
what does not fit one entry (a message too large alone as Pulsar chunks it), and a
:class:`~core.messaging.Subscriber` hands each chunked message over whole, once, with one
acknowledgement covering every chunk."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import trio

from core.format import Message, chunk_entries, decode_entry, entry_from_messages
from core.messaging import MAX_PENDING_CHUNKED, Received, Subscriber, publish
from core.naming import TopicName
from core.storage import Entry, Position
from core.subscription import Delivery
from tests.core._subscriber_fakes import FakeConsumer
from tests.core.test_topic_publish import _topic

TOPIC = TopicName.parse("persistent://public/default/big")


def _subscriber() -> tuple[Subscriber, FakeConsumer, list[Received]]:
    got: list[Received] = []
    sub = Subscriber(SimpleNamespace(), "s", got.append)
    return sub, FakeConsumer(TOPIC, sub), got


def _deliver(sub: Subscriber, consumer: FakeConsumer, entries: list[bytes], first: int = 0,
             redelivery_count: int = 0) -> None:
    sub.send_messages(consumer, [Delivery(Entry(Position(1, first + i), 0, first + i, 1, e), redelivery_count)  # type: ignore[arg-type]
                                 for i, e in enumerate(entries)])


def _chunks(payload: bytes, seq: int = 1, **props: str) -> list[bytes]:
    return chunk_entries(Message(payload=payload, key="k", properties=props), producer_name="p",
                         sequence_id=seq, publish_time=5, max_entry=1024)


def test_chunk_entries_fit_and_carry_the_message_metadata() -> None:
    payload = os.urandom(5000)
    chunks = _chunks(payload, n="1")
    assert len(chunks) > 4 and all(len(c) <= 1024 for c in chunks)
    metas = [decode_entry(c)[0] for c in chunks]
    assert [m.chunk_id for m in metas] == list(range(len(chunks)))
    assert {m.uuid for m in metas} == {"p-1"} and {m.num_chunks_from_msg for m in metas} == {len(chunks)}
    assert all(m.total_chunk_msg_size == 5000 and m.partition_key == "k" for m in metas)
    assert b"".join(decode_entry(c)[1] for c in chunks) == payload


def test_a_chunked_message_is_delivered_once_whole_and_acked_in_every_chunk() -> None:
    sub, consumer, got = _subscriber()
    payload = os.urandom(3000)
    chunks = _chunks(payload, n="1")
    _deliver(sub, consumer, chunks[:-1])
    assert got == [] and consumer.permits == len(chunks) - 1  # kept chunks give permits back
    _deliver(sub, consumer, chunks[-1:], first=len(chunks) - 1)
    assert len(got) == 1
    r = got[0]
    assert r.message.payload == payload and r.message.key == "k" and r.message.properties == {"n": "1"}
    assert r.positions == [Position(1, i) for i in range(len(chunks))]
    sub.ack(r)
    assert consumer.subscription.acked == r.positions
    sub.nack(r)
    assert consumer.subscription.redelivered == r.positions


def test_a_redelivery_starts_the_message_over_from_its_first_chunk() -> None:
    sub, consumer, got = _subscriber()
    payload = os.urandom(3000)
    chunks = _chunks(payload)
    _deliver(sub, consumer, chunks[:2])
    _deliver(sub, consumer, chunks, redelivery_count=1)  # the same entries again, from chunk 0
    assert [r.message.payload for r in got] == [payload] and got[0].redelivery_count == 1
    assert consumer.subscription.acked == []  # nothing dropped: they were the same entries


def test_chunks_that_cannot_make_a_message_are_acknowledged_not_delivered() -> None:
    sub, consumer, got = _subscriber()
    payload = os.urandom(3000)
    chunks = _chunks(payload)
    _deliver(sub, consumer, chunks[1:2], first=1)  # its chunk 0 is gone
    assert got == [] and consumer.subscription.acked == [Position(1, 1)]
    # a producer that stored two chunks, then began the message again
    _deliver(sub, consumer, chunks[:2], first=10)
    _deliver(sub, consumer, chunks, first=20)
    assert [r.message.payload for r in got] == [payload]
    assert consumer.subscription.acked == [Position(1, 1), Position(1, 10), Position(1, 11)]


def test_a_plain_entry_between_chunks_is_delivered_in_its_turn() -> None:
    sub, consumer, got = _subscriber()
    payload = os.urandom(3000)
    chunks = _chunks(payload)
    plain = entry_from_messages([Message(payload=b"small")], producer_name="q", sequence_id=1, publish_time=1)
    _deliver(sub, consumer, [chunks[0], plain, *chunks[1:]])
    assert [r.message.payload for r in got] == [b"small", payload]


def test_more_messages_being_put_together_than_the_bound_give_the_oldest_back() -> None:
    sub, consumer, got = _subscriber()
    firsts = [_chunks(os.urandom(2000), seq=i)[0] for i in range(MAX_PENDING_CHUNKED + 1)]
    _deliver(sub, consumer, firsts)
    assert consumer.subscription.redelivered == [Position(1, 0)] and got == []


async def test_publish_splits_what_does_not_fit_one_entry() -> None:
    topic, ledger = _topic("split")
    ledger.max_entry_size = 4096
    broker = SimpleNamespace(config={"maxMessageSize": 2048}, get_topic=None)

    async def get_topic(name: TopicName) -> Any:
        return topic

    broker.get_topic = get_topic
    stored: list[bytes] = []
    real = ledger._store

    def keep(entries: list[bytes]) -> Any:
        stored.extend(entries)
        return real(entries)

    ledger._store = keep  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(topic._flusher)
        small = [Message(payload=os.urandom(300)) for _ in range(10)]
        await publish(broker, TOPIC, small, producer_name="p")
        huge = Message(payload=os.urandom(10_000), key="k")
        await publish(broker, TOPIC, [huge], producer_name="p")
        nursery.cancel_scope.cancel()
    assert all(len(e) <= 2048 for e in stored)
    metas = [decode_entry(e)[0] for e in stored]
    batches = [m for m in metas if m.num_chunks_from_msg <= 1]
    assert len(batches) > 1 and sum(m.num_messages_in_batch or 1 for m in batches) == 10
    chunk_metas = [m for m in metas if m.num_chunks_from_msg > 1]
    assert len(chunk_metas) == chunk_metas[0].num_chunks_from_msg >= 5
    sub, consumer, got = _subscriber()
    _deliver(sub, consumer, stored)
    assert [r.message.payload for r in got] == [m.payload for m in small] + [huge.payload]
