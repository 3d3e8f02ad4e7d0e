"""MQTT publishes and subscriptions checked against the broker's authorization: a broker
with token authentication and ``authorizationEnabled``, roles granted produce or consume on
a topic or a namespace through the admin API, paho-mqtt 5.0 and 3.1.1 clients, and a socket
with the codec (:class:`Wire`) for what paho hides (a PUBREC's reason code, AUTH).

What a refusal must not do is store or deliver; each test waits for a permitted message
sent after the refused ones (on the same topic where it can) rather than for time to pass."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from gateway._admin_cli import AdminClient
from handlers.mqtt._packets import (
    Auth,
    Connack,
    Connect,
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
    Will,
)
from tests._auth import SUPER_USER, Tokens
from tests._standalone import Standalone

from ._clients import V5, V311, WAIT, Box, Socket, metric, scrape, token_broker, unique, wait_until

NOT_AUTHORIZED = ReasonCode.NOT_AUTHORIZED  # 0x87, 5.0
FAILURE = 0x80  # a 3.1.1 SUBACK's refusal
DEFAULT = "public/default"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return Tokens(tmp_path_factory.mktemp("mqtt-authz-key"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, tokens: Tokens) -> Iterator[Standalone]:
    with token_broker(tmp_path_factory.mktemp("mqtt-authz"), tokens) as s:
        yield s


@pytest.fixture(scope="module")
def admin(secured: Standalone, tokens: Tokens) -> AdminClient:
    return AdminClient(secured.addresses["web"][0], timeout=30, token=tokens.token(SUPER_USER))


@pytest.fixture
def addr(secured: Standalone) -> tuple[str, int]:
    host, port = secured.addresses["mqtt"][0].rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)


def grant(admin: AdminClient, topic: str, role: str, *actions: str, ns: str = DEFAULT) -> None:
    """``topics grant-permission`` on the topic ``topic`` of ``ns`` (a name without ``/``)."""
    admin.post(f"/admin/v2/persistent/{ns}/{topic}/permissions/{role}", list(actions))


def grant_namespace(admin: AdminClient, ns: str, role: str, *actions: str) -> None:
    admin.post(f"/admin/v2/namespaces/{ns}/permissions/{role}", list(actions))


def topics_of(admin: AdminClient, ns: str = DEFAULT) -> list[str]:
    return [name.rsplit("/", 1)[1] for name in admin.get(f"/admin/v2/persistent/{ns}")]


def dropped(s: Standalone) -> float:
    return metric(scrape(s.addresses["web"][0]), "magnetar_mqtt_messages_dropped_total",
                  reason="not_authorized")


class Client:
    """A paho client of ``version`` logged in as ``role`` (its token as the password),
    looping in its thread: what it receives (:attr:`box`), and its PUBACKs' and SUBACKs'
    reason codes as :meth:`publish` and :meth:`subscribe` return them."""

    def __init__(self, addr: tuple[str, int], token: str, version: int) -> None:
        self.box = Box()
        self.cond = threading.Condition()
        self.acks: dict[int, int] = {}
        self.subacks: dict[int, list[int]] = {}
        kw = {"clean_session": True} if version == V311 else {}
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=unique("authz"),
                        protocol=version, **kw)
        c.username_pw_set("app", token)
        connected = threading.Event()
        got: dict[str, int] = {}

        def on_connect(cl: mqtt.Client, u: Any, flags: Any, rc: Any, p: Any = None) -> None:
            got.update(rc=rc.value)
            connected.set()

        c.on_connect = on_connect
        c.on_message = lambda cl, u, m: self.box.add(m)
        c.on_publish = lambda cl, u, mid, rc, p: self._done(self.acks, mid, rc.value)
        c.on_subscribe = lambda cl, u, mid, rcs, p: self._done(self.subacks, mid,
                                                               [r.value for r in rcs])
        c.connect(*addr)
        c.loop_start()
        self.c = c
        assert connected.wait(WAIT), "no CONNACK"
        assert got["rc"] == 0

    def _done(self, into: dict[int, Any], mid: int, value: Any) -> None:
        with self.cond:
            into[mid] = value
            self.cond.notify_all()

    def _wait(self, into: dict[int, Any], mid: int) -> Any:
        with self.cond:
            assert self.cond.wait_for(lambda: mid in into, WAIT), "no acknowledgement"
            return into[mid]

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> int:
        """The reason code of the publish's acknowledgement (a QoS 0 one's: 0 once sent;
        a QoS 2 one's when its flow completes)."""
        return int(self._wait(self.acks, self.c.publish(topic, payload, qos=qos, retain=retain).mid))

    def subscribe(self, *filters: str, qos: int = 1) -> list[int]:
        """The SUBACK's codes, one per filter."""
        _, mid = self.c.subscribe([(f, qos) for f in filters])
        assert mid is not None
        return list(self._wait(self.subacks, mid))

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


