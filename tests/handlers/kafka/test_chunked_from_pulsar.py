"""A message a Pulsar producer split into chunks (``chunking_enabled``, a payload over
``maxMessageSize``) reaches Kafka consumers as one record holding the whole message, at
the offset of its last chunk; the offsets of the chunks before it are gaps, and a consumer
positioned at one goes on to the whole message.

The first tests drive :meth:`PartitionLog.read` over a ledger held in memory (chunks laid
out exactly as wanted: interleaved, resent, missing); the others run pulsar-client,
confluent-kafka and kafka-python against a standalone whose ``maxMessageSize`` is small,
so that messages of a few hundred kilobytes come in many chunks."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pulsar
import pytest
from confluent_kafka import Consumer, TopicPartition

from core.format import LZ4, NONE, ZSTD, MessageMetadata, compress, encode_entry
from core.format import pulsar_api_pb2 as pb
from core.storage import Entry, Position
from handlers.kafka import _records as rb
from handlers.kafka import _topics
from handlers.kafka._topics import BatchCache, PartitionLog
from handlers.pulsar import _events as ev
from tests._standalone import Standalone
from tests.handlers.kafka._wire import bootstrap, free_port
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import drain_confluent
from tests.handlers.pulsar._raw import RawClient

with warnings.catch_warnings():
    # kafka-python 3.0 reads its schemas with a deprecated importlib.resources call.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")

DEADLINE = 30.0
MAX_MESSAGE_SIZE = 16 * 1024
"""The standalone's ``maxMessageSize``: the official client splits larger messages."""


# -- PartitionLog.read over a ledger in memory ---------------------------------------------


class _Ledger:
    """A managed ledger of entries in memory, one message each (index = entry id,
    counting from ``first``), that counts the entries it reads."""

    def __init__(self, datas: list[bytes], first: int = 0):
        self.entries = [Entry(Position(3, first + i), 1_000 + i, first + i, 1, d)
                        for i, d in enumerate(datas)]
        self.first = first
        self.read_count = 0

    def next_index(self) -> int:
        return self.first + len(self.entries)

    def ledgers(self) -> list[dict[str, Any]]:
        return [{"entries": len(self.entries), "firstIndex": self.first}]

    async def find_by_index(self, index: int) -> Position | None:
        for e in self.entries:
            if e.index >= index:
                return e.position
        return None

    async def read_entries(self, pos: Position, max_entries: int) -> list[Entry]:
        got = [e for e in self.entries if e.position >= pos][:max_entries]
        self.read_count += len(got)
        return got


def _log(datas: list[bytes], first: int = 0) -> tuple[PartitionLog, _Ledger]:
    ml = _Ledger(datas, first)
    topic = SimpleNamespace(ml=ml, name="persistent://public/default/c-partition-0", policies={})
    owner = SimpleNamespace(cache=BatchCache(), broker=SimpleNamespace(metadata={}),
                            log_start_path=lambda name: f"/log-start/{name}")
    return PartitionLog("c", 0, topic, owner), ml  # type: ignore[arg-type]


def _plain(value: bytes, key: str = "p") -> bytes:
    return encode_entry(MessageMetadata(producer_name="plain", sequence_id=0, publish_time=500,
                                        partition_key=key), value)


def _chunks(uuid: str, value: bytes, n: int, *, compression: int = NONE, key: str = "big",
            props: dict[str, str] | None = None, event_time: int = 0) -> list[bytes]:
    """The chunk entries a producer writes for ``value`` (compressed, then split in ``n``)."""
    payload = compress(compression, value) if compression != NONE else value
    step = -(-len(payload) // n)
    out = []
    for i in range(n):
        md = MessageMetadata(producer_name=uuid.split("-")[0], sequence_id=0, publish_time=700,
                             partition_key=key, uuid=uuid, num_chunks_from_msg=n,
                             total_chunk_msg_size=len(payload), chunk_id=i)
        if compression != NONE:
            md.compression = compression  # type: ignore[assignment]
            md.uncompressed_size = len(value)
        if event_time:
            md.event_time = event_time
        for k, v in (props or {}).items():
            md.properties.add(key=k, value=v)
        out.append(encode_entry(md, payload[i * step:(i + 1) * step]))
    return out


def _records(batches: list[bytes]) -> list[rb.Record]:
    """The records of the batches a read returns, with absolute offsets."""
    out = []
    for b in rb.decode_batches(b"".join(batches)):
        for r in b.records:
            out.append(r._replace(offset_delta=b.base_offset + r.offset_delta))
    return out


def _seen(batches: list[bytes]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset_delta, r.key, r.value) for r in _records(batches)]


