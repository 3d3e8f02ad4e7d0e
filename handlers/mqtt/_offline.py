"""The bound on what a persistent session queues while its client is away
(``mqttMaxQueuedMessages``).

Theory of operation
-------------------
While a persistent session's client is away its messages wait on the durable cursors of
its subscription (``mqtt:{client id}``). An :class:`OfflineQueue` stands in for the client
on those cursors: one consumer per topic, with permits enough to be sent every message
(a bound's worth per topic, plus one). It acknowledges nothing it keeps, so what it holds
is still on the cursors, durable, and comes back to the client, in order, when it
reconnects: closing the queue's consumers returns what they held to the subscription,
and the session's own consumers are sent it first. Once the queue holds more than the
bound, it acknowledges (drops) the oldest message that would be delivered at QoS 0, or,
when none is, the oldest at QoS 1 or 2; each drop gives the permit back. A message the
session would not be sent at all (no filter matches it any more, or No Local) is
acknowledged at once.

What it holds is in memory (at most the bound per session, plus one per topic), as
Mosquitto holds its ``max_queued_messages``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

import trio

from core.messaging import Received, Subscriber
from core.naming import TopicName
from core.storage import Position

__all__ = ["OfflineQueue"]

log = logging.getLogger(__name__)


class OfflineQueue:
    """Holds a persistent session's messages, up to ``bound``, while its client is away.

    ``qos_of(received)`` is the QoS the session would be sent a message at (None: it would
    not be sent it); ``dropped()`` is called for each message dropped for the bound."""

    def __init__(self, broker: object, client_id: str, bound: int,
                 qos_of: Callable[[Received], int | None], dropped: Callable[[], None]):
        self.bound = bound
        self._qos_of = qos_of
        self._dropped = dropped
        self._lock = trio.Lock()
        self._closed = False
        self._low: deque[Received] = deque()  # QoS 0, oldest first
        self._high: deque[Received] = deque()  # QoS 1 and 2, oldest first
        self._subscriber = Subscriber(broker, f"mqtt:{client_id}", self._received,
                                      window=bound + 1)

    def __len__(self) -> int:
        return len(self._low) + len(self._high)

    async def attach(self, names: Iterable[TopicName], start: Position | None = None) -> None:
        """Stand in for the client on ``names`` (a topic new to the session from ``start``)."""
        async with self._lock:
            for name in names:
                if self._closed:
                    return
                try:
                    await self._subscriber.attach(name, durable=True, start=start)
                except Exception as exc:
                    log.warning("mqtt: %s: no offline queue on %s: %s",
                                self._subscriber.subscription, name, exc)

    async def close(self) -> None:
        """Give everything held back to the subscriptions (unacknowledged), for the client."""
        async with self._lock:
            self._closed = True
            self._low.clear()
            self._high.clear()
            await self._subscriber.close()

    def _received(self, r: Received) -> None:
        if self._closed:
            return  # left unacknowledged: closing the consumer gives it back
        qos = self._qos_of(r)
        if qos is None:
            self._forget(r)
            return
        (self._low if qos == 0 else self._high).append(r)
        while len(self) > self.bound:
            self._forget((self._low or self._high).popleft())
            self._dropped()

    def _forget(self, r: Received) -> None:
        self._subscriber.ack(r)
        self._subscriber.flow(r)
