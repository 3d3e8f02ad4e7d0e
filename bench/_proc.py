"""What the peer benchmarks share: CPU seconds from /proc, free ports, and how a figure
is compared with the peer's and with its target."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from typing import Any

__all__ = ["cpu_seconds", "free_port", "ratio", "verdict"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ratio(ours: Mapping[str, Any], peer: Mapping[str, Any], key: str) -> float:
    """Our figure over the peer's (infinite when the peer's is zero)."""
    return ours[key] / peer[key] if peer[key] else math.inf


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"
