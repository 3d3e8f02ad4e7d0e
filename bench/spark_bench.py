"""Spark read of a topic's backlog beside one pulsar-client Reader.

1,000,000 messages of 100 B on a 4-partition topic of a fresh standalone. Measured:
``df.count()`` and ``df.groupBy("key").count()`` through ``format("magnetar")`` on a
``local[2]`` session, and one official pulsar-client Reader over the whole partitioned
topic in this process, touching each message's payload. The session is started and
warmed up outside the timing: both queries run once over the first quarter of every
partition, so that the JVM has compiled the scan and aggregation paths (a cold JVM
reads at about half the speed it reaches once warm). Spark reads with
``directRead=require``, so a run that silently fell back to Readers fails instead of
reporting their figures. The machine is shared, so each case is timed ``ROUNDS``
times and the best round counts, for the Reader as for Spark. Every phase is bounded
by a deadline; a phase that misses it is reported as such, never waited on forever.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests._standalone import Standalone

MESSAGES = int(os.environ.get("MAGNETAR_SPARK_BENCH_MESSAGES", "1000000"))
PARTITIONS = 4
SIZE = 100
KEYS = 1000
PHASE_DEADLINE = 600.0
TARGET_RATIO = 2.0
ROUNDS = int(os.environ.get("MAGNETAR_SPARK_BENCH_ROUNDS", "3"))


def _create_partitioned(admin: str, topic: str, n: int) -> None:
    req = urllib.request.Request(f"{admin}/admin/v2/persistent/public/default/{topic}/partitions",
                                 data=json.dumps(n).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30):
        pass


def _produce(url: str, topic: str) -> float:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                   batching_max_publish_delay_ms=5, block_if_queue_full=True,
                                   max_pending_messages=20_000,
                                   max_pending_messages_across_partitions=80_000)
        payload = b"x" * SIZE
        failures: list[Any] = []

        def done(res: Any, _mid: Any) -> None:
            if res != pulsar.Result.Ok:
                failures.append(res)

        t0 = time.monotonic()
        deadline = t0 + PHASE_DEADLINE
        for i in range(MESSAGES):
            p.send_async(payload, done, partition_key=f"key-{i % KEYS}")
            if i % 10_000 == 0:
                if failures:
                    raise RuntimeError(f"{len(failures)} sends failed: {failures[0]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"producing {MESSAGES} messages took over {PHASE_DEADLINE} s")
        p.flush()
        if failures:
            raise RuntimeError(f"{len(failures)} sends failed: {failures[0]}")
        return time.monotonic() - t0
    finally:
        client.close()


def _single_reader(url: str, topic: str) -> dict[str, Any]:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
        t0 = time.monotonic()
        deadline = t0 + PHASE_DEADLINE
        n = total = 0
        while n < MESSAGES and time.monotonic() < deadline:
            try:
                msg = reader.read_next(10_000)
            except pulsar.Timeout:
                break
            total += len(msg.data())
            n += 1
        elapsed = time.monotonic() - t0
        reader.close()
        return {"messages": n, "seconds": elapsed, "msg_per_s": n / elapsed, "complete": n == MESSAGES}
    finally:
        client.close()


def _best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    best = dict(max(rounds, key=lambda r: r["msg_per_s"]))
    best["rounds_msg_per_s"] = [round(r["msg_per_s"]) for r in rounds]
    return best


def _spark(url: str, admin: str, topic: str) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark import register

    t0 = time.monotonic()
    s = (SparkSession.builder.master("local[2]").appName("magnetar-spark-bench")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
         .config("spark.driver.memory", "2g").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    startup = time.monotonic() - t0
    try:
        def load(**options: str) -> Any:
            r = (s.read.format("magnetar").option("serviceUrl", url).option("adminUrl", admin)
                 .option("topics", topic).option("directRead", "require"))
            for k, v in options.items():
                r = r.option(k, v)
            return r.load()

        df = load()
        sample = load(endingOffsets=json.dumps(
            {topic: {str(p): MESSAGES // PARTITIONS // 4 for p in range(PARTITIONS)}}))
        sample.count()
        sample.groupBy("key").count().collect()
        out: dict[str, Any] = {"session_startup_s": startup}
        counts, groups = [], []
        for _ in range(ROUNDS):
            t0 = time.monotonic()
            n = df.count()
            elapsed = time.monotonic() - t0
            counts.append({"messages": n, "seconds": elapsed, "msg_per_s": n / elapsed,
                           "complete": n == MESSAGES})
            t0 = time.monotonic()
            rows = df.groupBy("key").count().collect()
            elapsed = time.monotonic() - t0
            total = sum(r["count"] for r in rows)
            groups.append({"messages": total, "groups": len(rows), "seconds": elapsed,
                           "msg_per_s": total / elapsed, "complete": total == MESSAGES})
        out["count"] = _best(counts)
        out["group_by_key"] = _best(groups)
        return out
    finally:
        s.stop()


def run() -> dict[str, Any]:
    base = Path(os.environ.get("MAGNETAR_BENCH_DIR", "bench/results"))
    base.mkdir(parents=True, exist_ok=True)
    topic = "spark-bench"
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-spark-") as tmp:
        with Standalone(Path(tmp) / "data", conf={"journalSyncData": False}) as broker:
            admin = broker.addresses["web"][0]
            _create_partitioned(admin, topic, PARTITIONS)
            produce_s = _produce(broker.pulsar_url, topic)
            reader = _best([_single_reader(broker.pulsar_url, topic) for _ in range(ROUNDS)])
            spark = _spark(broker.pulsar_url, admin, topic)
    ratio_count = spark["count"]["msg_per_s"] / reader["msg_per_s"]
    ratio_group = spark["group_by_key"]["msg_per_s"] / reader["msg_per_s"]
    print(f"\nSpark read: {MESSAGES:,} x {SIZE} B on {PARTITIONS} partitions "
          f"(produced in {produce_s:.1f} s; session start {spark['session_startup_s']:.1f} s, untimed)")
    print(f"  {'reader (best of ' + str(ROUNDS) + ' rounds)':<34}{'msg/s':>12}{'seconds':>10}"
          f"  vs single Reader (target {TARGET_RATIO:.0f}x)")
    print(f"  {'pulsar-client Reader, 1 process':<34}{reader['msg_per_s']:>12,.0f}{reader['seconds']:>10.1f}")
    for label, case, ratio in (("spark df.count()", spark["count"], ratio_count),
                               ("spark groupBy(key).count()", spark["group_by_key"], ratio_group)):
        verdict = "meets" if ratio >= TARGET_RATIO else "below"
        print(f"  {label:<34}{case['msg_per_s']:>12,.0f}{case['seconds']:>10.1f}  "
              f"{ratio:.2f}x ({verdict} target)")
    return {"messages": MESSAGES, "size": SIZE, "partitions": PARTITIONS, "produce_s": produce_s,
            "single_reader": reader, "spark": spark, "ratio_count": ratio_count,
            "ratio_group_by_key": ratio_group, "target_ratio": TARGET_RATIO}


if __name__ == "__main__":
    run()
