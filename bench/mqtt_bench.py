"""MQTT 3.1.1 end to end with paho-mqtt: Magnetar standalone beside Mosquitto (Debian's
``mosquitto``, started here as its own process with its own config on a loopback port, not
the system service), the same clients against both, measured in one run.

Publishers (``python -m bench.mqtt_bench publish``) and subscribers (``python -m
bench.mqtt_bench subscribe``: one process holding every subscriber of a case, each a paho
client driven by one selector loop) are processes of their own. A payload starts with a
sequence number and its send time (``CLOCK_MONOTONIC``, one clock for every process of
the machine); each subscriber counts messages UNIQUE by sequence number, so duplicates and
losses are reported: a message is lost when it was PUBACKed (QoS 1) or sent (QoS 0) and a
subscriber has not had it :data:`CATCH_UP_SECONDS` after the publisher's end (or
:data:`QUIET_SECONDS` after the last delivery). Each broker gets:

- one untimed warm-up round of :data:`WARMUP_SECONDS`;
- ``idle``: :data:`IDLE_CLIENTS` clients connected from :data:`IDLE_PROCESSES` processes
  (``python -m bench.mqtt_bench idle``) with raw sockets: a minimal 3.1.1 CONNECT (clean
  session, keep-alive :data:`IDLE_KEEPALIVE`), its CONNACK, one SUBSCRIBE of a topic of
  its own and its SUBACK, then nothing. The broker's RSS growth per client is ``VmRSS``
  from ``/proc/<pid>/status`` before and :data:`IDLE_SETTLE_SECONDS` after the last one,
  over the clients that made it; each connect has :data:`IDLE_CONNECT_TIMEOUT`, the whole
  of it :data:`IDLE_DEADLINE` (then how many made it is reported). The file-descriptor
  limit is raised to its hard limit in the bench (which the brokers inherit) and in the
  client processes; Mosquitto runs with ``max_connections -1``;
- ``qos1-100B`` and ``qos1-1KiB``: QoS 1 publish → deliver, one publisher with
  :data:`WINDOW` PUBLISHes awaiting their PUBACK, as fast as it goes for
  :data:`ROUND_SECONDS`, to one QoS 1 subscriber;
- ``qos0-fanout``: :data:`FANOUT_MESSAGES` QoS 0 1 KiB messages as fast as the publisher
  goes to :data:`FANOUT` QoS 0 subscribers of the topic (figures are deliveries: a
  message to ten subscribers is ten);
- ``latency``: QoS 1 1 KiB at a fixed :data:`LATENCY_RATE` msg/s for
  :data:`LATENCY_SECONDS`: publish → deliver per message, p50 and p99 (and publish →
  PUBACK at the publisher);
- in every case the broker's own CPU per message delivered: utime + stime of the broker
  process (all threads; Magnetar's bookie included) from ``/proc/<pid>/stat``.

End-to-end throughput is the unique deliveries over the time from the publisher's first
publish to the last delivery. Magnetar writes every message to its journal and fdatasyncs
it (``journalSyncData=true``) before the PUBACK; Mosquitto (``persistence true``) keeps
messages in memory and writes its store only every ``autosave_interval`` and at exit.
Mosquitto runs with ``max_inflight_messages`` :data:`SERVER_INFLIGHT` (Magnetar's window
towards a 3.1.1 client) and no queue limit (Magnetar drops nothing for a connected
client), so neither drops for being the faster side.

Every loop is bounded in count and in time; the whole bench takes about three minutes.
If Mosquitto is not installed or does not start, its side is skipped and the reason printed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import math
import os
import resource
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

SIZES = {"qos1-100B": 100, "qos1-1KiB": 1024}
SIZE = 1024  # fan-out, latency and warm-up
ROUND_SECONDS = 8.0
WARMUP_SECONDS = 2.0
LATENCY_RATE = 2000.0
LATENCY_SECONDS = 6.0
FANOUT = 10
FANOUT_MESSAGES = 10_000
WINDOW = 500  # QoS 1 PUBLISHes a publisher has awaiting their PUBACK
SERVER_INFLIGHT = 1000
KEEPALIVE = 60
CATCH_UP_SECONDS = 20.0
QUIET_SECONDS = 5.0
CLIENT_READY_TIMEOUT = 20.0
PUBLISHER_SLACK = 20.0  # past its seconds, for the last PUBACKs and the close
MOSQUITTO_READY_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0
MAX_MESSAGES = 5_000_000

IDLE_CLIENTS = 10_000
IDLE_PROCESSES = 4
IDLE_WINDOW = 64  # connects in progress per client process
IDLE_KEEPALIVE = 600
IDLE_CONNECT_TIMEOUT = 10.0
IDLE_DEADLINE = 60.0
IDLE_SETTLE_SECONDS = 2.0
IDLE_DRAIN_TIMEOUT = 20.0  # for the broker to close the idle connections before the next case
FD_MARGIN = 256  # descriptors a broker needs beside its clients'

# Targets of the issue (MQTT 3.1.1 and 5, "Benchmark" and "Scale and memory").
TARGET_THROUGHPUT_RATIO = 1.0
TARGET_CPU_RATIO = 2.0
TARGET_P99_RATIO = 1.0
TARGET_IDLE_KIB = 10.0
FAR_FACTOR = 2.0

CASES = ("qos1-100B", "qos1-1KiB", "qos0-fanout", "latency")
BROKERS = ("magnetar", "mosquitto")
REPO = Path(__file__).resolve().parent.parent
_HEAD = struct.Struct(">qd")  # sequence number, send time (CLOCK_MONOTONIC)


# -- brokers ---------------------------------------------------------------------------------


def _raise_fd_limit() -> int:
    """The soft limit of open files raised to the hard one: the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _fd_limit(pid: int) -> int:
    """The soft limit of open files of a process, from ``/proc/<pid>/limits``."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return 1 << 62 if soft == "unlimited" else int(soft)
    return 0


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def magnetar_broker(root: Path) -> Iterator[tuple[tuple[str, int], int]]:
    """A Magnetar standalone (1 bookie, journal fsync on, MQTT only): ((host, port), pid)."""
    sys.path.insert(0, str(REPO))
    from tests._standalone import Standalone

    data = root / "magnetar"
    data.mkdir()
    port = free_port()
    conf = {"journalSyncData": True, "messagingProtocols": "mqtt",
            "mqttListeners": f"mqtt://127.0.0.1:{port}"}
    with Standalone(data, conf=conf) as s:
        assert s.proc is not None
        yield ("127.0.0.1", port), s.proc.pid


@contextlib.contextmanager
def mosquitto_broker(root: Path) -> Iterator[tuple[tuple[str, int], int]]:
    """Mosquitto as a process of its own, its config, store and log in ``root``:
    ((host, port), pid)."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto"
                                           if os.path.exists("/usr/sbin/mosquitto") else None)
    if binary is None:
        raise Skipped("mosquitto is not installed (Debian package mosquitto; "
                      "`make bench` installs it)")
    base = (root / "mosquitto").resolve()
    base.mkdir()
    port = free_port()
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "max_connections -1",
             "persistence true", f"persistence_location {base}/",
             f"max_inflight_messages {SERVER_INFLIGHT}", "max_queued_messages 0",
             f"log_dest file {base}/mosquitto.log", "log_type error", "log_type warning"]
    if os.geteuid() == 0:
        lines.append("user root")  # else it drops to the user mosquitto, who cannot write here
    conf = base / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n")
    log = base / "stdout.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "-c", str(conf)], cwd=base, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + MOSQUITTO_READY_TIMEOUT
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                said = " ".join(log.read_text(errors="replace").split())[-300:]
                raise Skipped(f"mosquitto did not start within {MOSQUITTO_READY_TIMEOUT:.0f} s: "
                              f"{said}")
            time.sleep(0.1)
        yield ("127.0.0.1", port), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# -- the publisher process ---------------------------------------------------------------------


