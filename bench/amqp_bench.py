"""AMQP 0-9-1 end to end with pika and aio-pika: Magnetar standalone beside RabbitMQ (Debian's
``rabbitmq-server``, started here as its own node on loopback ports), measured in one run.

Every case sends persistent (delivery_mode 2) 1 KiB messages to a fresh durable queue
through the default exchange, from a publisher process (``python -m bench.amqp_bench
publish``) to a consumer process (``python -m bench.amqp_bench consume``: pika,
``basic_consume`` with prefetch :data:`PREFETCH`, manual acks with ``multiple`` every
:data:`ACK_EVERY`). The consumer counts messages UNIQUE by the sequence number in their
payload, so duplicates and losses are reported: a message is lost when it was sent
(without confirms) or confirmed and the consumer has not had it :data:`CATCH_UP_SECONDS`
after the publisher's end (or :data:`QUIET_SECONDS` after the last delivery); the
longest pause between two deliveries is reported beside it.
Each broker gets:

- one untimed warm-up round of :data:`WARMUP_SECONDS`, so that no broker's first measured
  round pays for its start;
- (a) ``pika``: a pika ``BlockingConnection`` publishing without confirms as fast as it
  can for :data:`ROUND_SECONDS`, in :data:`ROUNDS` rounds (the median of each figure is
  reported, counts are summed so that one duplicate in any round shows);
- (b) ``confirms``: aio-pika with publisher confirms pipelined, :data:`CONFIRM_WINDOW` in
  flight, as fast as it can, in :data:`ROUNDS` rounds;
- (c) ``latency``: aio-pika with confirms at a fixed :data:`LATENCY_RATE` msg/s for
  :data:`ROUND_SECONDS`: publish → confirm per message, p50 and p99;
- in every case the broker's own CPU per message delivered: utime + stime of the broker
  process (all threads; Magnetar's bookie included, RabbitMQ's ``beam.smp``) from
  ``/proc/<pid>/stat``, before and after.

End-to-end throughput is the unique messages over the time from the publisher's first
publish to the consumer's last delivery (``CLOCK_MONOTONIC`` is one clock for every
process of the machine). Both brokers confirm only what is on disk: Magnetar fdatasyncs
its journal (``journalSyncData=true``), RabbitMQ fsyncs its message store before a
confirm; without confirms neither waits for the disk before delivering.

Every loop is bounded in count and in time; the whole bench takes about three minutes.
If RabbitMQ is not installed or does not start, its side is skipped and the reason printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._proc import (
    Skipped,
    combine_rounds,
    cpu_seconds,
    free_port,
    last_json,
    peer_ratios,
    percentile,
    quiet_disk,
    ratio,
    run_brokers,
    side_by_side,
    verdict,
)

SIZE = 1024
ROUND_SECONDS = 8.0
ROUNDS = 2
WARMUP_SECONDS = 2.0
LATENCY_RATE = 2000.0
CONFIRM_WINDOW = 500
PREFETCH = 500
ACK_EVERY = 100
CATCH_UP_SECONDS = 20.0
QUIET_SECONDS = 6.0
CLIENT_READY_TIMEOUT = 20.0
PUBLISHER_SLACK = 30.0  # past its seconds, for the last confirms and the close
RABBITMQ_READY_TIMEOUT = 60.0
RABBITMQ_STOP_TIMEOUT = 30.0
READY_EPMD_TIMEOUT = 10.0
MAX_MESSAGES = 5_000_000

# Targets of the issue (AMQP 0-9-1, "Benchmark").
TARGET_THROUGHPUT_RATIO = 1.0
TARGET_CPU_RATIO = 0.5
# A figure this far on the wrong side of its target is called out in the output.
FAR_FACTOR = 2.0

CASES = ("pika", "confirms", "latency")
REPO = Path(__file__).resolve().parent.parent
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
_HEAD = struct.Struct(">qd")  # sequence number, send time (s since the epoch)


# -- brokers ---------------------------------------------------------------------------------



def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str,
               log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise Skipped(f"{what} did not start within {timeout:.0f} s"
                          + (f": {_boot_error(log)}" if log else ""))
        time.sleep(0.1)


def _boot_error(log: Path) -> str:
    """What RabbitMQ's output says went wrong: from its first error on, else its end."""
    text = log.read_text(errors="replace") if log.exists() else ""
    at = max(text.find("BOOT FAILED"), text.find("Error"), text.find("error"))
    return " ".join((text[at:at + 400] if at >= 0 else text[-400:]).split())


