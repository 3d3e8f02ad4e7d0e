"""Kafka headers read back from storage exactly as produced: binary and null values, empty
values, repeated names, in order; a Pulsar consumer of the same topic sees text properties
(binary values base64, null ones empty) and the ``__kafka_header_kinds`` marker."""

from __future__ import annotations

import base64
import random
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from core import _native
from core.format import Message, entry_from_messages, messages_from_entry
from handlers.kafka import _mapping
from handlers.kafka import _records as rb
from tests._standalone import Standalone
from tests.handlers.kafka._wire import bootstrap, free_port
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE, create_topic, drain_confluent

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")

Headers = list[tuple[str, bytes | None]]
KINDS = "__kafka_header_kinds"
MIXED: Headers = [("bin", b"\xff\xfe\x00\x01"), ("null", None), ("dup", b"1"), ("empty", b""),
                  ("dup", b"2"), ("text", "ü".encode())]
# Per record: mixed kinds, text only (repeated name), none, a last header named like the
# marker, a lone null value, mixed again.
RECORDS: list[Headers] = [
    [*MIXED, ("i", b"0")],
    [("a", b"x"), ("a", b"y")],
    [],
    [("x", b"1"), (KINDS, b"t")],
    [("n", None)],
    [*MIXED, ("i", b"5")],
]


# -- the mapping ---------------------------------------------------------------------------------


def test_headers_that_are_not_text_get_a_kinds_marker() -> None:
    assert _mapping.header_properties(RECORDS[0]) == [
        ("bin", "//4AAQ=="), ("null", ""), ("dup", "1"), ("empty", ""), ("dup", "2"),
        ("text", "ü"), ("i", "0"), (KINDS, "bntttt" + "t")]
    assert _mapping.header_properties(RECORDS[1]) == [("a", "x"), ("a", "y")]
    assert _mapping.header_properties([]) == []
    assert _mapping.header_properties(RECORDS[3]) == [("x", "1"), (KINDS, "t"), (KINDS, "tt")]
    assert _mapping.header_properties(RECORDS[4]) == [("n", ""), (KINDS, "n")]
    for headers in RECORDS:
        assert list(_mapping.headers_of(_mapping.header_properties(headers))) == headers


def test_properties_without_a_well_formed_marker_are_text_headers() -> None:
    """Entries from Pulsar producers, or written before the marker, read as they did."""
    for props in ([("b", "//4AAQ==")], [("b", "//4AAQ=="), (KINDS, "bb")],
                  [("b", "//4AAQ=="), (KINDS, "x")], [(KINDS, "b"), ("b", "//4AAQ==")],
                  [("b", "//4AAQ=="), (KINDS, "B")]):
        assert _mapping.headers_of(props) == tuple((k, v.encode()) for k, v in props)
    # Marked base64 that is not base64 stays its text.
    assert _mapping.headers_of([("b", "not base64!"), (KINDS, "b")]) == (("b", b"not base64!"),)
    assert _mapping.headers_of([(KINDS, "")]) == ()
    entry = entry_from_messages([Message(payload=b"p", properties={"b": "//4AAQ==", "e": ""})],
                                producer_name="p", sequence_id=0, publish_time=1)
    out = _mapping.batch_from_entry(entry, index=0, num_messages=1, publish_time=1)
    [back] = rb.decode_batches(out)
    assert back.records[0].headers == (("b", b"//4AAQ=="), ("e", b""))


def _batch(codec: int, records: list[Headers]) -> rb.RecordBatch:
    recs = [rb.Record(offset_delta=i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"v%d" % i,
                      headers=tuple(h)) for i, h in enumerate(records)]
    [batch] = rb.decode_batches(rb.encode_batch(recs, base_offset=0, compression=codec))
    return batch


@pytest.mark.parametrize("codec", [rb.NONE, rb.ZSTD])
@pytest.mark.parametrize("single", [True, False])
def test_entries_give_the_headers_back_exactly(codec: int, single: bool) -> None:
    records = RECORDS[:1] if single else RECORDS
    batch = _batch(codec, records)
    entry = _mapping.entry_from_batch(batch, publish_time=5)
    assert [list(r.headers) for r in _mapping.records_from_entry(entry, 5)] == records
    n = len(records)
    for out in (_mapping.batch_from_entry(entry, index=n - 1, num_messages=n, publish_time=5),
                _mapping.python_batch_from_entry(entry, index=n - 1, num_messages=n,
                                                 publish_time=5)):
        [back] = rb.decode_batches(out)
        assert [list(r.headers) for r in back.records] == records
    # A Pulsar reader sees the text forms, the marker last.
    props = [m.properties for m in messages_from_entry(entry)]
    assert props[0] == {"bin": "//4AAQ==", "null": "", "dup": "2", "empty": "", "text": "ü",
                        "i": "0", KINDS: "bnttttt"}
    if not single:
        assert props[1] == {"a": "y"}


