"""Ports for tests that must name a listener's port (to come back on it after a restart)."""

from __future__ import annotations

import random
import socket

_LOWEST = 20000


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now and below the kernel's ephemeral range: a listener bound to port 0
    (the other listeners of a test's broker) is never given it, as it could be given a
    port picked by binding to 0 and releasing it."""
    top = max(_ephemeral_start(), _LOWEST + 1000)
    while True:
        port = random.randrange(_LOWEST, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
