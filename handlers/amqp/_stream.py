"""Stream queues (``x-queue-type=stream``, as RabbitMQ's streams): a queue that is a topic
itself, read by offset and never consumed away.

The stream ``s`` of a vhost is the topic ``s`` of its namespace. A publish to the default
exchange with routing key ``s`` is stored there directly; what the exchanges bound to it
route to it is copied there by a forwarder (the subscription ``amqp.s`` on each of their
topics, acknowledged once the copy is durable). Each consumer reads the topic on its own
non-durable subscription, from the ``x-stream-offset`` it gives: ``first``, ``last`` (the
last entry), ``next`` (what comes next, the default), an offset (the message's index in
the topic, Kafka's offset there) or a timestamp; every delivery carries its offset in the
``x-stream-offset`` header. An ack only gives the consumer credit (its prefetch), as
RabbitMQ's streams do; a nack or a closed channel does not put anything back.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trio

from core.format import Message
from core.messaging import EMPTY, Received, Subscriber, end_of, publish
from core.naming import TopicName
from core.storage import Position
from core.subscription import SubType
from handlers.amqp._codec import AMQPError, ReplyCode
from handlers.amqp._model import QueueDecl, VHost, queue_subscription
from handlers.amqp._queue import Held

if TYPE_CHECKING:
    from handlers.amqp._handler import AMQPProtocolHandler

__all__ = ["StreamQueue", "is_stream"]

log = logging.getLogger(__name__)


def is_stream(decl: QueueDecl) -> bool:
    return str(decl.arguments.get("x-queue-type", "")) == "stream"


class StreamReader:
    """One consumer's reading of a stream; the channel settles its deliveries here."""

    def __init__(self, stream: StreamQueue, consumer: Any):
        self.stream = stream
        self.consumer = consumer
        self.subscriber = Subscriber(stream.h.broker, f"amqp-stream-{uuid.uuid4()}", self._arrived,
                                     window=max(1, consumer.prefetch or consumer.channel.global_prefetch))
        self.waiting: list[Held] = []
        self.unacked = 0
        self.first_offset = 0  # messages below it (the start of their entry) are skipped
        self.live = False  # deliveries wait for the consume-ok
        # what the channel reads of a queue
        self.decl = stream.decl
        self.vhost = stream.vhost
        self.name = stream.name
        self.consumers = [consumer]
        self.had_consumer = True
        self.deleted = False

    async def start(self, offset: Any) -> None:
        topic = await self.stream.h.broker.get_topic(self.stream.topic)
        start, self.first_offset = await _start(topic, offset)
        await self.subscriber.attach(self.stream.topic, sub_type=SubType.Exclusive,
                                     durable=False, start=start)

    def _arrived(self, r: Received) -> None:
        if r.offset < self.first_offset:
            self.settle(r)
            return
        m = r.message
        headers = dict(self.stream.h.headers_of(m))
        headers["x-stream-offset"] = r.offset
        r = replace(r, message=_with_headers(m, headers))
        self.waiting.append(Held(r, "", False))
        self.dispatch()

    def go(self) -> None:
        self.live = True
        self.dispatch()

    def dispatch(self) -> None:
        while self.live and self.waiting and self.consumer.has_room(self.waiting[0]):
            held = self.waiting.pop(0)
            self.unacked += 1
            self.consumer.deliver(self, held)

    def settle(self, r: Received) -> None:
        self.subscriber.ack(r)
        self.subscriber.flow(r)

    def requeue(self, held: list[Held]) -> None:
        for h in held:
            self.settle(h.received)

    def remove_consumer(self, c: Any) -> None:
        self.consumers = []
        self.stream.readers.discard(self)
        if self.stream.h_nursery is not None:
            self.stream.h_nursery.start_soon(self.subscriber.close)

    @property
    def message_count(self) -> int:
        return 0


