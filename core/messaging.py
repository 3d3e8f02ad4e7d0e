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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from core.format import EntryFormatError, Message, ack_set_but, entry_from_messages
from core.format._entry import indexed_messages
from core.naming import TopicName
from core.storage import Position
from core.subscription import Consumer, Delivery, SubType
from core.topic import PersistentTopic, PublishResult

__all__ = ["publish", "Received", "Subscriber", "EMPTY", "end_of"]

log = logging.getLogger(__name__)

_sequence = itertools.count()
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
    """Store ``messages`` on the topic ``name`` (created when the namespace allows it) as
    one entry; return its position once durable, or raise what storing it raised."""
    topic: PersistentTopic = await broker.get_topic(name)  # type: ignore[attr-defined]
    entry = entry_from_messages(messages, producer_name=producer_name,
                                sequence_id=next(_sequence), publish_time=int(time.time() * 1000))
    done = trio.Event()
    result: list[PublishResult] = []

    def stored(r: PublishResult) -> None:
        result.append(r)
        done.set()

    topic.publish(entry, len(messages), producer_name, next(_sequence), stored)
    await done.wait()
    if result[0].error is not None:
        raise result[0].error
    pos = result[0].position
    return pos if pos is not None else Position(-1, -1)


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
        got = self.attached.pop(str(name), None)
        if got is None:
            return
        topic, consumer = got
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
            sub.ack_individual(r.consumer, [(r.position, None)])

    def nack(self, r: Received) -> None:
        sub = r.consumer.subscription
        if sub is not None:
            sub.redeliver(r.consumer, [r.position])

    def flow(self, r: Received, permits: int = 1) -> None:
        r.consumer.flow(permits)

    # -- ConsumerSink --------------------------------------------------------------------

    def send_messages(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        topic = consumer.subscription.topic.name if consumer.subscription is not None else None
        if topic is None:
            return
        give_back = 0
        for d in deliveries:
            entry = d.entry
            try:
                messages = indexed_messages(entry.data)
            except EntryFormatError as exc:
                log.warning("%s: entry %s of %s cannot be read (%s); acknowledged",
                            self.subscription, entry.position, topic, exc)
                if consumer.subscription is not None:
                    consumer.subscription.ack_individual(consumer, [(entry.position, None)])
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
                                      entry.index - entry.num_messages + 1 + index))
            give_back += entry.num_messages - sent
        if give_back:
            consumer.flow(give_back)

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


def _pending(words: list[int] | None) -> Callable[[int], bool] | None:
    """Whether a batch index is still to deliver, by a Pulsar ack set (None: all are)."""
    if words is None:
        return None
    bits = 0
    for i, w in enumerate(words):
        bits |= (w & ((1 << 64) - 1)) << (64 * i)
    return lambda index: bool(bits >> index & 1)
