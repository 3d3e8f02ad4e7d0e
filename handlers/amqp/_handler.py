"""The AMQP 0-9-1 protocol plugin: listens on ``amqpListeners`` and runs one
:class:`AMQPConnection` per client, with its channels; owns what outlives a connection
(each vhost's exchanges, queues and bindings, and the queues at run time).

A message published to exchange ``e`` is stored on the topic of ``e`` (see
:mod:`handlers.amqp._model`): its routing key is the message key, its headers the
message properties (and, exactly as typed, ``__amqp_headers``), the other basic
properties ``__amqp_*`` properties, its timestamp the event time. What a Pulsar or Kafka
producer writes to that topic reaches the bound queues as a publish with its key as the
routing key and its properties as headers.
"""

from __future__ import annotations

import base64
import functools
import logging
import math
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote, unquote

import trio

from core.auth import AuthenticationError
from core.format import Message
from core.messaging import Received, publish, store
from core.naming import NamespaceName, TopicName
from core.stats import Series
from core.storage import Position
from handlers._serve import Outbox, Reader, open_url_listeners, run_session
from handlers.amqp._codec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    AMQPError,
    FrameReader,
    Properties,
    ReplyCode,
    decode_header,
    decode_method,
    decode_table,
    encode_content,
    encode_method,
    encode_table,
)
from handlers.amqp._model import (
    DEFAULT_EXCHANGE_TOPIC,
    EXCHANGE_TYPES,
    ROOT,
    ExchangeDecl,
    QueueDecl,
    VHost,
    binding,
    queue_subscription,
)
from handlers.amqp._queue import Held, QueueArguments, QueueRuntime, admit
from handlers.amqp._settings import CONFIG_KEYS
from handlers.amqp._stream import StreamQueue, is_stream

__all__ = ["AMQPProtocolHandler"]

log = logging.getLogger(__name__)

P = "__amqp_"  # prefix of the properties only AMQP reads
BASIC = 60
PROPERTY_NAMES = ("content_type", "content_encoding", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "type", "user_id",
                  "app_id", "cluster_id")
INT_PROPERTIES = {"delivery_mode", "priority"}
CLOSE_WAIT = 1.0  # how long a connection.close waits for close-ok
CATCH_UP = 1.0  # how long a declare-ok's count or a basic.get waits for what is on its way
HANDSHAKE_TIMEOUT = 10.0  # seconds from the protocol header to connection.open (RabbitMQ's)
#: Publishes of a channel not yet stored past which its connection reads nothing more (and
#: says connection.blocked, to a client that takes it) until half are (amqpPublishWindow).
PUBLISH_WINDOW = 20_000




