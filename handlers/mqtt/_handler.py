"""The MQTT protocol plugin: listens on ``mqttListeners`` and runs one :class:`MQTTSession`
per connection; owns what outlives a connection (sessions by client id, retained
messages, the filters of every session in one topic tree).

Mapping: the MQTT topic ``a/b/c`` is the topic ``persistent://{mqttTenant}/{mqttNamespace}/a/b/c``
(a name written as ``persistent://t/ns/x`` picks its own namespace). A session is a
subscription named ``mqtt:{client id}`` on every topic its filters match, topics loaded
later included: durable for a persistent session (the cursor queues what arrives while
the client is away), non-durable for a clean one. MQTT 5 user properties are the
message's properties; what MQTT alone needs (QoS, retain, content type, response topic,
correlation data, expiry, the publisher) travels in properties named ``__mqtt_*``.
Shared subscriptions are the core's Shared subscriptions (:mod:`handlers.mqtt._shared`);
while a persistent session's client is away, an :class:`~handlers.mqtt._offline.OfflineQueue`
bounds what it keeps. The handler's counters are on ``/metrics`` (:meth:`MQTTProtocolHandler.series`).

Authentication: with ``authenticationEnabled`` a client proves a role with a token, as a
Pulsar client does: a 3.1.1 or 5.0 client as its CONNECT password, a 5.0 client also by
enhanced authentication (5.0 section 4.12) with the method ``token``, whose data is the
token, in the CONNECT or in the AUTH that answers the server's Continue authentication, and
again whenever it re-authenticates (:meth:`MQTTSession._auth`).

Authorization: with ``authorizationEnabled`` the role is checked as a Pulsar client's is
(:class:`core.auth.AuthService`). A PUBLISH, retained or not, needs ``produce`` on its
topic; one refused is not stored and is answered as Mosquitto answers a publish its ACLs
deny: PUBACK or PUBREC 0x87 (Not authorized) in 5.0, a plain PUBACK or PUBREC in 3.1.1,
which cannot say no (3.1.1 section 3.3.5, MQTT-3.3.5-2), nothing for QoS 0. A will is
checked when it is published, with the role the connection last proved (Mosquitto checks
it then too), not at CONNECT. A subscription needs ``consume``: an exact filter on its
topic, a filter with wildcards on the namespace it maps to; a refused filter gets SUBACK
0x87 (5.0) or 0x80 (3.1.1) alone. Each topic a session consumes is checked again when it
is attached (topics created after the filter included), as are the retained messages a
SUBSCRIBE sends, so a per-topic grant or a topic of another namespace is honoured; after a
re-authentication the topics the new role may not consume are let go.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any
from urllib.parse import quote

import trio

from core.auth import TOKEN_METHOD, AuthenticationError
from core.format import Message, entry_from_messages, messages_from_entry
from core.messaging import Received, Subscriber, end_of, publish, store
from core.naming import TopicName
from core.routing import TopicTree, mqtt_filter_error
from core.stats import Series
from core.storage import Position
from core.subscription import SubType
from core.topic import PersistentTopic
from core.writes import flush_at_end, write_batch, write_now
from handlers._serve import open_url_listeners, run_session
from handlers.mqtt._codec import (
    NEED_DATA,
    MQTTConnection,
    ProtocolError,
    RemoteProtocolError,
    Role,
    State,
    UnsupportedProtocolVersion,
)
from handlers.mqtt._offline import OfflineQueue
from handlers.mqtt._packets import (
    Auth,
    Connack,
    Connect,
    ConnectReturnCode,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscribeOption,
    Unsuback,
    Unsubscribe,
    Will,
)
from handlers.mqtt._settings import CONFIG_KEYS
from handlers.mqtt._shared import ShareFilter, parse_share

__all__ = ["MQTTProtocolHandler"]

log = logging.getLogger(__name__)

P = "__mqtt_"  # prefix of the properties only MQTT reads
SESSIONS = "/mqtt/sessions"
RETAINED = "/mqtt/retained"
OUT_BUFFER = 1 << 20
PUBLISH_WINDOW = 1000  # a session's publishes waiting to be stored before it stops reading
PUBLISH_DRAIN = 5.0  # how long a closing session waits for its publishes to be stored
SUBACK_FAILURE = 0x80  # 3.1.1 section 3.9.3: the one return code that refuses a filter


@dataclass(slots=True)
class SessionState:
    """What a session keeps between connections (and, when persistent, in the metadata
    store across restarts: its filters, the QoS 2 packet ids the client's PUBLISHes await
    PUBREL on, and those the broker sent PUBREL for and awaits PUBCOMP on)."""

    client_id: str
    persistent: bool
    expiry: int = 0  # seconds after disconnect; 0xFFFFFFFF never
    filters: dict[str, SubscribeOption] = field(default_factory=dict)  # shared ones too
    ids: dict[str, int] = field(default_factory=dict)  # filter -> subscription identifier
    awaiting_rel: set[int] = field(default_factory=set)
    #: Deliveries the client sent PUBREC for: MQTT-4.4.0-1, their PUBREL is resent on a
    #: reconnect with the same packet id, and the id is not reused until PUBCOMP.
    awaiting_comp: set[int] = field(default_factory=set)
    tree: TopicTree[str] = field(default_factory=TopicTree.mqtt)  # the filters not shared
    shared: dict[str, ShareFilter] = field(default_factory=dict)  # "$share/..." -> its parts
    expiry_scope: trio.CancelScope | None = None


class MQTTProtocolHandler:
    name = "mqtt"
    config_keys = CONFIG_KEYS

    def __init__(self, config: Any, broker: Any):
        self.config = config
        self.broker = broker
        self.tenant = str(config.get("mqttTenant") or "public")
        self.namespace = str(config.get("mqttNamespace") or "default")
        self.max_packet = int(config.get("mqttMaxPacketSize") or 1 << 20)
        self.receive_maximum = int(config.get("mqttReceiveMaximum") or 1024)
        self.topic_alias_maximum = int(config.get("mqttTopicAliasMaximum") or 0)
        self.max_queued = int(config.get("mqttMaxQueuedMessages"))
        self.sessions: dict[str, SessionState] = {}
        self.connected: dict[str, MQTTSession] = {}
        self.retained: dict[str, bytes] = {}  # full topic name -> entry
        self.wills: dict[str, trio.CancelScope] = {}
        self.offline: dict[str, OfflineQueue] = {}  # client id -> what its session keeps
        self.live: set[Any] = set()
        self.addresses: list[str] = []
        self._nursery: trio.Nursery | None = None
        self.stats = {"connections": 0, "publish_qos0": 0, "publish_qos1": 0, "publish_qos2": 0,
                      "deliveries": 0, "dropped_expired": 0, "dropped_queue_full": 0,
                      "dropped_not_authorized": 0}

    # -- names ---------------------------------------------------------------------------

    def topic_name(self, mqtt_topic: str) -> TopicName:
        if "://" in mqtt_topic:
            return TopicName.parse(mqtt_topic)
        return TopicName("persistent", self.tenant, self.namespace, mqtt_topic)

    def mqtt_topic(self, name: TopicName) -> str:
        if name.tenant == self.tenant and name.namespace == self.namespace:
            return name.local_name
        return str(name)

    # -- serving -------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners, urls = await open_url_listeners(self.config.get("mqttListeners"), "mqttListeners",
                                                   "mqtt", "mqtt://127.0.0.1:1883")
        self.addresses.extend(urls)
        self._load_state()
        self.broker.topic_loaded.append(self._topic_loaded)
        self.broker.stats.protocol_series[self.name] = self.series
        self.broker.protocol_views[self.name] = self  # the admin listing (gateway/admin/mqtt.py)
        log.info("mqtt listening on %s", ", ".join(self.addresses))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for state in self.sessions.values():
                if state.persistent:
                    nursery.start_soon(self._ensure_cursors, state)
            await nursery.start(partial(trio.serve_listeners, self._connection, listeners))
            task_status.started(list(self.addresses))

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.stats["connections"] += 1
        await run_session("mqtt", self.broker, self.live, MQTTSession(self, stream))

    # -- durable state -------------------------------------------------------------------

    def _load_state(self) -> None:
        md = self.broker.metadata
        for child in md.children(SESSIONS):
            got = md.get(f"{SESSIONS}/{child}")
            if got is None:
                continue
            doc = json.loads(got[0])
            state = SessionState(doc["client_id"], True, doc.get("expiry", 0))
            for f, o in doc.get("filters", {}).items():
                state.filters[f] = SubscribeOption(topic_filter=f, qos=o["qos"], no_local=o["nl"],
                                                   retain_as_published=o["rap"], retain_handling=o["rh"])
                share = parse_share(f)
                if isinstance(share, ShareFilter):
                    state.shared[f] = share
                else:
                    state.tree.add(f, f)
                if o.get("id"):
                    state.ids[f] = o["id"]
            state.awaiting_rel = set(doc.get("awaiting_rel", ()))
            state.awaiting_comp = set(doc.get("awaiting_comp", ()))
            self.sessions[state.client_id] = state
        for child in md.children(RETAINED):
            got = md.get(f"{RETAINED}/{child}")
            if got is not None:
                self.retained[_unquote(child)] = got[0]

    def save(self, state: SessionState) -> None:
        path = f"{SESSIONS}/{quote(state.client_id, safe='')}"
        if not state.persistent:
            if self.broker.metadata.exists(path):
                self.broker.metadata.delete(path)
            return
        doc = {"client_id": state.client_id, "expiry": state.expiry,
               "awaiting_rel": sorted(state.awaiting_rel),
               "awaiting_comp": sorted(state.awaiting_comp),
               "filters": {f: {"qos": o.qos, "nl": o.no_local, "rap": o.retain_as_published,
                               "rh": o.retain_handling, "id": state.ids.get(f)}
                           for f, o in state.filters.items()}}
        self.broker.metadata.put(path, json.dumps(doc).encode())

    def forget(self, state: SessionState) -> None:
        """End a session: its subscriptions go, durable ones with their cursors (a shared
        one once no session holds its filter)."""
        self.sessions.pop(state.client_id, None)
        state.persistent = False
        self.save(state)
        if self._nursery is not None:
            names = [f"mqtt:{state.client_id}"] + [
                sf.subscription for f, sf in state.shared.items() if not self.share_held(f)]
            self._nursery.start_soon(self._drop_cursors, state.client_id, names)

    def share_held(self, topic_filter: str) -> bool:
        """Whether a session holds the shared subscription ``topic_filter``."""
        return any(topic_filter in st.shared for st in self.sessions.values())

    async def _drop_cursors(self, client_id: str, names: list[str]) -> None:
        await self.stop_offline_queue(client_id)
        await self.drop_subscriptions(names)

    async def drop_subscriptions(self, names: list[str]) -> None:
        """Delete the subscriptions ``names`` (their cursors) where no consumer is attached."""
        for topic in list(self.broker.topics.values()):
            for name in names:
                if name in topic.subscriptions and not topic.subscriptions[name].consumers:
                    try:
                        await topic.unsubscribe(name)
                    except Exception as exc:
                        log.debug("mqtt: keeping %s on %s: %s", name, topic.name, exc)

    # -- offline persistent sessions -----------------------------------------------------

    def queue_offline(self, state: SessionState) -> None:
        """Bound what ``state`` keeps from now until its client is back (:mod:`._offline`)."""
        cid = state.client_id
        if (self._nursery is None or not state.persistent or cid in self.connected
                or cid in self.offline):
            return
        queue = OfflineQueue(self.broker, cid, self.max_queued, partial(_delivery_qos, self, state),
                             self._dropped_queue_full)
        self.offline[cid] = queue
        self._nursery.start_soon(queue.attach, self.matching_topics(state))

    async def stop_offline_queue(self, client_id: str) -> None:
        queue = self.offline.pop(client_id, None)
        if queue is not None:
            await queue.close()

    def _dropped_queue_full(self) -> None:
        self.stats["dropped_queue_full"] += 1

    def expire_later(self, state: SessionState) -> None:
        if state.expiry == 0xFFFFFFFF or self._nursery is None:
            return
        scope = trio.CancelScope()
        state.expiry_scope = scope

        async def expire() -> None:
            with scope:
                await trio.sleep(state.expiry)
                if state.client_id not in self.connected:
                    self.forget(state)

        self._nursery.start_soon(expire)

    def store_retained(self, topic: TopicName, message: Message) -> None:
        path = f"{RETAINED}/{quote(str(topic), safe='')}"
        if not message.payload:
            self.retained.pop(str(topic), None)
            if self.broker.metadata.exists(path):
                self.broker.metadata.delete(path)
            return
        entry = entry_from_messages([message], producer_name="mqtt-retained", sequence_id=0,
                                    publish_time=int(time.time() * 1000))
        self.retained[str(topic)] = entry
        self.broker.metadata.put(path, entry)

    # -- topics created after a filter ---------------------------------------------------

    def _topic_loaded(self, topic: PersistentTopic) -> None:
        if self._nursery is None or not topic.name.persistent:
            return
        local = self.mqtt_topic(topic.name)
        for state in self.sessions.values():
            session = self.connected.get(state.client_id)
            if any(True for _ in state.tree.match(local)):
                queue = self.offline.get(state.client_id)
                if session is not None:
                    self._nursery.start_soon(session.attach, topic.name, end_of(topic))
                elif queue is not None:
                    self._nursery.start_soon(queue.attach, [topic.name], end_of(topic))
                elif state.persistent:
                    self._nursery.start_soon(self._cursor, topic, f"mqtt:{state.client_id}")
            for f, sf in state.shared.items():
                if not _matches(sf.topic_filter, local):
                    continue
                if session is not None:
                    self._nursery.start_soon(session.attach_shared, f, topic.name, end_of(topic))
                elif state.persistent:
                    self._nursery.start_soon(self._cursor, topic, sf.subscription)

    async def _cursor(self, topic: PersistentTopic, name: str) -> None:
        if name in topic.subscriptions:
            return
        try:
            await topic.create_subscription(name, None, earliest=topic.ml.last_confirmed() is None)
        except Exception as exc:  # created meanwhile (two sessions of one share group)
            log.debug("mqtt: no cursor %s on %s: %s", name, topic.name, exc)

    async def _ensure_cursors(self, state: SessionState) -> None:
        wanted = [(n, f"mqtt:{state.client_id}") for n in self.matching_topics(state)]
        for sf in state.shared.values():
            wanted += [(n, sf.subscription) for n in self.shared_topics(sf)]
        for name, subscription in wanted:
            try:
                await self._cursor(await self.broker.get_topic(name), subscription)
            except Exception as exc:
                log.warning("mqtt: no cursor %s on %s: %s", subscription, name, exc)
        self.queue_offline(state)

    def matching_topics(self, state: SessionState) -> list[TopicName]:
        """The topics the session's filters (not the shared ones) match."""
        return self._topics(lambda local: any(True for _ in state.tree.match(local)))

    def shared_topics(self, share: ShareFilter) -> list[TopicName]:
        return self._topics(partial(_matches, share.topic_filter))

    def _topics(self, match: Callable[[str], bool]) -> list[TopicName]:
        from core.naming import NamespaceName

        try:
            names = self.broker.topics_of_namespace(NamespaceName(self.tenant, self.namespace))
        except LookupError:
            return []
        return [name for name in map(TopicName.parse, names) if match(self.mqtt_topic(name))]

    # -- the admin listing ---------------------------------------------------------------

    def admin_sessions(self) -> list[dict[str, Any]]:
        """Every session, connected or not, for ``/admin/v2/mqtt/sessions``."""
        out = []
        for cid, st in sorted(self.sessions.items()):
            queue = self.offline.get(cid)
            out.append({"client_id": cid, "connected": cid in self.connected,
                        "persistent": st.persistent, "expiry": st.expiry,
                        "subscriptions": [{"filter": f, "qos": o.qos}
                                          for f, o in sorted(st.filters.items())],
                        "queued": len(queue) if queue is not None else 0})
        return out

    def admin_retained(self) -> list[dict[str, Any]]:
        """Every topic with a retained message and its payload size, for
        ``/admin/v2/mqtt/retained``."""
        return [{"topic": self.mqtt_topic(TopicName.parse(full)),
                 "size": sum(len(m.payload) for m in messages_from_entry(entry))}
                for full, entry in sorted(self.retained.items())]

    # -- /metrics ------------------------------------------------------------------------

    def series(self) -> Iterator[Series]:
        """The handler's counters, as ``/metrics`` shows them (Magnetar's own series, so
        ``magnetar_``-prefixed, each with the broker's ``cluster`` label)."""
        st = self.stats
        yield Series("magnetar_mqtt_connections", "counter", "MQTT connections accepted",
                     st["connections"])
        yield Series("magnetar_mqtt_connected_clients", "gauge", "MQTT clients connected now",
                     len(self.connected))
        yield Series("magnetar_mqtt_sessions", "gauge", "MQTT sessions, connected or not",
                     len(self.sessions))
        for qos in (0, 1, 2):
            yield Series("magnetar_mqtt_messages_in", "counter", "PUBLISH packets taken from clients",
                         st[f"publish_qos{qos}"], (("qos", str(qos)),))
        yield Series("magnetar_mqtt_messages_out", "counter", "Messages sent to MQTT clients",
                     st["deliveries"])
        for reason in ("expired", "queue_full", "not_authorized"):
            yield Series("magnetar_mqtt_messages_dropped", "counter",
                         "Messages not delivered: expired, over mqttMaxQueuedMessages for an "
                         "offline session, or published (or willed) to a topic the role may "
                         "not produce to", st[f"dropped_{reason}"], (("reason", reason),))
        yield Series("magnetar_mqtt_queued_messages", "gauge",
                     "Messages held for persistent sessions whose clients are away",
                     sum(len(q) for q in self.offline.values()))
        yield Series("magnetar_mqtt_retained_messages", "gauge", "Topics with a retained message",
                     len(self.retained))


