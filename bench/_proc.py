"""What the peer benchmarks share: CPU seconds from /proc, free ports, a quiet disk before
each measurement, and how a figure is compared with the peer's and with its target."""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["combine_rounds", "cpu_seconds", "cpu_times", "free_port", "last_json", "peer_ratios", "percentile", "quiet_disk", "ratio",
           "run_brokers", "side_by_side", "Skipped", "verdict"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """utime and stime of a process (all its threads) in seconds: its own code's CPU time
    and the kernel's on its behalf (system calls, the network stack, the disk)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) in seconds."""
    return sum(cpu_times(pid))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quiet_disk() -> None:
    """Write back everything the machine still holds dirty (``sync`` returns once it is on
    disk), so that a measurement does not pay for what an earlier one wrote: an earlier
    bench's gigabytes still in the page cache slow every fsync that follows for tens of
    seconds. Each case then starts as if it ran on its own; what it writes itself stays
    in its figures."""
    os.sync()


def combine_rounds(runs: list[dict[str, Any]], medians: Iterable[str],
                   sums: Iterable[str]) -> dict[str, Any]:
    """Rounds of one case: the median of each of ``medians`` (rates, CPU, latency), the sum
    of each of ``sums`` (counts: one duplicate in any round shows), and the rounds
    themselves. Failed rounds (``{"error": ...}``) are left out; if every round failed,
    the first failure is the result."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in good) for k in medians}
    out.update({k: sum(r[k] for r in good) for k in sums})
    out["rounds"] = runs
    return out


def ratio(ours: Mapping[str, Any], peer: Mapping[str, Any], key: str) -> float:
    """Our figure over the peer's (infinite when the peer's is zero)."""
    return ours[key] / peer[key] if peer[key] else math.inf


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def peer_ratios(ours: Mapping[str, Any], peer: Mapping[str, Any], clean: bool,
                throughput_target: float, cpu_target: float) -> tuple[dict[str, Any], str]:
    """End-to-end throughput and broker CPU per message, ours over the peer's, judged
    against their targets (throughput counts only with no duplicate or loss): the ratios,
    and the sentence that reports them."""
    thr, cpu = ratio(ours, peer, "e2e_msg_per_s"), ratio(ours, peer, "cpu_us_per_msg")
    text = (f"throughput {thr:.2f}x (target >= {throughput_target:.1f}, no dup/loss: "
            f"{verdict(thr >= throughput_target and clean)}), CPU/msg {cpu:.2f}x "
            f"(target <= {cpu_target:.1f}: {verdict(cpu <= cpu_target)})")
    return {"throughput": thr, "cpu": cpu, "clean": clean}, text


def side_by_side(results: Mapping[str, Any], brokers: tuple[str, str], labels: Iterable[str],
                 widths: tuple[int, int], row: Callable[[str, dict[str, Any]], str]
                 ) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Print, case by case, each broker's table row (``row(label, case)`` after the label
    and the broker's name) or its error; yield ``(label, ours, peer)`` for every case both
    brokers ran. A broker whose whole run failed holds ``{"error": ...}``."""
    for label in labels:
        ran: dict[str, dict[str, Any]] = {}
        for name in brokers:
            cases = results.get(name, {})
            case = cases if "error" in cases else cases.get(label)
            head = f"  {label:<{widths[0]}}{name:<{widths[1]}}"
            if case is None or "error" in case:
                print(f"{head}error: {(case or {}).get('error', 'not run')[:80]}")
                continue
            print(head + row(label, case))
            ran[name] = case
        if len(ran) == len(brokers):
            yield label, ran[brokers[0]], ran[brokers[1]]


class Skipped(Exception):
    """The peer cannot run here; the message says why."""


def run_brokers(prefix: str, brokers: Iterable[tuple[str, Callable[[Path], Any]]],
                cases: Callable[[str, Any, int], dict[str, Any]]) -> dict[str, Any]:
    """Each broker in turn (a context manager factory given a scratch directory, yielding
    its address and the pid whose CPU is counted) through ``cases``; a broker that cannot
    run here, or fails, is reported as such rather than ending the bench."""
    base = Path(os.environ.get("MAGNETAR_BENCH_DIR", "bench/results"))
    base.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=base, prefix=prefix) as tmp:
        root = Path(tmp).resolve()
        for name, broker in brokers:
            try:
                with broker(root) as (address, pid):
                    results[name] = cases(name, address, pid)
            except Skipped as exc:
                results[name] = {"error": f"skipped: {exc}"}
                print(f"  {name}: SKIPPED: {exc}", flush=True)
            except Exception as exc:
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  {name}: {results[name]['error'][:300]}", flush=True)
    return results


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (inf for none)."""
    if not values:
        return math.inf
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def last_json(out: bytes) -> dict[str, Any] | None:
    """The JSON report a bench client process prints as its last line, if it did."""
    lines = out.decode(errors="replace").strip().splitlines()
    return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None

