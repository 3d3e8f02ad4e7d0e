"""The consumer and reader endpoints' sessions (``/ws/v2/consumer/...``,
``/ws/v2/reader/...``): messages pushed as Pulsar's ``ConsumerMessage``, the client's
acknowledgements, negative acknowledgements, permits and questions taken as Pulsar's
``ConsumerCommand``."""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import trio

from core.broker import SubscriptionNotFoundError
from core.naming import TopicName
from core.storage import Position
from core.subscription import (
    Consumer,
    Delivery,
    SubType,
)
from core.topic import (
    PersistentTopic,
    PublishResult,
)
from handlers.websocket._codec import (
    Chunk,
    ConsumerParams,
    Delivered,
    Endpoint,
    FrameError,
    Kind,
    MessageId,
    ProducerMessage,
    ReaderParams,
    Undecryptable,
    WebSocketError,
    ack_set_without,
    chunked_message,
    consumer_messages,
    decode_consumer_command,
    decode_message_id,
    decode_producer_message,
    end_of_topic,
    producer_entry,
)
from handlers.websocket._session import CLOSE_SERVER_ERROR, Send, Session, next_id

__all__ = ["ConsumerSession", "ReaderSession"]

log = logging.getLogger(__name__)

MAX_PENDING_CHUNKED = 10
"""Chunked messages a consumer puts together at once (Pulsar's client's
``maxPendingChunkedMessage``)."""
ACK_TIMEOUT_TICK = 1.0
"""How often, in seconds at most, unacknowledged messages are checked against
``ackTimeoutMillis`` (Pulsar's client checks every second)."""


@dataclass(slots=True)
class InFlight:
    """A message sent to the client and not yet acknowledged: when it was sent, with what
    redelivery count, and its frame (what goes to a dead letter topic)."""

    sent_at: float
    redelivery_count: int
    frame: str
    chunks: tuple[Position, ...] = ()  # a chunked message's entries


_Key = tuple[int, Position, int]  # partition (-1 when not partitioned), entry, batch index


