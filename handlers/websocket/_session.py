"""The WebSocket sessions: the trio drivers between one WebSocket (an ASGI connection on
the web service) and the BrokerService.

Each session is opened before the WebSocket is accepted, as Pulsar's handlers create their
producer, consumer or reader in the upgrade request: a failure answers the upgrade with an
HTTP error (:func:`handshake_status`) and no WebSocket is opened. Once open, one nursery
per session: a reader of the client's frames, and a writer that sends what the session
queued (answers, and messages that dispatch hands over from the subscription's task). What
waits to be written is bounded: by the permits a consumer or reader has (its receive queue,
or in pull mode what the client permitted), by the publishes a producer has in flight.

On a partitioned topic the session holds one producer or consumer per partition, as
Pulsar's partitioned producer and multi-topic consumer do; message ids carry the partition.
When the broker closes one of them (an unload, a seek, a fenced producer), the session
attaches again, as Pulsar's client under the WebSocket service reconnects, and the WebSocket
stays open.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from core.broker import NamespaceNotFoundError, SubscriptionNotFoundError, TopicNotFoundError
from core.format import NONE, EntryFormatError
from core.naming import InvalidNameError, TopicName
from core.policies import NotFoundError
from core.schema import IncompatibleSchemaError
from core.storage import Position
from core.subscription import (
    Consumer,
    ConsumerBusyError,
    Delivery,
    SubscriptionTypeMismatchError,
    SubType,
)
from core.topic import (
    BacklogQuotaExceededError,
    EncryptionRequiredError,
    PersistentTopic,
    Producer,
    ProducerAccessMode,
    ProducerBusyError,
    ProducerFencedError,
    PublishResult,
    TopicTerminatedError,
)
from handlers.websocket._codec import (
    DEFAULT_BATCHING_MAX_BYTES,
    Chunk,
    ConsumerParams,
    Delivered,
    Endpoint,
    FrameError,
    InvalidParams,
    Kind,
    MessageId,
    ProducerMessage,
    ProducerParams,
    ReaderParams,
    WebSocketError,
    ack_set_without,
    choose_partition,
    chunked_message,
    consumer_messages,
    decode_consumer_command,
    decode_message_id,
    decode_producer_message,
    encode_message_id,
    end_of_topic,
    producer_ack,
    producer_batch_entry,
    producer_entry,
    producer_error,
)

__all__ = ["SESSIONS", "handshake_status", "open_session"]

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

OUTBOX_LIMIT = 1024
"""Frames a session queues for its client before its consumers take no more messages."""
DEFAULT_MAX_PENDING_PUBLISHES = 1000
"""Publishes a producer has in flight, when the request names no ``maxPendingMessages``,
before the session reads no more of the client's frames until some are stored."""
MAX_PENDING_CHUNKED = 10
"""Chunked messages a consumer puts together at once (Pulsar's client's
``maxPendingChunkedMessage``)."""
ACK_TIMEOUT_TICK = 1.0
"""How often, in seconds at most, unacknowledged messages are checked against
``ackTimeoutMillis`` (Pulsar's client checks every second)."""
_NO_POSITION = (1 << 64) - 1  # the message id of a deduplicated publish: -1:-1

CLOSE_TIMEOUT = 5.0
"""Seconds a session that closes waits for what it queued, and its close frame, to go."""
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_SERVER_ERROR = 1011
"""The close code of a session whose client sent what Pulsar refuses (a frame that is not
its JSON). Pulsar names its own code in the reason; codes below 1000 cannot be sent in a
close frame (RFC 6455, 7.4)."""

_ids = iter(range(1, 1 << 62))


def handshake_status(kind: Kind, exc: BaseException) -> int:
    """The HTTP status Pulsar's WebSocket handlers answer an upgrade with when the producer
    or consumer cannot be created (``AbstractWebSocketHandler.getErrorCode``); a reader
    that cannot be created is answered 500, whatever the cause, as Pulsar's is."""
    if kind is Kind.reader:
        return 500
    match exc:
        case InvalidParams() | InvalidNameError():
            return 400
        case TopicNotFoundError() | NamespaceNotFoundError() | NotFoundError():
            return 404
        case (ProducerBusyError() | ConsumerBusyError() | SubscriptionTypeMismatchError()
              | ProducerFencedError() | IncompatibleSchemaError()):
            return 409
        case BacklogQuotaExceededError() | TopicTerminatedError():
            return 503
    return 500