class AMQPProtocolHandler:
    name = "amqp"
    config_keys = CONFIG_KEYS

    def __init__(self, config: Any, broker: Any):
        self.config = config
        self.broker = broker
        self.tenant = str(config.get("amqpTenant") or "public")
        self.frame_max = int(config.get("amqpFrameMax") or 131072)
        self.channel_max = int(config.get("amqpChannelMax") or 2047)
        self.heartbeat = int(config.get("amqpHeartbeat") if config.get("amqpHeartbeat") is not None else 60)
        self.max_connections = int(config.get("amqpMaxConnectionsPerVhost") or 0)
        # One over the broker's maxMessageSize is stored as a chunked message.
        self.max_message = int(config.get("amqpMaxMessageSize") or 128 << 20)
        self.publish_window = int(config.get("amqpPublishWindow") or PUBLISH_WINDOW)
        self.default_user = str(config.get("amqpDefaultUser") or "guest")
        self.default_pass = str(config.get("amqpDefaultPassword") or "guest")
        self.vhosts: dict[str, VHost] = {}
        self.queues: dict[tuple[str, str], QueueRuntime | StreamQueue] = {}
        self.connections: dict[str, set[AMQPConnection]] = {}
        self.live: set[Any] = set()
        self.addresses: list[str] = []
        self.nursery: trio.Nursery | None = None
        self.stats = {"connections": 0, "channels": 0, "publishes": 0, "deliveries": 0,
                      "confirms": 0, "returns": 0, "auth_failures": 0}

    # -- names ---------------------------------------------------------------------------

    def namespace(self, vhost: str) -> NamespaceName | None:
        """The namespace of a vhost, None when there is none: ``/`` is public/default
        (the ``amqpTenant``), any other ``v`` the namespace ``{amqpTenant}/v``."""
        name = NamespaceName(self.tenant, "default" if vhost == "/" else vhost)
        if vhost != "/" and self.broker.policies.get_namespace(name) is None:
            return None
        return name

    def exchange_topic(self, vhost: str, exchange: str) -> TopicName:
        ns = self.namespace(vhost) or NamespaceName(self.tenant, "default")
        local = DEFAULT_EXCHANGE_TOPIC if exchange == "" else quote(exchange, safe="-_.")
        return TopicName("persistent", ns.tenant, ns.namespace, local)

    def stream_topic(self, vhost: str, queue: str) -> TopicName:
        """The topic a stream queue is: ``queue`` in the vhost's namespace."""
        ns = self.namespace(vhost) or NamespaceName(self.tenant, "default")
        return TopicName("persistent", ns.tenant, ns.namespace, quote(queue, safe="-_."))

    def vhost(self, name: str) -> VHost:
        v = self.vhosts.get(name)
        if v is None:
            v = self.vhosts[name] = VHost(name, self.broker.metadata)
        return v

    @staticmethod
    def headers_of(m: Message) -> dict[str, Any]:
        """A message's AMQP headers: as published over AMQP, or else its properties."""
        packed = m.properties.get(P + "headers")
        if packed is not None:
            try:
                return decode_table(base64.b64decode(packed), 0)[0]
            except (AMQPError, ValueError):
                pass
        return {k: v for k, v in m.properties.items() if not k.startswith("__")}

    # -- serving -------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners, urls = await open_url_listeners(self.config.get("amqpListeners"), "amqpListeners",
                                                   "amqp", "amqp://127.0.0.1:5672")
        self.addresses.extend(urls)
        async with trio.open_nursery() as nursery:
            self.nursery = nursery  # where queues run their expiry timers and dead-lettering
            await self._load()
            self.vhost("/")
            self.broker.stats.protocol_series[self.name] = self.series
            self.broker.protocol_views[self.name] = self
            log.info("amqp listening on %s", ", ".join(self.addresses))
            await nursery.start(partial(trio.serve_listeners, self._connection, listeners))
            task_status.started(list(self.addresses))

    async def _load(self) -> None:
        """Every vhost's declarations back from the store; the queues that were not
        durable (or exclusive, whose connection is gone) are dropped with their
        subscriptions, the others read again where they were."""
        for child in self.broker.metadata.children(ROOT):
            v = self.vhost(unquote(child))
            v.load()
            for q in list(v.queues.values()):
                rt: QueueRuntime | StreamQueue = \
                    StreamQueue(self, v, q) if is_stream(q) else QueueRuntime(self, v, q)
                if not q.durable or q.exclusive:
                    await self._drop_subscriptions(v, q)
                    del v.queues[q.name]
                    v.forget("queues", q.name)
                    v.bindings = {b for b in v.bindings
                                  if b.to_exchange or b.destination != q.name}
                    continue
                self.queues[(v.name, q.name)] = rt
                await rt.refresh()
            v.save_bindings()

    async def _drop_subscriptions(self, v: VHost, q: QueueDecl) -> None:
        for exchange in v.chains(q.name):
            name = self.exchange_topic(v.name, exchange)
            try:
                topic = await self.broker.get_topic(name, create=False)
            except Exception:  # the topic is gone too
                continue
            if topic is not None and queue_subscription(q.name) in topic.subscriptions:
                try:
                    await topic.unsubscribe(queue_subscription(q.name))
                except Exception as exc:
                    log.debug("amqp: subscription of %s on %s kept: %s", q.name, name, exc)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.stats["connections"] += 1
        await run_session("amqp", self.broker, self.live, AMQPConnection(self, stream))

    def series(self) -> Iterator[Series]:
        """The handler's counters and gauges, as ``/metrics`` shows them."""
        st = self.stats
        yield Series("magnetar_amqp_connections", "counter", "AMQP connections accepted",
                     st["connections"])
        yield Series("magnetar_amqp_channels", "counter", "AMQP channels opened", st["channels"])
        yield Series("magnetar_amqp_channels_open", "gauge", "AMQP channels open now",
                     sum(len(c.channels) for c in self.live if isinstance(c, AMQPConnection)))
        yield Series("magnetar_amqp_publishes", "counter", "Messages published by AMQP clients",
                     st["publishes"])
        yield Series("magnetar_amqp_deliveries", "counter",
                     "Messages delivered to AMQP clients (basic.deliver and basic.get-ok)",
                     st["deliveries"])
        yield Series("magnetar_amqp_confirms", "counter", "Publisher confirms sent", st["confirms"])
        yield Series("magnetar_amqp_returns", "counter", "Unroutable mandatory messages returned",
                     st["returns"])
        yield Series("magnetar_amqp_auth_failures", "counter", "AMQP logins refused",
                     st["auth_failures"])
        for (vhost, name), q in sorted(self.queues.items()):
            labels = (("vhost", vhost), ("queue", name))
            yield Series("magnetar_amqp_queue_messages_ready", "gauge",
                         "Messages of a queue ready for delivery", q.message_count, labels)
            yield Series("magnetar_amqp_queue_messages_unacknowledged", "gauge",
                         "Messages of a queue delivered and not yet acknowledged", q.unacked, labels)
            yield Series("magnetar_amqp_queue_consumers", "gauge", "Consumers of a queue",
                         len(q.consumers), labels)

    # -- what the admin API shows ----------------------------------------------------------

    def admin_exchanges(self, vhost: str) -> list[dict[str, Any]]:
        v = self.vhosts[vhost]
        return [{"name": e.name, "type": e.type, "durable": e.durable, "auto_delete": e.auto_delete,
                 "internal": e.internal, "topic": str(self.exchange_topic(vhost, e.name))}
                for e in sorted(v.exchanges.values(), key=lambda e: e.name)]

    def admin_queues(self, vhost: str) -> list[dict[str, Any]]:
        out = []
        for (vname, name), q in sorted(self.queues.items()):
            if vname == vhost:
                out.append({"name": name, "durable": q.decl.durable, "exclusive": q.decl.exclusive,
                            "auto_delete": q.decl.auto_delete, "messages_ready": q.message_count,
                            "messages_unacknowledged": q.unacked, "consumers": len(q.consumers),
                            "subscription": queue_subscription(name),
                            "topics": sorted(str(t) for t in q.sources.values())})
        return out

    def admin_bindings(self, vhost: str) -> list[dict[str, Any]]:
        v = self.vhosts[vhost]
        return [{"source": b.source, "destination": b.destination,
                 "destination_type": "exchange" if b.to_exchange else "queue",
                 "routing_key": b.routing_key, "arguments": {k: _text(x) for k, x in b.arguments}}
                for b in sorted(v.bindings, key=lambda b: (b.source, b.destination, b.routing_key))]

    # -- queues --------------------------------------------------------------------------

    async def delete_queue(self, vhost: VHost, name: str) -> int:
        rt = self.queues.pop((vhost.name, name), None)
        count = 0
        if rt is not None:
            count = rt.message_count
            await rt.drop()
        vhost.queues.pop(name, None)
        vhost.forget("queues", name)
        before = len(vhost.bindings)
        vhost.bindings = {b for b in vhost.bindings if b.to_exchange or b.destination != name}
        if len(vhost.bindings) != before:
            vhost.save_bindings()
        await self._exchanges_unused(vhost)
        return count

    async def _exchanges_unused(self, vhost: VHost) -> None:
        """Auto-delete exchanges that lost their last binding go."""
        for e in list(vhost.exchanges.values()):
            if e.auto_delete and not any(b.source == e.name for b in vhost.bindings):
                del vhost.exchanges[e.name]
                vhost.forget("exchanges", e.name)

    async def refresh_all(self, vhost: VHost) -> None:
        for (vname, _), rt in list(self.queues.items()):
            if vname == vhost.name:
                await rt.refresh()


@dataclass(slots=True)
class _Run:
    """Publishes of a channel to one topic, stored as one call: (topic, message, confirm
    sequence number or 0, refused by a queue's reject-publish) each."""

    group: list[tuple[TopicName, Message, int, bool]]
    done: bool = False
    ok: bool = False


class ConnectionClosed(Exception):
    pass


class _Consumer:
    """A basic.consume: delivers on its channel while the channel's prefetch allows."""

    def __init__(self, channel: Channel, tag: str, queue: Any, no_ack: bool, prefetch: int):
        # queue: a QueueRuntime, or a stream consumer's StreamReader (the same calls)
        self.channel = channel
        self.tag = tag
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch  # per consumer, 0: none
        self.unacked = 0

    def has_room(self, held: Held) -> bool:
        ch = self.channel
        if ch.closing or not ch.flow_active or not ch.conn.outbox.writable():
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return ch.room_for(held)

    def deliver(self, queue: QueueRuntime, held: Held) -> None:
        self.channel.deliver(self, queue, held)

    def cancelled_by_server(self) -> None:
        self.channel.server_cancel(self)


