"""``magnetar perf produce|consume``: load generation with the official Pulsar client, the
way ``pulsar-perf`` does it.

Theory of operation
-------------------
Each producer (``-n`` per topic) runs in its own thread and publishes with ``send_async``;
a semaphore bounds the messages in flight (``-o/--max-outstanding``) so the thread never
blocks inside the client library and the client's queue never overflows. A rate (``-r``)
is kept by sending, in ticks of about a millisecond, the messages that are due since the
start; a producer that falls behind catches up in bursts, as pulsar-perf does. The
publish latency of a message is measured from the ``send_async`` call to its receipt
callback.

The client runs those callbacks on its own I/O thread, which Python did not start. For
each call its binding makes a Python thread state and deletes it afterwards, and with it
the frame stack Python maps for the state: a ``mmap``, a ``munmap`` and a TLB shootdown on
every CPU of the process, per receipt. That churn cost the producer more CPU than
publishing did, and it set the rate. :func:`_keep_thread_state` keeps the first state a
callback thread gets for the thread's whole life; later callbacks reuse it.

Each consumer (``-n`` per topic) runs ``receive`` in its own thread and acknowledges every
message individually (the client groups the acknowledgements on the wire). Its latency is
end-to-end: the receive time minus the message's publish time (millisecond resolution).

Every payload of at least :data:`HEADER_SIZE` bytes starts with a header naming the run,
the producer and a sequence number, so a consumer counts unique messages, duplicates and
gaps of what ``magnetar perf produce`` sent (other payloads are counted, not tracked).

A run always ends: after ``-m`` messages, after ``-time`` seconds, or after
:data:`DEFAULT_DURATION` seconds when neither is given. Latencies go into a
:class:`LatencyHistogram` (bounded memory, 0.1 % precision), so a long run does not grow.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, TextIO

from ._cli import Command, register_command

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_SERVICE_URL",
    "ConsumeOptions",
    "ConsumeStats",
    "ConsumeSummary",
    "HEADER_SIZE",
    "LatencyHistogram",
    "ProduceOptions",
    "ProduceSummary",
    "SequenceTracker",
    "consume",
    "make_payload",
    "produce",
]

DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"
#: Seconds a run lasts when neither ``-m`` nor ``-time`` bounds it.
DEFAULT_DURATION = 60.0
#: Longest wait, after the last send, for the receipts still in flight.
DRAIN_TIMEOUT = 30.0
#: How often a consumer thread wakes from ``receive`` to check its stop conditions.
RECEIVE_POLL_MS = 100
#: Largest burst a producer sends before it re-checks its bounds and the clock.
MAX_BURST = 1000
PACING_TICK = 0.001
PROGRESS_INTERVAL = 1.0

COMPRESSIONS = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
PERCENTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("p99.9", 0.999))

# Payload header: magic, run id, producer index, sequence number (little endian).
_HEADER = struct.Struct("<4sIIQ")
_MAGIC = b"MgPf"
HEADER_SIZE = _HEADER.size


# --------------------------------------------------------------------------------------
# Latency histogram


_SUB_BITS = 10
_SUB_COUNT = 1 << _SUB_BITS
_LINEAR = 2 << _SUB_BITS


def _bucket(value: int) -> int:
    """Exact below 2048; above, 1024 buckets per power of two (under 0.1 % wide)."""
    if value < _LINEAR:
        return value
    shift = value.bit_length() - _SUB_BITS - 1
    return _LINEAR + (shift - 1) * _SUB_COUNT + ((value >> shift) - _SUB_COUNT)


def _bucket_value(index: int) -> float:
    if index < _LINEAR:
        return float(index)
    k = index - _LINEAR
    shift = k // _SUB_COUNT + 1
    low = (k % _SUB_COUNT + _SUB_COUNT) << shift
    return low + ((1 << shift) - 1) / 2


class LatencyHistogram:
    """Counts of latencies in whole microseconds, in log-linear buckets.

    >>> h = LatencyHistogram()
    >>> for us in range(1, 101):
    ...     h.record(us)
    >>> h.count, h.percentile(0.5), h.percentile(0.99), h.max
    (100, 50.0, 99.0, 100)
    """

    __slots__ = ("_counts", "count", "total", "max")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.count = 0
        self.total = 0
        self.max = 0

    def record(self, micros: int) -> None:
        if micros < 0:
            micros = 0
        i = _bucket(micros)
        self._counts[i] = self._counts.get(i, 0) + 1
        self.count += 1
        self.total += micros
        if micros > self.max:
            self.max = micros

    def merge(self, other: LatencyHistogram) -> None:
        for i, n in other._counts.items():
            self._counts[i] = self._counts.get(i, 0) + n
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def percentile(self, p: float) -> float:
        """The smallest recorded value (to bucket precision) with at least ``p`` of the
        values at or below it; NaN when empty."""
        if not self.count:
            return math.nan
        rank = max(1, math.ceil(p * self.count))
        seen = 0
        for i in sorted(self._counts):
            seen += self._counts[i]
            if seen >= rank:
                return min(_bucket_value(i), float(self.max))
        return float(self.max)

    def summary_ms(self) -> dict[str, float]:
        """mean, p50, p95, p99, p99.9 and max in milliseconds."""
        out = {"mean": self.mean / 1000}
        for name, p in PERCENTILES:
            out[name] = self.percentile(p) / 1000
        out["max"] = self.max / 1000 if self.count else math.nan
        return out


# --------------------------------------------------------------------------------------
# Payloads and the tracking of what arrived


def make_payload(size: int, run: int, producer: int, seq: int, padding: bytes) -> bytes:
    """A payload of ``size`` bytes: the tracking header, then ``padding`` (at least
    ``size - HEADER_SIZE`` bytes). Payloads shorter than the header are only padding."""
    if size < HEADER_SIZE:
        return padding[:size]
    return _HEADER.pack(_MAGIC, run, producer, seq) + padding[: size - HEADER_SIZE]


class SequenceTracker:
    """Which (run, producer, sequence) triples arrived: a growing bitmap per producer.

    >>> t = SequenceTracker()
    >>> pad = bytes(100)
    >>> for seq in (0, 1, 1, 3):
    ...     _ = t.observe(make_payload(100, 7, 0, seq, pad))
    >>> t.unique, t.duplicates, t.gaps
    (3, 1, 1)
    """

    __slots__ = ("_seen", "_highest", "_per_producer", "unique", "duplicates", "untracked")

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], bytearray] = {}
        self._highest: dict[tuple[int, int], int] = {}
        self._per_producer: dict[tuple[int, int], int] = {}
        self.unique = 0
        self.duplicates = 0
        self.untracked = 0

    def observe(self, payload: bytes) -> bool:
        """Count one payload; False when it is a duplicate."""
        if len(payload) < HEADER_SIZE or payload[:4] != _MAGIC:
            self.untracked += 1
            return True
        _, run, producer, seq = _HEADER.unpack_from(payload)
        key = (run, producer)
        bits = self._seen.get(key)
        if bits is None:
            bits = self._seen[key] = bytearray(max(1024, (seq >> 3) + 1))
            self._highest[key] = -1
            self._per_producer[key] = 0
        byte, mask = seq >> 3, 1 << (seq & 7)
        if byte >= len(bits):
            bits.extend(bytes(max(len(bits), byte + 1 - len(bits))))
        if bits[byte] & mask:
            self.duplicates += 1
            return False
        bits[byte] |= mask
        self.unique += 1
        self._per_producer[key] += 1
        if seq > self._highest[key]:
            self._highest[key] = seq
        return True

    @property
    def gaps(self) -> int:
        """Sequence numbers not (yet) seen below each producer's highest one."""
        return sum(self._highest[k] + 1 - n for k, n in self._per_producer.items())


