"""The example jobs: the unified-stream window counts (run as a streaming query from topic
to topic) and the top-keys batch job, each checked against a direct computation."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulsar
import pytest

from spark.jobs.top_keys import top_keys
from spark.jobs.unified_stream import build_query
from tests._standalone import Standalone
from tests.spark.conftest import admin_url, kafka_bootstrap, reader

pytestmark = pytest.mark.xdist_group("spark-jobs")

BASE = 1_700_000_000_000  # a multiple of the 10 s window
WINDOW_MS = 10_000
RECEIVE_MS = 30_000


def _events() -> list[tuple[str, str, int]]:
    """(protocol, key, event time ms) over three windows, some late within the watermark."""
    out = []
    for i in range(30):
        protocol = "pulsar" if i % 2 else "kafka"
        key = ["a", "b", "c"][i % 3]
        out.append((protocol, key, BASE + (i * 997) % (3 * WINDOW_MS)))
    return out


def _produce(broker: Standalone, topic: str, events: list[tuple[str, str, int]]) -> None:
    from confluent_kafka import Producer

    client = pulsar.Client(broker.pulsar_url)
    try:
        p = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=10)
        for n, (protocol, key, ts) in enumerate(events):
            if protocol == "pulsar":
                p.send_async(b"e%d" % n, None, partition_key=key, event_timestamp=ts)
        p.flush()
    finally:
        client.close()
    k = Producer({"bootstrap.servers": kafka_bootstrap(broker), "linger.ms": 5})
    for n, (protocol, key, ts) in enumerate(events):
        if protocol == "kafka":
            k.produce(topic, key=key.encode(), value=b"e%d" % n, timestamp=ts)
    assert k.flush(10) == 0


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def test_unified_stream_window_counts_match_direct_computation(
        session: Any, broker: Standalone, unique: str, tmp_path: Path) -> None:
    source, sink = f"events-{unique}", f"counts-{unique}"
    events = _events()
    _produce(broker, source, events)
    # One event an hour later moves the watermark past every window above, closing them.
    _produce(broker, source, [("pulsar", "flush", BASE + 3_600_000)])
    expected = Counter(((ts // WINDOW_MS) * WINDOW_MS, protocol, key) for protocol, key, ts in events)

    client = pulsar.Client(broker.pulsar_url)
    try:
        consumer = client.subscribe(sink, f"check-{unique}", initial_position=pulsar.InitialPosition.Earliest)
        query = build_query(session, service_url=broker.pulsar_url, admin_url=admin_url(broker),
                            topics=source, output=sink, window="10 seconds", watermark="5 seconds",
                            checkpoint=str(tmp_path / "ckpt")).start()
        try:
            query.processAllAvailable()
            got: dict[tuple[int, str, str], int] = {}
            while len(got) < len(expected):
                msg = consumer.receive(RECEIVE_MS)
                consumer.acknowledge(msg)
                row = json.loads(msg.data())
                start = round(datetime.fromisoformat(row["windowStart"]).timestamp() * 1000)
                assert row["windowEnd"] == _iso(start + WINDOW_MS)
                assert msg.partition_key() == f"{row['protocol']}/{row['key']}"
                assert (start, row["protocol"], row["key"]) not in got, "a window was emitted twice"
                got[(start, row["protocol"], row["key"])] = row["count"]
        finally:
            query.stop()
        assert query.exception() is None
        with pytest.raises(pulsar.Timeout):
            consumer.receive(500)
    finally:
        client.close()
    assert got == dict(expected)


def test_top_keys_matches_direct_computation(session: Any, broker: Standalone, unique: str) -> None:
    topic = f"history-{unique}"
    keys = [f"k{i % 7}" for i in range(60)] + ["k3"] * 9 + ["k5"] * 4
    client = pulsar.Client(broker.pulsar_url)
    try:
        p = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=10)
        for n, key in enumerate(keys):
            p.send_async(b"x" * (n % 5 + 1), None, partition_key=key)
        p.flush()
    finally:
        client.close()
    rows = top_keys(reader(session, broker, topic), 3).collect()
    counts = Counter(keys)
    volume = Counter()
    for n, key in enumerate(keys):
        volume[key] += n % 5 + 1
    want = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert [(r.key, r.messages) for r in rows] == want
    assert [r.bytes for r in rows] == [volume[k] for k, _ in want]
    assert all(r.protocols == ["pulsar"] for r in rows)