def _paho(client_id: str) -> Any:
    import paho.mqtt.client as mqtt

    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                       clean_session=True, protocol=mqtt.MQTTv311)


def _connected(clients: list[Any], flags: list[bool], timeout: float) -> None:
    """Drive ``clients`` until every one had its CONNACK (and SUBACK, as ``flags`` says)."""
    deadline = time.monotonic() + timeout
    while not all(flags):
        if time.monotonic() > deadline:
            raise SystemExit(f"{flags.count(False)} clients not ready in {timeout:.0f} s")
        for c in clients:
            c.loop(0.01)


def _publish_main(args: argparse.Namespace) -> None:
    """QoS ``args.qos`` for ``args.seconds`` or ``args.count`` messages, as fast as it goes
    (QoS 1: ``args.window`` awaiting PUBACK) or at ``args.rate``; each PUBACK's time."""
    c = _paho(f"bench-pub-{os.getpid()}")
    c.max_inflight_messages_set(max(args.window, 1))
    ready = [False]
    st = {"acked": 0, "errors": 0}
    sent_at: dict[int, float] = {}
    latencies: list[float] = []

    def on_connect(_c: Any, _u: Any, _flags: Any, rc: Any, _p: Any) -> None:
        ready[0] = not rc.is_failure

    def on_publish(_c: Any, _u: Any, mid: int, _rc: Any, _p: Any) -> None:
        t = sent_at.pop(mid, None)
        if t is not None:
            latencies.append(time.monotonic() - t)
            st["acked"] += 1

    c.on_connect, c.on_publish = on_connect, on_publish
    c.connect(args.host, args.port, KEEPALIVE)
    _connected([c], ready, CLIENT_READY_TIMEOUT)
    pad = b"x" * max(0, args.size - _HEAD.size)
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    limit = min(args.count or MAX_MESSAGES, MAX_MESSAGES)
    seq = 0
    start = time.monotonic()
    end = start + args.seconds
    while seq < limit:
        now = time.monotonic()
        if now >= end:
            break
        if interval and start + seq * interval > now:
            c.loop(min(start + seq * interval - now, 0.005))
            continue
        if (args.qos and len(sent_at) >= args.window) or c.want_write():
            c.loop(0.01)  # PUBACKs in, what the socket did not take out
            continue
        info = c.publish(args.topic, _HEAD.pack(seq, time.monotonic()) + pad, qos=args.qos)
        if info.rc:
            st["errors"] += 1
            c.loop(0.01)
            continue
        if args.qos:
            sent_at[info.mid] = now
        seq += 1
        if seq % 64 == 0:
            c.loop(0)
    stop = time.monotonic() + PUBLISHER_SLACK
    while (sent_at or c.want_write()) and time.monotonic() < stop:
        c.loop(0.05)
    c.disconnect()
    with contextlib.suppress(Exception):
        c.loop(0.1)
    print(json.dumps({"sent": seq, "acked": st["acked"] if args.qos else seq,
                      "unacked": len(sent_at), "errors": st["errors"], "start": start,
                      "seconds": time.monotonic() - start,
                      "puback_p50_ms": percentile(latencies, 0.50) * 1000,
                      "puback_p99_ms": percentile(latencies, 0.99) * 1000}), flush=True)


