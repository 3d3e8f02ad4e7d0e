"""Settings of a server process (standalone broker, bookie) made once at start.

Transparent huge pages are turned off for the process (``prctl(PR_SET_THP_DISABLE)``, as
Redis and MongoDB advise for their servers). The broker allocates and frees many buffers
of up to a few MB per second (request frames, entries, journal groups); with huge pages
each fresh 2 MiB region is zeroed whole on its first touch, which cost a fifth of the
broker's CPU under a Kafka produce/consume load, and makes latency spikier.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["disable_transparent_huge_pages"]

log = logging.getLogger(__name__)

PR_SET_THP_DISABLE = 41  # <linux/prctl.h>
PR_GET_THP_DISABLE = 42


def disable_transparent_huge_pages() -> bool:
    """Turn transparent huge pages off for this process (and the processes it starts).
    Returns whether they are off; on a system without the call nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        log.debug("transparent huge pages stay as they are: prctl errno %d", ctypes.get_errno())
        return False
    return bool(libc.prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1)
