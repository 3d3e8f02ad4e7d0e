"""A queue at run time: the subscriptions it reads (one per exchange topic that reaches
it), the messages ready for its consumers, and who those consumers are.

Messages arrive from :class:`~core.messaging.Subscriber` in topic order; those no chain
of bindings matches are acknowledged at once, the rest wait in ``ready`` until a consumer
with room (prefetch) or a ``basic.get`` takes them. A message taken is the taker's until
it is acknowledged (the subscription's cursor moves past it), rejected, or requeued (it
goes back to the front of ``ready``, marked redelivered).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

from core.messaging import Received, Subscriber, end_of
from core.naming import TopicName
from core.subscription import SubType
from handlers.amqp._model import QueueDecl, VHost, queue_subscription

if TYPE_CHECKING:
    from handlers.amqp._handler import AMQPProtocolHandler

__all__ = ["Held", "QueueConsumer", "QueueRuntime"]

log = logging.getLogger(__name__)

WINDOW = 1000  # messages a queue takes from each of its topics ahead of its consumers


@dataclass(slots=True)
class Held:
    """One message of a queue: where it came from and whether it was delivered before."""

    received: Received
    exchange: str
    redelivered: bool = False

    @property
    def size(self) -> int:
        return len(self.received.message.payload)


class QueueConsumer(Protocol):
    """A consumer on a queue (an AMQP channel's basic.consume)."""

    tag: str
    no_ack: bool

    def has_room(self, held: Held) -> bool: ...

    def deliver(self, queue: QueueRuntime, held: Held) -> None: ...

    def cancelled_by_server(self) -> None: ...


class QueueRuntime:
    def __init__(self, handler: AMQPProtocolHandler, vhost: VHost, decl: QueueDecl):
        self.h = handler
        self.vhost = vhost
        self.decl = decl
        self.subscriber = Subscriber(handler.broker, queue_subscription(decl.name), self._arrived,
                                     window=WINDOW)
        self.ready: deque[Held] = deque()
        self.consumers: list[QueueConsumer] = []
        self.exclusive_consumer: QueueConsumer | None = None
        self.unacked = 0
        self.had_consumer = False
        self.owner: Any = None  # the connection of an exclusive queue
        self.sources: dict[str, TopicName] = {}  # exchange -> its topic, attached
        self._next = 0
        self.arrived = trio.Event()
        self.deleted = False

    @property
    def name(self) -> str:
        return self.decl.name

    # -- what it reads -------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the topic of every exchange that reaches the queue now, from its end for
        one it starts reading, and stop reading (dropping the subscription) those that no
        longer do."""
        wanted = set(self.vhost.chains(self.name))
        for exchange in wanted - set(self.sources):
            name = self.h.exchange_topic(self.vhost.name, exchange)
            topic = await self.h.broker.get_topic(name)
            await self.subscriber.attach(name, sub_type=SubType.Shared, durable=True,
                                         start=end_of(topic))
            self.sources[exchange] = name
        for exchange in set(self.sources) - wanted:
            await self.subscriber.detach(self.sources.pop(exchange), delete=True)

    async def drop(self) -> None:
        """The queue is deleted: its consumers are told, its subscriptions go."""
        self.deleted = True
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
        headers = self.h.headers_of(m)
        chains = self.vhost.chains(self.name).get(exchange or "", []) if exchange is not None else []
        if not any(self.vhost.chain_matches(c, key, headers) for c in chains):
            self.settle(r)
            return
        self.ready.append(Held(r, exchange or "", r.redelivery_count > 0))
        self.arrived.set()
        self.arrived = trio.Event()
        self.dispatch()

    def settle(self, r: Received) -> None:
        """The message is done with (acknowledged, or dropped): its cursor moves past it."""
        self.subscriber.ack(r)
        self.subscriber.flow(r)

    # -- consumers -----------------------------------------------------------------------

    def add_consumer(self, c: QueueConsumer, exclusive: bool) -> None:
        self.consumers.append(c)
        self.had_consumer = True
        if exclusive:
            self.exclusive_consumer = c
        self.dispatch()

    def remove_consumer(self, c: QueueConsumer) -> None:
        if c in self.consumers:
            self.consumers.remove(c)
        if self.exclusive_consumer is c:
            self.exclusive_consumer = None

    def dispatch(self) -> None:
        """Hand ready messages to consumers with room, in turn."""
        while self.ready and self.consumers:
            n = len(self.consumers)
            held = self.ready[0]
            for i in range(n):
                c = self.consumers[(self._next + i) % n]
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
        return self.ready.popleft() if self.ready else None

    async def wait_arrivals(self, seconds: float) -> None:
        """Wait up to ``seconds`` for what the queue's topics hold beyond what it has
        taken (a message published just before a basic.get on another channel)."""
        with trio.move_on_after(seconds):
            while not self.ready and self._behind():
                await self.arrived.wait()

    def _behind(self) -> bool:
        for topic, consumer in self.subscriber.attached.values():
            sub = consumer.subscription
            if sub is not None and sub.backlog() > self.unacked + len(self.ready):
                return True
            del topic
        return False

    def requeue(self, held: list[Held]) -> None:
        """Messages given back: to the front, in the order they were taken."""
        for h in reversed(held):
            h.redelivered = True
            self.ready.appendleft(h)
        self.dispatch()

    def purge(self) -> int:
        n = len(self.ready)
        while self.ready:
            self.settle(self.ready.popleft().received)
        return n

    @property
    def message_count(self) -> int:
        return len(self.ready)