BIG = bytes(range(256)) * 40


async def test_chunked_message_is_one_record_at_its_last_chunk() -> None:
    chunks = _chunks("a-0", BIG, 3, props={"h": "v"}, event_time=42)
    plog, ml = _log([_plain(b"first"), *chunks, _plain(b"after")])
    got = await plog.read(0, 1 << 20, ml.next_index())
    assert _seen(got) == [(0, b"p", b"first"), (3, b"big", BIG), (4, b"p", b"after")]
    whole = _records(got)[1]
    assert whole.headers == (("h", b"v"),)
    assert whole.timestamp == 42
    # A read from a chunk before the last goes on to the whole message, even with a byte
    # budget below it (the first batch always fits), from storage or from the cache.
    for offset in (1, 2, 3):
        assert _seen(await plog.read(offset, 10, ml.next_index())) == [(3, b"big", BIG)]
        plog.hints.clear()
        fresh, fresh_ml = _log([_plain(b"first"), *chunks, _plain(b"after")])
        assert _seen(await fresh.read(offset, 10, fresh_ml.next_index())) == [(3, b"big", BIG)]


async def test_timestamp_is_the_publish_time_without_an_event_time() -> None:
    plog, ml = _log(_chunks("a-0", BIG, 2))
    [whole] = _records(await plog.read(0, 1 << 20, ml.next_index()))
    assert (whole.offset_delta, whole.value, whole.timestamp) == (1, BIG, 700)


async def test_whole_message_is_cached() -> None:
    plog, ml = _log([_plain(b"first"), *_chunks("a-0", BIG, 3), _plain(b"after")])
    first = await plog.read(0, 1 << 20, ml.next_index())
    reads = ml.read_count
    plog.hints.clear()
    # Every entry is in the batch cache now (chunks before the last as gaps): no storage.
    for offset, want in [(0, first), (1, first[1:]), (2, first[1:]), (3, first[1:]), (4, first[2:])]:
        assert await plog.read(offset, 1 << 20, ml.next_index()) == want
        plog.hints.clear()
    assert ml.read_count == reads


@pytest.mark.parametrize("start", [0, 3, 4, 5])
async def test_chunks_of_two_producers_interleaved(start: int) -> None:
    other = bytes(reversed(BIG)) + b"tail"
    a, b = _chunks("a-0", BIG, 3, key="ka"), _chunks("b-0", other, 3, key="kb")
    # a0 b0 a1 b1 a2 b2 plain: a is at offset 4, b at 5
    plog, ml = _log([a[0], b[0], a[1], b[1], a[2], b[2], _plain(b"end")])
    want = [(4, b"ka", BIG), (5, b"kb", other), (6, b"p", b"end")]
    got = await plog.read(start, 1 << 20, ml.next_index())
    assert _seen(got) == [w for w in want if w[0] >= start]


async def test_resent_chunks_are_put_together_as_a_consumer_would() -> None:
    a = _chunks("a-0", BIG, 3)
    # The producer reconnected after two chunks and sent the message again from chunk 0;
    # chunk 1 also arrived twice.
    plog, ml = _log([a[0], a[1], a[0], a[1], a[1], a[2]])
    assert _seen(await plog.read(0, 1 << 20, ml.next_index())) == [(5, b"big", BIG)]
    plog2, ml2 = _log([a[0], a[1], a[0], a[1], a[1], a[2]])
    assert _seen(await plog2.read(5, 1 << 20, ml2.next_index())) == [(5, b"big", BIG)]


