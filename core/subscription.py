"""Theory of operation: subscriptions, consumers and dispatch.

A subscription is a durable cursor on the topic's managed ledger plus the consumers
attached to it. One trio task per subscription moves entries from storage to consumers:

* Consumers grant *permits* (a message count) through ``flow``; nothing is sent beyond them,
  so what a session buffers for a consumer is bounded by what that consumer asked for.
* The task first re-sends the *replay set* (entries that were redelivered, nacked, left
  unacknowledged by a consumer that went away, held back for a key, or whose delivery
  time has come), then reads new entries from the cursor.
* Which consumer gets an entry depends on the subscription type: the one active consumer
  (Exclusive, Failover), the next consumer with permits (Shared), or the consumer that
  owns the entry's key hash (Key_Shared). Shared takes turns among the consumers of the
  highest priority (lowest ``priority_level``) that have permits.
* Key_Shared keeps per-key order when consumers join or leave by tracking, per key hash,
  how many messages are delivered and not yet acknowledged. An entry whose hash is still
  held by a different consumer waits in the replay set until those messages are acked or
  redelivered; entries of other keys flow on, so one slow consumer never stalls keys it
  does not own. The replay set knows the key hash of each entry in it, and a new entry
  whose key has one waiting there waits behind it. When no entry the replay set offers can
  go (their consumers are slow, or no consumer's range covers them), the dispatcher reads
  on past them, as Pulsar's does, until the replay set holds
  ``keySharedLookAheadMsgInReplayThresholdPerConsumer`` messages per consumer (at most
  ``...PerSubscription``).
* How much one pass reads (``dispatcherMaxReadBatchSize``, ``dispatcherMaxReadSizeBytes``)
  and the look-ahead limits are broker settings that may change while the broker runs
  (dynamic configuration): each pass reads them anew, so a change applies to every
  subscription from its next pass.
* Entries whose ``deliver_at_time`` is in the future wait in a timer heap (delayed
  delivery works on every subscription type).
* On Shared and Key_Shared subscriptions, a consumer holding
  ``maxUnackedMessagesPerConsumer`` unacknowledged messages gets nothing more until its
  acknowledgements (or redeliveries) bring it down to half of that, and the subscription
  as a whole stops in the same way at ``maxUnackedMessagesPerSubscription`` (each also a
  namespace and topic policy; 0 turns it off), as Pulsar blocks them.

Acknowledgements go to the cursor (individual deletes or a cumulative mark-delete); the
cursor persists them. Batch-index acknowledgements (an ``ack_set`` whose set bits are the
messages still unacknowledged) are kept here until the whole entry is acknowledged, and
the cursor persists them too, so that after a restart only the messages of a batch not
acknowledged come again.
"""

from __future__ import annotations

import bisect
import enum
import functools
import heapq
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import trio
from sortedcontainers import SortedSet

from core._throttle import RateWindow, window_allowance
from core.format import EntryFormatError, MessageMetadata
from core.hashing import KEY_HASH_RANGE, key_hash, murmur3_32
from core.storage import Cursor, Entry, Position, entry_metadata
from core.writes import write_batch

if TYPE_CHECKING:
    from core.topic import PersistentTopic

__all__ = [
    "SubType",
    "Delivery",
    "ConsumerSink",
    "Consumer",
    "Subscription",
    "ConsumerAssignError",
    "ConsumerBusyError",
    "SubscriptionTypeMismatchError",
]

log = logging.getLogger(__name__)

READ_LIMITS = (("dispatcherMaxReadBatchSize", 100), ("dispatcherMaxReadSizeBytes", 5 << 20))
"""(broker config key, default) of the most entries, and bytes, a dispatch reads at once."""
_LAST_POSITION = Position(2**63 - 1, 2**63 - 1)
_BEFORE_FIRST = Position(-1, -1)
LOOK_AHEAD_LIMITS = (("keySharedLookAheadMsgInReplayThresholdPerConsumer", 2000),
                     ("keySharedLookAheadMsgInReplayThresholdPerSubscription", 20000))
"""(broker config key, default) of how many messages a Key_Shared subscription's replay
set may hold, per consumer and in all, while its dispatcher reads on past them."""
UNACKED_LIMITS = (
    ("max_unacked_messages_per_consumer", "maxUnackedMessagesPerConsumer", 50_000),
    ("max_unacked_messages_per_subscription", "maxUnackedMessagesPerSubscription", 200_000),
)
"""(policy, broker config key, default) of the two unacknowledged-message limits."""


class SubType(enum.IntEnum):
    """Pulsar's CommandSubscribe.SubType numbers."""

    Exclusive = 0
    Shared = 1
    Failover = 2
    Key_Shared = 3


class ConsumerBusyError(Exception):
    """Another consumer holds an exclusive subscription."""


class SubscriptionTypeMismatchError(Exception):
    """A consumer asked for a different type than the subscription's consumers use."""


class ConsumerAssignError(Exception):
    """A sticky Key_Shared consumer's hash ranges cannot be given to it (none, inverted, or
    held by another consumer)."""


class ReplaySet(SortedSet):  # type: ignore[misc]
    """The positions to deliver again, in order, with what is known of each: its key hash
    (-1 when unknown) and its messages (1 when unknown), so that a Key_Shared dispatcher
    can tell whether a key has an entry waiting (:meth:`holds_key`) and how many messages
    wait (:attr:`messages`)."""

    def __init__(self) -> None:
        super().__init__()
        self._known: dict[Position, tuple[int, int]] = {}
        self._keys: dict[int, int] = {}
        self.messages = 0

    def add(self, pos: Position, key_hash: int = -1, messages: int = 1) -> None:
        if pos in self:
            return
        super().add(pos)
        self._known[pos] = (key_hash, messages)
        self.messages += messages
        if key_hash >= 0:
            self._keys[key_hash] = self._keys.get(key_hash, 0) + 1

    def discard(self, pos: Position) -> None:
        known = self._known.pop(pos, None)
        if known is None:
            return
        super().discard(pos)
        key_hash, messages = known
        self.messages -= messages
        if key_hash >= 0:
            left = self._keys[key_hash] - 1
            if left:
                self._keys[key_hash] = left
            else:
                del self._keys[key_hash]

    def remove(self, pos: Position) -> None:
        if pos not in self:
            raise KeyError(pos)
        self.discard(pos)

    def pop(self, index: int = -1) -> Position:
        pos: Position = self[index]
        self.discard(pos)
        return pos

    def difference_update(self, *iterables: Iterable[Position]) -> None:
        for positions in iterables:
            for pos in positions:
                self.discard(pos)

    def clear(self) -> None:
        super().clear()
        self._known.clear()
        self._keys.clear()
        self.messages = 0

    def holds_key(self, key_hash: int) -> bool:
        """Whether an entry of this key hash waits here."""
        return key_hash in self._keys


