"""Decoded messages in and out of topics, for handlers that do not speak Pulsar's entries.

:func:`publish` stores protocol-neutral :class:`~core.format.Message` values on a topic
and returns once they are durable. :class:`Subscriber` attaches one consumer per topic
to a subscription and hands its session :class:`Received` messages, each acknowledged
or sent back on its own, whatever batch entry it came in; permits count messages.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import trio

from core.format import (
    DEFAULT_MAX_UNCOMPRESSED_SIZE,
    EntryFormatError,
    Message,
    MessageMetadata,
    ack_set_but,
    chunk_entries,
    decode_entry,
    entry_from_messages,
    messages_of,
)
from core.naming import TopicName
from core.storage import Position
from core.subscription import Consumer, Delivery, SubType
from core.topic import PersistentTopic, PublishResult

__all__ = ["publish", "store", "Received", "Subscriber", "EMPTY", "end_of"]

log = logging.getLogger(__name__)

_sequence = itertools.count()
#: The broker's ``maxMessageSize`` when it has none configured (Pulsar's default).
DEFAULT_MAX_MESSAGE_SIZE = 5 << 20
#: Chunked messages a subscriber puts together at once (Pulsar's consumer default of
#: ``maxPendingChunkedMessage``); the oldest beyond it is given back for redelivery.
MAX_PENDING_CHUNKED = 10
#: The start of a topic that held nothing when it was looked at.
EMPTY = Position(-1, -1)


def end_of(topic: PersistentTopic) -> Position:
    """Where what is published next to ``topic`` will go (:data:`EMPTY` if it holds
    nothing): a subscription that starts there misses nothing published after this call."""
    last = topic.ml.last_confirmed()
    return EMPTY if last is None else Position(last.ledger_id, last.entry_id + 1)
_consumer_ids = itertools.count(1 << 40)


async def publish(broker: object, name: TopicName, messages: Sequence[Message], *,
                  producer_name: str) -> Position:
    """Store ``messages`` on the topic ``name`` (created when the namespace allows it),
    together in one entry when they fit; return the position of the last once all are
    durable, or raise what storing them raised.

    What does not fit in one entry (the broker's ``maxMessageSize``, or what a bookie
    frame holds) goes in several, in order; a message larger than that alone is stored
    as a chunked message, as a Pulsar producer chunks one, and a :class:`Subscriber`
    (as a Pulsar consumer) hands it over whole."""
    topic: PersistentTopic = await broker.get_topic(name)  # type: ignore[attr-defined]
    stored = trio.Event()
    outcome: list[tuple[Position, BaseException | None]] = []

    def done(position: Position, error: BaseException | None) -> None:
        outcome.append((position, error))
        stored.set()

    store(broker, topic, messages, producer_name=producer_name, done=done)
    await stored.wait()
    position, error = outcome[0]
    if error is not None:
        raise error
    return position


def store(broker: object, topic: PersistentTopic, messages: Sequence[Message], *,
          producer_name: str, done: Callable[[Position, BaseException | None], None]) -> None:
    """:func:`publish` to a topic at hand, without waiting: the entries are queued now,
    and ``done(position of the last, error or None)`` runs once all are durable or one
    failed (from the topic's flusher, in the order they were queued on that topic). A
    session that stores one run after another without waiting for each keeps its
    publishes in order and has several runs on their way to the disk at once."""
    limit = entry_limit(broker, topic)
    now = int(time.time() * 1000)
    entries: list[tuple[bytes, int, int, bool]] = []
    if sum(len(m.payload) for m in messages) < limit // 2:
        sequence_id = next(_sequence)
        entry = entry_from_messages(messages, producer_name=producer_name,
                                    sequence_id=sequence_id, publish_time=now)
        if len(entry) <= limit:
            entries = [(entry, len(messages), sequence_id, False)]
    if not entries:
        entries = list(_entries(messages, producer_name, now, limit))
    results: list[PublishResult] = []

    def stored(r: PublishResult) -> None:
        results.append(r)
        if len(results) == len(entries):
            error = next((x.error for x in results if x.error is not None), None)
            position = results[-1].position
            done(position if position is not None else Position(-1, -1), error)

    for i, (entry, count, sequence_id, chunked) in enumerate(entries):
        topic.publish(entry, count, producer_name, sequence_id, stored,
                      hold=i < len(entries) - 1, chunked=chunked)


def entry_limit(broker: object, topic: PersistentTopic) -> int:
    """The largest entry :func:`publish` writes to ``topic``: the broker's
    ``maxMessageSize`` (what a Pulsar consumer accepts) within what one entry holds."""
    config = getattr(broker, "config", None)
    configured = int(config.get("maxMessageSize") or DEFAULT_MAX_MESSAGE_SIZE) if config is not None \
        else DEFAULT_MAX_MESSAGE_SIZE
    return min(configured, topic.max_entry_size)


def _entries(messages: Sequence[Message], producer_name: str, now: int,
             limit: int) -> Iterator[tuple[bytes, int, int, bool]]:
    """``(entry, messages in it, sequence id, is a chunk)`` for messages too large for one
    entry: runs of them an entry each, and each one too large alone in chunks (which
    share their message's sequence id, as a Pulsar producer's do)."""
    run: list[Message] = []
    size = 0
    for m in [*messages, None]:
        grow = 0 if m is None else len(m.payload) + 64 + sum(len(k) + len(v) + 8 for k, v in m.properties.items())
        if run and (m is None or size + grow > limit * 3 // 4):
            yield from _fitted(run, producer_name, now, limit)
            run, size = [], 0
        if m is not None:
            run.append(m)
            size += grow


def _fitted(run: list[Message], producer_name: str, now: int,
            limit: int) -> Iterator[tuple[bytes, int, int, bool]]:
    sequence_id = next(_sequence)
    entry = entry_from_messages(run, producer_name=producer_name, sequence_id=sequence_id,
                                publish_time=now)
    if len(entry) <= limit:
        yield entry, len(run), sequence_id, False
    elif len(run) > 1:
        half = len(run) // 2
        yield from _fitted(run[:half], producer_name, now, limit)
        yield from _fitted(run[half:], producer_name, now, limit)
    else:
        for chunk in chunk_entries(run[0], producer_name=producer_name, sequence_id=sequence_id,
                                   publish_time=now, max_entry=limit):
            yield chunk, 1, sequence_id, True


@dataclass(slots=True)
class Received:
    """One message delivered to a :class:`Subscriber`, with what acknowledging it needs."""

    topic: TopicName
    message: Message
    position: Position
    index: int
    batch_size: int
    redelivery_count: int
    consumer: Consumer
    #: The message's index in its topic (Kafka's offset, an AMQP stream's offset).
    offset: int = -1
    #: For a chunked message, where its chunks before the last (at ``position``) are.
    chunks: tuple[Position, ...] = ()

    @property
    def positions(self) -> list[Position]:
        """Every entry the message is stored in."""
        return [*self.chunks, self.position]


class Subscriber:
    """The sink of a session's consumers, one per topic, on subscriptions of one name.

    ``deliver(received)`` is called for each message in order per topic; the session
    calls :meth:`ack` or :meth:`nack` for each, and :meth:`flow` to grant permits."""

    def __init__(self, broker: object, subscription: str, deliver: Callable[[Received], None],
                 *, window: int = 1000, writable: Callable[[], bool] = lambda: True):
        self.broker = broker
        self.subscription = subscription
        self.deliver = deliver
        self.window = window
        self._writable = writable
        self.attached: dict[str, tuple[PersistentTopic, Consumer]] = {}
        #: Chunked messages being put together, by topic and uuid, oldest first.
        self._chunked: dict[tuple[str, str], _Chunked] = {}
        #: What :meth:`settle_later` was given, not yet acknowledged.
        self._settling: list[Received] = []
        self._delivering = False  # in send_messages: what it settles goes at its end
        self._settle_soon = False  # settle_pending is to run from the run loop

    async def attach(self, name: TopicName, *, sub_type: SubType = SubType.Exclusive,
                     durable: bool = False, start: Position | None = None) -> None:
        """Consume ``name`` (if not already). A subscription that does not exist yet starts
        at ``start`` (the next position to deliver; an empty topic's beginning when that is
        ``END_WHEN_EMPTY``), or else at the end."""
        key = str(name)
        if key in self.attached:
            return
        topic: PersistentTopic = await self.broker.get_topic(name)  # type: ignore[attr-defined]
        if key in self.attached:
            return
        consumer = Consumer(next(_consumer_ids), self.subscription, self)
        if durable and start is not None and self.subscription not in topic.subscriptions:
            await topic.create_subscription(self.subscription, None if start is EMPTY else start,
                                            earliest=start is EMPTY)
        await topic.subscribe(self.subscription, consumer, sub_type, durable=durable,
                              start=None if start is EMPTY else start, earliest=start is EMPTY)
        self.attached[key] = (topic, consumer)
        consumer.flow(self.window)

    async def detach(self, name: TopicName, *, delete: bool = False) -> None:
        self.settle_pending()
        got = self.attached.pop(str(name), None)
        if got is None:
            return
        topic, consumer = got
        for key in [k for k in self._chunked if k[0] == str(name)]:
            del self._chunked[key]  # redelivered from their first chunk to whoever is next
        sub = consumer.subscription  # closing the consumer lets go of it
        topic.consumer_closed(consumer)
        if delete and sub is not None and sub.durable:
            try:
                await topic.unsubscribe(self.subscription)
            except Exception as exc:  # another consumer still attached: keep it
                log.debug("subscription %s on %s kept: %s", self.subscription, name, exc)

    async def close(self, *, delete: bool = False) -> None:
        for key in list(self.attached):
            await self.detach(TopicName.parse(key), delete=delete)

    def ack(self, r: Received) -> None:
        sub = r.consumer.subscription
        if sub is None:
            return
        if r.batch_size > 0:
            sub.ack_individual(r.consumer, [(r.position, ack_set_but(r.index, r.batch_size))])
        else:
            sub.ack_individual(r.consumer, [(p, None) for p in r.positions])

    def ack_many(self, received: Sequence[Received], *, flow: bool = False) -> None:
        """:meth:`ack` each of ``received`` (with ``flow``, and :meth:`flow` one permit
        each), in one call into each subscription rather than one per message."""
        groups: dict[int, tuple[Consumer, list[tuple[Position, list[int] | None]], list[int]]] = {}
        for r in received:
            got = groups.get(id(r.consumer))
            if got is None:
                got = groups[id(r.consumer)] = (r.consumer, [], [0])
            acks = got[1]
            got[2][0] += 1
            if r.batch_size > 0:
                acks.append((r.position, ack_set_but(r.index, r.batch_size)))
            elif r.chunks:
                acks += [(p, None) for p in r.positions]
            else:
                acks.append((r.position, None))
        for consumer, acks, count in groups.values():
            sub = consumer.subscription
            if sub is not None:
                sub.ack_individual(consumer, acks)
            if flow:
                consumer.flow(count[0])

    def settle_later(self, r: Received) -> None:
        """:meth:`ack` ``r`` and :meth:`flow` its permit back, together with the others of
        the batch: at the end of the delivery under way, at :meth:`settle_pending` (a
        session calls it once it has handled what it read), or else as soon as the task
        that settled it lets the run loop go on. ``r`` is kept by the subscriber it came
        from, whichever subscriber is asked."""
        sink = r.consumer.sink
        owner = sink if isinstance(sink, Subscriber) else self
        owner._settling.append(r)
        if not owner._delivering and not owner._settle_soon:
            owner._settle_soon = True
            trio.lowlevel.current_trio_token().run_sync_soon(owner._settle_from_run_loop)

    def settle_pending(self) -> None:
        """Apply what :meth:`settle_later` holds: one call into each subscription."""
        if self._settling:
            settling, self._settling = self._settling, []
            self.ack_many(settling, flow=True)

    def _settle_from_run_loop(self) -> None:
        self._settle_soon = False
        try:
            self.settle_pending()
        except Exception:  # the run loop must not see it
            log.exception("%s: acknowledging failed", self.subscription)

    def nack(self, r: Received) -> None:
        sub = r.consumer.subscription
        if sub is not None:
            sub.redeliver(r.consumer, r.positions)

    def flow(self, r: Received, permits: int = 1) -> None:
        r.consumer.flow(permits)

    # -- ConsumerSink --------------------------------------------------------------------

    def send_messages(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        topic = consumer.subscription.topic.name if consumer.subscription is not None else None
        if topic is None:
            return
        self._delivering = True
        try:
            self._send(consumer, topic, deliveries)
        finally:
            self._delivering = False
            self.settle_pending()

    def _send(self, consumer: Consumer, topic: TopicName, deliveries: list[Delivery]) -> None:
        give_back = 0
        for d in deliveries:
            entry = d.entry
            chunks: tuple[Position, ...] = ()
            try:
                metadata, payload = decode_entry(entry.data)
                if metadata.num_chunks_from_msg > 1:
                    whole = self._chunk(str(topic), consumer, entry.position, metadata, payload)
                    if whole is None:  # a chunk kept until the rest of its message comes
                        give_back += 1
                        continue
                    metadata, payload, chunks = whole
                messages = messages_of(metadata, payload, max_uncompressed_size=max(
                    DEFAULT_MAX_UNCOMPRESSED_SIZE, metadata.uncompressed_size))
            except EntryFormatError as exc:
                log.warning("%s: entry %s of %s cannot be read (%s); acknowledged",
                            self.subscription, entry.position, topic, exc)
                if consumer.subscription is not None:
                    consumer.subscription.ack_individual(
                        consumer, [(p, None) for p in (*chunks, entry.position)])
                give_back += entry.num_messages
                continue
            pending = _pending(d.ack_set)
            batch_size = entry.num_messages if len(messages) > 1 or entry.num_messages > 1 else 0
            sent = 0
            for index, message in messages:
                if pending is not None and not pending(index):
                    continue
                sent += 1
                self.deliver(Received(topic, message, entry.position,
                                      index if batch_size else -1, batch_size,
                                      d.redelivery_count, consumer,
                                      entry.index - entry.num_messages + 1 + index, chunks))
            give_back += entry.num_messages - sent
        if give_back:
            consumer.flow(give_back)

    def _chunk(self, topic: str, consumer: Consumer, position: Position, md: MessageMetadata,
               payload: bytes) -> tuple[MessageMetadata, bytes, tuple[Position, ...]] | None:
        """Take one chunk of a chunked message; the whole message's metadata, payload and
        earlier chunks' positions once this is its last chunk, else None.

        A chunk 0 starts the message over (a redelivery starts at it); a chunk that does
        not follow the ones kept (its earlier chunks gone, or a producer's resend of one
        stored already) can never make a message here and is acknowledged."""
        key = (topic, md.uuid)
        kept = self._chunked.get(key)
        if md.chunk_id == 0:
            if kept is not None:
                del self._chunked[key]
                if kept.positions[0] != position:  # a copy a producer began again
                    self._settle(kept.consumer, kept.positions, ack=True)
            kept = self._chunked[key] = _Chunked(consumer, md.num_chunks_from_msg)
            while len(self._chunked) > MAX_PENDING_CHUNKED:
                dropped = self._chunked.pop(next(iter(self._chunked)))
                self._settle(dropped.consumer, dropped.positions, ack=False)
        elif kept is None or md.chunk_id != len(kept.parts) or kept.count != md.num_chunks_from_msg:
            log.warning("%s: chunk %d of %s on %s at %s does not follow what came before; "
                        "acknowledged", self.subscription, md.chunk_id, md.uuid, topic, position)
            self._settle(consumer, [position], ack=True)
            return None
        kept.parts.append(payload)
        kept.positions.append(position)
        if len(kept.parts) < kept.count:
            return None
        del self._chunked[key]
        whole = MessageMetadata()
        whole.CopyFrom(md)
        for name in ("uuid", "chunk_id", "num_chunks_from_msg", "total_chunk_msg_size"):
            whole.ClearField(name)
        return whole, b"".join(kept.parts), tuple(kept.positions[:-1])

    @staticmethod
    def _settle(consumer: Consumer, positions: list[Position], *, ack: bool) -> None:
        sub = consumer.subscription
        if sub is None or not positions:
            return
        if ack:
            sub.ack_individual(consumer, [(p, None) for p in positions])
        else:
            sub.redeliver(consumer, positions)

    def writable(self) -> bool:
        return self._writable()

    def active_consumer_changed(self, consumer: Consumer, active: bool) -> None:
        pass

    def reached_end_of_topic(self, consumer: Consumer) -> None:
        pass

    def wake(self) -> None:
        for _, consumer in self.attached.values():
            if consumer.subscription is not None:
                consumer.subscription.wake_for_room()


@dataclass(slots=True)
class _Chunked:
    """The chunks of one chunked message a subscriber has so far."""

    consumer: Consumer
    count: int
    parts: list[bytes] = field(default_factory=list)
    positions: list[Position] = field(default_factory=list)


def _pending(words: list[int] | None) -> Callable[[int], bool] | None:
    """Whether a batch index is still to deliver, by a Pulsar ack set (None: all are)."""
    if words is None:
        return None
    bits = 0
    for i, w in enumerate(words):
        bits |= (w & ((1 << 64) - 1)) << (64 * i)
    return lambda index: bool(bits >> index & 1)