class StreamQueue:
    """What the handler keeps of a stream queue (in ``handler.queues`` beside the others)."""

    def __init__(self, handler: AMQPProtocolHandler, vhost: VHost, decl: QueueDecl):
        self.h = handler
        self.vhost = vhost
        self.decl = decl
        self.topic = handler.stream_topic(vhost.name, decl.name)
        self.forwarder = Subscriber(handler.broker, queue_subscription(decl.name), self._arrived,
                                    window=1000)
        self.sources: dict[str, TopicName] = {}
        self.readers: set[StreamReader] = set()
        self.owner: Any = None
        self.exclusive_consumer: Any = None
        self.unacked = 0
        self.had_consumer = False
        self.deleted = False
        self.h_nursery: trio.Nursery | None = None
        self._copies: trio.MemorySendChannel[Received] | None = None

    @property
    def name(self) -> str:
        return self.decl.name

    @property
    def consumers(self) -> list[Any]:
        return [r.consumer for r in self.readers]

    @property
    def message_count(self) -> int:
        topic = self.h.broker.topics.get(str(self.topic))
        return int(topic.ml.next_index()) if topic is not None else 0

    async def refresh(self) -> None:
        await self.h.broker.get_topic(self.topic)
        if self._copies is None:
            send, receive = trio.open_memory_channel[Received](float("inf"))
            self._copies = send
            assert self.h.nursery is not None
            self.h_nursery = self.h.nursery
            self.h.nursery.start_soon(self._copy, receive)
        wanted = set(self.vhost.chains(self.name)) - {""}
        for exchange in wanted - set(self.sources):
            name = self.h.exchange_topic(self.vhost.name, exchange)
            topic = await self.h.broker.get_topic(name)
            await self.forwarder.attach(name, sub_type=SubType.Shared, durable=True, start=end_of(topic))
            self.sources[exchange] = name
        for exchange in set(self.sources) - wanted:
            await self.forwarder.detach(self.sources.pop(exchange), delete=True)

    def _arrived(self, r: Received) -> None:
        exchange = next((e for e, n in self.sources.items() if n == r.topic), None)
        m = r.message
        chains = self.vhost.chains(self.name).get(exchange, []) if exchange is not None else []
        if any(self.vhost.chain_matches(c, m.key or "", self.h.headers_of(m)) for c in chains):
            assert self._copies is not None
            self._copies.send_nowait(r)
        else:
            self.forwarder.ack(r)
            self.forwarder.flow(r)

    async def _copy(self, receive: trio.MemoryReceiveChannel[Received]) -> None:
        async with receive:
            async for r in receive:
                try:
                    await publish(self.h.broker, self.topic, [r.message], producer_name=f"amqp-stream-{self.name}")
                except Exception as exc:  # left unacknowledged: copied again later
                    log.warning("amqp: stream %s: copy from %s failed: %s", self.name, r.topic, exc)
                    continue
                self.forwarder.ack(r)
                self.forwarder.flow(r)

    async def add_reader(self, consumer: Any, arguments: dict[str, Any]) -> StreamReader:
        if consumer.no_ack or not (consumer.prefetch or consumer.channel.global_prefetch):
            raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                            f"PRECONDITION_FAILED - consumer prefetch count is not set for stream queue "
                            f"'{self.name}' in vhost '{self.vhost.name}'", 60, 20)
        reader = StreamReader(self, consumer)
        await reader.start(arguments.get("x-stream-offset", "next"))
        self.readers.add(reader)
        self.had_consumer = True
        return reader

    def remove_consumer(self, c: Any) -> None:
        for r in list(self.readers):
            if r.consumer is c:
                r.remove_consumer(c)

    def dispatch(self) -> None:
        for r in list(self.readers):
            r.dispatch()

    def refusal(self, method: str, class_id: int, method_id: int) -> AMQPError:
        return AMQPError(ReplyCode.PRECONDITION_FAILED,
                         f"PRECONDITION_FAILED - {method} not supported by stream queue '{self.name}' "
                         f"in vhost '{self.vhost.name}'", class_id, method_id)

    def purge(self) -> int:
        raise self.refusal("queue.purge", 50, 30)

    async def wait_arrivals(self, seconds: float) -> None:
        return None

    async def drop(self) -> None:
        self.deleted = True
        for r in list(self.readers):
            r.consumer.cancelled_by_server()
            r.remove_consumer(r.consumer)
        await self.forwarder.close(delete=True)
        if self._copies is not None:
            await self._copies.aclose()


async def _start(topic: Any, offset: Any) -> tuple[Position | None, int]:
    """Where a stream consumer starts: the first position it reads, and the first offset
    it is given (an entry read from its start may begin below it)."""
    ml = topic.ml
    if isinstance(offset, bytes):
        offset = offset.decode(errors="replace")
    if offset == "first":
        first = ml.first_position()
        return (first if first is not None else EMPTY), 0
    if offset == "last":
        last = ml.last_confirmed()
        return (last if last is not None else EMPTY), 0
    if offset == "next" or offset is None:
        return end_of(topic), 0
    if isinstance(offset, datetime.datetime):
        found = await ml.find_by_publish_time(int(offset.timestamp() * 1000))
        return (found if found is not None else end_of(topic)), 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"PRECONDITION_FAILED - invalid x-stream-offset {offset!r}: first, last, next, "
                        "an offset or a timestamp", 60, 20)
    if offset >= ml.next_index():
        return end_of(topic), offset
    found = await ml.find_by_index(offset)
    return (found if found is not None else EMPTY), offset


def _with_headers(m: Message, headers: dict[str, Any]) -> Message:
    import base64

    from handlers.amqp._codec import encode_table

    props = dict(m.properties)
    props["__amqp_headers"] = base64.b64encode(encode_table(headers)).decode()
    return replace(m, properties=props)
