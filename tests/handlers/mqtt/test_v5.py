"""MQTT 5 behaviours a raw client sees on the wire: will delay, topic aliases both ways,
receive maximum and message expiry."""

from __future__ import annotations

import time

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from handlers.mqtt._packets import (
    Disconnect,
    Properties,
    Puback,
    Publish,
    ReasonCode,
    Will,
)

from ._clients import V5, WAIT, Raw, subscribe, unique, wait_until

# --------------------------------------------------------------------------- will delay


def _will(topic: str, payload: bytes, delay: int) -> Will:
    return Will(topic=topic, payload=payload, qos=1, properties=Properties(will_delay_interval=delay))


def test_a_will_is_published_after_its_delay(connect, mqtt_addr):
    base = unique("wd")
    watcher, box = connect(unique("w"), V5)
    subscribe(watcher, f"{base}/#", qos=1)
    raw = Raw(mqtt_addr, unique("d"), will=_will(f"{base}/will", b"late", 1),
              session_expiry_interval=60)
    t0 = time.monotonic()
    raw.close()  # no DISCONNECT
    (m,) = box.wait(1)
    assert time.monotonic() - t0 >= 1.0
    assert (m.topic, m.payload) == (f"{base}/will", b"late")


def test_a_client_back_within_the_will_delay_cancels_its_will(connect, mqtt_addr):
    base, back = unique("wc"), unique("back")
    watcher, box = connect(unique("w"), V5)
    subscribe(watcher, f"{base}/#", qos=1)
    a = Raw(mqtt_addr, back, will=_will(f"{base}/will", b"a", 1), session_expiry_interval=60)
    # b's will, due a second after a's would be, shows a's was not sent
    b = Raw(mqtt_addr, unique("gone"), will=_will(f"{base}/will", b"b", 2), session_expiry_interval=60)
    a.close()
    b.close()
    a = Raw(mqtt_addr, back, clean=False, session_expiry_interval=60)
    try:
        assert a.connack.session_present
        box.wait(1)
        assert [m.payload for m in box.items] == [b"b"]
    finally:
        a.close()


def test_a_will_is_not_delayed_past_the_end_of_its_session(connect, mqtt_addr):
    # 5.0 section 3.1.2.5: published when the delay passes or the session ends, whichever
    # is first; a session expiry of 0 ends the session with the connection
    base = unique("we")
    watcher, box = connect(unique("w"), V5)
    subscribe(watcher, f"{base}/#", qos=1)
    raw = Raw(mqtt_addr, unique("d"), will=_will(f"{base}/will", b"now", 60))
    raw.close()
    assert [m.payload for m in box.wait(1, timeout=WAIT)] == [b"now"]


# --------------------------------------------------------------------------- topic aliases


def test_a_topic_alias_set_then_used_alone(connect, mqtt_addr):
    base = unique("ta")
    sub, box = connect(unique("s"), V5)
    subscribe(sub, f"{base}/#", qos=1)
    raw = Raw(mqtt_addr, unique("a"))
    try:
        assert raw.connack.properties.topic_alias_maximum == 10  # mqttTopicAliasMaximum
        raw.send(Publish(topic=f"{base}/a/long/name", payload=b"one", qos=1, packet_id=1,
                         properties=Properties(topic_alias=3)))
        assert raw.read() == Puback(packet_id=1)
        raw.send(Publish(topic="", payload=b"two", qos=1, packet_id=2,
                         properties=Properties(topic_alias=3)))
        assert raw.read() == Puback(packet_id=2)
    finally:
        raw.close()
    assert [(m.topic, m.payload) for m in box.wait(2)] == [
        (f"{base}/a/long/name", b"one"), (f"{base}/a/long/name", b"two")]


def test_a_topic_alias_over_the_maximum_is_0x94(mqtt_addr):
    raw = Raw(mqtt_addr, unique("a"))
    try:
        top = raw.connack.properties.topic_alias_maximum or 0
        raw.send(Publish(topic=unique("ta"), payload=b"x", properties=Properties(topic_alias=top + 1)))
        got = raw.read()
        assert isinstance(got, Disconnect) and got.reason_code == ReasonCode.TOPIC_ALIAS_INVALID
        assert raw.eof()
    finally:
        raw.close()


def test_the_broker_sends_topic_aliases_up_to_the_clients_maximum(connect, mqtt_addr):
    # 5.0 section 3.3.2.3.4: the name and a new alias on a topic's first PUBLISH, then the
    # alias alone; no more aliases than the client's Topic Alias Maximum
    base = unique("out")
    raw = Raw(mqtt_addr, unique("s"), topic_alias_maximum=2)
    try:
        raw.subscribe(f"{base}/#", 0)
        pub, _ = connect(unique("p"), V5)
        sent = [("a", b"1"), ("a", b"2"), ("b", b"3"), ("c", b"4"), ("b", b"5"), ("a", b"6"),
                ("c", b"7")]
        for name, payload in sent:
            pub.publish(f"{base}/{name}", payload, qos=1).wait_for_publish(WAIT)
        wire = [raw.read() for _ in sent]
    finally:
        raw.close()
    known: dict[int, str] = {}
    resolved = []
    for p in wire:
        assert isinstance(p, Publish)
        alias = p.properties.topic_alias
        if p.topic:
            assert p.topic not in known.values(), f"{p.topic} was sent again with an alias known"
            if alias is not None:
                known[alias] = p.topic
            resolved.append((p.topic, p.payload))
        else:
            assert alias in known, "an alias used before the PUBLISH that names it"
            resolved.append((known[alias], p.payload))
    assert sorted(known) == [1, 2]
    assert sorted(resolved) == sorted((f"{base}/{n}", p) for n, p in sent)
    unaliased = {p.topic for p in wire if isinstance(p, Publish) and p.properties.topic_alias is None}
    assert len(unaliased) == 1  # the third topic, sent by name every time
    assert sum(1 for p in wire if isinstance(p, Publish) and not p.topic) == 3


