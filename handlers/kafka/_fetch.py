"""Fetch (API key 1) and ListOffsets (API key 2).

Fetch is a long poll: when less than ``min_bytes`` is available the request waits, up to
``max_wait_ms``, on the partitions' topics, which call back the moment new entries are
durable (so a consumer sees a record about one storage round trip after it is produced,
not after the poll interval). Offsets are broker indexes; the offset → position lookup
goes through the native index. Transactions are written only when they commit, so the
last stable offset is the high watermark and a read_committed consumer has no aborted
transactions to skip.

From v7 a Fetch may run in an incremental fetch session (KIP-227, see
:mod:`handlers.kafka._fetch_session`): the session supplies the partitions and offsets,
and the response keeps only the partitions with news.

A partition that fails carries its error code and empty records, never null ones, as a
Kafka broker's does: librdkafka rejects the whole response over a null record set
("invalid MessageSetSize -1"), so the consumer would never see the error (and never reset
an out-of-range offset).

ListOffsets: -2 is the log start, -1 the high watermark, -3 (KIP-734, v7+) the record with
the largest timestamp, the earliest of those sharing it, found by reading the partition's
entries from the log start; any other value the first record from the log start on whose
timestamp is at or after it, found by publish time through the native time index and then
by record time among the entries from there. -4 (KIP-405, v8+) is the local log start,
which without tiered storage is the log start, and -5 (KIP-1005, v9+) the last tiered
offset, -1 when nothing is tiered, as a Kafka broker without remote storage answers. On a
topic with ``message.timestamp.type=LogAppendTime`` a record's time is its entry's publish
time, as fetched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import trio

from core.storage import Entry
from handlers.kafka import _mapping
from handlers.kafka._access import CONSUME, DESCRIBE, allowed, check, topic_error
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode
from handlers.kafka._fetch_session import FetchContext, full_fetch
from handlers.kafka._topics import PartitionLog

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = ["handle_fetch", "handle_list_offsets"]

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
TIMESTAMP_SCAN_ENTRIES = 256
MAX_WAIT_MS = 30_000


async def handle_fetch(h: KafkaProtocolHandler, req: RequestReceived
                       ) -> Data | Callable[[], Awaitable[Data]]:
    body = req.body
    if req.api_version >= 7:
        ctx = h.fetch_sessions.context(body.session_id, body.session_epoch, body.topics,
                                       body.forgotten_topics_data, trio.current_time() * 1000.0)
    else:
        ctx = FetchContext(full_fetch(body.topics))
    if ctx.error:
        return Data(throttle_time_ms=0, error_code=ctx.error, session_id=0, responses=[])
    max_wait = min(max(body.max_wait_ms, 0), MAX_WAIT_MS) / 1000.0
    min_bytes = max(body.min_bytes, 0)
    max_bytes = body.max_bytes if body.max_bytes > 0 else 0x7FFFFFFF

    async def run() -> Data:
        deadline = trio.current_time() + max_wait
        logs: dict[tuple[str, int], PartitionLog | BaseException] = {}
        for topic, partition, _, _ in ctx.wanted:
            try:
                check(h, req, topic, CONSUME)
                logs[(topic, partition)] = await h.topics.log(topic, partition, create=False)
            except Exception as exc:
                logs[(topic, partition)] = exc
        topics = {id(v.topic): v.topic for v in logs.values() if isinstance(v, PartitionLog)}
        while True:
            woken = trio.Event()
            for t in topics.values():
                t.add_entry_listener(woken.set)
            try:
                parts, total, errors = await _fetch_once(ctx.wanted, logs, max_bytes)
                if total >= min_bytes or errors or trio.current_time() >= deadline:
                    return _response(ctx.session_id, h.fetch_sessions.respond(ctx, parts))
                with trio.move_on_at(deadline):
                    await woken.wait()
            finally:
                for t in topics.values():
                    t.remove_entry_listener(woken.set)

    return run


def _response(session_id: int, parts: list[tuple[tuple[str, int], Data]]) -> Data:
    responses: dict[str, list[Data]] = {}
    for (topic, _), part in parts:
        responses.setdefault(topic, []).append(part)
    return Data(throttle_time_ms=0, error_code=0, session_id=session_id,
                responses=[Data(topic=t, partitions=ps) for t, ps in responses.items()])


async def _fetch_once(wanted: list[tuple[str, int, int, int]],
                      logs: dict[tuple[str, int], PartitionLog | BaseException],
                      max_bytes: int) -> tuple[list[tuple[tuple[str, int], Data]], int, bool]:
    out: list[tuple[tuple[str, int], Data]] = []
    total = 0
    errors = False
    for topic, partition, offset, partition_max_bytes in wanted:
        plog = logs[(topic, partition)]
        part = Data(partition_index=partition, error_code=0, high_watermark=-1,
                    last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                    preferred_read_replica=-1, records=[])
        out.append(((topic, partition), part))
        if not isinstance(plog, PartitionLog):
            part.error_code = topic_error(plog)
            errors = True
            continue
        hw = plog.high_watermark()
        start = plog.log_start_offset()
        part.high_watermark = hw
        part.last_stable_offset = hw
        part.log_start_offset = start
        part.aborted_transactions = []
        if offset < start or offset > hw:
            start = plog.log_start_offset(fresh=True)
            part.log_start_offset = start
            if offset < start or offset > hw:
                part.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                errors = True
                continue
        # KIP-74: the limits are soft only for the first batch of the first partition with
        # any; after it, a batch that does not fit the rest of either is not returned.
        budget = min(partition_max_bytes, max_bytes - total)
        if budget <= 0 and total > 0:
            continue
        try:
            data = await plog.read(offset, max(budget, 1), hw, min_one=total == 0)
        except Exception as exc:
            part.error_code = topic_error(exc)
            errors = True
            continue
        part.records = data
        total += sum(map(len, data))
    return out, total, errors


async def handle_list_offsets(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    out = []
    for t in req.body.topics:
        parts = []
        permitted = allowed(h, req, t.name, DESCRIBE)
        for p in t.partitions:
            if not permitted:
                parts.append(Data(partition_index=p.partition_index,
                                  error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, old_style_offsets=[],
                                  timestamp=-1, offset=-1, leader_epoch=-1))
                continue
            parts.append(await _list_one(h, t.name, p.partition_index, p.timestamp, req.api_version))
        out.append(Data(name=t.name, partitions=parts))
    return Data(throttle_time_ms=0, topics=out)


async def _list_one(h: KafkaProtocolHandler, topic: str, partition: int, ts: int,
                    version: int) -> Data:
    res = Data(partition_index=partition, error_code=0, old_style_offsets=[], timestamp=-1,
               offset=-1, leader_epoch=0)
    try:
        plog = await h.topics.log(topic, partition, create=False)
        hw = plog.high_watermark()
        if ts == EARLIEST or (ts == EARLIEST_LOCAL and version >= 8):
            res.offset = plog.log_start_offset(fresh=True)
        elif ts == LATEST_TIERED and version >= 9:
            res.leader_epoch = -1
        elif ts == LATEST:
            res.offset = hw
        elif ts == MAX_TIMESTAMP:
            found = await _max_timestamp(plog, plog.log_start_offset(fresh=True), hw)
            if found is not None:
                res.offset, res.timestamp = found
        elif ts >= 0:
            found = await _first_at_or_after(plog, ts, plog.log_start_offset(fresh=True), hw)
            if found is not None:
                res.offset, res.timestamp = found
        else:
            res.error_code = ErrorCode.INVALID_REQUEST
    except Exception as exc:
        res.error_code = topic_error(exc)
    return res


def _records_of(plog: PartitionLog, e: Entry) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of a stored entry: with log append times, the
    entry's publish time."""
    append_time = plog.log_append_time
    chunk = _mapping.chunk_metadata(e.data)
    if chunk is not None:
        # a chunked message is one record, at its last chunk's offset (the others are gaps)
        if chunk.chunk_id == chunk.num_chunks_from_msg - 1:
            yield e.index, e.publish_time if append_time else (chunk.event_time or e.publish_time)
        return
    base = e.index - e.num_messages + 1
    for rec in _mapping.records_from_entry(e.data, e.publish_time):
        yield base + rec.offset_delta, e.publish_time if append_time else rec.timestamp