class Delivery(NamedTuple):
    """An entry on its way to a consumer; made through ``tuple.__new__`` where the
    dispatch makes one per entry."""

    entry: Entry
    redelivery_count: int
    ack_set: list[int] | None = None


_tuple_new = tuple.__new__
_dict_set = dict.__setitem__
_dict_pop = dict.pop


class ConsumerSink(Protocol):
    """What a protocol session provides to receive messages for one of its consumers."""

    def send_messages(self, consumer: Consumer, deliveries: list[Delivery]) -> None: ...

    def writable(self) -> bool:
        """Whether the connection takes more messages now; once it does again after
        saying no, it wakes its consumers' subscriptions (``wake_for_room``)."""

    def active_consumer_changed(self, consumer: Consumer, active: bool) -> None: ...

    def reached_end_of_topic(self, consumer: Consumer) -> None: ...


class UnackedEntries(dict[Position, tuple[int, int]]):
    """A consumer's delivered, unacknowledged entries (position -> (messages, key hash or
    -1)), keeping the count of their messages as entries come and go."""

    __slots__ = ("messages",)

    def __init__(self) -> None:
        super().__init__()
        self.messages = 0

    def __setitem__(self, pos: Position, item: tuple[int, int]) -> None:
        old = super().get(pos)
        if old is not None:
            self.messages -= old[0]
        super().__setitem__(pos, item)
        self.messages += item[0]

    def pop(self, pos: Position, *default: tuple[int, int] | None) -> tuple[int, int] | None:  # type: ignore[override]
        if pos in self:
            item = super().pop(pos)
            self.messages -= item[0]
            return item
        if default:
            return default[0]
        raise KeyError(pos)

    def __delitem__(self, pos: Position) -> None:
        self.pop(pos)

    def clear(self) -> None:
        super().clear()
        self.messages = 0


class Activity:
    """How much a consumer (or the consumers of a subscription) acknowledged, and when, in
    epoch ms, it last acknowledged, was sent messages and asked for more (the stats'
    messageAckRate and last*Timestamp)."""

    def __init__(self) -> None:
        self.acked = 0
        self.last_acked_ts = 0
        self.last_consumed_ts = 0
        self.last_flow_ts = 0


