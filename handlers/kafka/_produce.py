"""Produce (API key 0): record batches in, one entry per batch, offsets out.

Everything up to handing the entries to their topics runs in request order on the
connection's reader, so pipelined produce requests land in the order they were sent; the
wait for durability (acks 1 and all: the entry is acknowledged once the ledger's ack
quorum has it, which is Kafka's "all in-sync replicas") runs beside it. acks=0 gets no
response, as in Kafka.

Idempotence (KIP-98): per partition and producer id, the epoch and the last sequence are
kept. A batch continuing the sequence is stored; a retry of one of the last five batches is
answered with the offset the original got, without storing it again; anything else is
OUT_OF_ORDER_SEQUENCE_NUMBER, and an older epoch INVALID_PRODUCER_EPOCH. Transactional
batches are sequenced the same way; they are staged by the transaction coordinator and
written when the transaction commits.

DescribeProducers (API key 61, KIP-664) reports that state per partition: each producer
id's epoch, last sequence, the largest timestamp of its last batch and the coordinator
epoch of the last transaction marker Kafka would have written there. A transaction's
batches are not in the log until it commits, so no open transaction holds back the
partition's last stable offset and none has a start offset in the log: the current
transaction start offset is always -1.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from core.broker import NamespaceNotFoundError, TopicNotFoundError
from core.format import EntryFormatError
from core.naming import InvalidNameError
from core.storage import Entry, Position, entry_metadata
from core.topic import MessageTooLargeError, PublishResult
from handlers.kafka import _mapping
from handlers.kafka._access import CONSUME, PRODUCE, allowed, topic_error
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode
from handlers.kafka._records import RecordBatch, decode_batches, with_records
from handlers.kafka._session import Later
from handlers.kafka._topics import PartitionLog, ProducerState

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = ["handle_produce", "handle_describe_producers", "Pending",
           "check_sequence", "note_sequence", "SEQUENCE_MOD"]

log = logging.getLogger(__name__)

RECENT_BATCHES = 5
RECOVER_ENTRIES = 1024
_BASE = struct.Struct(">q")
SEQUENCE_MOD = 1 << 31


class Pending:
    """The outcome of one stored batch: its base offset (and, on a topic with
    ``message.timestamp.type=LogAppendTime``, its append time) or an error code, once
    known. Whoever waits on it either awaits :meth:`wait` or registers a callback, which
    runs where the outcome is set (no task of its own)."""

    __slots__ = ("base_offset", "log_append_time", "error", "finished", "_callbacks")

    def __init__(self) -> None:
        self.base_offset = -1
        self.log_append_time = -1
        self.error = 0
        self.finished = False
        self._callbacks: list[Callable[[], None]] | None = None

    def done(self, base_offset: int, error: int = 0, *, log_append_time: int = -1) -> None:
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        self.finished = True
        callbacks, self._callbacks = self._callbacks, None
        for cb in callbacks or ():
            cb()

    def add_callback(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` once the outcome is known: now, if it already is."""
        if self.finished:
            cb()
        elif self._callbacks is None:
            self._callbacks = [cb]
        else:
            self._callbacks.append(cb)

    async def wait(self) -> None:
        if not self.finished:
            event = trio.Event()
            self.add_callback(event.set)
            await event.wait()


Slot = tuple[str, int, int, list[Pending], PartitionLog | None]
"""A partition of a produce request: topic, partition, error, its batches, and its log."""