def _descendant(pid: int, comm: str) -> int | None:
    """The first process named ``comm`` among the descendants of ``pid``."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            names[int(entry)] = stat[stat.index("(") + 1:stat.rindex(")")]
            parents[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p:
                if names[child] == comm:
                    return child
                frontier.append(child)
    return None


@contextlib.contextmanager
def magnetar_broker(root: Path) -> Iterator[tuple[str, int]]:
    """A Magnetar standalone (1 bookie, journal fsync on): (AMQP URL, pid)."""
    sys.path.insert(0, str(REPO))
    from tests._standalone import Standalone

    data = root / "magnetar"
    data.mkdir()
    port = free_port()
    conf = {"journalSyncData": True, "messagingProtocols": "amqp",
            "amqpListeners": f"amqp://127.0.0.1:{port}"}
    with Standalone(data, conf=conf) as s:
        assert s.proc is not None
        yield f"amqp://guest:guest@127.0.0.1:{port}/%2F", s.proc.pid


@contextlib.contextmanager
def rabbitmq_broker(root: Path) -> Iterator[tuple[str, int]]:
    """RabbitMQ as a node of its own (not the system service): its own epmd on a free
    port, its data, logs, config and (no) plugins in ``root``: (AMQP URL, beam.smp pid)."""
    server, ctl = RABBITMQ_BIN / "rabbitmq-server", RABBITMQ_BIN / "rabbitmqctl"
    epmd_bin = shutil.which("epmd")
    if not server.exists() or epmd_bin is None:
        raise Skipped("rabbitmq-server is not installed (Debian package rabbitmq-server; "
                      "`make bench` installs it)")
    base = (root / "rabbitmq").resolve()  # the node runs in it: no relative paths
    base.mkdir()
    (base / "enabled_plugins").write_text("")  # no management plugin, no plugin at all
    (base / "rabbitmq.conf").write_text("")
    node = f"magnetar-bench-{os.getpid()}@localhost"
    port, dist, epmd_port = free_port(), free_port(), free_port()
    env = dict(os.environ, HOME=str(base), ERL_EPMD_PORT=str(epmd_port),
               RABBITMQ_NODENAME=node, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
               RABBITMQ_NODE_PORT=str(port), RABBITMQ_DIST_PORT=str(dist),
               RABBITMQ_MNESIA_BASE=str(base / "mnesia"), RABBITMQ_LOG_BASE=str(base / "log"),
               RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
               RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"))
    log = base / "server.log"
    epmd = subprocess.Popen([epmd_bin, "-port", str(epmd_port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc: subprocess.Popen[bytes] | None = None
    try:
        # Ready before the node starts, or erl would start an epmd of its own on the port.
        _wait_port(epmd_port, epmd, READY_EPMD_TIMEOUT, "epmd")
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(server)], env=env, cwd=base, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        _wait_port(port, proc, RABBITMQ_READY_TIMEOUT, "rabbitmq-server", log)
        beam = _descendant(proc.pid, "beam.smp")
        if beam is None:
            raise Skipped("rabbitmq-server is listening but its beam.smp process was not found")
        yield f"amqp://guest:guest@127.0.0.1:{port}/%2F", beam
    finally:
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run([str(ctl), "-n", node, "stop"], env=env, cwd=base,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=RABBITMQ_STOP_TIMEOUT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(RABBITMQ_STOP_TIMEOUT)
            # Whatever of the node is left, in the session it was started in.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        epmd.terminate()
        try:
            epmd.wait(10)
        except subprocess.TimeoutExpired:
            epmd.kill()
            epmd.wait()


# -- the publisher process ---------------------------------------------------------------------


def _publish_pika(args: argparse.Namespace) -> dict[str, Any]:
    """Without confirms, as fast as the client goes, for ``args.seconds``."""
    import pika

    params = pika.URLParameters(args.url)
    params.blocked_connection_timeout = PUBLISHER_SLACK
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2)
    pad = b"x" * max(0, args.size - _HEAD.size)
    seq = 0
    start = time.monotonic()
    end = start + args.seconds
    while seq < MAX_MESSAGES and time.monotonic() < end:
        ch.basic_publish("", args.queue, _HEAD.pack(seq, time.time()) + pad, props)
        seq += 1
        if seq % 1000 == 0:
            conn.process_data_events(0)  # heartbeats, connection.blocked
    conn.close()
    return {"sent": seq, "confirmed": 0, "nacked": 0, "errors": 0, "start": start,
            "seconds": time.monotonic() - start}


async def _publish_aio(args: argparse.Namespace) -> dict[str, Any]:
    """With confirms, ``args.window`` in flight, as fast as it goes or at ``args.rate``;
    each message's publish → confirm time."""
    import aio_pika
    from aiormq.exceptions import DeliveryError

    conn = await aio_pika.connect(args.url, timeout=CLIENT_READY_TIMEOUT)
    ch = await conn.channel(publisher_confirms=True)
    exchange = ch.default_exchange
    window = asyncio.Semaphore(args.window)
    pad = b"x" * max(0, args.size - _HEAD.size)
    latencies: list[float] = []
    stats = {"confirmed": 0, "nacked": 0, "errors": 0}
    pending: set[asyncio.Task[None]] = set()

    async def one(seq: int) -> None:
        t = time.monotonic()
        try:
            await exchange.publish(
                aio_pika.Message(_HEAD.pack(seq, time.time()) + pad,
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=args.queue)
            latencies.append(time.monotonic() - t)
            stats["confirmed"] += 1
        except DeliveryError:
            stats["nacked"] += 1
        except Exception:
            stats["errors"] += 1
        finally:
            window.release()

    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    seq = 0
    start = time.monotonic()
    end = start + args.seconds
    while seq < MAX_MESSAGES:
        now = time.monotonic()
        if now >= end:
            break
        if interval and start + seq * interval > now:
            await asyncio.sleep(min(start + seq * interval - now, 0.01))
            continue
        try:
            await asyncio.wait_for(window.acquire(), end - now)
        except TimeoutError:
            break
        task = asyncio.create_task(one(seq))
        pending.add(task)
        task.add_done_callback(pending.discard)
        seq += 1
    if pending:
        await asyncio.wait(set(pending), timeout=PUBLISHER_SLACK)
    for task in set(pending):
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 10)
    return {"sent": seq, **stats, "start": start, "seconds": time.monotonic() - start,
            "p50_ms": percentile(latencies, 0.50) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000}


