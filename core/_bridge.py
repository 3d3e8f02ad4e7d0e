"""Theory of operation: awaiting native operations from trio.

Every asynchronous native call takes a completion queue and an integer token and returns
at once; the operation runs on the native runtime and pushes ``(token, ok, value)`` onto
the queue when it ends. The queue's file descriptor becomes readable when the queue goes
from empty to non-empty, so one wake-up of :meth:`NativeBridge.run` drains a whole batch
of completions, however many operations finished together.

Each operation has a callback, run inside the drain (:meth:`NativeBridge.start`). A hot
path that needs no task of its own (a topic storing its publishes) uses it directly, which
saves a waiting task's wake-up and one pass of the scheduler per operation;
:meth:`NativeBridge.call` awaits the result through a callback that sets an event. A
caller that is cancelled while waiting simply stops waiting: the native operation still
finishes and its result is dropped.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

import trio

from core import _native
from core.writes import write_batch

__all__ = ["NativeBridge"]

log = logging.getLogger(__name__)


class _Pending:
    """The outcome an awaiting :meth:`NativeBridge.call` waits for."""

    __slots__ = ("event", "ok", "value")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.ok = False
        self.value: Any = None

    def done(self, ok: bool, value: Any) -> None:
        self.ok = ok
        self.value = value
        self.event.set()


class NativeBridge:
    """Runs in the broker's nursery; turns native completions into awaited results."""

    def __init__(self) -> None:
        self.queue = _native.CompletionQueue()
        self._tokens = itertools.count(1)
        self._callbacks: dict[int, Callable[[bool, Any], None]] = {}

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        fd = self.queue.fileno()
        task_status.started()
        while True:
            await trio.lowlevel.wait_readable(fd)
            # what the callbacks queue for the clients (receipts, responses) goes out at
            # the end of the drain, a connection's share in one write
            with write_batch():
                for token, ok, value in self.queue.drain():
                    done = self._callbacks.pop(token, None)
                    if done is not None:
                        try:
                            done(ok, value)
                        except Exception:
                            log.exception("a native completion callback failed")

    def start(self, start: Callable[..., None], *args: Any,
              done: Callable[[bool, Any], None]) -> None:
        """Start ``start(queue, token, *args)``; ``done(ok, value)`` is called from the drain
        when it ends (``value`` the result, or the exception when not ``ok``). A failure to
        start raises here and ``done`` is never called."""
        token = next(self._tokens)
        self._callbacks[token] = done
        try:
            start(self.queue, token, *args)
        except BaseException:
            del self._callbacks[token]
            raise

    async def call(self, start: Callable[..., None], *args: Any) -> Any:
        """Start ``start(queue, token, *args)`` and wait for its result (or exception)."""
        pending = _Pending()
        self.start(start, *args, done=pending.done)
        await pending.event.wait()
        if pending.ok:
            return pending.value
        raise pending.value
