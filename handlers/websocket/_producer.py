"""The producer endpoint's session (``/ws/v2/producer/...``): each text frame a message to
publish, each answered with Pulsar's ``ProducerAck``."""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import trio

from core.format import NONE, EntryFormatError
from core.topic import (
    EncryptionRequiredError,
    Producer,
    ProducerAccessMode,
    PublishResult,
)
from handlers.websocket._codec import (
    DEFAULT_BATCHING_MAX_BYTES,
    Endpoint,
    FrameError,
    MessageId,
    ProducerMessage,
    ProducerParams,
    WebSocketError,
    choose_partition,
    decode_producer_message,
    encode_message_id,
    producer_ack,
    producer_batch_entry,
    producer_entry,
    producer_error,
)
from handlers.websocket._session import Send, Session, next_id

__all__ = ["ProducerSession"]

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_PUBLISHES = 1000
"""Publishes a producer has in flight, when the request names no ``maxPendingMessages``,
before the session reads no more of the client's frames until some are stored."""
_NO_POSITION = (1 << 64) - 1  # the message id of a deduplicated publish: -1:-1


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
            f"{self.broker.cluster}-websocket-{next_id()}"
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
        producer = Producer(topic, next_id(), self.producer_name, ProducerAccessMode.Shared,
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
