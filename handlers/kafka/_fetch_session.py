"""Theory of operation: incremental fetch sessions (KIP-227).

A Fetch request from v7 on carries ``session_id`` and ``session_epoch``. A client that
opens a session (epoch 0) sends its whole partition list once; the broker remembers it,
with each partition's fetch offset and the high watermark, last stable offset and log
start offset it last told the client. Later requests (epoch 1, 2, ...) name only the
partitions whose fetch position changed, plus ``forgotten_topics_data`` for those to drop,
and the response carries only the partitions with something new: records, an error, or a
moved high watermark, last stable offset or log start offset.

The request's (session id, epoch) pair chooses the context, as in Kafka's FetchManager:

    ======  ======  =================================================================
    id      epoch   meaning
    ======  ======  =================================================================
    0       -1      sessionless full fetch (what librdkafka always sends)
    X       -1      close session X, then a sessionless full fetch
    0 / X   0       (close X and) open a new session holding the request's partitions
    X       >0      incremental fetch in session X; an unknown X is
                    FETCH_SESSION_ID_NOT_FOUND, an unexpected epoch
                    INVALID_FETCH_SESSION_EPOCH
    ======  ======  =================================================================

The epoch the broker expects next goes 1, 2, ... and wraps from 2^31-1 back to 1.

:class:`FetchSessionCache` is bounded (``max.incremental.fetch.session.cache.slots``,
Kafka's default 1000; each session takes one slot). A new session that finds the cache
full evicts, like Kafka's, the least recently used session that has been idle at least
``min.incremental.fetch.session.eviction.ms`` (120 s), else the smallest session (the
least recently used of those) if it holds fewer partitions than the newcomer; when
neither exists the new session is not
created and the response carries session id 0, which tells the client to keep sending
full fetches. An evicted session's next incremental fetch gets FETCH_SESSION_ID_NOT_FOUND
and the client opens a new one.

This module is pure bookkeeping (no I/O, no trio); the time is passed in.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from handlers.kafka._errors import ErrorCode

__all__ = [
    "CachedPartition",
    "FetchSession",
    "FetchSessionCache",
    "FetchContext",
    "DEFAULT_CACHE_SLOTS",
    "DEFAULT_EVICTION_MS",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "full_fetch",
    "next_epoch",
]

DEFAULT_CACHE_SLOTS = 1000
"""Kafka's ``max.incremental.fetch.session.cache.slots`` default."""
DEFAULT_EVICTION_MS = 120_000
"""Kafka's ``min.incremental.fetch.session.eviction.ms`` default."""
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = 0x7FFFFFFF

Key = tuple[str, int]


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """A partition of a session: where the client reads from, and what it was last told
    (-1 until the first response, so a partition just added is always answered)."""

    fetch_offset: int
    max_bytes: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    sent_log_start_offset: int = -1

    def changed(self, part: Any) -> bool:
        """Whether the response partition ``part`` has news for the client; remembers
        what it tells."""
        news = bool(part.records) or part.error_code != 0 \
            or part.high_watermark != self.high_watermark \
            or part.last_stable_offset != self.last_stable_offset \
            or part.log_start_offset != self.sent_log_start_offset
        self.high_watermark = part.high_watermark
        self.last_stable_offset = part.last_stable_offset
        self.sent_log_start_offset = part.log_start_offset
        return news


@dataclass(eq=False, slots=True)
class FetchSession:
    session_id: int
    epoch: int
    last_used_ms: float
    partitions: OrderedDict[Key, CachedPartition] = field(default_factory=OrderedDict)

    def update(self, topics: list[Any], forgotten: list[Any]) -> None:
        """Apply an incremental request: add or update the named partitions, drop the
        forgotten ones."""
        for t in topics:
            for p in t.partitions:
                key = (t.topic, p.partition)
                cached = self.partitions.get(key)
                if cached is None:
                    self.partitions[key] = CachedPartition(p.fetch_offset, p.partition_max_bytes)
                else:
                    cached.fetch_offset = p.fetch_offset
                    cached.max_bytes = p.partition_max_bytes
        for t in forgotten:
            for index in t.partitions:
                self.partitions.pop((t.topic, index), None)


