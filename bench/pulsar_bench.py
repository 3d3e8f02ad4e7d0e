"""The Pulsar protocol end to end with the official client: Magnetar standalone beside
pulsar-lite (a Rust Pulsar-protocol broker, PyPI ``pulsar-lite``), measured in one run.

For 100 B and 1 KiB messages, batching on and off, journal fsync on, each broker gets:

- end-to-end throughput: a ``magnetar perf produce`` process publishes as fast as it can
  for :data:`PEAK_SECONDS` while a consumer in this process receives and acknowledges;
  messages are counted UNIQUE by the payload's producer and sequence number, so the
  duplicates and the losses (acknowledged by the broker, never delivered) are reported;
- the broker's own CPU seconds per message: utime + stime of the broker process (all its
  threads, bookies included for Magnetar) from ``/proc/<pid>/stat``, before and after;
- publish p99 at half of the measured peak rate, for :data:`LATENCY_SECONDS`, with the
  consumer running, beside one raw ``write + fdatasync`` of this disk
  (:func:`bench.storage_bench.raw_fsync`);
- beside that p99, this machine's floors at Magnetar's half rate, measured in the same
  round: the client's (the same producer against ``pulsar-receipts``, a Rust endpoint
  that stores nothing and answers each SEND at once, with no consumer) and the disk's
  (the same bytes arriving at the same rate, written and fdatasync'ed by a bare loop:
  :func:`bench.storage_bench.raw_open_loop`). A broker that fsyncs before it answers
  pays both, so the larger of the two is a floor for its p99.

Beside the table, what one wake-up costs on this machine (:func:`wake_costs`): the CPU a
thread spends to take one byte from a socket after sleeping 1 or 10 ms, as a trio task
(what each of the broker's protocol and completion wake-ups is) and as a plain blocking
read. With batching, the broker's Python thread wakes one to two times per stored entry and
sleeps in between, so on a machine where a wake-up after a sleep is costly, that cost, not
the work per message, sets its CPU per entry.

Durability differs: Magnetar acknowledges a publish once its journal has fdatasync'ed it;
pulsar-lite (0.2.0) has no setting for syncing and never calls fsync or fdatasync (its
RocksDB write-ahead log is written, not synced), so its publish latency carries no disk
sync. The table says so beside the ratios.

Each broker first gets one untimed warm-up run of :data:`WARMUP_SECONDS`, so that neither
pays for its start (first topic, first ledger, cold caches) in a measured case. Every
case runs :data:`ROUNDS` times (``MAGNETAR_BENCH_ROUNDS`` overrides), the brokers
taking turns in alternating order, and the table shows the medians (counts summed) with
the ratios Magnetar/peer and the issue's targets. ``MAGNETAR_BENCH_DIR`` is where the data
directories go; ``MAGNETAR_BENCH_CASES`` (e.g. ``100-batch,1024-nobatch``) runs only
the cases it names. Every loop is bounded in count and in time; the whole bench takes about
six minutes on two cores.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from bench._proc import (
    combine_rounds,
    cpu_times,
    free_port,
    peer_ratios,
    quiet_disk,
    side_by_side,
    verdict,
)
from bench.storage_bench import raw_fsync, raw_open_loop
from gateway._perf import ConsumeOptions, ConsumeStats, consume
from tests._standalone import Standalone

SIZES = (100, 1024)
BATCHING = (True, False)
PEAK_SECONDS = 6.0
ROUNDS = 3
LATENCY_SECONDS = 4.0
#: After the producer ends, longest wait for the consumer to catch up, and the quiet
#: period after which what has not arrived is counted as lost.
CATCH_UP_SECONDS = 30.0
QUIET_SECONDS = 5.0
READY_TIMEOUT = 30.0
PRODUCER_TIMEOUT = 90.0
BATCH_DELAY_MS = 1
BUILD_TIMEOUT = 900.0
WARMUP_SECONDS = 2.0

# Targets of the issue (Native Pulsar broker, "Benchmark").
TARGET_THROUGHPUT_RATIO = 1.0
TARGET_CPU_RATIO = 0.5
TARGET_P99_FSYNCS = 3.0

REPO = Path(__file__).resolve().parent.parent




def pulsar_lite_binary() -> Path:
    """The broker binary shipped inside the ``pulsar-lite`` wheel."""
    try:
        import pulsar_lite
    except ImportError:
        raise RuntimeError("pulsar-lite is not installed (pip install pulsar-lite)") from None
    return Path(pulsar_lite.__file__).resolve().parent / "bin" / "pulsar-lite"


def receipts_binary() -> Path:
    """``pulsar-receipts`` (rust/pulsar-wire), built in release mode where cargo puts it
    (``CARGO_TARGET_DIR``, as the Makefile sets it, or the workspace's ``target``)."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "magnetar-pulsar-wire",
                    "--bin", "pulsar-receipts"], cwd=REPO, check=True, timeout=BUILD_TIMEOUT)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    return target / "release" / "pulsar-receipts"


