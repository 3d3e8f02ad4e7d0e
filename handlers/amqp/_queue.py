"""A queue at run time: the subscriptions it reads (one per exchange topic that reaches
it), the messages ready for its consumers, and who those consumers are.

Theory of operation
-------------------
Messages arrive from :class:`~core.messaging.Subscriber` in topic order; those no chain
of bindings matches are acknowledged at once, the rest wait in ``ready`` until a consumer
with room (prefetch) or a ``basic.get`` takes them. A message taken is the taker's until
it is acknowledged (the subscription's cursor moves past it), rejected, or requeued (it
goes back to the front of ``ready``, marked redelivered).

RabbitMQ's queue arguments (https://www.rabbitmq.com/docs/queues#optional-arguments),
parsed once into :class:`QueueArguments`:

- TTL (``x-message-ttl``, the ``expiration`` property; rabbitmq.com/docs/ttl): a
  message's deadline counts from when it was stored for the queue. An expired message
  is never delivered: it goes when it reaches the head (a timer watches the heads), or
  when a dispatch or a ``basic.get`` meets it. A deadline already past on arrival still
  lets a consumer with room take it at once (``expiration`` "0").
- Length limits (``x-max-length``, ``x-max-length-bytes``; rabbitmq.com/docs/maxlength)
  count ready messages only. ``drop-head`` drops (or dead-letters) the oldest once over.
  ``reject-publish`` is decided where the publish is, since what is published reaches
  the queue only later through its topic: :func:`admit` reserves room for the message,
  or marks it refused by the queue (the publisher gets basic.nack), and ``_arrived``
  settles a message so marked instead of taking it.
- Dead-lettering (rabbitmq.com/docs/dlx): a message rejected without requeue, expired
  or dropped by ``drop-head`` is republished to the dead-letter exchange's topic with
  the ``x-death`` header, and only then acknowledged here (at least once).
- ``x-single-active-consumer``: only the first consumer, in subscription order, is
  given messages; when it goes the next one is.
- ``x-max-priority``: ``ready`` is one FIFO per priority, highest served first.
- ``x-expires`` (rabbitmq.com/docs/ttl#queue-ttl): a queue with no consumers that is
  neither declared again nor read with ``basic.get`` for that long is deleted, as
  queue.delete would (its subscriptions go). The same timer that watches the heads
  watches :attr:`QueueRuntime.last_used`; each use (:meth:`QueueRuntime.used`) wakes it.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import trio

from core.format import Message
from core.messaging import Received, Subscriber, end_of, publish
from core.naming import TopicName
from core.subscription import SubType
from handlers.amqp._codec import AMQPError, ReplyCode, encode_table
from handlers.amqp._model import Binding, QueueDecl, VHost, queue_subscription

if TYPE_CHECKING:
    from handlers.amqp._handler import AMQPProtocolHandler

__all__ = ["Held", "QueueArguments", "QueueConsumer", "QueueRuntime", "admit", "REFUSED_BY",
           "ADMITTED_BY"]

log = logging.getLogger(__name__)

WINDOW = 1000  # messages a queue takes from each of its topics ahead of its consumers
MAX_PRIORITY = 255  # RabbitMQ's largest x-max-priority
#: Properties of a published message naming the reject-publish queues that refused it,
#: and those that reserved room for it (JSON lists of queue names).
REFUSED_BY = "__amqp_refused_by"
ADMITTED_BY = "__amqp_admitted_by"
OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")


def _now_ms() -> float:
    return time.time() * 1000


# -- the arguments ------------------------------------------------------------------------


def _type_name(v: Any) -> str:
    """A value's field-table type as RabbitMQ names it in its errors."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "signedint" if -(1 << 31) <= v < 1 << 31 else "long"
    if isinstance(v, float):
        return "double"
    if isinstance(v, (str, bytes)):
        return "longstr"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, list):
        return "array"
    if v is None:
        return "void"
    return type(v).__name__


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _non_negative(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"{{unacceptable_type,{_type_name(v)}}}"
    return f"{{value_negative,{v}}}" if v < 0 else None


def _positive(v: Any) -> str | None:
    problem = _non_negative(v)
    return problem if problem is not None else (f"{{value_zero,{v}}}" if v == 0 else None)


def _string(v: Any) -> str | None:
    return None if isinstance(v, (str, bytes)) else f"{{unacceptable_type,{_type_name(v)}}}"


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"{{unacceptable_type,{_type_name(v)}}}"


def _overflow(v: Any) -> str | None:
    problem = _string(v)
    if problem is None and _text(v) not in OVERFLOWS:
        return f'{{invalid_overflow,<<"{_text(v)}">>}}'
    return problem


def _priority(v: Any) -> str | None:
    problem = _non_negative(v)
    if problem is None and v > MAX_PRIORITY:
        return f"{{max_value_exceeded,{v}}}"
    return problem


#: The queue arguments RabbitMQ checks, and how (what an unacceptable value is told).
CHECKS: dict[str, Callable[[Any], str | None]] = {
    "x-message-ttl": _non_negative,
    "x-expires": _positive,
    "x-max-length": _non_negative,
    "x-max-length-bytes": _non_negative,
    "x-overflow": _overflow,
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    "x-single-active-consumer": _boolean,
    "x-max-priority": _priority,
    "x-queue-type": _string,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueArguments:
    """What a queue's ``x-`` arguments ask of it."""

    message_ttl: int | None = None
    expires: int | None = None  # ms a queue may go unused
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    single_active_consumer: bool = False
    max_priority: int | None = None

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None

    @property
    def rejects_publish(self) -> bool:
        return self.limited and self.overflow != "drop-head"

    @classmethod
    def check(cls, args: Mapping[str, Any], queue: str, vhost: str) -> QueueArguments:
        """The arguments of a queue.declare, or PRECONDITION_FAILED as RabbitMQ words it."""
        for name, value in args.items():
            how = CHECKS.get(name)
            problem = how(value) if how is not None else None
            if problem is not None:
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"PRECONDITION_FAILED - invalid arg '{name}' for queue '{queue}' in "
                                f"vhost '{vhost}': {problem}", 50, 10)
        if "x-dead-letter-routing-key" in args and "x-dead-letter-exchange" not in args:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                            f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue "
                            f"'{queue}' in vhost '{vhost}': routing_key_but_no_dlx_defined", 50, 10)
        return cls.of(args)

    @classmethod
    def of(cls, args: Mapping[str, Any]) -> QueueArguments:
        """The arguments as stored (checked when declared; anything else is ignored)."""
        def num(name: str) -> int | None:
            v = args.get(name)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        def text(name: str) -> str | None:
            v = args.get(name)
            return _text(v) if isinstance(v, (str, bytes)) else None

        overflow = text("x-overflow")
        return cls(message_ttl=num("x-message-ttl"), expires=num("x-expires") or None,
                   max_length=num("x-max-length"),
                   max_length_bytes=num("x-max-length-bytes"),
                   overflow=overflow if overflow in OVERFLOWS else "drop-head",
                   dead_letter_exchange=text("x-dead-letter-exchange"),
                   dead_letter_routing_key=text("x-dead-letter-routing-key"),
                   single_active_consumer=args.get("x-single-active-consumer") is True,
                   max_priority=num("x-max-priority"))