# --------------------------------------------------------------------------------------
# Options and results


@dataclass(slots=True, kw_only=True)
class ProduceOptions:
    """What ``magnetar perf produce`` does; the fields mirror its flags."""

    topics: list[str]
    service_url: str = DEFAULT_SERVICE_URL
    rate: float = 100.0
    size: int = 1024
    num_producers: int = 1
    num_messages: int = 0
    duration: float = 0.0
    batching: bool = True
    batch_max_messages: int = 1000
    batch_max_delay_ms: float = 1.0
    compression: str = "NONE"
    max_outstanding: int = 1000
    progress: bool = True


@dataclass(slots=True, kw_only=True)
class ConsumeOptions:
    """What ``magnetar perf consume`` does; the fields mirror its flags."""

    topics: list[str]
    service_url: str = DEFAULT_SERVICE_URL
    subscription: str = "sub"
    subscription_type: str = "Exclusive"
    subscription_position: str = "Latest"
    num_consumers: int = 1
    num_messages: int = 0
    duration: float = 0.0
    rate: float = 0.0
    receiver_queue_size: int = 1000
    progress: bool = True


@dataclass(slots=True, kw_only=True)
class ProduceSummary:
    """A produce run: messages sent, acknowledged by the broker and not (failed or still
    unacknowledged at the end); the time from the start to the last receipt; publish
    latency percentiles in ms (``mean p50 p95 p99 p99.9 max``); the wall-clock start
    (``time.time()``) and the run id stamped into the payloads."""

    sent: int
    acked: int
    failed: int
    seconds: float
    msg_per_s: float
    mb_per_s: float
    latency_ms: dict[str, float]
    started_at: float
    run_id: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, kw_only=True)
