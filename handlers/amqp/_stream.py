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
RabbitMQ's streams do; a nack or a closed channel does not put anything back. An interval
(``"7D"``, ``"30m"``: a whole number and one of RabbitMQ's units Y, M, D, h, m, s) starts
at the first message published at or after that long ago, as a timestamp does.

Retention (rabbitmq.com/docs/streams#retention): the declare's ``x-max-age`` and
``x-max-length-bytes`` are the topic's own retention policy and
``x-stream-max-segment-size-bytes`` its ledger rollover size, the policies Kafka's
``retention.ms``, ``retention.bytes`` and ``segment.bytes`` set (``handlers.kafka._configs``):
whole minutes and MB in ``retention_policies`` (what the admin API shows), the exact
milliseconds and bytes in ``retention_exact``, which the storage and the broker's
retention check enforce, a ledger being a RabbitMQ segment. A limit not given is none: a
stream keeps everything unless told otherwise, as in RabbitMQ, not what its namespace's
retention (by default nothing consumed) keeps. The arguments are applied to the topic
whenever the broker builds the stream (declared, or loaded at start), so they, not a
retention set on the topic through the admin API meanwhile, are the stream's; a change
reopens the topic, since the storage reads them when it opens it. Pulsar's retention
counts what every durable subscription has passed, and the stream's readers hold none
(each reads on a non-durable subscription; the copies from exchanges are read on the
exchanges' topics): what the retention no longer keeps goes whatever the readers have
read. A reader whose next message went reads on from the first one kept.
"""

from __future__ import annotations

import datetime
import logging
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import trio

from core.format import Message
from core.messaging import EMPTY, Received, Subscriber, end_of, publish
from core.naming import TopicName
from core.policies import (
    LEDGER_ROLLOVER,
    RETENTION,
    RETENTION_EXACT,
    set_policy_field,
    set_retention_limit,
)
from core.storage import Position
from core.subscription import SubType
from handlers.amqp._codec import AMQPError, ReplyCode
from handlers.amqp._model import Binding, QueueDecl, VHost, queue_subscription
from handlers.amqp._queue import Held, _non_negative, _type_name

if TYPE_CHECKING:
    from handlers.amqp._handler import AMQPProtocolHandler

__all__ = ["StreamQueue", "StreamRetention", "interval_ms", "is_stream"]

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
#: The units of an ``x-max-age`` and of an interval ``x-stream-offset``, in ms, as
#: RabbitMQ's ``rabbit_amqqueue:check_max_age`` counts them (a month is 30 days, a year 365).
INTERVAL_UNITS_MS = {"Y": 365 * DAY_MS, "M": 30 * DAY_MS, "D": DAY_MS, "h": 3_600_000,
                     "m": 60_000, "s": 1000}
_INTERVAL = re.compile(r"([0-9]+)([YMDhms])")
MAX_SEGMENT_SIZE = 3_000_000_000  # RabbitMQ's largest x-stream-max-segment-size-bytes
LONGEST_MS = (1 << 63) - 1  # the longest retention the storage holds (a signed 64-bit ms)
MIB = 1 << 20
# the topic policies a stream's arguments set
ROLLOVER_SIZE = "rolloverSizeInMB"


def is_stream(decl: QueueDecl) -> bool:
    return str(decl.arguments.get("x-queue-type", "")) == "stream"


def interval_ms(value: Any) -> int | None:
    """An interval as RabbitMQ writes an ``x-max-age`` or an ``x-stream-offset`` (a whole
    number above 0 and one unit: ``"7D"``, ``"12h"``) in ms; None when it is not one."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    found = _INTERVAL.fullmatch(text) if isinstance(text, str) else None
    if found is None or int(found[1]) == 0:
        return None
    return min(LONGEST_MS, int(found[1]) * INTERVAL_UNITS_MS[found[2]])


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamRetention:
    """What a stream's declare asks it to keep (None: no limit): ``x-max-age`` (ms),
    ``x-max-length-bytes``, and the size its ledgers roll over at,
    ``x-stream-max-segment-size-bytes`` (None: the broker's)."""

    max_age_ms: int | None = None
    max_bytes: int | None = None
    segment_bytes: int | None = None

    @classmethod
    def check(cls, args: Mapping[str, Any], queue: str, vhost: str) -> StreamRetention:
        """The retention of a stream's arguments, or PRECONDITION_FAILED as RabbitMQ
        words it (``rabbit_amqqueue:declare_args``)."""
        def refused(text: str) -> AMQPError:
            return AMQPError(ReplyCode.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {text}", 50, 10)

        def invalid(name: str, problem: str) -> AMQPError:
            return refused(f"invalid arg '{name}' for queue '{queue}' in vhost '{vhost}': {problem}")

        age = None
        if "x-max-age" in args:
            v = args["x-max-age"]
            if not isinstance(v, (str, bytes)):
                raise invalid("x-max-age", f"{{unacceptable_type,{_type_name(v)}}}")
            age = interval_ms(v)
            if age is None:
                raise invalid("x-max-age", "invalid_max_age")
        sizes: dict[str, int | None] = {}
        for name in ("x-max-length-bytes", "x-stream-max-segment-size-bytes"):
            v = args.get(name)
            if name in args and (problem := _non_negative(v)) is not None:
                raise invalid(name, problem)
            sizes[name] = v
        segment = sizes["x-stream-max-segment-size-bytes"]
        if segment is not None and segment > MAX_SEGMENT_SIZE:
            raise refused("Exceeded max value for x-stream-max-segment-size-bytes")
        return cls(max_age_ms=age, max_bytes=sizes["x-max-length-bytes"], segment_bytes=segment)

    def apply(self, policies: dict[str, Any]) -> None:
        """Set these limits as a topic's own policies (mutating them): its retention
        policy (no limit: -1) with the exact values beside it, and its ledger rollover
        size, as Kafka's ``retention.ms``, ``retention.bytes`` and ``segment.bytes`` are."""
        set_retention_limit(policies, "time", self.max_age_ms)
        set_retention_limit(policies, "size", self.max_bytes)
        set_policy_field(policies, LEDGER_ROLLOVER, ROLLOVER_SIZE,
                         None if self.segment_bytes is None else math.ceil(self.segment_bytes / MIB))


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

    def settle_many(self, received: list[Received]) -> None:
        self.subscriber.ack_many(received, flow=True)

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
        self.retention = StreamRetention.check(decl.arguments, decl.name, vhost.name)
        self.topic = handler.stream_topic(vhost.name, decl.name)
        self.forwarder = Subscriber(handler.broker, queue_subscription(decl.name), self._arrived,
                                    window=1000)
        self.sources: dict[str, TopicName] = {}
        # The binding chains into the stream by the exchange they start on, and whether
        # one passes a headers exchange, as of the last refresh (as a queue keeps them).
        self.chains: dict[str, list[tuple[Binding, ...]]] = {}
        self.needs_headers = False
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
        """The messages the stream holds: from the first one retention kept."""
        topic = self.h.broker.topics.get(str(self.topic))
        if topic is None:
            return 0
        end = int(topic.ml.next_index())
        first = next((int(info["firstIndex"]) for info in topic.ml.ledgers() if int(info["entries"]) > 0), end)
        return end - first

    async def _keep(self) -> None:
        """The stream's retention as its topic's own policies; a change reopens the topic
        (when it is open), whose storage reads them when it opens."""
        policies = self.h.broker.policies
        current = policies.topic_policies(self.topic)
        wanted = dict(current)
        self.retention.apply(wanted)
        keys = (RETENTION, RETENTION_EXACT, LEDGER_ROLLOVER)
        if all(current.get(k) == wanted.get(k) for k in keys):
            return
        policies.update_topic_policies(self.topic, self.retention.apply)
        await self.h.broker.topic_policies_changed(self.topic, reload=True)

    async def refresh(self) -> None:
        if self._copies is None:
            await self._keep()
        await self.h.broker.get_topic(self.topic)
        if self._copies is None:
            send, receive = trio.open_memory_channel[Received](float("inf"))
            self._copies = send
            assert self.h.nursery is not None
            self.h_nursery = self.h.nursery
            self.h.nursery.start_soon(self._copy, receive)
        self.chains = self.vhost.chains(self.name)
        self.needs_headers = any(
            (e := self.vhost.exchanges.get(b.source)) is not None and e.type == "headers"
            for chains in self.chains.values() for chain in chains for b in chain)
        wanted = set(self.chains) - {""}
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
        chains = self.chains.get(exchange, []) if exchange is not None else []
        headers = self.h.headers_of(m) if self.needs_headers else None
        if any(self.vhost.chain_matches(c, m.key or "", headers) for c in chains):
            assert self._copies is not None
            self._copies.send_nowait(r)
        else:
            self.forwarder.ack(r)
            self.forwarder.flow(r)

    async def _copy(self, receive: trio.MemoryReceiveChannel[Received]) -> None:
        """Store what bound exchanges route to the stream on its topic, what has come
        while the last copy was being stored together as one entry, in order; then
        acknowledge it on the exchanges' topics."""
        async with receive:
            while True:
                try:
                    run = [await receive.receive()]
                except trio.EndOfChannel:
                    return
                while True:
                    try:
                        run.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                try:
                    await publish(self.h.broker, self.topic, [r.message for r in run],
                                  producer_name=f"amqp-stream-{self.name}")
                except Exception as exc:  # left unacknowledged: copied again later
                    log.warning("amqp: stream %s: copy of %d from its exchanges failed: %s",
                                self.name, len(run), exc)
                    continue
                for r in run:
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
    since: int | None = None
    if isinstance(offset, datetime.datetime):
        since = int(offset.timestamp() * 1000)
    elif isinstance(offset, str) and (ago := interval_ms(offset)) is not None:
        since = int(time.time() * 1000) - ago
    if since is not None:
        found = await ml.find_by_publish_time(max(0, since))
        return (found if found is not None else end_of(topic)), 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"PRECONDITION_FAILED - invalid x-stream-offset {offset!r}: first, last, next, "
                        "an offset, a timestamp or an interval (a whole number above 0 and one of the "
                        "units Y, M, D, h, m, s: \"7D\", \"30m\")", 60, 20)
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
