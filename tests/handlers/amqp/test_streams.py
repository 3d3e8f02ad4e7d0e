"""Stream queues (x-queue-type=stream): the queue is a topic, read by many consumers
independently from the offset each gives, and a Pulsar reader sees the same messages."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pika
import pika.exceptions as pex
import pulsar
import pytest

from tests._standalone import Standalone

WAIT = 10.0
STREAM = {"x-queue-type": "stream"}


def read(conn: pika.BlockingConnection, stream: str, offset: Any, n: int,
         timeout: float = WAIT) -> list[tuple[int, bytes]]:
    """(x-stream-offset, body) of ``n`` messages from ``offset``, on a channel of its own."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[tuple[int, bytes]] = []

    def on(c: Any, m: Any, p: Any, body: bytes) -> None:
        got.append((p.headers["x-stream-offset"], body))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(stream, on, arguments={"x-stream-offset": offset})
    end = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        conn.process_data_events(0.05)
    ch.close()
    return got


def test_stream_consumers_read_from_their_offsets(conn: pika.BlockingConnection, unique: str,
                                                  amqp_broker: Standalone) -> None:
    s = f"stream-{unique}"
    ch = conn.channel()
    ok = ch.queue_declare(s, durable=True, arguments=STREAM)
    assert ok.method.message_count == 0
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", s, b"m%d" % i)
    assert read(conn, s, "first", 10) == [(i, b"m%d" % i) for i in range(10)]
    # a second consumer reads the same messages again: nothing was consumed away
    assert read(conn, s, 6, 4) == [(i, b"m%d" % i) for i in range(6, 10)]
    assert read(conn, s, "last", 1)[0] == (9, b"m9")
    # a timestamp (AMQP's are whole seconds): from the first message published at or after it
    an_hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    assert read(conn, s, an_hour_ago, 1)[0] == (0, b"m0")
    assert ch.queue_declare(s, durable=True, passive=True).method.message_count == 10
    # next: only what comes after the consumer starts
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=5)
    later: list[bytes] = []
    ch2.basic_consume(s, lambda c, m, p, b: (later.append(b), c.basic_ack(m.delivery_tag)),
                      arguments={"x-stream-offset": "next"})
    conn.process_data_events(0.2)
    ch.basic_publish("", s, b"m10")
    end = time.monotonic() + WAIT
    while not later and time.monotonic() < end:
        conn.process_data_events(0.05)
    assert later == [b"m10"]
    ch2.close()
    # a Pulsar reader of the stream's topic sees the same messages
    client = pulsar.Client(amqp_broker.pulsar_url)
    try:
        r = client.create_reader(f"persistent://public/default/{s}", pulsar.MessageId.earliest)
        assert [r.read_next(int(WAIT * 1000)).data() for _ in range(11)] == [b"m%d" % i for i in range(11)]
    finally:
        client.close()


def test_a_stream_bound_to_an_exchange_gets_its_matching_messages(
        conn: pika.BlockingConnection, unique: str) -> None:
    s, ex = f"stream-b-{unique}", f"stream-ex-{unique}"
    ch = conn.channel()
    ch.exchange_declare(ex, "direct")
    ch.queue_declare(s, durable=True, arguments=STREAM)
    ch.queue_bind(s, ex, routing_key="keep")
    ch.confirm_delivery()
    for i in range(6):
        ch.basic_publish(ex, "keep" if i % 2 == 0 else "drop", b"%d" % i)
    assert [b for _, b in read(conn, s, "first", 3)] == [b"0", b"2", b"4"]


def test_stream_consumers_need_a_prefetch_and_streams_have_no_get(
        conn: pika.BlockingConnection, unique: str) -> None:
    s = f"stream-rules-{unique}"
    ch = conn.channel()
    ch.queue_declare(s, durable=True, arguments=STREAM)
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.basic_consume(s, lambda *a: None)
    assert info.value.reply_code == 406 and "prefetch" in info.value.reply_text
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.basic_get(s)
    assert info.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(f"stream-t-{unique}", durable=False, arguments=STREAM)
    assert info.value.reply_code == 406
