"""Stream queues (x-queue-type=stream): the queue is a topic, read by many consumers
independently from the offset each gives, and a Pulsar reader sees the same messages; its
retention arguments are the topic's retention, which the broker's retention check
enforces whatever the stream's readers have read."""

from __future__ import annotations

import datetime
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions as pex
import pulsar
import pytest

from tests._standalone import Standalone
from tests.handlers.amqp.conftest import AMQP_CONF, amqp_port

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


def test_a_streams_bindings_apply_from_when_they_change(
        conn: pika.BlockingConnection, unique: str) -> None:
    s, ex, hx = f"stream-rb-{unique}", f"stream-rex-{unique}", f"stream-hx-{unique}"
    ch = conn.channel()
    ch.exchange_declare(ex, "direct")
    ch.exchange_declare(hx, "headers")
    ch.queue_declare(s, durable=True, arguments=STREAM)
    ch.queue_bind(s, ex, routing_key="a")
    ch.confirm_delivery()
    ch.basic_publish(ex, "a", b"a1")
    ch.basic_publish(ex, "b", b"b1")
    ch.queue_bind(s, ex, routing_key="b")  # the same exchange, one more key
    ch.queue_unbind(s, ex, routing_key="a")
    ch.queue_bind(s, hx, arguments={"x-match": "all", "kind": "x"})
    ch.basic_publish(ex, "a", b"a2")
    ch.basic_publish(ex, "b", b"b2")
    ch.basic_publish(hx, "", b"h-no", pika.BasicProperties(headers={"kind": "y"}))
    ch.basic_publish(hx, "", b"h-yes", pika.BasicProperties(headers={"kind": "x"}))
    ch.basic_publish(ex, "b", b"end")
    got = [b for _, b in read(conn, s, "first", 4)]
    assert sorted(got) == [b"a1", b"b2", b"end", b"h-yes"]


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


# -- interval offsets -----------------------------------------------------------------------


def publish(ch: Any, stream: str, bodies: list[bytes]) -> None:
    """Publish on a channel in confirm mode: each is stored when this returns."""
    for body in bodies:
        ch.basic_publish("", stream, body)


def test_an_interval_offset_starts_that_long_ago(conn: pika.BlockingConnection, unique: str) -> None:
    """"1h" (and "1Y", which reaches before the epoch) reads everything published in the
    test; "2s", asked at once after a gap of 3 s between two batches, only the later batch:
    the earlier one is a second and more older than the interval, the later one younger."""
    s = f"stream-i-{unique}"
    ch = conn.channel()
    ch.queue_declare(s, durable=True, arguments=STREAM)
    ch.confirm_delivery()
    publish(ch, s, [b"a0", b"a1", b"a2"])
    gap_from = time.time()
    assert read(conn, s, "1h", 3) == [(0, b"a0"), (1, b"a1"), (2, b"a2")]
    while time.time() < gap_from + 3.0:  # bounded: the gap between the batches
        conn.process_data_events(0.05)
    publish(ch, s, [b"b0", b"b1", b"b2"])
    assert read(conn, s, "2s", 3) == [(3, b"b0"), (4, b"b1"), (5, b"b2")]
    assert [o for o, _ in read(conn, s, "1Y", 6)] == list(range(6))
    assert [o for o, _ in read(conn, s, "1D", 6)] == list(range(6))


@pytest.mark.parametrize("offset", ["1X", "0h", "-1h", "h", "1.5h", "1 h", "1hh", ""])
def test_a_bad_interval_offset_is_refused(conn: pika.BlockingConnection, unique: str, offset: str) -> None:
    s = f"stream-bad-i-{unique}"
    ch = conn.channel()
    ch.queue_declare(s, durable=True, arguments=STREAM)
    ch.basic_qos(prefetch_count=1)
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.basic_consume(s, lambda *a: None, arguments={"x-stream-offset": offset})
    assert info.value.reply_code == 406
    assert "invalid x-stream-offset" in info.value.reply_text and "interval" in info.value.reply_text


# -- retention ------------------------------------------------------------------------------