def test_native_writer_and_reader_agree_with_python_on_marked_headers() -> None:
    rng = random.Random(4)
    for _ in range(50):
        records = [rng.choice(RECORDS) for _ in range(rng.randint(1, 4))]
        batch = _batch(rb.NONE, records)
        [header] = rb.decode_batches(batch.raw, records=False)
        native = _mapping.native_entry(header, publish_time=5)
        assert native is not None
        entry = _mapping.entry_from_batch(batch, publish_time=5,
                                          producer_name=_mapping.producer_name_of(batch))
        assert native[0] == entry
        n = len(records)
        fetched = _native.kafka_batch_from_entry(entry, n - 1, n, 5)
        assert fetched is not None
        assert fetched == _mapping.python_batch_from_entry(entry, index=n - 1, num_messages=n,
                                                           publish_time=5)
        [back] = rb.decode_batches(fetched)
        assert [list(r.headers) for r in back.records] == records


# -- through a broker, read back after a restart -------------------------------------------------

# (topic suffix, compression, one record per batch)
CASES = [("none", "none", False), ("lz4", "lz4", False), ("single", "none", True),
         ("single-gzip", "gzip", True)]


def _produce_confluent(boot: str, topic: str, compression: str, single: bool) -> None:
    p = Producer({"bootstrap.servers": boot, "compression.type": compression, "linger.ms": 50})
    for i, headers in enumerate(RECORDS):
        p.produce(topic, value=b"v%d" % i, partition=0, headers=[(k, v) for k, v in headers])
        if single:
            assert p.flush(DEADLINE) == 0
    assert p.flush(DEADLINE) == 0


def _produce_kafka_python(boot: str, topic: str, compression: str, single: bool) -> None:
    # kafka-python sends no null header values.
    p = KafkaProducer(bootstrap_servers=boot, linger_ms=50,
                      compression_type=None if compression == "none" else compression)
    for i, headers in enumerate(RECORDS):
        p.send(topic, value=b"v%d" % i, partition=0,
               headers=[(k, v) for k, v in headers if v is not None])
        if single:
            p.flush(DEADLINE)
    p.flush(DEADLINE)
    p.close()


def _expected(producer: str) -> list[Headers]:
    if producer == "kp":
        return [[(k, v) for k, v in h if v is not None] for h in RECORDS]
    return RECORDS


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Standalone, str]]:
    """A broker that was sent every case's records, then restarted: its batch cache is
    empty, so consumers read the stored entries."""
    data = tmp_path_factory.mktemp("headers")
    conf = {**KAFKA_CONF, "bookiePort": free_port()}
    s = Standalone(data, conf=conf).start()
    try:
        boot = bootstrap(s.addresses)
        for name, compression, single in CASES:
            for producer, send in (("cf", _produce_confluent), ("kp", _produce_kafka_python)):
                topic = f"hd-{producer}-{name}"
                create_topic(boot, topic, 1)
                send(boot, topic, compression, single)
    finally:
        s.kill()
    s = Standalone(data, conf=conf).start()
    try:
        yield s, bootstrap(s.addresses)
    finally:
        s.kill()


def _confluent_headers(boot: str, topic: str) -> list[Headers]:
    c = Consumer({"bootstrap.servers": boot, "group.id": f"g-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = drain_confluent(c, len(RECORDS))
    c.close()
    assert [m.value() for m in got] == [b"v%d" % i for i in range(len(RECORDS))]
    return [m.headers() or [] for m in got]


def _kafka_python_headers(boot: str, topic: str) -> list[Headers]:
    c = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest")
    tp = KTopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got: list[Any] = []
    end = time.monotonic() + DEADLINE
    while len(got) < len(RECORDS) and time.monotonic() < end:
        for records in c.poll(500).values():
            got.extend(records)
    c.close()
    assert [r.value for r in got] == [b"v%d" % i for i in range(len(RECORDS))]
    return [list(r.headers) for r in got]


@pytest.mark.parametrize("reader", ["confluent", "kafka-python"])
@pytest.mark.parametrize("producer", ["cf", "kp"])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_each_client_reads_headers_exactly_after_a_restart(
        restarted: tuple[Standalone, str], reader: str, producer: str, name: str) -> None:
    _, boot = restarted
    read = _confluent_headers if reader == "confluent" else _kafka_python_headers
    assert read(boot, f"hd-{producer}-{name}") == _expected(producer)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_pulsar_consumer_sees_text_properties(restarted: tuple[Standalone, str], name: str) -> None:
    s, _ = restarted
    client = pulsar.Client(s.pulsar_url)
    try:
        consumer = client.subscribe(f"hd-cf-{name}", "sub",
                                    initial_position=pulsar.InitialPosition.Earliest)
        got = []
        for _ in RECORDS:
            m = consumer.receive(10_000)
            got.append(m.properties())
            consumer.acknowledge(m)
    finally:
        client.close()
    # pulsar-client keeps the first value of a repeated name.
    b64 = base64.b64encode(b"\xff\xfe\x00\x01").decode()
    mixed = {"bin": b64, "null": "", "dup": "1", "empty": "", "text": "ü", KINDS: "bnttttt"}
    assert got == [{**mixed, "i": "0"}, {"a": "x"}, {}, {"x": "1", KINDS: "t"},
                   {"n": "", KINDS: "n"}, {**mixed, "i": "5"}]