async def _entries_from(plog: PartitionLog, start: int, hw: int) -> AsyncIterator[Entry]:
    """The stored entries holding offsets ``start`` up to ``hw``, read
    :data:`TIMESTAMP_SCAN_ENTRIES` at a time, from one ledger into the next."""
    ml = plog.topic.ml
    while start < hw:
        pos = await ml.find_by_index(start)
        entries = await ml.read_entries(pos, TIMESTAMP_SCAN_ENTRIES) if pos is not None else []
        if not entries:
            return
        for e in entries:
            yield e
        start = entries[-1].index + 1


async def _first_at_or_after(plog: PartitionLog, ts: int, start: int,
                             hw: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record in [start, hw) with timestamp >= ts: from
    the first entry published at or after ts (a record is not stored before it is made)
    on. Records below the log start (deleted by DeleteRecords) are not candidates."""
    pos = await plog.topic.ml.find_by_publish_time(ts)
    first = await plog.topic.ml.read_entries(pos, 1) if pos is not None else []
    if not first:
        return None
    begin = max(start, first[0].index - first[0].num_messages + 1)
    async for e in _entries_from(plog, begin, hw):
        for offset, rec_ts in _records_of(plog, e):
            if begin <= offset < hw and rec_ts >= ts:
                return offset, rec_ts
    return None


async def _max_timestamp(plog: PartitionLog, start: int, hw: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the record in [start, hw) with the largest timestamp, the
    earliest if several share it (KIP-734). Record times are not indexed, so this reads
    every entry."""
    best: tuple[int, int] | None = None
    async for e in _entries_from(plog, start, hw):
        for offset, rec_ts in _records_of(plog, e):
            if start <= offset < hw and (best is None or rec_ts > best[1]):
                best = offset, rec_ts
    return best
