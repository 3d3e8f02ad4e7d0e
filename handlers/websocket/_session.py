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

import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from core.broker import NamespaceNotFoundError, TopicNotFoundError
from core.format import NONE
from core.naming import InvalidNameError, TopicName
from core.policies import NotFoundError
from core.schema import IncompatibleSchemaError
from core.subscription import (
    ConsumerBusyError,
    SubscriptionTypeMismatchError,
)
from core.topic import (
    BacklogQuotaExceededError,
    EncryptionRequiredError,
    Producer,
    ProducerAccessMode,
    ProducerBusyError,
    ProducerFencedError,
    PublishResult,
    TopicTerminatedError,
)
from handlers.websocket._codec import (
    Endpoint,
    FrameError,
    InvalidParams,
    Kind,
    MessageId,
    ProducerMessage,
    ProducerParams,
    WebSocketError,
    choose_partition,
    decode_producer_message,
    encode_message_id,
    producer_ack,
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
ACK_TIMEOUT_TICK = 1.0
"""How often, in seconds at most, unacknowledged messages are checked against
``ackTimeoutMillis`` (Pulsar's client checks every second)."""
_NO_POSITION = (1 << 64) - 1  # the message id of a deduplicated publish: -1:-1

CLOSE_TIMEOUT = 5.0
"""Seconds a session that closes waits for what it queued, and its close frame, to go."""
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
"""The close code of a session whose client sent what Pulsar refuses (a frame that is not
its JSON). Pulsar names its own code in the reason; codes below 1000 cannot be sent in a
close frame (RFC 6455, 7.4)."""

_ids = iter(range(1, 1 << 62))


def handshake_status(exc: BaseException) -> int:
    """The HTTP status Pulsar's WebSocket handlers answer an upgrade with when the producer
    or consumer cannot be created (``AbstractWebSocketHandler.getErrorCode``)."""
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
    if isinstance(exc, InvalidParams | InvalidNameError):
        return f"Invalid query params: {exc}"
    if kind is Kind.reader:
        return f"Failed to create reader: {exc}"
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
                await self._send(frame)
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
                nursery.start_soon(self.socket.close_when_idle,
                                   int(self.config.get("webSocketSessionIdleTimeoutMillis")) / 1000)
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
                    await self.on_text(text)
                if self.socket.closed:
                    # what the session queued, and its close frame, go out before it ends
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await self.socket.close_sent.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
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
        seq = self.sequence_id
        self.sequence_id += 1
        entry = producer_entry(msg, producer_name=producer.name, sequence_id=seq, publish_time=now,
                               compression=self.params.compression if msg.payload else NONE)
        producer.msg_in += 1
        producer.bytes_in += len(entry)
        self._pending += 1
        pid = partition if self.partitions else -1
        context = msg.context

        def done(result: PublishResult) -> None:
            self._pending -= 1
            if self._pending < self._limit:
                self._room.set()
            if result.error is not None:
                self.send(producer_error(WebSocketError.UnknownError, str(result.error), context))
                return
            pos = result.position
            mid = MessageId(pos.ledger_id, pos.entry_id, pid) if pos is not None \
                else MessageId(_NO_POSITION, _NO_POSITION, pid)
            self.send(producer_ack(encode_message_id(mid), context))

        topic.publish(entry, 1, producer.name, seq, done)


SESSIONS: dict[Kind, type[Session]] = {
    Kind.producer: ProducerSession,
}
"""The session class of each endpoint served."""


async def open_session(broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                       send: Send) -> Session:
    """The session an endpoint names, opened (its producer, consumer or reader created);
    raises what :func:`handshake_status` maps to the upgrade's answer."""
    session = SESSIONS[endpoint.kind](broker, config, scope, endpoint, send)
    await session.open()
    return session
