"""Kafka topics and partitions over Magnetar topics.

A Kafka topic ``t`` is the partitioned topic ``persistent://{kafkaTenant}/{kafkaNamespace}/t``
and its partition N the topic ``t-partition-N``; a fully qualified name is accepted as
is. A Pulsar topic that is not partitioned shows to Kafka clients as one partition (0).

:class:`PartitionLog` is the Kafka view of one partition: offsets are broker indexes
(the high watermark is the managed ledger's next index, the log start the first index
still stored, raised by DeleteRecords: the ledgers wholly below it are then deleted from
storage once no subscription needs them), and reads go offset → position through the
native offset index, remembering where the previous read ended so that a consumer
reading on does not search again.

A message a Pulsar producer split into chunks (several entries, one per chunk) is one
Kafka record at the offset of its last chunk, holding the whole message; the offsets of
its other chunks are gaps, as compaction leaves them in a Kafka log (a fetch from one goes
on to the next record). See :meth:`PartitionLog.read`.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from core.broker import BrokerService, TopicNotFoundError
from core.format import MessageMetadata
from core.naming import InvalidNameError, TopicName
from core.storage import Entry, Position
from core.topic import PersistentTopic
from handlers.kafka import _configs, _mapping
from handlers.kafka._records import with_log_append_time

__all__ = ["DEFAULT_RETENTION_HOURS", "KafkaTopics", "PartitionLog", "ProducerState", "BatchCache"]

log = logging.getLogger(__name__)

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
DEFAULT_RETENTION_HOURS = 168
"""Kafka's default ``log.retention.hours``: a week."""
MAX_HINTS = 64
READ_CHUNK = 64
"""Most entries read from storage at once; fewer when entries are large (see
:meth:`PartitionLog.read`)."""
LOG_START_REFRESH_S = 1.0
CHUNK_LOOKBACK = 1000
"""How many entries of other messages may lie between the chunks of one chunked message
(chunks of several producers interleave): a message whose earlier chunks are not found
within its own chunk count plus this many entries before its last chunk is skipped."""
CHUNK_READ = 16
"""Entries read at once while looking back for the earlier chunks of a message (chunks are
up to ``maxMessageSize`` each)."""
_BASE_OFFSET = struct.Struct(">q")
_LAST_DELTA = struct.Struct(">i")
_GAP = _BASE_OFFSET
"""What the batch cache holds for an entry that gives a fetch no batch (a chunk of a
message other than its last, or a chunked message whose chunks are not all there): the
offset after the entry, 8 bytes (a record batch is at least 61)."""


def _next_offset(batch: bytes) -> int:
    """The offset after a record batch: its base offset plus its last offset delta, plus
    one (cached batches have contiguous offsets); or after a :data:`_GAP`."""
    if len(batch) == _GAP.size:
        return int(_GAP.unpack(batch)[0])
    return int(_BASE_OFFSET.unpack_from(batch, 0)[0]) + int(_LAST_DELTA.unpack_from(batch, 23)[0]) + 1


def _chunks_of(entries: list[tuple[Entry, MessageMetadata]], count: int) -> list[Entry] | None:
    """The chunks before the last of a message of ``count`` chunks, in chunk order, from
    the stored chunks of its uuid before its last (in log order), as a Pulsar consumer
    puts them together: chunk 0 starts the message (again, when its producer sent it
    again), a chunk already had is a duplicate and dropped, one out of order loses the
    message. None when they are not all there."""
    parts: list[Entry] | None = None
    for e, md in entries:
        if md.chunk_id == 0:
            parts = [e]
        elif parts is not None:
            if md.chunk_id == len(parts):
                parts.append(e)
            elif md.chunk_id > len(parts):
                parts = None
    return parts if parts is not None and len(parts) == count - 1 else None


CacheKey = tuple[str, bool, Position]
"""A cached batch's topic, whether it is served with log append times, and its entry."""


class BatchCache:
    """Encoded record batches by entry position, bounded in bytes (consumers reading the
    same data, or re-reading after a rebalance, are served without re-encoding)."""

    def __init__(self, max_bytes: int = 128 * 1024 * 1024):
        self.max_bytes = max_bytes
        self.size = 0
        self._items: OrderedDict[CacheKey, bytes] = OrderedDict()

    def get(self, key: CacheKey) -> bytes | None:
        v = self._items.get(key)
        if v is not None:
            self._items.move_to_end(key)
        return v

    def put(self, key: CacheKey, value: bytes) -> None:
        if len(value) > self.max_bytes // 4:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= len(old)
        self._items[key] = value
        self.size += len(value)
        while self.size > self.max_bytes:
            _, v = self._items.popitem(last=False)
            self.size -= len(v)