@pytest.mark.parametrize("compression", [ZSTD, LZ4])
async def test_compressed_message_put_together_then_decompressed(compression: int) -> None:
    value = os.urandom(3000) * 5
    plog, ml = _log([*_chunks("z-0", value, 4, compression=compression), _plain(b"x")])
    assert _seen(await plog.read(0, 1 << 20, ml.next_index())) == [(3, b"big", value), (4, b"p", b"x")]
    plog.hints.clear()
    plog.owner.cache = BatchCache()
    assert _seen(await plog.read(3, 1 << 20, ml.next_index())) == [(3, b"big", value), (4, b"p", b"x")]


async def test_message_with_missing_chunks_is_skipped() -> None:
    a = _chunks("a-0", BIG, 3)
    # Chunk 0 was trimmed away: the log starts at chunk 1 (offset 1).
    plog, ml = _log([a[1], a[2], _plain(b"after")], first=1)
    for start in (1, 2):
        assert _seen(await plog.read(start, 1 << 20, ml.next_index())) == [(3, b"p", b"after")]
        plog.hints.clear()
    # A chunk in the middle is missing.
    plog, ml = _log([a[0], a[2], _plain(b"after")])
    assert _seen(await plog.read(0, 1 << 20, ml.next_index())) == [(2, b"p", b"after")]


async def test_chunks_too_far_back_are_not_looked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_topics, "CHUNK_LOOKBACK", 2)
    a = _chunks("a-0", BIG, 2)
    near = [a[0], _plain(b"x"), _plain(b"y"), a[1]]
    far = [a[0], _plain(b"x"), _plain(b"y"), _plain(b"z"), a[1]]
    plog, ml = _log(near)
    assert _seen(await plog.read(3, 1 << 20, ml.next_index())) == [(3, b"big", BIG)]
    plog, ml = _log(far)
    assert _seen(await plog.read(4, 1 << 20, ml.next_index())) == []
    # Read in one go from its first chunk, the message is whole whatever lies between.
    plog, ml = _log(far)
    assert [r[0] for r in _seen(await plog.read(0, 1 << 20, ml.next_index()))] == [1, 2, 3, 4]


# -- pulsar-client to Kafka clients --------------------------------------------------------


@pytest.fixture(scope="module")
def chunk_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("chunks")
    s = Standalone(data, conf={**KAFKA_CONF, "maxMessageSize": MAX_MESSAGE_SIZE}).start()
    try:
        yield s
    finally:
        s.kill()


def _value(n: int) -> bytes:
    return os.urandom(n)


def _send(url: str, topic: str, messages: list[tuple[bytes, str, dict[str, str]]], *,
          compression: Any = None, event_timestamp: int | None = None) -> None:
    client = pulsar.Client(url)
    try:
        kw = {"compression_type": compression} if compression is not None else {}
        producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False, **kw)
        for value, key, props in messages:
            producer.send(value, partition_key=key, properties=props, event_timestamp=event_timestamp)
        producer.close()
    finally:
        client.close()


def _confluent(boot: str, topic: str, offset: int, n: int, **conf: Any) -> list[Any]:
    c = Consumer({"bootstrap.servers": boot, "group.id": f"g-{topic}-{offset}",
                  "enable.auto.commit": False, "enable.partition.eof": False, **conf})
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        return drain_confluent(c, n)
    finally:
        c.close()


def _kafka_python(boot: str, topic: str, offset: int, n: int, **conf: Any) -> list[Any]:
    c = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, **conf)
    try:
        tp = KTopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, offset)
        got: list[Any] = []
        end = time.monotonic() + DEADLINE
        while len(got) < n and time.monotonic() < end:
            for records in c.poll(500).values():
                got.extend(records)
        return got
    finally:
        c.close()


def test_whole_message_with_key_headers_and_time(chunk_broker: Standalone, unique: str) -> None:
    topic = f"chunked-{unique}"
    value = _value(100_000)
    _send(chunk_broker.pulsar_url, topic, [(value, "big", {"h": "v", "n": "1"})],
          event_timestamp=1_600_000_000_123)
    boot = bootstrap(chunk_broker.addresses)
    [m] = _confluent(boot, topic, 0, 1)
    assert m.offset() > 1, "the record is at its last chunk's offset"
    assert (m.key(), m.value(), sorted(m.headers())) == (b"big", value, [("h", b"v"), ("n", b"1")])
    assert m.timestamp()[1] == 1_600_000_000_123
    [r] = _kafka_python(boot, topic, 0, 1)
    assert (r.offset, r.key, r.value, sorted(r.headers)) == (m.offset(), b"big", value,
                                                             [("h", b"v"), ("n", b"1")])
    assert r.timestamp == 1_600_000_000_123