# -- what a queue holds -------------------------------------------------------------------


@dataclass(slots=True)
class Held:
    """One message of a queue: where it came from, whether it was delivered before, its
    deadline (ms since the epoch, None: none) and its priority."""

    received: Received
    exchange: str
    redelivered: bool = False
    expires_at: float | None = None
    priority: int = 0

    @property
    def size(self) -> int:
        return len(self.received.message.payload)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class Ready:
    """The ready messages: one FIFO per priority, the highest priority first."""

    def __init__(self) -> None:
        self._levels: dict[int, deque[Held]] = {}
        self._order: list[int] = []  # the priorities present, highest first
        self.count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def _level(self, priority: int) -> deque[Held]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = deque()
            self._order.append(priority)
            self._order.sort(reverse=True)
        return level

    def append(self, h: Held) -> None:
        self._level(h.priority).append(h)
        self.count += 1
        self.bytes += h.size

    def appendleft(self, h: Held) -> None:
        self._level(h.priority).appendleft(h)
        self.count += 1
        self.bytes += h.size

    def head(self) -> Held | None:
        for p in self._order:
            level = self._levels[p]
            if level:
                return level[0]
        return None

    def _taken(self, h: Held) -> Held:
        self.count -= 1
        self.bytes -= h.size
        return h

    def popleft(self) -> Held:
        for p in self._order:
            level = self._levels[p]
            if level:
                return self._taken(level.popleft())
        raise IndexError("no ready message")

    def pop_expired(self, now: float) -> Iterator[Held]:
        """The messages at the head of each priority whose time is up."""
        for p in self._order:
            level = self._levels[p]
            while level and level[0].expired(now):
                yield self._taken(level.popleft())

    def next_deadline(self) -> float | None:
        deadlines = [lv[0].expires_at for lv in self._levels.values()
                     if lv and lv[0].expires_at is not None]
        return min(deadlines) if deadlines else None

    def clear(self) -> list[Held]:
        out = [h for p in self._order for h in self._levels[p]]
        self._levels.clear()
        self._order.clear()
        self.count = self.bytes = 0
        return out