class ConsumerSession(Session):
    """A consumer (``/ws/v2/consumer/...``) and, with :class:`ReaderSession`'s changes, a
    reader. Push mode keeps ``receiverQueueSize`` messages unacknowledged at most: each
    message sent takes a permit, each acknowledgement or negative acknowledgement of one
    gives it back. In pull mode only the client's ``permit`` commands give permits."""

    kind = Kind.consumer

    def __init__(self, broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                 send: Send):
        super().__init__(broker, config, scope, endpoint, send)
        self.subscription = endpoint.subscription
        self.params = ConsumerParams.parse(self.query, self.name, self.subscription)
        self.consumers: dict[int, tuple[PersistentTopic, Consumer]] = {}  # by partition
        self.consumer_name = self.params.consumer_name or secrets.token_hex(3)[:5]
        self.in_flight: dict[_Key, InFlight] = {}
        self.end_of_topic: set[int] = set()
        self._dlq_topic: PersistentTopic | None = None
        # the chunks of messages not complete yet, by partition and uuid
        self._chunks: dict[tuple[int, str], list[tuple[Position, Chunk]]] = {}

    # -- attaching ----------------------------------------------------------------------------------

    @property
    def sub_type(self) -> SubType:
        return SubType[self.params.subscription_type]

    def initial_permits(self) -> int:
        if self.params.pull_mode:
            return 0
        size = self.params.receiver_queue_size or 1
        return max(1, size // max(1, self.partitions))

    async def open(self) -> None:
        await self.resolve_partitions()
        for partition in range(max(1, self.partitions)):
            await self._attach(partition)

    async def subscribe(self, topic: PersistentTopic, consumer: Consumer) -> None:
        if (self.params.durable and topic.name.persistent and self.subscription not in topic.subscriptions
                and not topic.auto_subscription_creation_allowed):
            # Pulsar's client fails with SubscriptionNotFoundException, which its WebSocket
            # handler answers 500
            raise SubscriptionNotFoundError("Subscription does not exist")
        await topic.subscribe(self.subscription, consumer, self.sub_type,
                              durable=self.params.durable)

    async def _attach(self, partition: int) -> None:
        topic = await self.broker.get_topic(self.topic_name(partition))
        consumer = Consumer(next_id(), self.consumer_name, self,
                            priority=self.params.priority_level)
        await self.subscribe(topic, consumer)
        if self.closed:
            topic.consumer_closed(consumer)
            return
        self.consumers[partition if self.partitions else -1] = (topic, consumer)
        consumer.flow(self.initial_permits())

    def release(self) -> None:
        for topic, consumer in self.consumers.values():
            topic.consumer_closed(consumer)
        self.consumers.clear()

    def broker_closed_consumer(self, consumer: Consumer, *, reset: bool = False) -> None:
        """The broker closed a consumer (a seek, an unload): attach again, as Pulsar's
        client under the WebSocket service does."""
        for partition, (topic, c) in list(self.consumers.items()):
            if c is consumer:
                del self.consumers[partition]
                topic.consumer_closed(consumer, reset=reset)
                self.in_flight = {k: v for k, v in self.in_flight.items() if k[0] != partition}
                self.spawn(self._reattach, partition)

    async def _reattach(self, partition: int) -> None:
        try:
            await self._attach(max(partition, 0))
        except Exception as exc:
            log.info("websocket: %s could not attach again to %s: %s", self.consumer_name, self.name, exc)
            self.socket.close(CLOSE_SERVER_ERROR, f"Consumer was closed: {exc}")

    def _consumer_of(self, partition: int) -> Consumer | None:
        attached = self.consumers.get(partition if self.partitions else -1)
        return attached[1] if attached is not None else None

    # -- ConsumerSink --------------------------------------------------------------------------------

    def send_messages(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        partition = next((p for p, (_, c) in self.consumers.items() if c is consumer), None)
        if partition is None:
            return
        now = time.monotonic()
        # permits the dispatch took for messages not sent (acknowledged messages of a batch,
        # an entry that cannot be read) go back; in push mode, so do those of messages sent
        # again while in flight, which hold the permit they took the first time
        give_back = 0
        push = not self.params.pull_mode
        for d in deliveries:
            e = d.entry
            got = consumer_messages(e.data, e.position.ledger_id, e.position.entry_id,
                                    partition, d.redelivery_count, d.ack_set,
                                    self.params.crypto_failure_action)
            chunks: tuple[Position, ...] = ()
            if isinstance(got, Undecryptable):
                messages: list[Delivered] = []
                if got.discard and consumer.subscription is not None:
                    consumer.subscription.ack_individual(consumer, [(e.position, None)])
            elif isinstance(got, Chunk):
                # a chunk's permit goes back but for the last one's, which the whole
                # message holds
                whole = self._put_together(partition, e.position, got, d.redelivery_count)
                messages, chunks = ([whole[0]], whole[1]) if whole is not None else ([], ())
            else:
                messages = got
            give_back += e.num_messages - len(messages)
            for m in messages:
                key = (partition, e.position, m.message_id.batch_index)
                if push and key in self.in_flight:
                    give_back += 1
                self.in_flight[key] = InFlight(now, d.redelivery_count, m.frame, chunks)
                self.sent(m)
        if give_back:
            consumer.flow(give_back)

    def _put_together(self, partition: int, pos: Position, chunk: Chunk, redelivery_count: int
                      ) -> tuple[Delivered, tuple[Position, ...]] | None:
        """Keep a chunk until its message's last one came, then that message and its
        entries. A chunk out of order drops what was kept of its message, as Pulsar's
        client does; so does a message beyond :data:`MAX_PENDING_CHUNKED` incomplete
        ones (the oldest goes)."""
        key = (partition, chunk.uuid)
        if chunk.chunk_id == 0:
            self._chunks.pop(key, None)
            self._chunks[key] = []
            while len(self._chunks) > MAX_PENDING_CHUNKED:
                del self._chunks[next(iter(self._chunks))]
        parts = self._chunks.get(key)
        if parts is None or len(parts) != chunk.chunk_id:
            self._chunks.pop(key, None)
            return None
        parts.append((pos, chunk))
        if chunk.chunk_id + 1 < chunk.num_chunks:
            return None
        del self._chunks[key]
        first = parts[0][0]
        whole = chunked_message([c for _, c in parts], MessageId(first.ledger_id, first.entry_id, partition),
                                MessageId(pos.ledger_id, pos.entry_id, partition), redelivery_count)
        return (whole, tuple(p for p, _ in parts)) if whole is not None else None

    def sent(self, delivered: Delivered) -> None:
        self.send(delivered.frame)

    def writable(self) -> bool:
        return self.socket.writable()

    def wake_all(self) -> None:
        for _, consumer in self.consumers.values():
            if consumer.subscription is not None:
                consumer.subscription.wake_for_room()

    def active_consumer_changed(self, consumer: Consumer, active: bool) -> None:
        pass

    def reached_end_of_topic(self, consumer: Consumer) -> None:
        for partition, (_, c) in self.consumers.items():
            if c is consumer:
                self.end_of_topic.add(partition)

    # -- the client's commands -----------------------------------------------------------------------

    def started(self, nursery: trio.Nursery) -> None:
        if self.params.ack_timeout_ms > 0:
            nursery.start_soon(self._ack_timeouts)

    async def on_text(self, text: str) -> None:
        try:
            cmd = decode_consumer_command(text)
            if cmd.type == "permit":
                if cmd.permit_messages is None:
                    raise FrameError(WebSocketError.FailedToDeserializeFromJSON,
                                     "Missing required permitMessages field for 'permit' command")
                self._permit(cmd.permit_messages)
            elif cmd.type == "unsubscribe":
                await self._unsubscribe()
            elif cmd.type == "negativeAcknowledge":
                self._nack(decode_message_id(cmd.message_id))
            elif cmd.type == "isEndOfTopic":
                self.send(end_of_topic(self.reached_end()))
            else:
                self._ack(decode_message_id(cmd.message_id))
        except FrameError as exc:
            self.close_for(exc.code)

    def reached_end(self) -> bool:
        return bool(self.consumers) and all(p in self.end_of_topic for p in self.consumers)

    def _permit(self, n: int) -> None:
        if not self.params.pull_mode or n <= 0 or not self.consumers:
            return
        attached = list(self.consumers.values())
        share, extra = divmod(n, len(attached))
        for i, (_, consumer) in enumerate(attached):
            if share + (i < extra):
                consumer.flow(share + (i < extra))

    def _settled(self, mid: MessageId) -> tuple[Consumer, InFlight | None] | None:
        """The consumer a message id names, and its in-flight record, now forgotten; in
        push mode its permit goes back."""
        consumer = self._consumer_of(mid.partition)
        if consumer is None:
            return None
        part = mid.partition if self.partitions else -1
        record = self.in_flight.pop((part, Position(mid.ledger_id, mid.entry_id), mid.batch_index), None)
        if record is not None and not self.params.pull_mode:
            consumer.flow(1)
        return consumer, record

    def _ack(self, mid: MessageId) -> None:
        settled = self._settled(mid)
        if settled is None or settled[0].subscription is None:
            return
        consumer, record = settled
        pos = Position(mid.ledger_id, mid.entry_id)
        ack_set = ack_set_without(mid.batch_size, mid.batch_index) \
            if mid.batch_index >= 0 and mid.batch_size > 0 else None
        acks = [(pos, ack_set)]
        if record is not None and record.chunks:
            acks = [(p, None) for p in record.chunks]  # every entry of a chunked message
        elif mid.first_chunk is not None:
            acks.append((Position(mid.first_chunk.ledger_id, mid.first_chunk.entry_id), None))
        assert consumer.subscription is not None
        consumer.subscription.ack_individual(consumer, acks)

    def _nack(self, mid: MessageId) -> None:
        settled = self._settled(mid)
        if settled is None:
            return
        consumer, record = settled
        part = mid.partition if self.partitions else -1
        self.spawn(self._redeliver_after, self.params.nack_delay_ms / 1000, consumer,
                   {(part, Position(mid.ledger_id, mid.entry_id), mid.batch_index): record})

    async def _redeliver_after(self, delay: float, consumer: Consumer,
                               records: dict[_Key, InFlight | None]) -> None:
        await trio.sleep(delay)
        await self._redeliver(consumer, records)

    async def _redeliver(self, consumer: Consumer, records: dict[_Key, InFlight | None]) -> None:
        """Deliver these messages again; those delivered ``maxRedeliverCount`` times
        already go to the dead letter topic instead (and are acknowledged), as Pulsar's
        client sends them there when it would have them redelivered."""
        sub = consumer.subscription
        if sub is None:
            return
        dead = {k: r for k, r in records.items() if r is not None and self.params.max_redeliver_count > 0
                and r.redelivery_count >= self.params.max_redeliver_count}
        for key, record in dead.items():
            if await self._to_dead_letter(key, record):
                self._ack(decode_message_id(json.loads(record.frame)["messageId"]))
        again = sorted({p for k, r in records.items() if k not in dead
                        for p in ((r.chunks if r is not None else ()) or (k[1],))})
        if again and consumer.subscription is not None:
            consumer.subscription.redeliver(consumer, again)

    async def _to_dead_letter(self, key: _Key, record: InFlight) -> bool:
        try:
            msg = decode_producer_message(record.frame)
            if self._dlq_topic is None:
                assert self.params.dead_letter_topic is not None
                self._dlq_topic = await self.broker.get_topic(TopicName.parse(self.params.dead_letter_topic))
        except Exception as exc:
            log.warning("websocket: cannot send to dead letter topic %s: %s",
                        self.params.dead_letter_topic, exc)
            return False
        partition, pos, index = key
        origin = f"{pos.ledger_id}:{pos.entry_id}:{partition}" + (f":{index}" if index >= 0 else "")
        props = {**msg.properties, "REAL_TOPIC": str(self.topic_name(max(partition, 0))),
                 "ORIGIN_MESSAGE_ID": origin}
        dead = ProducerMessage(payload=msg.payload, properties=props, key=msg.key,
                               event_time=msg.event_time)
        entry = producer_entry(dead, producer_name=f"{self.name}-{self.subscription}-{self.consumer_name}-DLQ",
                               sequence_id=0, publish_time=int(time.time() * 1000))
        stored = trio.Event()
        failed: list[BaseException] = []

        def done(result: PublishResult) -> None:
            if result.error is not None:
                failed.append(result.error)
            stored.set()

        self._dlq_topic.publish(entry, 1, None, 0, done)
        await stored.wait()
        if failed:
            log.warning("websocket: cannot send to dead letter topic %s: %s",
                        self.params.dead_letter_topic, failed[0])
            self._dlq_topic = None  # closed or unloaded, perhaps: open it again next time
        return not failed

    async def _ack_timeouts(self) -> None:
        timeout = self.params.ack_timeout_ms / 1000
        while True:
            await trio.sleep(min(timeout, ACK_TIMEOUT_TICK))
            now = time.monotonic()
            due: dict[int, dict[_Key, InFlight | None]] = {}
            for key, record in self.in_flight.items():
                if now - record.sent_at >= timeout:
                    record.sent_at = now
                    due.setdefault(key[0], {})[key] = record
            for partition, records in due.items():
                consumer = self._consumer_of(partition)
                if consumer is not None:
                    await self._redeliver(consumer, records)

    async def _unsubscribe(self) -> None:
        for _, consumer in self.consumers.values():
            sub = consumer.subscription
            if sub is not None and len(sub.consumers) > 1:
                # Pulsar's client fails the unsubscribe, and its WebSocket handler closes
                # the session for it as for a frame it could not read
                raise FrameError(WebSocketError.FailedToDeserializeFromJSON,
                                 "Unconnected or shared consumer attempting to unsubscribe")
        for topic, consumer in list(self.consumers.values()):
            sub = consumer.subscription
            topic.consumer_closed(consumer)
            if sub is not None:
                try:
                    await topic.unsubscribe(sub.name)
                except Exception as exc:
                    raise FrameError(WebSocketError.FailedToDeserializeFromJSON, str(exc)) from None
        self.consumers.clear()
        self.in_flight.clear()


class ReaderSession(ConsumerSession):
    """A reader (``/ws/v2/reader/...``): a non-durable Exclusive subscription of its own,
    from ``messageId`` on (earliest, latest, or the message after the one named). As
    Pulsar's reader does, it acknowledges what it was sent, and the client's frames (but
    ``isEndOfTopic``) only give permits back."""

    kind = Kind.reader

    def __init__(self, broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                 send: Send):
        Session.__init__(self, broker, config, scope, endpoint, send)
        self.reader_params = ReaderParams.parse(self.query)
        self.params = ConsumerParams(receiver_queue_size=self.reader_params.receiver_queue_size,
                                     crypto_failure_action=self.reader_params.crypto_failure_action)
        self.subscription = "reader-" + secrets.token_hex(5)
        self.consumers = {}
        self.consumer_name = self.reader_params.reader_name or secrets.token_hex(3)[:5]
        self.in_flight = {}
        self.end_of_topic = set()
        self._dlq_topic = None
        self._chunks = {}
        self._unacked = 0

    async def subscribe(self, topic: PersistentTopic, consumer: Consumer) -> None:
        start = self.reader_params.start
        pos = None
        if isinstance(start, MessageId):
            # after the message named; a batch's later messages are in its entry
            pos = Position(start.ledger_id, start.entry_id + (0 if start.batch_index >= 0 else 1))
        await topic.subscribe(self.subscription, consumer, SubType.Exclusive, durable=False,
                              earliest=start == "earliest", start=pos)

    def send_messages(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        start = self.reader_params.start
        if isinstance(start, MessageId) and start.batch_index >= 0:
            first = Position(start.ledger_id, start.entry_id)
            deliveries = [d if d.entry.position != first else
                          Delivery(d.entry, d.redelivery_count,
                                   _without_first(d.ack_set, d.entry.num_messages, start.batch_index))
                          for d in deliveries]
        super().send_messages(consumer, deliveries)
        if deliveries and consumer.subscription is not None:
            # Pulsar's reader acknowledges what it reads, so its cursor moves on
            consumer.subscription.ack_cumulative(consumer, deliveries[-1].entry.position)

    def sent(self, delivered: Delivered) -> None:
        self.in_flight.clear()  # a reader's messages are acknowledged as they are read
        self._unacked += 1
        self.send(delivered.frame)

    async def on_text(self, text: str) -> None:
        try:
            cmd = decode_consumer_command(text)
        except FrameError as exc:
            self.close_for(exc.code)
            return
        if cmd.type == "isEndOfTopic":
            self.send(end_of_topic(self.reached_end()))
            return
        if self._unacked > 0 and self.consumers:
            # Pulsar's reader reads no more of an ack than that one came: its permit goes
            # back to the partition the id names, when it names one the reader reads
            self._unacked -= 1
            try:
                consumer = self._consumer_of(decode_message_id(cmd.message_id).partition)
            except FrameError:
                consumer = None
            if consumer is None:
                consumer = next(iter(self.consumers.values()))[1]
            consumer.flow(1)


def _without_first(ack_set: list[int] | None, size: int, last_skipped: int) -> list[int]:
    """An ack set that leaves out a batch's messages up to ``last_skipped``."""
    words = list(ack_set) if ack_set is not None else \
        [((1 << min(64, size - w * 64)) - 1) for w in range((size + 63) // 64)]
    for i in range(min(last_skipped + 1, size)):
        words[i // 64] &= ~(1 << (i % 64))
    return words
