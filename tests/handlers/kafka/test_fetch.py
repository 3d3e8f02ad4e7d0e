"""Fetch errors and ListOffsets by timestamp (handlers/kafka/_fetch.py): in the handler,
on every Fetch version, and with confluent-kafka against a real standalone broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from core.broker import TopicNotFoundError
from core.storage import Position
from handlers.kafka._codec import APIS, Data, decode_body, encode_body
from handlers.kafka._errors import ErrorCode
from handlers.kafka._fetch import _fetch_once, _response
from handlers.kafka._topics import PartitionLog
from tests.handlers.kafka._wire import Wire
from tests.handlers.kafka.test_clients import DEADLINE, create_topic, drain_confluent
from tests.handlers.kafka.test_wire import FETCH as FETCH_KEY
from tests.handlers.kafka.test_wire import PRODUCE, batch, fetch_body, produce_body

FETCH = APIS[1]


class _Ledger:
    """A managed ledger holding messages 0..9 in one ledger, whose reads fail as a deleted
    topic's do."""

    def next_index(self) -> int:
        return 10

    def ledgers(self) -> list[dict[str, Any]]:
        return [{"entries": 10, "firstIndex": 0}]

    async def find_by_index(self, index: int) -> Position | None:
        raise TopicNotFoundError("deleted while being read")


def _log() -> PartitionLog:
    topic = SimpleNamespace(ml=_Ledger(), name="persistent://public/default/t-partition-0")
    owner = SimpleNamespace(broker=SimpleNamespace(metadata={}), log_start_path=str)
    return PartitionLog("t", 0, topic, owner)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", range(FETCH.min_version, FETCH.max_version + 1))
async def test_error_partitions_carry_empty_records_not_null(version: int) -> None:
    # Kafka answers a partition error with empty records; a null (-1 size) makes librdkafka
    # reject the whole response ("invalid MessageSetSize -1").
    logs: dict[tuple[str, int], PartitionLog | BaseException] = {
        ("gone", 0): TopicNotFoundError("gone"), ("t", 0): _log()}
    wanted = [("gone", 0, 0, 1 << 20), ("t", 0, 1000, 1 << 20), ("t", 0, 3, 1 << 20)]
    parts, total, errors = await _fetch_once(wanted, logs, 1 << 20)
    assert errors and total == 0

    body = decode_body(FETCH, version, encode_body(FETCH, version, _response(0, parts)),
                       response=True)
    got = [(p.error_code, p.records) for t in body.responses for p in t.partitions]
    assert got == [(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, b""),
                   (ErrorCode.OFFSET_OUT_OF_RANGE, b""),
                   (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, b"")]


def test_confluent_offset_out_of_range_resets_to_earliest(boot: str, unique: str) -> None:
    topic = f"oor-{unique}"
    create_topic(boot, topic, 1)
    p = Producer({"bootstrap.servers": boot})
    for i in range(10):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(DEADLINE) == 0
    c = Consumer({"bootstrap.servers": boot, "group.id": f"oor-{unique}",
                  "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 1000)])
        got = drain_confluent(c, 10, timeout=15)
    finally:
        c.close()
    assert [(m.offset(), m.value()) for m in got] == [(i, b"%d" % i) for i in range(10)]


def test_list_offsets_max_timestamp_is_the_record_with_the_largest_timestamp(
        boot: str, unique: str) -> None:
    # KIP-734: the record with the largest timestamp, the earliest of those sharing it.
    topic = f"maxts-{unique}"
    create_topic(boot, topic, 1)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 0})
    for stamps in ([1_000_000, 9_000_000], [2_000_000, 9_000_000], [3_000_000]):
        for ts in stamps:
            p.produce(topic, value=b"x", timestamp=ts)
        assert p.flush(DEADLINE) == 0
    admin = AdminClient({"bootstrap.servers": boot})
    tp = TopicPartition(topic, 0)

    def max_timestamp() -> tuple[int, int]:
        [fut] = admin.list_offsets({tp: OffsetSpec.max_timestamp()}).values()
        r = fut.result(DEADLINE)
        return r.offset, r.timestamp

    assert max_timestamp() == (1, 9_000_000)
    # Records below the log start are not candidates.
    [fut] = admin.delete_records([TopicPartition(topic, 0, 2)]).values()
    fut.result(DEADLINE)
    assert max_timestamp() == (3, 9_000_000)