@pytest.fixture
def client(addr: tuple[str, int], tokens: Tokens) -> Iterator[Any]:
    """``client(role, version=V5)``: a :class:`Client`, closed at the end of the test."""
    made: list[Client] = []

    def make(role: str, version: int = V5) -> Client:
        made.append(Client(addr, tokens.token(role), version))
        return made[-1]

    yield make
    for c in made:
        c.close()


class Wire(Socket):
    """An MQTT client made of a socket and the codec, past its CONNACK: logged in as a
    role by its token, as the password or (``enhanced``, 5.0) by enhanced authentication
    with the method ``token``."""

    def __init__(self, addr: tuple[str, int], token: bytes, *, level: int = 5,
                 enhanced: bool = False, will: Will | None = None) -> None:
        super().__init__(addr)
        if enhanced:
            connect = Connect(protocol_level=level, client_id=unique("wire"), will=will,
                              properties=Properties(authentication_method="token",
                                                    authentication_data=token))
        else:
            connect = Connect(protocol_level=level, client_id=unique("wire"), will=will,
                              username="app", password=token)
        self.send(connect)
        got = self.read()
        assert isinstance(got, Connack) and got.reason_code == 0, got

    def subscribe(self, packet_id: int, *filters: str) -> tuple[int, ...]:
        self.send(Subscribe(packet_id=packet_id, subscriptions=tuple(
            SubscribeOption(topic_filter=f, qos=1) for f in filters)))
        got = self.read()
        assert isinstance(got, Suback) and got.packet_id == packet_id, got
        return got.reason_codes


@pytest.fixture
def wire(addr: tuple[str, int], tokens: Tokens) -> Iterator[Any]:
    """``wire(role, level=5, enhanced=False, will=None)``: a :class:`Wire`, closed at the
    end of the test."""
    made: list[Wire] = []

    def make(role: str, **kw: Any) -> Wire:
        made.append(Wire(addr, tokens.token(role).encode(), **kw))
        return made[-1]

    yield make
    for w in made:
        w.close()


# --------------------------------------------------------------------------- publishing


@pytest.mark.parametrize("version", [V5, V311], ids=["v5", "v311"])
def test_a_granted_publish_reaches_a_subscriber(client: Any, admin: AdminClient,
                                                version: int) -> None:
    topic, role = unique("authz-granted"), unique("writer")
    grant(admin, topic, role, "produce")
    watcher = client(SUPER_USER)
    assert watcher.subscribe(topic) == [1]
    writer = client(role, version)
    assert writer.publish(topic, b"granted") == 0
    assert writer.publish(topic, b"granted twice", qos=2) == 0
    assert [m.payload for m in watcher.box.wait(2)] == [b"granted", b"granted twice"]


def test_a_refused_publish_is_not_authorized_and_stores_nothing(
        client: Any, wire: Any, admin: AdminClient, secured: Standalone) -> None:
    allowed, forbidden, role = unique("authz-ok"), unique("authz-no"), unique("writer")
    grant(admin, allowed, role, "produce")
    watcher = client(SUPER_USER)
    assert watcher.subscribe(forbidden, allowed) == [1, 1]
    before = dropped(secured)
    writer = client(role)
    assert writer.publish(forbidden, b"refused") == NOT_AUTHORIZED  # 5.0 3.4.2.1: PUBACK 0x87
    assert writer.publish(forbidden, b"refused retained", retain=True) == NOT_AUTHORIZED
    assert writer.publish(forbidden, b"refused at QoS 0", qos=0) == 0  # sent, and dropped
    w = wire(role)
    w.send(Publish(topic=forbidden, payload=b"refused at QoS 2", qos=2, packet_id=1))
    assert w.read() == Pubrec(packet_id=1, reason_code=NOT_AUTHORIZED)  # 5.0 3.5.2.1
    assert writer.publish(allowed, b"marker") == 0
    [got] = watcher.box.wait(1)
    assert (got.topic, got.payload) == (allowed, b"marker")
    assert forbidden not in topics_of(admin)  # nothing was stored: no topic was made
    assert forbidden not in {r["topic"] for r in admin.get("/admin/v2/mqtt/retained")}
    assert dropped(secured) == before + 4
    assert watcher.box.items == [got]