# -- the subscriber process --------------------------------------------------------------------


def _subscribe_main(args: argparse.Namespace) -> None:
    """``args.subscribers`` paho clients subscribed to ``args.topic``, driven by one selector;
    print ``ready``; once a line with the count to expect arrives on stdin, stop when
    every subscriber has that many unique messages, or :data:`QUIET_SECONDS` without one,
    or :data:`CATCH_UP_SECONDS` after that line, or at ``args.max_seconds``; then the
    counts."""
    from paho.mqtt.client import MQTT_ERR_SUCCESS

    n = args.subscribers
    clients = [_paho(f"bench-sub-{os.getpid()}-{i}") for i in range(n)]
    ready = [False] * n
    seen: list[set[int]] = [set() for _ in range(n)]
    st = {"deliveries": 0, "duplicates": 0, "dup_flag": 0, "first": 0.0, "last": 0.0,
          "max_gap_s": 0.0, "disconnected": 0}
    latencies: list[float] = []

    def on_connect(client: Any, i: int, _flags: Any, rc: Any, _p: Any) -> None:
        if not rc.is_failure:
            client.subscribe(args.topic, qos=args.qos)

    def on_subscribe(_c: Any, i: int, _mid: int, codes: Any, _p: Any) -> None:
        ready[i] = all(not rc.is_failure for rc in codes)

    def on_message(_c: Any, i: int, msg: Any) -> None:
        now = time.monotonic()
        seq, t = _HEAD.unpack_from(msg.payload, 0)
        st["deliveries"] += 1
        st["dup_flag"] += bool(msg.dup)
        if seq in seen[i]:
            st["duplicates"] += 1
        else:
            seen[i].add(seq)
        if args.latency:
            latencies.append(now - t)
        if st["last"]:
            st["max_gap_s"] = max(st["max_gap_s"], now - st["last"])
        st["last"] = now
        st["first"] = st["first"] or now

    for i, c in enumerate(clients):
        c.user_data_set(i)
        c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
        c.connect(args.host, args.port, KEEPALIVE)
    _connected(clients, ready, CLIENT_READY_TIMEOUT)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    for c in clients:
        sel.register(c.socket(), selectors.EVENT_READ, c)
    expected: int | None = None
    told = misc = 0.0
    hard = time.monotonic() + args.max_seconds
    while time.monotonic() < hard and sel.get_map():
        for key, _ in sel.select(0.05):
            if key.data.loop_read() != MQTT_ERR_SUCCESS:
                sel.unregister(key.fileobj)
                st["disconnected"] += 1
        now = time.monotonic()
        if now - misc > 1.0:
            misc = now
            for c in clients:
                c.loop_misc()
                if c.want_write():
                    c.loop_write()
        if expected is None and select.select([sys.stdin], [], [], 0)[0]:
            expected, told = int(sys.stdin.readline() or 0), now
            hard = min(hard, told + CATCH_UP_SECONDS)
        if expected is not None and (min(len(s) for s in seen) >= expected
                                     or now - max(st["last"], told) > QUIET_SECONDS):
            break
    for c in clients:
        with contextlib.suppress(Exception):
            c.disconnect()
    print(json.dumps({"received": [len(s) for s in seen], **st,
                      "p50_ms": percentile(latencies, 0.50) * 1000,
                      "p99_ms": percentile(latencies, 0.99) * 1000}), flush=True)


# -- the idle-client process -------------------------------------------------------------------


def _utf8(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _packet(head: int, body: bytes) -> bytes:
    """An MQTT control packet: fixed header, remaining length (3.1.1 section 2.2.3), body."""
    out, n = bytearray([head]), len(body)
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out) + body