def test_chunked_message_between_plain_ones(chunk_broker: Standalone, unique: str) -> None:
    topic = f"between-{unique}"
    value = _value(60_000)
    _send(chunk_broker.pulsar_url, topic, [(b"before", "a", {}), (value, "big", {}), (b"after", "b", {})])
    boot = bootstrap(chunk_broker.addresses)
    whole = 1 + -(-len(value) // MAX_MESSAGE_SIZE)  # at least this many chunks
    got = _confluent(boot, topic, 0, 3)
    offsets = [m.offset() for m in got]
    assert offsets[0] == 0 and offsets[1] >= whole - 1 and offsets[2] == offsets[1] + 1
    assert [m.value() for m in got] == [b"before", value, b"after"]
    last = offsets[1]
    # A consumer at any offset of a chunk gets the whole message, at its last chunk's offset,
    # whatever its fetch size.
    for offset in (1, 2, last - 1, last):
        got = _confluent(boot, topic, offset, 2, **{"fetch.max.bytes": 1024, "message.max.bytes": 1000,
                                                   "max.partition.fetch.bytes": 1024})
        assert [(m.offset(), m.value()) for m in got] == [(last, value), (last + 1, b"after")]
        kp = _kafka_python(boot, topic, offset, 2, max_partition_fetch_bytes=1024)
        assert [(r.offset, r.value) for r in kp] == [(last, value), (last + 1, b"after")]
    # A group whose committed offset is a middle chunk resumes with the whole message.
    group = f"grp-{unique}"
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    c.close()
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "latest"})
    c.subscribe([topic])
    try:
        got = drain_confluent(c, 2)
    finally:
        c.close()
    assert [(m.offset(), m.value()) for m in got] == [(last, value), (last + 1, b"after")]
    # The end of the log after the whole message is where Kafka says the log ends.
    c = Consumer({"bootstrap.servers": boot, "group.id": group})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, last + 2)
    finally:
        c.close()