class ConsumeSummary:
    """A consume run: deliveries, unique messages (tracked ones by sequence number plus
    untracked ones), duplicates, gaps below each producer's highest sequence number; the
    time from the first to the last delivery; end-to-end latency percentiles in ms; the
    wall-clock times (``time.time()``) of the first and last delivery."""

    received: int
    unique: int
    duplicates: int
    gaps: int
    untracked: int
    seconds: float
    msg_per_s: float
    mb_per_s: float
    latency_ms: dict[str, float]
    first_at: float
    last_at: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bounded_duration(num_messages: int, duration: float) -> float:
    if duration > 0:
        return duration
    return math.inf if num_messages > 0 else DEFAULT_DURATION


def _share(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def _fmt_ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


# --------------------------------------------------------------------------------------
# Produce


class _ProduceState:
    """Counters and histograms shared by the producer threads and their callbacks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.interval = LatencyHistogram()
        self.total = LatencyHistogram()
        self.last_completion = 0.0

    def completed(self, ok: bool, seconds: float) -> None:
        micros = int(seconds * 1e6)
        with self.lock:
            if ok:
                self.acked += 1
                self.interval.record(micros)
            else:
                self.failed += 1
            self.last_completion = time.monotonic()

    def take_interval(self) -> tuple[int, int, LatencyHistogram]:
        with self.lock:
            hist, self.interval = self.interval, LatencyHistogram()
            self.total.merge(hist)
            return self.acked, self.failed, hist


def _pulsar() -> Any:
    import pulsar

    return pulsar


def _client(service_url: str) -> Any:
    pulsar = _pulsar()
    return pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _compression(name: str) -> Any:
    pulsar = _pulsar()
    return {"NONE": pulsar.CompressionType.NONE, "LZ4": pulsar.CompressionType.LZ4,
            "ZLIB": pulsar.CompressionType.ZLib, "ZSTD": pulsar.CompressionType.ZSTD,
            "SNAPPY": pulsar.CompressionType.SNAPPY}[name.upper()]


_kept = threading.local()


def _keep_thread_state() -> bool:
    """Keep the calling thread's Python thread state until the thread ends (see the
    module docs); True the first time on a thread, when it takes effect.

    The state belongs to the thread's callback, which deletes it once its count of users
    falls to zero. One more ``PyGILState_Ensure``, never released, keeps that count above
    zero. The local below lives in the state, so it is lost if the state is."""
    if getattr(_kept, "kept", False):
        return False
    ctypes.pythonapi.PyGILState_Ensure()
    _kept.kept = True
    return True


def _produce_loop(producer: Any, index: int, quota: int, rate: float, opts: ProduceOptions,
                  state: _ProduceState, run_id: int, deadline: float, stop: threading.Event,
                  errors: list[BaseException]) -> None:
    pulsar = _pulsar()
    ok = pulsar.Result.Ok
    in_flight = threading.Semaphore(opts.max_outstanding)
    padding = os.urandom(opts.size)
    clock = time.perf_counter

    def receipt(started: float, result: Any, _msg_id: Any) -> None:
        _keep_thread_state()
        elapsed = clock() - started
        in_flight.release()
        state.completed(result == ok, elapsed)

    sent = 0
    start = time.monotonic()
    try:
        while not stop.is_set() and (quota <= 0 or sent < quota):
            now = time.monotonic()
            if now >= deadline:
                break
            if rate > 0:
                due = int((now - start) * rate) + 1 - sent
                if due <= 0:
                    time.sleep(min(PACING_TICK, max(0.0, start + sent / rate - now)))
                    continue
            else:
                due = MAX_BURST
            if quota > 0:
                due = min(due, quota - sent)
            for _ in range(min(due, MAX_BURST)):
                if not in_flight.acquire(blocking=False):
                    # Window full: wait for a receipt, then re-check the bounds.
                    if not in_flight.acquire(timeout=0.1):
                        break
                    if stop.is_set() or time.monotonic() >= deadline:
                        in_flight.release()
                        break
                payload = make_payload(opts.size, run_id, index, sent, padding)
                producer.send_async(payload, partial(receipt, clock()))
                sent += 1
                with state.lock:
                    state.sent += 1
    except Exception as exc:
        errors.append(exc)


def produce(opts: ProduceOptions, *, stop: threading.Event | None = None,
            out: TextIO | None = None) -> ProduceSummary:
    """Publish as ``opts`` says until ``-m``, ``-time`` or ``stop``; wait for the receipts
    in flight (up to :data:`DRAIN_TIMEOUT`); print a progress line every second and a
    summary to ``out`` (stdout by default) when ``opts.progress``."""
    out = out or sys.stdout
    stop = stop or threading.Event()
    pulsar = _pulsar()
    run_id = int.from_bytes(os.urandom(4), "little")
    duration = _bounded_duration(opts.num_messages, opts.duration)
    state = _ProduceState()
    client = _client(opts.service_url)
    producers = []
    try:
        for topic in opts.topics:
            for _ in range(opts.num_producers):
                producers.append(client.create_producer(
                    topic,
                    batching_enabled=opts.batching,
                    batching_max_messages=opts.batch_max_messages,
                    batching_max_publish_delay_ms=max(1, round(opts.batch_max_delay_ms)),
                    compression_type=_compression(opts.compression),
                    max_pending_messages=opts.max_outstanding,
                    block_if_queue_full=True,
                ))
        started_wall = time.time()
        t0 = time.monotonic()
        deadline = t0 + duration
        errors: list[BaseException] = []
        n = len(producers)
        threads = [
            threading.Thread(
                target=_produce_loop, name=f"perf-producer-{i}", daemon=True,
                args=(p, i, _share(opts.num_messages, n, i) if opts.num_messages > 0 else 0,
                      opts.rate / n if opts.rate > 0 else 0.0, opts, state, run_id,
                      deadline, stop, errors))
            for i, p in enumerate(producers)
        ]
        for t in threads:
            t.start()

        def all_done() -> bool:
            return all(not t.is_alive() for t in threads)

        try:
            _report_produce_progress(state, all_done, out if opts.progress else None, t0,
                                     opts.size)
        except KeyboardInterrupt:
            stop.set()
            for t in threads:
                t.join(DRAIN_TIMEOUT)
        drain_deadline = time.monotonic() + DRAIN_TIMEOUT
        while time.monotonic() < drain_deadline:
            with state.lock:
                if state.acked + state.failed >= state.sent:
                    break
            time.sleep(0.005)
        for p in producers:
            try:
                p.close()
            except pulsar.PulsarException:
                pass
        if errors:
            raise errors[0]
    finally:
        client.close()
    state.take_interval()
    end = state.last_completion or time.monotonic()
    seconds = max(end - t0, 1e-9)
    summary = ProduceSummary(
        sent=state.sent, acked=state.acked, failed=state.sent - state.acked,
        seconds=seconds, msg_per_s=state.acked / seconds,
        mb_per_s=state.acked * opts.size / seconds / 1e6,
        latency_ms=state.total.summary_ms(), started_at=started_wall, run_id=run_id)
    if opts.progress:
        _print_produce_summary(summary, out)
    return summary


def _report_produce_progress(state: _ProduceState, done: Callable[[], bool],
                             out: TextIO | None, t0: float, size: int) -> None:
    last_acked, last_t = 0, t0
    while not done():
        time.sleep(0.05)
        now = time.monotonic()
        if now - last_t < PROGRESS_INTERVAL and not done():
            continue
        acked, failed, hist = state.take_interval()
        if out is not None:
            span = max(now - last_t, 1e-9)
            rate = (acked - last_acked) / span
            lat = hist.summary_ms()
            mb = rate * size / 1e6
            print(f"produced: {rate:>11,.1f} msg/s {mb:>9.2f} MB/s  latency ms "
                  f"p50 {_fmt_ms(lat['p50'])} p99 {_fmt_ms(lat['p99'])}  "
                  f"total {acked:,}{f'  failed {failed:,}' if failed else ''}", file=out, flush=True)
        last_acked, last_t = acked, now


def _print_produce_summary(s: ProduceSummary, out: TextIO) -> None:
    lat = s.latency_ms
    print(f"Aggregated produce: {s.acked:,} msgs in {s.seconds:.1f} s: {s.msg_per_s:,.1f} msg/s, "
          f"{s.mb_per_s:.2f} MB/s; failed {s.failed:,}", file=out)
    print("Aggregated latency ms: " + "  ".join(
        f"{k} {_fmt_ms(lat[k])}" for k in ("mean", "p50", "p95", "p99", "p99.9", "max")),
        file=out, flush=True)


# --------------------------------------------------------------------------------------
# Consume


class ConsumeStats:
    """Live counters of a consume run, safe to read from another thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received = 0
        self.bytes = 0
        self.tracker = SequenceTracker()
        self.interval = LatencyHistogram()
        self.total = LatencyHistogram()
        self.first_at = 0.0
        self.last_at = 0.0

    def observe(self, payload: bytes, latency_ms: float) -> None:
        now = time.time()
        with self.lock:
            self.received += 1
            self.bytes += len(payload)
            self.tracker.observe(payload)
            self.interval.record(int(latency_ms * 1000))
            if not self.first_at:
                self.first_at = now
            self.last_at = now

    @property
    def unique(self) -> int:
        with self.lock:
            return self.tracker.unique + self.tracker.untracked

    def take_interval(self) -> tuple[int, int, LatencyHistogram]:
        with self.lock:
            hist, self.interval = self.interval, LatencyHistogram()
            self.total.merge(hist)
            return self.received, self.bytes, hist