def rest(server: Standalone, path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(server.addresses["web"][0] + path, method=method)
    with urllib.request.urlopen(req, timeout=WAIT) as r:
        body = r.read()
    return json.loads(body) if body else None


def topic_path(stream: str) -> str:
    return f"/admin/v2/persistent/public/default/{stream}"


def test_retention_arguments_are_the_topics_retention(conn: pika.BlockingConnection, unique: str,
                                                     amqp_broker: Standalone) -> None:
    """x-max-age and x-max-length-bytes are the topic's retention policy (whole minutes
    and MB, rounded up), x-stream-max-segment-size-bytes its ledger rollover size; a
    stream without them keeps everything (no limit), not the namespace's retention. A
    redeclare with other retention arguments is refused as inequivalent."""
    limited, plain = f"stream-r-{unique}", f"stream-p-{unique}"
    args = {**STREAM, "x-max-age": "7D", "x-max-length-bytes": 5_000_000,
            "x-stream-max-segment-size-bytes": 1_000_000}
    ch = conn.channel()
    ch.queue_declare(limited, durable=True, arguments=args)
    ch.queue_declare(plain, durable=True, arguments=STREAM)
    assert rest(amqp_broker, topic_path(limited) + "/retention") == {
        "retentionTimeInMinutes": 7 * 24 * 60, "retentionSizeInMB": 5}
    assert rest(amqp_broker, topic_path(limited) + "/ledgerRollover") == {"rolloverSizeInMB": 1}
    assert rest(amqp_broker, topic_path(plain) + "/retention") == {
        "retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    ch.queue_declare(limited, durable=True, arguments=args)  # the same: fine
    for other in ({**args, "x-max-age": "1D"}, {**args, "x-max-length-bytes": 1},
                  {k: v for k, v in args.items() if k != "x-stream-max-segment-size-bytes"}):
        with pytest.raises(pex.ChannelClosedByBroker) as info:
            ch.queue_declare(limited, durable=True, arguments=other)
        assert info.value.reply_code == 406 and "inequivalent arg" in info.value.reply_text
        ch = conn.channel()


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("x-max-age", "1X", "invalid_max_age"),
    ("x-max-age", "0D", "invalid_max_age"),
    ("x-max-age", "-1h", "invalid_max_age"),
    ("x-max-age", "h", "invalid_max_age"),
    ("x-max-age", 3600, "{unacceptable_type,signedint}"),
    ("x-max-length-bytes", -1, "{value_negative,-1}"),
    ("x-stream-max-segment-size-bytes", -1, "{value_negative,-1}"),
    ("x-stream-max-segment-size-bytes", "big", "{unacceptable_type,longstr}"),
])
def test_bad_retention_arguments_are_refused(conn: pika.BlockingConnection, unique: str,
                                             name: str, value: Any, problem: str) -> None:
    s = f"stream-bad-r-{unique}"
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(s, durable=True, arguments={**STREAM, name: value})
    assert info.value.reply_code == 406
    assert info.value.reply_text == (f"PRECONDITION_FAILED - invalid arg '{name}' for queue '{s}' "
                                     f"in vhost '/': {problem}")
    with pytest.raises(pex.ChannelClosedByBroker) as info:  # nothing was declared
        conn.channel().queue_declare(s, passive=True)
    assert info.value.reply_code == 404


def test_a_segment_size_past_rabbitmqs_largest_is_refused(conn: pika.BlockingConnection, unique: str) -> None:
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        conn.channel().queue_declare(f"stream-seg-{unique}", durable=True, arguments={
            **STREAM, "x-stream-max-segment-size-bytes": 3_000_000_001})
    assert info.value.reply_code == 406
    assert info.value.reply_text == \
        "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes"


ENTRIES_PER_LEDGER = 5


@pytest.fixture
def small_ledgers(tmp_path: Path) -> Iterator[Standalone]:
    """A broker whose ledgers roll over every 5 entries, whatever their age, and whose
    retention check runs only when asked (the admin API's trim), with the namespace's
    default retention: nothing that has been consumed is kept."""
    s = Standalone(tmp_path, conf={**AMQP_CONF, "managedLedgerMaxEntriesPerLedger": ENTRIES_PER_LEDGER,
                                   "managedLedgerMinLedgerRolloverTimeMinutes": 0,
                                   "retentionCheckIntervalInSeconds": 3600}).start()
    try:
        yield s
    finally:
        s.kill()