def test_no_topic_alias_for_a_client_that_allows_none(connect, mqtt_addr):
    base = unique("none")
    raw = Raw(mqtt_addr, unique("s"))
    try:
        raw.subscribe(f"{base}/#", 0)
        pub, _ = connect(unique("p"), V5)
        for _ in range(2):
            pub.publish(f"{base}/a", b"x", qos=1).wait_for_publish(WAIT)
        wire = [raw.read() for _ in range(2)]
    finally:
        raw.close()
    assert [(p.topic, p.properties.topic_alias) for p in wire if isinstance(p, Publish)] == [
        (f"{base}/a", None)] * 2


# --------------------------------------------------------------------------- receive maximum


def test_the_broker_keeps_within_the_clients_receive_maximum(connect, mqtt_addr):
    # 5.0 section 4.9: never more unacknowledged QoS 1 and 2 PUBLISHes than Receive Maximum,
    # retained messages sent on a SUBSCRIBE and live ones alike
    base = unique("rm")
    pub, _ = connect(unique("p"), V5)
    for i in range(4):
        pub.publish(f"{base}/r{i}", b"r%d" % i, qos=1, retain=True).wait_for_publish(WAIT)
    raw = Raw(mqtt_addr, unique("s"), receive_maximum=2)
    try:
        raw.subscribe(f"{base}/#", 1)
        for i in range(3):
            pub.publish(f"{base}/live", b"l%d" % i, qos=1).wait_for_publish(WAIT)
        outstanding: list[int] = []
        got: list[bytes] = []

        def take(packets: list) -> None:
            for p in packets:
                assert isinstance(p, Publish) and p.qos == 1 and p.packet_id is not None, p
                outstanding.append(p.packet_id)
                got.append(p.payload)
            assert len(outstanding) <= 2, f"{len(outstanding)} unacknowledged"

        take(raw.ping())
        while len(got) < 7:
            if outstanding:
                raw.send(Puback(packet_id=outstanding.pop(0)))
            else:
                take([raw.read()])
            take(raw.ping())
    finally:
        raw.close()
    assert sorted(got) == sorted([b"r0", b"r1", b"r2", b"r3", b"l0", b"l1", b"l2"])


# --------------------------------------------------------------------------- message expiry


def _expiring(seconds: int) -> PahoProperties:
    pp = PahoProperties(PacketTypes.PUBLISH)
    pp.MessageExpiryInterval = seconds
    return pp


def test_an_expired_retained_message_is_not_sent(connect):
    base = unique("rx")
    pub, _ = connect(unique("p"), V5)
    t0 = time.monotonic()
    pub.publish(f"{base}/old", b"old", qos=1, retain=True, properties=_expiring(1)).wait_for_publish(WAIT)
    pub.publish(f"{base}/new", b"new", qos=1, retain=True, properties=_expiring(30)).wait_for_publish(WAIT)
    wait_until(lambda: time.monotonic() - t0 > 1.2)  # "old" has expired
    sub, box = connect(unique("s"), V5)
    subscribe(sub, f"{base}/+", qos=1)
    # retained messages go out in the order they were stored: "old" would come first
    (m, *_) = box.wait(1)
    assert m.payload == b"new" and len(box.items) == 1
    assert 1 <= m.properties.MessageExpiryInterval <= 29  # what is left of it


def test_an_expired_queued_message_is_not_delivered(connect):
    cid, base = unique("qx"), unique("qx")
    expiry = PahoProperties(PacketTypes.CONNECT)
    expiry.SessionExpiryInterval = 300
    sub, _ = connect(cid, V5, clean=False, props=expiry)
    subscribe(sub, f"{base}/t", qos=1)
    sub.loop_stop()
    sub.disconnect()
    pub, _ = connect(unique("p"), V5)
    t0 = time.monotonic()
    pub.publish(f"{base}/t", b"short", qos=1, properties=_expiring(1)).wait_for_publish(WAIT)
    pub.publish(f"{base}/t", b"long", qos=1, properties=_expiring(30)).wait_for_publish(WAIT)
    wait_until(lambda: time.monotonic() - t0 > 1.2)  # "short" has expired
    again, box = connect(cid, V5, clean=False, props=expiry)
    assert box.flags.session_present
    (m, *_) = box.wait(1)  # one topic, in order: "short" would come first
    assert m.payload == b"long"
    assert 1 <= m.properties.MessageExpiryInterval <= 29


def test_a_delivered_message_carries_the_interval_left(connect):
    base = unique("dx")
    sub, box = connect(unique("s"), V5)
    subscribe(sub, base, qos=1)
    pub, _ = connect(unique("p"), V5)
    pub.publish(base, b"m", qos=1, properties=_expiring(60)).wait_for_publish(WAIT)
    (m,) = box.wait(1)
    assert 55 <= m.properties.MessageExpiryInterval <= 60


def test_a_message_with_a_second_left_is_delivered_with_it(connect):
    # the interval left is rounded up: under a second left is not expired
    base = unique("one")
    sub, box = connect(unique("s"), V5)
    subscribe(sub, base, qos=1)
    pub, _ = connect(unique("p"), V5)
    pub.publish(base, b"brief", qos=1, properties=_expiring(1)).wait_for_publish(WAIT)
    (m,) = box.wait(1)
    assert (m.payload, m.properties.MessageExpiryInterval) == (b"brief", 1)
