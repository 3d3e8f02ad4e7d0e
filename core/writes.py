"""Theory of operation: connection writes gathered to the end of a batch of work.

A session's writer task sends what the session queued. Waking it costs a pass of the
scheduler, and most frames are queued in bursts that end within the same task step: the
receipts of one stored batch (in the native drain), the MESSAGE frames of one dispatch,
the responses to what one socket read brought. Code that runs such a burst opens
:func:`write_batch`; a session queueing a frame inside it registers its flush with
:func:`flush_at_end` instead of waking its writer, and every registered flush runs when
the outermost batch ends, sending the session's whole burst with one non-blocking write
(:func:`write_now`). What the socket does not take goes to the writer task, which waits
for the socket to drain, exactly as before.

A batch must not span an ``await``: other tasks would run inside it and their frames
would wait for its end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

__all__ = ["IOV_MAX", "drop_sent", "flush_at_end", "write_batch", "write_now"]

log = logging.getLogger(__name__)

IOV_MAX = 1024  # the most buffers one vectored write takes (Linux's UIO_MAXIOV)

class _WriteBatch:
    """The context of :func:`write_batch`: one shared instance, nesting counted (a class
    rather than a generator context manager: it is entered for every read and drain).
    Inside a batch while ``depth`` is above zero; ``flushes`` are what its end runs."""

    __slots__ = ("depth", "flushes")

    def __init__(self) -> None:
        self.depth = 0
        self.flushes: list[Callable[[], None]] = []

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        if self.depth > 1:
            self.depth -= 1
            return
        # The outermost end. The flushes run still inside the batch, so that what one
        # queues (gathered frames put to their outbox) registers that outbox's flush for
        # the next round rather than waking its writer.
        try:
            while self.flushes:
                flushes, self.flushes = self.flushes, []
                for flush in flushes:
                    try:
                        flush()
                    except Exception:
                        log.exception("a deferred connection flush failed")
        finally:
            self.depth = 0


_BATCH = _WriteBatch()


def write_batch() -> _WriteBatch:
    """Gather the flushes registered inside; run them at the end (of the outermost)."""
    return _BATCH


def flush_at_end(flush: Callable[[], None]) -> bool:
    """Inside a write batch: run ``flush()`` at its end and return True. Outside one:
    False, and the caller wakes its writer."""
    if not _BATCH.depth:
        return False
    _BATCH.flushes.append(flush)
    return True


def write_now(fd: int, pieces: list[bytes]) -> list[bytes]:
    """Write ``pieces`` back to back on the non-blocking socket ``fd`` as far as it takes
    them now; what it did not take (the tail of a piece included) is returned. OSError
    (a reset or closed peer) propagates."""
    while pieces:
        try:
            n = os.writev(fd, pieces[:IOV_MAX])
        except BlockingIOError:
            return pieces
        if drop_sent(pieces, n):
            return pieces
    return pieces


def drop_sent(pieces: list[bytes], n: int) -> bool:
    """Remove the first ``n`` bytes written from ``pieces``; True when that ended inside
    a piece (the socket took less than it was given)."""
    sent = 0
    while sent < len(pieces) and n >= len(pieces[sent]):
        n -= len(pieces[sent])
        sent += 1
    del pieces[:sent]
    if n:
        pieces[0] = memoryview(pieces[0])[n:]  # type: ignore[call-overload]
        return True
    return False
