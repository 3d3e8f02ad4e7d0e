"""Theory of operation: a persistent topic.

A topic owns its managed ledger, its producers and its subscriptions.

Publishing is grouped: ``publish`` queues the entry with a completion callback and returns;
one flusher task per topic hands everything queued to the native ledger in a single
``add_entries`` call and, when the batch is durable, runs the callbacks in order. So a
burst of sends from many producers costs one crossing into the native core and one
quorum write round, and receipts leave in publish order.

Deduplication (when enabled by broker config or namespace policy) keeps, per producer
name, the highest sequence id pushed and the highest persisted. A send whose sequence id is
not above the pushed one is a duplicate: it is answered without being stored. The map is
snapshotted into the metadata store every ``brokerDeduplicationEntriesInterval`` entries
and on close; on open, the snapshot is loaded and the entries written after it are re-read,
so the state after a crash is exactly what was persisted. A producer's state is dropped once
it has been disconnected for ``brokerDeduplicationProducerInactivityTimeoutMinutes`` (one
restored from a snapshot counts as disconnected from the open), and a snapshot keeps at
most ``brokerDeduplicationMaxNumberOfProducers``, as in Pulsar, so the state stays bounded
however many producer names come and go.
"""

from __future__ import annotations

import collections
import enum
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import trio

from core._throttle import RateWindow, rate_limits, window_allowance
from core.format import EntryFormatError, ack_set
from core.naming import TopicName
from core.policies import (
    INACTIVE_TOPIC_POLICIES,
    TOPIC_PROPERTIES_ROOT,
    ConflictError,
    PreconditionError,
    default_inactive_topic_policies,
)
from core.storage import (
    Cursor,
    Entry,
    ManagedLedger,
    Position,
    chunk_metadata,
    entry_metadata,
    last_confirmed_entry,
)
from core.subscription import Consumer, ConsumerBusyError, Subscription, SubType

if TYPE_CHECKING:
    from core.broker import BrokerService

__all__ = [
    "ProducerAccessMode",
    "Producer",
    "PersistentTopic",
    "topic_metadata_paths",
    "PublishResult",
    "NotAllowedError",
    "MessageTooLargeError",
    "EncryptionRequiredError",
    "ProducerBusyError",
    "ProducerFencedError",
    "TopicClosedError",
    "TopicTerminatedError",
    "BacklogQuotaExceededError",
    "BacklogQuota",
]

log = logging.getLogger(__name__)

DEDUP_SNAPSHOT_INTERVAL = 1000
DEDUP_PRODUCER_INACTIVITY_MINUTES = 360.0
#: The cursor compaction keeps on a topic (the name of Pulsar's compaction subscription).
COMPACTION_CURSOR = "__compaction"
MAX_PUBLISH_BATCH = 1000
MAX_PUBLISH_BATCHES_IN_FLIGHT = 4
"""Batches of publishes one topic has handed to its managed ledger and not yet seen stored.
A publish arriving while the ledger is busy starts at once instead of waiting for the
batch ahead of it (which, at a steady rate, waits half a store on average). A topic with
deduplication keeps one: a batch handed over after a failed one, before the topic has
learned of the failure, could be stored ahead of the producer's resend of the failed
messages, whose sequence ids would then look like duplicates."""
RESET_RECONNECT_GRACE = 60.0
"""Seconds a reader's subscription (non-durable) outlives its consumers after a seek
disconnected them: the reader subscribes again and must find the position it sought, not
start over where it first began. Unclaimed by then, it is dropped."""




class ProducerAccessMode(enum.IntEnum):
    """Pulsar's ProducerAccessMode numbers."""

    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


class NotAllowedError(PreconditionError):
    """An operation the topic does not allow: one that needs stored messages, asked of a
    non-persistent topic, or a subscription past the topic's limit (Pulsar's
    ``NotAllowedError``)."""


class MessageTooLargeError(NotAllowedError):
    """A message larger than the topic's ``maxMessageSize`` policy, or than one entry
    holds: one bookie frame (``nettyMaxFrameSizeBytes``) less the headers stored with it.
    Refused before it is stored, alone, as Pulsar refuses one over a topic's maximum
    message size (``NotAllowedError``)."""


class EncryptionRequiredError(Exception):
    """A producer that does not encrypt, on a topic whose policies require it (Pulsar
    answers MetadataError)."""


class ProducerBusyError(Exception):
    pass


class ProducerFencedError(Exception):
    pass


class TopicClosedError(Exception):
    pass


class TopicTerminatedError(Exception):
    """The topic was terminated: it takes no more messages."""


class BacklogQuotaExceededError(Exception):
    """A producer refused because the topic's backlog is over its quota; ``policy`` is
    ``producer_request_hold`` (the client may retry) or ``producer_exception``."""

    def __init__(self, message: str, policy: str):
        super().__init__(message)
        self.policy = policy


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    """The backlog quota in force on a topic: a size in bytes and an age in seconds
    (-1 for no limit) and what to do when either is exceeded."""

    limit_size: int
    limit_time: int
    policy: str


@dataclass(slots=True)
class PublishResult:
    """Where a published entry landed; ``position`` is None for a deduplicated send."""

    position: Position | None
    index: int = -1
    publish_time: int = 0
    error: BaseException | None = None


PublishCallback = Callable[[PublishResult], None]
#: Where the entries of a run were stored, one (ledger id, entry id, index, publish time)
#: row per entry, in order.
StoredRows = list[tuple[int, int, int, int]]
RunCallback = Callable[["PublishRun", "StoredRows | None", "BaseException | None"], None]


@dataclass(slots=True, eq=False)
class PublishRun:
    """Entries one producer published back to back (a read's run of SENDs, or a single
    publish), queued, stored and answered together, with no call per entry on the way.

    ``sequence_ids`` are what deduplication compares; ``context`` is the publisher's own,
    one item per entry. A run stored in two batches is split in two (:meth:`split`), each
    part keeping its own entries' items, and ``done(part, rows, None)`` is called once per
    part as it is stored (``done(part, None, error)`` when it failed), in publish order."""

    entries: list[bytes]
    num_messages: list[int]
    producer_name: str | None
    sequence_ids: list[int]
    context: list[Any]
    done: RunCallback

    def split(self, n: int) -> PublishRun:
        """Take the first ``n`` entries off this run, as a run of their own."""
        head = PublishRun(self.entries[:n], self.num_messages[:n], self.producer_name,
                          self.sequence_ids[:n], self.context[:n], self.done)
        del self.entries[:n], self.num_messages[:n], self.sequence_ids[:n], self.context[:n]
        return head


def _single(callback: PublishCallback) -> RunCallback:
    """The run callback of a single publish: its outcome as a :class:`PublishResult`."""

    def done(run: PublishRun, rows: StoredRows | None, error: BaseException | None) -> None:
        if rows is None:
            callback(PublishResult(None, error=error))
        else:
            ledger_id, entry_id, index, publish_time = rows[0]
            callback(PublishResult(Position(ledger_id, entry_id), index, publish_time))

    return done


@dataclass(eq=False)
class Producer:
    topic: PersistentTopic
    producer_id: int
    name: str
    access_mode: ProducerAccessMode
    on_fenced: Callable[[], None] | None = None
    msg_in: int = 0
    bytes_in: int = 0
    connected_since: float = field(default_factory=time.time)
    # what the client says of itself: its metadata, address and version (for the stats)
    metadata: dict[str, str] = field(default_factory=dict)
    address: str = ""
    client_version: str = ""
    # the topic epoch: one the client brings back when it reconnects, then the one it holds
    topic_epoch: int | None = None


# Where a persistent topic keeps its state in the metadata store besides its managed
# ledger and dedup state, one node under each root; deleting the topic deletes them.
TERMINATED_ROOT = "/terminated"
COMPACTION_ROOT = "/compaction"
REPLICATED_ROOT = "/replicated-subscriptions"
TOPIC_EPOCH_ROOT = "/topic-epoch"
_TOPIC_METADATA_ROOTS = (TERMINATED_ROOT, COMPACTION_ROOT, REPLICATED_ROOT, TOPIC_EPOCH_ROOT,
                         TOPIC_PROPERTIES_ROOT)