def _report_consume_progress(stats: ConsumeStats, threads: list[threading.Thread],
                             out: TextIO | None, t0: float) -> None:
    last_n, last_b, last_t = 0, 0, t0
    while any(t.is_alive() for t in threads):
        time.sleep(0.05)
        now = time.monotonic()
        if now - last_t < PROGRESS_INTERVAL:
            continue
        received, nbytes, hist = stats.take_interval()
        if out is not None:
            span = now - last_t
            lat = hist.summary_ms()
            dup = stats.tracker.duplicates
            print(f"consumed: {(received - last_n) / span:>11,.1f} msg/s "
                  f"{(nbytes - last_b) / span / 1e6:>9.2f} MB/s  e2e latency ms "
                  f"p50 {_fmt_ms(lat['p50'])} p99 {_fmt_ms(lat['p99'])}  total {received:,}"
                  f"{f'  duplicates {dup:,}' if dup else ''}", file=out, flush=True)
        last_n, last_b, last_t = received, nbytes, now


def _consumer_type(name: str) -> Any:
    return getattr(_pulsar().ConsumerType, name.replace("_", ""))


def _consume_loop(consumer: Any, quota: int, rate: float, stats: ConsumeStats, deadline: float,
                  stop: threading.Event, errors: list[BaseException]) -> None:
    pulsar = _pulsar()
    received = 0
    start = time.monotonic()
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            if quota > 0 and stats.received >= quota:
                break
            if rate > 0:
                wait = start + received / rate - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, RECEIVE_POLL_MS / 1000))
                    continue
            try:
                msg = consumer.receive(timeout_millis=RECEIVE_POLL_MS)
            except pulsar.Timeout:
                continue
            stats.observe(msg.data(), time.time() * 1000 - msg.publish_timestamp())
            consumer.acknowledge(msg)
            received += 1
    except Exception as exc:
        errors.append(exc)


