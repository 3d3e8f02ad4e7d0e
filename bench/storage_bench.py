"""Append throughput and latency of the native storage core, beside this disk's limits.

Measured in one run, on the same filesystem:
- the machine's limits: a raw ``write + fdatasync`` loop (ops/s and latency) and sequential
  fsynced write bandwidth (1 MiB blocks);
- managed-ledger appends from trio through ``core._native`` (journal fsync on): entries/s,
  MB/s, and p50/p99 add latency at half of the measured peak rate, for 100 B and 1 KiB
  entries, with 1 bookie and with 3 bookies (E=3, Qw=2, Qa=2);
- beside each latency, the disk alone under the same load: the same entries arriving at
  the same rate, written and fdatasync'ed by a bare loop that groups whatever is due into
  one direct write over blocks written beforehand, as an ideal journal with no overhead
  would. Its p99 is the floor any fsynced store has on this disk at that rate: the closed
  loop above waits for each fdatasync before it issues the next, so a stall of the disk
  delays one operation there, while under a steady arrival rate it delays every entry
  that arrives during it.
Every loop is bounded in count and in time.
"""

from __future__ import annotations

import mmap
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench._proc import quiet_disk
from gateway._process import disable_transparent_huge_pages, settle_garbage_collector
from tests.core._storage_env import ml_config, storage_env

RAW_FSYNC_OPS = 2000
RAW_SEQ_BYTES = 256 << 20
APPEND_SECONDS = 8.0
APPEND_BATCH = 500
IN_FLIGHT = 8
LATENCY_SECONDS = 5.0
TICK = 0.001
"""The latency runs hand over the entries due every this many seconds, in one go."""


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


def raw_fsync(directory: Path, size: int = 1024) -> dict[str, float]:
    path = directory / "raw-fsync.bin"
    block = os.urandom(size)
    lat = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        deadline = time.monotonic() + 10
        for _ in range(RAW_FSYNC_OPS):
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
            if time.monotonic() > deadline:
                break
    finally:
        os.close(fd)
        path.unlink()
    return {"ops_per_s": len(lat) / sum(lat), "p50_us": _percentile(lat, 0.5) * 1e6,
            "p99_us": _percentile(lat, 0.99) * 1e6}


def _per_tick(rate: float) -> int:
    """Entries due each :data:`TICK` at ``rate`` entries/s (at least one)."""
    return max(1, round(rate * TICK))


MAX_TICKS_PER_PASS = 256
"""A pass of :func:`raw_open_loop` writes at most this many ticks' entries; the rest wait."""