def _chunk_before_last(entry: bytes) -> bool:
    """Whether an entry is a chunk of a large message other than its last."""
    md = chunk_metadata(entry)
    return md is not None and md.chunk_id < md.num_chunks_from_msg - 1


def _metadata_path(root: str, name: TopicName) -> str:
    return f"{root}/{name.storage_name}"


def topic_metadata_paths(name: TopicName) -> list[str]:
    """The topic's metadata nodes (see above) that go with it when it is deleted."""
    return [_metadata_path(root, name) for root in _TOPIC_METADATA_ROOTS]


class PersistentTopic:
    def __init__(self, broker: BrokerService, name: TopicName, ml: ManagedLedger,
                 policies: dict[str, Any]):
        self.broker = broker
        self.name = name
        # The partition number (-1: not a partition), asked for per message.
        self.partition_index = name.partition_index
        self.ml = ml
        self.policies = policies
        self._dedup_decided_for: dict[str, Any] | None = None
        self._dedup = False
        self.producers: list[Producer] = []
        # Raised each time an exclusive producer takes the topic (PIP-68): a producer
        # that reconnects with an older epoch was fenced meanwhile. None until the first.
        self.topic_epoch: int | None = None
        self.subscriptions: dict[str, Subscription] = {}
        self._pending: collections.deque[PublishRun] = collections.deque()
        self._pending_entries = 0  # entries in the runs of _pending
        self._flush_wanted = trio.Event()
        # WaitForExclusive producers queued for the topic, first come first served: each
        # with the event set once it holds the topic (or gave up waiting)
        self._waiting_exclusive: collections.deque[tuple[Producer, trio.Event]] = collections.deque()
        #: Waiting producers an ExclusiveWithFencing producer fenced out, until told so.
        self._fenced_waiters: set[Producer] = set()
        # what removed subscriptions had dispatched (see ``dispatched``)
        self._msg_out_removed = self._bytes_out_removed = 0
        self._closed = False
        self.has_delayed_messages = False
        self.has_chunked_messages = False
        # The entries stored before this broker opened the topic may hold delayed messages
        # that no publish here announced (note_delayed): the dispatcher looks at the
        # delivery time of each up to the last of them, as a restarted Pulsar broker's
        # delayed-delivery tracker takes them in again.
        self.stored_before_open: Position | None = ml.last_confirmed()
        self.dedup_pushed: dict[str, int] = {}
        self.dedup_persisted: dict[str, int] = {}
        # producers with deduplication state that are not connected -> since when (ms)
        self._dedup_idle_since: dict[str, int] = {}
        self._dedup_snapshot_entries = int(broker.config.get("brokerDeduplicationEntriesInterval",
                                                             DEDUP_SNAPSHOT_INTERVAL))
        self._entries_since_snapshot = 0
        self.msg_in = 0
        self.bytes_in = 0
        self.last_publish_time = 0
        # when a producer or consumer last left, or an inactivity check last found the
        # topic in use (wall-clock ms): inactivity counts from this or the last publish
        self.last_active_ms = int(time.time() * 1000)
        self._entry_listeners: set[Callable[[], None]] = set()
        self.terminated_at: Position | None = None
        self._in_flight = 0  # batches handed to the ledger, not yet answered
        self._batch_done = trio.Event()
        self._compaction: dict[str, Any] | None = None
        # reader subscriptions a seek left without consumers -> the wait before dropping them
        self._awaiting_reader: dict[Subscription, trio.CancelScope] = {}
        # the last compacted view (kept positions, horizon, partial batches' ack sets):
        # kept when a compaction ends, loaded from the metadata store when first asked for
        # after a (re)load
        self._compacted: tuple[list[Position], Position, dict[Position, list[int]]] | None = None
        self._compacted_loaded = False
        # holds back retention from what the compacted view points into, and from the
        # messages after its horizon (Pulsar's __compaction subscription)
        self._compaction_cursor: Cursor | None = None
        self._compaction_sub: Subscription | None = None
        self._publish_window = RateWindow()
        self._publish_resume_at = 0.0
        self._dispatch_window = RateWindow()
        self.publish_rate_limited_times = 0
        self._nursery: trio.Nursery | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def dedup_path(self) -> str:
        return f"/dedup/{self.name.storage_name}"

    @property
    def dedup_enabled(self) -> bool:
        """The namespace/topic policy, else the broker's setting. Asked on every publish, so
        it is worked out once per policies object (the broker replaces the object when the
        policies change, and its own config is fixed)."""
        policies = self.policies
        if self._dedup_decided_for is not policies:
            pol = policies.get("deduplicationEnabled")
            self._dedup = bool(self.broker.config.get("brokerDeduplicationEnabled") if pol is None else pol)
            self._dedup_decided_for = policies
        return self._dedup

    @property
    def terminated_path(self) -> str:
        return _metadata_path(TERMINATED_ROOT, self.name)

    @property
    def topic_epoch_path(self) -> str:
        return _metadata_path(TOPIC_EPOCH_ROOT, self.name)

    @property
    def replicated_path(self) -> str:
        """Where the names of the topic's replicated subscriptions are kept (Pulsar keeps
        the mark as a property of each subscription's cursor)."""
        return _metadata_path(REPLICATED_ROOT, self.name)

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        got = self.broker.metadata.get(self.terminated_path)
        if got is not None:
            self.terminated_at = Position(*json.loads(got[0]))
        got = self.broker.metadata.get(self.topic_epoch_path)
        if got is not None:
            self.topic_epoch = int(json.loads(got[0]))
        await self._recover_dedup()
        for name in self.ml.cursor_names():
            if name == COMPACTION_CURSOR:
                self._compaction_cursor = await self.ml.open_cursor(name, True)
                continue
            await self._attach_subscription(name, SubType.Exclusive, earliest=True)
        got = self.broker.metadata.get(self.replicated_path)
        for name in json.loads(got[0]) if got is not None else []:
            if name in self.subscriptions:
                self.subscriptions[name].replicated = True
        nursery.start_soon(self._flusher)

    async def _recover_dedup(self) -> None:
        if not self.dedup_enabled:
            return
        snap = self.broker.metadata.get(self.dedup_path)
        start: Position | None = self.ml.first_position()
        if snap is not None:
            data = json.loads(snap[0])
            self.dedup_pushed = {k: int(v) for k, v in data.get("sequences", {}).items()}
            if data.get("position"):
                last = Position(*data["position"])
                start = Position(last.ledger_id, last.entry_id + 1)
        end = self.ml.last_confirmed()
        if start is not None and end is not None:
            await self._read_sequences(start, end)
        self.dedup_persisted = dict(self.dedup_pushed)
        now = int(time.time() * 1000)
        self._dedup_idle_since = dict.fromkeys(self.dedup_pushed, now)

    async def _read_sequences(self, start: Position, end: Position) -> None:
        """Take the sequence ids of the entries from ``start`` to ``end`` into the pushed ones."""
        pos = start
        while pos <= end:
            entries = await self.ml.read_entries(pos, 200)
            if not entries:
                break
            for e in entries:
                self._note_sequence(e)
            pos = Position(entries[-1].position.ledger_id, entries[-1].position.entry_id + 1)

    def _note_sequence(self, entry: Entry) -> None:
        try:
            md = entry_metadata(entry.data)
        except EntryFormatError:
            return
        if md.num_chunks_from_msg > 1 and md.chunk_id < md.num_chunks_from_msg - 1:
            return  # the message is stored once its last chunk is
        seq = md.highest_sequence_id if md.HasField("highest_sequence_id") and md.highest_sequence_id > md.sequence_id else md.sequence_id
        if seq > self.dedup_pushed.get(md.producer_name, -1):
            self.dedup_pushed[md.producer_name] = seq

    def _snapshot_dedup(self) -> None:
        last = self.ml.last_confirmed()
        sequences = self.dedup_persisted
        most = int(self.broker.config.get("brokerDeduplicationMaxNumberOfProducers", 10000))
        if len(sequences) > most:
            connected = {p.name for p in self.producers}
            kept = [n for n in sequences if n in connected]
            kept += [n for n in reversed(sequences) if n not in connected]
            sequences = {n: sequences[n] for n in kept[:most]}
        body = json.dumps({
            "position": [last.ledger_id, last.entry_id] if last else None,
            "sequences": sequences,
        }).encode()
        self.broker.metadata.put(self.dedup_path, body)
        self._entries_since_snapshot = 0

    def purge_inactive_dedup_producers(self, now_ms: int | None = None) -> list[str]:
        """Drop the deduplication state of the producers disconnected for longer than
        ``brokerDeduplicationProducerInactivityTimeoutMinutes`` (a snapshot follows);
        their names."""
        timeout_ms = float(self.broker.config.get("brokerDeduplicationProducerInactivityTimeoutMinutes",
                                                  DEDUP_PRODUCER_INACTIVITY_MINUTES)) * 60_000
        now = int(time.time() * 1000) if now_ms is None else now_ms
        gone = [name for name, since in self._dedup_idle_since.items() if now - since > timeout_ms]
        for name in gone:
            del self._dedup_idle_since[name]
            self.dedup_pushed.pop(name, None)
            self.dedup_persisted.pop(name, None)
        if gone:
            shown = ", ".join(gone[:10]) + (f" and {len(gone) - 10} more" if len(gone) > 10 else "")
            log.info("%s: deduplication state dropped for producer(s) %s, disconnected for over "
                     "%g minutes", self.name, shown, timeout_ms / 60_000)
            if self.dedup_enabled:
                self._snapshot_dedup()
        return gone

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush_wanted.set()
        while self._waiting_exclusive:  # their add_producer fails: the topic is closing
            self._waiting_exclusive.popleft()[1].set()
        for sub in self.subscriptions.values():
            sub.close()
            if sub.durable:
                await sub.cursor.flush()
        if self.dedup_enabled:
            self._snapshot_dedup()
        await self.ml.close()

    # -- producers ---------------------------------------------------------------------------------

    async def add_producer(self, producer: Producer, on_queued: Callable[[], None] | None = None) -> None:
        """Admit ``producer`` as its access mode allows. A WaitForExclusive producer that
        must wait is queued behind any others that wait, ``on_queued`` is called (a Pulsar
        session tells its client the producer is not ready yet), and this returns once it
        holds the topic; it fails if the topic closes or the producer is closed meanwhile."""
        if self._closed:
            raise TopicClosedError(f"Topic {self.name} is closing")
        if self.terminated_at is not None:
            raise TopicTerminatedError(f"Topic {self.name} was already terminated")
        exceeded = self.backlog_quota_exceeded()
        if exceeded is not None and exceeded.policy != "consumer_backlog_eviction":
            raise BacklogQuotaExceededError(
                f"Cannot create producer on topic with backlog quota exceeded ({exceeded.policy})",
                exceeded.policy)
        mode = producer.access_mode
        limit = self.limit("max_producers_per_topic", "maxProducersPerTopic")
        if limit and len(self.producers) >= limit:
            raise ProducerBusyError(f"Topic '{self.name}' reached max producers limit")
        if any(p.name == producer.name for p in self.producers):
            raise ProducerBusyError(f"Producer with name '{producer.name}' is already connected to topic")
        exclusive = [p for p in self.producers if p.access_mode != ProducerAccessMode.Shared]
        exclusive += [p for p, _ in self._waiting_exclusive]
        if mode == ProducerAccessMode.Shared:
            if exclusive:
                raise ProducerBusyError(
                    f"Topic has an exclusive producer '{exclusive[0].name}': no other producer allowed")
        elif mode == ProducerAccessMode.Exclusive:
            if self.producers:
                raise ProducerFencedError(
                    f"Topic has existing shared producers or an exclusive producer: {self.producers[0].name}")
        elif mode == ProducerAccessMode.ExclusiveWithFencing:
            # as Pulsar: the producers waiting for the topic are fenced out first, so that
            # none of them is handed the topic as the ones holding it are fenced
            while self._waiting_exclusive:
                waiter, granted = self._waiting_exclusive.popleft()
                self._fenced_waiters.add(waiter)
                granted.set()
            for p in list(self.producers):
                self.remove_producer(p)
                if p.on_fenced is not None:
                    p.on_fenced()
        elif mode == ProducerAccessMode.WaitForExclusive and (self.producers or self._waiting_exclusive):
            await self._wait_for_exclusive(producer, on_queued)
            return
        if mode == ProducerAccessMode.Shared:
            producer.topic_epoch = self.topic_epoch
        else:
            self._take_epoch(producer, fence=True)
        self.producers.append(producer)
        self._dedup_idle_since.pop(producer.name, None)

    def _take_epoch(self, producer: Producer, *, fence: bool) -> None:
        """An exclusive producer takes the topic: the epoch it brings back when it
        reconnects, else one more than the topic's, persisted. With ``fence``, one that
        brings back an older epoch than the topic's is refused: another producer took the
        topic since."""
        current = -1 if self.topic_epoch is None else self.topic_epoch
        asked = producer.topic_epoch
        if fence and asked is not None and asked < current:
            raise ProducerFencedError(
                f"Topic epoch has already moved. Current epoch: {current}, Producer epoch: {asked}")
        self.topic_epoch = producer.topic_epoch = current + 1 if asked is None else asked
        if self.name.persistent:
            self.broker.metadata.put(self.topic_epoch_path, json.dumps(self.topic_epoch).encode())

    async def _wait_for_exclusive(self, producer: Producer, on_queued: Callable[[], None] | None) -> None:
        waiting = (producer, trio.Event())
        self._waiting_exclusive.append(waiting)
        if on_queued is not None:
            on_queued()
        try:
            await waiting[1].wait()
        except BaseException:  # its connection went away: leave the queue, or the topic
            if waiting in self._waiting_exclusive:
                self._waiting_exclusive.remove(waiting)
            else:
                self.remove_producer(producer)
            raise
        if producer not in self.producers:
            if producer in self._fenced_waiters:
                self._fenced_waiters.discard(producer)
                raise ProducerFencedError("Fenced out")
            if self._closed:
                raise TopicClosedError(f"Topic {self.name} is closing")
            raise ProducerBusyError(f"Producer '{producer.name}' was closed while it waited")

    @property
    def waiting_producers(self) -> int:
        """WaitForExclusive producers queued for the topic."""
        return len(self._waiting_exclusive)

    def _hand_over_exclusive(self) -> None:
        """The topic has no producer: the first WaitForExclusive producer queued gets it."""
        if not self.producers and self._waiting_exclusive:
            producer, granted = self._waiting_exclusive.popleft()
            self._take_epoch(producer, fence=False)
            self.producers.append(producer)
            self._dedup_idle_since.pop(producer.name, None)
            granted.set()

    @property
    def encryption_required(self) -> bool:
        """Whether the namespace's (or the topic's) ``encryption_required`` policy is on:
        producers must say they encrypt, and every message must carry encryption keys."""
        return bool(self.policies.get("encryption_required"))

    def subscription_expiration_ms(self) -> int:
        """How long a durable subscription (on a non-persistent topic, a consumer's) may go
        unused before it is deleted (0: never):
        the topic's or namespace's ``subscription_expiration_time_minutes``, else the
        broker's ``subscriptionExpirationTimeMinutes``."""
        return self.limit("subscription_expiration_time_minutes",
                          "subscriptionExpirationTimeMinutes") * 60_000

    async def expire_inactive_subscriptions(self, now_ms: int | None = None) -> list[str]:
        """Delete the durable subscriptions that no consumer has used for the expiration
        time (none connected, and none joined, left, acknowledged, received or asked for
        messages since), as Pulsar's inactive subscription check does; their names."""
        limit = self.subscription_expiration_ms()
        if limit <= 0:
            return []
        now = int(time.time() * 1000) if now_ms is None else now_ms
        gone = []
        for name, sub in list(self.subscriptions.items()):
            if sub.durable and not sub.consumers and now - sub.last_active > limit:
                await self.unsubscribe(name)
                log.info("%s: subscription %s deleted after %d minutes unused",
                         self.name, name, limit // 60_000)
                gone.append(name)
        return gone

    def inactive_topic_policies(self) -> dict[str, Any]:
        """The topic's or its namespace's ``inactiveTopicPolicies``, else the broker's."""
        return self.policies.get(INACTIVE_TOPIC_POLICIES) or default_inactive_topic_policies(self.broker.config)

    def in_use(self, mode: str) -> bool:
        """Whether the topic is active for Pulsar's inactive topic ``mode``: a producer
        (or one waiting) in either; with ``delete_when_no_subscriptions`` any consumer or
        subscription (a compacted topic's ``__compaction`` included); with
        ``delete_when_subscriptions_caught_up`` a subscription with a backlog."""
        if self.producers or self._waiting_exclusive:
            return True
        if mode == "delete_when_subscriptions_caught_up":
            return any(sub.backlog() > 0 for sub in self.subscriptions.values())
        return bool(self.subscriptions) or self._compaction_sub is not None

    def inactive_past_limit(self, now_ms: int | None = None) -> dict[str, Any] | None:
        """The inactive topic policies when they say to delete the topic now: deletion
        while inactive is on, and the topic has not been in use (:meth:`in_use`), nor
        published to, for their ``maxInactiveDurationSeconds``. None otherwise; a topic
        found in use counts as active from now."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        policy = self.inactive_topic_policies()
        if self.in_use(str(policy.get("inactiveTopicDeleteMode"))):
            self.last_active_ms = now
            return None
        if not policy.get("deleteWhileInactive"):
            return None
        idle_since = max(self.last_active_ms, self.last_publish_time)
        return policy if now - idle_since >= int(policy.get("maxInactiveDurationSeconds") or 0) * 1000 else None

    def limit(self, policy: str, config_key: str, default: int = 0) -> int:
        """A count limit (0: none): the topic's or its namespace's ``policy``, else the
        broker's ``config_key`` (``default`` where the configuration lacks it)."""
        value = self.policies.get(policy)
        if value is None:
            value = self.broker.config.get(config_key, default)
        return int(value or 0)

    @property
    def auto_subscription_creation_allowed(self) -> bool:
        """Whether a durable subscription that does not exist yet may be created by a
        consumer subscribing (or by a producer's initial subscription): the topic's or its
        namespace's ``autoSubscriptionCreation`` override, else the broker's
        ``allowAutoSubscriptionCreation``."""
        override = self.policies.get("autoSubscriptionCreationOverride")
        if override:
            return bool(override.get("allowAutoSubscriptionCreation"))
        return bool(self.broker.config.get("allowAutoSubscriptionCreation", True))

    def check_subscription_type(self, sub_type: SubType) -> None:
        """Refuse a subscription type the topic's, its namespace's or the broker's
        ``subscriptionTypesEnabled`` leaves out, as Pulsar does."""
        config = self.broker.config
        if sub_type == SubType.Key_Shared and not config.get("subscriptionKeySharedEnable", True):
            raise NotAllowedError("Key_Shared subscription is disabled by broker.")
        enabled = self.policies.get("subscription_types_enabled") or \
            config.get("subscriptionTypesEnabled", [t.name for t in SubType])
        if sub_type.name not in enabled:
            raise NotAllowedError(f"Topic[{{{self.name}}}] doesn't support {sub_type.name} sub type!")

    def check_consumer_limits(self, subscription: str) -> None:
        """Refuse a consumer as Pulsar does when the topic has as many consumers as it may,
        or the subscription it joins has, or it would create a subscription past the
        topic's limit."""
        subs = self.subscriptions
        limit = self.limit("max_consumers_per_topic", "maxConsumersPerTopic")
        if limit and sum(len(s.consumers) for s in subs.values()) >= limit:
            raise ConsumerBusyError("Topic reached max consumers limit")
        sub = subs.get(subscription)
        if sub is None:
            limit = self.limit("max_subscriptions_per_topic", "maxSubscriptionsPerTopic")
            if limit and len(subs) >= limit:
                raise NotAllowedError(
                    f"Exceed the maximum number of subscriptions of the topic: {self.name}")
        else:
            limit = self.limit("max_consumers_per_subscription", "maxConsumersPerSubscription")
            if limit and len(sub.consumers) >= limit:
                raise ConsumerBusyError("Subscription reached max consumers limit")

    def remove_producer(self, producer: Producer) -> None:
        """A producer leaves the topic, or the queue of those waiting for it."""
        self.last_active_ms = int(time.time() * 1000)
        if producer in self.producers:
            self.producers.remove(producer)
            if producer.name in self.dedup_pushed:
                self._dedup_idle_since[producer.name] = self.last_active_ms
            self._hand_over_exclusive()
            return
        for waiting in self._waiting_exclusive:
            if waiting[0] is producer:
                self._waiting_exclusive.remove(waiting)
                waiting[1].set()  # its add_producer fails: it no longer waits
                return

    # -- publishing -----------------------------------------------------------------------------------

    @cached_property
    def max_entry_size(self) -> int:
        """The largest entry :meth:`publish` stores (see :class:`MessageTooLargeError`)."""
        return self.ml.max_entry_size

    def publish(self, entry: bytes, num_messages: int, producer_name: str | None,
                sequence_id: int, callback: PublishCallback, *, hold: bool = False,
                chunked: bool = False) -> None:
        """Queue one entry (Pulsar entry format) for storage; `callback` runs once it is
        durable, or failed, in publish order. With `hold`, the caller has more to publish
        in this step and calls :meth:`flush` once it is done (a session does, at the end of
        what it read): the entries go together, with no task woken to start them.

        An entry larger than :attr:`max_entry_size`, or one from a named producer larger
        than the topic's ``maxMessageSize`` policy, fails at once, with
        :class:`MessageTooLargeError`, ahead of what is still being stored (as Pulsar answers
        one over a topic's maximum message size); it is not stored and holds nothing up.

        ``chunked`` says the entry is a chunk of a large message. Every chunk of a message
        carries the message's sequence id, so deduplication (as Pulsar's) looks at the last
        chunk alone: the ones before it are stored as they come, and the consumer's client
        drops a chunk it already has."""
        if self._closed:
            callback(PublishResult(None, error=TopicClosedError(f"Topic {self.name} is closed")))
            return
        if self.terminated_at is not None:
            callback(PublishResult(None, error=TopicTerminatedError(f"Topic {self.name} was already terminated")))
            return
        if len(entry) > self.max_entry_size:
            callback(PublishResult(None, error=MessageTooLargeError(
                f"Exceed maximum message size: {len(entry)} bytes, more than the "
                f"{self.max_entry_size} one entry holds in a bookie frame "
                "(nettyMaxFrameSizeBytes)")))
            return
        limit = self.policies.get("max_message_size")
        if limit and producer_name is not None and len(entry) > limit and chunk_metadata(entry) is None:
            # Pulsar's PersistentTopic.publishMessage: the topic's maxMessageSize bounds
            # metadata and payload as a producer sent them; a chunk of a large message is
            # let through. A publish without a producer name is Kafka's, whose handler
            # bounds the record batch as Kafka measures it (max.message.bytes), not the
            # entry it becomes.
            callback(PublishResult(None, error=MessageTooLargeError("Exceed maximum message size")))
            return
        if producer_name is not None and self.dedup_enabled:
            if chunked and _chunk_before_last(entry):
                producer_name = None  # nothing to compare, nothing to record
            elif sequence_id <= self.dedup_pushed.get(producer_name, -1):
                callback(PublishResult(None))
                return
            else:
                self.dedup_pushed[producer_name] = sequence_id
        self._queue(PublishRun([entry], [num_messages], producer_name, [sequence_id], [None],
                               _single(callback)), hold)

    def publish_run(self, run: PublishRun, *, hold: bool = False) -> bool:
        """Queue a run of entries from one named producer as :meth:`publish` queues one
        each; False, with nothing queued, when one of them needs what only that does (a
        refusal to answer, deduplication, a ``max_message_size`` policy): the caller then
        publishes them one by one."""
        if (self._closed or self.terminated_at is not None or self.dedup_enabled
                or self.policies.get("max_message_size")
                or max(map(len, run.entries)) > self.max_entry_size):
            return False
        self._queue(run, hold)
        return True

    def _queue(self, run: PublishRun, hold: bool) -> None:
        self._pending.append(run)
        self._pending_entries += len(run.entries)
        if self._room() and not hold:
            self._flush_wanted.set()

    def flush(self) -> None:
        """Start storing what is queued now, unless as many batches as a topic may have in
        flight are being stored already (the first completion takes what queued meanwhile)."""
        if self._pending and self._room() and not self._flush_next():
            self._flush_wanted.set()  # the flusher waits out the rate window

    # Storing: up to MAX_PUBLISH_BATCHES_IN_FLIGHT batches of entries are in the ledger at
    # a time (one with deduplication), answered in the order they were handed over. While
    # there is room, a held publish's caller starts a batch (flush), or else the flusher
    # task does (after the current scheduler pass, so the publishes of that pass go
    # together); a batch's completion, called from the native drain, answers its publishes
    # and starts the next batch from what queued meanwhile, with no task woken in between.

    async def _flusher(self) -> None:
        while not self._closed or self._pending or self._in_flight:
            if not self._room() or not self._pending:
                await self._flush_wanted.wait()
                self._flush_wanted = trio.Event()
                continue
            if not self._flush_next():
                await trio.sleep_until(self._publish_resume_at)

    def _flush_next(self) -> bool:
        """Start storing the next batch; False when the publish rate policy holds it back
        (until ``_publish_resume_at``)."""
        batch = self._take_batch()
        if not batch:
            return False
        started = time.monotonic()
        self._in_flight += 1
        try:
            self.ml.start_add_entries([e for run in batch for e in run.entries],
                                      [n for run in batch for n in run.num_messages],
                                      lambda got: self._stored(batch, started, got))
        except Exception as exc:
            self._stored(batch, started, exc)
        return True

    def _stored(self, batch: list[PublishRun], started: float, results: StoredRows | BaseException) -> None:
        self._in_flight -= 1
        self._batch_done.set()
        try:
            if isinstance(results, BaseException):
                self._failed(batch, results)
            else:
                self._answer(batch, started, results)
        finally:
            self.flush()  # what queued meanwhile
            if self._closed and not self._in_flight:
                self._flush_wanted.set()  # the flusher ends once all is stored

    def _room(self) -> bool:
        """Whether another batch may go to the ledger now."""
        return self._in_flight < (1 if self.dedup_enabled else MAX_PUBLISH_BATCHES_IN_FLIGHT)

    def _failed(self, batch: list[PublishRun], exc: BaseException) -> None:
        log.warning("publish to %s failed: %s", self.name, exc)
        # What queued behind the failed entries fails with them, as the managed ledger fails
        # the adds it had queued behind them: a producer resends from its first failed
        # message on, in order, and nothing it sent after that may be stored ahead of the
        # resend.
        behind, self._pending, self._pending_entries = list(self._pending), collections.deque(), 0
        for run in batch + behind:
            pname = run.producer_name
            if pname is not None and self.dedup_pushed.get(pname) in run.sequence_ids:
                self.dedup_pushed[pname] = self.dedup_persisted.get(pname, -1)
            self._deliver(run, None, exc)

    def _answer(self, batch: list[PublishRun], started: float, rows: StoredRows) -> None:
        self.last_publish_time = int(time.time() * 1000)
        messages = size = at = 0
        persisted = self.dedup_persisted
        for run in batch:
            n = len(run.entries)
            messages += sum(run.num_messages)
            size += sum(map(len, run.entries))
            pname = run.producer_name
            if pname is not None:
                persisted[pname] = max(max(run.sequence_ids), persisted.get(pname, -1))
            self._deliver(run, rows[at:at + n], None)
            at += n
        if at != len(rows):
            log.error("%s: the ledger answered %d entries of %d", self.name, len(rows), at)
        self.msg_in += messages
        self.bytes_in += size
        self.broker.stats.record_publish(at, messages, size)
        self.broker.stats.record_publish_latency((time.monotonic() - started) * 1000.0)
        if self.dedup_enabled:
            self._entries_since_snapshot += at
            if self._entries_since_snapshot >= self._dedup_snapshot_entries:
                self._snapshot_dedup()
        for sub in self.subscriptions.values():
            sub.entries_stored()
        for listener in list(self._entry_listeners):
            listener()

    def _deliver(self, run: PublishRun, rows: StoredRows | None, error: BaseException | None) -> None:
        """Hand a run its outcome. One protocol's callback failing must not stop the
        topic's storing: the failure is logged and the flusher goes on."""
        try:
            run.done(run, rows, error)
        except Exception:
            log.exception("a publish callback on %s failed", self.name)

    def add_entry_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` each time new entries are durable (long-poll readers that do
        not go through a subscription wait on this)."""
        self._entry_listeners.add(listener)

    def remove_entry_listener(self, listener: Callable[[], None]) -> None:
        self._entry_listeners.discard(listener)

    def _take_batch(self) -> list[PublishRun]:
        """The next entries to store: up to MAX_PUBLISH_BATCH, and no more than the
        publish rate policy leaves in the current window (empty when it leaves none:
        the receipts, and so the producers, wait - Pulsar's publish throttling)."""
        n = min(self._pending_entries, MAX_PUBLISH_BATCH)
        limits = self.rate_policy("publishMaxMessageRate", "publishThrottlingRateInMsg",
                                  "publishThrottlingRateInByte", "maxPublishRatePerTopicInMessages",
                                  "maxPublishRatePerTopicInBytes")
        if limits is not None:
            msgs_left, bytes_left, until = self._publish_window.allowance(*limits, now=trio.current_time())
            take = msgs = size = 0
            queued = ((e, m) for run in self._pending for e, m in zip(run.entries, run.num_messages, strict=True))
            for entry, nmsg in itertools.islice(queued, n):
                over = (msgs_left is not None and msgs + nmsg > msgs_left) or \
                       (bytes_left is not None and size + len(entry) > bytes_left)
                # A window with any room left takes at least one entry, however large.
                if over and (take or msgs_left == 0 or bytes_left == 0):
                    break
                take += 1
                msgs += nmsg
                size += len(entry)
            if take == 0:
                self.publish_rate_limited_times += 1
                self._publish_resume_at = until
                return []
            self._publish_window.add(msgs, size)
            n = take
        batch = []
        pending = self._pending
        self._pending_entries -= n
        while n:
            run = pending[0]
            if len(run.entries) <= n:
                batch.append(pending.popleft())
                n -= len(run.entries)
            else:
                batch.append(run.split(n))
                n = 0
        return batch

    def dispatch_allowance(self) -> tuple[int | None, int | None, float]:
        """The messages and bytes the dispatch rate policy leaves in the current window for
        all of the topic's subscriptions (None: no limit), and when the window resets."""
        limits = self.rate_policy("topicDispatchRate", "dispatchThrottlingRateInMsg",
                                  "dispatchThrottlingRateInByte", "dispatchThrottlingRatePerTopicInMsg",
                                  "dispatchThrottlingRatePerTopicInByte")
        return window_allowance(self._dispatch_window, limits)

    def rate_policy(self, policy: str, msg_field: str, byte_field: str, config_msgs: str,
                    config_bytes: str) -> tuple[int, int, float] | None:
        """(max messages, max bytes, period) of a rate policy of the topic or its namespace,
        else of the broker's per-second keys ``config_msgs``/``config_bytes``; None when
        nothing limits."""
        value = self.policies.get(policy)
        if value is not None:
            return rate_limits(value, msg_field, byte_field)
        config = self.broker.config
        msgs, size = int(config.get(config_msgs, 0) or 0), int(config.get(config_bytes, 0) or 0)
        return (msgs, size, 1.0) if msgs > 0 or size > 0 else None

    def note_dispatched(self, messages: int, size: int) -> None:
        self._dispatch_window.add(messages, size)

    @property
    def delayed_delivery_enabled(self) -> bool:
        """Whether subscriptions hold messages back until their delivery time: the topic's
        or namespace's ``delayedDelivery`` policy, else the broker's
        ``delayedDeliveryEnabled`` (when off, they are delivered at once)."""
        pol = self.policies.get("delayed_delivery_policies")
        if isinstance(pol, dict) and "active" in pol:
            return bool(pol["active"])
        return bool(self.broker.config.get("delayedDeliveryEnabled"))

    @property
    def max_delivery_delay_ms(self) -> int:
        """The delayedDelivery policy's ``maxDeliveryDelayInMillis`` while delays are on: a
        message asking for a longer delay is refused (0: no limit)."""
        pol = self.policies.get("delayed_delivery_policies")
        if not self.delayed_delivery_enabled or not isinstance(pol, dict):
            return 0
        return int(pol.get("maxDeliveryDelayInMillis") or 0)

    def note_delayed(self) -> None:
        self.has_delayed_messages = True

    def note_chunked(self) -> None:
        """A chunk of a large message was published: Shared subscriptions look at the
        chunk fields of what they dispatch from now on (see Subscription._shared_target)."""
        self.has_chunked_messages = True

    # -- subscriptions ------------------------------------------------------------------------------------

    async def _attach_subscription(self, name: str, sub_type: SubType, *, earliest: bool) -> Subscription:
        cursor = await self.ml.open_cursor(name, earliest)
        sub = Subscription(self, name, cursor, sub_type)
        self.subscriptions[name] = sub
        assert self._nursery is not None
        self._nursery.start_soon(sub.run)
        return sub

    async def durable_subscription(self, name: str) -> Subscription:
        """The durable subscription `name`, created at the earliest position if missing; it
        may have no consumers (a position tracked on behalf of another protocol's client)."""
        if self._closed:
            raise TopicClosedError(f"Topic {self.name} is closing")
        sub = self.subscriptions.get(name)
        if sub is None:
            sub = await self._attach_subscription(name, SubType.Exclusive, earliest=True)
        return sub

    async def subscribe(self, name: str, consumer: Consumer, sub_type: SubType, *,
                        earliest: bool = False, durable: bool = True,
                        start: Position | None = None, replicated: bool = False) -> Subscription:
        """Attach ``consumer`` to the subscription ``name``, created if missing. A consumer
        asking for ``replicated`` marks a durable subscription replicated for good (as in
        Pulsar, a consumer that does not ask leaves the mark as it is)."""
        if self._closed:
            raise TopicClosedError(f"Topic {self.name} is closing")
        self.check_subscription_type(sub_type)
        self.check_consumer_limits(name)
        sub = self.subscriptions.get(name)
        if sub is None:
            if durable:
                sub = await self._attach_subscription(name, sub_type, earliest=earliest)
            else:
                if start is None:
                    last = self.ml.last_confirmed()
                    first = self.ml.first_position()
                    if earliest and first is not None:
                        start = first
                    elif last is not None:
                        start = Position(last.ledger_id, last.entry_id + 1)
                    else:
                        start = Position(0, 0)
                cursor = self.ml.new_non_durable_cursor(start)
                sub = Subscription(self, name, cursor, sub_type, durable=False)
                self.subscriptions[name] = sub
                assert self._nursery is not None
                self._nursery.start_soon(sub.run)
        sub.add_consumer(consumer, sub_type)
        if replicated and sub.durable and not sub.replicated \
                and self.broker.config.get("enableReplicatedSubscriptions", True):
            sub.replicated = True
            self._save_replicated()
        return sub

    def _save_replicated(self) -> None:
        names = sorted(n for n, s in self.subscriptions.items() if s.replicated)
        if names:
            self.broker.metadata.put(self.replicated_path, json.dumps(names).encode())
        elif self.broker.metadata.exists(self.replicated_path):
            self.broker.metadata.delete(self.replicated_path)

    def consumer_closed(self, consumer: Consumer, *, reset: bool = False) -> None:
        """A consumer is gone. A non-durable subscription goes with its last consumer, or,
        when ``reset`` (the broker disconnected it after moving the subscription), once its
        reader has had :data:`RESET_RECONNECT_GRACE` to come back."""
        sub = consumer.subscription
        if sub is None:
            return
        self.last_active_ms = int(time.time() * 1000)
        sub.remove_consumer(consumer)
        if sub.durable or sub.consumers:
            return
        if reset and self._nursery is not None:
            # one waiting task per subscription, however often its reader seeks
            grace = self._awaiting_reader.get(sub)
            if grace is None:
                grace = self._awaiting_reader[sub] = trio.CancelScope()
                self._nursery.start_soon(self._drop_when_unclaimed, sub, grace)
            grace.deadline = trio.current_time() + RESET_RECONNECT_GRACE
        else:
            self._drop_non_durable(sub)

    def _drop_non_durable(self, sub: Subscription) -> None:
        sub.close()
        if self.subscriptions.get(sub.name) is sub:
            self._remove_subscription(sub)

    def _remove_subscription(self, sub: Subscription) -> None:
        """Take ``sub`` off the topic; what it dispatched stays in the topic's counts."""
        self._msg_out_removed += sub.msg_out
        self._bytes_out_removed += sub.bytes_out
        del self.subscriptions[sub.name]

    @property
    def dispatched(self) -> tuple[int, int]:
        """The messages and bytes the topic's subscriptions have dispatched since it was
        loaded, those of subscriptions removed since included (as Pulsar's counters keep
        them): a counter that never goes down."""
        subs = self.subscriptions.values()
        return (self._msg_out_removed + sum(s.msg_out for s in subs),
                self._bytes_out_removed + sum(s.bytes_out for s in subs))

    async def _drop_when_unclaimed(self, sub: Subscription, grace: trio.CancelScope) -> None:
        with grace:  # its deadline moves with every seek
            await trio.sleep_forever()
        del self._awaiting_reader[sub]
        if not sub.consumers and self.subscriptions.get(sub.name) is sub:
            self._drop_non_durable(sub)

    async def unsubscribe(self, name: str) -> None:
        sub = self.subscriptions.get(name)
        if sub is not None and sub.consumers:
            raise ConsumerBusyError("Subscription has active connected consumers")
        if sub is not None:
            sub.close()
            self._remove_subscription(sub)
            if not sub.durable:
                return
            if sub.replicated:
                self._save_replicated()
        await self.ml.delete_cursor(name)

    # -- administration ---------------------------------------------------------------------------------

    async def create_subscription(self, name: str, start: Position | None, *, earliest: bool = False) -> Subscription:
        """A durable subscription with no consumer, its cursor at `start` (the next entry
        to deliver) or at the end (or the beginning when `earliest`)."""
        if self._closed:
            raise TopicClosedError(f"Topic {self.name} is closing")
        if name in self.subscriptions:
            raise ConflictError("Subscription already exists for topic")
        sub = await self._attach_subscription(name, SubType.Exclusive, earliest=earliest)
        if start is not None:
            await sub.reset_to(start)
        return sub

    async def terminate(self) -> Position:
        """Take no more messages, persistently; returns the last message's position
        (:func:`core.storage.last_confirmed_entry`)."""
        self.terminated_at = Position(-1, -1)  # refuse new sends while the queue drains
        with trio.fail_after(float(self.broker.config.get("bookkeeperClientTimeoutInSeconds", 30))):
            while self._pending or self._in_flight:
                self._batch_done = trio.Event()
                await self._batch_done.wait()
        self.terminated_at = last_confirmed_entry(self.ml.stats())
        self.broker.metadata.put(self.terminated_path,
                                 json.dumps([self.terminated_at.ledger_id, self.terminated_at.entry_id]).encode())
        for p in list(self.producers):
            self.remove_producer(p)
            if p.on_fenced is not None:
                p.on_fenced()
        self.wake_subscriptions()  # consumers that have read everything hear of the end now
        return self.terminated_at

    def wake_subscriptions(self) -> None:
        """Have every subscription's dispatcher look again at what it may send (the topic's
        policies or state changed)."""
        for sub in self.subscriptions.values():
            sub.wake()

    # Compaction: the latest message of each key, up to a horizon (Pulsar's topic
    # compaction). The compacted view is a list of entry positions kept in the metadata
    # store, and for a batch of which only some messages are kept, their indexes as an
    # ack set (set bits: the messages a compacted read delivers); a key whose latest
    # message has a null value is dropped, and so are messages without a key. Entries are
    # read in bounded batches.

    @property
    def compaction_path(self) -> str:
        return _metadata_path(COMPACTION_ROOT, self.name)

    def compaction_status(self) -> dict[str, Any]:
        """``{"status": NOT_RUN|RUNNING|SUCCESS|ERROR, "lastError": ...}`` plus the last
        run's figures."""
        if self._compaction is not None:
            return dict(self._compaction)
        got = self.broker.metadata.get(self.compaction_path)
        if got is None:
            return {"status": "NOT_RUN", "lastError": ""}
        data = json.loads(got[0])
        return {"status": "SUCCESS", "lastError": "", "removed": data.get("removed", 0),
                "succeededAt": data.get("timestamp", 0), "durationMs": data.get("durationMs", 0)}

    def bytes_since_compaction(self) -> int:
        """About how many bytes of entries were stored after the last compaction's horizon
        (all of the topic's, when it was never compacted): a ledger's share is its size
        times the share of its entries past the horizon."""
        view = self.compacted_view()
        horizon = view[1] if view is not None else None
        total = 0
        for info in self.ml.ledgers():
            lid, entries, size = int(info["ledgerId"]), int(info["entries"]), int(info["size"])
            if horizon is None or lid > horizon.ledger_id:
                total += size
            elif lid == horizon.ledger_id and entries > 0:
                after = max(0, entries - (horizon.entry_id + 1))
                total += size * after // entries
        return total

    def check_compaction(self) -> bool:
        """Start a compaction when the bytes stored since the last one pass the topic's or
        its namespace's ``compactionThreshold``, else the broker's
        ``brokerServiceCompactionThresholdInBytes`` (0: only on request), as Pulsar's
        compaction monitor does. Whether one was started."""
        threshold = self.limit("compaction_threshold", "brokerServiceCompactionThresholdInBytes")
        if threshold <= 0 or self._compaction_running:
            return False
        if self.bytes_since_compaction() <= threshold:
            return False
        log.info("compacting %s: past its compaction threshold of %d bytes", self.name, threshold)
        return self.start_compaction()

    @property
    def _compaction_running(self) -> bool:
        return self._compaction is not None and self._compaction.get("status") == "RUNNING"

    def start_compaction(self) -> bool:
        """Start compacting in the background; False when a run is already going."""
        if self._compaction_running:
            return False
        self._compaction = {"status": "RUNNING", "lastError": ""}
        assert self._nursery is not None
        self._nursery.start_soon(self._run_compaction)
        return True

    async def _run_compaction(self) -> None:
        try:
            # compactionServiceThreads topics at once; the others wait here, RUNNING
            async with self.broker.compaction_limiter:
                started = time.monotonic()
                positions, masks, removed, horizon = await self.compact()
        except Exception as exc:
            log.warning("compaction of %s failed: %s", self.name, exc)
            self._compaction = {"status": "ERROR", "lastError": str(exc), "failedAt": int(time.time() * 1000)}
            return
        duration = int((time.monotonic() - started) * 1000)
        self.broker.metadata.put(self.compaction_path, json.dumps({
            "horizon": [horizon.ledger_id, horizon.entry_id] if horizon else None,
            "positions": [[p.ledger_id, p.entry_id] for p in positions],
            "masks": [[p.ledger_id, p.entry_id, words] for p, words in masks.items()],
            "removed": removed, "timestamp": int(time.time() * 1000), "durationMs": duration,
        }).encode())
        # the view just stored is the one reads use from now on
        self._compacted = (positions, horizon, masks) if horizon is not None else None
        self._compacted_loaded = True
        try:
            if horizon is not None:
                await self._hold_compacted(positions[0] if positions else None, horizon)
        finally:
            # SUCCESS once the compaction cursor holds the view (and __compaction is listed)
            self._compaction = None

    async def _hold_compacted(self, first_kept: Position | None, horizon: Position) -> None:
        """Keep retention from trimming the entries the compacted view reads and those
        after its horizon: Pulsar copies the view into a ledger of its own and its
        compaction cursor holds the rest; here the view points into the topic's ledgers,
        so the compaction cursor stays just before the first entry the view keeps."""
        if self._compaction_cursor is None:
            self._compaction_cursor = await self.ml.open_cursor(COMPACTION_CURSOR, True)
        hold = horizon if first_kept is None or first_kept > horizon \
            else self.previous_position(first_kept)
        if hold is not None:
            self._compaction_cursor.mark_delete(hold)

    async def compact(self) -> tuple[list[Position], dict[Position, list[int]], int, Position | None]:
        """The compacted view up to the last entry now: (kept positions in order, the ack
        sets of batches kept in part, messages removed, horizon)."""
        from core.format import decode_entry, iter_batch

        horizon = self.ml.last_confirmed()
        pos = self.ml.first_position()
        # key -> (entry, index in its batch, messages in that batch)
        latest: dict[str, tuple[Position, int, int]] = {}
        # entries kept whole because the broker cannot open them (encrypted batches)
        opaque: set[Position] = set()
        # counted as Pulsar's compactor counts removed events: a message replacing its
        # key's, a tombstone (a null or empty value deletes its key), a message without key
        removed = 0

        def note(key: str | None, size: int, null: bool, where: tuple[Position, int, int]) -> None:
            nonlocal removed
            if key is None:
                removed += 1
            elif null or size <= 0:
                latest.pop(key, None)
                removed += 1
            elif latest.setdefault(key, where) is not where:
                latest[key] = where
                removed += 1

        while pos is not None and horizon is not None and pos <= horizon:
            entries = await self.ml.read_entries(pos, 200)
            if not entries:
                break
            for e in entries:
                if e.position > horizon:
                    break
                try:
                    metadata, payload = decode_entry(e.data)
                except EntryFormatError:
                    continue
                if len(metadata.encryption_keys):
                    # The key is in the clear: a single message is compacted by it (its size
                    # the one before compression and encryption, when the producer gave it);
                    # a batch cannot be split and is kept whole.
                    if metadata.HasField("num_messages_in_batch"):
                        opaque.add(e.position)
                    else:
                        size = metadata.uncompressed_size if metadata.HasField("uncompressed_size") \
                            else len(payload)
                        note(metadata.partition_key if metadata.HasField("partition_key") else None,
                             size, metadata.null_value, (e.position, 0, 1))
                    continue
                try:
                    singles = iter_batch(metadata, payload)
                except EntryFormatError:
                    continue
                for index, single in enumerate(singles):
                    meta = single.metadata
                    if meta.compacted_out:
                        continue
                    note(meta.partition_key if meta.HasField("partition_key") else None,
                         meta.payload_size, meta.null_value, (e.position, index, len(singles)))
            last = entries[-1].position
            pos = Position(last.ledger_id, last.entry_id + 1)
        kept: dict[Position, tuple[set[int], int]] = {p: ({0}, 1) for p in opaque}
        for p, index, size in latest.values():
            kept.setdefault(p, (set(), size))[0].add(index)
        masks = {p: ack_set(indexes, size) for p, (indexes, size) in kept.items()
                 if len(indexes) < size}
        return sorted(kept), masks, removed, horizon

    @property
    def compaction_subscription(self) -> Subscription | None:
        """The compactor's subscription (Pulsar's ``__compaction``) once the topic was
        compacted: its cursor, which holds what the compacted view reads. Admin lists and
        stats show it beside the topic's subscriptions; it is not among them, so that no
        consumer, acknowledgement, expiry or backlog eviction moves its cursor."""
        cursor = self._compaction_cursor
        if cursor is None:
            return None
        if self._compaction_sub is None or self._compaction_sub.cursor is not cursor:
            self._compaction_sub = Subscription(self, COMPACTION_CURSOR, cursor, SubType.Exclusive)
        return self._compaction_sub

    async def delete_compaction(self) -> None:
        """Drop the compacted view and the compactor's cursor, as deleting Pulsar's
        ``__compaction`` subscription deletes its compacted ledger with it: compacted reads
        read the whole topic until the next compaction, which starts afresh."""
        if self.broker.metadata.exists(self.compaction_path):
            self.broker.metadata.delete(self.compaction_path)
        self._compacted, self._compacted_loaded = None, True
        cursor, self._compaction_cursor, self._compaction_sub = self._compaction_cursor, None, None
        if cursor is not None:
            await self.ml.delete_cursor(COMPACTION_CURSOR)
        self.wake_subscriptions()

    def compacted_view(self) -> tuple[list[Position], Position, dict[Position, list[int]]] | None:
        """The last compaction's kept entries (in order), its horizon (the last entry it
        covered) and the ack sets of the batches it kept in part; None when the topic was
        never compacted (or was empty then)."""
        if not self._compacted_loaded:
            got = self.broker.metadata.get(self.compaction_path)
            data = json.loads(got[0]) if got is not None else {}
            horizon = data.get("horizon")
            self._compacted = None if horizon is None else (
                [Position(lid, eid) for lid, eid in data["positions"]], Position(*horizon),
                {Position(lid, eid): words for lid, eid, words in data.get("masks", [])})
            self._compacted_loaded = True
        return self._compacted

    def disconnect_all(self) -> None:
        """Ask every producer's and consumer's session to close it (clients reconnect)."""
        for p in list(self.producers):
            self.remove_producer(p)
            if p.on_fenced is not None:
                p.on_fenced()
        for sub in list(self.subscriptions.values()):
            sub.disconnect_consumers()

    def previous_position(self, pos: Position) -> Position | None:
        """The position of the entry just before `pos` (None if `pos` is the first)."""
        if pos.entry_id > 0:
            return Position(pos.ledger_id, pos.entry_id - 1)
        before = [int(info["ledgerId"]) for info in self.ml.ledgers()
                  if int(info["ledgerId"]) < pos.ledger_id and int(info["entries"]) > 0]
        if not before:
            return None
        lid = max(before)
        entries = next(int(i["entries"]) for i in self.ml.ledgers() if int(i["ledgerId"]) == lid)
        return Position(lid, entries - 1)

    def entries_between(self, after: Position, upto: Position) -> int:
        """How many entries lie in (after, upto]."""
        count = 0
        for info in self.ml.ledgers():
            lid, n = int(info["ledgerId"]), int(info["entries"])
            first = after.entry_id + 1 if lid == after.ledger_id else 0
            last = upto.entry_id if lid == upto.ledger_id else n - 1
            if after.ledger_id <= lid <= upto.ledger_id and last >= first:
                count += min(last, n - 1) - first + 1
        return count

    def backlog_quota(self) -> BacklogQuota:
        """The destination_storage quota: the namespace/topic policy, else the broker default."""
        quota = (self.policies.get("backlog_quota_map") or {}).get("destination_storage")
        age = (self.policies.get("backlog_quota_map") or {}).get("message_age") or {}
        if quota:
            size = int(quota.get("limitSize", quota.get("limit", -1)))
            policy = str(quota.get("policy") or "producer_request_hold")
        else:
            gb = float(self.broker.config.get("backlogQuotaDefaultLimitGB", -1.0))
            size = -1 if gb < 0 else int(gb * 1024 ** 3)
            policy = str(self.broker.config.get("backlogQuotaDefaultRetentionPolicy", "producer_request_hold"))
        limit_time = int(age.get("limitTime", -1)) if age else int((quota or {}).get("limitTime", -1))
        if age and not quota:
            policy = str(age.get("policy") or policy)
        return BacklogQuota(size, limit_time, policy)

    def backlog_bytes(self, sub: Subscription | None = None) -> int:
        """Estimated bytes held back by `sub` (default: the slowest durable subscription)."""
        subs = [sub] if sub is not None else [s for s in self.subscriptions.values() if s.durable]
        entries = max((s.backlog() for s in subs), default=0)
        if not entries:
            return 0
        st = self.ml.stats()
        n = int(st.get("number_of_entries") or 0)
        size = int(st.get("total_size") or 0)
        return entries * size // n if n else 0

    def backlog_quota_exceeded(self) -> BacklogQuota | None:
        """The quota, when the slowest subscription's backlog is over its size limit."""
        quota = self.backlog_quota()
        if quota.limit_size >= 0 and self.subscriptions and self.backlog_bytes() > quota.limit_size:
            return quota
        return None

    async def oldest_backlog_publish_time(self, sub: Subscription | None = None) -> int:
        """Publish time (ms) of the oldest unacknowledged entry, 0 when there is none."""
        subs = [sub] if sub is not None else [s for s in self.subscriptions.values() if s.durable]
        oldest = 0
        for s in subs:
            got = await s.unacked_entries(1)
            if got and (oldest == 0 or got[0].publish_time < oldest):
                oldest = got[0].publish_time
        return oldest

    async def enforce_backlog_quota(self) -> None:
        """What the periodic check does when the quota is exceeded: evict the oldest
        backlog (consumer_backlog_eviction) or disconnect producers, whose sessions then
        find producer creation refused until the backlog shrinks."""
        quota = self.backlog_quota()
        over = self.backlog_quota_exceeded() is not None
        if quota.limit_time > 0 and not over:
            oldest = await self.oldest_backlog_publish_time()
            over = oldest > 0 and time.time() * 1000 - oldest > quota.limit_time * 1000
        if not over:
            return
        if quota.policy == "consumer_backlog_eviction":
            for sub in list(self.subscriptions.values()):
                if not sub.durable:
                    continue
                if quota.limit_time > 0:
                    await sub.expire(quota.limit_time)
                if quota.limit_size >= 0:
                    st = self.ml.stats()
                    n = int(st.get("number_of_entries") or 0)
                    avg = max(1, int(st.get("total_size") or 0) // n) if n else 1
                    allowed = quota.limit_size // avg
                    extra = sub.backlog() - allowed
                    if extra > 0:
                        entries = await sub.unacked_entries(extra)
                        sub.ack_entries(None, [e.position for e in entries])
                        await sub.cursor.flush()
            return
        for p in list(self.producers):
            self.remove_producer(p)
            if p.on_fenced is not None:
                p.on_fenced()

    async def expire_messages(self) -> None:
        """Message TTL: expire, in every subscription, what is older than the TTL."""
        ttl = self.policies.get("message_ttl_in_seconds")
        if ttl is None:
            ttl = int(self.broker.config.get("ttlDurationDefaultInSeconds", 0))
        if not ttl or int(ttl) <= 0:
            return
        for sub in list(self.subscriptions.values()):
            await sub.expire(int(ttl))

    # -- stats --------------------------------------------------------------------------------------------

    def backlog_size(self) -> int:
        return max((s.backlog() for s in self.subscriptions.values() if s.durable), default=0)