def consume(opts: ConsumeOptions, *, stop: threading.Event | None = None,
            ready: threading.Event | None = None, stats: ConsumeStats | None = None,
            out: TextIO | None = None) -> ConsumeSummary:
    """Receive and acknowledge as ``opts`` says until ``-m``, ``-time`` or ``stop``. Sets
    ``ready`` once every consumer is subscribed; counts into ``stats`` (readable while the
    run goes on); prints progress and a summary to ``out`` when ``opts.progress``."""
    out = out or sys.stdout
    stop = stop or threading.Event()
    stats = stats or ConsumeStats()
    pulsar = _pulsar()
    duration = _bounded_duration(opts.num_messages, opts.duration)
    client = _client(opts.service_url)
    consumers = []
    try:
        for topic in opts.topics:
            for _ in range(opts.num_consumers):
                consumers.append(client.subscribe(
                    topic, opts.subscription,
                    consumer_type=_consumer_type(opts.subscription_type),
                    initial_position=getattr(pulsar.InitialPosition, opts.subscription_position),
                    receiver_queue_size=opts.receiver_queue_size,
                ))
        if opts.progress:
            print(f"subscribed {len(consumers)} consumer(s) to {', '.join(opts.topics)} "
                  f"as {opts.subscription!r} ({opts.subscription_type})", file=out, flush=True)
        if ready is not None:
            ready.set()
        t0 = time.monotonic()
        deadline = t0 + duration
        errors: list[BaseException] = []
        n = len(consumers)
        threads = [
            threading.Thread(
                target=_consume_loop, name=f"perf-consumer-{i}", daemon=True,
                args=(c, opts.num_messages, opts.rate / n if opts.rate > 0 else 0.0, stats,
                      deadline, stop, errors))
            for i, c in enumerate(consumers)
        ]
        for t in threads:
            t.start()
        try:
            _report_consume_progress(stats, threads, out if opts.progress else None, t0)
        except KeyboardInterrupt:
            stop.set()
            for t in threads:
                t.join(DRAIN_TIMEOUT)
        for c in consumers:
            try:
                c.close()
            except pulsar.PulsarException:
                pass
        if errors:
            raise errors[0]
    finally:
        client.close()
    stats.take_interval()
    with stats.lock:
        span = stats.last_at - stats.first_at if stats.received > 1 else 0.0
        seconds = max(span, 1e-9)
        tracker = stats.tracker
        summary = ConsumeSummary(
            received=stats.received, unique=tracker.unique + tracker.untracked,
            duplicates=tracker.duplicates, gaps=tracker.gaps, untracked=tracker.untracked, seconds=span,
            msg_per_s=stats.received / seconds if span else 0.0,
            mb_per_s=stats.bytes / seconds / 1e6 if span else 0.0,
            latency_ms=stats.total.summary_ms(), first_at=stats.first_at, last_at=stats.last_at)
    if opts.progress:
        lat = summary.latency_ms
        print(f"Aggregated consume: {summary.received:,} msgs in {summary.seconds:.1f} s: "
              f"{summary.msg_per_s:,.1f} msg/s, {summary.mb_per_s:.2f} MB/s; unique "
              f"{summary.unique:,}, duplicates {summary.duplicates:,}, gaps {summary.gaps:,}",
              file=out)
        print("Aggregated e2e latency ms: " + "  ".join(
            f"{k} {_fmt_ms(lat[k])}" for k in ("mean", "p50", "p95", "p99", "p99.9", "max")),
            file=out, flush=True)
    return summary