def _connect_packet(client_id: str) -> bytes:
    """CONNECT, 3.1.1 section 3.1: protocol level 4, clean session, keep-alive."""
    return _packet(0x10, _utf8("MQTT") + bytes([4, 0x02]) + struct.pack(">H", IDLE_KEEPALIVE)
                   + _utf8(client_id))


def _subscribe_packet(topic: str) -> bytes:
    """SUBSCRIBE, 3.1.1 section 3.8: packet id 1, one filter at QoS 1."""
    return _packet(0x82, struct.pack(">H", 1) + _utf8(topic) + b"\x01")


def _idle_main(args: argparse.Namespace) -> None:
    """Connect ``args.count`` clients (CONNECT → CONNACK → SUBSCRIBE → SUBACK), at most
    :data:`IDLE_WINDOW` in progress; print the counts; on a line from stdin, how many of
    the connections the broker has closed since; on the end of stdin, close them."""
    _raise_fd_limit()
    addr = (args.host, args.port)
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, list[Any]] = {}  # sock -> [state, buffer, deadline, index]
    done: list[socket.socket] = []
    errors: dict[str, int] = {}
    started = connacked = 0
    give_up = time.monotonic() + args.deadline
    t0 = time.monotonic()

    def fail(s: socket.socket, why: str) -> None:
        errors[why] = errors.get(why, 0) + 1
        pending.pop(s, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(s)
        s.close()

    exhausted = False  # no more sockets to be had here (descriptors, ports)
    while (started < args.count and not exhausted or pending) and time.monotonic() < give_up:
        while started < args.count and len(pending) < IDLE_WINDOW and not exhausted:
            try:
                s = socket.socket()
            except OSError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                exhausted = True
                break
            s.setblocking(False)
            rc = s.connect_ex(addr)
            if rc not in (0, errno.EINPROGRESS):
                why = errno.errorcode.get(rc, str(rc))
                errors[why] = errors.get(why, 0) + 1
                exhausted = True
                s.close()
                break
            pending[s] = ["connecting", b"", time.monotonic() + IDLE_CONNECT_TIMEOUT,
                          args.first + started]
            sel.register(s, selectors.EVENT_WRITE)
            started += 1
        for key, _ in sel.select(0.05):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            entry = pending[s]
            try:
                if entry[0] == "connecting":
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        fail(s, errno.errorcode.get(err, str(err)))
                        continue
                    s.sendall(_connect_packet(f"{args.prefix}-{entry[3]}"))
                    entry[0] = "connack"
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                data = s.recv(64)
            except OSError as exc:
                fail(s, type(exc).__name__)
                continue
            if not data:
                fail(s, "closed by the broker")
                continue
            entry[1] += data
            if entry[0] == "connack" and len(entry[1]) >= 4:
                if entry[1][0] != 0x20 or entry[1][3] != 0:
                    fail(s, f"CONNACK {entry[1][:4].hex()}")
                    continue
                connacked += 1
                entry[0], entry[1] = "suback", entry[1][4:]
                s.sendall(_subscribe_packet(f"bench/idle/{args.prefix}/{entry[3]}"))
            if entry[0] == "suback" and len(entry[1]) >= 5:
                if entry[1][0] != 0x90 or entry[1][4] & 0x80:
                    fail(s, f"SUBACK {entry[1][:5].hex()}")
                    continue
                sel.unregister(s)
                del pending[s]
                done.append(s)
        now = time.monotonic()
        for s in [s for s, e in pending.items() if e[2] < now]:
            fail(s, "timeout")
    for s in list(pending):
        fail(s, "gave up")
    print(json.dumps({"connected": connacked, "subscribed": len(done), "errors": errors,
                      "seconds": time.monotonic() - t0}), flush=True)
    if sys.stdin.readline():
        dropped = 0
        poller = select.poll()
        by_fd = {s.fileno(): s for s in done}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            with contextlib.suppress(OSError):
                dropped += by_fd[fd].recv(1) == b""
        print(json.dumps({"dropped": dropped}), flush=True)
        sys.stdin.read()
    for s in done:
        s.close()


# -- one measurement ----------------------------------------------------------------------------


def _client(role: str, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bench.mqtt_bench", role, *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)


def _readline(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        return proc.stdout.readline() if sel.select(timeout) else b""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _end_to_end(address: tuple[str, int], pid: int, topic: str, *, qos: int, size: int,
                seconds: float, count: int = 0, rate: float = 0.0, subscribers: int = 1,
                latency: bool = False) -> dict[str, Any]:
    """One publisher process against one subscriber process, started on a quiet disk."""
    quiet_disk()
    host, port = address[0], str(address[1])
    max_seconds = CLIENT_READY_TIMEOUT + seconds + PUBLISHER_SLACK + CATCH_UP_SECONDS
    sub = _client("subscribe", "--host", host, "--port", port, "--topic", topic, "--qos", str(qos),
                  "--subscribers", str(subscribers), "--max-seconds", str(max_seconds),
                  *(("--latency",) if latency else ()))
    assert sub.stdin is not None and sub.stdout is not None
    try:
        if _readline(sub, CLIENT_READY_TIMEOUT).strip() != b"ready":
            raise RuntimeError("the subscriber did not start")
        cpu0 = cpu_seconds(pid)
        pub = _client("publish", "--host", host, "--port", port, "--topic", topic,
                      "--qos", str(qos), "--size", str(size), "--seconds", str(seconds),
                      "--count", str(count), "--rate", str(rate), "--window", str(WINDOW))
        try:
            out, _ = pub.communicate(timeout=seconds + PUBLISHER_SLACK + CLIENT_READY_TIMEOUT)
        except subprocess.TimeoutExpired:
            pub.kill()
            out, _ = pub.communicate()
        sent = last_json(out)
        if sent is None:
            raise RuntimeError(f"the publisher failed (exit {pub.returncode})")
        expect = sent["acked"]
        sub.stdin.write(f"{expect}\n".encode())
        sub.stdin.close()
        try:
            sub.wait(CATCH_UP_SECONDS + 10)
        except subprocess.TimeoutExpired:
            sub.kill()
            sub.wait()
        cpu = cpu_seconds(pid) - cpu0
        got = last_json(sub.stdout.read())
        if got is None:
            raise RuntimeError(f"the subscriber failed (exit {sub.returncode})")
    finally:
        _stop(sub)
    unique = sum(got["received"])
    elapsed = max(got["last"] - sent["start"], 1e-9)
    return {
        "sent": sent["sent"], "acked": expect, "unacked": sent["unacked"],
        "publish_errors": sent["errors"], "received": unique, "duplicates": got["duplicates"],
        "dup_flag": got["dup_flag"], "lost": sum(max(0, expect - r) for r in got["received"]),
        "disconnected": got["disconnected"], "max_gap_s": got["max_gap_s"],
        "publish_msg_per_s": sent["sent"] / max(sent["seconds"], 1e-9),
        "e2e_msg_per_s": unique / elapsed if unique else 0.0,
        "cpu_us_per_msg": cpu / max(unique, 1) * 1e6,
        "p50_ms": got["p50_ms"], "p99_ms": got["p99_ms"],
        "puback_p50_ms": sent["puback_p50_ms"], "puback_p99_ms": sent["puback_p99_ms"],
    }


def _idle(name: str, address: tuple[str, int], pid: int) -> dict[str, Any]:
    """:data:`IDLE_CLIENTS` idle clients: the broker's RSS and descriptors before and after."""
    wanted = IDLE_CLIENTS
    room = _fd_limit(pid) - FD_MARGIN
    note = ""
    if room < wanted:
        note = f"the broker may open only {room + FD_MARGIN} files: {room} clients tried"
        wanted = max(room, 0)
    fds0, rss0, cpu0 = _fds(pid), _rss_kib(pid), cpu_seconds(pid)
    per = -(-wanted // IDLE_PROCESSES)
    procs = [_client("idle", "--host", address[0], "--port", str(address[1]),
                     "--count", str(min(per, wanted - i * per)), "--first", str(i * per),
                     "--prefix", f"{name}{os.getpid()}p{i}", "--deadline", str(IDLE_DEADLINE))
             for i in range(IDLE_PROCESSES) if wanted > i * per]
    try:
        reports = [last_json(_readline(p, IDLE_DEADLINE + CLIENT_READY_TIMEOUT)) for p in procs]
        cpu = cpu_seconds(pid) - cpu0
        time.sleep(IDLE_SETTLE_SECONDS)
        rss1, fds1 = _rss_kib(pid), _fds(pid)
        for p in procs:
            assert p.stdin is not None
            with contextlib.suppress(OSError):
                p.stdin.write(b"check\n")
                p.stdin.flush()
        checks = [last_json(_readline(p, CLIENT_READY_TIMEOUT)) for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            _stop(p)
    # Before the next case: the broker has let go of the connections.
    deadline = time.monotonic() + IDLE_DRAIN_TIMEOUT
    while _fds(pid) > fds0 + 50 and time.monotonic() < deadline:
        time.sleep(0.2)
    good = [r for r in reports if r is not None]
    subscribed = sum(r["subscribed"] for r in good)
    errors: dict[str, int] = {}
    for r in good:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "tried": wanted, "connected": sum(r["connected"] for r in good), "subscribed": subscribed,
        "failed_processes": len(reports) - len(good), "errors": errors,
        "dropped": sum(c["dropped"] for c in checks if c is not None),
        "connect_seconds": max((r["seconds"] for r in good), default=0.0),
        "rss_before_mib": rss0 / 1024, "rss_after_mib": rss1 / 1024,
        "kib_per_client": (rss1 - rss0) / subscribed if subscribed else math.inf,
        "fds_before": fds0, "fds_after": fds1,
        "cpu_us_per_client": cpu / max(subscribed, 1) * 1e6, "note": note,
    }


def _broker_cases(name: str, address: tuple[str, int], pid: int) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    tag = f"{os.getpid()}"
    counts = ("sent", "acked", "unacked", "publish_errors", "received", "duplicates", "dup_flag",
              "lost", "disconnected")
    medians = ("e2e_msg_per_s", "cpu_us_per_msg", "publish_msg_per_s", "max_gap_s", "p50_ms",
               "p99_ms", "puback_p50_ms", "puback_p99_ms")
    try:
        _end_to_end(address, pid, f"bench/warmup/{tag}", qos=1, size=SIZE, seconds=WARMUP_SECONDS)
    except Exception as exc:
        print(f"  {name} warm-up: {type(exc).__name__}: {exc}", flush=True)
    try:
        cases["idle"] = _idle(name, address, pid)
    except Exception as exc:
        cases["idle"] = {"error": f"{type(exc).__name__}: {exc}"}
    _say_idle(name, cases["idle"])
    plans: dict[str, dict[str, Any]] = {
        **{case: {"qos": 1, "size": size, "seconds": ROUND_SECONDS} for case, size in SIZES.items()},
        "qos0-fanout": {"qos": 0, "size": SIZE, "seconds": ROUND_SECONDS,
                        "count": FANOUT_MESSAGES, "subscribers": FANOUT},
        "latency": {"qos": 1, "size": SIZE, "seconds": LATENCY_SECONDS, "rate": LATENCY_RATE,
                    "latency": True},
    }
    for case, plan in plans.items():
        try:
            cases[case] = combine_rounds(
                [_end_to_end(address, pid, f"bench/{case}/{tag}", **plan)], medians, counts)
        except Exception as exc:
            cases[case] = {"error": f"{type(exc).__name__}: {exc}"}
        _say(name, case, cases[case])
    return cases


def _say(name: str, case: str, c: dict[str, Any]) -> None:
    if "error" in c:
        print(f"  {name} {case}: {c['error'][:200]}", flush=True)
        return
    lat = (f", publish→deliver p50 {c['p50_ms']:.1f} ms p99 {c['p99_ms']:.1f} ms, PUBACK p99 "
           f"{c['puback_p99_ms']:.1f} ms" if case == "latency" else "")
    print(f"  {name} {case}: {c['e2e_msg_per_s']:,.0f} deliveries/s end to end (publisher "
          f"{c['publish_msg_per_s']:,.0f} msg/s), {c['cpu_us_per_msg']:.1f} us/msg{lat}, "
          f"dup {c['duplicates']} lost {c['lost']} unacked {c['unacked']}, longest pause "
          f"{c['max_gap_s']:.1f} s", flush=True)


def _say_idle(name: str, c: dict[str, Any]) -> None:
    if "error" in c:
        print(f"  {name} idle: {c['error'][:200]}", flush=True)
        return
    print(f"  {name} idle: {c['subscribed']:,} of {c['tried']:,} clients connected and "
          f"subscribed in {c['connect_seconds']:.1f} s, RSS {c['rss_before_mib']:.1f} → "
          f"{c['rss_after_mib']:.1f} MiB = {c['kib_per_client']:.2f} KiB/client, fds "
          f"{c['fds_before']} → {c['fds_after']}, dropped {c['dropped']}"
          + (f", errors {c['errors']}" if c["errors"] else "")
          + (f"; NOTE {c['note']}" if c["note"] else ""), flush=True)


def run() -> dict[str, Any]:
    limit = _raise_fd_limit()  # before the brokers start: they inherit it
    print(f"\nMQTT 3.1.1: paho-mqtt, Magnetar standalone (journal fsync on) vs Mosquitto "
          f"(own process); open-file limit {limit}", flush=True)
    results = run_brokers("bench-mqtt-", (("magnetar", magnetar_broker),
                                          ("mosquitto", mosquitto_broker)), _broker_cases)
    results["trio_floor"] = _trio_floor()
    _print_table(results)
    return results


def _trio_floor() -> dict[str, Any]:
    """The idle case against the least a trio server can hold a connection with: one task
    per connection reading with a keep-alive timeout, answering CONNECT and SUBSCRIBE and
    keeping nothing else (``python -m bench.mqtt_bench floor``): what every session of a
    broker built on trio costs before it keeps anything of its own."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.mqtt_bench", "floor", "--port", str(port)],
                            stdout=subprocess.PIPE, cwd=REPO)
    try:
        if _readline(proc, CLIENT_READY_TIMEOUT).strip() != b"ready":
            return {"error": "the floor server did not start"}
        return _idle("floor", ("127.0.0.1", port), proc.pid)
    except Exception as exc:  # reported beside the table, the rest of the bench stands
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        _stop(proc)


def _floor_packet(buf: bytes) -> tuple[int, bytes, int] | None:
    """The first whole packet in ``buf``: (type, body, where it ends); None until it is in."""
    length, shift = 0, 0
    for i in range(1, min(len(buf), 5)):
        length |= (buf[i] & 0x7F) << shift
        if not buf[i] & 0x80:
            end = i + 1 + length
            return (buf[0] >> 4, buf[i + 1:end], end) if len(buf) >= end else None
        shift += 7
    return None


def _floor_main(args: argparse.Namespace) -> None:
    import trio

    async def session(stream: trio.SocketStream) -> None:
        try:
            await serve_one(stream)
        except (trio.BrokenResourceError, OSError):
            pass  # the client went: this connection alone ends

    async def serve_one(stream: trio.SocketStream) -> None:
        buf = b""
        while True:
            data = b""
            with trio.move_on_after(IDLE_KEEPALIVE * 1.5):
                data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
            while (got := _floor_packet(buf)) is not None:
                kind, body, end = got
                buf = buf[end:]
                if kind == 1:  # CONNECT -> CONNACK accepted
                    await stream.send_all(b"\x20\x02\x00\x00")
                elif kind == 8:  # SUBSCRIBE -> SUBACK granting QoS 0
                    await stream.send_all(b"\x90\x03" + body[:2] + b"\x00")
                elif kind == 12:  # PINGREQ
                    await stream.send_all(b"\xd0\x00")

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(trio.serve_tcp, session, args.port, host="127.0.0.1"))
            print("ready", flush=True)

    trio.run(serve)


def _print_table(results: dict[str, Any]) -> None:
    print(f"  {'case':<13}{'broker':<11}{'deliv/s':>10}{'MB/s':>8}{'CPU us/msg':>12}"
          f"{'p50 ms':>8}{'p99 ms':>8}{'dup':>6}{'lost':>7}{'pause s':>9}")

    def row(label: str, c: dict[str, Any]) -> str:
        size = SIZES.get(label, SIZE)
        lat = (f"{c['p50_ms']:>8.1f}{c['p99_ms']:>8.1f}" if label == "latency"
               else f"{'-':>8}{'-':>8}")
        return (f"{c['e2e_msg_per_s']:>10,.0f}{c['e2e_msg_per_s'] * size / 1e6:>8.2f}"
                f"{c['cpu_us_per_msg']:>12.1f}{lat}{c['duplicates']:>6}{c['lost']:>7}"
                f"{c['max_gap_s']:>9.1f}")

    far: list[str] = []
    notes: list[str] = []
    for label, m, p in side_by_side(results, BROKERS, CASES, (13, 11), row):
        clean = m["duplicates"] + m["lost"] + m["unacked"] + m["publish_errors"] == 0
        if label == "latency":
            p99 = ratio(m, p, "p99_ms")
            m["ratios"] = {"p99": p99, "cpu": ratio(m, p, "cpu_us_per_msg"), "clean": clean}
            said = (f"publish→deliver p99 {p99:.2f}x at {LATENCY_RATE:.0f}/s (target <= "
                    f"{TARGET_P99_RATIO:.1f}, no dup/loss: "
                    f"{verdict(p99 <= TARGET_P99_RATIO and clean)}), CPU/msg "
                    f"{m['ratios']['cpu']:.2f}x")
            if p99 > TARGET_P99_RATIO * FAR_FACTOR:
                far.append(f"latency: p99 at {LATENCY_RATE:.0f}/s is {p99:.1f}x Mosquitto's "
                           f"({m['p99_ms']:.1f} vs {p['p99_ms']:.1f} ms)")
            for who, c in (("Magnetar", m), ("Mosquitto", p)):
                if c["publish_msg_per_s"] < LATENCY_RATE * 0.95:
                    notes.append(f"the publisher reached only {c['publish_msg_per_s']:,.0f} "
                                 f"msg/s of {LATENCY_RATE:.0f} against {who}: its latency is "
                                 "at that rate, with the PUBACK window full")
        else:
            m["ratios"], said = peer_ratios(m, p, clean, TARGET_THROUGHPUT_RATIO, TARGET_CPU_RATIO)
            thr, cpu = m["ratios"]["throughput"], m["ratios"]["cpu"]
            if thr < TARGET_THROUGHPUT_RATIO / FAR_FACTOR:
                far.append(f"{label}: throughput is {thr:.2f}x Mosquitto's "
                           f"(target >= {TARGET_THROUGHPUT_RATIO:.1f}x)")
            if cpu > TARGET_CPU_RATIO * FAR_FACTOR:
                far.append(f"{label}: broker CPU per message is {cpu:.2f}x Mosquitto's "
                           f"(target <= {TARGET_CPU_RATIO:.1f}x)")
        if not clean:
            far.append(f"{label}: Magnetar had {m['duplicates']} duplicates, {m['lost']} lost, "
                       f"{m['unacked']} never PUBACKed, {m['publish_errors']} publish errors")
        print(f"  {'':<13}{'ratio':<11}{said}")
    _print_idle(results, far)
    print("  ratios are Magnetar / Mosquitto; deliv/s = unique deliveries per second from the "
          f"first publish to the last delivery (qos0-fanout: {FANOUT} subscribers, each "
          "delivery counts); CPU is the broker process's utime + stime per delivery; lost = "
          f"PUBACKed (QoS 1) or sent (QoS 0) and not delivered within {CATCH_UP_SECONDS:.0f} s "
          "of the publisher's end; pause = longest gap between two deliveries", flush=True)
    for line in notes:
        print(f"  NOTE: {line}", flush=True)
    for line in far:
        print(f"  FAR FROM TARGET: {line}", flush=True)


def _print_idle(results: dict[str, Any], far: list[str]) -> None:
    print(f"  {'idle':<13}{'broker':<11}{'clients':>10}{'RSS MiB':>16}{'KiB/client':>12}"
          f"{'fds':>14}{'dropped':>9}{'connect s':>11}")

    def row(_label: str, c: dict[str, Any]) -> str:
        return (f"{c['subscribed']:>10,}{c['rss_before_mib']:>7.1f} →{c['rss_after_mib']:>7.1f}"
                f"{c['kib_per_client']:>12.2f}{c['fds_before']:>6} →{c['fds_after']:>6}"
                f"{c['dropped']:>9}{c['connect_seconds']:>11.1f}")

    for _label, m, p in side_by_side(results, BROKERS, ("idle",), (13, 11), row):
        per = ratio(m, p, "kib_per_client")
        all_in = m["subscribed"] == IDLE_CLIENTS and m["dropped"] == 0
        m["ratios"] = {"kib_per_client": per, "all_connected": all_in}
        print(f"  {'':<13}{'ratio':<11}RSS per idle client {per:.2f}x; Magnetar "
              f"{m['kib_per_client']:.2f} KiB/client (target <= {TARGET_IDLE_KIB:.0f}, all "
              f"{IDLE_CLIENTS:,} connected: "
              f"{verdict(m['kib_per_client'] <= TARGET_IDLE_KIB and all_in)})")
        if m["kib_per_client"] > TARGET_IDLE_KIB * FAR_FACTOR:
            far.append(f"idle: {m['kib_per_client']:.1f} KiB per client "
                       f"(target <= {TARGET_IDLE_KIB:.0f})")
        floor = results.get("trio_floor") or {}
        if "kib_per_client" in floor:
            m["ratios"]["trio_floor_kib_per_client"] = floor["kib_per_client"]
            print(f"  {'':<13}{'floor':<11}a bare trio server (a task per connection reading "
                  f"with a timeout, nothing kept): {floor['kib_per_client']:.2f} KiB/client over "
                  f"{floor['subscribed']:,}; Magnetar's own per session: "
                  f"{m['kib_per_client'] - floor['kib_per_client']:.2f} KiB")
        elif floor:
            print(f"  {'':<13}{'floor':<11}not measured: {floor.get('error')}")
        for who, c in (("Magnetar", m), ("Mosquitto", p)):
            if c["subscribed"] < IDLE_CLIENTS:
                far.append(f"idle: only {c['subscribed']:,} of {IDLE_CLIENTS:,} clients made it "
                           f"to {who} ({c['errors']})")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mqtt_bench")
    sub = parser.add_subparsers(dest="command")
    pub = sub.add_parser("publish", help="the bench's publisher process")
    pub.add_argument("--host", required=True)
    pub.add_argument("--port", type=int, required=True)
    pub.add_argument("--topic", required=True)
    pub.add_argument("--qos", type=int, choices=(0, 1), required=True)
    pub.add_argument("--size", type=int, default=SIZE)
    pub.add_argument("--seconds", type=float, required=True)
    pub.add_argument("--count", type=int, default=0)
    pub.add_argument("--rate", type=float, default=0.0)
    pub.add_argument("--window", type=int, default=WINDOW)
    subs = sub.add_parser("subscribe", help="the bench's subscriber process")
    subs.add_argument("--host", required=True)
    subs.add_argument("--port", type=int, required=True)
    subs.add_argument("--topic", required=True)
    subs.add_argument("--qos", type=int, choices=(0, 1), required=True)
    subs.add_argument("--subscribers", type=int, default=1)
    subs.add_argument("--max-seconds", type=float, required=True)
    subs.add_argument("--latency", action="store_true")
    floor = sub.add_parser("floor", help="the idle case's floor: a bare trio server")
    floor.add_argument("--port", type=int, required=True)
    idle = sub.add_parser("idle", help="the bench's idle-client process")
    idle.add_argument("--host", required=True)
    idle.add_argument("--port", type=int, required=True)
    idle.add_argument("--count", type=int, required=True)
    idle.add_argument("--first", type=int, default=0)
    idle.add_argument("--prefix", required=True)
    idle.add_argument("--deadline", type=float, default=IDLE_DEADLINE)
    args = parser.parse_args(argv)
    if args.command == "publish":
        _publish_main(args)
    elif args.command == "subscribe":
        _subscribe_main(args)
    elif args.command == "idle":
        _idle_main(args)
    elif args.command == "floor":
        _floor_main(args)
    else:
        run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
