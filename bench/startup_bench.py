"""How fast `magnetar standalone` starts and how much memory it idles in (bounded: one
start, a few seconds idle, one clean stop)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from tests._standalone import Standalone

IDLE_SECONDS = 3.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        t = time.monotonic()
        s = Standalone(Path(tmp) / "data").start()
        ready = time.monotonic() - t
        assert s.proc is not None
        time.sleep(IDLE_SECONDS)
        rss = _rss_mb(s.proc.pid)
        t = time.monotonic()
        s.stop()
        stop = time.monotonic() - t
    print("\nStandalone: process start to ready, idle memory, clean stop")
    print(f"  ready in {ready:.2f} s (spawn to listening), idle RSS {rss:.0f} MB, SIGINT stop {stop:.2f} s")
    return {"ready_s": ready, "idle_rss_mb": rss, "stop_s": stop}


if __name__ == "__main__":
    run()
