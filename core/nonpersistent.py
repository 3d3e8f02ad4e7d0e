"""Theory of operation: non-persistent topics (``non-persistent://tenant/ns/topic``).

Nothing is stored. ``publish`` hands the entry at once to every subscription and answers
the producer straight away; there is no ledger, no cursor, no backlog and nothing survives
an unload or a restart.

Each subscription picks the consumer by the same rules as a persistent one (the shared
``Subscription._assign``: the active consumer for Exclusive and Failover, the next consumer
with permits for Shared, the owner of the key's hash for Key_Shared). Where a persistent
subscription would keep an entry for later (no permits, no consumer), a non-persistent one
drops it and counts the messages (Pulsar's ``msgDropRate``). Nothing waits for an
acknowledgement, so acknowledgements and redelivery requests are accepted and ignored, and
Key_Shared keeps no per-key hold between deliveries.

A consumer's subscription outlives its consumers, as in Pulsar: it stays listed (and
drops what is published while no consumer is connected) until it is unsubscribed, its
inactivity expiry deletes it, or the topic is unloaded. A reader's (non-durable)
subscription goes with its reader. Operations that need stored messages - seek, last message id, terminate,
compaction, a subscription created without a consumer - raise :class:`NotAllowedError`.

Every message carries the message id ``0:0`` (ledger 0, entry 0) in receipts and
deliveries, as Pulsar's brokers send for non-persistent topics.

Example (inside a running broker)::

    topic = await broker.get_topic(TopicName.parse("non-persistent://public/default/t"))
    await topic.subscribe("s", consumer, SubType.Shared)
    topic.publish(entry_bytes, 1, "producer-1", 0, on_receipt)   # delivered now, or dropped
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import trio

from core.naming import TopicName
from core.storage import Cursor, Entry, ManagedLedger, Position
from core.subscription import Consumer, Subscription, SubType
from core.topic import (
    NotAllowedError,
    PersistentTopic,
    PublishCallback,
    PublishResult,
    PublishRun,
    TopicClosedError,
)

if TYPE_CHECKING:
    from core.broker import BrokerService

__all__ = ["NonPersistentTopic", "NonPersistentSubscription", "NotAllowedError", "NON_PERSISTENT_POSITION"]

#: The message id of every non-persistent message (receipts and deliveries).
NON_PERSISTENT_POSITION = Position(0, 0)


class _NoLedger(ManagedLedger):
    """The storage face of a topic that stores nothing: empty, and every statistic zero."""

    def __init__(self, bridge: Any, name: str):
        super().__init__(bridge, None)
        self._name = name
        #: Entries published since the topic was loaded (Pulsar's ``entriesAddedCounter``
        #: of a non-persistent topic counts them though it keeps none).
        self.entries_added = 0

    @property
    def name(self) -> str:
        return self._name

    async def add_entries(self, entries: list[bytes], num_messages: list[int]) -> list[tuple[Position, int, int]]:
        raise NotAllowedError("A non-persistent topic stores no entries")

    async def read_entries(self, start: Position, max_entries: int) -> list[Entry]:
        return []

    async def wait_entries_after(self, position: Position) -> None:
        raise NotAllowedError("A non-persistent topic stores no entries")

    async def open_cursor(self, name: str, earliest: bool) -> Cursor:
        raise NotAllowedError("A non-persistent topic has no cursors")

    def new_non_durable_cursor(self, start: Position) -> Cursor:
        raise NotAllowedError("A non-persistent topic has no cursors")

    async def delete_cursor(self, name: str) -> None:
        return None

    def cursor_names(self) -> list[str]:
        return []

    def last_confirmed(self) -> Position | None:
        return None

    def first_position(self) -> Position | None:
        return None

    def next_index(self) -> int:
        return 0

    async def find_by_index(self, index: int) -> Position | None:
        return None

    async def find_by_publish_time(self, publish_time_ms: int) -> Position | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"total_size": 0, "number_of_entries": 0, "entries_added": self.entries_added,
                "current_ledger_entries": 0,
                "current_ledger_size": 0, "last_confirmed": None, "next_index": 0, "status": "Open"}

    def ledgers(self) -> list[dict[str, Any]]:
        return []

    async def trim(self) -> None:
        return None

    def raise_trim_floor(self, floor: int) -> None:
        return None

    async def check_rollover(self) -> bool:
        return False

    async def close(self) -> None:
        return None

    async def delete(self) -> None:
        return None


class _NoCursor(Cursor):
    """The position of a subscription that keeps none: nothing to read, nothing to ack."""

    def __init__(self, bridge: Any, name: str):
        super().__init__(bridge, None)
        self._name = name
        self._properties: dict[str, str] = {}

    @property
    def name(self) -> str:
        return self._name

    async def read_entries(self, max_entries: int) -> list[Entry]:
        return []

    def mark_delete(self, position: Position) -> None:
        return None

    def delete(self, positions: list[Position]) -> None:
        return None

    def set_batch_acks(self, acks: list[tuple[Position, list[int]]]) -> None:
        return None

    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    async def set_properties(self, properties: dict[str, str]) -> None:
        self._properties = dict(properties)  # kept while the topic is loaded, like the rest

    def batch_acks(self) -> dict[Position, list[int]]:
        return {}

    def rewind(self) -> None:
        return None

    def seek(self, position: Position) -> None:
        raise NotAllowedError("Seek is not allowed on a non-persistent topic")

    async def reset(self, position: Position) -> None:
        raise NotAllowedError("Seek is not allowed on a non-persistent topic")

    def mark_delete_position(self) -> Position:
        return Position(-1, -1)

    def read_position(self) -> Position:
        return Position(-1, -1)

    def individually_deleted(self) -> list[tuple[Position, Position]]:
        return []

    def backlog(self) -> int:
        return 0

    def has_more(self) -> bool:
        return False

    async def flush(self) -> None:
        return None


class NonPersistentSubscription(Subscription):
    """A subscription whose entries are pushed by the topic as they are published; an
    entry no consumer can take now is dropped (counted in ``msg_dropped``)."""

    def __init__(self, topic: NonPersistentTopic, name: str, sub_type: SubType, *, durable: bool = True):
        super().__init__(topic, name, _NoCursor(topic.broker.bridge, name), sub_type, durable=durable)
        self.msg_dropped = 0

    def _unacked_limits(self) -> tuple[int, int]:
        # Nothing is kept for redelivery here, so nothing counts against a limit.
        return 0, 0

    def push(self, entry: Entry) -> bool:
        """Deliver `entry` to a consumer chosen by the subscription type, within its
        permits; returns False when it was dropped."""
        if self._closed:
            return False
        self.replay.clear()
        # from_replay=1: the entry is handed over now (no delayed delivery, as in Pulsar).
        sent = self._assign([entry], 1)
        # Nothing waits for an ack: forget what was delivered, and what could not be.
        self.replay.clear()
        for c in self.consumers:
            c.unacked.clear()
        self._hash_owner.clear()
        if not sent:
            self.msg_dropped += entry.num_messages
        return sent

    async def run(self) -> None:
        # Entries are pushed by the topic; there is nothing to read.
        return None

    def ack_individual(self, consumer: Consumer | None, acks: list[tuple[Position, list[int] | None]]) -> None:
        return None

    def ack_cumulative(self, consumer: Consumer | None, pos: Position) -> None:
        return None

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        return None

    async def reset_to(self, pos: Position) -> None:
        raise NotAllowedError("Seek is not allowed on a non-persistent topic")

    def backlog(self) -> int:
        return 0

    async def unacked_entries(self, limit: int) -> list[Entry]:
        return []

    async def skip(self, messages: int) -> int:
        return 0

    async def clear_backlog(self) -> int:
        return 0

    async def expire(self, seconds: float) -> int:
        return 0


class NonPersistentTopic(PersistentTopic):
    """A topic that stores nothing. It keeps the producer rules (access modes, limits,
    names) and the consumer surface of :class:`PersistentTopic`; publishing and
    subscriptions work as the module docstring describes."""

    def __init__(self, broker: BrokerService, name: TopicName, policies: dict[str, Any]):
        self._ledger = _NoLedger(broker.bridge, name.storage_name)
        super().__init__(broker, name, self._ledger, policies)
        #: Messages some subscription could not take (each subscription's share is its
        #: own ``msg_dropped``), since the topic was loaded.
        self.msg_dropped = 0

    @property
    def dedup_enabled(self) -> bool:
        return False

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in self.subscriptions.values():
            sub.close()

    def publish(self, entry: bytes, num_messages: int, producer_name: str | None,
                sequence_id: int, callback: PublishCallback, *, hold: bool = False,
                chunked: bool = False) -> None:
        """Hand the entry to every subscription now and answer at once (so there is never
        anything for :meth:`flush` to start); a chunk like any entry (nothing here
        deduplicates)."""
        if self._closed:
            callback(PublishResult(None, error=TopicClosedError(f"Topic {self.name} is closed")))
            return
        callback(PublishResult(NON_PERSISTENT_POSITION, -1, self._push(entry, num_messages)))

    def publish_run(self, run: PublishRun, *, hold: bool = False) -> bool:
        """Hand each entry of ``run`` to every subscription now, as :meth:`publish` does,
        and answer them together; False on a closed topic (whose refusal :meth:`publish`
        answers)."""
        if self._closed:
            return False
        ledger_id, entry_id = NON_PERSISTENT_POSITION
        rows = [(ledger_id, entry_id, -1, self._push(entry, n))
                for entry, n in zip(run.entries, run.num_messages, strict=True)]
        run.done(run, rows, None)
        return True

    def _push(self, entry: bytes, num_messages: int) -> int:
        """Deliver one entry to the subscriptions that take it now; its publish time."""
        now = int(time.time() * 1000)
        self.msg_in += num_messages
        self.bytes_in += len(entry)
        self._ledger.entries_added += 1
        self.last_publish_time = now
        self.broker.stats.record_publish(1, num_messages, len(entry))
        item = Entry(NON_PERSISTENT_POSITION, now, -1, num_messages, entry)
        for sub in list(self.subscriptions.values()):
            if isinstance(sub, NonPersistentSubscription) and not sub.push(item):
                self.msg_dropped += num_messages
        return now

    async def subscribe(self, name: str, consumer: Consumer, sub_type: SubType, *,
                        earliest: bool = False, durable: bool = True,
                        start: Position | None = None, replicated: bool = False) -> Subscription:
        """Attach `consumer`, creating the subscription if it has none yet: kept after its
        last consumer leaves unless not `durable` (a reader's). `earliest`, `start` and
        `replicated` mean nothing here (only what is published from now on is delivered,
        and nothing of it is replicated)."""
        if self._closed:
            raise TopicClosedError(f"Topic {self.name} is closing")
        self.check_subscription_type(sub_type)
        self.check_consumer_limits(name)
        sub = self.subscriptions.get(name)
        if sub is None:
            sub = NonPersistentSubscription(self, name, sub_type, durable=durable)
            self.subscriptions[name] = sub
        try:
            sub.add_consumer(consumer, sub_type)
        except Exception:
            if not sub.consumers:
                self.subscriptions.pop(name, None)
                sub.close()
            raise
        return sub

    async def durable_subscription(self, name: str) -> Subscription:
        raise NotAllowedError("A non-persistent topic has no durable subscriptions")

    async def create_subscription(self, name: str, start: Position | None, *, earliest: bool = False) -> Subscription:
        raise NotAllowedError("Create subscription on non-persistent topic can only be done through client")

    async def terminate(self) -> Position:
        raise NotAllowedError("Termination of a non-persistent topic is not allowed")

    def start_compaction(self) -> bool:
        raise NotAllowedError("Compaction is not allowed on a non-persistent topic")

    async def compact(self) -> tuple[list[Position], dict[Position, list[int]], int, Position | None]:
        return [], {}, 0, None

    def compacted_view(self) -> None:
        return None

    def backlog_quota_exceeded(self) -> None:
        return None

    async def enforce_backlog_quota(self) -> None:
        return None

    async def expire_messages(self) -> None:
        return None