def _publish_main(args: argparse.Namespace) -> None:
    out = _publish_pika(args) if args.client == "pika" else asyncio.run(_publish_aio(args))
    print(json.dumps(out), flush=True)


# -- the consumer process ----------------------------------------------------------------------


def _consume_main(args: argparse.Namespace) -> None:
    """Declare the durable queue, consume it, print ``ready``; once a line with the count
    to expect arrives on stdin, stop at that many unique messages, or after
    :data:`QUIET_SECONDS` without one, or :data:`CATCH_UP_SECONDS` after that line, or at
    ``args.max_seconds``; then the counts."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(args.url))
    ch = conn.channel()
    ch.queue_declare(args.queue, durable=True)
    ch.basic_qos(prefetch_count=PREFETCH)
    seen: set[int] = set()
    st = {"deliveries": 0, "duplicates": 0, "redelivered": 0, "first": 0.0, "last": 0.0,
          "max_gap_s": 0.0, "tag": 0, "acked": 0}

    def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
        seq = _HEAD.unpack_from(body, 0)[0]
        st["deliveries"] += 1
        st["redelivered"] += bool(method.redelivered)
        if seq in seen:
            st["duplicates"] += 1
        else:
            seen.add(seq)
        now = time.monotonic()
        if st["last"]:
            st["max_gap_s"] = max(st["max_gap_s"], now - st["last"])
        st["last"] = now
        st["first"] = st["first"] or now
        st["tag"] = method.delivery_tag
        if st["deliveries"] % ACK_EVERY == 0:
            channel.basic_ack(method.delivery_tag, multiple=True)
            st["acked"] = method.delivery_tag

    tag = ch.basic_consume(args.queue, on_message, auto_ack=False)
    print("ready", flush=True)
    expected: int | None = None
    told = 0.0
    hard = time.monotonic() + args.max_seconds
    while time.monotonic() < hard:
        conn.process_data_events(time_limit=0.05)
        if expected is None and select.select([sys.stdin], [], [], 0)[0]:
            line = sys.stdin.readline()
            expected, told = int(line or 0), time.monotonic()
            hard = min(hard, told + CATCH_UP_SECONDS)
        if expected is not None and (len(seen) >= expected
                                     or time.monotonic() - max(st["last"], told) > QUIET_SECONDS):
            break
    if st["tag"] > st["acked"]:
        ch.basic_ack(st["tag"], multiple=True)
    # What the broker still holds but never delivered: "lost" is either this or gone.
    in_queue = -1
    with contextlib.suppress(Exception):
        ch.basic_cancel(tag)
        in_queue = ch.queue_declare(args.queue, durable=True, passive=True).method.message_count
    with contextlib.suppress(Exception):
        ch.queue_delete(args.queue)
    with contextlib.suppress(Exception):
        conn.close()
    print(json.dumps({"received": len(seen), "in_queue": in_queue, **st}), flush=True)


# -- one measurement ----------------------------------------------------------------------------


def _client(role: str, *argv: str, stdin: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bench.amqp_bench", role, *argv],
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, cwd=REPO)


def _end_to_end(url: str, pid: int, queue: str, client: str, seconds: float,
                rate: float = 0.0) -> dict[str, Any]:
    """One publisher process against one consumer process, started on a quiet disk."""
    quiet_disk()
    max_seconds = CLIENT_READY_TIMEOUT + seconds + PUBLISHER_SLACK + CATCH_UP_SECONDS
    cons = _client("consume", "--url", url, "--queue", queue, "--max-seconds", str(max_seconds),
                   stdin=True)
    assert cons.stdin is not None and cons.stdout is not None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(cons.stdout, selectors.EVENT_READ)
            if not sel.select(CLIENT_READY_TIMEOUT) or cons.stdout.readline().strip() != b"ready":
                raise RuntimeError("the consumer did not start")
        cpu0 = cpu_seconds(pid)
        pub = _client("publish", "--url", url, "--queue", queue, "--client", client,
                      "--size", str(SIZE), "--seconds", str(seconds), "--rate", str(rate),
                      "--window", str(CONFIRM_WINDOW))
        try:
            out, _ = pub.communicate(timeout=seconds + PUBLISHER_SLACK + CLIENT_READY_TIMEOUT)
        except subprocess.TimeoutExpired:
            pub.kill()
            out, _ = pub.communicate()
        sent = last_json(out)
        if sent is None:
            raise RuntimeError(f"the publisher failed (exit {pub.returncode})")
        expect = sent["confirmed"] if client != "pika" else sent["sent"]
        cons.stdin.write(f"{expect}\n".encode())
        cons.stdin.close()
        try:
            cons.wait(CATCH_UP_SECONDS + 10)
        except subprocess.TimeoutExpired:
            cons.kill()
            cons.wait()
        cpu = cpu_seconds(pid) - cpu0
        got = last_json(cons.stdout.read())
        if got is None:
            raise RuntimeError(f"the consumer failed (exit {cons.returncode})")
    finally:
        if cons.poll() is None:
            cons.kill()
            cons.wait()
        cons.stdout.close()
    unique = got["received"]
    elapsed = max(got["last"] - sent["start"], 1e-9)
    result = {
        "sent": sent["sent"], "confirmed": sent["confirmed"], "nacked": sent["nacked"],
        "publish_errors": sent["errors"], "received": unique, "duplicates": got["duplicates"],
        "redelivered": got["redelivered"], "lost": max(0, expect - unique),
        "max_gap_s": got["max_gap_s"], "left_in_queue": got["in_queue"],
        "publish_msg_per_s": sent["sent"] / max(sent["seconds"], 1e-9),
        "e2e_msg_per_s": unique / elapsed if unique else 0.0,
        "cpu_us_per_msg": cpu / max(unique, 1) * 1e6,
    }
    if client != "pika":
        result.update(p50_ms=sent["p50_ms"], p99_ms=sent["p99_ms"])
    return result


def _broker_cases(name: str, url: str, pid: int) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    counts = ("sent", "confirmed", "nacked", "publish_errors", "received", "duplicates",
              "redelivered", "lost", "left_in_queue")
    try:
        _end_to_end(url, pid, "bench-warmup", "aio", WARMUP_SECONDS)
    except Exception as exc:
        print(f"  {name} warm-up: {type(exc).__name__}: {exc}", flush=True)
    for case, client in (("pika", "pika"), ("confirms", "aio")):
        try:
            cases[case] = combine_rounds(
                [_end_to_end(url, pid, f"bench-{case}-{i}", client, ROUND_SECONDS)
                 for i in range(ROUNDS)],
                ("e2e_msg_per_s", "cpu_us_per_msg", "publish_msg_per_s", "max_gap_s")
                + (("p50_ms", "p99_ms") if client == "aio" else ()), counts)
        except Exception as exc:
            cases[case] = {"error": f"{type(exc).__name__}: {exc}"}
        _say(name, case, cases[case])
    try:
        cases["latency"] = _end_to_end(url, pid, "bench-latency", "aio", ROUND_SECONDS, LATENCY_RATE)
    except Exception as exc:
        cases["latency"] = {"error": f"{type(exc).__name__}: {exc}"}
    _say(name, "latency", cases["latency"])
    return cases


def _say(name: str, case: str, c: dict[str, Any]) -> None:
    if "error" in c:
        print(f"  {name} {case}: {c['error'][:200]}", flush=True)
        return
    each = ", ".join(f"{r['e2e_msg_per_s']:,.0f}/{r['cpu_us_per_msg']:.1f}"
                     for r in c.get("rounds", [c]) if "error" not in r)
    conf = f", confirm p50 {c['p50_ms']:.1f} ms p99 {c['p99_ms']:.1f} ms" if "p99_ms" in c else ""
    print(f"  {name} {case}: {c['e2e_msg_per_s']:,.0f} msg/s end to end, "
          f"{c['cpu_us_per_msg']:.1f} us/msg (msg/s / us per round: {each}){conf}, "
          f"dup {c['duplicates']} lost {c['lost']} (left in the queue {c['left_in_queue']}), longest pause in deliveries "
          f"{c['max_gap_s']:.1f} s", flush=True)


def run() -> dict[str, Any]:
    print(f"\nAMQP 0-9-1: pika / aio-pika, persistent {SIZE} B messages to a durable queue, "
          "Magnetar standalone (journal fsync on) vs RabbitMQ (own node)", flush=True)
    results = run_brokers("bench-amqp-", (("magnetar", magnetar_broker), ("rabbitmq", rabbitmq_broker)),
                          _broker_cases)
    _print_table(results)
    return results


def _print_table(results: dict[str, Any]) -> None:
    print(f"  {'case':<10}{'broker':<10}{'e2e msg/s':>11}{'MB/s':>8}{'CPU us/msg':>12}"
          f"{'conf p50':>10}{'conf p99':>10}{'dup':>6}{'lost':>7}{'pause s':>9}")

    def row(_label: str, c: dict[str, Any]) -> str:
        p50 = f"{c['p50_ms']:>8.1f}ms" if "p50_ms" in c else f"{'-':>10}"
        p99 = f"{c['p99_ms']:>8.1f}ms" if "p99_ms" in c else f"{'-':>10}"
        return (f"{c['e2e_msg_per_s']:>11,.0f}{c['e2e_msg_per_s'] * SIZE / 1e6:>8.2f}"
                f"{c['cpu_us_per_msg']:>12.1f}{p50}{p99}{c['duplicates']:>6}{c['lost']:>7}"
                f"{c['max_gap_s']:>9.1f}")

    far: list[str] = []
    notes: list[str] = []
    for label, m, p in side_by_side(results, ("magnetar", "rabbitmq"), CASES, (10, 10), row):
        clean = m["duplicates"] + m["lost"] + m["nacked"] + m["publish_errors"] == 0
        if label == "latency":
            p99 = ratio(m, p, "p99_ms")
            m["ratios"] = {"p99": p99, "cpu": ratio(m, p, "cpu_us_per_msg"), "clean": clean}
            said = (f"confirm p99 {p99:.2f}x at {LATENCY_RATE:.0f}/s (target <= 1.0, no dup/loss: "
                    f"{verdict(p99 <= 1.0 and clean)})")
            if p99 > FAR_FACTOR:
                far.append(f"confirm p99 at {LATENCY_RATE:.0f}/s is {p99:.1f}x RabbitMQ's "
                           f"({m['p99_ms']:.1f} vs {p['p99_ms']:.1f} ms; target <= 1.0x)")
            for who, c in (("Magnetar", m), ("RabbitMQ", p)):
                if c["publish_msg_per_s"] < LATENCY_RATE * 0.95:
                    notes.append(f"the aio-pika publisher reached only "
                                 f"{c['publish_msg_per_s']:,.0f} msg/s of {LATENCY_RATE:.0f} "
                                 f"against {who}: its confirm latency is at that rate")
        else:
            m["ratios"], said = peer_ratios(m, p, clean, TARGET_THROUGHPUT_RATIO, TARGET_CPU_RATIO)
            thr, cpu = m["ratios"]["throughput"], m["ratios"]["cpu"]
            if thr < TARGET_THROUGHPUT_RATIO / FAR_FACTOR:
                far.append(f"{label}: throughput is {thr:.2f}x RabbitMQ's "
                           f"(target >= {TARGET_THROUGHPUT_RATIO:.1f}x)")
            if cpu > TARGET_CPU_RATIO * FAR_FACTOR:
                far.append(f"{label}: broker CPU per message is {cpu:.2f}x RabbitMQ's "
                           f"(target <= {TARGET_CPU_RATIO:.1f}x)")
        if not clean:
            far.append(f"{label}: Magnetar had {m['duplicates']} duplicates, {m['lost']} lost "
                       f"({m['left_in_queue']} of them left in the queue undelivered), "
                       f"{m['nacked']} nacked, {m['publish_errors']} publish errors")
        print(f"  {'':<10}{'ratio':<10}{said}")
    print("  ratios are Magnetar / RabbitMQ; pika = no confirms, confirms = aio-pika with "
          f"{CONFIRM_WINDOW} in flight, latency = aio-pika confirms at {LATENCY_RATE:.0f}/s; "
          "CPU is the broker process's utime + stime per message delivered; lost = sent "
          f"(pika) or confirmed (aio-pika) and not delivered within {CATCH_UP_SECONDS:.0f} s "
          "of the publisher's end; pause = longest gap between two deliveries", flush=True)
    for line in notes:
        print(f"  NOTE: {line}", flush=True)
    for line in far:
        print(f"  FAR FROM TARGET: {line}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.amqp_bench")
    sub = parser.add_subparsers(dest="command")
    pub = sub.add_parser("publish", help="the bench's publisher process")
    pub.add_argument("--url", required=True)
    pub.add_argument("--queue", required=True)
    pub.add_argument("--client", choices=("pika", "aio"), required=True)
    pub.add_argument("--size", type=int, default=SIZE)
    pub.add_argument("--seconds", type=float, required=True)
    pub.add_argument("--rate", type=float, default=0.0)
    pub.add_argument("--window", type=int, default=CONFIRM_WINDOW)
    cons = sub.add_parser("consume", help="the bench's consumer process")
    cons.add_argument("--url", required=True)
    cons.add_argument("--queue", required=True)
    cons.add_argument("--max-seconds", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "publish":
        _publish_main(args)
    elif args.command == "consume":
        _consume_main(args)
    else:
        run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
