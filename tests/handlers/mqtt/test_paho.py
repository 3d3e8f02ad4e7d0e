"""paho-mqtt (3.1.1 and 5) against the broker: what a device sees."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pulsar
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WAIT = 10.0
V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5


class Box:
    """Messages a client received, and a way to wait for a count of them."""

    def __init__(self) -> None:
        self.items: list[mqtt.MQTTMessage] = []
        self.cond = threading.Condition()
        self.disconnects: list[int] = []

    def add(self, msg: mqtt.MQTTMessage) -> None:
        with self.cond:
            self.items.append(msg)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.items) >= n, timeout)
            return list(self.items)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def connect(mqtt_addr: tuple[str, int]) -> Iterator:
    made: list[mqtt.Client] = []

    def make(client_id: str = "", version: int = V311, clean: bool = True, box: Box | None = None,
             will: tuple[str, bytes] | None = None, props: Properties | None = None,
             keepalive: int = 60) -> tuple[mqtt.Client, Box]:
        box = box or Box()
        kw = {"clean_session": clean} if version == V311 else {}
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version, **kw)
        connected = threading.Event()
        c.on_connect = lambda cl, u, flags, rc, p=None: (setattr(box, "flags", flags),
                                                         setattr(box, "rc", rc), connected.set())
        c.on_message = lambda cl, u, m: box.add(m)
        c.on_disconnect = lambda cl, u, flags, rc, p=None: box.disconnects.append(
            rc.value if hasattr(rc, "value") else rc)
        if will is not None:
            c.will_set(will[0], will[1], qos=1)
        if version == V5:
            c.connect(*mqtt_addr, keepalive=keepalive, clean_start=clean, properties=props)
        else:
            c.connect(*mqtt_addr, keepalive=keepalive)
        c.loop_start()
        assert connected.wait(WAIT), "no CONNACK"
        made.append(c)
        return c, box

    yield make
    for c in made:
        c.loop_stop()
        c.disconnect()


def subscribe(c: mqtt.Client, *args, **kw) -> None:
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.subscribe(*args, **kw)
    assert done.wait(WAIT), "no SUBACK"


@pytest.mark.parametrize("version", [V311, V5])
def test_every_qos_reaches_a_wildcard_subscriber_at_the_granted_qos(connect, version):
    base = unique("qos")
    sub, box = connect(unique("s"), version)
    subscribe(sub, f"{base}/#", qos=1)
    pub, _ = connect(unique("p"), version)
    for q in (0, 1, 2):
        pub.publish(f"{base}/t{q}", f"m{q}".encode(), qos=q).wait_for_publish(WAIT)
    got = box.wait(3)
    # topics created after the subscription are covered; QoS is min(publish, subscription)
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        (f"{base}/t0", b"m0", 0), (f"{base}/t1", b"m1", 1), (f"{base}/t2", b"m2", 1)]


def test_dollar_topics_and_plus_levels(connect):
    base = unique("lv")
    sub, box = connect(unique("s"))
    subscribe(sub, [(f"{base}/+/temp", 1)])
    pub, _ = connect(unique("p"))
    for t in (f"{base}/kitchen/temp", f"{base}/kitchen/humidity", f"{base}/a/b/temp", f"{base}/hall/temp"):
        pub.publish(t, t.encode(), qos=1).wait_for_publish(WAIT)
    got = box.wait(2)
    time.sleep(0.3)  # what must not arrive has had the time the others took
    assert sorted(m.topic for m in box.items) == [f"{base}/hall/temp", f"{base}/kitchen/temp"]
    assert len(got) == 2


def test_retained_messages_every_match_on_a_wildcard_and_empty_payload_clears(connect):
    base = unique("ret")
    pub, _ = connect(unique("p"))
    for name in ("a", "b", "c"):
        pub.publish(f"{base}/{name}", f"last-{name}".encode(), qos=1, retain=True).wait_for_publish(WAIT)
    pub.publish(f"{base}/b", b"", qos=1, retain=True).wait_for_publish(WAIT)
    sub, box = connect(unique("s"))
    subscribe(sub, f"{base}/+", qos=1)
    got = box.wait(2)
    assert sorted((m.topic, m.payload, m.retain) for m in got) == [
        (f"{base}/a", b"last-a", True), (f"{base}/c", b"last-c", True)]


def test_a_persistent_session_queues_while_offline_and_resumes(connect):
    cid, base = unique("persist"), unique("off")
    sub, box = connect(cid, clean=False)
    subscribe(sub, f"{base}/#", qos=1)
    sub.loop_stop()
    sub.disconnect()
    pub, _ = connect(unique("p"))
    for i in range(5):
        pub.publish(f"{base}/x", f"m{i}".encode(), qos=1).wait_for_publish(WAIT)
    again, box2 = connect(cid, clean=False)
    assert box2.flags.session_present
    got = box2.wait(5)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5)]  # in order


def test_a_clean_session_forgets_its_subscriptions(connect):
    cid, base = unique("clean"), unique("cl")
    sub, box = connect(cid, clean=False)
    subscribe(sub, f"{base}/#", qos=1)
    sub.loop_stop()
    sub.disconnect()
    fresh, box2 = connect(cid, clean=True)
    assert not box2.flags.session_present
    pub, _ = connect(unique("p"))
    pub.publish(f"{base}/x", b"nobody", qos=1).wait_for_publish(WAIT)
    probe, pbox = connect(unique("probe"))
    subscribe(probe, f"{base}/#", qos=1)
    pub.publish(f"{base}/x", b"probe", qos=1).wait_for_publish(WAIT)
    assert [m.payload for m in pbox.wait(1)] == [b"probe"]
    assert box2.items == []


def test_a_will_is_sent_when_the_connection_drops_not_after_disconnect(connect, mqtt_addr):
    base = unique("will")
    watcher, box = connect(unique("w"))
    subscribe(watcher, f"{base}/#", qos=1)
    polite, _ = connect(unique("polite"), will=(f"{base}/polite", b"gone"))
    polite.loop_stop()
    polite.disconnect()
    rude = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=unique("rude"))
    rude.will_set(f"{base}/rude", b"lost", qos=1)
    rude.connect(*mqtt_addr)
    rude.loop(timeout=1.0)
    rude.socket().close()  # no DISCONNECT
    got = box.wait(1)
    time.sleep(0.3)
    assert [(m.topic, m.payload) for m in box.items] == [(f"{base}/rude", b"lost")]
    assert len(got) == 1


def test_a_second_connection_takes_the_session_over_with_0x8e(connect):
    cid = unique("take")
    first, box1 = connect(cid, V5)
    second, box2 = connect(cid, V5)
    deadline = time.monotonic() + WAIT
    while not box1.disconnects and time.monotonic() < deadline:
        time.sleep(0.02)
    assert box1.disconnects and box1.disconnects[0] == 0x8E
    assert second.is_connected()


def test_v5_user_properties_and_subscription_identifiers(connect):
    base = unique("props")
    sub, box = connect(unique("s"), V5)
    sp = Properties(PacketTypes.SUBSCRIBE)
    sp.SubscriptionIdentifier = 7
    subscribe(sub, f"{base}/#", qos=1, properties=sp)
    pub, _ = connect(unique("p"), V5)
    pp = Properties(PacketTypes.PUBLISH)
    pp.UserProperty = [("colour", "blue")]
    pp.ContentType = "text/plain"
    pp.ResponseTopic = f"{base}/reply"
    pp.CorrelationData = b"\x01\x02"
    pub.publish(f"{base}/x", b"hello", qos=1, properties=pp).wait_for_publish(WAIT)
    (m,) = box.wait(1)
    assert m.payload == b"hello"
    assert ("colour", "blue") in m.properties.UserProperty
    assert m.properties.ContentType == "text/plain"
    assert m.properties.ResponseTopic == f"{base}/reply"
    assert m.properties.CorrelationData == b"\x01\x02"
    assert m.properties.SubscriptionIdentifier == [7]


def test_mqtt_and_pulsar_read_each_others_messages(connect, standalone):
    base = unique("xp")
    client = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=15)
    try:
        consumer = client.subscribe(f"persistent://public/default/{base}/from-mqtt", "s",
                                    initial_position=pulsar.InitialPosition.Earliest)
        pub, _ = connect(unique("p"))
        pub.publish(f"{base}/from-mqtt", b"to pulsar", qos=1).wait_for_publish(WAIT)
        assert consumer.receive(int(WAIT * 1000)).data() == b"to pulsar"
        sub, box = connect(unique("s"))
        subscribe(sub, f"{base}/+", qos=1)
        producer = client.create_producer(f"persistent://public/default/{base}/from-pulsar")
        producer.send(b"to mqtt", properties={"k": "v"})
        (m,) = box.wait(1)
        assert (m.topic, m.payload) == (f"{base}/from-pulsar", b"to mqtt")
    finally:
        client.close()


def test_garbage_closes_only_that_connection(connect, mqtt_addr):
    with socket.create_connection(mqtt_addr, timeout=WAIT) as s:
        s.sendall(b"\x10\xff\xff\xff\xff\x7f")  # a remaining length of five bytes
        assert s.recv(100) == b""
    with socket.create_connection(mqtt_addr, timeout=WAIT) as s:
        s.sendall(b"\x30\x03\x00\x01a")  # PUBLISH before CONNECT
        assert s.recv(100) == b""
    c, box = connect(unique("after"))
    assert c.is_connected()


def test_keep_alive_is_enforced_at_one_and_a_half_times(mqtt_addr):
    # CONNECT 3.1.1, keep alive 1 s, then silence
    client_id = b"ka"
    body = b"\x00\x04MQTT\x04\x02\x00\x01" + len(client_id).to_bytes(2, "big") + client_id
    with socket.create_connection(mqtt_addr, timeout=WAIT) as s:
        s.sendall(bytes([0x10, len(body)]) + body)
        assert s.recv(4) == b"\x20\x02\x00\x00"
        t0 = time.monotonic()
        assert s.recv(100) == b""
        assert 1.4 <= time.monotonic() - t0 <= 2.6