class QueueConsumer(Protocol):
    """A consumer on a queue (an AMQP channel's basic.consume)."""

    tag: str
    no_ack: bool

    def has_room(self, held: Held) -> bool: ...

    def deliver(self, queue: QueueRuntime, held: Held) -> None: ...

    def cancelled_by_server(self) -> None: ...


def _names(m: Message, prop: str) -> list[str]:
    raw = m.properties.get(prop)
    if raw is None:
        return []
    try:
        got = json.loads(raw)
    except ValueError:
        return []
    return [str(n) for n in got] if isinstance(got, list) else []


def admit(queues: Iterable[QueueRuntime], m: Message) -> tuple[Message, bool]:
    """A publish routed to ``queues``: those with ``x-overflow`` reject-publish that are
    full refuse it (the message is marked so they settle it when it reaches them), the
    others reserve room for it. Returns the message to store, and whether one refused."""
    refused: list[str] = []
    admitted: list[str] = []
    for q in queues:
        if q.args.rejects_publish:
            (admitted if q.reserve(len(m.payload)) else refused).append(q.name)
    if not refused and not admitted:
        return m, False
    props = dict(m.properties)
    if refused:
        props[REFUSED_BY] = json.dumps(refused)
    if admitted:
        props[ADMITTED_BY] = json.dumps(admitted)
    return replace(m, properties=props), bool(refused)


