"""gateway._perf: ``magnetar perf produce|consume`` against a real standalone, and the
histogram and sequence tracking it reports with."""

from __future__ import annotations

import doctest
import io
import json
import math
import os
import random
import selectors
import signal
import subprocess
import sys
import threading

import pytest

from gateway import _perf
from gateway._cli import build_parser, main
from gateway._perf import (
    HEADER_SIZE,
    ConsumeOptions,
    ConsumeStats,
    LatencyHistogram,
    ProduceOptions,
    SequenceTracker,
    consume,
    make_payload,
    produce,
)
from tests._standalone import Standalone

BOUND = 60.0


def _readline(proc: subprocess.Popen, timeout: float = BOUND) -> str:
    """The next line of a child's stdout, failing after ``timeout`` seconds."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        assert sel.select(timeout), "no output in time"
    finally:
        sel.close()
    return proc.stdout.readline()


# ----------------------------------------------------------------------------------
# Histogram and tracker


def test_doc_examples_run():
    import gateway._perf

    result = doctest.testmod(gateway._perf)
    assert result.attempted >= 5 and result.failed == 0


def test_histogram_exact_below_2048_us():
    h = LatencyHistogram()
    for v in range(1, 1001):
        h.record(v)
    assert h.count == 1000
    assert h.percentile(0.5) == 500
    assert h.percentile(0.99) == 990
    assert h.percentile(0.999) == 999
    assert h.percentile(1.0) == 1000
    assert h.max == 1000
    assert h.mean == pytest.approx(500.5)


def test_histogram_relative_error_is_bounded_over_the_range():
    rng = random.Random(7)
    values = sorted(int(10 ** rng.uniform(0, 9)) for _ in range(20_000))
    h = LatencyHistogram()
    for v in values:
        h.record(v)
    for p in (0.5, 0.9, 0.95, 0.99, 0.999):
        exact = values[math.ceil(p * len(values)) - 1]
        assert h.percentile(p) == pytest.approx(exact, rel=2e-3, abs=1)
    assert h.max == values[-1]


def test_histogram_merge_and_empty():
    a, b = LatencyHistogram(), LatencyHistogram()
    assert a.count == 0 and math.isnan(a.percentile(0.5))
    assert all(math.isnan(v) for v in a.summary_ms().values())
    for v in (1, 2, 3):
        a.record(v)
    for v in (100_000, 200_000):
        b.record(v)
    a.merge(b)
    assert a.count == 5
    assert a.max == 200_000
    assert a.percentile(0.6) == 3
    assert a.percentile(1.0) == pytest.approx(200_000, rel=1e-3)
    s = a.summary_ms()
    assert list(s) == ["mean", "p50", "p95", "p99", "p99.9", "max"]
    assert s["max"] == 200.0


def test_negative_latency_counts_as_zero():
    h = LatencyHistogram()
    h.record(-5)
    assert h.count == 1 and h.max == 0 and h.percentile(0.5) == 0


def test_payload_has_the_requested_size_and_header():
    pad = bytes(range(256)) * 8
    for size in (0, 1, HEADER_SIZE - 1, HEADER_SIZE, 100, 1024):
        p = make_payload(size, 1, 2, 3, pad)
        assert len(p) == size
    t = SequenceTracker()
    assert t.observe(make_payload(10, 1, 2, 3, pad))
    assert t.untracked == 1 and t.unique == 0


def test_tracker_counts_unique_duplicates_and_gaps_per_producer():
    pad = bytes(100)
    t = SequenceTracker()
    for run, producer, seq in [(1, 0, 0), (1, 0, 1), (1, 0, 1), (1, 1, 0), (2, 0, 0),
                               (1, 0, 5), (1, 0, 0)]:
        t.observe(make_payload(100, run, producer, seq, pad))
    assert t.unique == 5
    assert t.duplicates == 2
    assert t.gaps == 3  # (1, 0) is missing 2, 3 and 4
    assert t.untracked == 0


def test_tracker_grows_for_large_sequence_numbers():
    pad = bytes(100)
    t = SequenceTracker()
    seqs = [0, 10_000_000, 8191, 8192, 10_000_000]
    for s in seqs:
        t.observe(make_payload(100, 9, 0, s, pad))
    assert t.unique == 4 and t.duplicates == 1


def test_tracker_ignores_foreign_payloads():
    t = SequenceTracker()
    assert t.observe(b"x" * 100)
    assert t.untracked == 1 and t.unique == 0 and t.duplicates == 0


# ----------------------------------------------------------------------------------
# Command line


def test_perf_is_a_registered_command(capsys):
    assert main(["--help"]) == 0
    assert "perf" in capsys.readouterr().out
    assert main(["perf"]) == 2
    assert "produce" in capsys.readouterr().err


def test_produce_flags_mirror_pulsar_perf():
    args = build_parser().parse_args(
        ["perf", "produce", "t1", "t2", "--service-url", "pulsar://h:1", "-r", "0", "-s", "100",
         "-n", "3", "-m", "50", "-time", "7.5", "--no-batching", "-bm", "10", "-b", "5",
         "-z", "lz4", "-o", "20"])
    assert args.topics == ["t1", "t2"]
    assert args.service_url == "pulsar://h:1"
    assert (args.rate, args.size, args.num_producers, args.num_messages) == (0, 100, 3, 50)
    assert args.test_duration == 7.5
    assert args.batching is False
    assert (args.batch_max_messages, args.batch_time_window) == (10, 5)
    assert (args.compression, args.max_outstanding) == ("LZ4", 20)
    assert build_parser().parse_args(["perf", "produce", "t", "-db"]).batching is False
    defaults = build_parser().parse_args(["perf", "produce", "t"])
    assert defaults.batching is True and defaults.rate == 100 and defaults.size == 1024


def test_consume_flags_mirror_pulsar_perf():
    args = build_parser().parse_args(
        ["perf", "consume", "t", "-ss", "s1", "-st", "Key_Shared", "-sp", "Earliest", "-n", "2",
         "-q", "50", "-r", "10", "-m", "5", "--test-duration", "3"])
    assert (args.subscription, args.subscription_type, args.subscription_position) == (
        "s1", "Key_Shared", "Earliest")
    assert (args.num_consumers, args.receiver_queue_size, args.rate) == (2, 50, 10)
    assert (args.num_messages, args.test_duration) == (5, 3)


@pytest.mark.parametrize("bad", [["-r", "-1"], ["-n", "0"], ["-z", "brotli"], ["-time", "x"]])
def test_bad_flags_are_usage_errors(bad, capsys):
    assert main(["perf", "produce", "t", *bad]) == 2


def test_missing_client_library_is_reported(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pulsar", None)
    assert main(["perf", "produce", "t", "-m", "1"]) == 2
    assert "pip install pulsar-client" in capsys.readouterr().err


# ----------------------------------------------------------------------------------
# Against a real broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Standalone(tmp_path_factory.mktemp("perf")) as s:
        yield s


def _start_consumer(opts: ConsumeOptions) -> tuple[threading.Thread, threading.Event,
                                                   ConsumeStats, list]:
    stats, stop, ready = ConsumeStats(), threading.Event(), threading.Event()
    result: list = []

    def body() -> None:
        try:
            result.append(consume(opts, stop=stop, ready=ready, stats=stats, out=io.StringIO()))
        except BaseException as exc:
            result.append(exc)
            ready.set()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    assert ready.wait(BOUND)
    return t, stop, stats, result


@pytest.mark.parametrize("batching", [True, False])
def test_produce_and_consume_every_message_once(broker, unique, batching):
    topic = f"perf-{unique}"
    copts = ConsumeOptions(topics=[topic], service_url=broker.pulsar_url, subscription="s",
                           subscription_position="Earliest", num_messages=3000, duration=BOUND)
    thread, _, _, result = _start_consumer(copts)
    out = io.StringIO()
    summary = produce(ProduceOptions(topics=[topic], service_url=broker.pulsar_url, rate=0,
                                     size=100, num_producers=2, num_messages=3000,
                                     batching=batching), out=out)
    assert (summary.sent, summary.acked, summary.failed) == (3000, 3000, 0)
    assert summary.msg_per_s > 0
    assert summary.latency_ms["p50"] <= summary.latency_ms["p99"] <= summary.latency_ms["max"]
    assert "Aggregated produce: 3,000 msgs" in out.getvalue()
    assert "p99.9" in out.getvalue()
    thread.join(BOUND)
    assert not thread.is_alive()
    consumed = result[0]
    assert not isinstance(consumed, BaseException), consumed
    assert (consumed.received, consumed.unique, consumed.duplicates, consumed.gaps) == (
        3000, 3000, 0, 0)
    assert consumed.latency_ms["max"] >= consumed.latency_ms["p50"] >= 0


def test_receipt_callbacks_keep_their_thread_state(broker, unique, monkeypatch):
    # The client calls each receipt on a thread Python did not start; without a kept
    # state every call would get a new one (and map and unmap its frame stack), so the
    # first-time branch would run once per receipt instead of once per client thread.
    firsts = []
    keep = _perf._keep_thread_state

    def counted() -> bool:
        first = keep()
        firsts.append(first)
        return first

    monkeypatch.setattr(_perf, "_keep_thread_state", counted)
    summary = produce(ProduceOptions(topics=[f"perf-keep-{unique}"], service_url=broker.pulsar_url,
                                     rate=0, size=100, num_messages=2000, batching=False),
                      out=io.StringIO())
    assert summary.acked == 2000
    assert len(firsts) == 2000
    assert 1 <= sum(firsts) <= 4


def test_several_topics_with_a_consumer_each(broker, unique):
    topics = [f"perf-a-{unique}", f"perf-b-{unique}"]
    copts = ConsumeOptions(topics=topics, service_url=broker.pulsar_url, subscription="s",
                           subscription_position="Earliest", num_messages=1000, duration=BOUND)
    thread, _, _, result = _start_consumer(copts)
    summary = produce(ProduceOptions(topics=topics, service_url=broker.pulsar_url, rate=0,
                                     size=HEADER_SIZE, num_messages=1000), out=io.StringIO())
    assert summary.acked == 1000
    thread.join(BOUND)
    assert not thread.is_alive()
    assert (result[0].unique, result[0].duplicates, result[0].gaps) == (1000, 0, 0)


def test_rate_limit_spreads_the_sends(broker, unique):
    summary = produce(ProduceOptions(topics=[f"perf-rate-{unique}"], service_url=broker.pulsar_url,
                                     rate=400, size=64, num_messages=400, batching=False),
                      out=io.StringIO())
    assert summary.acked == 400
    # 400 messages at 400/s: the last one is not due before 0.9975 s.
    assert summary.seconds >= 0.99


def test_duration_bounds_a_run(broker, unique):
    out = io.StringIO()
    summary = produce(ProduceOptions(topics=[f"perf-time-{unique}"], service_url=broker.pulsar_url,
                                     rate=200, size=10, duration=2.5), out=out)
    assert 2.0 <= summary.seconds < 2.5 + 10
    assert 300 <= summary.acked <= 501
    assert out.getvalue().count("produced:") >= 1


def test_cli_produce_then_consume_with_json(broker, unique, tmp_path):
    topic = f"perf-cli-{unique}"
    sub = "cli"
    # Subscribe first so the messages are kept for the subscription.
    consumer = subprocess.Popen(
        [sys.executable, "-m", "gateway", "perf", "consume", topic, "-u", broker.pulsar_url,
         "-ss", sub, "-st", "Shared", "-n", "2", "-m", "500", "-time", "60",
         "--json", str(tmp_path / "c.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = _readline(consumer)
        assert first.startswith("subscribed 2 consumer(s)"), first
        produced = subprocess.run(
            [sys.executable, "-m", "gateway", "perf", "produce", topic, "-u", broker.pulsar_url,
             "-r", "0", "-s", "200", "-m", "500", "-z", "LZ4", "-bm", "50",
             "--json", str(tmp_path / "p.json")],
            capture_output=True, text=True, timeout=BOUND)
        assert produced.returncode == 0, produced.stderr
        assert "Aggregated produce: 500 msgs" in produced.stdout
        assert "Aggregated latency ms:" in produced.stdout
        rest, err = consumer.communicate(timeout=BOUND)
        assert consumer.returncode == 0, err
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    p = json.loads((tmp_path / "p.json").read_text())
    c = json.loads((tmp_path / "c.json").read_text())
    assert (p["sent"], p["acked"], p["failed"]) == (500, 500, 0)
    assert set(p["latency_ms"]) == {"mean", "p50", "p95", "p99", "p99.9", "max"}
    assert (c["received"], c["unique"], c["duplicates"], c["gaps"]) == (500, 500, 0, 0)
    assert "Aggregated consume: 500 msgs" in rest


def test_stop_event_ends_a_consumer(broker, unique):
    copts = ConsumeOptions(topics=[f"perf-stop-{unique}"], service_url=broker.pulsar_url,
                           duration=BOUND)
    thread, stop, _, result = _start_consumer(copts)
    stop.set()
    thread.join(BOUND)
    assert not thread.is_alive()
    assert result[0].received == 0


def test_ctrl_c_stops_a_producer_with_a_summary(broker, unique):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "perf", "produce", f"perf-int-{unique}",
         "-u", broker.pulsar_url, "-r", "200", "-s", "64", "-time", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = _readline(proc)
        assert line.startswith("produced:"), line
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Aggregated produce:" in rest and "failed 0" in rest


def test_consume_duration_bounds_an_idle_consumer(broker, unique):
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "perf", "consume", f"perf-idle-{unique}",
         "-u", broker.pulsar_url, "-time", "1"],
        capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0, done.stderr
    assert "Aggregated consume: 0 msgs" in done.stdout


def test_bench_end_to_end_counts_every_message_and_broker_cpu(broker, unique, tmp_path):
    from bench._proc import cpu_seconds
    from bench.pulsar_bench import _end_to_end

    assert cpu_seconds(os.getpid()) > 0
    assert broker.proc is not None
    case = _end_to_end(broker.pulsar_url, broker.proc.pid, f"bench-{unique}", 100, True, 2000,
                       1.0, tmp_path)
    assert case["acked"] >= 1000
    assert (case["unique"], case["duplicates"], case["lost"]) == (case["acked"], 0, 0)
    assert case["cpu_s"] > 0 and case["cpu_us_per_msg"] > 0
    assert 0 <= case["kernel_us_per_msg"] <= case["cpu_us_per_msg"]
    assert case["e2e_msg_per_s"] > 0
    assert case["publish_latency_ms"]["p99"] >= case["publish_latency_ms"]["p50"]


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_missing_namespace_is_an_error_not_a_traceback(broker, command):
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "perf", command, "persistent://no-such/ns/t",
         "-u", broker.pulsar_url, "-m", "1"],
        capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 1
    assert "magnetar perf: error:" in done.stderr and "TopicNotFound" in done.stderr
    assert "Traceback" not in done.stderr


def test_bench_table_sets_the_p99_target_beside_the_peer_that_never_syncs(capsys):
    from bench.pulsar_bench import _print_table

    def case(p99_ms: float, rate: float, cpu: float) -> dict[str, float]:
        return {"e2e_msg_per_s": rate, "cpu_us_per_msg": cpu, "kernel_us_per_msg": cpu / 2,
                "half_p99_ms": p99_ms, "duplicates": 0, "half_duplicates": 0, "lost": 0,
                "half_lost": 0}

    results = {"magnetar": {"100-batch": case(1.0, 20_000, 1.0)},
               "pulsar-lite": {"100-batch": case(2.0, 10_000, 4.0)}}
    _print_table(results, {"p50_us": 200.0, "p99_us": 300.0})
    out = capsys.readouterr().out
    # 1.0 ms and 2.0 ms over a 0.2 ms fdatasync
    assert "p99 5.0x fsync (target <= 3: MISSED; pulsar-lite, which never syncs, 10.0x)" in out
    assert results["magnetar"]["100-batch"]["ratios"]["peer_p99_fsyncs"] == 10.0
    assert "up to 1 ms (5.0x fsync)" in out


def test_the_receipts_floor_answers_the_official_client_at_once():
    import pulsar

    from bench.pulsar_bench import receipts_endpoint

    with receipts_endpoint() as url:
        client = pulsar.Client(url, operation_timeout_seconds=10)
        try:
            producer = client.create_producer("floor", batching_enabled=False)
            ids = [producer.send(b"x" * 100) for _ in range(3)]
            # one entry each, in order, as a broker's receipts give them
            assert [i.entry_id() for i in ids] == [0, 1, 2]
            producer.close()
        finally:
            client.close()


def test_bench_table_sets_the_p99_beside_this_machines_floor(capsys):
    from bench.pulsar_bench import _print_table

    def case(p99_ms: float) -> dict[str, float]:
        return {"e2e_msg_per_s": 10_000, "cpu_us_per_msg": 1.0, "kernel_us_per_msg": 0.5,
                "half_p99_ms": p99_ms, "duplicates": 0, "half_duplicates": 0, "lost": 0,
                "half_lost": 0}

    results = {"magnetar": {"100-batch": case(2.0), "1024-batch": case(2.0)},
               "pulsar-lite": {"100-batch": case(2.0), "1024-batch": case(2.0)},
               "floor": {"100-batch": {"client_p99_ms": 1.0, "disk_p99_ms": 0.3,
                                       "floor_p99_ms": 1.0},
                         "1024-batch": {"client_p99_ms": 0.2, "disk_p99_ms": 0.5,
                                        "floor_p99_ms": 0.5}}}
    _print_table(results, {"p50_us": 200.0, "p99_us": 300.0})  # target 0.6 ms
    out = capsys.readouterr().out
    assert "client 1.000 ms (pulsar-receipts), disk 0.300 ms (bare write+fdatasync); the " \
           "target is below this floor" in out
    assert "the target is above this floor; Magnetar's p99 is 4.0x it" in out
    assert results["magnetar"]["100-batch"]["ratios"]["target_below_floor"] is True
    assert results["magnetar"]["1024-batch"]["ratios"]["p99_over_floor"] == 4.0
