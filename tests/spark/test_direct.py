"""Direct reads from the bookies (spark._direct, core._native.LedgerRangeReader) against a
real broker: the same rows as through a Pulsar Reader for batched, plain, compressed,
keyed messages with properties from Pulsar and Kafka producers; failover across
replicas; fallback to the Reader when no replica answers, before or during a range."""

from __future__ import annotations

import dataclasses
import json
import socket
from typing import Any

import pulsar
import pytest

from tests._standalone import Standalone
from tests.spark.conftest import admin_url, kafka_bootstrap, produce_mixed, reader

pytestmark = pytest.mark.xdist_group("spark-source")

COMPRESSIONS = [pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib,
                pulsar.CompressionType.ZSTD, pulsar.CompressionType.SNAPPY]


def _produce_compressed(broker: Standalone, topic: str) -> None:
    """Compressed batches and compressed plain messages from Pulsar producers, and
    compressed batches from a Kafka producer, on the topic produce_mixed created."""
    from confluent_kafka import Producer

    client = pulsar.Client(broker.pulsar_url)
    try:
        for kind in COMPRESSIONS:
            batched = client.create_producer(topic, batching_enabled=True, compression_type=kind,
                                             batching_max_publish_delay_ms=20)
            for i in range(7):
                batched.send_async(b"%s-batched-%d " % (str(kind).encode(), i) * 20, None,
                                   partition_key=f"ck{i % 3}", properties={"c": str(kind), "n": str(i)})
            batched.flush()
            plain = client.create_producer(topic, batching_enabled=False, compression_type=kind)
            plain.send(b"%s-plain " % str(kind).encode() * 40, partition_key="plain",
                       properties={"z": "1"}, event_timestamp=1_650_000_000_000)
    finally:
        client.close()
    for codec in ("lz4", "gzip", "zstd", "snappy"):
        p = Producer({"bootstrap.servers": kafka_bootstrap(broker), "linger.ms": 5,
                      "compression.type": codec})
        for i in range(6):
            # Keys that are not UTF-8 are stored base64-encoded; an empty key reads as null.
            key = {4: b"\xff\xfe%d" % i, 5: b""}.get(i, b"kc%d" % i)
            p.produce(topic, key=key, value=b"kafka-%s-%d " % (codec.encode(), i) * 10,
                      partition=i % 2, headers=[("codec", codec.encode())])
        assert p.flush(10) == 0


@pytest.fixture(scope="module")
def topic(broker: Standalone) -> str:
    name = "direct-mixed"
    produce_mixed(broker, name)
    _produce_compressed(broker, name)
    return name


def _splits(broker: Standalone, topic: str, **options: str) -> list[Any]:
    from spark._source import _BatchReader

    opts = {"serviceUrl": broker.pulsar_url, "adminUrl": admin_url(broker), "topics": topic, **options}
    return list(_BatchReader(opts).partitions())


def _table(splits: list[Any]) -> Any:
    import pyarrow as pa

    from spark._source import read_partition

    batches = [b for s in splits for b in read_partition(s)]
    return pa.Table.from_batches(batches)


def _paths() -> dict[str, int]:
    from spark._source import READ_PATHS

    return dict(READ_PATHS)


def _grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_ensemble(split: Any, ensemble: list[str], *, at: int = 0) -> Any:
    """The split with its ledger's metadata changed: from entry ``at`` on, the fragment
    is ``ensemble`` (written to all of it); the fragment before keeps the real bookie."""
    meta = json.loads(split.ledger_metadata)
    real = meta["ensembles"][0][1]
    fragments = ([[0, real + real[:1] * (len(ensemble) - 1)]] if at else []) + [[at, ensemble]]
    meta.update(ensembleSize=len(ensemble), writeQuorumSize=len(ensemble), ackQuorumSize=1,
                ensembles=fragments)
    return dataclasses.replace(split, ledger_metadata=json.dumps(meta))


def test_direct_rows_equal_reader_rows(broker: Standalone, topic: str) -> None:
    direct = _splits(broker, topic, directRead="require")
    via_reader = _splits(broker, topic, directRead="false")
    assert direct and all(s.ledger_metadata for s in direct)
    before = _paths()
    got = _table(direct)
    assert _grew(before, _paths()) == {"direct": len(direct)}
    before = _paths()
    want = _table(via_reader)
    assert _grew(before, _paths()) == {"reader": len(via_reader)}
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows == 84
    assert got.to_pylist() == want.to_pylist()
    rows = got.to_pylist()
    assert {r["protocol"] for r in rows} == {"pulsar", "kafka"}
    assert any(r["value"] is None for r in rows)  # the Kafka tombstone
    assert any(r["messageId"].endswith(":-1") for r in rows)  # plain entries
    assert any(r["properties"] == [("codec", "zstd")] for r in rows)
    assert any(r["key"] == b"//40" for r in rows)  # the Kafka key b"\xff\xfe4", base64-encoded
    assert any(r["key"] is None and r["protocol"] == "kafka" for r in rows)