def handshake_message(kind: Kind, exc: BaseException) -> str:
    if kind is Kind.reader:
        return f"Failed to create reader: {exc}"
    if isinstance(exc, InvalidParams | InvalidNameError):
        return f"Invalid query params: {exc}"
    return f"Failed to create producer/consumer: {exc}"


class Socket:
    """The ASGI side of one WebSocket: frames queued by any task and sent in order by
    :meth:`run_writer`; ``on_room`` is called when a full queue has drained to half."""

    def __init__(self, send: Send):
        self._send = send
        self._frames: deque[dict[str, Any]] = deque()
        self._wake = trio.Event()
        self._full = False
        self.closed = False
        self.close_sent = trio.Event()
        self.last_active = trio.current_time()
        self.on_room: Callable[[], None] = lambda: None

    def put(self, text: str) -> None:
        if self.closed:
            return
        self._frames.append({"type": "websocket.send", "text": text})
        if len(self._frames) >= OUTBOX_LIMIT:
            self._full = True
        self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """Close after what is queued: the writer sends the close frame and returns."""
        if self.closed:
            return
        self._frames.append({"type": "websocket.close", "code": code, "reason": reason[:120]})
        self.closed = True
        self._wake.set()

    def writable(self) -> bool:
        return not self._full and not self.closed

    async def close_when_idle(self, idle_seconds: float) -> None:
        """Close the WebSocket once nothing went either way for ``idle_seconds``
        (``webSocketSessionIdleTimeoutMillis``, Jetty's idle timeout under Pulsar's)."""
        while not self.closed:
            idle_until = self.last_active + idle_seconds
            if trio.current_time() >= idle_until:
                self.close(CLOSE_GOING_AWAY, "Connection Idle Timeout")
                return
            await trio.sleep_until(idle_until)

    async def run_writer(self) -> None:
        while not self.close_sent.is_set():
            while self._frames:
                frame = self._frames.popleft()
                try:
                    await self._send(frame)
                except Exception as exc:  # the client went away: nothing more to send
                    log.debug("websocket: send failed: %s", exc)
                    self.closed = True
                    self.close_sent.set()
                    return
                self.last_active = trio.current_time()
                if frame["type"] == "websocket.close":
                    self.close_sent.set()
                    return
                if self._full and len(self._frames) <= OUTBOX_LIMIT // 2:
                    self._full = False
                    self.on_room()
            self._wake = trio.Event()
            await self._wake.wait()