@dataclass(slots=True)
class FetchContext:
    """What one Fetch request reads and how its response is shaped.

    ``wanted`` lists (topic, partition, fetch offset, partition max bytes) in response
    order; ``session`` is None for a sessionless fetch; ``incremental`` filters the
    response down to changed partitions; ``error`` is a top-level error (nothing read).
    """

    wanted: list[tuple[str, int, int, int]]
    session: FetchSession | None = None
    incremental: bool = False
    error: int = 0

    @property
    def session_id(self) -> int:
        return self.session.session_id if self.session is not None else 0


def full_fetch(topics: list[Any]) -> list[tuple[str, int, int, int]]:
    return [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
            for t in topics for p in t.partitions]


class FetchSessionCache:
    def __init__(self, slots: int = DEFAULT_CACHE_SLOTS, eviction_ms: float = DEFAULT_EVICTION_MS,
                 rng: random.Random | None = None):
        self.slots = max(0, slots)
        self.eviction_ms = eviction_ms
        self.sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._rng = rng or random.Random()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.sessions)

    def context(self, session_id: int, epoch: int, topics: list[Any], forgotten: list[Any],
                now_ms: float) -> FetchContext:
        """The context of a Fetch request (v7+), per the table in the module docs."""
        if epoch == FINAL_EPOCH:
            self.sessions.pop(session_id, None)
            return FetchContext(full_fetch(topics))
        if epoch == INITIAL_EPOCH:
            self.sessions.pop(session_id, None)
            session = self._create(topics, now_ms)
            return FetchContext(full_fetch(topics), session)
        session = self.sessions.get(session_id)
        if session is None:
            return FetchContext([], error=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if epoch != session.epoch:
            return FetchContext([], error=ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        session.update(topics, forgotten)
        session.epoch = next_epoch(epoch)
        self._touch(session, now_ms)
        wanted = [(t, p, c.fetch_offset, c.max_bytes) for (t, p), c in session.partitions.items()]
        return FetchContext(wanted, session, incremental=True)

    def _touch(self, session: FetchSession, now_ms: float) -> None:
        session.last_used_ms = now_ms
        self.sessions.move_to_end(session.session_id)

    def _create(self, topics: list[Any], now_ms: float) -> FetchSession | None:
        size = sum(len(t.partitions) for t in topics)
        if len(self.sessions) >= self.slots and not self._evict_for(size, now_ms):
            return None
        session_id = 0
        while session_id == 0 or session_id in self.sessions:
            session_id = self._rng.randint(1, MAX_EPOCH)
        session = FetchSession(session_id, next_epoch(INITIAL_EPOCH), now_ms)
        session.update(topics, [])
        self.sessions[session_id] = session
        return session

    def _evict_for(self, size: int, now_ms: float) -> bool:
        if not self.sessions:
            return False
        victim = next((s for s in self.sessions.values()
                       if now_ms - s.last_used_ms >= self.eviction_ms), None)
        if victim is None:
            smallest = min(self.sessions.values(), key=lambda s: (len(s.partitions), s.last_used_ms))
            victim = smallest if len(smallest.partitions) < size else None
        if victim is None:
            return False
        del self.sessions[victim.session_id]
        self.evictions += 1
        return True

    def respond(self, ctx: FetchContext, responses: list[tuple[Key, Any]]) -> list[tuple[Key, Any]]:
        """The partitions of the response: all of a full fetch (a new session remembers
        what each was told), only the changed ones of an incremental fetch. Partitions
        that returned records move to the end of the session's order, so that the next
        fetch starts with the others (Kafka's round robin over a session)."""
        session = ctx.session
        if session is None:
            return responses
        out = []
        for key, part in responses:
            cached = session.partitions.get(key)
            if cached is None:
                continue
            if cached.changed(part) or not ctx.incremental:
                out.append((key, part))
            if part.records:
                session.partitions.move_to_end(key)
        return out