def test_spark_direct_and_reader_reads_agree(session: Any, broker: Standalone, topic: str) -> None:
    def rows(mode: str) -> list[Any]:
        return sorted(reader(session, broker, topic, directRead=mode).collect(),
                      key=lambda r: (r.partition, r.offset))

    direct = rows("require")
    assert len(direct) == 84
    assert direct == rows("false")
    assert direct == rows("true")


def test_large_ranges_split_into_contiguous_partitions(monkeypatch: pytest.MonkeyPatch,
                                                       broker: Standalone, topic: str) -> None:
    import spark._source

    whole = _splits(broker, topic)
    monkeypatch.setattr(spark._source, "SPLIT_MESSAGES", 5)
    pieces = _splits(broker, topic)
    assert len(pieces) > len(whole)
    for p in (0, 1):
        ranges = [(s.from_offset, s.to_offset) for s in pieces if s.partition == p]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert all(s.entry_id <= s.last_entry_id for s in pieces)
    assert _table(pieces).to_pylist() == _table(whole).to_pylist()


def test_failover_to_another_replica(broker: Standalone, topic: str) -> None:
    split = _splits(broker, topic)[0]
    real = json.loads(split.ledger_metadata)["ensembles"][0][1][0]
    dead = f"127.0.0.1:{_closed_port()}"
    before = _paths()
    got = _table([_with_ensemble(split, [dead, real])])
    assert _grew(before, _paths()) == {"direct": 1}
    assert got.to_pylist() == _table([dataclasses.replace(split, direct_read="false")]).to_pylist()


def test_unreachable_bookies_fall_back_to_the_reader(broker: Standalone, topic: str) -> None:
    split = _splits(broker, topic)[0]
    broken = _with_ensemble(split, [f"127.0.0.1:{_closed_port()}"])
    before = _paths()
    got = _table([broken])
    assert _grew(before, _paths()) == {"reader": 1}
    assert got.to_pylist() == _table([split]).to_pylist()
    with pytest.raises(RuntimeError, match="directRead=require"):
        _table([dataclasses.replace(broken, direct_read="require")])


def test_entries_not_known_final_are_left_to_the_reader(broker: Standalone, topic: str) -> None:
    """Metadata saying the ledger closed before the range's last entry: the native reader
    refuses the range (it only reads final entries), and a Reader serves it."""
    split = _splits(broker, topic)[0]
    meta = json.loads(split.ledger_metadata)
    meta.update(state="CLOSED", lastEntryId=split.last_entry_id - 1)
    stale = dataclasses.replace(split, ledger_metadata=json.dumps(meta))
    before = _paths()
    got = _table([stale])
    assert _grew(before, _paths()) == {"reader": 1}
    assert got.to_pylist() == _table([split]).to_pylist()
    with pytest.raises(RuntimeError, match="is closed at entry"):
        _table([dataclasses.replace(stale, direct_read="require")])


def test_failure_midway_resumes_on_a_reader(monkeypatch: pytest.MonkeyPatch, broker: Standalone,
                                             topic: str) -> None:
    import spark._source

    split = max(_splits(broker, topic), key=lambda s: s.last_entry_id - s.entry_id)
    assert split.last_entry_id - split.entry_id >= 2
    monkeypatch.setattr(spark._source, "ARROW_BATCH_ROWS", 1)
    middle = (split.entry_id + split.last_entry_id + 1) // 2
    broken = _with_ensemble(split, [f"127.0.0.1:{_closed_port()}"], at=middle)
    before = _paths()
    batches = list(spark._source.read_partition(broken))
    assert _grew(before, _paths()) == {"resumed": 1}
    import pyarrow as pa

    assert pa.Table.from_batches(batches).to_pylist() == _table([split]).to_pylist()


def test_bad_direct_read_option_is_refused(broker: Standalone) -> None:
    with pytest.raises(ValueError, match="directRead"):
        _splits(broker, "anything", directRead="sometimes")