# --------------------------------------------------------------------------------------
# Command line


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _pos_int(text: str) -> int:
    value = _nonneg_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("topics", nargs="+", metavar="TOPIC", help="topic(s) to use")
    p.add_argument("-u", "--service-url",
                   default=os.environ.get("MAGNETAR_SERVICE_URL", DEFAULT_SERVICE_URL),
                   help=f"Pulsar service URL (default {DEFAULT_SERVICE_URL}, or $MAGNETAR_SERVICE_URL)")
    p.add_argument("-m", "--num-messages", type=_nonneg_int, default=0,
                   help="messages in total, then stop (0: no count limit)")
    p.add_argument("-time", "--test-duration", type=_nonneg_float, default=0.0, metavar="SECONDS",
                   help=f"seconds to run (0: until -m; {DEFAULT_DURATION:.0f} s when -m is 0 too)")
    p.add_argument("--json", metavar="FILE", help="also write the final summary as JSON to FILE")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="perf_command", metavar="COMMAND", title="commands")

    prod = sub.add_parser("produce", help="publish at a rate and report throughput and latency",
                          description="Publish messages and report msg/s, MB/s and publish latency.")
    _common(prod)
    prod.add_argument("-r", "--rate", type=_nonneg_float, default=100.0,
                      help="messages per second in total (0: as fast as possible; default 100)")
    prod.add_argument("-s", "--size", type=_nonneg_int, default=1024, help="message size in bytes")
    prod.add_argument("-n", "--num-producers", type=_pos_int, default=1, help="producers per topic")
    prod.add_argument("--batching", action=argparse.BooleanOptionalAction, default=True,
                      help="batch messages (default on)")
    prod.add_argument("-db", "--disable-batching", dest="batching", action="store_false",
                      help="same as --no-batching")
    prod.add_argument("-bm", "--batch-max-messages", type=_pos_int, default=1000,
                      help="most messages in one batch (default 1000)")
    prod.add_argument("-b", "--batch-time-window", type=_nonneg_float, default=1.0, metavar="MS",
                      help="longest batch publish delay in whole ms (default 1)")
    prod.add_argument("-z", "--compression", type=str.upper, choices=COMPRESSIONS, default="NONE")
    prod.add_argument("-o", "--max-outstanding", type=_pos_int, default=1000,
                      help="most messages in flight per producer (default 1000)")
    prod.set_defaults(_perf_run=_run_produce)

    cons = sub.add_parser("consume", help="consume and report throughput and end-to-end latency",
                          description="Consume messages and report msg/s, MB/s and end-to-end latency.")
    _common(cons)
    cons.add_argument("-n", "--num-consumers", type=_pos_int, default=1, help="consumers per topic")
    cons.add_argument("-ss", "--subscription", default="sub", help="subscription name (default sub)")
    cons.add_argument("-st", "--subscription-type", default="Exclusive", choices=SUBSCRIPTION_TYPES)
    cons.add_argument("-sp", "--subscription-position", default="Latest", choices=("Latest", "Earliest"))
    cons.add_argument("-q", "--receiver-queue-size", type=_pos_int, default=1000)
    cons.add_argument("-r", "--rate", type=_nonneg_float, default=0.0,
                      help="messages per second in total (0: as fast as they come)")
    cons.set_defaults(_perf_run=_run_consume)
    p.set_defaults(_perf_parser=p)