class _Closed(Exception):
    """The session ends (after telling the client why, where the protocol lets it)."""


#: Runs of a session's publishes on their way to storage at once: a publish need not wait
#: for the run before it to be durable, and what comes while two are stored goes in one.
RUNS_IN_FLIGHT = 2


@dataclass(slots=True)
class _Run:
    """A session's publishes to one topic, stored as one call, answered in their turn."""

    name: TopicName
    batch: list[tuple[TopicName, Message, Publish]]
    done: bool = False
    refused: bool = False  # the role may not produce to the topic
    error: BaseException | None = None


#: Packets whose handling may wait (for storage, for a subscription's cursors).
_MAY_WAIT = (Connect, Publish, Subscribe, Unsubscribe, Auth)


class MQTTSession:
    """One client connection. Its slots, and a writer task only while the socket is full,
    keep an idle connection small (the issue's 10,000 idle clients)."""

    __slots__ = ("h", "stream", "conn", "state", "subscriber", "shared", "out", "out_ready",
                 "flush_asked", "will", "keep_alive", "v5", "receive_max",
                 "inflight", "backlog", "next_pid", "aliases", "alias_maximum_out",
                 "aliases_out", "clean_exit", "taken_over", "role", "auth_method", "challenged",
                 "pending", "done", "nursery", "publishes", "publishing", "published",
                 "storing_qos2", "runs", "in_runs")

    def __init__(self, handler: MQTTProtocolHandler, stream: trio.SocketStream):
        self.h = handler
        self.stream = stream
        self.conn = MQTTConnection(Role.SERVER, max_packet_size=handler.max_packet)
        self.state: SessionState | None = None
        self.subscriber: Subscriber | None = None
        self.shared: dict[str, Subscriber] = {}  # "$share/..." filter -> its group's consumers
        # What is to be sent: written at once (at the end of the write batch under way, or
        # right away), and by the writer task, started the first time the socket is full.
        self.out = bytearray()
        self.out_ready: trio.Event | None = None  # the writer task's, once it runs
        self.flush_asked = False
        # runs of publishes on their way to storage, answered in order; their messages
        self.runs: list[_Run] = []
        self.in_runs = 0
        self.will: Will | None = None
        self.keep_alive = 0
        self.v5 = False
        self.receive_max = 65535  # the client's
        self.inflight: dict[int, Received | None] = {}  # packet id -> delivery (None: PUBREL sent)
        self.backlog: list[tuple[Received, Publish]] = []
        self.next_pid = 0
        self.aliases: dict[int, str] = {}  # the client's: alias -> topic
        self.alias_maximum_out = 0  # the client's Topic Alias Maximum (5.0 section 3.1.2.11.8)
        self.aliases_out: dict[str, int] = {}  # ours: topic -> alias
        self.clean_exit = False
        self.taken_over = False
        self.role: str | None = None  # what the client authenticated as (None: auth is off)
        self.auth_method: str | None = None  # the CONNECT's enhanced authentication method
        self.challenged = False  # we sent AUTH 0x18 and wait for the client's answer
        self.pending: Connect | None = None  # a CONNECT waiting for that answer
        self.done = trio.Event()
        self.nursery: trio.Nursery | None = None
        # PUBLISH packets on their way to storage, in order: stored per run of one topic as
        # one entry, then answered (PUBACK/PUBREC) and retained, in the order they came.
        self.publishes: list[tuple[TopicName, Message, Publish]] = []
        # the publisher task's, once it runs: publishes are waiting, a run of them is stored
        self.publishing: trio.Event | None = None
        self.published: trio.Event | None = None
        self.storing_qos2: set[int] = set()  # QoS 2 packet ids in ``publishes`` or being stored

    # -- writing -------------------------------------------------------------------------

    def send(self, packet: Any) -> None:
        assigned = None
        if isinstance(packet, Publish) and self.alias_maximum_out and packet.topic:
            packet, assigned = self._alias_out(packet)
        try:
            self.out += self.conn.send(packet)
        except ProtocolError as exc:
            log.debug("mqtt: not sent to %s: %s", self.state and self.state.client_id, exc)
            return
        if assigned is not None:  # known to the client once the packet that names it is out
            self.aliases_out[assigned] = packet.properties.topic_alias
        if self.out_ready is not None:
            self.out_ready.set()
        elif not self.flush_asked:
            self.flush_asked = True
            if not flush_at_end(self._write_now):
                self._write_now()

    def _write_now(self) -> None:
        """Send what is queued with one non-blocking write; what the socket does not take
        goes to the writer task, started now if it is not running yet."""
        self.flush_asked = False
        if self.out_ready is not None:
            self.out_ready.set()
            return
        if not self.out:
            return
        full = len(self.out) >= OUT_BUFFER
        try:
            rest = write_now(self.stream.socket.fileno(), [bytes(self.out)])
        except OSError as exc:  # the peer is gone: the read loop meets it too
            log.debug("mqtt: write to %s failed: %s", self.state and self.state.client_id, exc)
            self.out.clear()
            if self.nursery is not None:
                self.nursery.cancel_scope.cancel()
            return
        if not rest:
            self.out.clear()
            if full:
                self._wake_subscribers()
            return
        del self.out[:len(self.out) - len(rest[0])]
        if self.nursery is not None:  # else the session is ending: its last words go then
            self.out_ready = trio.Event()
            self.out_ready.set()
            self.nursery.start_soon(self._writer)

    def _alias_out(self, p: Publish) -> tuple[Publish, str | None]:
        """5.0 section 3.3.2.3.4: ``p`` with a topic alias, and the topic when the alias is
        new. A topic gets the next alias on first use, while the client's maximum allows;
        its first PUBLISH carries the name and the alias, later ones the alias alone. The
        mapping lives as long as the connection."""
        alias = self.aliases_out.get(p.topic)
        if alias is not None:
            return replace(p, topic="", properties=replace(p.properties, topic_alias=alias)), None
        if len(self.aliases_out) >= self.alias_maximum_out:
            return p, None
        alias = len(self.aliases_out) + 1
        return replace(p, properties=replace(p.properties, topic_alias=alias)), p.topic

    async def _writer(self) -> None:
        while True:
            assert self.out_ready is not None
            await self.out_ready.wait()
            self.out_ready = trio.Event()
            while self.out:
                data = bytes(self.out)
                await self.stream.send_all(data)
                del self.out[:len(data)]
            self._wake_subscribers()

    def _wake_subscribers(self) -> None:
        """There is room to send again: what waited for it may be delivered."""
        if self.subscriber is not None:
            self.subscriber.wake()
        for shared in self.shared.values():
            shared.wake()

    # -- the connection ------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                try:
                    await self._read_loop()
                except _Closed:
                    pass
                with trio.move_on_after(PUBLISH_DRAIN):
                    # what the client sent before it left is stored (QoS 0 included)
                    while (self.publishes or self.runs) and self.published is not None:
                        await self.published.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.nursery = None  # closed to new tasks: what is left to send goes below
            await self._cleanup()
            with trio.move_on_after(1) as cs:
                cs.shield = True
                try:
                    if self.out:  # the last words: a CONNACK refusal, a DISCONNECT
                        await self.stream.send_all(bytes(self.out))
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                    pass
                await self.stream.aclose()
            self.done.set()

    async def _read_loop(self) -> None:
        while True:
            timeout = self.keep_alive * 1.5 if self.keep_alive else (10 if self.state is None else float("inf"))
            with trio.move_on_after(timeout) as cs:
                data = await self.stream.receive_some(65536)
            if cs.cancelled_caught:
                self._disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
                raise _Closed
            if not data:
                raise _Closed
            self.conn.receive_data(data)
            await self._handle_read()

    async def _handle_read(self) -> None:
        """Handle the packets of what was read. Those answered at once (acknowledgements,
        PINGREQ) are handled inside a write batch, so what they send leaves in one write;
        a batch spans no ``await``, so one ends before each packet that may wait."""
        while True:
            waiting = None
            with write_batch():
                while True:
                    packet = self._next_packet()
                    if packet is NEED_DATA:
                        break
                    if isinstance(packet, _MAY_WAIT):
                        waiting = packet
                        break
                    self._handle_now(packet)
            if waiting is None:
                break
            await self._handle(waiting)
        if self.subscriber is not None:
            self.subscriber.settle_pending()  # the acknowledgements just read, at once

    def _next_packet(self) -> Any:
        try:
            return self.conn.next_event()
        except UnsupportedProtocolVersion:
            self.send(Connack(reason_code=ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
                              if self.conn.version < 5 else ReasonCode.UNSUPPORTED_PROTOCOL_VERSION))
            raise _Closed from None
        except RemoteProtocolError as exc:
            log.info("mqtt: closing a connection: %s", exc)
            if self.conn.state is State.REFUSING:  # no CONNACK yet: it says why
                self.send(Connack(reason_code=exc.reason_code,
                                  properties=Properties(reason_string=str(exc))))
            else:
                self._disconnect(exc.reason_code, str(exc))
            raise _Closed from None

    def _disconnect(self, code: int, reason: str = "") -> None:
        if self.v5 and self.state is not None:
            props = Properties(reason_string=reason) if reason else Properties()
            self.send(Disconnect(reason_code=code, properties=props))

    async def _handle(self, p: Any) -> None:
        if isinstance(p, Connect):
            await self._connect(p)
        elif isinstance(p, Publish):
            await self._publish(p)
        elif isinstance(p, Subscribe):
            await self._subscribe(p)
        elif isinstance(p, Unsubscribe):
            await self._unsubscribe(p)
        elif isinstance(p, Auth):
            await self._auth(p)
        else:
            self._handle_now(p)

    def _handle_now(self, p: Any) -> None:
        """A packet answered without waiting for anything."""
        if isinstance(p, Puback):
            self._acked(p.packet_id)
        elif isinstance(p, Pubrec):
            assert self.state is not None
            got = self.inflight.get(p.packet_id)
            if got is not None:
                self._settle(got)
                self.inflight[p.packet_id] = None
                self.state.awaiting_comp.add(p.packet_id)
                if self.state.persistent:
                    self.h.save(self.state)
            self.send(Pubrel(packet_id=p.packet_id))
        elif isinstance(p, Pubcomp):
            assert self.state is not None
            if p.packet_id in self.inflight and self.inflight[p.packet_id] is None:
                del self.inflight[p.packet_id]
                self._drain_backlog()
            if p.packet_id in self.state.awaiting_comp:
                self.state.awaiting_comp.discard(p.packet_id)
                if self.state.persistent:
                    self.h.save(self.state)
        elif isinstance(p, Pubrel):
            assert self.state is not None
            known = p.packet_id in self.state.awaiting_rel
            self.state.awaiting_rel.discard(p.packet_id)
            if known and self.state.persistent:
                self.h.save(self.state)
            code = 0 if known else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
            self.send(Pubcomp(packet_id=p.packet_id, reason_code=code if self.v5 else 0))
        elif isinstance(p, Pingreq):
            self.send(Pingresp())
        elif isinstance(p, Disconnect):
            if p.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
                self.will = None
            if self.v5 and self.state is not None and p.properties.session_expiry_interval is not None:
                self.state.expiry = p.properties.session_expiry_interval
            self.clean_exit = True
            raise _Closed

    # -- authentication ------------------------------------------------------------------

    def _token_role(self, token: bytes) -> str | None:
        """The role ``token`` proves; None when authentication is off (any token will do).
        Raises :class:`AuthenticationError`."""
        auth = self.h.broker.auth
        if not auth.authentication_enabled:
            return None
        return auth.authenticate(TOKEN_METHOD, token).role

    async def _connect(self, c: Connect) -> None:
        self.v5 = c.protocol_level == 5
        method = c.properties.authentication_method
        if method is None:
            if self.h.broker.auth.authentication_enabled:
                try:
                    self.role = self._token_role(c.password or b"")
                except AuthenticationError as exc:
                    log.info("mqtt: %s not authenticated: %s", c.client_id, exc)
                    self.send(Connack(reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD if self.v5
                                      else ConnectReturnCode.BAD_USER_NAME_OR_PASSWORD))
                    raise _Closed from None
            await self._open(c)
            return
        # 5.0 section 4.12: enhanced authentication (the codec allows a method on 5.0 only)
        if method != TOKEN_METHOD:  # MQTT-4.12.0-1
            reason = f"authentication method {method!r} is not supported; use {TOKEN_METHOD!r}"
            self.send(Connack(reason_code=ReasonCode.BAD_AUTHENTICATION_METHOD,
                              properties=Properties(reason_string=reason)))
            raise _Closed
        self.auth_method = method
        if c.properties.authentication_data is None:
            self.pending = c  # MQTT-4.12.0-2: ask for the token
            self._challenge()
            return
        self._authenticated(c.properties.authentication_data)
        await self._open(c)

    def _challenge(self) -> None:
        self.challenged = True
        self.send(Auth(reason_code=ReasonCode.CONTINUE_AUTHENTICATION,
                       properties=Properties(authentication_method=self.auth_method)))

    def _authenticated(self, token: bytes) -> None:
        """Take the role ``token`` proves, or refuse: bad credentials in an enhanced
        authentication are CONNACK 0x87 before the CONNACK (MQTT-4.12.0-4, as Mosquitto
        answers), DISCONNECT 0x87 after it (MQTT-4.12.1-2); the role stays what it was."""
        try:
            self.role = self._token_role(token)
        except AuthenticationError as exc:
            log.info("mqtt: %s not authenticated: %s", self.state.client_id if self.state
                     else "a client", exc)
            if self.state is None:
                self.send(Connack(reason_code=ReasonCode.NOT_AUTHORIZED,
                                  properties=Properties(reason_string="not authorized")))
            else:
                self._disconnect(ReasonCode.NOT_AUTHORIZED, "re-authentication failed")
            raise _Closed from None

    async def _auth(self, a: Auth) -> None:
        """An AUTH from the client: the codec has checked its method is the CONNECT's and its
        reason code one the client may send now (0x18 before the CONNACK; 0x18 or 0x19
        after). ``token`` is a method of one step: the data of a CONNECT or of a
        Re-authenticate is the token; without it the server asks with Continue
        authentication and the client's Continue authentication carries it."""
        data = a.properties.authentication_data
        if a.reason_code == ReasonCode.RE_AUTHENTICATE and not self.challenged:
            if data is None:
                self._challenge()  # 5.0 section 4.12.1: the server may ask for more
                return
        elif a.reason_code != ReasonCode.CONTINUE_AUTHENTICATION or not self.challenged:
            # a Continue the server did not ask for, or a Re-authenticate inside another
            reason = "an AUTH the server did not ask for"
            if self.state is None:
                self.send(Connack(reason_code=ReasonCode.PROTOCOL_ERROR,
                                  properties=Properties(reason_string=reason)))
            else:
                self._disconnect(ReasonCode.PROTOCOL_ERROR, reason)
            raise _Closed
        self.challenged = False
        self._authenticated(data or b"")
        if self.pending is not None:
            c, self.pending = self.pending, None
            await self._open(c)
        else:  # 5.0 section 4.12.1: re-authentication is complete
            assert self.state is not None
            log.info("mqtt: %s re-authenticated as %s", self.state.client_id, self.role)
            await self._reauthorized()  # before the answer: what follows it is the new role's
            self.send(Auth(reason_code=ReasonCode.SUCCESS,
                           properties=Properties(authentication_method=self.auth_method)))

    # -- authorization -------------------------------------------------------------------

    @property
    def own_subscription(self) -> str:
        """The core subscription the session's filters (not the shared ones) consume."""
        assert self.state is not None
        return f"mqtt:{self.state.client_id}"

    def _consume_refusal(self, name: TopicName, subscription: str) -> str | None:
        """Why the role may not consume ``name`` on ``subscription`` (Pulsar's rules: consume,
        and a subscription's own permissions), or None when it may (always with
        authorization off)."""
        return self.h.broker.auth.subscribe_refusal(name, self.role, subscription)

    def _filter_refusal(self, topic_filter: str, subscription: str) -> str | None:
        """Why the role may not subscribe to ``topic_filter``, or None. An exact filter needs
        consume on its topic; one with wildcards on the namespace it maps to (asked of the
        filter as a topic name of that namespace, so the namespace's grants answer); one
        that maps to no namespace (``persistent://+/...``) is a super-user's alone."""
        auth = self.h.broker.auth
        if not auth.authorization_enabled:
            return None
        try:
            name = self.h.topic_name(topic_filter)
        except ValueError:
            return None if auth.is_super_user(self.role) else "the filter spans namespaces"
        return self._consume_refusal(name, subscription)

    async def _reauthorized(self) -> None:
        """After a re-authentication: let go of the topics the new role may not consume (the
        filters stay; later topics are checked as they come)."""
        if not self.h.broker.auth.authorization_enabled or self.state is None:
            return
        for subscriber in [s for s in (self.subscriber, *self.shared.values()) if s is not None]:
            for key in list(subscriber.attached):
                name = TopicName.parse(key)
                refusal = self._consume_refusal(name, subscriber.subscription)
                if refusal is not None:
                    log.info("mqtt: %s as %s no longer consumes %s: %s", self.state.client_id,
                             self.role, name, refusal)
                    await subscriber.detach(name)

    # -- the session ---------------------------------------------------------------------

    async def _open(self, c: Connect) -> None:
        """Start the session of an authenticated CONNECT and answer it with CONNACK."""
        h = self.h
        client_id = c.client_id
        assigned = None
        if not client_id:
            if not self.v5 and not c.clean_start:
                self.send(Connack(reason_code=ConnectReturnCode.IDENTIFIER_REJECTED))
                raise _Closed
            client_id = assigned = "magnetar-" + base64.b32encode(trio.lowlevel.current_task().name.encode()[-5:] + time.time_ns().to_bytes(8, "big")).decode().rstrip("=").lower()
        old = h.connected.get(client_id)
        if old is not None:
            old.taken_over = True
            old._disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection took the session over")
            if old.nursery is not None:
                old.nursery.cancel_scope.cancel()
            with trio.move_on_after(5):
                await old.done.wait()
        scope = h.wills.pop(client_id, None)
        if scope is not None:
            scope.cancel()  # a delayed will is not sent when the client is back
        await h.stop_offline_queue(client_id)  # what it kept goes to this connection
        if self.v5:
            expiry = c.properties.session_expiry_interval or 0
            persistent = expiry > 0
        else:
            expiry = 0xFFFFFFFF if not c.clean_start else 0
            persistent = not c.clean_start
        state = h.sessions.get(client_id)
        present = state is not None and not c.clean_start
        if state is not None and c.clean_start:
            h.forget(state)
            state = None
        if state is None:
            state = SessionState(client_id, persistent, expiry)
        else:
            state.persistent, state.expiry = persistent, expiry
            if state.expiry_scope is not None:
                state.expiry_scope.cancel()
        h.sessions[client_id] = state
        h.save(state)
        self.state = state
        h.connected[client_id] = self
        self.will = c.will
        self.keep_alive = c.keep_alive
        props = Properties()
        if self.v5:
            self.receive_max = c.properties.receive_maximum or 65535
            self.alias_maximum_out = c.properties.topic_alias_maximum or 0
            self.conn.peer_max_packet_size = c.properties.maximum_packet_size
            props = Properties(assigned_client_identifier=assigned, receive_maximum=h.receive_maximum,
                               topic_alias_maximum=h.topic_alias_maximum or None,
                               maximum_packet_size=h.max_packet, shared_subscription_available=1,
                               authentication_method=self.auth_method)
        self.send(Connack(session_present=present, properties=props))
        for pid in sorted(state.awaiting_comp):  # MQTT-4.4.0-1: PUBRELs are resent
            self.inflight[pid] = None
            self.send(Pubrel(packet_id=pid))
        self.subscriber = Subscriber(h.broker, f"mqtt:{client_id}", self._deliver,
                                     window=min(self.receive_max, 1000),
                                     writable=lambda: len(self.out) < OUT_BUFFER)
        for name in h.matching_topics(state):
            await self.attach(name)
        for f, share in state.shared.items():
            await self.open_shared(f, share)

    async def attach(self, name: TopicName, start: Position | None = None) -> None:
        """Consume ``name`` if the role may; a topic loaded after the filter starts where it
        stood then."""
        if self.subscriber is None or self.state is None or str(name) in self.subscriber.attached:
            return
        refusal = self._consume_refusal(name, self.subscriber.subscription)
        if refusal is not None:
            log.debug("mqtt: %s does not consume %s: %s", self.state.client_id, name, refusal)
            return
        try:
            await self.subscriber.attach(name, sub_type=SubType.Exclusive,
                                         durable=self.state.persistent, start=start)
        except Exception as exc:
            log.info("mqtt: %s cannot consume %s: %s", self.state.client_id, name, exc)

    async def open_shared(self, topic_filter: str, share: ShareFilter) -> None:
        """Join the group of the shared subscription ``topic_filter`` on every topic its
        filter matches (:mod:`handlers.mqtt._shared`)."""
        if self.state is None or topic_filter in self.shared:
            return
        self.shared[topic_filter] = Subscriber(
            self.h.broker, share.subscription, partial(self._deliver_shared, topic_filter),
            window=min(self.receive_max, 1000), writable=lambda: len(self.out) < OUT_BUFFER)
        for name in self.h.shared_topics(share):
            await self.attach_shared(topic_filter, name)

    async def attach_shared(self, topic_filter: str, name: TopicName,
                            start: Position | None = None) -> None:
        subscriber = self.shared.get(topic_filter)
        if subscriber is None or self.state is None or str(name) in subscriber.attached:
            return
        refusal = self._consume_refusal(name, subscriber.subscription)
        if refusal is not None:
            log.debug("mqtt: %s does not consume %s for %s: %s", self.state.client_id, name,
                      topic_filter, refusal)
            return
        try:
            await subscriber.attach(name, sub_type=SubType.Shared, durable=self.state.persistent,
                                    start=start)
        except Exception as exc:
            log.info("mqtt: %s cannot consume %s for %s: %s", self.state.client_id, name,
                     topic_filter, exc)

    # -- publishing ----------------------------------------------------------------------

    async def _publish(self, p: Publish) -> None:
        assert self.state is not None
        topic = p.topic
        alias = p.properties.topic_alias
        if alias is not None:
            if not alias or alias > self.h.topic_alias_maximum:
                self._disconnect(ReasonCode.TOPIC_ALIAS_INVALID, "topic alias out of range")
                raise _Closed
            if topic:
                self.aliases[alias] = topic
            elif alias in self.aliases:
                topic = self.aliases[alias]
            else:
                self._disconnect(ReasonCode.PROTOCOL_ERROR, "unknown topic alias")
                raise _Closed
        if not topic:
            self._disconnect(ReasonCode.TOPIC_NAME_INVALID, "empty topic name")
            raise _Closed
        if p.properties.payload_format_indicator == 1:
            try:
                p.payload.decode("utf-8")
            except UnicodeDecodeError:
                self._ack_publish(p, ReasonCode.PAYLOAD_FORMAT_INVALID)
                return
        if p.qos == 2 and p.packet_id in self.storing_qos2:
            return  # a resend of one on its way: its PUBREC follows the store
        if p.qos == 2 and p.packet_id in self.state.awaiting_rel:
            self.send(Pubrec(packet_id=p.packet_id))  # a resend: stored once already
            return
        if p.qos == 2 and len(self.state.awaiting_rel) + len(self.storing_qos2) >= self.h.receive_maximum:
            self._disconnect(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
            raise _Closed
        self.h.stats[f"publish_qos{p.qos}"] += 1
        try:
            name = self.h.topic_name(topic)
            message = self._message(p)
        except Exception as exc:
            self._publish_failed(p, topic, exc)
            return
        if p.qos == 2:
            self.storing_qos2.add(p.packet_id or 0)
        self.publishes.append((name, message, p))
        if self.publishing is None or self.published is None:  # a task only for sessions that publish
            self.publishing, self.published = trio.Event(), trio.Event()
            assert self.nursery is not None
            self.nursery.start_soon(self._publisher)
        self.publishing.set()
        while len(self.publishes) + self.in_runs >= PUBLISH_WINDOW:  # reading waits for storage
            await self.published.wait()

    def _publish_failed(self, p: Publish, topic: str, exc: BaseException) -> None:
        assert self.state is not None
        log.info("mqtt: publish to %s by %s failed: %s", topic, self.state.client_id, exc)
        if p.qos == 0 or not self.v5:
            self._disconnect(ReasonCode.UNSPECIFIED_ERROR, str(exc))
            raise _Closed from None
        self._ack_publish(p, ReasonCode.TOPIC_NAME_INVALID if isinstance(exc, ValueError)
                          else ReasonCode.UNSPECIFIED_ERROR, str(exc))

    async def _publisher(self) -> None:
        """Stores the waiting publishes in order, each run of one topic as one entry,
        without waiting for a run to be durable before queuing the next; answers and
        retains each run once it and every run before it are stored: a client's publishes
        need not wait for each other's journal write, and still reach the topic and their
        acknowledgements in order (MQTT-4.6.0-2)."""
        assert self.state is not None
        producer = f"mqtt:{self.state.client_id}"
        while True:
            assert self.publishing is not None
            await self.publishing.wait()
            self.publishing = trio.Event()
            while self.publishes:
                name = self.publishes[0][0]
                size = 1
                while size < len(self.publishes) and self.publishes[size][0] == name:
                    size += 1
                run = _Run(name, self.publishes[:size])
                self.publishes = self.publishes[size:]
                self.runs.append(run)
                self.in_runs += size
                if not self.h.broker.auth.can_produce(name, self.role):
                    run.refused = True
                    self._run_done(run, None)
                    continue
                try:
                    topic = await self.h.broker.get_topic(name)
                except Exception as exc:
                    self._run_done(run, exc)
                    continue
                store(self.h.broker, topic, [m for _, m, _ in run.batch], producer_name=producer,
                      done=functools.partial(self._run_stored, run))
                while len(self.runs) >= RUNS_IN_FLIGHT and self.published is not None:
                    await self.published.wait()  # what comes meanwhile goes in one next run

    def _run_stored(self, run: _Run, _position: Position, exc: BaseException | None) -> None:
        self._run_done(run, exc)

    def _run_done(self, run: _Run, exc: BaseException | None) -> None:
        """A run is stored, failed or refused: answer it and the finished runs after it,
        in order."""
        run.done, run.error = True, exc
        try:
            while self.runs and self.runs[0].done:
                first = self.runs.pop(0)
                self.in_runs -= len(first.batch)
                self._answer(first)
        except _Closed:  # a failure this session cannot answer in the protocol: it ends
            if self.nursery is not None:
                self.nursery.cancel_scope.cancel()
        finally:
            if self.published is not None:
                self.published.set()
            self.published = trio.Event()

    def _answer(self, run: _Run) -> None:
        assert self.state is not None
        name, batch = run.name, run.batch
        if run.refused:
            self._refuse_publishes(name, batch)
            return
        if run.error is not None:
            for _, _, p in batch:
                self.storing_qos2.discard(p.packet_id or 0)
            for _, _, p in batch:
                self._publish_failed(p, p.topic or str(name), run.error)
            return
        saved = False
        for _, message, p in batch:
            if p.retain:
                self.h.store_retained(name, message)
            if p.qos == 2:
                self.storing_qos2.discard(p.packet_id or 0)
                self.state.awaiting_rel.add(p.packet_id or 0)
                saved = True
        if saved and self.state.persistent:
            self.h.save(self.state)
        with write_batch():  # the run's acknowledgements leave in one write
            for _, _, p in batch:
                self._ack_publish(p, 0)

    def _refuse_publishes(self, name: TopicName, batch: list[tuple[TopicName, Message, Publish]]) -> None:
        """A run of publishes to a topic the role may not produce to: nothing is stored or
        retained; each is answered in its turn as Mosquitto answers a publish its ACLs deny.
        5.0: PUBACK or PUBREC 0x87 Not authorized (sections 3.4.2.1, 3.5.2.1; a PUBREC of
        0x80 or above ends the flow: MQTT-4.3.3-4, so no packet id is kept). 3.1.1 has no
        negative acknowledgement: MQTT-3.3.5-2 leaves a positive one or a close, and the
        positive one keeps the client connected."""
        assert self.state is not None
        log.debug("mqtt: %s as %s may not produce to %s: %d PUBLISH dropped",
                  self.state.client_id, self.role, name, len(batch))
        self.h.stats["dropped_not_authorized"] += len(batch)
        for _, _, p in batch:
            self.storing_qos2.discard(p.packet_id or 0)
            self._ack_publish(p, ReasonCode.NOT_AUTHORIZED)

    def _ack_publish(self, p: Publish, code: int, reason: str = "") -> None:
        props = Properties(reason_string=reason) if reason and self.v5 else Properties()
        code = code if self.v5 else 0
        if p.qos == 1:
            self.send(Puback(packet_id=p.packet_id or 0, reason_code=code, properties=props))
        elif p.qos == 2:
            self.send(Pubrec(packet_id=p.packet_id or 0, reason_code=code, properties=props))

    def _message(self, p: Publish) -> Message:
        assert self.state is not None
        return _message(self.state.client_id, p)


    # -- subscribing ---------------------------------------------------------------------

    async def _subscribe(self, s: Subscribe) -> None:
        assert self.state is not None
        codes = []
        sid = s.properties.subscription_identifiers[0] if s.properties.subscription_identifiers else None
        fresh: list[SubscribeOption] = []
        joined: list[tuple[str, ShareFilter]] = []
        for opt in s.subscriptions:
            f = opt.topic_filter
            share = parse_share(f)
            if isinstance(share, str) or share is None and mqtt_filter_error(f) is not None:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if self.v5 else SUBACK_FAILURE)
                continue
            if share is not None and opt.no_local:
                # MQTT-3.8.3-4: No Local on a shared subscription is a protocol error
                self._disconnect(ReasonCode.PROTOCOL_ERROR, "no local on a shared subscription")
                raise _Closed
            refusal = (self._filter_refusal(share.topic_filter, share.subscription) if share
                       else self._filter_refusal(f, self.own_subscription))
            if refusal is not None:
                # 5.0 section 3.9.3: 0x87 Not authorized; 3.1.1 section 3.9.3: 0x80 Failure.
                # That filter alone; one the session held already stays as it was.
                log.info("mqtt: %s as %s may not subscribe to %s: %s", self.state.client_id,
                         self.role, f, refusal)
                codes.append(ReasonCode.NOT_AUTHORIZED if self.v5 else SUBACK_FAILURE)
                continue
            existed = f in self.state.filters
            self.state.filters[f] = opt
            if share is not None:
                self.state.shared[f] = share
                joined.append((f, share))
            else:
                self.state.tree.add(f, f)
            if sid is not None:
                self.state.ids[f] = sid
            else:
                self.state.ids.pop(f, None)
            codes.append(opt.qos)
            # 5.0 section 4.8.2: no retained messages on a shared subscription
            if share is None and (opt.retain_handling == 0
                                  or (opt.retain_handling == 1 and not existed)):
                fresh.append(opt)
        self.h.save(self.state)
        self.send(Suback(packet_id=s.packet_id, reason_codes=tuple(codes)))
        for name in self.h.matching_topics(self.state):
            await self.attach(name)
        for f, share in joined:
            await self.open_shared(f, share)
        for opt in fresh:
            self._send_retained(opt)

    def _send_retained(self, opt: SubscribeOption) -> None:
        tree: TopicTree[int] = TopicTree.mqtt()
        tree.add(opt.topic_filter, 0)
        for full, entry in list(self.h.retained.items()):
            name = TopicName.parse(full)
            if not any(True for _ in tree.match(self.h.mqtt_topic(name))):
                continue
            if self._consume_refusal(name, self.own_subscription) is not None:
                continue
            for m in messages_from_entry(entry):
                qos = min(opt.qos, int(m.properties.get(P + "qos", "1")))
                pub = self._to_publish(name, m, qos, True, {opt.topic_filter})
                if pub is None:
                    continue
                if qos == 0:
                    self.send(pub)
                elif len(self.inflight) >= self.receive_max:  # 5.0 section 4.9
                    self.backlog.append((_RETAINED, pub))
                else:
                    pid = self._pid()
                    self.inflight[pid] = _RETAINED
                    self.send(_with_pid(pub, pid))

    async def _unsubscribe(self, u: Unsubscribe) -> None:
        assert self.state is not None
        codes = []
        left: list[str] = []
        for f in u.topic_filters:
            if f in self.state.filters:
                del self.state.filters[f]
                self.state.ids.pop(f, None)
                if self.state.shared.pop(f, None) is not None:
                    left.append(f)
                else:
                    self.state.tree.remove(f, f)
                codes.append(0)
            else:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
        self.h.save(self.state)
        self.send(Unsuback(packet_id=u.packet_id, reason_codes=tuple(codes) if self.v5 else ()))
        for f in left:
            shared = self.shared.pop(f, None)
            if shared is not None:  # what this member held goes to the others
                await shared.close()
                if not self.h.share_held(f):
                    await self.h.drop_subscriptions([shared.subscription])
        if self.subscriber is not None:
            still = {str(n) for n in self.h.matching_topics(self.state)}
            for key in list(self.subscriber.attached):
                if key not in still:
                    await self.subscriber.detach(TopicName.parse(key), delete=True)

    # -- delivering ----------------------------------------------------------------------

    def _pid(self) -> int:
        for _ in range(65536):
            self.next_pid = self.next_pid % 65535 + 1
            if self.next_pid not in self.inflight:
                return self.next_pid
        raise RuntimeError("no free packet identifier")

    def _deliver(self, r: Received) -> None:
        state = self.state
        if state is None or self.subscriber is None:
            return
        got = _delivery(self.h, state, r)
        if got is None:
            self._settle(r)
            return
        qos, matched = got
        opts = [state.filters[f] for f in matched]
        retain = any(o.retain_as_published for o in opts) and r.message.properties.get(P + "retain") == "1"
        self._send_delivery(r, self._to_publish(r.topic, r.message, qos, retain, matched))

    def _deliver_shared(self, topic_filter: str, r: Received) -> None:
        """A message of the shared subscription ``topic_filter``: this member's to send."""
        opt = self.state.filters.get(topic_filter) if self.state is not None else None
        if opt is None or self.subscriber is None:
            return  # unsubscribed: left unacknowledged, it goes to another member
        props = r.message.properties
        qos = min(opt.qos, int(props.get(P + "qos", "2")))
        retain = opt.retain_as_published and props.get(P + "retain") == "1"
        self._send_delivery(r, self._to_publish(r.topic, r.message, qos, retain, {topic_filter}))

    def _send_delivery(self, r: Received, pub: Publish | None) -> None:
        if pub is None:
            self._settle(r)
            return
        qos = pub.qos
        if r.redelivery_count:
            pub = Publish(topic=pub.topic, payload=pub.payload, qos=pub.qos, retain=pub.retain,
                          dup=qos > 0, properties=pub.properties)
        self.h.stats["deliveries"] += 1
        if qos == 0:
            self.send(pub)
            self._settle(r)
        elif len(self.inflight) >= self.receive_max:
            self.backlog.append((r, pub))
        else:
            pid = self._pid()
            self.inflight[pid] = r
            self.send(_with_pid(pub, pid))

    def _to_publish(self, name: TopicName, m: Message, qos: int, retain: bool,
                    filters: set[str]) -> Publish | None:
        assert self.state is not None
        props = m.properties
        expires = props.get(P + "expires")
        expiry = None
        if expires is not None:
            # 5.0 section 3.3.2.3.3: the interval less the time it waited, in whole seconds
            # rounded up (a message with half a second left has not expired)
            left_ms = int(expires) - int(time.time() * 1000)
            if left_ms <= 0:
                self.h.stats["dropped_expired"] += 1
                return None
            expiry = -(-left_ms // 1000)
        properties = Properties()
        if self.v5:
            user = tuple((k, v) for k, v in props.items() if not k.startswith(P))
            if m.key is not None:
                user += (("key", m.key),)
            corr = props.get(P + "correlation")
            fmt = props.get(P + "format")
            properties = Properties(
                user_properties=user, content_type=props.get(P + "content_type"),
                response_topic=props.get(P + "response_topic"),
                correlation_data=base64.b64decode(corr) if corr is not None else None,
                payload_format_indicator=int(fmt) if fmt is not None else None,
                message_expiry_interval=expiry,
                subscription_identifiers=tuple(sorted({self.state.ids[f] for f in filters
                                                       if f in self.state.ids})))
        return Publish(topic=self.h.mqtt_topic(name), payload=m.payload, qos=qos, retain=retain,
                       properties=properties)

    def _settle(self, r: Received) -> None:
        if self.subscriber is not None and isinstance(r, Received):
            self.subscriber.settle_later(r)  # with the rest of what was read or delivered

    def _acked(self, pid: int) -> None:
        got = self.inflight.pop(pid, None)
        if isinstance(got, Received):
            self._settle(got)
        self._drain_backlog()

    def _drain_backlog(self) -> None:
        while self.backlog and len(self.inflight) < self.receive_max:
            r, pub = self.backlog.pop(0)
            pid = self._pid()
            self.inflight[pid] = r
            self.send(_with_pid(pub, pid))

    # -- the end -------------------------------------------------------------------------

    async def _cleanup(self) -> None:
        h, state = self.h, self.state
        if state is None:
            return
        if h.connected.get(state.client_id) is self:
            del h.connected[state.client_id]
        if self.subscriber is not None:
            # unacknowledged deliveries go back to the subscription (resent with DUP)
            await self.subscriber.close()
        for shared in self.shared.values():
            await shared.close()  # and a shared subscription's, to another member
        self.shared.clear()
        if self.will is not None:
            self._schedule_will(self.will, state)
        if h.connected.get(state.client_id) is None and not self.taken_over:
            if not state.persistent or state.expiry == 0:
                h.forget(state)
            else:
                h.save(state)
                h.expire_later(state)
                h.queue_offline(state)

    def _schedule_will(self, will: Will, state: SessionState) -> None:
        h = self.h
        if h._nursery is None:
            return
        # 5.0 section 3.1.2.5: after the will delay or when the session ends, whichever
        # is first (a session that is not persistent ends now)
        delay = will.properties.will_delay_interval or 0 if self.v5 else 0
        if not state.persistent:
            delay = 0
        elif self.v5 and state.expiry != 0xFFFFFFFF:
            delay = min(delay, state.expiry)
        scope = trio.CancelScope()
        if delay:
            h.wills[state.client_id] = scope
        client_id, role = state.client_id, self.role

        async def send_will() -> None:
            with scope:
                await trio.sleep(delay)
                h.wills.pop(client_id, None)
                pub = Publish(topic=will.topic, payload=will.payload, qos=will.qos,
                              retain=will.retain, properties=will.properties)
                try:
                    name = h.topic_name(will.topic)
                    message = _message(client_id, pub)
                    # checked now, as Mosquitto checks a will: the grants of when it is sent
                    if not h.broker.auth.can_produce(name, role):
                        h.stats["dropped_not_authorized"] += 1
                        log.info("mqtt: the will of %s not published: %s may not produce to %s",
                                 client_id, role, name)
                        return
                    await publish(h.broker, name, [message], producer_name=f"mqtt:{client_id}")
                    if will.retain:
                        h.store_retained(name, message)
                except Exception as exc:
                    log.warning("mqtt: the will of %s not published: %s", client_id, exc)

        h._nursery.start_soon(send_will)


#: The in-flight mark of a retained message sent on subscribe (nothing to acknowledge).
_RETAINED: Any = object()


def _message(client_id: str, p: Publish) -> Message:
    """What a PUBLISH stores: its payload, its user properties, and under ``__mqtt_*`` what
    only MQTT subscribers read."""
    props: dict[str, str] = dict(p.properties.user_properties)
    pr = p.properties
    props[P + "qos"] = str(p.qos)
    props[P + "client"] = client_id
    if p.retain:
        props[P + "retain"] = "1"
    if pr.content_type is not None:
        props[P + "content_type"] = pr.content_type
    if pr.response_topic is not None:
        props[P + "response_topic"] = pr.response_topic
    if pr.correlation_data is not None:
        props[P + "correlation"] = base64.b64encode(pr.correlation_data).decode()
    if pr.payload_format_indicator is not None:
        props[P + "format"] = str(pr.payload_format_indicator)
    if pr.message_expiry_interval is not None:
        props[P + "expires"] = str(int(time.time() * 1000) + pr.message_expiry_interval * 1000)
    return Message(payload=p.payload, properties=props, event_time=int(time.time() * 1000))


def _with_pid(p: Publish, pid: int) -> Publish:
    return Publish(topic=p.topic, payload=p.payload, qos=p.qos, retain=p.retain, dup=p.dup,
                   packet_id=pid, properties=p.properties)


def _matches(topic_filter: str, local: str) -> bool:
    tree: TopicTree[int] = TopicTree.mqtt()
    tree.add(topic_filter, 0)
    return any(True for _ in tree.match(local))


def _delivery_qos(h: MQTTProtocolHandler, state: SessionState, r: Received) -> int | None:
    got = _delivery(h, state, r)
    return None if got is None else got[0]


def _delivery(h: MQTTProtocolHandler, state: SessionState, r: Received) -> tuple[int, set[str]] | None:
    """The QoS a message of the session's own subscription goes out at, and the filters
    that match it (3.3.5: once, at the highest QoS granted); None when it does not go to
    the session (no filter matches any more, or each that does is No Local and the
    session published it)."""
    props = r.message.properties
    matched = {f for f, _ in state.tree.match(h.mqtt_topic(r.topic)) if f in state.filters}
    opts = [state.filters[f] for f in matched]
    if not opts or all(o.no_local for o in opts) and props.get(P + "client") == state.client_id:
        return None
    return min(max(o.qos for o in opts), int(props.get(P + "qos", "2"))), matched


def _unquote(s: str) -> str:
    from urllib.parse import unquote

    return unquote(s)