class Channel:
    def __init__(self, conn: AMQPConnection, number: int):
        self.conn = conn
        self.number = number
        self.closing = False
        self.flow_active = True
        self.consumers: dict[str, _Consumer] = {}
        self.next_tag = 1
        # delivery tag -> (queue, message, consumer tag or None for basic.get)
        self.unacked: OrderedDict[int, tuple[QueueRuntime, Held, _Consumer | None]] = OrderedDict()
        self.unacked_bytes = 0
        self.prefetch_count = 0  # for consumers started after basic.qos(global=False)
        self.global_prefetch = 0
        self.prefetch_size = 0
        self.confirming = False
        self.publish_seq = 0
        self.tx: list[tuple[str, Any]] | None = None
        # the content being read: (method args, header, body parts, size so far)
        self.content: tuple[dict[str, Any], Properties | None, int, list[bytes], int] | None = None
        self.publishes: trio.MemorySendChannel[Any] | None = None
        self.pending_publishes = 0
        self.published = trio.Event()
        self.runs: deque[_Run] = deque()  # on their way to storage, in order

    # -- deliveries ----------------------------------------------------------------------

    def room_for(self, held: Held) -> bool:
        unacked = len(self.unacked)
        if self.global_prefetch and unacked >= self.global_prefetch:
            return False
        if self.prefetch_size and self.unacked_bytes and \
                self.unacked_bytes + held.size > self.prefetch_size:
            return False
        return True

    def _take_tag(self, queue: QueueRuntime, held: Held, consumer: _Consumer | None,
                  no_ack: bool) -> int:
        tag = self.next_tag
        self.next_tag += 1
        if not no_ack:
            self.unacked[tag] = (queue, held, consumer)
            self.unacked_bytes += held.size
            if consumer is not None:
                consumer.unacked += 1
        return tag

    def deliver(self, consumer: _Consumer, queue: QueueRuntime, held: Held) -> None:
        tag = self._take_tag(queue, held, consumer, consumer.no_ack)
        m = held.received.message
        frames = encode_method(self.number, "basic.deliver", consumer_tag=consumer.tag,
                               delivery_tag=tag, redelivered=held.redelivered,
                               exchange=held.exchange, routing_key=m.key or "")
        self.conn.send(frames + self.conn.content(self.number, m))
        self.conn.h.stats["deliveries"] += 1
        if consumer.no_ack:
            queue.settle(held.received)

    def server_cancel(self, consumer: _Consumer) -> None:
        if self.consumers.pop(consumer.tag, None) is not None and not self.closing:
            self.conn.send(encode_method(self.number, "basic.cancel", consumer_tag=consumer.tag,
                                         nowait=True))

    # -- settling ------------------------------------------------------------------------

    def _tags(self, tag: int, multiple: bool, method: str) -> list[int]:
        if multiple:
            tags = [t for t in self.unacked if t <= tag or tag == 0]
            return tags
        if tag not in self.unacked:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}",
                            BASIC, {"basic.ack": 80, "basic.reject": 90, "basic.nack": 120}[method])
        return [tag]

    def settle(self, tags: list[int], *, ack: bool, requeue: bool) -> None:
        by_queue: dict[int, tuple[QueueRuntime, list[Held]]] = {}
        acked: dict[int, tuple[QueueRuntime, list[Received]]] = {}
        touched: set[QueueRuntime] = set()
        for t in tags:
            queue, held, consumer = self.unacked.pop(t)
            self.unacked_bytes -= held.size
            queue.unacked -= 1
            if consumer is not None:
                consumer.unacked -= 1
            touched.add(queue)
            if ack:
                acked.setdefault(id(queue), (queue, []))[1].append(held.received)
            elif not requeue:
                queue.dead_letter(held, "rejected")
            else:
                by_queue.setdefault(id(queue), (queue, []))[1].append(held)
        for queue, received in acked.values():
            queue.settle_many(received)
        for queue, held_list in by_queue.values():
            queue.requeue(held_list)
        for queue in touched:
            queue.dispatch()
        self.conn.dispatch_all()

    def release_all(self) -> None:
        """The channel is gone: unacknowledged deliveries go back to their queues, in
        order; its consumers stop."""
        for c in list(self.consumers.values()):
            c.queue.remove_consumer(c)
            self.conn.h_auto_delete(c.queue)
        self.consumers.clear()
        self.settle(list(self.unacked), ack=False, requeue=True)