def _write_json(path: str | None, summary: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=2)


def _run_produce(args: argparse.Namespace) -> int:
    opts = ProduceOptions(
        topics=args.topics, service_url=args.service_url, rate=args.rate, size=args.size,
        num_producers=args.num_producers, num_messages=args.num_messages,
        duration=args.test_duration, batching=args.batching,
        batch_max_messages=args.batch_max_messages, batch_max_delay_ms=args.batch_time_window,
        compression=args.compression, max_outstanding=args.max_outstanding)
    summary = produce(opts)
    _write_json(args.json, summary.as_dict())
    return 0 if summary.failed == 0 else 1


def _run_consume(args: argparse.Namespace) -> int:
    opts = ConsumeOptions(
        topics=args.topics, service_url=args.service_url, subscription=args.subscription,
        subscription_type=args.subscription_type,
        subscription_position=args.subscription_position, num_consumers=args.num_consumers,
        num_messages=args.num_messages, duration=args.test_duration, rate=args.rate,
        receiver_queue_size=args.receiver_queue_size)
    summary = consume(opts)
    _write_json(args.json, summary.as_dict())
    return 0


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_perf_run", None)
    if fn is None:
        args._perf_parser.print_help(sys.stderr)
        return 2
    try:
        import pulsar  # noqa: F401
    except ImportError:
        print("magnetar perf: error: needs the Pulsar client library "
              "(pip install pulsar-client)", file=sys.stderr)
        return 2
    try:
        return int(fn(args))
    except Exception as exc:
        pulsar = sys.modules.get("pulsar")
        if pulsar is not None and isinstance(exc, pulsar.PulsarException):
            print(f"magnetar perf: error: {exc}", file=sys.stderr)
            return 1
        raise


register_command(Command(
    "perf",
    "measure publish and consume throughput and latency (like pulsar-perf)",
    _add_arguments,
    run,
    "Load a broker with the Pulsar client library and report msg/s, MB/s and latency percentiles.",
))