def test_two_producers_interleaved(chunk_broker: Standalone, unique: str) -> None:
    """Chunks of two producers' messages interleave in the partition: each message is put
    together from its own chunks (matched by uuid)."""
    topic = f"persistent://public/default/interleaved-{unique}"
    values = {"p1": _value(40_000), "p2": _value(50_000)}
    raw = RawClient(chunk_broker.pulsar_url)
    try:
        raw.connect()
        for pid, name in enumerate(values, 1):
            raw.send(ev.CommandProducer.build(topic=topic, producer_id=pid, request_id=pid,
                                              producer_name=name))
            assert isinstance(raw.next_event(), ev.CommandProducerSuccess)
        n = 4
        parts = {name: [v[i * len(v) // n:(i + 1) * len(v) // n] for i in range(n)]
                 for name, v in values.items()}
        for i in range(n):
            for pid, name in enumerate(values, 1):
                md = MessageMetadata(producer_name=name, sequence_id=0,
                                     publish_time=int(time.time() * 1000), partition_key=name,
                                     uuid=f"{name}-0", num_chunks_from_msg=n,
                                     total_chunk_msg_size=len(values[name]), chunk_id=i)
                raw.send(ev.CommandSend(command=pb.CommandSend(producer_id=pid, sequence_id=0,
                                                               num_messages=1),
                                        entry=encode_entry(md, parts[name][i])))
                assert isinstance(raw.next_event(), ev.CommandSendReceipt)
    finally:
        raw.close()
    name = topic.rsplit("/", 1)[1]
    boot = bootstrap(chunk_broker.addresses)
    # p1's last chunk is the 7th entry (offset 6), p2's the 8th.
    want = [(6, b"p1", values["p1"]), (7, b"p2", values["p2"])]
    assert [(m.offset(), m.key(), m.value()) for m in _confluent(boot, name, 0, 2)] == want
    # From p2's last chunk alone its earlier chunks are read back from storage.
    assert [(m.offset(), m.key(), m.value()) for m in _confluent(boot, name, 7, 1)] == want[1:]
    assert [(r.offset, r.key, r.value) for r in _kafka_python(boot, name, 5, 2)] == want
    # Pulsar consumers put the same messages together.
    client = pulsar.Client(chunk_broker.pulsar_url)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert {reader.read_next(10_000).data() for _ in range(2)} == set(values.values())
    finally:
        client.close()


def test_two_pulsar_client_producers_at_once(chunk_broker: Standalone, unique: str) -> None:
    topic = f"concurrent-{unique}"
    values = {f"k{i}": _value(80_000) for i in range(4)}

    def produce(keys: list[str]) -> None:
        _send(chunk_broker.pulsar_url, topic, [(values[k], k, {}) for k in keys])

    threads = [threading.Thread(target=produce, args=(keys,)) for keys in (["k0", "k1"], ["k2", "k3"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    boot = bootstrap(chunk_broker.addresses)
    got = _confluent(boot, topic, 0, 4)
    assert {m.key().decode(): m.value() for m in got} == values
    offsets = [m.offset() for m in got]
    assert offsets == sorted(set(offsets)) and offsets[0] > 0


@pytest.mark.parametrize("compression", [pulsar.CompressionType.ZSTD, pulsar.CompressionType.LZ4])
def test_compressed_chunked_message_from_pulsar_client(chunk_broker: Standalone, unique: str, compression: Any) -> None:
    topic = f"compressed-{unique}"
    value = os.urandom(60_000).hex().encode()  # compresses, to more than one chunk holds
    _send(chunk_broker.pulsar_url, topic, [(value, "z", {"c": "1"}), (b"after", "a", {})],
          compression=compression)
    boot = bootstrap(chunk_broker.addresses)
    got = _confluent(boot, topic, 0, 2)
    assert [(m.key(), m.value()) for m in got] == [(b"z", value), (b"a", b"after")]
    assert got[0].offset() > 1 and got[0].headers() == [("c", b"1")]
    r = _kafka_python(boot, topic, 1, 1)[0]
    assert (r.offset, r.value) == (got[0].offset(), value)
    # ListOffsets by time finds the message at its last chunk (its chunks hold no records)
    c = Consumer({"bootstrap.servers": boot, "group.id": f"t-{topic}"})
    try:
        [found] = c.offsets_for_times([TopicPartition(topic, 0, got[0].timestamp()[1])], timeout=DEADLINE)
    finally:
        c.close()
    assert (found.error, found.offset) == (None, got[0].offset())


def test_read_after_restart(tmp_path_factory: pytest.TempPathFactory, unique: str) -> None:
    """From storage, with no batch cached: a new broker process reads the chunks back."""
    data = tmp_path_factory.mktemp("restart")
    conf = {**KAFKA_CONF, "maxMessageSize": MAX_MESSAGE_SIZE, "bookiePort": free_port()}
    topic = f"restart-{unique}"
    value = _value(70_000)
    s = Standalone(data, conf=conf).start()
    try:
        _send(s.pulsar_url, topic, [(b"before", "a", {}), (value, "big", {"h": "v"}), (b"after", "b", {})])
    finally:
        s.kill()
    s = Standalone(data, conf=conf).start()
    try:
        boot = bootstrap(s.addresses)
        got = _confluent(boot, topic, 0, 3)
        assert [(m.key(), m.value()) for m in got] == [(b"a", b"before"), (b"big", value), (b"b", b"after")]
        assert got[1].headers() == [("h", b"v")]
        last = got[1].offset()
        # Straight to the last chunk and to a middle one: earlier chunks read back.
        s.kill()
        s = Standalone(data, conf=conf).start()
        boot = bootstrap(s.addresses)
        assert [(m.offset(), m.value()) for m in _confluent(boot, topic, last, 1)] == [(last, value)]
        assert [(m.offset(), m.value()) for m in _confluent(boot, topic, 2, 1)] == [(last, value)]
    finally:
        s.kill()
