"""Fault tests with real processes: bookies and writers killed with SIGKILL, journals
truncated. Bookies run as `magnetar bookie`; the writer is a separate Python process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from tests._ports import free_port
from tests.core._storage_env import ml_config, storage_env

pytestmark = pytest.mark.slow

WAIT = 60.0


class Proc:
    """A child process whose output lines are collected by a thread; waits are bounded."""

    def __init__(self, args: list[str]):
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as out:
            for raw in out:
                with self._cond:
                    self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                    self._cond.notify_all()

    def wait_for(self, predicate, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not predicate(self.lines):
                    raise AssertionError("timed out; output:\n" + "\n".join(self.lines[-40:]))
                self._cond.wait(min(left, 0.5))

    def acked(self) -> list[int]:
        with self._cond:
            return [int(line.split()[1]) for line in self.lines if line.startswith("acked ")]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)
        self._reader.join(WAIT)


def bookie_args(data: Path, port: int, metadata_url: str, *conf: str) -> list[str]:
    """``magnetar bookie`` with ``-c key=value`` for each of ``conf``."""
    return [sys.executable, "-m", "gateway", "bookie", "--port", str(port), "--data-dir",
            str(data), "--metadata-store-url", metadata_url,
            *(arg for kv in conf for arg in ("-c", kv))]


def start_bookie(data: Path, port: int, metadata_url: str, *conf: str) -> Proc:
    p = Proc(bookie_args(data, port, metadata_url, *conf))
    p.wait_for(lambda lines: any("bookie ready" in x for x in lines))
    return p


def start_writer(metadata_url: str, name: str, config: dict, count: int) -> Proc:
    return Proc([sys.executable, "-m", "tests.core._storage_env", metadata_url, name,
                 json.dumps(config), str(count)])


def ledger_ensemble(metadata_url: str, ledger_id: int) -> list[str]:
    from core.metadata import open_metadata_store
    store = open_metadata_store(metadata_url)
    try:
        meta = json.loads(store.get(f"/ledgers/ledger/{ledger_id}")[0])
        return list(meta["ensembles"][-1][1])
    finally:
        store.close()


async def read_everything(tmp_path: Path, url: str, name: str, config: dict) -> list[bytes]:
    async with storage_env(tmp_path / "reader", bookies=0, metadata_url=url) as env:
        ml = await env.storage.open(name, config)
        first = ml.first_position()
        if first is None:
            return []
        out = []
        pos = first
        while True:
            got = await ml.read_entries(pos, 500)
            if not got:
                break
            out += [e.data for e in got]
            last = got[-1].position
            pos = type(last)(last.ledger_id, last.entry_id + 1)
        return out


def assert_all_acked_present(acked: list[int], data: list[bytes]) -> None:
    values = [int(d.decode().split("-")[1]) for d in data]
    assert values == sorted(values), "entries out of order"
    missing = set(acked) - set(values)
    assert not missing, f"{len(missing)} acknowledged entries lost, e.g. {sorted(missing)[:5]}"


def test_kill_one_bookie_during_adds(tmp_path):
    url = f"sqlite:{tmp_path / 'meta.db'}"
    ports = [free_port() for _ in range(4)]
    bookies = [start_bookie(tmp_path / f"b{i}", ports[i], url) for i in range(4)]
    config = ml_config(ensemble_size=3, write_quorum=2, ack_quorum=2)
    writer = start_writer(url, "t/ns/persistent/kill-bookie", config, 1500)
    try:
        writer.wait_for(lambda lines: sum(x.startswith("acked") for x in lines) >= 200)
        from core.metadata import open_metadata_store
        store = open_metadata_store(url)
        ml_record = json.loads(store.get("/managed-ledgers/t/ns/persistent/kill-bookie")[0])
        store.close()
        ledger = ml_record["ledgers"][-1]["ledgerId"]
        victim = ledger_ensemble(url, ledger)[0]
        bookies[ports.index(int(victim.rsplit(":", 1)[1]))].kill()
        writer.wait_for(lambda lines: "done" in lines, timeout=120)
        acked = writer.acked()
        assert len(acked) == 1500
        writer.kill()
        assert victim not in ledger_ensemble(url, ledger)
        data = trio.run(read_everything, tmp_path, url, "t/ns/persistent/kill-bookie", config)
        assert_all_acked_present(acked, data)
    finally:
        writer.kill()
        for b in bookies:
            b.kill()


def test_kill_writer_then_recover_and_fence(tmp_path):
    url = f"sqlite:{tmp_path / 'meta.db'}"
    ports = [free_port() for _ in range(3)]
    bookies = [start_bookie(tmp_path / f"b{i}", ports[i], url) for i in range(3)]
    config = ml_config(ensemble_size=3, write_quorum=2, ack_quorum=2)
    name = "t/ns/persistent/kill-writer"
    try:
        first = start_writer(url, name, config, 10**6)
        first.wait_for(lambda lines: sum(x.startswith("acked") for x in lines) >= 300)
        first.kill()
        acked = first.acked()
        data = trio.run(read_everything, tmp_path, url, name, config)
        assert_all_acked_present(acked, data)
        assert len(data) >= len(acked)
        before = data
        # A live writer is fenced out when another owner opens the managed ledger.
        second = start_writer(url, name, config, 10**6)
        second.wait_for(lambda lines: sum(x.startswith("acked") for x in lines) >= 100)
        data = trio.run(read_everything, tmp_path, url, name, config)
        second.wait_for(lambda lines: any(x.startswith("error") for x in lines))
        fenced_at = len(second.acked())
        time.sleep(0.5)
        assert len(second.acked()) == fenced_at, "a fenced writer kept acknowledging adds"
        second.kill()
        final = trio.run(read_everything, tmp_path, url, name, config)
        assert final[:len(before)] == before
        assert_all_acked_present(second.acked(), final[len(before):])
    finally:
        for b in bookies:
            b.kill()


def test_restarted_bookie_replays_its_journal(tmp_path):
    url = f"sqlite:{tmp_path / 'meta.db'}"
    port = free_port()
    bookie = start_bookie(tmp_path / "b0", port, url)
    name = "t/ns/persistent/replay"
    writer = start_writer(url, name, ml_config(), 500)
    try:
        writer.wait_for(lambda lines: "done" in lines)
        acked = writer.acked()
        bookie.kill()
        writer.kill()
        bookie = start_bookie(tmp_path / "b0", port, url)
        data = trio.run(read_everything, tmp_path, url, name, ml_config())
        assert_all_acked_present(acked, data)
        assert len(data) == 500
    finally:
        writer.kill()
        bookie.kill()


def test_bookie_with_journal_and_ledgers_on_their_own_directories(tmp_path):
    """journalDirectory and ledgerDirectories: the journal and the entry logs go where they
    say, a killed bookie recovers from them, and a bookie started without one of its
    ledger directories refuses to run, saying why."""
    url = f"sqlite:{tmp_path / 'meta.db'}"
    port = free_port()
    journal, l1, l2 = tmp_path / "journal-disk", tmp_path / "ledgers-1", tmp_path / "ledgers-2"
    dirs = (f"journalDirectory={journal}", f"ledgerDirectories={l1},{l2}")
    bookie = start_bookie(tmp_path / "data", port, url, *dirs)
    name = "t/ns/persistent/dirs"
    # Several ledgers, spread over both directories.
    config = ml_config(max_entries_per_ledger=100, min_rollover_time_ms=0)
    writer = start_writer(url, name, config, 500)
    try:
        writer.wait_for(lambda lines: "done" in lines)
        acked = writer.acked()
        bookie.kill()
        writer.kill()
        assert list((journal / "journal").glob("*.log"))
        assert not (journal / "ledgers").exists()
        for d in (l1, l2):
            assert list((d / "ledgers").glob("*.log")), f"no ledger in {d}"
            assert not (d / "journal").exists()
        assert not (tmp_path / "data" / "bookie" / "journal").exists()

        bookie = start_bookie(tmp_path / "data", port, url, *dirs)
        data = trio.run(read_everything, tmp_path, url, name, config)
        assert_all_acked_present(acked, data)
        assert len(data) == 500
        bookie.kill()

        refused = subprocess.run(
            bookie_args(tmp_path / "data", port, url, dirs[0], f"ledgerDirectories={l1}"),
            capture_output=True, text=True, timeout=WAIT)
        assert refused.returncode == 1
        assert "cookie mismatch" in refused.stderr
        assert "created with 3 directories, 2 are configured" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        writer.kill()
        bookie.kill()


def test_truncated_journal_tail_is_dropped_and_the_rest_recovered(tmp_path):
    url = f"sqlite:{tmp_path / 'meta.db'}"
    port = free_port()
    bookie = start_bookie(tmp_path / "b0", port, url)
    name = "t/ns/persistent/torn"
    writer = start_writer(url, name, ml_config(), 300)
    try:
        writer.wait_for(lambda lines: "done" in lines)
        journals = sorted((tmp_path / "b0").rglob("*.log"), key=lambda p: p.stat().st_mtime)
        journal = [j for j in journals if "journal" in str(j)][-1]
        # Idle, the bookie writes zeros after the records; the kill leaves them there.
        deadline = time.monotonic() + 10
        while journal.stat().st_size < 1 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        bookie.kill()
        writer.kill()
        # Cut five bytes before the last non-zero byte, inside the last record.
        raw = journal.read_bytes()
        records_end = len(raw.rstrip(b"\0"))
        assert records_end < len(raw), "the journal was preallocated past its records"
        with open(journal, "r+b") as f:
            f.truncate(records_end - 5)
        bookie = start_bookie(tmp_path / "b0", port, url)
        data = trio.run(read_everything, tmp_path, url, name, ml_config())
        values = [int(d.decode().split("-")[1]) for d in data]
        assert values[:299] == list(range(299))
    finally:
        writer.kill()
        bookie.kill()