def test_a_311_refused_publish_is_acknowledged_and_dropped(
        client: Any, wire: Any, admin: AdminClient, secured: Standalone) -> None:
    # 3.1.1 section 3.3.5 (MQTT-3.3.5-2): a positive acknowledgement, as Mosquitto gives
    allowed, forbidden, role = unique("authz-ok"), unique("authz-no"), unique("writer")
    grant(admin, allowed, role, "produce")
    watcher = client(SUPER_USER)
    assert watcher.subscribe(allowed) == [1]
    before = dropped(secured)
    writer = client(role, V311)
    assert writer.publish(forbidden, b"refused") == 0
    assert writer.publish(forbidden, b"refused at QoS 2", qos=2) == 0  # PUBREC, PUBREL, PUBCOMP
    w = wire(role, level=4)
    w.send(Publish(topic=forbidden, payload=b"refused", qos=2, packet_id=7))
    assert w.read() == Pubrec(packet_id=7)
    w.send(Pubrel(packet_id=7))
    assert w.read() == Pubcomp(packet_id=7)
    assert writer.publish(allowed, b"marker") == 0  # the connection goes on
    assert [m.payload for m in watcher.box.wait(1)] == [b"marker"]
    assert forbidden not in topics_of(admin)
    assert dropped(secured) == before + 3


def test_a_will_is_checked_when_it_is_published(client: Any, wire: Any, admin: AdminClient,
                                                secured: Standalone) -> None:
    # as Mosquitto: the CONNECT is accepted; the will, when due, needs produce on its topic
    topic, refused, granted = unique("authz-will"), unique("nobody"), unique("heir")
    grant(admin, topic, granted, "produce")
    watcher = client(SUPER_USER)
    assert watcher.subscribe(topic) == [1]
    before = dropped(secured)
    wire(refused, will=Will(topic=topic, payload=b"refused will", qos=1)).close()
    wait_until(lambda: dropped(secured) == before + 1)
    wire(granted, will=Will(topic=topic, payload=b"granted will", qos=1)).close()
    [got] = watcher.box.wait(1)
    assert got.payload == b"granted will"


# --------------------------------------------------------------------------- subscribing


@pytest.mark.parametrize("version", [V5, V311], ids=["v5", "v311"])
def test_each_filter_of_a_subscribe_is_answered_alone(client: Any, admin: AdminClient,
                                                      version: int) -> None:
    readable, unreadable, role = unique("authz-r"), unique("authz-u"), unique("reader")
    grant(admin, readable, role, "consume")
    reader = client(role, version)
    refused = NOT_AUTHORIZED if version == V5 else FAILURE  # 5.0 / 3.1.1 section 3.9.3
    assert reader.subscribe(readable, unreadable) == [1, refused]
    publisher = client(SUPER_USER)
    assert publisher.publish(unreadable, b"hidden") == 0
    assert publisher.publish(readable, b"shown") == 0
    assert [m.payload for m in reader.box.wait(1)] == [b"shown"]


def test_a_wildcard_filter_needs_consume_on_the_namespace(client: Any,
                                                          admin: AdminClient) -> None:
    ns, role = f"public/authz-{unique('ns')}", unique("reader")
    admin.put(f"/admin/v2/namespaces/{ns}")
    base = f"persistent://{ns}"
    grant(admin, "one", role, "consume", ns=ns)  # a grant on one topic is not enough
    reader = client(role)
    assert reader.subscribe(f"{base}/+", f"{base}/one") == [NOT_AUTHORIZED, 1]
    assert reader.subscribe("persistent://+/default/#") == [NOT_AUTHORIZED]  # no one namespace
    grant_namespace(admin, ns, role, "consume")
    assert reader.subscribe(f"{base}/+") == [1]
    publisher = client(SUPER_USER)
    assert publisher.publish(f"{base}/later", b"on a topic made after the filter") == 0
    [got] = reader.box.wait(1)
    assert (got.topic, got.payload) == (f"{base}/later", b"on a topic made after the filter")