def _open_direct(path: Path) -> tuple[int, bool]:
    """``path`` opened for writing with ``O_DIRECT`` where the file system allows it (as
    the journal opens its files); the descriptor and whether it is direct."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        return os.open(path, flags | os.O_DIRECT, 0o644), True
    except OSError:
        return os.open(path, flags, 0o644), False


def raw_open_loop(directory: Path, size: int, rate: float,
                  seconds: float = LATENCY_SECONDS) -> dict[str, float]:
    """``size``-byte entries due at ``rate``/s (a tick's worth every millisecond, as
    :func:`_latency_at` issues them), each pass writing every entry due so far with one
    write and one fdatasync. An entry's latency runs from the tick it was due.

    The best case for any fsynced store: the file's blocks are written (with zeros) and
    synced before the loop, so no fdatasync in it carries a file-system metadata commit,
    and writes are direct, whole blocks from an aligned buffer, each pass padded to a
    block as the journal pads its group commits."""
    path = directory / "raw-open-loop.bin"
    per_tick = _per_tick(rate)
    ticks = int(seconds / TICK) + 1
    block = 4096
    tick_bytes = per_tick * size
    pass_cap = -(-tick_bytes * MAX_TICKS_PER_PASS // block) * block
    total = -(-(ticks * (tick_bytes + block)) // (1 << 20)) * (1 << 20)
    buf = mmap.mmap(-1, pass_cap)  # page-aligned, as a direct write needs
    buf.write(os.urandom(pass_cap))
    view = memoryview(buf)
    lat: list[float] = []
    fd, direct = _open_direct(path)
    try:
        zeros = mmap.mmap(-1, 1 << 20)
        for off in range(0, total, 1 << 20):
            os.pwrite(fd, zeros, off)
        os.fsync(fd)
        zeros.close()
        start = time.perf_counter()
        next_due = start
        end = start + seconds
        off = 0
        while next_due < end:
            now = time.perf_counter()
            if now < next_due:
                time.sleep(next_due - now)
                now = time.perf_counter()
            due: list[float] = []
            while next_due <= now and next_due < end and len(due) < MAX_TICKS_PER_PASS:
                due.append(next_due)
                next_due += TICK
            length = tick_bytes * len(due)
            padded = -(-length // block) * block if direct else length
            os.pwrite(fd, view[:padded], off)
            off += padded
            os.fdatasync(fd)
            done = time.perf_counter()
            for d in due:
                lat.extend([done - d] * per_tick)
    finally:
        view.release()
        buf.close()
        os.close(fd)
        path.unlink()
    return {"p50_us": _percentile(lat, 0.5) * 1e6, "p99_us": _percentile(lat, 0.99) * 1e6}


def raw_sequential(directory: Path) -> dict[str, float]:
    path = directory / "raw-seq.bin"
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    t = time.perf_counter()
    try:
        deadline = time.monotonic() + 10
        while written < RAW_SEQ_BYTES and time.monotonic() < deadline:
            os.write(fd, block)
            os.fdatasync(fd)
            written += len(block)
    finally:
        elapsed = time.perf_counter() - t
        os.close(fd)
        path.unlink()
    return {"mb_per_s": written / elapsed / 1e6}


async def _peak(ml: Any, size: int) -> dict[str, float]:
    payload = os.urandom(size)
    batch = [payload] * APPEND_BATCH
    counts = [1] * APPEND_BATCH
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + APPEND_SECONDS

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await ml.add_entries(batch, counts)
            done += APPEND_BATCH

    async with trio.open_nursery() as nursery:
        for _ in range(IN_FLIGHT):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - t0
    return {"entries_per_s": done / elapsed, "mb_per_s": done * size / elapsed / 1e6}


async def _latency_at(ml: Any, size: int, rate: float) -> dict[str, float]:
    """Append at `rate` entries/s: every millisecond the entries due are handed over in one
    call, as the broker's publish path groups them. An entry's latency runs from that call
    to its acknowledgement. (Not from the tick it was due: trio's timer wakes up to a
    millisecond late, and that lateness belongs to this load generator, not to the store.
    The calls are independent tasks, so a slow add never holds back the next tick.)"""
    payload = os.urandom(size)
    lat: list[float] = []
    per_tick = _per_tick(rate)
    batch = [payload] * per_tick
    counts = [1] * per_tick
    end = time.perf_counter() + LATENCY_SECONDS

    async def one() -> None:
        issued = time.perf_counter()
        await ml.add_entries(batch, counts)
        lat.extend([time.perf_counter() - issued] * per_tick)

    async with trio.open_nursery() as nursery:
        due = time.perf_counter()
        while due < end:
            nursery.start_soon(one)
            due += TICK
            await trio.sleep(max(0.0, due - time.perf_counter()))
    return {"p50_us": _percentile(lat, 0.5) * 1e6, "p99_us": _percentile(lat, 0.99) * 1e6,
            "adds": float(len(lat)), "rate": per_tick / TICK}


async def _append_case(root: Path, bookies: int, size: int) -> dict[str, Any]:
    quorum = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2} if bookies == 3 else {}
    async with storage_env(root, bookies=bookies) as env:
        ml = await env.storage.open(f"bench/ns/persistent/append-{bookies}-{size}",
                                    ml_config(max_entries_per_ledger=10_000_000, **quorum))
        peak = await _peak(ml, size)
        lat = await _latency_at(ml, size, peak["entries_per_s"] / 2)
        await ml.close()
    return {**peak, "half_rate": lat["rate"], "p50_us": lat["p50_us"], "p99_us": lat["p99_us"]}


def run() -> dict[str, Any]:
    # This process stands in for the broker, which runs with transparent huge pages off and
    # its startup objects frozen out of the garbage collector.
    disable_transparent_huge_pages()
    settle_garbage_collector()
    base = Path(os.environ.get("MAGNETAR_BENCH_DIR", "bench/results"))
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-storage-") as tmp:
        root = Path(tmp)
        fsync = raw_fsync(root)
        seq = raw_sequential(root)
        cases: dict[tuple[int, int], dict[str, Any]] = {}
        for bookies in (1, 3):
            for size in (100, 1024):
                case_root = root / f"b{bookies}-{size}"
                case_root.mkdir()
                # Each case starts on a quiet disk, with the previous case's files gone.
                quiet_disk()
                case = trio.run(_append_case, case_root, bookies, size)
                shutil.rmtree(case_root)
                quiet_disk()
                case["disk_alone"] = raw_open_loop(root, size, case["half_rate"])
                cases[(bookies, size)] = case
    print("\nStorage: managed-ledger appends (journal fsync on) beside this disk's limits")
    print(f"  raw write+fdatasync (1 KiB): {fsync['ops_per_s']:,.0f} ops/s, "
          f"p50 {fsync['p50_us']:.0f} us, p99 {fsync['p99_us']:.0f} us")
    print(f"  raw sequential fsynced write (1 MiB blocks): {seq['mb_per_s']:,.0f} MB/s")
    print(f"  {'case':<22}{'entries/s':>12}{'MB/s':>9}{'p50 us':>9}{'p99 us':>9}"
          f"{'disk alone p99':>16}  ratios")
    for (bookies, size), c in cases.items():
        label = f"{bookies} bookie{'s' if bookies > 1 else ''}, {size} B"
        ratios = [f"p99 {c['p99_us'] / fsync['p50_us']:.1f}x fsync",
                  f"{c['p99_us'] / c['disk_alone']['p99_us']:.1f}x disk alone"]
        if size == 1024 and bookies == 1:
            ratios.insert(0, f"{c['mb_per_s'] / seq['mb_per_s'] * 100:.0f}% of seq bw")
        if bookies == 3:
            ratios.insert(0, f"{c['entries_per_s'] / cases[(1, size)]['entries_per_s'] * 100:.0f}% of 1 bookie")
        print(f"  {label:<22}{c['entries_per_s']:>12,.0f}{c['mb_per_s']:>9,.1f}"
              f"{c['p50_us']:>9,.0f}{c['p99_us']:>9,.0f}{c['disk_alone']['p99_us']:>16,.0f}"
              f"  {', '.join(ratios)}")
    print("  p50/p99: add latency at half of peak; disk alone: a bare direct write+fdatasync "
          "loop over blocks written beforehand, fed the same entries at the same rate "
          "(the floor on this disk)")
    return {"raw_fsync": fsync, "raw_sequential": seq,
            "append": {f"{b}x{s}": v for (b, s), v in cases.items()},
            "median_fsync_us": statistics.median([fsync["p50_us"]])}


if __name__ == "__main__":
    run()
