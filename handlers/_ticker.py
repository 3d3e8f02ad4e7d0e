"""A periodic check that parks while there is nothing for it to check.

The Kafka group and transaction coordinators expire sessions, rebalances and transactions
on a short tick. A broker with no Kafka group members and no open transactions should not
wake ten times a second to find that out: the coordinator asks :meth:`Ticker.next_tick`
whether anything can expire, and is woken by :meth:`Ticker.arm` when something starts that
can.
"""

from __future__ import annotations

import trio

__all__ = ["Ticker"]


class Ticker:
    def __init__(self, period: float):
        self.period = period
        self._armed = trio.Event()

    def arm(self) -> None:
        """Something that can expire exists now: tick again (no-op while ticking)."""
        self._armed.set()

    async def next_tick(self, busy: bool) -> None:
        """Sleep one period; first, when not ``busy``, until :meth:`arm` is called.

        ``busy`` is read from the caller's state in the same step as this call, and
        :meth:`arm` is called in the step that changes that state, so no arm is missed."""
        if not busy:
            self._armed = trio.Event()
            await self._armed.wait()
        await trio.sleep(self.period)