def test_retention_trims_a_stream_whatever_its_readers(small_ledgers: Standalone) -> None:
    """20 messages, 5 to a ledger, in each of three streams, then the retention check:
    with x-max-length-bytes=1 only the newest ledger holding data stays (the stream starts
    at offset 15), although a reader still holds offset 0 unacknowledged, and that reader
    goes on at 15; with x-max-age=1s, once its messages are a second old, nothing stays
    (the idle ledger is sealed, then deleted); a stream without retention arguments keeps
    all 20, after a restart too."""
    params = pika.ConnectionParameters("127.0.0.1", amqp_port(small_ledgers),
                                       credentials=pika.PlainCredentials("guest", "guest"),
                                       connection_attempts=1, socket_timeout=5)
    conn = pika.BlockingConnection(params)
    try:
        sized, aged, kept = "sized", "aged", "kept"
        ch = conn.channel()
        ch.queue_declare(aged, durable=True, arguments={**STREAM, "x-max-age": "1s"})
        ch.queue_declare(sized, durable=True, arguments={**STREAM, "x-max-length-bytes": 1})
        ch.queue_declare(kept, durable=True, arguments=STREAM)
        ch.confirm_delivery()
        for s in (aged, sized, kept):
            publish(ch, s, [b"%s%d" % (s.encode(), i) for i in range(20)])
        aged_at = time.time()
        # a reader of the sized stream holding its first message unacknowledged
        holder = conn.channel()
        holder.basic_qos(prefetch_count=1)
        held: list[tuple[int, int]] = []
        holder.basic_consume(sized, lambda c, m, p, b: held.append((p.headers["x-stream-offset"], m.delivery_tag)),
                             arguments={"x-stream-offset": "first"})
        end = time.monotonic() + WAIT
        while not held and time.monotonic() < end:
            conn.process_data_events(0.05)
        assert [o for o, _ in held] == [0]

        for s in (sized, kept):
            rest(small_ledgers, topic_path(s) + "/trim", "POST")
        assert read(conn, sized, "first", 1)[0][0] == 15
        assert ch.queue_declare(sized, durable=True, passive=True).method.message_count == 5
        assert [o for o, _ in read(conn, kept, "first", 20)] == list(range(20))
        assert ch.queue_declare(kept, durable=True, passive=True).method.message_count == 20
        holder.basic_ack(held[0][1])
        end = time.monotonic() + WAIT
        while len(held) < 2 and time.monotonic() < end:
            conn.process_data_events(0.05)
        assert [o for o, _ in held] == [0, 15]

        while time.time() < aged_at + 1.2:  # bounded: until the aged stream's messages are 1 s old
            conn.process_data_events(0.05)
        rest(small_ledgers, topic_path(aged) + "/trim", "POST")
        assert ch.queue_declare(aged, durable=True, passive=True).method.message_count == 0
        assert read(conn, aged, "first", 1, timeout=0.5) == []
        ledgers = rest(small_ledgers, topic_path(aged) + "/internalStats")["ledgers"]
        assert [led["entries"] for led in ledgers] == [0]
        publish(ch, aged, [b"later"])
        assert read(conn, aged, "first", 1) == [(20, b"later")]
    finally:
        conn.close()
    # After a restart the streams' arguments are their topics' retention still, and what
    # the check kept is there.
    small_ledgers.kill()
    again = Standalone(small_ledgers.data_dir, conf=small_ledgers.conf).start()
    try:
        assert rest(again, topic_path(sized) + "/retention") == {
            "retentionTimeInMinutes": -1, "retentionSizeInMB": 1}
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", amqp_port(again), credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=1, socket_timeout=5))
        try:
            assert [o for o, _ in read(conn, kept, "first", 20)] == list(range(20))
            assert [o for o, _ in read(conn, sized, "first", 5)] == list(range(15, 20))
        finally:
            conn.close()
    finally:
        again.kill()