class QueueRuntime:
    def __init__(self, handler: AMQPProtocolHandler, vhost: VHost, decl: QueueDecl):
        self.h = handler
        self.vhost = vhost
        self.decl = decl
        self.args = QueueArguments.of(decl.arguments)
        self.subscriber = Subscriber(handler.broker, queue_subscription(decl.name), self._arrived,
                                     window=WINDOW)
        self.ready = Ready()
        self.consumers: list[QueueConsumer] = []
        self.exclusive_consumer: QueueConsumer | None = None
        self.unacked = 0
        self.had_consumer = False
        self.last_used = _now_ms()  # x-expires counts from here while there is no consumer
        self.owner: Any = None  # the connection of an exclusive queue
        self.sources: dict[str, TopicName] = {}  # exchange -> its topic, attached
        # The binding chains into the queue, by the exchange they start on, as of the last
        # refresh (every binding or exchange change refreshes the vhost's queues): each
        # arrival matches against these instead of walking the bindings again.
        self.chains: dict[str, list[tuple[Binding, ...]]] = {}
        self.needs_headers = False  # some chain passes a headers exchange
        self._next = 0
        self.arrived = trio.Event()
        self.deleted = False
        # reject-publish: messages admitted at publish time that have not arrived yet
        self.reserved = 0
        self.reserved_bytes = 0
        self._fresh: Held | None = None  # the message arriving now (may go to a consumer)
        # the timer and the dead-letter publisher: started when first needed
        self._scope: trio.CancelScope | None = None
        self._wake = trio.Event()
        self._dead_send, self._dead_receive = trio.open_memory_channel[tuple[Held, str]](math.inf)
        self.dead_lettering = 0  # bounded by WINDOW per topic: they hold their permits
        if self.args.rejects_publish:
            vhost.publish_limited.add(decl.name)

    @property
    def name(self) -> str:
        return self.decl.name

    # -- what it reads -------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the topic of every exchange that reaches the queue now, from its end for
        one it starts reading, and stop reading (dropping the subscription) those that no
        longer do."""
        self.chains = self.vhost.chains(self.name)
        self.needs_headers = any(
            (e := self.vhost.exchanges.get(b.source)) is not None and e.type == "headers"
            for chains in self.chains.values() for chain in chains for b in chain)
        wanted = set(self.chains)
        for exchange in wanted - set(self.sources):
            name = self.h.exchange_topic(self.vhost.name, exchange)
            topic = await self.h.broker.get_topic(name)
            await self.subscriber.attach(name, sub_type=SubType.Shared, durable=True,
                                         start=end_of(topic))
            self.sources[exchange] = name
        for exchange in set(self.sources) - wanted:
            await self.subscriber.detach(self.sources.pop(exchange), delete=True)
        if self.args.expires is not None:
            self._timer()

    async def drop(self) -> None:
        """The queue is deleted: its consumers are told, its subscriptions go."""
        self.deleted = True
        self.vhost.publish_limited.discard(self.name)
        if self._scope is not None:
            self._scope.cancel()
        for c in list(self.consumers):
            c.cancelled_by_server()
        self.consumers.clear()
        self.ready.clear()
        await self.subscriber.close(delete=True)
        self.sources.clear()

    # -- arrivals ------------------------------------------------------------------------

    def _exchange_of(self, topic: TopicName) -> str | None:
        for exchange, name in self.sources.items():
            if name == topic:
                return exchange
        return None

    def _arrived(self, r: Received) -> None:
        exchange = self._exchange_of(r.topic)
        m = r.message
        key = m.key or ""
        admitted = False
        if ADMITTED_BY in m.properties and self.name in _names(m, ADMITTED_BY):
            admitted = True
            self.reserved = max(0, self.reserved - 1)
            self.reserved_bytes = max(0, self.reserved_bytes - len(m.payload))
        if REFUSED_BY in m.properties and self.name in _names(m, REFUSED_BY):
            self.settle(r)
            self._poke()
            return
        headers = self.h.headers_of(m) if self.needs_headers else None
        chains = self.chains.get(exchange, []) if exchange is not None else []
        if not any(self.vhost.chain_matches(c, key, headers) for c in chains):
            self.settle(r)
            self._poke()
            return
        held = Held(r, exchange or "", r.redelivery_count > 0, self._deadline(m), self._priority(m))
        if self.args.rejects_publish and not admitted and not self._room_for(held.size):
            self.settle(r)  # not published over AMQP (no reservation), and no room
            self._poke()
            return
        self.ready.append(held)
        self._poke()
        self._fresh = held
        try:
            self.dispatch()
        finally:
            self._fresh = None
        self._drop_over_limit()
        if held.expires_at is not None:
            self._expire()
            self._timer()

    def _poke(self) -> None:
        """Wake who waits for the queue to take what its topics hold (wait_arrivals)."""
        self.arrived.set()
        self.arrived = trio.Event()

    def _deadline(self, m: Message) -> float | None:
        """When a message expires: its queue's TTL or its own, from when it was stored."""
        ttls: list[float] = []
        if self.args.message_ttl is not None:
            ttls.append(self.args.message_ttl)
        expiration = m.properties.get("__amqp_expiration")
        if expiration is not None:
            try:
                ttls.append(max(0, int(expiration)))
            except ValueError:
                pass
        if not ttls:
            return None
        now = _now_ms()
        since = min(m.publish_time, now) if m.publish_time else now
        return since + min(ttls)

    def _priority(self, m: Message) -> int:
        top = self.args.max_priority
        if not top:
            return 0
        raw = m.properties.get("__amqp_priority")
        if raw is None:
            return 0
        try:
            return min(max(0, int(raw)), top)
        except ValueError:
            return 0

    def settle(self, r: Received) -> None:
        """The message is done with (acknowledged, or dropped): its cursor moves past it."""
        self.subscriber.ack(r)
        self.subscriber.flow(r)

    def settle_many(self, received: list[Received]) -> None:
        """:meth:`settle` of each, in one call into the core."""
        self.subscriber.ack_many(received, flow=True)

    # -- limits and expiry ---------------------------------------------------------------

    def _room_for(self, size: int) -> bool:
        a = self.args
        if a.max_length is not None and len(self.ready) + self.reserved + 1 > a.max_length:
            return False
        return a.max_length_bytes is None or \
            self.ready.bytes + self.reserved_bytes + size <= a.max_length_bytes

    def reserve(self, size: int) -> bool:
        """reject-publish: whether a message of ``size`` bytes published now fits; if it
        does it is counted until it arrives."""
        if not self._room_for(size):
            return False
        self.reserved += 1
        self.reserved_bytes += size
        return True

    def _drop_over_limit(self) -> None:
        a = self.args
        if not a.limited or a.rejects_publish:
            return
        while self.ready and (
                (a.max_length is not None and len(self.ready) > a.max_length)
                or (a.max_length_bytes is not None and self.ready.bytes > a.max_length_bytes)):
            self.dead_letter(self.ready.popleft(), "maxlen")

    def _expire(self) -> None:
        for held in list(self.ready.pop_expired(_now_ms())):
            self.dead_letter(held, "expired")

    def _timer(self) -> None:
        """A deadline may have come nearer: the timer looks again."""
        if self._start():
            self._wake.set()

    def used(self) -> None:
        """The queue was declared again, read with basic.get, or consumed from: x-expires
        counts again from now."""
        self.last_used = _now_ms()
        if self.args.expires is not None:
            self._timer()

    def _unused_until(self) -> float | None:
        """When the queue expires unless it is used before (None: it does not)."""
        if self.args.expires is None or self.consumers:
            return None
        return self.last_used + self.args.expires

    async def _expiry(self) -> None:
        while True:
            self._expire()
            unused = self._unused_until()
            if unused is not None and unused <= _now_ms():
                # Shielded: deleting the queue cancels this very task (drop).
                with trio.CancelScope(shield=True):
                    await self._expired()
                return
            deadlines = [d for d in (self.ready.next_deadline(), unused) if d is not None]
            deadline = min(deadlines) if deadlines else None
            wake = self._wake = trio.Event()
            wait = math.inf if deadline is None else max(0.0, (deadline - _now_ms()) / 1000)
            with trio.move_on_after(wait + 0.001):
                await wake.wait()

    async def _expired(self) -> None:
        """x-expires: the queue has gone unused for its time and is deleted."""
        if self.deleted or self.h.queues.get((self.vhost.name, self.name)) is not self:
            return
        log.debug("amqp: queue %s unused for %d ms, deleted", self.name, self.args.expires)
        if self.owner is not None:
            self.owner.exclusive.discard(self.name)
        await self.h.delete_queue(self.vhost, self.name)

    # -- dead-lettering ------------------------------------------------------------------

    def _start(self) -> bool:
        """The queue's own task (timer and dead-letter publisher), in the handler's nursery
        and cancelled by :meth:`drop`; False when there is no nursery to run it in."""
        if self._scope is not None:
            return True
        nursery = getattr(self.h, "nursery", None)
        if nursery is None or self.deleted:
            return False
        self._scope = trio.CancelScope()
        nursery.start_soon(self._run, self._scope)
        return True

    async def _run(self, scope: trio.CancelScope) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._expiry)
                nursery.start_soon(self._dead_letterer)

    def dead_letter(self, held: Held, reason: str) -> None:
        """A message rejected without requeue, expired, or dropped over the length limit:
        republished to the dead-letter exchange when the queue has one, else dropped."""
        dlx = self.args.dead_letter_exchange
        if dlx is None or dlx not in self.vhost.exchanges or not self._start() \
                or self._cycle(held, reason):
            self.settle(held.received)
            return
        self.dead_lettering += 1
        self._dead_send.send_nowait((held, reason))

    def _cycle(self, held: Held, reason: str) -> bool:
        """RabbitMQ drops a message that would go round again to this queue with no
        client having rejected it on the way."""
        if reason == "rejected":
            return False
        deaths = self.h.headers_of(held.received.message).get("x-death")
        if not isinstance(deaths, list):
            return False
        tables = [d for d in deaths if isinstance(d, dict)]
        return any(_text(d.get("queue")) == self.name for d in tables) and \
            not any(_text(d.get("reason")) == "rejected" for d in tables)

    async def _dead_letterer(self) -> None:
        """Publishes what is dead-lettered, in order, what waits together as one entry;
        settles each here once it is stored."""
        while True:
            batch = [await self._dead_receive.receive()]
            while True:
                try:
                    batch.append(self._dead_receive.receive_nowait())
                except trio.WouldBlock:
                    break
            dlx = self.args.dead_letter_exchange or ""
            messages = [self.dead_lettered(h, reason) for h, reason in batch]
            try:
                await publish(self.h.broker, self.h.exchange_topic(self.vhost.name, dlx), messages,
                              producer_name=f"amqp-dlx-{self.name}")
            except Exception as exc:
                log.warning("amqp: dead-lettering from %s to %s failed: %s", self.name, dlx, exc)
            for h, _ in batch:
                self.dead_lettering -= 1
                if not self.deleted:
                    self.settle(h.received)

    def dead_lettered(self, held: Held, reason: str) -> Message:
        """The message as the dead-letter exchange gets it: the ``x-death`` header updated
        (rabbitmq.com/docs/dlx#effects), routed by ``x-dead-letter-routing-key`` or its
        own key, without its ``expiration`` (kept as ``original-expiration``)."""
        m = held.received.message
        headers = dict(self.h.headers_of(m))
        key = m.key or ""
        deaths = [dict(d) for d in headers.get("x-death", []) if isinstance(d, dict)] \
            if isinstance(headers.get("x-death"), list) else []
        now = datetime.now(UTC).replace(microsecond=0)
        expiration = m.properties.get("__amqp_expiration")
        for i, d in enumerate(deaths):
            if _text(d.get("queue")) == self.name and _text(d.get("reason")) == reason:
                d["count"] = int(d.get("count", 0)) + 1
                d["time"] = now
                deaths.insert(0, deaths.pop(i))
                break
        else:
            death: dict[str, Any] = {"count": 1, "reason": reason, "queue": self.name,
                                     "time": now, "exchange": held.exchange,
                                     "routing-keys": [key]}
            if expiration is not None:
                death["original-expiration"] = expiration
            deaths.insert(0, death)
        headers["x-death"] = deaths
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", self.name)
        headers.setdefault("x-first-death-exchange", held.exchange)
        props = {k: v for k, v in m.properties.items()
                 if k.startswith("__amqp_") and k not in (REFUSED_BY, ADMITTED_BY,
                                                          "__amqp_expiration", "__amqp_headers")}
        for k, val in headers.items():
            props[k] = _text(val) if not isinstance(val, (dict, list, datetime)) else str(val)
        props["__amqp_headers"] = base64.b64encode(encode_table(headers)).decode()
        props["__amqp_exchange"] = self.args.dead_letter_exchange or ""
        new_key = self.args.dead_letter_routing_key or key
        return Message(payload=m.payload, key=new_key or None, properties=props,
                       event_time=m.event_time, publish_time=int(_now_ms()))

    # -- consumers -----------------------------------------------------------------------

    def add_consumer(self, c: QueueConsumer, exclusive: bool) -> None:
        self.consumers.append(c)
        self.had_consumer = True
        self.used()
        if exclusive:
            self.exclusive_consumer = c
        self.dispatch()

    def remove_consumer(self, c: QueueConsumer) -> None:
        if c in self.consumers:
            self.consumers.remove(c)
        if self.exclusive_consumer is c:
            self.exclusive_consumer = None
        if not self.consumers:
            self.used()  # unused from now
        if self.args.single_active_consumer:
            self.dispatch()  # the next in line is the active one now

    def dispatch(self) -> None:
        """Hand ready messages to consumers with room, in turn (only the first consumer,
        with a single active consumer); expired ones met on the way go."""
        now = 0.0
        while self.ready and self.consumers:
            held = self.ready.head()
            assert held is not None
            if held.expires_at is not None and held is not self._fresh:
                now = now or _now_ms()
                if held.expired(now):
                    self.dead_letter(self.ready.popleft(), "expired")
                    continue
            consumers = self.consumers[:1] if self.args.single_active_consumer else self.consumers
            n = len(consumers)
            for i in range(n):
                c = consumers[(self._next + i) % n]
                if c.has_room(held):
                    self._next = (self._next + i + 1) % n
                    self.ready.popleft()
                    if not c.no_ack:
                        self.unacked += 1
                    c.deliver(self, held)
                    break
            else:
                return

    def get(self) -> Held | None:
        self.used()
        now = _now_ms()
        while self.ready:
            held = self.ready.popleft()
            if not held.expired(now):
                return held
            self.dead_letter(held, "expired")
        return None

    async def wait_arrivals(self, seconds: float) -> None:
        """Wait up to ``seconds`` for what the queue's topics hold beyond what it has
        taken (a message published just before a basic.get on another channel)."""
        with trio.move_on_after(seconds):
            while not self.ready and self._behind():
                await self.arrived.wait()

    def _behind(self) -> bool:
        held = self.unacked + len(self.ready) + self.dead_lettering
        for _topic, consumer in self.subscriber.attached.values():
            sub = consumer.subscription
            if sub is not None and sub.backlog() > held:
                return True
        return False

    def requeue(self, held: list[Held]) -> None:
        """Messages given back: to the front, in the order they were taken."""
        for h in reversed(held):
            h.redelivered = True
            self.ready.appendleft(h)
        self.dispatch()
        if any(h.expires_at is not None for h in held):
            self._timer()

    def purge(self) -> int:
        taken = self.ready.clear()
        for h in taken:
            self.settle(h.received)
        return len(taken)

    @property
    def message_count(self) -> int:
        return len(self.ready)
