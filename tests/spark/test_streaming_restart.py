"""Issue 51: a streaming query restarted from its checkpoint reads every message exactly
once, whatever entries (Kafka record batches, Pulsar batches, chunked messages) end or
start a run.

The steps are the issue's, on a fresh standalone per test: Pulsar and Kafka writers on
one new topic, a batch read, then a parquet sink with a checkpoint run with
``trigger(availableNow=True)`` four times, more messages appended before each restart.
They run with the default read path (from the bookies; a chunked message makes it hand
the rest of its range to a Pulsar Reader) and with ``directRead=false`` (a Reader for
every range, the path an executor without the native core takes).
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests._standalone import Standalone
from tests.spark.conftest import BROKER_CONF, admin_url, kafka_bootstrap, reader

with warnings.catch_warnings():
    # kafka-python 3.0 reads its schemas with a deprecated importlib.resources call.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaProducer

pytestmark = [pytest.mark.xdist_group("spark-restart"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")]

QUERY_TIMEOUT_S = 180
#: Small enough that a Pulsar producer splits a 100 kB message into chunks.
MAX_MESSAGE_SIZE = 40_000


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A fresh standalone for each run of the steps, as in the issue."""
    conf = {**BROKER_CONF, "maxMessageSize": MAX_MESSAGE_SIZE}
    s = Standalone(tmp_path_factory.mktemp("restart-broker"), conf=conf).start()
    try:
        yield s
    finally:
        s.kill()


def _pulsar_send(broker: Standalone, topic: str, values: list[bytes], *, batching: bool = False,
                 chunking: bool = False) -> None:
    client = pulsar.Client(broker.pulsar_url)
    try:
        if chunking:
            p = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
            for v in values:
                p.send(v)
        elif batching:
            # Batches of up to 64 messages; the last value closes a batch of several.
            p = client.create_producer(topic, batching_enabled=True, batching_max_messages=64,
                                       batching_max_publish_delay_ms=50)
            for v in values:
                p.send_async(v, None)
            p.flush()
        else:
            p = client.create_producer(topic, batching_enabled=False)
            for v in values:
                p.send(v)
    finally:
        client.close()


def _kafka_python_send(broker: Standalone, topic: str, values: list[bytes]) -> None:
    # Default settings and one flush at the end: the records go in multi-record batches.
    p = KafkaProducer(bootstrap_servers=kafka_bootstrap(broker))
    try:
        for v in values:
            p.send(topic, v)
        p.flush()
    finally:
        p.close()


def _confluent_send(broker: Standalone, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka_bootstrap(broker), "linger.ms": 20})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(30) == 0


def _run_query(session: Any, broker: Standalone, topic: str, out: Path, ckpt: Path,
               direct_read: str) -> None:
    stream = (session.readStream.format("magnetar").option("serviceUrl", broker.pulsar_url)
              .option("adminUrl", admin_url(broker)).option("topics", topic)
              .option("startingOffsets", "earliest").option("directRead", direct_read).load()
              .selectExpr("offset", "cast(value as string) as value"))
    q = (stream.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S), "availableNow query did not finish"
    finally:
        q.stop()
    assert q.exception() is None


def _kafka_view(broker: Standalone, topic: str, n: int) -> dict[int, str]:
    """offset → value, as a Kafka consumer reads the topic."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka_bootstrap(broker), "group.id": f"check-{topic}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: dict[int, str] = {}
        end = time.monotonic() + 30
        while len(got) < n and time.monotonic() < end:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got[m.offset()] = m.value().decode()
        return got
    finally:
        c.close()


def _sink(session: Any, out: Path) -> Counter[str]:
    return Counter(r.value for r in session.read.parquet(str(out)).select("value").collect())


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


@pytest.mark.parametrize("direct_read", ["true", "false"])
def test_restart_from_checkpoint_reads_every_message_once(
        session: Any, broker: Standalone, unique: str, tmp_path: Path, direct_read: str) -> None:
    topic = f"issue51-{unique}"
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    expected: list[bytes] = []

    def append(values: list[bytes]) -> None:
        expected.extend(values)

    append(_values("pulsar", 1000))
    _pulsar_send(broker, topic, _values("pulsar", 1000), batching=False)
    append(_values("kafka", 1000))
    _kafka_python_send(broker, topic, _values("kafka", 1000))

    # A batch read sees all 2,000, each once, at dense offsets.
    rows = reader(session, broker, topic).selectExpr("offset", "cast(value as string) as value").collect()
    assert Counter(r.value for r in rows) == Counter(v.decode() for v in expected)
    assert sorted(r.offset for r in rows) == list(range(2000))

    # First run: everything stored, ending in a Kafka record batch.
    _run_query(session, broker, topic, out, ckpt, direct_read)
    assert _sink(session, out) == Counter(v.decode() for v in expected)

    # Restart after 500 more Pulsar messages: 2,500 distinct rows.
    late = _values("late", 500)
    append(late)
    _pulsar_send(broker, topic, late, batching=False)
    _run_query(session, broker, topic, out, ckpt, direct_read)
    got = _sink(session, out)
    assert sum(got.values()) == len(got) == 2500
    assert got == Counter(v.decode() for v in expected)

    # Second restart after confluent-kafka batches, two chunked messages and a batching
    # Pulsar producer, so that the run ends in a Pulsar batch; then a third after more
    # Kafka records, so that a run starts right after that batch.
    more_kafka = _values("confluent", 700)
    chunked = [b"chunked-%d-" % i + b"x" * 100_000 for i in range(2)]
    batched = _values("batched", 333)
    append(more_kafka)
    append(chunked)
    append(batched)
    _confluent_send(broker, topic, more_kafka)
    _pulsar_send(broker, topic, chunked, chunking=True)
    _pulsar_send(broker, topic, batched, batching=True)
    _run_query(session, broker, topic, out, ckpt, direct_read)
    assert _sink(session, out) == Counter(v.decode() for v in expected)

    tail = _values("tail", 250)
    append(tail)
    _kafka_python_send(broker, topic, tail)
    _run_query(session, broker, topic, out, ckpt, direct_read)
    assert _sink(session, out) == Counter(v.decode() for v in expected)
    assert len(expected) == 2000 + 500 + 700 + 2 + 333 + 250
    # Each row at the offset a Kafka consumer sees it at (a chunked message at its last chunk's).
    rows = session.read.parquet(str(out)).collect()
    assert {r.offset: r.value for r in rows} == _kafka_view(broker, topic, len(expected))