def test_offsets_for_times_does_not_answer_a_deleted_record(boot: str, unique: str) -> None:
    """The first record at or after a time is looked for from the log start: a record
    deleted by DeleteRecords is not an answer (a consumer seeking there would be out of
    range), as in Kafka, whose deleted records are gone from its time index."""
    topic = f"tsdel-{unique}"
    create_topic(boot, topic, 1)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 0})
    for i in range(6):
        p.produce(topic, value=b"%d" % i, timestamp=1_000_000 + 1000 * i)
        assert p.flush(DEADLINE) == 0
    admin = AdminClient({"bootstrap.servers": boot})
    tp = TopicPartition(topic, 0)

    def at(ts: int) -> tuple[int, int]:
        [fut] = admin.list_offsets({tp: OffsetSpec.for_timestamp(ts)}).values()
        r = fut.result(DEADLINE)
        return r.offset, r.timestamp

    assert at(1_001_000) == (1, 1_001_000)
    [fut] = admin.delete_records([TopicPartition(topic, 0, 3)]).values()
    fut.result(DEADLINE)
    assert at(0) == (3, 1_003_000)
    assert at(1_001_000) == (3, 1_003_000)
    assert at(1_004_500) == (5, 1_005_000)


def test_fetch_limits_are_soft_for_the_first_batch_only(boot: str, unique: str) -> None:
    """KIP-74: the first batch of the first partition with any is returned whatever the
    limits; after it, a batch that does not fit the rest of max_bytes, or a later
    partition's max bytes, is left for a later fetch."""
    topic = f"soft-{unique}"
    create_topic(boot, topic, 2)
    with Wire(boot) as w:
        for partition in (0, 1):
            for _ in range(2):
                w.call(PRODUCE, 9, produce_body(topic, batch([b"z" * 2000]), partition=partition))

        def sizes(max_bytes: int, partition_max: int) -> list[int]:
            body = fetch_body(topic, 0)
            body.max_bytes = max_bytes
            body.topics[0].partitions = [
                SimpleNamespace(partition=p, fetch_offset=0, partition_max_bytes=partition_max)
                for p in (0, 1)]
            resp = w.call(FETCH_KEY, 12, body)
            return [len(p.records or b"") for p in resp.responses[0].partitions]

        one = sizes(1 << 20, 1 << 20)[0] // 2  # the size of one batch
        assert sizes(1 << 20, 1 << 20) == [2 * one, 2 * one]
        assert sizes(one + 100, 1 << 20) == [one, 0], "max_bytes: no second batch anywhere"
        assert sizes(2 * one + 100, 1 << 20) == [2 * one, 0]
        assert sizes(10, 1 << 20) == [one, 0], "the first batch comes whatever max_bytes"
        assert sizes(1 << 20, 10) == [one, 0], "the first, whatever max.partition.fetch.bytes"
        assert sizes(1 << 20, one + 100) == [one, one]


def test_list_offsets_earliest_local_and_latest_tiered(boot: str, unique: str) -> None:
    """ListOffsets v8's -4 (KIP-405) is the local log start, which without tiered storage
    is the log start, and v9's -5 (KIP-1005) the last tiered offset: -1 (leader epoch -1)
    when nothing is tiered, as a Kafka broker without remote storage answers."""
    topic = f"tiered-{unique}"
    create_topic(boot, topic, 1)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 0})
    for i in range(4):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(DEADLINE) == 0
    admin = AdminClient({"bootstrap.servers": boot})
    [fut] = admin.delete_records([TopicPartition(topic, 0, 2)]).values()
    fut.result(DEADLINE)
    with Wire(boot) as w:
        def list_offsets(version: int, ts: int) -> Any:
            body = Data(replica_id=-1, isolation_level=0, topics=[Data(name=topic, partitions=[
                Data(partition_index=0, current_leader_epoch=-1, timestamp=ts)])])
            return w.call(2, version, body).topics[0].partitions[0]

        local = list_offsets(8, -4)
        assert (local.error_code, local.offset, local.timestamp) == (0, 2, -1)
        tiered = list_offsets(9, -5)
        assert (tiered.error_code, tiered.offset, tiered.timestamp, tiered.leader_epoch) == (0, -1, -1, -1)
        assert list_offsets(7, -4).error_code == ErrorCode.INVALID_REQUEST