def _peer(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"/{client[0]}:{client[1]}" if client else ""


def _user_agent(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"user-agent":
            return str(value.decode("latin-1"))
    return ""


class Session:
    """What the three endpoints share: the socket, the topic's partitions, and the loop
    reading the client's text frames."""

    def __init__(self, broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                 send: Send):
        assert endpoint.topic is not None
        self.broker = broker
        self.config = config
        self.name = endpoint.topic
        self.peer_address = _peer(scope)
        self.client_version = _user_agent(scope)
        self.query = scope.get("query_string", b"")
        # frames queued before the WebSocket is accepted (dispatch may start as soon as a
        # consumer is attached) go out once it is
        self.socket = Socket(send)
        self.socket.on_room = self.wake_all
        self.partitions = 0
        self._nursery: trio.Nursery | None = None
        self.closed = False

    def topic_name(self, partition: int) -> TopicName:
        return self.name.partition(partition) if self.partitions else self.name

    async def resolve_partitions(self) -> None:
        self.partitions = await self.broker.partitioned_metadata(self.name)

    async def open(self) -> None:
        raise NotImplementedError

    async def run(self, receive: Receive) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.socket.run_writer)
                idle_ms = int(self.config.get("webSocketSessionIdleTimeoutMillis"))
                if idle_ms > 0:
                    nursery.start_soon(self.socket.close_when_idle, idle_ms / 1000)
                self.started(nursery)
                while not self.socket.closed:
                    message = await receive()
                    self.socket.last_active = trio.current_time()
                    if message["type"] == "websocket.disconnect":
                        break
                    text = message.get("text") if message["type"] == "websocket.receive" else None
                    if text is None:
                        continue  # as Pulsar's handlers, binary frames are not read
                    self.broker.stats.record_request("websocket")
                    try:
                        await self.on_text(text)
                    except Exception:
                        # a fault of the broker's: this session ends, the broker serves on
                        log.exception("websocket %s: session on %s failed", self.peer_address, self.name)
                        self.socket.close(CLOSE_SERVER_ERROR, WebSocketError.UnknownError.description)
                if self.socket.closed:
                    # what the session queued, and its close frame, go out before it ends
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await self.socket.close_sent.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            self.socket.closed = True  # answers still due (stored publishes) have no one to go to
            self.release()

    def started(self, nursery: trio.Nursery) -> None:
        """Start the session's own tasks, once its socket is open."""

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is not None and not self.closed:
            self._nursery.start_soon(fn, *args)

    def send(self, text: str) -> None:
        self.socket.put(text)

    def close_for(self, error: WebSocketError, detail: str = "") -> None:
        """Close the session as Pulsar does for a frame it cannot read."""
        reason = error.description + (f": {detail}" if detail else "")
        log.info("websocket %s: closing session on %s: %s", self.peer_address, self.name, reason)
        self.socket.close(CLOSE_PROTOCOL_ERROR, reason)

    def wake_all(self) -> None:
        pass

    async def on_text(self, text: str) -> None:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError


# -- producer ----------------------------------------------------------------------------------------


class ProducerSession(Session):
    def __init__(self, broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                 send: Send):
        super().__init__(broker, config, scope, endpoint, send)
        self.params = ProducerParams.parse(self.query)
        self.producers: dict[int, Producer] = {}
        self.producer_name = ""
        self.sequence_id = 0
        self._pending = 0
        self._room = trio.Event()
        self._next_partition = 0
        self._single_partition = 0
        self._batches: dict[int, list[ProducerMessage]] = {}  # open batches, by partition
        self._batch_bytes: dict[int, int] = {}
        self._publishes: deque[_Publish] = deque()  # waiting to be stored, oldest first
        self._publish_added = trio.Event()

    @property
    def _limit(self) -> int:
        return self.params.max_pending_messages or DEFAULT_MAX_PENDING_PUBLISHES

    async def open(self) -> None:
        if self.params.encryption_keys is not None:
            raise RuntimeError("Can't add encryption key without configuring "
                               "cryptoKeyReaderFactoryClassName")
        await self.resolve_partitions()
        self.producer_name = self.params.producer_name or \
            f"{self.broker.cluster}-websocket-{next(_ids)}"
        for partition in range(max(1, self.partitions)):
            await self._attach(partition)
        topic = self.producers[0].topic
        if self.params.initial_sequence_id is not None:
            self.sequence_id = self.params.initial_sequence_id + 1
        elif topic.dedup_enabled:
            self.sequence_id = topic.dedup_persisted.get(self.producer_name, -1) + 1
        if self.partitions:
            self._single_partition = random.randrange(self.partitions)
            self._next_partition = random.randrange(self.partitions)

    async def _attach(self, partition: int) -> Producer:
        topic = await self.broker.get_topic(self.topic_name(partition))
        await self.broker.schemas.add_or_check(topic, None)
        if topic.encryption_required:
            raise EncryptionRequiredError(f"Encryption is required in {topic.name}")
        producer = Producer(topic, next(_ids), self.producer_name, ProducerAccessMode.Shared,
                            address=self.peer_address, client_version=self.client_version)
        producer.on_fenced = lambda: self._fenced(partition, producer)
        await topic.add_producer(producer)
        if self.closed:
            topic.remove_producer(producer)
        else:
            self.producers[partition] = producer
        return producer

    def _fenced(self, partition: int, producer: Producer) -> None:
        """The broker closed the producer (an unload, a deleted topic): it attaches again
        at its next message."""
        if self.producers.get(partition) is producer:
            del self.producers[partition]

    def release(self) -> None:
        for producer in self.producers.values():
            producer.topic.remove_producer(producer)
        self.producers.clear()

    def _partition_for(self, key: str | None) -> int:
        if not self.partitions:
            return 0
        if self.params.routing_mode == "RoundRobinPartition":
            fallback = self._next_partition
            if key is None:
                self._next_partition = (self._next_partition + 1) % self.partitions
        else:
            fallback = self._single_partition
        return choose_partition(key, self.partitions, self.params.hashing_scheme, fallback)

    async def on_text(self, text: str) -> None:
        try:
            msg = decode_producer_message(text)
        except FrameError as exc:
            self.send(producer_error(exc.code, exc.message, exc.context))
            return
        if self._pending >= self._limit:
            if self.params.max_pending_messages:
                self.send(producer_error(WebSocketError.UnknownError,
                                         "Producer send queue is full", msg.context))
                return
            while self._pending >= self._limit:  # until some are stored
                self._room = trio.Event()
                await self._room.wait()
        partition = self._partition_for(msg.key)
        producer = self.producers.get(partition)
        if producer is None:
            try:
                producer = await self._attach(partition)
            except Exception as exc:
                self.send(producer_error(WebSocketError.UnknownError, str(exc), msg.context))
                return
        delayed = msg.deliver_after_ms > 0 or msg.deliver_at > 0
        if self.params.batching and not delayed:
            self._add_to_batch(partition, msg)
            return
        self._flush_batch(partition)  # what was batched before it goes first
        self._publish(producer, partition, msg)

    def _publish(self, producer: Producer, partition: int, msg: ProducerMessage) -> None:
        topic = producer.topic
        now = int(time.time() * 1000)
        if msg.deliver_after_ms > 0 or msg.deliver_at > 0:
            delay = msg.deliver_after_ms if msg.deliver_after_ms > 0 else msg.deliver_at - now
            limit = topic.max_delivery_delay_ms
            if limit > 0 and delay > limit:
                self.send(producer_error(WebSocketError.UnknownError,
                                         f"Exceeds max allowed delivery delay of {limit} milliseconds",
                                         msg.context))
                return
            topic.note_delayed()
        try:
            entry = producer_entry(msg, producer_name=producer.name, sequence_id=self.sequence_id,
                                   publish_time=now,
                                   compression=self.params.compression if msg.payload else NONE)
        except (ValueError, EntryFormatError) as exc:  # text protobuf cannot carry (lone surrogates)
            self.send(producer_error(WebSocketError.PayloadEncodingError, str(exc), msg.context))
            return
        self._pending += 1
        self._store(producer, partition, entry, [msg], batched=False)

    def _add_to_batch(self, partition: int, msg: ProducerMessage) -> None:
        """Batching (``batchingEnabled=true``): the message joins its partition's open
        batch, which is stored when it is full or its delay is up."""
        self._pending += 1
        batch = self._batches.get(partition)
        if batch is None:
            batch = self._batches[partition] = []
            self.spawn(self._flush_later, partition, batch)
        batch.append(msg)
        size = self._batch_bytes[partition] = self._batch_bytes.get(partition, 0) + len(msg.payload)
        if len(batch) >= self.params.batching_max_messages or size >= DEFAULT_BATCHING_MAX_BYTES:
            self._flush_batch(partition)

    async def _flush_later(self, partition: int, batch: list[ProducerMessage]) -> None:
        await trio.sleep(self.params.batching_max_delay_ms / 1000)
        if self._batches.get(partition) is batch:
            self._flush_batch(partition)

    def _flush_batch(self, partition: int) -> None:
        batch = self._batches.pop(partition, None)
        self._batch_bytes.pop(partition, None)
        if not batch:
            return
        producer = self.producers.get(partition)
        try:
            if producer is None:
                raise RuntimeError("Producer was closed by the broker")
            entry = producer_batch_entry(batch, producer_name=producer.name,
                                         sequence_id=self.sequence_id,
                                         publish_time=int(time.time() * 1000),
                                         compression=self.params.compression)
        except (ValueError, RuntimeError, EntryFormatError) as exc:
            self._settle(len(batch))
            for m in batch:
                self.send(producer_error(WebSocketError.UnknownError, str(exc), m.context))
            return
        self._store(producer, partition, entry, batch, batched=True)

    def _store(self, producer: Producer, partition: int, entry: bytes, msgs: list[ProducerMessage],
               *, batched: bool) -> None:
        """Publish ``entry`` (``msgs``, counted in ``_pending``) and answer each message:
        its message id (with its batch index when ``batched``), or the failure."""
        n = len(msgs)
        seq = self.sequence_id
        self.sequence_id += n
        producer.msg_in += n
        producer.bytes_in += len(entry)
        pid = partition if self.partitions else -1

        publish = _Publish(trio.current_time() + self.params.send_timeout_ms / 1000, msgs)
        if self.params.send_timeout_ms > 0:
            self._publishes.append(publish)
            self._publish_added.set()

        def done(result: PublishResult) -> None:
            if publish.answered:
                return  # answered with its timeout already
            publish.answered = True
            self._settle(n)
            if result.error is not None:
                for m in msgs:
                    self.send(producer_error(WebSocketError.UnknownError, str(result.error), m.context))
                return
            pos = result.position
            ledger, entry_id = (pos.ledger_id, pos.entry_id) if pos is not None else (_NO_POSITION, _NO_POSITION)
            for i, m in enumerate(msgs):
                mid = MessageId(ledger, entry_id, pid, i, n) if batched else MessageId(ledger, entry_id, pid)
                self.send(producer_ack(encode_message_id(mid), m.context))

        producer.topic.publish(entry, n, producer.name, seq + n - 1, done)

    def _settle(self, n: int) -> None:
        """``n`` messages are answered: room for as many more."""
        self._pending -= n
        if self._pending < self._limit:
            self._room.set()

    def started(self, nursery: trio.Nursery) -> None:
        if self.params.send_timeout_ms > 0:
            nursery.start_soon(self._send_timeouts)

    async def _send_timeouts(self) -> None:
        """Answer a publish that is not stored within ``sendTimeoutMillis`` with a failure,
        as Pulsar's producer fails it (if it is stored later, it is not answered again).
        Publishes are stored in order, so the oldest one waiting is the first to check."""
        publishes = self._publishes
        while True:
            while publishes and publishes[0].answered:
                publishes.popleft()
            if not publishes:
                self._publish_added = trio.Event()
                await self._publish_added.wait()
                continue
            head = publishes[0]
            if trio.current_time() < head.deadline:
                await trio.sleep_until(head.deadline)
                continue
            publishes.popleft()
            head.answered = True
            self._settle(len(head.msgs))
            for m in head.msgs:
                self.send(producer_error(
                    WebSocketError.UnknownError,
                    f"The producer {self.producer_name} can not send message to the topic "
                    f"{self.name} within given timeout", m.context))


@dataclass(slots=True)
class _Publish:
    """A publish waiting to be stored: by when, and its messages."""

    deadline: float
    msgs: list[ProducerMessage]
    answered: bool = False


# -- consumer and reader -----------------------------------------------------------------------------


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
        consumer = Consumer(next(_ids), self.consumer_name, self,
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
                                    partition, d.redelivery_count, d.ack_set)
            chunks: tuple[Position, ...] = ()
            if isinstance(got, Chunk):
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
        self.params = ConsumerParams(receiver_queue_size=self.reader_params.receiver_queue_size)
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


SESSIONS: dict[Kind, type[Session]] = {
    Kind.producer: ProducerSession,
    Kind.consumer: ConsumerSession,
    Kind.reader: ReaderSession,
}
"""The session class of each endpoint served."""


async def open_session(broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                       send: Send) -> Session:
    """The session an endpoint names, opened (its producer, consumer or reader created);
    raises what :func:`handshake_status` maps to the upgrade's answer."""
    session = SESSIONS[endpoint.kind](broker, config, scope, endpoint, send)
    await session.open()
    return session