class Consumer(Activity):
    def __init__(
        self,
        consumer_id: int,
        name: str,
        sink: ConsumerSink,
        *,
        priority: int = 0,
        sticky_ranges: list[tuple[int, int]] | None = None,
        read_compacted: bool = False,
        metadata: dict[str, str] | None = None,
        allow_out_of_order: bool = False,
    ):
        super().__init__()
        self.consumer_id = consumer_id
        self.name = name
        self.sink = sink
        self.priority = priority
        self.sticky_ranges = sticky_ranges
        # up to the last compaction's horizon, only what the compacted view kept
        self.read_compacted = read_compacted
        self.metadata = metadata or {}
        # Key_Shared: a key may move to a new owner while the old one still holds some
        self.allow_out_of_order = allow_out_of_order
        self.permits = 0
        self.subscription: Subscription | None = None
        self.unacked = UnackedEntries()
        # Shared and Key_Shared: no more deliveries until acknowledgements free it
        self.blocked_on_unacked = False
        self.msg_out = 0
        self.entries_out = 0
        # messages of this consumer's sent back for redelivery (nacks, timeouts, leaving)
        self.redelivered = 0
        self.bytes_out = 0
        self.connected_since = time.time()
        self.told_end_of_topic = False

    def flow(self, permits: int) -> None:
        self.permits += permits
        self.last_flow_ts = now_ms()
        if self.subscription is not None:
            self.subscription.last_flow_ts = self.last_flow_ts
            self.subscription.wake_for_room()

    @property
    def unacked_messages(self) -> int:
        return self.unacked.messages


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (what the stats' timestamps are in)."""
    return int(time.time() * 1000)


FAILOVER_RING_REPLICAS = 100
"""Points per consumer on the hash ring a non-partitioned Failover topic picks by."""


@functools.lru_cache(maxsize=4096)
def _ring_points(name: str) -> tuple[int, ...]:
    """A consumer name's points on the Failover hash ring: the name with 0..REPLICAS-1
    appended, murmur3 as a non-negative 32-bit int. Hashed once per name, not at every
    consumer change of every topic."""
    return tuple(murmur3_32(f"{name}{j}".encode()) & 0x7FFFFFFF for j in range(FAILOVER_RING_REPLICAS))


def _ring_pick(topic: str, names: list[str]) -> int:
    """The index in ``names`` whose point on the hash ring (:func:`_ring_points`; a later
    name taking a point an earlier one had) follows the hash of ``topic``, wrapping to the
    first."""
    ring: dict[int, int] = {}
    for i, name in enumerate(names):
        for point in _ring_points(name):
            ring[point] = i
    point = murmur3_32(topic.encode()) & 0x7FFFFFFF
    points = sorted(ring)
    at = bisect.bisect_left(points, point)
    return ring[points[at] if at < len(points) else points[0]]


def _consecutive_runs(positions: list[Position]) -> list[list[Position]]:
    """Sorted ``positions`` split into runs of adjacent entries of one ledger."""
    runs: list[list[Position]] = []
    for pos in positions:
        if runs and runs[-1][-1].ledger_id == pos.ledger_id and runs[-1][-1].entry_id + 1 == pos.entry_id:
            runs[-1].append(pos)
        else:
            runs.append([pos])
    return runs


def _metadata(entry: Entry) -> MessageMetadata:
    """The entry's metadata; an empty one (no key, no delivery time, no chunk) when it
    cannot be read. A dispatch pass reads it at most once per entry, for whichever of its
    key, delivery time and chunk fields it needs."""
    try:
        return entry_metadata(entry.data)
    except EntryFormatError:
        return MessageMetadata()


def _unchecked_until(topic: PersistentTopic, seen: bool) -> Position:
    """The last entry that may hold what ``seen`` says the topic has had (delayed messages,
    chunks): any, once one was published here; else those stored before the topic was
    opened (a restart forgets what they held)."""
    if seen:
        return _LAST_POSITION
    return topic.stored_before_open or _BEFORE_FIRST


def _entry_key_hash(entry: Entry, md: MessageMetadata | None = None) -> int:
    if md is None:
        md = _metadata(entry)
    key = md.ordering_key if md.HasField("ordering_key") else None
    if key is None and md.HasField("partition_key"):
        key = md.partition_key.encode()
    return key_hash(key) if key else 0


class Subscription(Activity):
    def __init__(self, topic: PersistentTopic, name: str, cursor: Cursor, sub_type: SubType, *,
                 durable: bool = True):
        super().__init__()
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.sub_type = sub_type
        self.durable = durable
        # a consumer asked for its state to be replicated to other clusters
        # (replicate_subscription_state); kept by the topic
        self.replicated = False
        self.consumers: list[Consumer] = []
        self.replay = ReplaySet()
        self.redelivery_counts: dict[Position, int] = {}
        # batch-index acknowledgements of entries not wholly acknowledged, kept by the cursor
        self.batch_ack_sets: dict[Position, list[int]] = cursor.batch_acks()
        self._delayed: list[tuple[int, Position]] = []
        self._delayed_set: set[Position] = set()
        # Shared: the consumer each chunked message under way goes to, by its uuid
        self._chunk_owners: dict[str, Consumer] = {}
        # Key_Shared: hash -> (owner consumer, messages delivered and unacked)
        self._hash_owner: dict[int, tuple[Consumer, int]] = {}
        self.blocked_on_unacked = False
        # messages the subscription may still deliver before its unacked limit, if it has one
        self._unacked_room: int | None = None
        self._rr = 0
        self._active: Consumer | None = None
        self._wake = trio.Event()
        self._idle = False  # the dispatcher task waits for a wake-up, with no timer armed
        self._avg_messages_per_entry = 1.0
        # Until entries were seen, larger than any read may be: the first reads one.
        self._avg_entry_bytes = float("inf")
        self._closed = False
        # Held by a dispatch pass (its reads, the cursor moves they make, and the sending
        # of what they read) and by a cursor reset, so that neither overtakes the other: a
        # pass that finished after a seek would move the cursor on from where it read
        # before it, and the seek would be lost.
        self._moving = trio.Lock()
        self.msg_out = 0
        self.redelivered = 0
        self.bytes_out = 0
        self.expired = 0
        self.last_expire_timestamp = 0
        self._throttled_until = float("inf")
        self._dispatch_window = RateWindow()
        # Key_Shared: deliver a key's messages to its new owner at once, without waiting
        # for its previous owner to acknowledge what it holds (allowOutOfOrderDelivery)
        self.allow_out_of_order = False
        # the mark-delete position last seen and when it moved; when a consumer came or went
        self._mark_delete_seen: tuple[Position, int] | None = None
        self._last_seen = now_ms()

    @property
    def last_mark_delete_ts(self) -> int:
        """When (epoch ms) the mark-delete position last moved, as far as seen: the cursor
        applies acknowledgements on its own, so each look compares the position with the
        one seen before and, when it moved, dates the move to the last acknowledgement."""
        md = self.cursor.mark_delete_position()
        seen = self._mark_delete_seen
        if seen is None:
            self._mark_delete_seen = (md, 0)
            return 0
        if md != seen[0]:
            seen = self._mark_delete_seen = (md, self.last_acked_ts or now_ms())
        return seen[1]

    @property
    def last_active(self) -> int:
        """When (epoch ms) a consumer last used this subscription: joined or left it,
        acknowledged, was sent messages or asked for more (what subscription expiration
        measures from)."""
        return max(self._last_seen, self.last_acked_ts, self.last_consumed_ts, self.last_flow_ts)

    # -- consumers ---------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer, sub_type: SubType) -> None:
        if self.consumers and sub_type != self.sub_type:
            raise SubscriptionTypeMismatchError("Subscription is of different type")
        if not self.consumers:
            self.sub_type = sub_type
            # As in Pulsar, the subscription's first consumer sets it for the others.
            self.allow_out_of_order = consumer.allow_out_of_order
        if self.sub_type == SubType.Exclusive and self.consumers:
            raise ConsumerBusyError("Exclusive consumer is already connected")
        if self.sub_type == SubType.Key_Shared:
            self._check_sticky_ranges(consumer)
        consumer.subscription = self
        self.consumers.append(consumer)
        self._last_seen = now_ms()
        self._update_active()
        self.wake()

    def _check_sticky_ranges(self, consumer: Consumer) -> None:
        """On a sticky Key_Shared subscription (its consumers declare their hash ranges),
        every consumer must declare ranges that no other consumer holds, as Pulsar's
        exclusive hash range selector requires."""
        sticky = consumer.sticky_ranges is not None or any(
            c.sticky_ranges is not None for c in self.consumers)
        if not sticky:
            return
        ranges = consumer.sticky_ranges or []
        if not ranges:
            raise ConsumerAssignError("Ranges for KeyShared policy must not be empty.")
        for start, end in ranges:
            if start > end:
                raise ConsumerAssignError("Fixed hash range start > end")
            for other in self.consumers:
                if any(start <= o_end and o_start <= end for o_start, o_end in other.sticky_ranges or ()):
                    raise ConsumerAssignError(f"Range conflict with consumer {other.name}")

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self._last_seen = now_ms()
        consumer.subscription = None
        # As Pulsar's dispatchers: what the consumer held goes to the others without
        # counting as a redelivery (it closed or lost its connection; it refused nothing),
        # and once no consumer is left the counts start anew, as the cursor does.
        self._return_unacked(consumer, list(consumer.unacked), count=False)
        if not self.consumers:
            self.redelivery_counts.clear()
        # its chunked messages start again, from their first chunks, with other consumers
        for uuid in [u for u, c in self._chunk_owners.items() if c is consumer]:
            del self._chunk_owners[uuid]
        self._update_active()
        self.wake()

    def _update_active(self) -> None:
        if self.sub_type not in (SubType.Exclusive, SubType.Failover):
            return
        new = None
        if self.consumers:
            ordered = sorted(self.consumers, key=lambda c: (c.priority, c.name, c.consumer_id))
            # As Pulsar picks a Failover subscription's active consumer: among those of the
            # highest priority, by the partition's number, or on a non-partitioned topic by
            # the topic name's place on a hash ring of their names (so that the topics of a
            # multi-topic consumer group spread over its consumers).
            top = [c for c in ordered if c.priority == ordered[0].priority]
            if self.sub_type != SubType.Failover or len(top) == 1:
                new = top[0]
            elif self.topic.name.partition_index >= 0:
                new = top[self.topic.name.partition_index % len(top)]
            else:
                new = top[_ring_pick(str(self.topic.name), [c.name for c in top])]
        old = self._active
        self._active = new
        if self.sub_type == SubType.Failover:
            if new is not old and old is not None and old in self.consumers:
                # The old active consumer's in-flight messages go to the new one.
                self._return_unacked(old, list(old.unacked), count=False)
            for c in self.consumers:
                c.sink.active_consumer_changed(c, c is new)

    def _return_unacked(self, consumer: Consumer, positions: Iterable[Position], *, count: bool = True) -> None:
        for pos in positions:
            item = consumer.unacked.pop(pos, None)
            if item is None:
                continue
            self._release_hash(consumer, item)
            if count:
                self.redelivery_counts[pos] = self.redelivery_counts.get(pos, 0) + 1
                consumer.redelivered += item[0]
                self.redelivered += item[0]
            self.replay.add(pos, item[1], item[0])

    def _release_hash(self, consumer: Consumer, item: tuple[int, int]) -> None:
        _, h = item
        if h < 0:
            return
        owner = self._hash_owner.get(h)
        if owner is not None and owner[0] is consumer:
            if owner[1] <= 1:
                del self._hash_owner[h]
            else:
                self._hash_owner[h] = (consumer, owner[1] - 1)

    # -- acknowledgements -----------------------------------------------------------------

    def ack_individual(self, consumer: Consumer | None, acks: list[tuple[Position, list[int] | None]]) -> None:
        self._acked_at(consumer)
        self._acked_entries(self._merge_batch_acks(acks))

    def ack_entries(self, consumer: Consumer | None, positions: list[Position]) -> None:
        """:meth:`ack_individual` of whole entries (no ack sets), the common case, without
        the look at each for an ack set to merge."""
        self._acked_at(consumer)
        if self.batch_ack_sets:
            pop = self.batch_ack_sets.pop
            for pos in positions:
                pop(pos, None)
        self._acked_entries(positions)

    def _acked_entries(self, done: list[Position]) -> None:
        """Entries now wholly acknowledged: off the cursor and the consumers' books."""
        if not done:
            return
        self.cursor.delete(done)
        self._forget(done)
        self.wake_for_room()

    def _acked_at(self, consumer: Consumer | None) -> None:
        self.last_acked_ts = now_ms()
        if consumer is not None:
            consumer.last_acked_ts = self.last_acked_ts

    def _merge_batch_acks(self, acks: list[tuple[Position, list[int] | None]]) -> list[Position]:
        """Fold batch-index acks into what is kept per entry (and the cursor persists);
        the entries now wholly acked."""
        done: list[Position] = []
        partial: dict[Position, list[int]] = {}  # an entry named twice: what both leave
        for pos, ack_set in acks:
            if ack_set is not None:
                merged = self._narrow_ack_set(pos, ack_set)
                if any(merged):
                    self.batch_ack_sets[pos] = merged
                    partial[pos] = merged
                    continue
            self.batch_ack_sets.pop(pos, None)
            partial.pop(pos, None)
            done.append(pos)
        if partial:
            self.cursor.set_batch_acks(list(partial.items()))
        return done

    def _narrow_ack_set(self, pos: Position, ack_set: list[int]) -> list[int]:
        """The entry's kept ack set with ``ack_set``'s acknowledgements added (a message is
        left to deliver only while both still have its bit set)."""
        prev = self.batch_ack_sets.get(pos)
        return ack_set if prev is None else [a & b for a, b in zip(prev, ack_set, strict=False)]

    def ack_cumulative(self, consumer: Consumer | None, pos: Position) -> None:
        self._acked_at(consumer)
        self.cursor.mark_delete(pos)
        gone = [p for c in self.consumers for p in c.unacked if p <= pos]
        gone += [p for p in self.replay if p <= pos]
        self._forget(gone)
        for p in [p for p in self.batch_ack_sets if p <= pos]:
            del self.batch_ack_sets[p]
        self.wake()

    def _forget(self, positions: list[Position]) -> None:
        if self.redelivery_counts:
            for pos in positions:
                self.redelivery_counts.pop(pos, None)
        if self.replay:
            self.replay.difference_update(positions)
        if len(self.consumers) == 1 and self.sub_type != SubType.Key_Shared:
            # One consumer and no key hashes held: nothing else to release.
            only = self.consumers[0]
            unacked, acked = only.unacked, 0
            for pos in positions:
                item = _dict_pop(unacked, pos, None)  # UnackedEntries.pop, without its call
                if item is not None:
                    acked += item[0]
            unacked.messages -= acked
            only.acked += acked
            self.acked += acked
            return
        for pos in positions:
            for c in self.consumers:
                item = c.unacked.pop(pos, None)
                if item is not None:
                    c.acked += item[0]
                    self.acked += item[0]
                    self._release_hash(c, item)
                    break

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES: all of the consumer's, or the given ones."""
        if positions is None:
            positions = list(consumer.unacked)
        self._return_unacked(consumer, positions)
        self.wake()

    # -- seeking ------------------------------------------------------------------------------

    async def reset_to(self, pos: Position) -> None:
        """Move the cursor so that `pos` is the next entry delivered; drop in-flight state.
        A dispatch pass under way finishes first; the next one reads from `pos`."""
        async with self._moving:
            await self.cursor.reset(pos)
            self._clear_in_flight()

    def _clear_in_flight(self) -> None:
        for c in self.consumers:
            c.unacked.clear()
        self.replay.clear()
        self.redelivery_counts.clear()
        self.batch_ack_sets.clear()
        self._delayed.clear()
        self._delayed_set.clear()
        self._hash_owner.clear()
        self._chunk_owners.clear()
        self.wake()

    @property
    def active_consumer(self) -> Consumer | None:
        """The consumer that receives messages (Exclusive and Failover), else None."""
        active = self._active
        return active if active is not None and active in self.consumers else None

    @property
    def delayed_messages(self) -> int:
        """Entries waiting for their delivery time."""
        return len(self._delayed_set)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- administration ------------------------------------------------------------------------------
    #
    # What the admin API does to a subscription: each works on the cursor (so it persists)
    # and drops the in-flight state of what it acknowledged. The cursor applies
    # acknowledgements in order on its own; each operation waits (flush) until they are
    # applied, so it returns with its effect visible.

    def _is_acked(self, pos: Position, md: Position, ranges: list[tuple[Position, Position]]) -> bool:
        return pos <= md or any(a <= pos <= b for a, b in ranges)

    async def unacked_entries(self, limit: int) -> list[Entry]:
        """Up to `limit` entries from the oldest unacknowledged one on, skipping acknowledged
        entries, in position order."""
        md = self.cursor.mark_delete_position()
        ranges = self.cursor.individually_deleted()
        pos = Position(md.ledger_id, md.entry_id + 1)
        out: list[Entry] = []
        max_entries = self._read_limits()[0]
        while len(out) < limit:
            got = await self.topic.ml.read_entries(pos, min(max_entries, limit - len(out) + len(ranges)))
            if not got:
                break
            out.extend(e for e in got if not self._is_acked(e.position, md, ranges))
            last = got[-1].position
            pos = Position(last.ledger_id, last.entry_id + 1)
        return out[:limit]

    async def skip(self, messages: int) -> int:
        """Acknowledge the oldest unacknowledged entries holding `messages` messages (whole
        entries: a batch is skipped entirely); returns the messages skipped."""
        skipped = 0
        positions: list[Position] = []
        while skipped < messages:
            taken = set(positions)
            got = [e for e in await self.unacked_entries(self._read_limits()[0]) if e.position not in taken]
            if not got:
                break
            for e in got:
                if skipped >= messages:
                    break
                positions.append(e.position)
                skipped += e.num_messages
            self.ack_entries(None, positions)
            await self.cursor.flush()
        return skipped

    async def clear_backlog(self) -> int:
        """Acknowledge everything published so far; returns the entries that were in backlog."""
        before = self.backlog()
        last = self.topic.ml.last_confirmed()
        if last is not None:
            self.ack_cumulative(None, last)
            await self.cursor.flush()
        return before

    async def expire(self, seconds: float) -> int:
        """Acknowledge every entry published more than `seconds` ago (message TTL); returns
        the entries expired."""
        cutoff = int(time.time() * 1000 - seconds * 1000)
        ml = self.topic.ml
        last = ml.last_confirmed()
        if last is None or cutoff < 0:  # nothing was published before the epoch
            return 0
        first_kept = await ml.find_by_publish_time(cutoff)
        if first_kept is None:
            upto: Position | None = last
        else:
            upto = self.topic.previous_position(first_kept)
        md = self.cursor.mark_delete_position()
        if upto is None or upto <= md:
            return 0
        gone = self.topic.entries_between(md, upto)
        for a, b in self.cursor.individually_deleted():
            if md < a and b <= upto:
                gone -= b.entry_id - a.entry_id + 1
        # Counted with the acknowledgement, before anything awaits: stats read meanwhile
        # never show the backlog gone but not yet counted as expired.
        gone = max(0, gone)
        self.ack_cumulative(None, upto)
        self.expired += gone
        self.last_expire_timestamp = int(time.time() * 1000)
        await self.cursor.flush()
        return gone

    def disconnect_consumers(self, *, reset: bool = False, keep: Consumer | None = None) -> None:
        """Ask each consumer's session (but ``keep``'s) to close it (the clients
        reconnect); ``reset`` when the subscription was just moved (a seek), so that a
        reader finds it again."""
        for c in list(self.consumers):
            if c is keep:
                continue
            close = getattr(c.sink, "broker_closed_consumer", None)
            if close is not None:
                close(c, reset=reset)
            else:
                self.remove_consumer(c)

    # -- dispatch ----------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def wake_for_room(self) -> None:
        """A consumer has room for more (permits, or fewer unacknowledged messages): wake
        the dispatcher if there is anything it could send. With nothing to read, replay or
        release later, the next stored entry wakes it and the room is used then."""
        if self._has_more_to_send():
            self._wake.set()

    def _has_more_to_send(self) -> bool:
        """Entries not read yet, replays, or delayed messages to release later."""
        return bool(self.replay or self._delayed or self.cursor.has_more())

    @property
    def _reads_compacted(self) -> bool:
        """The active consumer reads the topic's compacted view."""
        return self._active is not None and self._active.read_compacted

    def entries_stored(self) -> None:
        """New entries were stored on the topic. A dispatcher waiting with nothing to do
        and no timer sends them from here, straight from the entry cache, which saves its
        task a wake-up per stored batch; otherwise, or when the entries are not cached or
        something remains to do that needs the task (replays, delayed messages, a rate
        limit's window, more than one read's worth), the task is woken."""
        if (not self._idle or self.replay or self._delayed or self._reads_compacted
                or self._moving.locked()):  # a reset under way: the task reads after it
            self.wake()
            return
        budget = self._dispatch_budget()
        if not budget:
            if self._throttled_until != float("inf"):
                self.wake()  # its task waits for the rate window's end
            return  # no consumer can take more now: a flow or an ack wakes the task
        try:
            entries = self.cursor.read_cached(budget)
            if entries is not None:
                self._dispatch(entries, 0)
        except Exception:
            # the task takes over: its own pass goes on from where this one stopped, and
            # the topic's storing is not held up
            log.exception("dispatching new entries of %s failed", self.name)
            entries = None
        if entries is None or self._has_more_to_send():
            self.wake()

    def close(self) -> None:
        self._closed = True
        self.wake()

    def backlog(self) -> int:
        return self.cursor.backlog()

    async def run(self) -> None:
        moving = self._moving
        while not self._closed:
            try:
                # Free unless a reset holds it: taken without the scheduler pass that
                # ``async with`` makes even then (one per dispatch pass on the hot path).
                moving.acquire_nowait()
            except trio.WouldBlock:
                await moving.acquire()
            try:
                sent = await self._dispatch_once()
            finally:
                moving.release()
            if sent:
                if self.replay or self.cursor.has_more():
                    await trio.lowlevel.checkpoint()  # more to send: others run in between
                    continue
                # All caught up: wait right away, without a trip through the loop to
                # find nothing to read.
                self._tell_end_of_topic()
            deadline = self._delayed[0][0] / 1000.0 if self._delayed else float("inf")
            wake_at = trio.current_time() + max(0.0, deadline - time.time()) \
                if deadline != float("inf") else float("inf")
            wake_at = min(wake_at, self._throttled_until)
            self._throttled_until = float("inf")
            if wake_at == float("inf"):
                self._idle = True  # nothing to do until woken: entries_stored may dispatch
                try:
                    await self._wake.wait()  # no timer to arm: a cancel scope per wake is waste
                finally:
                    self._idle = False
            else:
                with trio.move_on_at(wake_at):
                    await self._wake.wait()
            self._wake = trio.Event()

    def _receivers(self) -> list[Consumer]:
        if self.sub_type in (SubType.Exclusive, SubType.Failover):
            active = self._active
            return [active] if active is not None and active.permits > 0 and active.sink.writable() else []
        per_consumer, per_subscription = self._unacked_limits()
        self._unacked_room = None
        if per_subscription:
            total = sum(c.unacked.messages for c in self.consumers)
            if self.blocked_on_unacked and total <= per_subscription // 2:
                self.blocked_on_unacked = False
            elif total >= per_subscription:
                self.blocked_on_unacked = True
            if self.blocked_on_unacked:
                return []
            self._unacked_room = per_subscription - total
        else:
            self.blocked_on_unacked = False
        half = per_consumer // 2
        for c in self.consumers:
            if c.blocked_on_unacked and (not per_consumer or c.unacked.messages <= half):
                c.blocked_on_unacked = False
        return [c for c in self.consumers if c.permits > 0 and not c.blocked_on_unacked and c.sink.writable()]

    def _unacked_limits(self) -> tuple[int, int]:
        """maxUnackedMessagesPerConsumer and ...PerSubscription as they apply here: the
        topic's or namespace's policy, else the broker's setting; 0 for none."""
        (cp, ck, cd), (sp, sk, sd) = UNACKED_LIMITS
        return max(0, self.topic.limit(cp, ck, cd)), max(0, self.topic.limit(sp, sk, sd))

    async def _dispatch_once(self) -> bool:
        budget = self._dispatch_budget()
        if not budget:
            return False
        entries: list[Entry] = []
        if self.replay:
            entries = await self._read_replay(budget)
        from_replay = len(entries)
        if len(entries) < budget and self._reads_compacted:
            entries.extend(await self._read_compacted(budget - len(entries)))
        if len(entries) < budget and self.cursor.has_more():
            entries.extend(await self.cursor.read_entries(budget - len(entries)))
        sent = self._dispatch(entries, from_replay)
        if (not sent and from_replay == budget and self.sub_type == SubType.Key_Shared
                and self.cursor.has_more() and self._may_look_ahead()):
            # None of the replays the budget took could go: their consumers are slow or
            # gone. Read on past them, so that the other keys are not stuck behind them.
            sent = self._dispatch(await self.cursor.read_entries(budget), 0)
        return sent

    def _may_look_ahead(self) -> bool:
        """Whether the replay set holds few enough messages for the dispatcher to read new
        entries past it (``keySharedLookAheadMsgInReplayThreshold...``, as the broker's
        configuration says now; 0 turns a limit off)."""
        config = self.topic.broker.config
        per_consumer, in_all = (max(0, int(config.get(key, default))) for key, default in LOOK_AHEAD_LIMITS)
        limits = [limit for limit in (per_consumer * len(self.consumers), in_all) if limit > 0]
        return not limits or self.replay.messages < min(limits)

    def _read_limits(self) -> tuple[int, int]:
        """The most entries, and bytes, one read may take (``dispatcherMaxReadBatchSize``,
        ``dispatcherMaxReadSizeBytes``), as the broker's configuration says now: read once
        per dispatch pass, so a change applies from the next pass."""
        config = self.topic.broker.config
        entries, size = (max(1, int(config.get(key, default) or default)) for key, default in READ_LIMITS)
        return entries, size

    def _dispatch_budget(self) -> int:
        """How many entries the next dispatch may read: 0 when no consumer can take one
        or a rate limit's window is spent (``_throttled_until`` then says until when).
        Delayed messages now due join the replay first."""
        self._release_due_delayed()
        receivers = self._receivers()
        if not receivers:
            return 0
        # Permits count messages and an entry may hold a batch of them: read as many entries
        # as the permits cover at the average batch size seen, so that entries are not read
        # only to wait in the replay set for permits.
        permits = sum(c.permits for c in receivers)
        if self._unacked_room is not None:
            permits = min(permits, self._unacked_room)
        max_entries, max_bytes = self._read_limits()
        budget = max(1, min(max_entries, int(permits / self._avg_messages_per_entry),
                            int(max_bytes / self._avg_entry_bytes)))
        for allowed, size_left, until in (self.topic.dispatch_allowance(), self._dispatch_allowance()):
            if allowed == 0:
                self._throttled_until = until
                return 0
            if allowed is not None:
                budget = min(budget, allowed)
            if size_left is not None:  # at least one entry: what it takes past the limit is paid back
                budget = min(budget, max(1, int(size_left / self._avg_entry_bytes)))
        return budget

    def _dispatch(self, entries: list[Entry], from_replay: int) -> bool:
        """Send ``entries`` (the first ``from_replay`` of them replays) to the consumers;
        whether any went out (or was put away until its delivery time)."""
        if entries:
            mean = sum(e.num_messages for e in entries) / len(entries)
            self._avg_messages_per_entry = 0.8 * self._avg_messages_per_entry + 0.2 * mean
            # Smaller entries than thought count at once, larger ones by degrees: reads stay
            # within dispatcherMaxReadSizeBytes, give or take a change of entry sizes.
            size = sum(len(e.data) for e in entries) / len(entries)
            self._avg_entry_bytes = size if size < self._avg_entry_bytes else \
                0.8 * self._avg_entry_bytes + 0.2 * size
        if not entries:
            self._tell_end_of_topic()
            return False
        msg_out, bytes_out = self.msg_out, self.bytes_out
        with write_batch():  # each consumer's MESSAGE frames leave in one write
            sent = self._assign(entries, from_replay)
        self.topic.note_dispatched(self.msg_out - msg_out, self.bytes_out - bytes_out)
        self._dispatch_window.add(self.msg_out - msg_out, self.bytes_out - bytes_out)
        return sent

    def _dispatch_allowance(self) -> tuple[int | None, int | None, float]:
        """What the subscription dispatch rate (the topic's or namespace's
        ``subscriptionDispatchRate``, else the broker's
        ``dispatchThrottlingRatePerSubscription*``) leaves this subscription now."""
        limits = self.topic.rate_policy(
            "subscriptionDispatchRate", "dispatchThrottlingRateInMsg", "dispatchThrottlingRateInByte",
            "dispatchThrottlingRatePerSubscriptionInMsg", "dispatchThrottlingRatePerSubscriptionInByte")
        return window_allowance(self._dispatch_window, limits)

    async def _read_compacted(self, n: int) -> list[Entry]:
        """Up to ``n`` entries of the topic's compacted view from the cursor's read position
        on, moving the read position past them (and past the view's horizon once it is
        read), so that reading goes on in the topic itself after the horizon."""
        view = self.topic.compacted_view()
        if view is None:
            return []
        kept, horizon, masks = view
        start = self.cursor.read_position()
        if start > horizon:
            return []
        i = bisect.bisect_left(kept, start)
        picked = kept[i:i + n]
        out: list[Entry] = []
        for run in _consecutive_runs(picked):  # one read per run of adjacent kept entries
            got = await self.topic.ml.read_entries(run[0], len(run))
            out.extend(e for e in got if e.position <= run[-1])
        for pos in picked:
            mask = masks.get(pos)
            if mask is not None:
                # what compaction dropped from the batch counts as acknowledged
                self.batch_ack_sets[pos] = self._narrow_ack_set(pos, mask)
        last = picked[-1] if i + n < len(kept) else horizon
        self.cursor.seek(Position(last.ledger_id, last.entry_id + 1))
        return out

    def _tell_end_of_topic(self) -> None:
        """A terminated topic whose every entry was delivered: REACHED_END_OF_TOPIC."""
        if self.topic.terminated_at is None or self.cursor.has_more() or self.replay or self._delayed:
            return
        for c in self.consumers:
            if not c.told_end_of_topic:
                c.told_end_of_topic = True
                c.sink.reached_end_of_topic(c)

    async def _read_replay(self, budget: int) -> list[Entry]:
        wanted = list(self.replay.islice(0, budget))
        out: list[Entry] = []
        i = 0
        while i < len(wanted):
            start = wanted[i]
            run = 1
            while (i + run < len(wanted) and wanted[i + run].ledger_id == start.ledger_id
                   and wanted[i + run].entry_id == start.entry_id + run):
                run += 1
            got = await self.topic.ml.read_entries(start, run)
            out.extend(e for e in got if e.position in self.replay)
            i += run
        for e in out:
            self.replay.discard(e.position)
        return out

    def _release_due_delayed(self) -> None:
        now = int(time.time() * 1000)
        while self._delayed and self._delayed[0][0] <= now:
            _, pos = heapq.heappop(self._delayed)
            self._delayed_set.discard(pos)
            self.replay.add(pos)

    def _assign(self, entries: list[Entry], from_replay: int) -> bool:
        now = int(time.time() * 1000)
        batches: dict[int, tuple[Consumer, list[Delivery]]] = {}
        sent = msgs = nbytes = parked = 0
        redelivery_counts, batch_ack_sets = self.redelivery_counts, self.batch_ack_sets
        # who may take entries in this pass: with permits and room, on a connection that
        # takes more (which stays so through the pass: the frames go out at its end)
        receivers = self._receivers()
        sub_type = self.sub_type
        key_shared, shared = sub_type == SubType.Key_Shared, sub_type == SubType.Shared
        per_type_counts = key_shared or shared
        ready: set[Consumer] = set(receivers) if per_type_counts else set()
        per_consumer = self._unacked_limits()[0] if per_type_counts else 0
        # entries after the replays may be due later (a replayed one was due already):
        # any, once the topic had a delayed message, else those stored before it opened;
        # none when the delayedDelivery policy (or delayedDeliveryEnabled) turns delays off
        topic = self.topic
        delayed_until = _unchecked_until(topic, topic.has_delayed_messages) \
            if topic.delayed_delivery_enabled else _BEFORE_FIRST
        chunks_until = _unchecked_until(topic, topic.has_chunked_messages) if shared else _BEFORE_FIRST
        for i, entry in enumerate(entries):
            pos = entry.position
            md = None  # read once, when something below needs it
            if i >= from_replay and pos <= delayed_until:
                md = _metadata(entry)
                deliver_at = md.deliver_at_time
                if deliver_at > now:
                    if pos not in self._delayed_set:
                        self._delayed_set.add(pos)
                        heapq.heappush(self._delayed, (deliver_at, pos))
                    parked += 1
                    continue
            h = -1
            if key_shared:
                h = _entry_key_hash(entry, md)
                target = self._key_owner(h)
                held = self._hash_owner.get(h)
                if target is None or target not in ready or target.permits <= 0 or target.blocked_on_unacked or (
                        held is not None and held[0] is not target and not self.allow_out_of_order) or (
                        i >= from_replay and self.replay.holds_key(h)):  # behind its key's replays
                    self.replay.add(pos, h, entry.num_messages)
                    continue
            elif shared:
                target = self._shared_target(md or _metadata(entry), ready) if pos <= chunks_until \
                    else self._next_shared(ready)
                if target is None:
                    self.replay.add(pos, -1, entry.num_messages)
                    continue
            else:
                target = self._active
                if not receivers or target is None or target.permits <= 0:
                    self.replay.add(pos, -1, entry.num_messages)
                    continue
            # Only Shared and Key_Shared tell a message's redeliveries, as in Pulsar: a
            # single active consumer's client would otherwise send it to its dead letter
            # topic, a policy Pulsar gives those two types alone.
            delivery = _tuple_new(Delivery, (
                entry, redelivery_counts.get(pos, 0) if redelivery_counts and per_type_counts else 0,
                batch_ack_sets.get(pos) if batch_ack_sets else None))
            n, size = entry.num_messages, len(entry.data)
            target.permits -= n
            unacked = target.unacked
            if pos in unacked:
                unacked[pos] = (n, h)
            else:  # UnackedEntries.__setitem__ for a new entry, without its call
                _dict_set(unacked, pos, (n, h))
                unacked.messages += n
            if per_consumer and target.unacked.messages >= per_consumer:
                target.blocked_on_unacked = True
            if h >= 0:
                held = self._hash_owner.get(h)
                self._hash_owner[h] = (target, (held[1] if held else 0) + 1)
            slot = batches.get(target.consumer_id)
            if slot is None:
                batches[target.consumer_id] = (target, [delivery])
            else:
                slot[1].append(delivery)
            target.msg_out += n
            target.entries_out += 1
            target.bytes_out += size
            msgs += n
            nbytes += size
            sent += 1
        if sent:
            self.msg_out += msgs
            self.bytes_out += nbytes
            self.topic.broker.stats.record_dispatch(msgs, nbytes)
            self.last_consumed_ts = now
        for consumer, deliveries in batches.values():
            consumer.last_consumed_ts = now
            consumer.sink.send_messages(consumer, deliveries)
        # Entries put away until their delivery time count as progress too: the pass after
        # reads on, rather than the entries behind a delayed one waiting for its time.
        return sent > 0 or parked > 0

    def _shared_target(self, md: MessageMetadata, ready: set[Consumer]) -> Consumer | None:
        """Shared: the consumer for an entry (its metadata ``md``) that may be a chunk of a
        large message. Every chunk of a message goes to the consumer its first chunk went
        to (as Pulsar's Shared chunk assignment does), so that one consumer can put it
        together; None while that consumer cannot take it (it waits in the replay set)."""
        if md.num_chunks_from_msg <= 1:
            return self._next_shared(ready)
        owners = self._chunk_owners
        target = owners.get(md.uuid) if md.chunk_id > 0 else None
        if target is None:
            target = self._next_shared(ready)
            if target is None:
                return None
        elif target not in ready or target.permits <= 0 or target.blocked_on_unacked:
            return None
        if md.chunk_id + 1 >= md.num_chunks_from_msg:
            owners.pop(md.uuid, None)  # the last chunk
        else:
            owners[md.uuid] = target
        return target

    def _next_shared(self, ready: set[Consumer]) -> Consumer | None:
        """The next consumer in turn, of those ``ready`` at the start of the pass, that can
        take a message; as in Pulsar, among those of the highest priority (the lowest
        priority level) that can."""
        if not ready:
            return None
        n = len(self.consumers)
        top = None
        if any(c.priority != self.consumers[0].priority for c in self.consumers):
            top = min((c.priority for c in ready if c.permits > 0 and not c.blocked_on_unacked),
                      default=None)
            if top is None:
                return None
        for _ in range(n):
            c = self.consumers[self._rr % n]
            self._rr += 1
            if c in ready and c.permits > 0 and not c.blocked_on_unacked and (top is None or c.priority == top):
                return c
        return None

    def _key_owner(self, h: int) -> Consumer | None:
        """Auto-split: the hash space is cut into equal ranges, one per consumer in join
        order; sticky consumers own exactly the ranges they declared."""
        sticky = [c for c in self.consumers if c.sticky_ranges]
        for c in sticky:
            for start, end in c.sticky_ranges or ():
                if start <= h <= end:
                    return c
        auto = [c for c in self.consumers if not c.sticky_ranges]
        if not auto:
            return None
        return auto[h * len(auto) // KEY_HASH_RANGE]