@contextlib.contextmanager
def receipts_endpoint() -> Iterator[str]:
    """A ``pulsar-receipts`` process on a free port: its service URL."""
    proc = subprocess.Popen([str(receipts_binary()), "--addr", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        line = _first_line(proc.stdout, READY_TIMEOUT)
        if not line.startswith("listening on "):
            raise RuntimeError(f"pulsar-receipts did not start: {line!r}")
        yield "pulsar://" + line.removeprefix("listening on ").strip()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _first_line(stream: Any, timeout: float) -> str:
    """The first line of a child's output, waiting at most ``timeout`` seconds for it."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline().decode(errors="replace") if ready else ""


WAKE_INTERVALS_MS = (1, 10)
WAKES = 150


def wake_costs() -> dict[str, float]:
    """CPU microseconds per wake-up, after sleeps of each of :data:`WAKE_INTERVALS_MS`:
    ``trio_<N>ms_us`` for a trio task receiving from a socket, ``blocking_<N>ms_us`` for a
    thread blocked in ``recv``. Another thread sends one byte every N ms, :data:`WAKES`
    times; the receiving thread's own CPU time (``time.thread_time``) is divided by them."""
    costs: dict[str, float] = {}
    for ms in WAKE_INTERVALS_MS:
        costs[f"trio_{ms}ms_us"] = _wake_cost(ms / 1000, use_trio=True)
        costs[f"blocking_{ms}ms_us"] = _wake_cost(ms / 1000, use_trio=False)
    return costs


def _wake_cost(interval: float, use_trio: bool) -> float:
    sender, receiver = socket.socketpair()

    def send() -> None:
        for _ in range(WAKES):
            time.sleep(interval)
            sender.send(b"x")

    async def receive_trio() -> None:
        sock = trio.socket.from_stdlib_socket(receiver)
        got = 0
        while got < WAKES:
            got += len(await sock.recv(4096))

    def receive_blocking() -> None:
        got = 0
        while got < WAKES:
            got += len(receiver.recv(4096))

    with sender, receiver:
        thread = threading.Thread(target=send, name="bench-waker", daemon=True)
        start = time.thread_time()
        thread.start()
        if use_trio:
            trio.run(receive_trio)
        else:
            receive_blocking()
        spent = time.thread_time() - start
        thread.join()
    return spent / WAKES * 1e6


def floors(size: int, batching: bool, rate: float, workdir: Path) -> dict[str, float]:
    """This machine's publish-latency floors at ``rate`` (see the module docs): the
    client's p50 and p99 against ``pulsar-receipts``, the disk's p99, and the larger p99."""
    with receipts_endpoint() as url:
        client = _run_producer(url, f"floor-{_label(size, batching)}", size, batching, rate,
                               LATENCY_SECONDS, workdir)["latency_ms"]
    quiet_disk()
    disk = raw_open_loop(workdir, size, rate, LATENCY_SECONDS)
    disk_p99 = disk["p99_us"] / 1000
    return {"client_p50_ms": client["p50"], "client_p99_ms": client["p99"],
            "disk_p99_ms": disk_p99, "floor_p99_ms": max(client["p99"], disk_p99)}


@contextlib.contextmanager
def magnetar_broker(root: Path) -> Iterator[tuple[str, int]]:
    """A Magnetar standalone (1 bookie, journal fsync on): (service URL, broker pid)."""
    data = root / "magnetar"
    data.mkdir()
    with Standalone(data, conf={"journalSyncData": True}) as s:
        assert s.proc is not None
        yield s.pulsar_url, s.proc.pid


@contextlib.contextmanager
def pulsar_lite_broker(root: Path) -> Iterator[tuple[str, int]]:
    """pulsar-lite on a free port with its metrics listener off: (service URL, pid)."""
    base = root / "pulsar-lite"
    base.mkdir()
    config = base / "pulsar-lite.toml"
    config.write_text("[metrics]\nenabled = false\n")
    port = free_port()
    with open(base / "broker.log", "wb") as log:
        proc = subprocess.Popen(
            [str(pulsar_lite_binary()), "--addr", f"127.0.0.1:{port}", "--db-path",
             str(base / "db"), "--config", str(config), "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=base)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError("pulsar-lite exited:\n" + (base / "broker.log").read_text())
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("pulsar-lite did not listen in time") from None
                time.sleep(0.05)
        yield f"pulsar://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_producer(url: str, topic: str, size: int, batching: bool, rate: float,
                  seconds: float, workdir: Path) -> dict[str, Any]:
    """``magnetar perf produce`` in its own process (its own GIL); its JSON summary."""
    out = workdir / f"{topic}.produce.json"
    args = [sys.executable, "-m", "gateway", "perf", "produce", topic, "-u", url,
            "-s", str(size), "-r", str(rate), "-time", str(seconds),
            "-b", str(BATCH_DELAY_MS), "--batching" if batching else "--no-batching",
            "--json", str(out)]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, timeout=PRODUCER_TIMEOUT,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    if not out.exists():
        raise RuntimeError(f"perf produce failed ({proc.returncode}):\n"
                           + proc.stderr.decode(errors="replace")[-2000:])
    return dict(json.loads(out.read_text()))


def _end_to_end(url: str, pid: int, topic: str, size: int, batching: bool, rate: float,
                seconds: float, workdir: Path) -> dict[str, Any]:
    """One producer process against one consumer here, started on a quiet disk; counts,
    CPU and latency."""
    quiet_disk()
    stats = ConsumeStats()
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    opts = ConsumeOptions(topics=[topic], service_url=url, subscription="bench",
                          subscription_position="Earliest",
                          duration=seconds + PRODUCER_TIMEOUT + CATCH_UP_SECONDS,
                          progress=False)

    def consumer() -> None:
        try:
            consume(opts, stop=stop, ready=ready, stats=stats)
        except BaseException as exc:
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=consumer, name="bench-consumer", daemon=True)
    thread.start()
    try:
        if not ready.wait(READY_TIMEOUT) or failure:
            raise RuntimeError(f"consumer did not subscribe: {failure[:1]}")
        cpu0 = cpu_times(pid)
        produced = _run_producer(url, topic, size, batching, rate, seconds, workdir)
        # Wait for the consumer to catch up; stop once quiet for QUIET_SECONDS.
        deadline = time.monotonic() + CATCH_UP_SECONDS
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline and thread.is_alive():
            with stats.lock:
                unique = stats.tracker.unique
            if unique >= produced["acked"]:
                break
            if unique != last:
                last, last_change = unique, time.monotonic()
            elif time.monotonic() - last_change > QUIET_SECONDS:
                break
            time.sleep(0.02)
        cpu1 = cpu_times(pid)
    finally:
        stop.set()
        thread.join(READY_TIMEOUT)
    if failure:
        raise RuntimeError(f"consumer failed: {failure[0]!r}")
    with stats.lock:
        unique = stats.tracker.unique
        duplicates = stats.tracker.duplicates
        last_at = stats.last_at
    span = max(last_at - produced["started_at"], 1e-9)
    acked = int(produced["acked"])
    kernel = cpu1[1] - cpu0[1]
    cpu = cpu1[0] - cpu0[0] + kernel
    return {
        "acked": acked, "unique": unique, "duplicates": duplicates,
        "lost": max(0, acked - unique), "e2e_msg_per_s": unique / span if unique else 0.0,
        "produce_msg_per_s": produced["msg_per_s"], "cpu_s": cpu,
        "cpu_us_per_msg": cpu / acked * 1e6 if acked else math.nan,
        "kernel_us_per_msg": kernel / acked * 1e6 if acked else math.nan,
        "publish_latency_ms": produced["latency_ms"],
    }


def _case(url: str, pid: int, size: int, batching: bool, workdir: Path,
          tag: str) -> dict[str, Any]:
    """Peak end to end, then publish latency at half of that rate, on fresh topics."""
    label = _label(size, batching)
    try:
        peak = _end_to_end(url, pid, f"peak-{label}-{tag}", size, batching, 0, PEAK_SECONDS,
                           workdir)
        half = peak["e2e_msg_per_s"] / 2
        lat = _end_to_end(url, pid, f"half-{label}-{tag}", size, batching, max(half, 1.0),
                          LATENCY_SECONDS, workdir)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {**peak, "half_rate": half,
            "half_p50_ms": lat["publish_latency_ms"]["p50"],
            "half_p99_ms": lat["publish_latency_ms"]["p99"],
            "half_duplicates": lat["duplicates"], "half_lost": lat["lost"]}


_MEDIANS = ("e2e_msg_per_s", "produce_msg_per_s", "cpu_us_per_msg", "kernel_us_per_msg", "half_rate",
            "half_p50_ms", "half_p99_ms")
_SUMS = ("acked", "unique", "duplicates", "lost", "half_duplicates", "half_lost", "cpu_s")


def _label(size: int, batching: bool) -> str:
    return f"{size}-{'batch' if batching else 'nobatch'}"


def _cases() -> list[tuple[int, bool]]:
    """The (size, batching) cases to run: all of them, or those ``MAGNETAR_BENCH_CASES``
    names by their labels."""
    every = [(size, batching) for size in SIZES for batching in BATCHING]
    wanted = os.environ.get("MAGNETAR_BENCH_CASES", "").replace(" ", "")
    if not wanted:
        return every
    labels = set(wanted.split(","))
    unknown = labels - {_label(*case) for case in every}
    if unknown:
        raise ValueError(f"unknown bench cases: {', '.join(sorted(unknown))}")
    return [case for case in every if _label(*case) in labels]


_FLOOR_MEDIANS = ("client_p50_ms", "client_p99_ms", "disk_p99_ms", "floor_p99_ms")


def _floor(size: int, batching: bool, rate: float, workdir: Path) -> dict[str, Any]:
    """:func:`floors` for one case and round, printed; an error is reported, not raised."""
    workdir.mkdir(exist_ok=True)
    try:
        floor: dict[str, Any] = floors(size, batching, rate, workdir)
    except Exception as exc:
        floor = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  floor {_label(size, batching)}: {floor['error'][:200]}", flush=True)
        return floor
    print(f"  floor {_label(size, batching)} at {rate:,.0f} msg/s: client p99 "
          f"{floor['client_p99_ms']:.2f} ms, disk p99 {floor['disk_p99_ms']:.2f} ms", flush=True)
    return floor


def _short(c: dict[str, Any]) -> str:
    if "error" in c:
        return c["error"][:200]
    return (f"{c['e2e_msg_per_s']:,.0f} msg/s e2e, {c['cpu_us_per_msg']:.1f} us CPU/msg, "
            f"p99 {c['half_p99_ms']:.2f} ms at {c['half_rate']:,.0f} msg/s, "
            f"dup {c['duplicates'] + c['half_duplicates']}, lost {c['lost'] + c['half_lost']}")



def run() -> dict[str, Any]:
    base = Path(os.environ.get("MAGNETAR_BENCH_DIR", "bench/results"))
    base.mkdir(parents=True, exist_ok=True)
    rounds = max(1, int(os.environ.get("MAGNETAR_BENCH_ROUNDS", str(ROUNDS))))
    print("\nPulsar: official client end to end, Magnetar standalone vs pulsar-lite "
          f"(journal fsync on; {rounds} round{'s' if rounds > 1 else ''})", flush=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-pulsar-") as tmp, \
            contextlib.ExitStack() as stack:
        root = Path(tmp)
        fsync = raw_fsync(root)
        wakes = wake_costs()
        print("  CPU per wake-up after a sleep of " + ", ".join(
            f"{ms} ms: trio task {wakes[f'trio_{ms}ms_us']:.0f} us, blocking read "
            f"{wakes[f'blocking_{ms}ms_us']:.0f} us" for ms in WAKE_INTERVALS_MS), flush=True)
        # Both brokers run for the whole bench and take turns case by case, so a busy
        # moment of the machine falls on both alike.
        brokers: dict[str, tuple[str, int]] = {}
        results: dict[str, Any] = {}
        for name, broker in (("magnetar", magnetar_broker), ("pulsar-lite", pulsar_lite_broker)):
            try:
                brokers[name] = stack.enter_context(broker(root))
                results[name] = {}
                (root / f"runs-{name}").mkdir()
            except Exception as exc:
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  {name}: {results[name]['error'][:300]}", flush=True)
        for name, (url, pid) in brokers.items():
            try:
                _end_to_end(url, pid, "warmup", SIZES[0], True, 0, WARMUP_SECONDS,
                            root / f"runs-{name}")
            except Exception as exc:  # the measured cases will say what is wrong
                print(f"  {name} warm-up: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for round_no in range(rounds):
            for size, batching in _cases():
                label = _label(size, batching)
                order = list(brokers.items())
                if round_no % 2:
                    order.reverse()
                for name, (url, pid) in order:
                    case = _case(url, pid, size, batching, root / f"runs-{name}",
                                 f"r{round_no}")
                    runs.setdefault((name, label), []).append(case)
                    print(f"  {name} {label}: {_short(case)}", flush=True)
                ours = runs.get(("magnetar", label), [{}])[-1]
                if "half_rate" in ours:
                    floor = _floor(size, batching, ours["half_rate"], root / "runs-floor")
                    runs.setdefault(("floor", label), []).append(floor)
        for (name, label), cases in runs.items():
            medians = _FLOOR_MEDIANS if name == "floor" else _MEDIANS
            results.setdefault(name, {})[label] = combine_rounds(cases, medians, () if name == "floor" else _SUMS)
    load = os.getloadavg()
    _print_table(results, fsync)
    print(f"  load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} CPUs (other work on the machine skews the figures)", flush=True)
    return {"raw_fsync": fsync, "wake_cpu_us": wakes, "load_average": load, **results}


def _print_table(results: dict[str, Any], fsync: dict[str, float]) -> None:
    fsync_ms = fsync["p50_us"] / 1000
    print(f"  raw write+fdatasync (1 KiB): p50 {fsync_ms:.3f} ms, p99 "
          f"{fsync['p99_us'] / 1000:.3f} ms; p99 target {TARGET_P99_FSYNCS:.0f}x p50 = "
          f"{TARGET_P99_FSYNCS * fsync_ms:.3f} ms")
    print(f"  {'case':<14}{'broker':<13}{'e2e msg/s':>11}{'MB/s':>8}{'CPU us/msg':>12}"
          f"{'of it kernel':>14}{'p99 ms @half':>14}{'dup':>9}{'lost':>7}")
    sizes = {_label(size, batching): size for size, batching in _cases()}

    def row(label: str, c: dict[str, Any]) -> str:
        return (f"{c['e2e_msg_per_s']:>11,.0f}{c['e2e_msg_per_s'] * sizes[label] / 1e6:>8.2f}"
                f"{c['cpu_us_per_msg']:>12.1f}{c['kernel_us_per_msg']:>14.1f}{c['half_p99_ms']:>14.3f}"
                f"{c['duplicates'] + c['half_duplicates']:>9}{c['lost'] + c['half_lost']:>7}")

    target_ms = TARGET_P99_FSYNCS * fsync_ms
    for label, m, p in side_by_side(results, ("magnetar", "pulsar-lite"), sizes, (14, 13), row):
        p99, peer_p99 = m["half_p99_ms"] / fsync_ms, p["half_p99_ms"] / fsync_ms
        clean = (m["duplicates"] + m["half_duplicates"] + m["lost"] + m["half_lost"]) == 0
        ratios, said = peer_ratios(m, p, clean, TARGET_THROUGHPUT_RATIO, TARGET_CPU_RATIO)
        m["ratios"] = {**ratios, "p99_fsyncs": p99, "peer_p99_fsyncs": peer_p99}
        print(f"  {'':<14}{'ratio':<13}{said}, p99 {p99:.1f}x fsync (target <= "
              f"{TARGET_P99_FSYNCS:.0f}: {verdict(p99 <= TARGET_P99_FSYNCS)}; pulsar-lite, "
              f"which never syncs, {peer_p99:.1f}x)")
        floor = results.get("floor", {}).get(label)
        if floor is not None and "error" not in floor:
            lowest = floor["floor_p99_ms"]
            m["ratios"]["p99_over_floor"] = m["half_p99_ms"] / lowest
            m["ratios"]["target_below_floor"] = target_ms < lowest
            where = ("the target is below this floor" if target_ms < lowest else
                     f"the target is above this floor; Magnetar's p99 is "
                     f"{m['half_p99_ms'] / lowest:.1f}x it")
            print(f"  {'':<14}{'floor':<13}p99 at Magnetar's half rate: client "
                  f"{floor['client_p99_ms']:.3f} ms (pulsar-receipts), disk "
                  f"{floor['disk_p99_ms']:.3f} ms (bare write+fdatasync); {where}")
    print("  ratios are Magnetar / pulsar-lite; Magnetar fdatasyncs its journal before each "
          "receipt, pulsar-lite never syncs to disk", flush=True)
    print(f"  p99 is the client's publish latency: with batching it includes the up to "
          f"{BATCH_DELAY_MS} ms ({BATCH_DELAY_MS / fsync_ms:.1f}x fsync) a message waits in "
          "the client's batch before it is sent", flush=True)
    print("  floor: the same producer against pulsar-receipts, which stores nothing and "
          "answers each SEND at once (no consumer), and the same bytes written and "
          "fdatasync'ed by a bare loop at the same rate; a broker that syncs before it "
          "answers pays both", flush=True)
    print("  CPU: the broker process's user + kernel time per message; of it kernel: the "
          "kernel's share (system calls, loopback TCP, the journal's writes and syncs)",
          flush=True)
    print(f"  dup: deliveries of a message already received; lost: acknowledged to the producer "
          f"but not received once no new message came for {QUIET_SECONDS:.0f} s", flush=True)


if __name__ == "__main__":
    run()