class AMQPConnection:
    def __init__(self, handler: AMQPProtocolHandler, stream: trio.SocketStream):
        self.h = handler
        self.stream = stream
        self.reader = Reader(stream)
        self.outbox = Outbox(stream)
        self.outbox.on_writable = self.dispatch_all
        self.frames = FrameReader(frame_max=handler.frame_max)
        self.channels: dict[int, Channel] = {}
        self.closing_channels: set[int] = set()
        self.vhost: VHost | None = None
        self.user = ""
        self.role: str | None = None
        self.frame_max = handler.frame_max
        self.channel_max = handler.channel_max
        self.heartbeat = 0
        self.last_read = trio.current_time()
        self.state = "start"  # start, tune, open, closing
        self.exclusive: set[str] = set()
        self.nursery: trio.Nursery | None = None
        self.name = str(uuid.uuid4())
        self.close_ok = trio.Event()
        self.takes_blocked = False  # the client's capabilities say connection.blocked

    # -- output --------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.outbox.put(data)

    def content(self, channel: int, m: Message) -> bytes:
        return encode_content(channel, BASIC, self.h_properties(m), m.payload, self.frame_max)

    def h_properties(self, m: Message) -> Properties:
        props: dict[str, Any] = {}
        for name in PROPERTY_NAMES:
            v = m.properties.get(P + name)
            if v is not None:
                props[name] = int(v) if name in INT_PROPERTIES else v
        headers = self.h.headers_of(m)
        if headers:
            props["headers"] = headers
        if m.event_time:
            props["timestamp"] = m.event_time // 1000
        return Properties(**props)

    def dispatch_all(self) -> None:
        for ch in self.channels.values():
            for c in list(ch.consumers.values()):
                c.queue.dispatch()

    def h_auto_delete(self, queue: QueueRuntime) -> None:
        """An auto-delete queue goes when its last consumer does (having had one)."""
        if queue.decl.auto_delete and queue.had_consumer and not queue.consumers \
                and not queue.deleted and self.h.nursery is not None:
            # the handler's nursery: this connection's may be closing
            self.h.nursery.start_soon(self.h.delete_queue, queue.vhost, queue.name)

    # -- the connection ------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self.outbox.run_writer)
                try:
                    await self._read_loop()
                except ConnectionClosed:
                    pass
                with trio.move_on_after(CLOSE_WAIT):
                    await self.outbox.drained()
                nursery.cancel_scope.cancel()
        finally:
            await self._cleanup()
            with trio.move_on_after(1) as cs:
                cs.shield = True
                await self.stream.aclose()

    async def _cleanup(self) -> None:
        for ch in list(self.channels.values()):
            ch.release_all()
        self.channels.clear()
        if self.vhost is not None:
            conns = self.h.connections.get(self.vhost.name)
            if conns is not None:
                conns.discard(self)
            with trio.CancelScope(shield=True):
                for q in list(self.exclusive):
                    await self.h.delete_queue(self.vhost, q)

    async def _read_loop(self) -> None:
        header = b""
        while len(header) < 8:
            got = await self._receive()
            header += got
        if header[:8] != PROTOCOL_HEADER:
            self.send(PROTOCOL_HEADER)
            raise ConnectionClosed
        self.frames.feed(header[8:])
        self.send(encode_method(0, "connection.start", version_major=0, version_minor=9,
                                server_properties=self._server_properties(),
                                mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US"))
        while True:
            try:
                while (frame := self.frames.next()) is not None:
                    await self._frame(frame)
            except AMQPError as exc:
                if exc.connection or self.state != "open":
                    await self._close_connection(exc)
                    raise ConnectionClosed from exc
                raise
            await self._receive_more()

    async def _receive(self) -> bytes:
        # A handshake has HANDSHAKE_TIMEOUT to reach connection.open; once tune-ok agreed a
        # heartbeat, two intervals with nothing read end the connection, open or not
        # (spec 4.2.7; RabbitMQ's heartbeat timeout).
        limits = [HANDSHAKE_TIMEOUT] if self.state != "open" else []
        if self.heartbeat:
            limits.append(self.heartbeat * 2)
        timeout = min(limits, default=math.inf)
        with trio.move_on_after(timeout):
            got = await self.reader.receive(65536)
            if not got:
                raise ConnectionClosed
            self.last_read = trio.current_time()
            return bytes(got)
        log.debug("amqp: %s silent for %.0f s, closed", self.user or "client", timeout)
        raise ConnectionClosed

    async def _receive_more(self) -> None:
        self.frames.feed(await self._receive())

    def _server_properties(self) -> dict[str, Any]:
        return {"product": "Magnetar", "platform": "Python", "version": "0.1.0",
                "information": "Pulsar-model broker with AMQP 0-9-1",
                "capabilities": {"publisher_confirms": True, "exchange_exchange_bindings": True,
                                 "basic.nack": True, "consumer_cancel_notify": True,
                                 "connection.blocked": True, "authentication_failure_close": True,
                                 "per_consumer_qos": True, "direct_reply_to": False}}

    async def _close_connection(self, exc: AMQPError) -> None:
        log.debug("amqp: closing connection: %s %s", exc.code, exc.text)
        self.state = "closing"
        self.send(encode_method(0, "connection.close", reply_code=int(exc.code), reply_text=exc.text[:255],
                                class_id=exc.class_id, method_id=exc.method_id))
        with trio.move_on_after(CLOSE_WAIT):
            while not self.close_ok.is_set():
                try:
                    frame = self.frames.next()
                except AMQPError:
                    break
                if frame is None:
                    try:
                        await self._receive_more()
                    except ConnectionClosed:
                        break
                    continue
                if frame.type == FRAME_METHOD and frame.channel == 0:
                    try:
                        m = decode_method(frame.payload)
                    except AMQPError:
                        continue
                    if m.name in ("connection.close-ok", "connection.close"):
                        if m.name == "connection.close":
                            self.send(encode_method(0, "connection.close-ok"))
                        break

    # -- frames --------------------------------------------------------------------------

    async def _frame(self, frame: Any) -> None:
        if frame.type == FRAME_HEARTBEAT:
            return
        if frame.channel == 0:
            if frame.type != FRAME_METHOD:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, "UNEXPECTED_FRAME - content on channel 0")
            await self._connection_method(decode_method(frame.payload))
            return
        if self.state != "open":
            raise AMQPError(ReplyCode.CHANNEL_ERROR, "CHANNEL_ERROR - the connection is not open")
        if frame.channel in self.closing_channels:
            if frame.type == FRAME_METHOD:
                m = decode_method(frame.payload)
                if m.name == "channel.close-ok":
                    self.closing_channels.discard(frame.channel)
                    self.channels.pop(frame.channel, None)
                elif m.name == "channel.close":
                    self.send(encode_method(frame.channel, "channel.close-ok"))
            return
        ch = self.channels.get(frame.channel)
        if frame.type == FRAME_METHOD:
            m = decode_method(frame.payload)
            if ch is None:
                if m.name != "channel.open":
                    raise AMQPError(ReplyCode.CHANNEL_ERROR,
                                    f"CHANNEL_ERROR - expected 'channel.open' on channel {frame.channel}",
                                    m.class_id, m.method_id)
                await self._open_channel(frame.channel)
                return
            if ch.content is not None:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME,
                                f"UNEXPECTED_FRAME - expected content header for class 60, got {m.name}",
                                m.class_id, m.method_id)
            try:
                await self._channel_method(ch, m)
            except AMQPError as exc:
                if exc.connection:
                    raise
                self._close_channel(ch, exc)
            return
        if ch is None:
            raise AMQPError(ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {frame.channel} is not open")
        try:
            await self._content(ch, frame)
        except AMQPError as exc:
            if exc.connection:
                raise
            self._close_channel(ch, exc)

    def _close_channel(self, ch: Channel, exc: AMQPError) -> None:
        """A channel error: the channel is closed with its code; what the client sends on it
        until close-ok is ignored."""
        log.debug("amqp: channel %d closed: %s %s", ch.number, exc.code, exc.text)
        ch.closing = True
        ch.release_all()
        self.closing_channels.add(ch.number)
        self.send(encode_method(ch.number, "channel.close", reply_code=int(exc.code),
                                reply_text=exc.text[:255], class_id=exc.class_id,
                                method_id=exc.method_id))

    async def _open_channel(self, number: int) -> None:
        if number > self.channel_max:
            raise AMQPError(ReplyCode.NOT_ALLOWED,
                            f"NOT_ALLOWED - channel number {number} is over the channel_max {self.channel_max}",
                            20, 10)
        ch = self.channels[number] = Channel(self, number)
        self.h.stats["channels"] += 1
        send, receive = trio.open_memory_channel[Any](float("inf"))
        ch.publishes = send
        assert self.nursery is not None
        self.nursery.start_soon(self._publisher, ch, receive)
        self.send(encode_method(number, "channel.open-ok", channel_id=b""))

    # -- connection class ----------------------------------------------------------------

    async def _connection_method(self, m: Any) -> None:
        a = m.args
        if m.name == "connection.start-ok":
            if self.state != "start":
                raise AMQPError(ReplyCode.COMMAND_INVALID, "COMMAND_INVALID - start-ok out of turn", 10, 11)
            self._authenticate(a.get("mechanism", ""), a.get("response", b""))
            caps = (a.get("client_properties") or {}).get("capabilities") or {}
            self.takes_blocked = bool(caps.get("connection.blocked"))
            self.state = "tune"
            self.send(encode_method(0, "connection.tune", channel_max=self.channel_max,
                                    frame_max=self.frame_max, heartbeat=self.h.heartbeat))
        elif m.name == "connection.tune-ok":
            asked = int(a.get("frame_max", 0))
            if asked and asked < 4096:
                raise AMQPError(ReplyCode.NOT_ALLOWED, f"NOT_ALLOWED - frame_max {asked} is under 4096", 10, 31)
            ch_max = int(a.get("channel_max", 0))
            # RabbitMQ refuses a client that answers with more than it offered
            for what, value, most in (("frame_max", asked, self.h.frame_max),
                                      ("channel_max", ch_max, self.h.channel_max)):
                if most and value > most:
                    raise AMQPError(ReplyCode.NOT_ALLOWED,
                                    f"NOT_ALLOWED - negotiated {what} = {value} is higher than the maximum "
                                    f"allowed value ({most})", 10, 31)
            if asked:
                self.frame_max = min(asked, self.h.frame_max) if self.h.frame_max else asked
            if ch_max:
                self.channel_max = min(ch_max, self.channel_max)
            self.heartbeat = int(a.get("heartbeat", 0))
            self.frames.frame_max = self.frame_max
            self.state = "tuned"
            if self.heartbeat and self.nursery is not None:
                self.nursery.start_soon(self._heartbeats)
        elif m.name == "connection.open":
            if self.state != "tuned":
                raise AMQPError(ReplyCode.COMMAND_INVALID, "COMMAND_INVALID - open before tune-ok", 10, 40)
            name = str(a.get("virtual_host", "/") or "/")
            if self.h.namespace(name) is None:
                raise AMQPError(ReplyCode.NOT_ALLOWED, f"NOT_ALLOWED - vhost {name} not found", 10, 40)
            conns = self.h.connections.setdefault(name, set())
            if self.h.max_connections and len(conns) >= self.h.max_connections:
                raise AMQPError(ReplyCode.NOT_ALLOWED,
                                f"NOT_ALLOWED - access to vhost '{name}' refused for user '{self.user}': "
                                f"connection limit ({self.h.max_connections}) is reached", 10, 40)
            conns.add(self)
            self.vhost = self.h.vhost(name)
            self.state = "open"
            self.send(encode_method(0, "connection.open-ok", known_hosts=""))
        elif m.name == "connection.close":
            self.send(encode_method(0, "connection.close-ok"))
            raise ConnectionClosed
        elif m.name == "connection.close-ok":
            self.close_ok.set()
            raise ConnectionClosed
        elif m.name in ("connection.blocked", "connection.unblocked", "connection.update-secret"):
            if m.name == "connection.update-secret":
                self._authenticate("PLAIN", b"\0" + self.user.encode() + b"\0" + bytes(a.get("new_secret", b"")))
                self.send(encode_method(0, "connection.update-secret-ok"))
        else:
            raise AMQPError(ReplyCode.COMMAND_INVALID, f"COMMAND_INVALID - {m.name} on channel 0",
                            m.class_id, m.method_id)

    def _authenticate(self, mechanism: str, response: bytes | str) -> None:
        raw = response.encode() if isinstance(response, str) else bytes(response)
        if mechanism == "PLAIN":
            parts = raw.split(b"\0")
            if len(parts) != 3:
                self._refuse(mechanism)
            user, password = parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
        elif mechanism == "AMQPLAIN":
            try:
                table, _ = decode_table(_with_length(raw), 0)
            except AMQPError:
                self._refuse(mechanism)
            user = _text(table.get("LOGIN", ""))
            password = _text(table.get("PASSWORD", ""))
        else:
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"ACCESS_REFUSED - unsupported authentication mechanism {mechanism!r}", 10, 11)
        auth = self.h.broker.auth
        if auth.authentication_enabled:
            try:
                self.role = auth.authenticate("token", password).role
            except AuthenticationError:
                self._refuse(mechanism)
        elif (user, password) != (self.h.default_user, self.h.default_pass):
            self._refuse(mechanism)
        elif not self._from_loopback():
            self.h.stats["auth_failures"] += 1
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"ACCESS_REFUSED - user '{user}' can only connect via localhost", 10, 11)
        self.user = user

    def _from_loopback(self) -> bool:
        """Whether the client is on this host (RabbitMQ lets its default user in only so)."""
        sock = getattr(self.stream, "socket", None)
        try:
            host = str(sock.getpeername()[0]) if sock is not None else "127.0.0.1"
        except OSError:
            return False
        return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or \
            host.startswith("::ffff:127.")

    def _authorize(self, topics: list[TopicName], produce: bool, what: str, class_id: int,
                   method_id: int) -> None:
        """With authorization on, the token's role must be granted produce (a publish) or
        consume (a consume or get) on the topics behind ``what``."""
        auth = self.h.broker.auth
        if not auth.authorization_enabled:
            return
        check = auth.can_produce if produce else auth.can_consume
        for t in topics:
            if not check(t, self.role):
                assert self.vhost is not None
                raise AMQPError(ReplyCode.ACCESS_REFUSED,
                                f"ACCESS_REFUSED - access to {what} in vhost '{self.vhost.name}' refused "
                                f"for user '{self.user}'", class_id, method_id)

    def _refuse(self, mechanism: str) -> Any:
        self.h.stats["auth_failures"] += 1
        raise AMQPError(ReplyCode.ACCESS_REFUSED,
                        f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. "
                        "For details see the broker logfile.", 10, 11)

    async def _heartbeats(self) -> None:
        while True:
            await trio.sleep(self.heartbeat / 2)
            self.send(HEARTBEAT_FRAME)

    # -- channel methods -----------------------------------------------------------------

    async def _channel_method(self, ch: Channel, m: Any) -> None:
        a = m.args
        name = m.name
        assert self.vhost is not None
        v = self.vhost
        if name == "channel.close":
            ch.release_all()
            self.channels.pop(ch.number, None)
            if ch.publishes is not None:
                await ch.publishes.aclose()
            self.send(encode_method(ch.number, "channel.close-ok"))
        elif name == "channel.close-ok":
            self.channels.pop(ch.number, None)
        elif name == "channel.open":
            raise AMQPError(ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {ch.number} is already open",
                            20, 10)
        elif name == "channel.flow":
            ch.flow_active = bool(a.get("active", True))
            self.send(encode_method(ch.number, "channel.flow-ok", active=ch.flow_active))
            if ch.flow_active:
                self.dispatch_all()
        elif name == "channel.flow-ok":
            pass
        elif name == "exchange.declare":
            await self._exchange_declare(ch, v, a)
        elif name == "exchange.delete":
            await self._exchange_delete(ch, v, a)
        elif name in ("exchange.bind", "exchange.unbind"):
            await self._bind(ch, v, a, name, to_exchange=True)
        elif name == "queue.declare":
            await self._queue_declare(ch, v, a)
        elif name in ("queue.bind", "queue.unbind"):
            await self._bind(ch, v, a, name, to_exchange=False)
        elif name == "queue.purge":
            q = self._queue(v, a.get("queue", ""), m)
            n = q.purge()
            if not a.get("nowait"):
                self.send(encode_method(ch.number, "queue.purge-ok", message_count=n))
        elif name == "queue.delete":
            await self._queue_delete(ch, v, a, m)
        elif name == "basic.qos":
            self._qos(ch, a)
        elif name == "basic.consume":
            await self._consume(ch, v, a, m)
        elif name == "basic.cancel":
            tag = a.get("consumer_tag", "")
            c = ch.consumers.pop(tag, None)
            if c is not None:
                c.queue.remove_consumer(c)
                self.h_auto_delete(c.queue)
            if not a.get("nowait"):
                self.send(encode_method(ch.number, "basic.cancel-ok", consumer_tag=tag))
        elif name == "basic.publish":
            self._start_publish(ch, v, a)
        elif name == "basic.get":
            await self._get(ch, v, a, m)
        elif name in ("basic.ack", "basic.nack", "basic.reject"):
            tag = int(a.get("delivery_tag", 0))
            tags = ch._tags(tag, bool(a.get("multiple")), name)
            ack = name == "basic.ack"
            requeue = bool(a.get("requeue", True)) if not ack else False
            if ch.tx is not None:
                ch.tx.append(("settle", (tags, ack, requeue)))
            else:
                ch.settle(tags, ack=ack, requeue=requeue)
        elif name in ("basic.recover", "basic.recover-async"):
            ch.settle(list(ch.unacked), ack=False, requeue=True)
            if name == "basic.recover":
                self.send(encode_method(ch.number, "basic.recover-ok"))
        elif name == "confirm.select":
            if ch.tx is not None:
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                "PRECONDITION_FAILED - cannot switch from tx to confirm mode", 85, 10)
            ch.confirming = True
            if not a.get("nowait"):
                self.send(encode_method(ch.number, "confirm.select-ok"))
        elif name == "tx.select":
            if ch.confirming:
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                "PRECONDITION_FAILED - cannot switch from confirm to tx mode", 90, 10)
            if ch.tx is None:
                ch.tx = []
            self.send(encode_method(ch.number, "tx.select-ok"))
        elif name in ("tx.commit", "tx.rollback"):
            if ch.tx is None:
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                "PRECONDITION_FAILED - channel is not transactional", 90, m.method_id)
            work, ch.tx = ch.tx, []
            if name == "tx.commit":
                await self._commit(ch, work)
                self.send(encode_method(ch.number, "tx.commit-ok"))
            else:
                self.send(encode_method(ch.number, "tx.rollback-ok"))
        else:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {name}", m.class_id, m.method_id)

    def _queue(self, v: VHost, name: str, m: Any) -> QueueRuntime | StreamQueue:
        q = self.h.queues.get((v.name, name))
        if q is None:
            raise AMQPError(ReplyCode.NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '{v.name}'",
                            m.class_id, m.method_id)
        if q.owner is not None and q.owner is not self:
            raise AMQPError(ReplyCode.RESOURCE_LOCKED,
                            f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in "
                            f"vhost '{v.name}'. It could be originally declared on another connection or "
                            "the exclusive property value does not match that of the original declaration.",
                            m.class_id, m.method_id)
        return q

    async def _exchange_declare(self, ch: Channel, v: VHost, a: Mapping[str, Any]) -> None:
        name = a.get("exchange", "")
        kind = a.get("type", "direct") or "direct"
        existing = v.exchanges.get(name)
        if a.get("passive"):
            if existing is None:
                raise AMQPError(ReplyCode.NOT_FOUND, f"NOT_FOUND - no exchange '{name}' in vhost '{v.name}'", 40, 10)
        else:
            if kind not in EXCHANGE_TYPES:
                raise AMQPError(ReplyCode.COMMAND_INVALID, f"COMMAND_INVALID - unknown exchange type '{kind}'", 40, 10)
            decl = ExchangeDecl(name, kind, bool(a.get("durable")), bool(a.get("auto_delete")),
                                bool(a.get("internal")), dict(a.get("arguments") or {}))
            if existing is None:
                if name.startswith("amq.") or name == "":
                    raise AMQPError(ReplyCode.ACCESS_REFUSED,
                                    f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'",
                                    40, 10)
                v.exchanges[name] = decl
                v.save_exchange(decl)
            elif not existing.same_as(decl):
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"PRECONDITION_FAILED - inequivalent arg for exchange '{name}' in vhost "
                                f"'{v.name}': received {_describe(decl)} but current is {_describe(existing)}",
                                40, 10)
        if not a.get("nowait"):
            self.send(encode_method(ch.number, "exchange.declare-ok"))

    async def _exchange_delete(self, ch: Channel, v: VHost, a: Mapping[str, Any]) -> None:
        name = a.get("exchange", "")
        if name == "" or name.startswith("amq."):
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"ACCESS_REFUSED - operation not permitted on the default exchange or '{name}'", 40, 20)
        if name in v.exchanges:
            if a.get("if_unused") and any(b.source == name for b in v.bindings):
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"PRECONDITION_FAILED - exchange '{name}' in vhost '{v.name}' in use", 40, 20)
            del v.exchanges[name]
            v.forget("exchanges", name)
            v.bindings = {b for b in v.bindings
                          if b.source != name and not (b.to_exchange and b.destination == name)}
            v.save_bindings()
            await self.h.refresh_all(v)
        if not a.get("nowait"):
            self.send(encode_method(ch.number, "exchange.delete-ok"))

    async def _bind(self, ch: Channel, v: VHost, a: Mapping[str, Any], name: str, *, to_exchange: bool) -> None:
        method_id = {"exchange.bind": 30, "exchange.unbind": 40, "queue.bind": 20, "queue.unbind": 50}[name]
        class_id = 40 if to_exchange else 50
        source = a.get("source" if to_exchange else "exchange", "")
        dest = a.get("destination" if to_exchange else "queue", "")
        if not to_exchange and dest == "":
            raise AMQPError(ReplyCode.NOT_FOUND, "NOT_FOUND - no queue name given", class_id, method_id)
        if source == "":
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            "ACCESS_REFUSED - operation not permitted on the default exchange", class_id, method_id)
        if source not in v.exchanges:
            raise AMQPError(ReplyCode.NOT_FOUND, f"NOT_FOUND - no exchange '{source}' in vhost '{v.name}'",
                            class_id, method_id)
        if to_exchange:
            if dest not in v.exchanges:
                raise AMQPError(ReplyCode.NOT_FOUND, f"NOT_FOUND - no exchange '{dest}' in vhost '{v.name}'",
                                class_id, method_id)
        else:
            self._queue(v, dest, _Ids(class_id, method_id))
        b = binding(source, dest, to_exchange, a.get("routing_key", ""), a.get("arguments"))
        if name.endswith(".bind"):
            v.bindings.add(b)
        else:
            v.bindings.discard(b)
        v.save_bindings()
        await self.h.refresh_all(v)
        if name.endswith(".unbind"):
            await self.h._exchanges_unused(v)
        if not a.get("nowait") or name == "queue.unbind":
            self.send(encode_method(ch.number, name + "-ok"))

    async def _queue_declare(self, ch: Channel, v: VHost, a: Mapping[str, Any]) -> None:
        name = a.get("queue", "")
        m = _Ids(50, 10)
        if a.get("passive"):
            q = self._queue(v, name, m)
        else:
            if not name:
                name = "amq.gen-" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            elif name.startswith("amq."):
                raise AMQPError(ReplyCode.ACCESS_REFUSED,
                                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'", 50, 10)
            decl = QueueDecl(name, bool(a.get("durable")), bool(a.get("exclusive")),
                             bool(a.get("auto_delete")), dict(a.get("arguments") or {}))
            QueueArguments.check(decl.arguments, name, v.name)
            stream = is_stream(decl)
            if stream and (not decl.durable or decl.exclusive or decl.auto_delete):
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"PRECONDITION_FAILED - invalid property for stream queue '{name}' in vhost "
                                f"'{v.name}': a stream is durable, neither exclusive nor auto-delete", 50, 10)
            found = self.h.queues.get((v.name, name))
            if found is None:
                q = StreamQueue(self.h, v, decl) if stream else QueueRuntime(self.h, v, decl)
                if decl.exclusive:
                    q.owner = self
                    self.exclusive.add(name)
                v.queues[name] = decl
                v.save_queue(decl)
                self.h.queues[(v.name, name)] = q
                await q.refresh()
            else:
                q = self._queue(v, name, m)
                if not found.decl.same_as(decl):
                    raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                    f"PRECONDITION_FAILED - inequivalent arg for queue '{name}' in vhost "
                                    f"'{v.name}': received {_describe(decl)} but current is "
                                    f"{_describe(found.decl)}", 50, 10)
        if isinstance(q, QueueRuntime):
            q.used()  # x-expires: a declaration is a use
        await self._caught_up(q)
        if not a.get("nowait"):
            self.send(encode_method(ch.number, "queue.declare-ok", queue=q.name,
                                    message_count=q.message_count, consumer_count=len(q.consumers)))

    async def _queue_delete(self, ch: Channel, v: VHost, a: Mapping[str, Any], m: Any) -> None:
        name = a.get("queue", "")
        q = self.h.queues.get((v.name, name))
        count = 0
        if q is not None:
            self._queue(v, name, m)
            if a.get("if_unused") and q.consumers:
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"PRECONDITION_FAILED - queue '{name}' in vhost '{v.name}' in use", 50, 40)
            if a.get("if_empty") and (q.message_count or q.unacked):
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"PRECONDITION_FAILED - queue '{name}' in vhost '{v.name}' is not empty", 50, 40)
            self.exclusive.discard(name)
            count = await self.h.delete_queue(v, name)
        if not a.get("nowait"):
            self.send(encode_method(ch.number, "queue.delete-ok", message_count=count))

    async def _caught_up(self, q: Any) -> None:
        """Before a count or a get answers: this connection's publishes stored, and the
        queue holding what its topics have for it (up to :data:`CATCH_UP` seconds), so a
        client sees in the queue what it published before asking, as in RabbitMQ."""
        with trio.move_on_after(CATCH_UP):
            for ch in list(self.channels.values()):
                while ch.pending_publishes:
                    await ch.published.wait()
            await q.wait_arrivals(CATCH_UP)

    def _qos(self, ch: Channel, a: Mapping[str, Any]) -> None:
        count = int(a.get("prefetch_count", 0))
        if a.get("global"):
            ch.global_prefetch = count
            ch.prefetch_size = int(a.get("prefetch_size", 0))
        else:
            ch.prefetch_count = count
            if a.get("prefetch_size"):
                ch.prefetch_size = int(a.get("prefetch_size", 0))
        self.send(encode_method(ch.number, "basic.qos-ok"))
        self.dispatch_all()

    async def _consume(self, ch: Channel, v: VHost, a: Mapping[str, Any], m: Any) -> None:
        q = self._queue(v, a.get("queue", ""), m)
        tag = a.get("consumer_tag", "") or "amq.ctag-" + base64.urlsafe_b64encode(
            uuid.uuid4().bytes).decode().rstrip("=")
        if tag in ch.consumers:
            raise AMQPError(ReplyCode.NOT_ALLOWED,
                            f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'", 60, 20)
        if q.exclusive_consumer is not None or (a.get("exclusive") and q.consumers):
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"ACCESS_REFUSED - queue '{q.name}' in vhost '{v.name}' in exclusive use", 60, 20)
        self._authorize(_read_topics(q), False, f"queue '{q.name}'", 60, 20)
        c = _Consumer(ch, tag, q, bool(a.get("no_ack")), ch.prefetch_count)
        if isinstance(q, StreamQueue):
            reader = await q.add_reader(c, dict(a.get("arguments") or {}))
            c.queue = reader  # type: ignore[assignment]
        ch.consumers[tag] = c
        if not a.get("nowait"):
            self.send(encode_method(ch.number, "basic.consume-ok", consumer_tag=tag))
        if isinstance(q, StreamQueue):
            reader.go()
        else:
            q.add_consumer(c, bool(a.get("exclusive")))

    async def _get(self, ch: Channel, v: VHost, a: Mapping[str, Any], m: Any) -> None:
        q = self._queue(v, a.get("queue", ""), m)
        if isinstance(q, StreamQueue):
            raise q.refusal("basic.get", 60, 70)
        self._authorize(_read_topics(q), False, f"queue '{q.name}'", 60, 70)
        held = q.get()
        if held is None:
            await self._caught_up(q)
            held = q.get()
        if held is None:
            self.send(encode_method(ch.number, "basic.get-empty", cluster_id=""))
            return
        no_ack = bool(a.get("no_ack"))
        if not no_ack:
            q.unacked += 1
        tag = ch._take_tag(q, held, None, no_ack)
        msg = held.received.message
        self.send(encode_method(ch.number, "basic.get-ok", delivery_tag=tag, redelivered=held.redelivered,
                                exchange=held.exchange, routing_key=msg.key or "",
                                message_count=q.message_count) + self.content(ch.number, msg))
        self.h.stats["deliveries"] += 1
        if no_ack:
            q.settle(held.received)

    # -- publishing ----------------------------------------------------------------------

    def _start_publish(self, ch: Channel, v: VHost, a: Mapping[str, Any]) -> None:
        exchange = a.get("exchange", "")
        e = v.exchanges.get(exchange)
        if e is None:
            raise AMQPError(ReplyCode.NOT_FOUND, f"NOT_FOUND - no exchange '{exchange}' in vhost '{v.name}'",
                            60, 40)
        if e.internal:
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"ACCESS_REFUSED - cannot publish to internal exchange '{exchange}' in vhost '{v.name}'",
                            60, 40)
        self._authorize([self.h.exchange_topic(v.name, exchange)], True, f"exchange '{exchange}'", 60, 40)
        ch.content = (dict(a), None, 0, [], 0)

    async def _content(self, ch: Channel, frame: Any) -> None:
        if ch.content is None:
            raise AMQPError(ReplyCode.UNEXPECTED_FRAME,
                            f"UNEXPECTED_FRAME - content frame on channel {ch.number} with no method", 0, 0)
        args, props, size, parts, got = ch.content
        if frame.type == FRAME_HEADER:
            if props is not None:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, "UNEXPECTED_FRAME - a second content header", 60, 40)
            class_id, size, props = decode_header(frame.payload)
            if class_id != BASIC:
                raise AMQPError(ReplyCode.FRAME_ERROR, f"FRAME_ERROR - content header of class {class_id}", 60, 40)
            if size > self.h.max_message:
                ch.content = None
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"PRECONDITION_FAILED - message size {size} is larger than configured max "
                                f"size {self.h.max_message}", 60, 40)
        elif frame.type == FRAME_BODY:
            if props is None:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, "UNEXPECTED_FRAME - body before the content header",
                                60, 40)
            parts.append(frame.payload)
            got += len(frame.payload)
            if got > size:
                raise AMQPError(ReplyCode.FRAME_ERROR,
                                f"FRAME_ERROR - body of {got} bytes, over the {size} the header gave", 60, 40)
        else:
            raise AMQPError(ReplyCode.UNEXPECTED_FRAME, f"UNEXPECTED_FRAME - frame type {frame.type}", 60, 40)
        ch.content = (args, props, size, parts, got)
        if props is not None and got == size:
            ch.content = None
            await self._published(ch, args, props, b"".join(parts))

    async def _published(self, ch: Channel, args: Mapping[str, Any], props: Properties, body: bytes) -> None:
        assert self.vhost is not None
        v = self.vhost
        exchange = args.get("exchange", "")
        key = args.get("routing_key", "")
        self.h.stats["publishes"] += 1
        m = _message(exchange, key, props, body)
        seq = 0
        if ch.confirming:
            ch.publish_seq += 1
            seq = ch.publish_seq
        if ch.tx is not None:
            ch.tx.append(("publish", (exchange, key, props, m, bool(args.get("mandatory")))))
            return
        if args.get("mandatory") and not any(True for _ in v.routes(exchange, key, props.headers)):
            self._return(ch, exchange, key, m)
        refused = False
        if v.publish_limited:  # x-overflow reject-publish: decided now, for this message
            m, refused = admit([q for n in v.routes(exchange, key, props.headers)
                                if isinstance(q := self.h.queues.get((v.name, n)), QueueRuntime)], m)
        topic = self.h.exchange_topic(v.name, exchange)
        if exchange == "" and isinstance(target := self.h.queues.get((v.name, key)), StreamQueue):
            topic = target.topic
        ch.pending_publishes += 1
        assert ch.publishes is not None
        ch.publishes.send_nowait((topic, m, seq, refused))
        if ch.pending_publishes >= self.h.publish_window:
            await self._wait_for_room(ch)

    async def _wait_for_room(self, ch: Channel) -> None:
        """Too many publishes of ``ch`` wait to be stored: read nothing more until half
        are, saying connection.blocked meanwhile to a client that takes it."""
        if self.takes_blocked:
            self.send(encode_method(0, "connection.blocked", reason="publishes wait to be stored"))
        while ch.pending_publishes > self.h.publish_window // 2 and ch.number in self.channels:
            await ch.published.wait()
        if self.takes_blocked:
            self.send(encode_method(0, "connection.unblocked"))

    def _return(self, ch: Channel, exchange: str, key: str, m: Message) -> None:
        self.h.stats["returns"] += 1
        self.send(encode_method(ch.number, "basic.return", reply_code=int(ReplyCode.NO_ROUTE),
                                reply_text="NO_ROUTE", exchange=exchange, routing_key=key)
                  + self.content(ch.number, m))

    async def _publisher(self, ch: Channel, receive: trio.MemoryReceiveChannel[Any]) -> None:
        """Stores a channel's publishes in order, those waiting together as one entry per
        topic, without waiting for one run to be durable before queuing the next; each
        run is confirmed (in confirm mode) once it and every run before it are stored."""
        producer = f"amqp-{self.name}-{ch.number}"
        async with receive:
            while True:
                try:
                    first = await receive.receive()
                except trio.EndOfChannel:
                    return
                batch = [first]
                while True:
                    try:
                        batch.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                i = 0
                while i < len(batch):
                    name = batch[i][0]
                    j = i
                    while j < len(batch) and batch[j][0] == name:
                        j += 1
                    run = _Run(batch[i:j])
                    i = j
                    ch.runs.append(run)
                    try:
                        topic = await self.h.broker.get_topic(name)
                    except Exception as exc:
                        self._stored(ch, run, name, exc)
                        continue
                    store(self.h.broker, topic, [m for _, m, _, _ in run.group], producer_name=producer,
                          done=functools.partial(self._run_stored, ch, run, name))

    def _run_stored(self, ch: Channel, run: _Run, name: TopicName, _position: Position,
                    exc: BaseException | None) -> None:
        self._stored(ch, run, name, exc)

    def _stored(self, ch: Channel, run: _Run, name: TopicName, exc: BaseException | None) -> None:
        """A run is stored (or failed): confirm it and the stored runs after it, in order."""
        if exc is not None:
            log.warning("amqp: publish to %s failed: %s", name, exc)
        run.ok, run.done = exc is None, True
        while ch.runs and ch.runs[0].done:
            self._confirm(ch, ch.runs.popleft())
        ch.published.set()
        ch.published = trio.Event()

    def _confirm(self, ch: Channel, run: _Run) -> None:
        group, ok = run.group, run.ok
        ch.pending_publishes -= len(group)
        last = group[-1][2]
        if not last or ch.closing or ch.number not in self.channels:
            return
        self.h.stats["confirms"] += len(group)
        if any(refused for *_, refused in group):
            for _, _, seq, refused in group:  # one by one: some are nacked
                self.send(encode_method(ch.number, "basic.nack" if refused or not ok
                                        else "basic.ack", delivery_tag=seq, multiple=False,
                                        **({"requeue": False} if refused or not ok else {})))
        else:
            self.send(encode_method(ch.number, "basic.ack" if ok else "basic.nack",
                                    delivery_tag=last, multiple=len(group) > 1,
                                    **({} if ok else {"requeue": False})))

    async def _commit(self, ch: Channel, work: list[tuple[str, Any]]) -> None:
        """A transaction's publishes, stored together per topic (all of one topic in one
        entry, so all or none), then its acknowledgements."""
        assert self.vhost is not None
        v = self.vhost
        while ch.pending_publishes:
            await ch.published.wait()
        by_topic: dict[TopicName, list[Message]] = {}
        for kind, item in work:
            if kind == "publish":
                exchange, key, props, m, mandatory = item
                if mandatory and not any(True for _ in v.routes(exchange, key, props.headers)):
                    self._return(ch, exchange, key, m)
                by_topic.setdefault(self.h.exchange_topic(v.name, exchange), []).append(m)
        for topic, messages in by_topic.items():
            await publish(self.h.broker, topic, messages, producer_name=f"amqp-{self.name}-{ch.number}")
        for kind, item in work:
            if kind == "settle":
                tags, ack, requeue = item
                ch.settle([t for t in tags if t in ch.unacked], ack=ack, requeue=requeue)


