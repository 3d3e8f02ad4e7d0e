"""The magnetar data source against a real broker: batch reads of messages from Pulsar and
Kafka clients, offset ranges, streaming restarts from a checkpoint, batch and streaming
writes read back by a Pulsar consumer."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests._standalone import Standalone
from tests.spark.conftest import (
    admin_url,
    create_partitioned,
    kafka_bootstrap,
    produce_mixed,
    reader,
)

pytestmark = pytest.mark.xdist_group("spark-source")

RECEIVE_MS = 10_000


def _ms(ts: dt.datetime | None) -> int | None:
    return None if ts is None else round(ts.timestamp() * 1000)


def _kafka_offsets(broker: Standalone, topic: str, partitions: int, n: int
                   ) -> dict[tuple[int, int], bytes | None]:
    """(partition, offset) → value, as a Kafka consumer sees the topic."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka_bootstrap(broker), "group.id": f"check-{topic}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: dict[tuple[int, int], bytes | None] = {}
        end = time.monotonic() + 30
        while len(got) < n and time.monotonic() < end:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got[(m.partition(), m.offset())] = m.value()
        return got
    finally:
        c.close()


def test_batch_read_every_column(session: Any, broker: Standalone, unique: str) -> None:
    topic = f"mixed-{unique}"
    before = int(time.time() * 1000) - 1000
    expected = produce_mixed(broker, topic)
    after = int(time.time() * 1000) + 1000
    from spark import protocol_of

    df = reader(session, broker, topic)
    assert [f.name for f in df.schema.fields] == [
        "topic", "partition", "offset", "messageId", "key", "value", "properties",
        "publishTime", "eventTime", "producerName", "protocol"]
    rows = df.collect()
    tombstones = [r for r in rows if r.value is None]
    assert [(bytes(r.key), r.protocol) for r in tombstones] == [(b"tombstone", "kafka")]
    kafka_view = _kafka_offsets(broker, topic, 2, len(rows))
    assert {(r.partition, r.offset): None if r.value is None else bytes(r.value) for r in rows} == kafka_view
    rows = [r for r in rows if r.value is not None]
    assert sorted(bytes(r.value) for r in rows) == sorted(expected)
    for r in rows:
        want = expected[bytes(r.value)]
        assert r.topic == topic
        assert r.partition in (0, 1)
        assert bytes(r.key) == want["key"]
        assert dict(r.properties) == want["properties"]
        assert _ms(r.eventTime) == want["eventTime"]
        assert before <= _ms(r.publishTime) <= after
        assert r.protocol == want["protocol"] == protocol_of(r.producerName)
        if want["protocol"] == "kafka":
            assert re.fullmatch(r"kafka(-\d+)?", r.producerName)
        assert re.fullmatch(r"\d+:\d+:-?\d+", r.messageId)
    # Offsets are the Kafka ones: dense per partition and what a Kafka consumer sees.
    by_partition: dict[int, list[int]] = {}
    for r in [*rows, *tombstones]:
        by_partition.setdefault(r.partition, []).append(r.offset)
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))


def test_starting_and_ending_offsets(session: Any, broker: Standalone, unique: str) -> None:
    topic = f"range-{unique}"
    client = pulsar.Client(broker.pulsar_url)
    try:
        p = client.create_producer(topic, batching_enabled=True, batching_max_messages=4,
                                   batching_max_publish_delay_ms=50)
        for i in range(20):
            p.send_async(b"%d" % i, None)
        p.flush()
    finally:
        client.close()

    def offsets(**options: str) -> list[int]:
        return sorted(r.offset for r in reader(session, broker, topic, **options).select("offset").collect())

    assert offsets() == list(range(20))
    assert offsets(startingOffsets=f'{{"{topic}": {{"0": 6}}}}',
                   endingOffsets=f'{{"{topic}": {{"0": 15}}}}') == list(range(6, 15))
    # Mid-batch starts and ends; -2 and -1 are earliest and latest.
    assert offsets(startingOffsets=f'{{"{topic}": {{"0": 3}}}}',
                   endingOffsets=f'{{"{topic}": {{"0": -1}}}}') == list(range(3, 20))
    assert offsets(startingOffsets=f'{{"{topic}": {{"0": -2}}}}',
                   endingOffsets=f'{{"{topic}": {{"0": 5}}}}') == list(range(5))
    assert offsets(startingOffsets="latest") == []
    pattern = reader(session, broker, "", topicsPattern=f"persistent://public/default/range-{unique}")
    assert pattern.count() == 20
    assert offsets(startingOffsets=f'{{"{topic}": {{"0": 40}}}}') == []
    values = {r.offset: bytes(r.value) for r in reader(session, broker, topic).collect()}
    assert values == {i: b"%d" % i for i in range(20)}


def _consume(broker: Standalone, topic: str, n: int, unique: str) -> list[Any]:
    client = pulsar.Client(broker.pulsar_url)
    try:
        consumer = client.subscribe(topic, f"check-{unique}",
                                    initial_position=pulsar.InitialPosition.Earliest)
        got = []
        for _ in range(n):
            m = consumer.receive(RECEIVE_MS)
            got.append(m)
            consumer.acknowledge(m)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(500)
        return got
    finally:
        client.close()