def test_topics_a_wildcard_matches_later_are_checked_one_by_one(client: Any,
                                                                admin: AdminClient) -> None:
    # "#" on the MQTT namespace also matches topics other namespaces load later
    # (persistent://...): each is checked as it is attached
    other, role = f"public/authz-{unique('ns')}", unique("reader")
    admin.put(f"/admin/v2/namespaces/{other}")
    grant_namespace(admin, DEFAULT, role, "consume")
    publisher = client(SUPER_USER)
    assert publisher.publish(f"persistent://{other}/kept", b"retained", retain=True) == 0
    reader = client(role)
    assert reader.subscribe("#") == [1]  # and not the retained message of the other namespace
    hidden, marker = f"persistent://{other}/hidden", unique("authz-marker")
    assert publisher.publish(hidden, b"hidden") == 0
    assert publisher.publish(marker, b"shown") == 0
    [got] = reader.box.wait(1)
    assert (got.topic, got.payload) == (marker, b"shown")
    stats = admin.get(f"/admin/v2/persistent/{other}/hidden/stats")
    assert not any(name.startswith("mqtt:") for name in stats["subscriptions"])


def test_a_super_user_and_the_tenant_admin_may_do_anything(client: Any,
                                                           admin: AdminClient) -> None:
    tenant, owner = f"authz-{unique('t')}", unique("owner")
    admin.put(f"/admin/v2/tenants/{tenant}", {"adminRoles": [owner],
                                             "allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{tenant}/ns")
    base = f"persistent://{tenant}/ns"
    for role in (SUPER_USER, owner):
        c = client(role)
        assert c.subscribe(f"{base}/{role}/+", f"{base}/{role}/exact") == [1, 1]
        assert c.publish(f"{base}/{role}/exact", b"mine", retain=True) == 0
        assert [m.payload for m in c.box.wait(1)] == [b"mine"]
    assert client(SUPER_USER).subscribe("persistent://+/ns/#") == [1]
    assert client(owner).subscribe("persistent://+/ns/#") == [NOT_AUTHORIZED]


# --------------------------------------------------------------------------- re-authentication


def test_re_authentication_changes_what_the_connection_may_do(wire: Any, client: Any,
                                                              admin: AdminClient,
                                                              tokens: Tokens) -> None:
    first, second = unique("role-a"), unique("role-b")
    topic, marker = unique("authz-t"), unique("authz-m")
    grant(admin, topic, first, "produce", "consume")
    for role in (first, second):
        grant(admin, marker, role, "consume")
    publisher = client(SUPER_USER)
    assert publisher.publish(topic, b"makes the topic") == 0
    w = wire(first, enhanced=True)
    assert w.subscribe(1, topic, marker) == (1, 1)
    w.send(Publish(topic=topic, payload=b"as the first", qos=1, packet_id=2))
    got = [w.read(), w.read()]  # the PUBACK and the delivery, in either order
    assert Puback(packet_id=2) in got, got
    [delivery] = [p for p in got if isinstance(p, Publish)]
    assert delivery.payload == b"as the first" and delivery.packet_id is not None
    w.send(Puback(packet_id=delivery.packet_id))
    w.send(Auth(reason_code=ReasonCode.RE_AUTHENTICATE,
                properties=Properties(authentication_method="token",
                                      authentication_data=tokens.token(second).encode())))
    assert w.read() == Auth(reason_code=ReasonCode.SUCCESS,
                            properties=Properties(authentication_method="token"))
    # the second role may neither publish to the topic nor go on reading it
    w.send(Publish(topic=topic, payload=b"as the second", qos=1, packet_id=3))
    assert w.read() == Puback(packet_id=3, reason_code=NOT_AUTHORIZED)
    assert w.subscribe(4, topic) == (NOT_AUTHORIZED,)
    assert publisher.publish(topic, b"hidden") == 0
    assert publisher.publish(marker, b"shown") == 0
    got_next = w.read()
    assert isinstance(got_next, Publish) and (got_next.topic, got_next.payload) == (marker, b"shown")