@dataclass
class ProducerState:
    """Idempotent-producer state of one producer id on one partition: its epoch, the
    last sequence accepted and the last few batches (for answering retries); and, as
    DescribeProducers reports them, the largest timestamp of its last batch and the
    transaction coordinator's epoch when a transaction of it last ended here (-1: none)."""

    epoch: int
    last_sequence: int
    # (first sequence, last sequence) -> the batch's Pending outcome (its base offset)
    recent: OrderedDict[tuple[int, int], Any] = field(default_factory=OrderedDict)
    # Read back from the log, which holds committed transactions only: a transactional
    # producer's aborted batches are missing from it, so its sequence may jump ahead.
    from_log: bool = False
    last_timestamp: int = -1
    coordinator_epoch: int = -1


class PartitionLog:
    def __init__(self, kafka_topic: str, partition: int, topic: PersistentTopic, owner: KafkaTopics):
        self.kafka_topic = kafka_topic
        self.partition = partition
        self.topic = topic
        self.owner = owner
        self.key = str(topic.name)
        self.hints: OrderedDict[int, Position] = OrderedDict()
        self.producers: dict[int, ProducerState] = {}
        self._log_start = 0
        self._log_start_at = 0.0
        self.avg_entry_size = 1024.0
        self.recovery: Any = None  # set while/after producer state is read back

    @property
    def log_append_time(self) -> bool:
        """Whether the topic's ``message.timestamp.type`` is LogAppendTime: Kafka clients
        are then shown each batch's broker publish time as its records' timestamp."""
        return self.topic.policies.get(_configs.TIMESTAMP_TYPE) == _configs.LOG_APPEND_TIME

    def cache_key(self, position: Position) -> CacheKey:
        return self.key, self.log_append_time, position

    def served(self, batch: bytes, publish_time: int) -> bytes:
        """``batch``, of an entry published at ``publish_time``, as a fetch returns it."""
        return with_log_append_time(batch, publish_time) if self.log_append_time and batch else batch

    # -- offsets ---------------------------------------------------------------------------

    def high_watermark(self) -> int:
        return self.topic.ml.next_index()

    def deleted_before(self) -> int:
        got = self.owner.broker.metadata.get(self.owner.log_start_path(self.topic.name))
        return int(json.loads(got[0])) if got else 0

    def log_start_offset(self, *, fresh: bool = False) -> int:
        now = time.monotonic()
        if fresh or now - self._log_start_at > LOG_START_REFRESH_S:
            first = None
            for info in self.topic.ml.ledgers():
                if int(info.get("entries", 0)) > 0:
                    first = int(info["firstIndex"])
                    break
            start = self.high_watermark() if first is None else first
            self._log_start = max(start, min(self.deleted_before(), self.high_watermark()))
            self._log_start_at = now
        return self._log_start

    def remember(self, offset: int, position: Position) -> None:
        self.hints[offset] = position
        self.hints.move_to_end(offset)
        while len(self.hints) > MAX_HINTS:
            self.hints.popitem(last=False)

    async def position_of(self, offset: int) -> Position | None:
        pos = self.hints.get(offset)
        if pos is not None:
            return pos
        return await self.topic.ml.find_by_index(offset)

    # -- reading ---------------------------------------------------------------------------

    async def read(self, offset: int, max_bytes: int, high_watermark: int, *,
                   min_one: bool = True) -> list[bytes]:
        """Record batches from the one holding ``offset`` on, at most ``max_bytes`` of
        them but, with ``min_one``, at least one batch when any is there, as a list to be
        written out back to back. Batches still cached are served from the cache, without
        reading storage.

        A chunked message (see :func:`_mapping.chunk_metadata`) is one batch, at its last
        chunk, built from all its chunks (:meth:`_chunked`); its other chunks give no
        batch, their offsets are gaps, and a read from one goes on to the next batch."""
        if offset >= high_watermark:
            return []
        pos = await self.position_of(offset)
        if pos is None:
            return []
        out: list[bytes] = []
        size = 0
        retried = False
        cache = self.owner.cache
        # chunks of messages not yet complete, read in this call: uuid -> (entry, metadata)
        chunks: dict[str, list[tuple[Entry, MessageMetadata]]] = {}

        def take(batch: bytes) -> bool:
            """Add ``batch`` if the byte budget has room for it (with ``min_one``, the
            first always fits)."""
            nonlocal size
            if len(batch) <= _GAP.size:
                return True  # an entry with no batch to serve (a gap)
            if (out or not min_one) and size + len(batch) > max_bytes:
                return False
            out.append(batch)
            size += len(batch)
            return True

        while size < max_bytes:
            cached = cache.get(self.cache_key(pos))
            if cached:
                if not take(cached):
                    break
                offset = _next_offset(cached)
                pos = Position(pos.ledger_id, pos.entry_id + 1)
                self.remember(offset, pos)
                if offset >= high_watermark:
                    break
                continue
            # Read about as many entries as the byte budget holds (entries may be a
            # megabyte each: reading 64 of them to return one would waste the read).
            want = int(min(READ_CHUNK, max(1, (max_bytes - size) // max(self.avg_entry_size, 1.0) + 1)))
            entries = await self.topic.ml.read_entries(pos, want)
            if entries:
                mean = sum(len(e.data) for e in entries) / len(entries)
                self.avg_entry_size = 0.8 * self.avg_entry_size + 0.2 * mean
            if not entries:
                if not out and not retried:
                    # The remembered position was past a ledger's end: search instead.
                    self.hints.pop(offset, None)
                    found = await self.topic.ml.find_by_index(offset)
                    retried = True
                    if found is None or found == pos:
                        break
                    pos = found
                    continue
                break
            last: Entry | None = None
            full = False
            for e in entries:
                if e.index >= offset:
                    batch = self._batch(e)
                    if batch is None:
                        batch = await self._chunked(e, chunks)
                    if not take(batch):
                        full = True
                        break
                last = e
                if size >= max_bytes:
                    full = True
                    break
            if last is None:
                break
            pos = Position(last.position.ledger_id, last.position.entry_id + 1)
            offset = last.index + 1
            self.remember(offset, pos)
            if full or offset >= high_watermark:
                break
        return out

    def _batch(self, e: Entry) -> bytes | None:
        """The batch of entry ``e`` (cached), a :data:`_GAP` or empty when it gives none;
        None when ``e`` is a chunk of a chunked message not converted yet (the native
        converter refuses chunks: only entries it refuses are looked at for one)."""
        key = self.cache_key(e.position)
        cache = self.owner.cache
        got = cache.get(key)
        if got is None:
            batch = _mapping.batch_from_entry(e.data, index=e.index, num_messages=e.num_messages,
                                              publish_time=e.publish_time, chunks=True)
            if batch is None:
                return None
            got = self.served(batch, e.publish_time)
            cache.put(key, got)
        return got

    async def _chunked(self, e: Entry, pending: dict[str, list[tuple[Entry, MessageMetadata]]]) -> bytes:
        """The batch of chunk entry ``e``, cached: a :data:`_GAP` for a chunk before the
        last (kept in ``pending``, by uuid, for the last chunk read after it in the same
        read); for the last chunk, the whole message as one record (offset ``e.index``).
        Its earlier chunks come from ``pending``, else from storage, looking back from
        ``e`` over at most its chunk count plus :data:`CHUNK_LOOKBACK` entries. A message
        whose chunks are not all found there (trimmed by retention, deleted by
        DeleteRecords, or too far back) is skipped: a gap, never a partial value."""
        md = _mapping.chunk_metadata(e.data)
        assert md is not None
        key = self.cache_key(e.position)
        count = md.num_chunks_from_msg
        if md.chunk_id != count - 1:
            pending.setdefault(md.uuid, []).append((e, md))
            got = _GAP.pack(e.index + 1)
        else:
            earlier = _chunks_of(pending.pop(md.uuid, []), count)
            if earlier is None:
                earlier = await self._earlier_chunks(e, md)
            if earlier is None:
                log.warning("%s: offset %d is the last chunk of message %s, whose earlier "
                            "chunks are gone or too far back: skipped", self.key, e.index, md.uuid)
                got = _GAP.pack(e.index + 1)
            else:
                got = self.served(_mapping.batch_from_chunks(
                    [c.data for c in earlier] + [e.data], index=e.index, publish_time=e.publish_time),
                    e.publish_time) or _GAP.pack(e.index + 1)
        self.owner.cache.put(key, got)
        return got

    async def _earlier_chunks(self, last: Entry, md: MessageMetadata) -> list[Entry] | None:
        """The chunks before ``last`` (the last chunk of the message ``md`` says) read
        back from storage, in chunk order; None when they are not all found."""
        ml = self.topic.ml
        count = md.num_chunks_from_msg
        floor = max(self.log_start_offset(), last.index - (count - 1) - CHUNK_LOOKBACK)
        found: list[tuple[Entry, MessageMetadata]] = []
        hi = last.index  # the entries with indexes below hi are still to look at
        want = count - 1  # most of the time the chunks are the entries right before
        while hi > floor:
            lo = max(floor, hi - want)
            pos = await ml.find_by_index(lo)
            entries = await ml.read_entries(pos, hi - lo) if pos is not None else []
            window: list[tuple[Entry, MessageMetadata]] = []
            for c in entries:
                if c.position >= last.position or c.index >= hi:
                    break
                cmd = _mapping.chunk_metadata(c.data)
                if cmd is not None and cmd.uuid == md.uuid and cmd.num_chunks_from_msg == count:
                    window.append((c, cmd))
            found[:0] = window
            # The latest chunk 0 before the last chunk starts the message: once it is
            # read, so is everything after it.
            if any(cmd.chunk_id == 0 for _, cmd in window) or not entries:
                break
            hi = min(lo, entries[0].index - entries[0].num_messages + 1)
            want = CHUNK_READ
        return _chunks_of(found, count)


class KafkaTopics:
    """Resolves Kafka topic names and keeps one :class:`PartitionLog` per open partition."""

    def __init__(self, broker: BrokerService, tenant: str, namespace: str, *,
                 retention_ms: int | None = DEFAULT_RETENTION_HOURS * 3_600_000):
        self.broker = broker
        self.tenant = tenant
        self.namespace = namespace
        # what a topic created here gets as its own retention.ms (None: nothing)
        self.retention_ms = retention_ms
        self.logs: dict[str, PartitionLog] = {}
        self.cache = BatchCache()

    def topic_name(self, kafka_name: str) -> TopicName:
        """The Magnetar topic of a Kafka topic name (InvalidNameError if illegal)."""
        if "://" in kafka_name or "/" in kafka_name:
            return TopicName.parse(kafka_name)
        if not kafka_name or len(kafka_name) > MAX_TOPIC_NAME or not _LEGAL.match(kafka_name) \
                or kafka_name in (".", ".."):
            raise InvalidNameError(f"Invalid Kafka topic name {kafka_name!r}")
        name = TopicName("persistent", self.tenant, self.namespace, kafka_name)
        if name.partition_index >= 0:
            # Kafka partition N of topic x is stored as x-partition-N: a Kafka topic of that
            # name would be another topic's partition.
            raise InvalidNameError(
                f"Invalid Kafka topic name {kafka_name!r}: a name ending in -partition-N names a "
                f"partition of topic {name.partitioned_topic.local_name!r} here")
        return name

    def kafka_name(self, name: TopicName) -> str:
        if name.tenant == self.tenant and name.namespace == self.namespace and name.persistent:
            return name.local_name
        return str(name)

    @staticmethod
    def log_start_path(name: TopicName) -> str:
        return f"/kafka/log-start/{name.storage_name}"

    def partition_count(self, name: TopicName) -> int:
        """Partitions of an existing topic; 0 when it does not exist."""
        n = self.broker.policies.partitions(name)
        if n:
            return n
        if self.broker.topic_exists(name):
            return 1
        return 0

    def auto_create_allowed(self, name: TopicName) -> bool:
        pol = self.broker.namespace_policies(name.namespace_name)
        allowed, _, _ = self.broker.auto_creation(pol)
        return bool(allowed)

    def default_partitions(self, name: TopicName) -> int:
        pol = self.broker.namespace_policies(name.namespace_name)
        _, _, count = self.broker.auto_creation(pol)
        return max(1, int(count))

    def create(self, name: TopicName, partitions: int) -> None:
        """Create the topic, with Kafka's retention as its own (``log.retention.hours``):
        consumer groups hold no subscription, so without it nothing past the current
        ledger would be kept for them. A new topic has no partition loaded yet, so the
        policy applies from their first opening."""
        self.check_limits(name, partitions, partitions)
        self.broker.policies.create_partitioned(name, partitions)
        if self.retention_ms is not None:
            ms = str(self.retention_ms)
            self.broker.policies.update_topic_policies(
                name, lambda p: _configs.apply(p, [("retention.ms", ms)]))

    def check_limits(self, name: TopicName, partitions: int, new_topics: int) -> None:
        """Refuse, as the broker refuses Pulsar's clients and admin API, ``partitions`` past
        ``maxNumPartitionsPerPartitionedTopic`` (PartitionCountError), and ``new_topics``
        more partitions past the namespace's topic quota (TopicQuotaError)."""
        self.broker.check_partition_count(partitions)
        self.broker.check_topic_quota(name, self.broker.namespace_policies(name.namespace_name), new_topics)

    async def ensure(self, kafka_name: str, *, create: bool) -> tuple[TopicName, int]:
        """(topic name, partition count); creates the topic when allowed and asked to."""
        name = self.topic_name(kafka_name)
        n = self.partition_count(name)
        if n == 0 and create and self.auto_create_allowed(name):
            try:
                self.create(name, self.default_partitions(name))
            except Exception:
                pass
            n = self.partition_count(name)
        return name, n

    def partition_name(self, name: TopicName, partition: int) -> TopicName:
        if self.broker.policies.partitions(name):
            return name.partition(partition)
        return name

    def cached_log(self, kafka_name: str, partition: int) -> PartitionLog | None:
        log = self.logs.get(f"{kafka_name}\x00{partition}")
        if log is not None and log.topic is self.broker.topics.get(log.key):
            return log
        return None

    async def log(self, kafka_name: str, partition: int, *, create: bool = True) -> PartitionLog:
        """The partition's log; TopicNotFoundError when the topic or partition is unknown."""
        log = self.cached_log(kafka_name, partition)
        if log is not None:
            return log
        name, n = await self.ensure(kafka_name, create=create)
        if not 0 <= partition < n:
            raise TopicNotFoundError(f"{kafka_name}-{partition} does not exist")
        topic = await self.broker.get_topic(self.partition_name(name, partition))
        log = PartitionLog(kafka_name, partition, topic, self)
        floor = log.deleted_before()
        if floor > 0:
            topic.ml.raise_trim_floor(floor)
        old = self.logs.get(f"{kafka_name}\x00{partition}")
        if old is not None:
            log.producers = old.producers
        self.logs[f"{kafka_name}\x00{partition}"] = log
        return log

    def all_topics(self) -> list[TopicName]:
        """Every topic of the Kafka namespace, partitioned topics once."""
        from core.naming import NamespaceName
        ns = NamespaceName(self.tenant, self.namespace)
        found: dict[str, TopicName] = {}
        for base in self.broker.policies.partitioned_topics(ns):
            t = TopicName.parse(base)
            found[str(t)] = t
        for full in self.broker.topics_of_namespace(ns):
            t = TopicName.parse(full)
            if t.partition_index >= 0 and str(t.partitioned_topic) in found:
                continue
            found.setdefault(str(t), t)
        return [found[k] for k in sorted(found)]

    async def trim_deleted(self, plog: PartitionLog) -> None:
        """Delete from storage the ledgers wholly below the partition's DeleteRecords
        offset, as soon as no subscription needs them any more. The offset stays the
        managed ledger's trim floor, so the broker's retention check retries what a
        subscription still held back (a failure here is logged: the log start itself is
        already recorded)."""
        try:
            floor = plog.deleted_before()
            if floor > 0:
                plog.topic.ml.raise_trim_floor(floor)
                await plog.topic.ml.trim()
                plog.log_start_offset(fresh=True)
        except Exception as exc:
            log.warning("kafka: trimming %s below its log start: %r", plog.key, exc)

    def forget(self, kafka_name: str) -> None:
        for key in [k for k in self.logs if k.split("\x00", 1)[0] == kafka_name]:
            del self.logs[key]