def test_batch_write_read_back_by_pulsar_consumer(session: Any, broker: Standalone, unique: str) -> None:
    topic = f"written-{unique}"
    rows = [(f"k{i}", f"value-{i}".encode(), {"n": str(i)}) for i in range(25)]
    df = session.createDataFrame(rows, "key string, value binary, properties map<string,string>")
    (df.write.format("magnetar").mode("append").option("serviceUrl", broker.pulsar_url)
     .option("adminUrl", admin_url(broker)).option("topic", topic).save())
    got = _consume(broker, topic, 25, unique)
    assert sorted((m.partition_key(), m.data(), m.properties()) for m in got) == sorted(
        (k, v, p) for k, v, p in rows)


def test_stream_write_read_back_by_pulsar_consumer(session: Any, broker: Standalone, unique: str,
                                                   tmp_path: Path) -> None:
    source, sink = f"stream-in-{unique}", f"stream-out-{unique}"
    client = pulsar.Client(broker.pulsar_url)
    try:
        p = client.create_producer(source)
        for i in range(15):
            p.send(b"m%d" % i, partition_key=f"k{i % 3}", properties={"i": str(i)})
    finally:
        client.close()
    from pyspark.sql import functions as F

    stream = (session.readStream.format("magnetar").option("serviceUrl", broker.pulsar_url)
              .option("adminUrl", admin_url(broker)).option("topics", source)
              .option("startingOffsets", "earliest").load()
              .select("key", F.concat(F.col("value"), F.lit(b"!")).alias("value"), "properties"))
    query = (stream.writeStream.format("magnetar").option("serviceUrl", broker.pulsar_url)
             .option("adminUrl", admin_url(broker)).option("topic", sink)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert query.exception() is None
    got = _consume(broker, sink, 15, unique)
    assert sorted((m.partition_key(), m.data(), m.properties()["i"]) for m in got) == sorted(
        (f"k{i % 3}", b"m%d!" % i, str(i)) for i in range(15))


def _file_sink_query(session: Any, broker: Standalone, topic: str, out: Path, ckpt: Path) -> None:
    """Run the query until it has processed what is stored, then stop it."""
    stream = (session.readStream.format("magnetar").option("serviceUrl", broker.pulsar_url)
              .option("adminUrl", admin_url(broker)).option("topics", topic)
              .option("startingOffsets", "earliest").option("maxEntriesPerTrigger", "7").load()
              .selectExpr("partition", "offset", "cast(value as string) as value"))
    q = (stream.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ckpt)).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    assert all(p["numInputRows"] <= 7 for p in q.recentProgress)  # maxEntriesPerTrigger


def test_streaming_restart_from_checkpoint_no_loss_no_duplicates(
        session: Any, broker: Standalone, unique: str, tmp_path: Path) -> None:
    topic = f"restart-{unique}"
    create_partitioned(broker, topic, 2)
    client = pulsar.Client(broker.pulsar_url)
    try:
        p = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                   batching_max_publish_delay_ms=20)

        def produce(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                p.send_async(b"v%d" % i, None, partition_key=f"k{i}")
            p.flush()

        out, ckpt = tmp_path / "out", tmp_path / "ckpt"
        produce(0, 20)
        _file_sink_query(session, broker, topic, out, ckpt)
        batches = sorted(int(f.name) for f in (ckpt / "commits").iterdir() if f.name.isdigit())
        assert len(batches) >= 3  # 20 messages at most 7 per trigger
        # A crash after the last batch's offsets were logged but before it was committed:
        # the restarted query must run that batch again, and the sink must not duplicate it.
        (ckpt / "commits" / str(batches[-1])).unlink()
        (ckpt / "commits" / f".{batches[-1]}.crc").unlink(missing_ok=True)
        produce(20, 33)
        _file_sink_query(session, broker, topic, out, ckpt)
    finally:
        client.close()
    got = session.read.parquet(str(out)).collect()
    values = sorted(r.value for r in got)
    assert values == sorted(f"v{i}" for i in range(33))
    assert len({(r.partition, r.offset) for r in got}) == 33


def test_decode_schema_json_and_avro(session: Any, broker: Standalone, unique: str) -> None:
    from pulsar.schema import AvroSchema, Double, Integer, JsonSchema, Record, String

    class Order(Record):
        id = Integer()
        item = String()
        price = Double()

    orders = [Order(id=i, item=f"item-{i}", price=i * 1.5) for i in range(6)]
    client = pulsar.Client(broker.pulsar_url)
    try:
        for kind, schema in (("json", JsonSchema(Order)), ("avro", AvroSchema(Order))):
            p = client.create_producer(f"orders-{kind}-{unique}", schema=schema)
            for o in orders:
                p.send(o)
    finally:
        client.close()
    for kind in ("json", "avro"):
        df = reader(session, broker, f"orders-{kind}-{unique}", decodeSchema="true")
        assert df.schema.fieldNames()[-3:] == ["id", "item", "price"]
        got = sorted((r.id, r.item, r.price) for r in df.collect())
        assert got == [(o.id, o.item, o.price) for o in orders], kind
