"""Windowed rate limits for the publish and dispatch rate policies.

A window counts messages and bytes from its start; once a period has passed the counts
restart, less the limit of each period gone by: what a window let through beyond its
limit (a read may take a whole entry past it, and several readers may share one limit) is
paid back by the windows after it, as a token bucket would, so the rate holds over time.
A limit of 0 or less means no limit. Times are trio clock seconds, so a throttled task
sleeps until :meth:`RateWindow.allowance`'s reset time.

>>> w = RateWindow()
>>> w.allowance(10, 0, 1.0, now=100.0)
(10, None, 101.0)
>>> w.add(8, 800)
>>> w.allowance(10, 0, 1.0, now=100.5)
(2, None, 101.0)
>>> w.allowance(10, 0, 1.0, now=101.0)
(10, None, 102.0)
>>> w.add(25, 0)
>>> w.allowance(10, 0, 1.0, now=102.0)
(0, None, 103.0)
>>> w.allowance(10, 0, 1.0, now=103.5)
(5, None, 104.5)
"""

from __future__ import annotations

from typing import Any

import trio

__all__ = ["RateWindow", "rate_limits", "window_allowance"]


class RateWindow:
    def __init__(self) -> None:
        self.start = float("-inf")
        self.messages = 0
        self.bytes = 0

    def allowance(self, max_messages: int, max_bytes: int, period: float,
                  now: float) -> tuple[int | None, int | None, float]:
        """(messages left, bytes left, when the window resets); None where unlimited."""
        if now >= self.start + period:
            periods = (now - self.start) // period if self.start != float("-inf") else float("inf")
            self.start = now
            self.messages = _left_over(self.messages, max_messages, periods)
            self.bytes = _left_over(self.bytes, max_bytes, periods)
        msgs = None if max_messages <= 0 else max(0, max_messages - self.messages)
        size = None if max_bytes <= 0 else max(0, max_bytes - self.bytes)
        return msgs, size, self.start + period

    def add(self, messages: int, size: int) -> None:
        self.messages += messages
        self.bytes += size


def _left_over(used: int, limit: int, periods: float) -> int:
    """What of ``used`` a new window still owes after ``periods`` of ``limit`` each."""
    if limit <= 0 or periods == float("inf"):
        return 0
    return int(max(0, used - limit * periods))


def rate_limits(policy: Any, msg_key: str, byte_key: str) -> tuple[int, int, float] | None:
    """(max messages, max bytes, period seconds) from a DispatchRate/PublishRate policy,
    or None when the policy sets no limit."""
    if not isinstance(policy, dict):
        return None
    msgs = int(policy.get(msg_key, -1) or -1)
    size = int(policy.get(byte_key, -1) or -1)
    period = float(policy.get("ratePeriodInSecond", 1) or 1)
    if msgs <= 0 and size <= 0:
        return None
    return msgs, size, max(period, 0.001)


def window_allowance(window: RateWindow, limits: tuple[int, int, float] | None,
                     now: float | None = None) -> tuple[int | None, int | None, float]:
    """The messages and bytes ``limits`` leave in ``window`` now (None: no limit; both 0
    once either is spent), and when the window resets."""
    if limits is None:
        return None, None, float("inf")
    if now is None:
        now = trio.current_time()
    msgs, size, until = window.allowance(*limits, now=now)
    if msgs == 0 or size == 0:
        return 0, 0, until
    return msgs, size, until