class ProduceReply(Later):
    """A produce response, complete when every batch of the request is stored: it is
    built in the callback of the last one to finish."""

    __slots__ = ("_slots", "_waiting", "_reply")

    def __init__(self, slots: list[Slot]):
        self._slots = slots
        self._waiting = 0
        self._reply: Callable[[Data], None] | None = None

    def then(self, reply: Callable[[Data], None]) -> None:
        self._reply = reply
        self._waiting = 1 + sum(len(pendings) for _, _, _, pendings, _ in self._slots)
        for _, _, _, pendings, _ in self._slots:
            for p in pendings:
                p.add_callback(self._one_done)
        self._one_done()

    def _one_done(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            assert self._reply is not None
            self._reply(self.body())

    def body(self) -> Data:
        by_topic: dict[str, list[Data]] = {}
        for name, index, error, pendings, plog in self._slots:
            # The partition's error, else the first of its batches'; its base offset and
            # log append time are its first batch's, and its log start offset (v5+) the
            # partition's once they are stored, as Kafka's (-1 with an error).
            error = error or next((p.error for p in pendings if p.error), 0)
            first = pendings[0] if pendings and not error else None
            by_topic.setdefault(name, []).append(Data(
                index=index, error_code=error, base_offset=first.base_offset if first else -1,
                log_append_time_ms=first.log_append_time if first else -1,
                log_start_offset=plog.log_start_offset() if first and plog else -1,
                record_errors=[],
                error_message=None))
        return Data(responses=[Data(name=n, partition_responses=ps) for n, ps in by_topic.items()],
                    throttle_time_ms=0)


def check_sequence(plog: PartitionLog, batch: RecordBatch) -> tuple[int, Pending | None]:
    """(error, original) for an idempotent batch: original is set for a retried batch."""
    pid, epoch = batch.producer_id, batch.producer_epoch
    first, last = batch.base_sequence, batch.last_sequence
    st = plog.producers.get(pid)
    if st is None:
        plog.producers[pid] = ProducerState(epoch, (first - 1) % SEQUENCE_MOD)
        return 0, None
    if epoch < st.epoch:
        return ErrorCode.INVALID_PRODUCER_EPOCH, None
    if epoch > st.epoch:
        if first != 0:
            return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
        st.epoch = epoch
        st.last_sequence = -1
        st.recent.clear()
        return 0, None
    original = st.recent.get((first, last))
    if original is not None:
        return 0, original
    if first != (st.last_sequence + 1) % SEQUENCE_MOD:
        return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
    return 0, None


def note_sequence(plog: PartitionLog, batch: RecordBatch, pending: Pending) -> None:
    st = plog.producers[batch.producer_id]
    st.last_sequence = batch.last_sequence
    # The batch's largest timestamp as stored: on a LogAppendTime topic, the append time.
    st.last_timestamp = int(time.time() * 1000) if plog.log_append_time else batch.max_timestamp
    st.recent[(batch.base_sequence, batch.last_sequence)] = pending
    while len(st.recent) > RECENT_BATCHES:
        st.recent.popitem(last=False)


def publish_batch(plog: PartitionLog, batch: RecordBatch, pending: Pending,
                  native: tuple[bytes, int, bool] | None = None, *, hold: bool = False) -> None:
    """Store one batch as one entry; ``pending`` completes with its base offset. ``native``
    is the entry the native core built for it (:func:`_mapping.native_entry`); without it,
    ``batch`` carries its decoded records. ``hold``: the caller flushes the topic once it
    has published the request's batches (:meth:`PersistentTopic.publish`)."""
    if native is not None:
        entry, n, contiguous = native
    else:
        n = len(batch.records)
        entry = _mapping.entry_from_batch(
            batch, publish_time=int(time.time() * 1000),
            producer_name=_mapping.producer_name_of(batch),
            sequence_id=max(batch.base_sequence, 0))
        contiguous = all(r[0] == i for i, r in enumerate(batch.records))

    def done(result: PublishResult) -> None:
        if result.error is not None:
            log.warning("kafka: storing a batch on %s failed: %s", plog.key, result.error)
            if batch.producer_id >= 0:
                st = plog.producers.get(batch.producer_id)
                if st is not None:
                    # What the producer sent after this batch failed with it (the topic
                    # fails what queued behind a failed write): it resends from here on.
                    # Failures come in order, so only the first of a run moves it back.
                    before = (batch.base_sequence - 1) % SEQUENCE_MOD
                    if (st.last_sequence - before) % SEQUENCE_MOD < SEQUENCE_MOD // 2:
                        st.last_sequence = before
                    st.recent.pop((batch.base_sequence, batch.last_sequence), None)
            too_large = isinstance(result.error, MessageTooLargeError)
            pending.done(-1, ErrorCode.MESSAGE_TOO_LARGE if too_large else ErrorCode.NOT_ENOUGH_REPLICAS)
            return
        base = result.index - n + 1
        pending.done(base, log_append_time=result.publish_time if plog.log_append_time else -1)
        if cacheable and result.position is not None:
            # Kafka consumers of this entry get the producer's own batch: only the base
            # offset (outside the CRC) changes, and, with log append times, the batch's
            # timestamp type and max timestamp.
            with memoryview(batch.raw) as raw:  # one copy, not a slice and a concatenation
                plog.owner.cache.put(plog.cache_key(result.position), plog.served(
                    b"".join((_BASE.pack(base), raw[8:])), result.publish_time))

    cacheable = bool(batch.raw) and not batch.is_transactional and contiguous
    plog.topic.publish(entry, n, None, 0, done, hold=hold)


def _prepare(batches: list[RecordBatch], limit: int
             ) -> list[tuple[RecordBatch, tuple[bytes, int, bool] | None]]:
    """Each batch with its natively built entry, or with its records decoded when the
    native core leaves it to Python. Every batch is checked before any is stored."""
    now = int(time.time() * 1000)
    out = []
    for batch in batches:
        native = _mapping.native_entry(batch, publish_time=now)
        if native is None:
            batch = with_records(batch, max_uncompressed_size=limit)
        out.append((batch, native))
    return out


async def recover_producers(plog: PartitionLog) -> None:
    """Read back the idempotent producers' last sequences from the partition's newest
    entries (at most :data:`RECOVER_ENTRIES`), so that a retry crossing a broker restart
    is still recognised. Each entry names its producer id and epoch and carries its first
    sequence number."""
    ml = plog.topic.ml
    hw = plog.high_watermark()
    start = max(plog.log_start_offset(fresh=True), hw - RECOVER_ENTRIES)
    if start >= hw:
        return
    pos = await ml.find_by_index(start)
    seen: dict[int, ProducerState] = {}
    newest: dict[int, Entry] = {}
    reads = 0
    while pos is not None and reads < RECOVER_ENTRIES // 64 + 1:
        entries = await ml.read_entries(pos, 64)
        reads += 1
        if not entries:
            if start >= hw:
                break
            # past the end of a ledger: continue in the next one
            pos = await ml.find_by_index(start)
            entries = await ml.read_entries(pos, 64) if pos is not None else []
            if not entries:
                break
        for e in entries:
            try:
                md = entry_metadata(e.data)
            except EntryFormatError:
                continue
            parts = md.producer_name.split("-")
            if len(parts) != 3 or parts[0] != "kafka":
                continue
            try:
                pid, epoch = int(parts[1]), int(parts[2])
            except ValueError:
                continue
            first = md.sequence_id
            last = (first + e.num_messages - 1) % SEQUENCE_MOD
            st = seen.get(pid)
            if st is None or epoch > st.epoch:
                st = seen[pid] = ProducerState(epoch, last, from_log=True)
            st.last_sequence = last
            newest[pid] = e
            done = Pending()
            done.done(e.index - e.num_messages + 1,
                      log_append_time=e.publish_time if plog.log_append_time else -1)
            st.recent[(first, last)] = done
            while len(st.recent) > RECENT_BATCHES:
                st.recent.popitem(last=False)
        last_pos = entries[-1].position
        pos = Position(last_pos.ledger_id, last_pos.entry_id + 1)
        start = entries[-1].index + 1
    for pid, st in seen.items():
        e = newest[pid]
        if plog.log_append_time:
            st.last_timestamp = e.publish_time
        else:
            try:
                st.last_timestamp = max(r.timestamp for r in
                                        _mapping.records_from_entry(e.data, e.publish_time))
            except (EntryFormatError, ValueError):
                st.last_timestamp = e.publish_time
        plog.producers.setdefault(pid, st)


async def recovered(plog: PartitionLog) -> None:
    """Return once the partition's producer state has been read back from its log
    (:func:`recover_producers`, run by the first caller)."""
    if plog.recovery is None:
        plog.recovery = trio.Event()
        try:
            await recover_producers(plog)
        finally:
            plog.recovery.set()
    elif not plog.recovery.is_set():
        await plog.recovery.wait()


async def handle_describe_producers(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """DescribeProducers: the producers with state on each partition asked about (see the
    module docs); a topic or partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION,
    as Kafka answers it."""
    topics = []
    for t in req.body.topics:
        partitions = []
        permitted = allowed(h, req, t.name, CONSUME)  # Kafka: READ on the topic
        for index in t.partition_indexes:
            res = Data(partition_index=index, error_code=0, error_message=None,
                       active_producers=[])
            partitions.append(res)
            if not permitted:
                res.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                plog = await h.topics.log(t.name, index, create=False)
                await recovered(plog)
            except (InvalidNameError, TopicNotFoundError, NamespaceNotFoundError):
                res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            except Exception as exc:
                res.error_code = topic_error(exc)
                continue
            res.active_producers = [
                Data(producer_id=pid, producer_epoch=st.epoch, last_sequence=st.last_sequence,
                     last_timestamp=st.last_timestamp, coordinator_epoch=st.coordinator_epoch,
                     current_txn_start_offset=-1)
                for pid, st in sorted(plog.producers.items())]
        topics.append(Data(name=t.name, partitions=partitions))
    return Data(throttle_time_ms=0, topics=topics)


async def handle_produce(h: KafkaProtocolHandler, req: RequestReceived) -> ProduceReply | None:
    body = req.body
    acks = body.acks
    txn_id = body.transactional_id
    max_size = h.max_message_size
    slots: list[Slot] = []
    for td in body.topic_data:
        permitted = allowed(h, req, td.name, PRODUCE)
        for pd in td.partition_data:
            if not permitted:
                slots.append((td.name, pd.index, ErrorCode.TOPIC_AUTHORIZATION_FAILED, [], None))
                continue
            error, pendings, plog = await _produce_partition(h, td.name, pd, acks, txn_id,
                                                             max_size)
            slots.append((td.name, pd.index, error, pendings, plog))
    if acks == 0:
        return None
    return ProduceReply(slots)


async def _produce_partition(h: KafkaProtocolHandler, topic: str, pd: Any, acks: int,
                             txn_id: str | None, max_size: int
                             ) -> tuple[int, list[Pending], PartitionLog | None]:
    if acks not in (0, 1, -1):
        return ErrorCode.INVALID_REQUIRED_ACKS, [], None
    records = pd.records
    if records is None:
        return ErrorCode.CORRUPT_MESSAGE, [], None
    if len(records) > max_size:
        return ErrorCode.MESSAGE_TOO_LARGE, [], None
    try:
        plog = await h.topics.log(topic, pd.index, create=h.auto_create_on_produce)
        limit = plog.topic.policies.get("max_message_size")
        if limit is not None and len(records) > limit:
            return ErrorCode.MESSAGE_TOO_LARGE, [], None
        batches = _prepare(decode_batches(records, max_uncompressed_size=h.max_uncompressed_size,
                                          records=False), h.max_uncompressed_size)
        await recovered(plog)
    except Exception as exc:
        return topic_error(exc), [], None
    try:
        return (*_publish_all(h, plog, batches, txn_id), plog)
    finally:
        plog.topic.flush()


def _publish_all(h: KafkaProtocolHandler, plog: PartitionLog,
                 batches: list[tuple[RecordBatch, tuple[bytes, int, bool] | None]],
                 txn_id: str | None) -> tuple[int, list[Pending]]:
    pendings: list[Pending] = []
    for batch, native in batches:
        if not batch.record_count:
            continue
        if batch.is_control:
            return ErrorCode.INVALID_RECORD, pendings
        if batch.is_transactional:
            if txn_id is None:
                return ErrorCode.INVALID_TXN_STATE, pendings
            error, pending = h.txns.stage(txn_id, plog, batch)
            if error:
                return error, pendings
            pendings.append(pending)
            continue
        original = None
        if batch.producer_id >= 0:
            error, original = check_sequence(plog, batch)
            if error:
                return error, pendings
        if original is not None:
            pendings.append(original)
            continue
        pending = Pending()
        if batch.producer_id >= 0:
            note_sequence(plog, batch, pending)
        publish_batch(plog, batch, pending, native, hold=True)
        pendings.append(pending)
    return 0, pendings