def _read_topics(q: QueueRuntime | StreamQueue) -> list[TopicName]:
    """The topics a queue's consumers read."""
    return [q.topic] if isinstance(q, StreamQueue) else list(q.sources.values())


class _Ids:
    def __init__(self, class_id: int, method_id: int):
        self.class_id = class_id
        self.method_id = method_id


def _describe(d: Any) -> str:
    if isinstance(d, ExchangeDecl):
        return f"type '{d.type}', durable {str(d.durable).lower()}, auto_delete {str(d.auto_delete).lower()}"
    return (f"durable {str(d.durable).lower()}, exclusive {str(d.exclusive).lower()}, "
            f"auto_delete {str(d.auto_delete).lower()}")


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _with_length(raw: bytes) -> bytes:
    """AMQPLAIN's response is a field table without its length prefix."""
    return len(raw).to_bytes(4, "big") + raw


def _message(exchange: str, key: str, props: Properties, body: bytes) -> Message:
    properties: dict[str, str] = {}
    if props.headers:
        for k, val in props.headers.items():
            properties[k] = _text(val) if not isinstance(val, (dict, list)) else str(val)
        properties[P + "headers"] = base64.b64encode(encode_table(props.headers)).decode()
    for name in PROPERTY_NAMES:
        val = getattr(props, name)
        if val is not None:
            properties[P + name] = str(val)
    if exchange:
        properties[P + "exchange"] = exchange
    event_time = props.timestamp * 1000 if props.timestamp else None
    return Message(payload=body, key=key or None, properties=properties, event_time=event_time,
                   publish_time=int(time.time() * 1000))
