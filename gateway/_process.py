"""Settings of a server process (standalone broker, bookie) made once at start.

The garbage collector is off while the standalone starts (walking startup's objects before
they are frozen only delayed "ready", by about 50 ms) and settled once the server is up
(:func:`settle_garbage_collector`), which turns it back on: what startup built (modules,
classes, protocol descriptors: some 60,000 objects) is frozen out of the collector's
view, and a young collection runs every
:data:`GC_YOUNG_THRESHOLD` allocations rather than every 700. Without this, each full
collection walked every one of those objects again (about 40 ms each, several times a
second under load), and collections took a tenth of the broker's CPU while it relayed
messages.

Transparent huge pages are turned off for the process (``prctl(PR_SET_THP_DISABLE)``, as
Redis and MongoDB advise for their servers). The broker allocates and frees many buffers
of up to a few MB per second (request frames, entries, journal groups); with huge pages
each fresh 2 MiB region is zeroed whole on its first touch, which cost a fifth of the
broker's CPU under a Kafka produce/consume load, and makes latency spikier.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys

__all__ = ["disable_transparent_huge_pages", "settle_garbage_collector"]

log = logging.getLogger(__name__)

PR_SET_THP_DISABLE = 41  # <linux/prctl.h>
PR_GET_THP_DISABLE = 42
GC_YOUNG_THRESHOLD = 10_000
"""Allocations (less deallocations) of tracked objects between two young collections."""


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


def settle_garbage_collector() -> None:
    """Call once startup is done: collect what startup left behind, freeze the rest out of
    every later collection, and space young collections out (see the module docs)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    gc.enable()  # the standalone command starts with it off
