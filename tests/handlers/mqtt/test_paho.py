"""paho-mqtt (3.1.1 and 5) against the broker: what a device sees."""

from __future__ import annotations

import socket
import time

import paho.mqtt.client as mqtt
import pulsar
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from handlers.mqtt._codec import NEED_DATA, MQTTConnection, Role
from handlers.mqtt._packets import (
    Connack,
    Connect,
    Disconnect,
    Publish,
    ReasonCode,
    Suback,
    Subscribe,
    SubscribeOption,
)

from ._clients import V5, V311, WAIT, metric, scrape, subscribe, unique, wait_until


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


# --------------------------------------------------------------------------- raw clients


def raw_client(addr: tuple[str, int], client_id: str) -> tuple[socket.socket, MQTTConnection]:
    """A socket past an MQTT 5 CONNECT and its CONNACK, and the codec reading it: a client
    that acknowledges only what the test says."""
    sock = socket.create_connection(addr, timeout=WAIT)
    conn = MQTTConnection(Role.CLIENT)
    sock.sendall(conn.send(Connect(protocol_level=5, client_id=client_id)))
    assert isinstance(read_packet(sock, conn), Connack)
    return sock, conn


def read_packet(sock: socket.socket, conn: MQTTConnection) -> object:
    while (packet := conn.next_event()) is NEED_DATA:
        data = sock.recv(65536)
        assert data, "the broker closed the connection"
        conn.receive_data(data)
    return packet


def test_a_client_publish_with_a_subscription_identifier_is_a_protocol_error(mqtt_addr):
    # 5.0 section 3.3.2.3.8: a client MUST NOT send one (the codec will not, so bytes)
    sock, conn = raw_client(mqtt_addr, unique("sid"))
    with sock:
        sock.sendall(b"\x30\x06\x00\x01t\x02\x0b\x01")
        got = read_packet(sock, conn)
        assert isinstance(got, Disconnect) and got.reason_code == ReasonCode.PROTOCOL_ERROR
        assert sock.recv(100) == b""


# --------------------------------------------------------------------------- shared subscriptions


def test_a_share_group_gets_each_message_once_and_an_outsider_every_one(connect):
    base, group = unique("share"), unique("g")
    members = [connect(unique("m"), v) for v in (V5, V5, V311)]  # 3.1.1 clients may share too
    for c, _ in members:
        subscribe(c, f"$share/{group}/{base}/#", qos=1)
    outside, obox = connect(unique("o"), V311)
    subscribe(outside, f"{base}/#", qos=1)
    pub, _ = connect(unique("p"))
    sent = [f"m{i}".encode() for i in range(60)]
    for i, payload in enumerate(sent):  # topics created after the SUBSCRIBEs
        pub.publish(f"{base}/t{i % 3}", payload, qos=1).wait_for_publish(WAIT)
    assert sorted(m.payload for m in obox.wait(60)) == sorted(sent)
    wait_until(lambda: sum(len(box.items) for _, box in members) >= 60)
    assert sorted(m.payload for _, box in members for m in box.items) == sorted(sent)
    assert all(box.items for _, box in members), [len(box.items) for _, box in members]


def test_what_a_member_leaves_unacknowledged_goes_to_another_member(connect, mqtt_addr):
    base, group = unique("fail"), unique("g")
    share = f"$share/{group}/{base}"
    sock, conn = raw_client(mqtt_addr, unique("raw"))
    sock.sendall(conn.send(Subscribe(packet_id=1, subscriptions=(
        SubscribeOption(topic_filter=share, qos=1),))))
    assert read_packet(sock, conn) == Suback(packet_id=1, reason_codes=(1,))
    other, box = connect(unique("m"), V5)
    subscribe(other, share, qos=1)
    pub, _ = connect(unique("p"))
    sent = [f"m{i}".encode() for i in range(10)]
    for payload in sent:
        pub.publish(base, payload, qos=1).wait_for_publish(WAIT)
    held = read_packet(sock, conn)  # never acknowledged
    assert isinstance(held, Publish) and held.qos == 1
    sock.close()
    wait_until(lambda: len(box.items) >= len(sent))
    assert sorted(m.payload for m in box.items) == sorted(sent)


def test_a_shared_subscribe_sends_no_retained_message(connect):
    base = unique("sret")
    pub, _ = connect(unique("p"))
    pub.publish(f"{base}/r", b"retained", qos=1, retain=True).wait_for_publish(WAIT)
    sub, box = connect(unique("s"), V5)
    assert box.props.SharedSubscriptionAvailable == 1  # the CONNACK says they are
    subscribe(sub, f"$share/{unique('g')}/{base}/#", qos=1)
    pub.publish(f"{base}/r", b"after", qos=1).wait_for_publish(WAIT)
    box.wait(1)
    assert [m.payload for m in box.items] == [b"after"]


def test_bad_shared_filters_are_refused_with_0x8f(mqtt_addr):
    # 5.0 section 4.8.2: a share name of one character or more without / + #, then a filter
    bad = ["$share/g", "$share//x", "$share/g+/x", "$share/#/x", "$share/g/x/#/y"]
    sock, conn = raw_client(mqtt_addr, unique("bad"))
    with sock:
        sock.sendall(conn.send(Subscribe(packet_id=1, subscriptions=tuple(
            SubscribeOption(topic_filter=f, qos=1) for f in [*bad, "$share/g/x"]))))
        assert read_packet(sock, conn) == Suback(packet_id=1, reason_codes=(0x8F,) * len(bad) + (1,))


def test_no_local_on_a_shared_subscription_is_a_protocol_error(connect):
    sub, box = connect(unique("s"), V5)
    sub.subscribe(f"$share/g/{unique('nl')}", options=SubscribeOptions(qos=1, noLocal=True))
    wait_until(lambda: bool(box.disconnects))
    assert box.disconnects[0] == ReasonCode.PROTOCOL_ERROR


# --------------------------------------------------------------------------- /metrics


def test_metrics_count_mqtt_traffic(connect, standalone):
    web = standalone.addresses["web"][0]
    before = scrape(web)
    base = unique("met")
    sub, box = connect(unique("s"), V5)
    subscribe(sub, f"{base}/#", qos=2)
    pub, _ = connect(unique("p"), V5)
    for qos in (0, 1, 1, 2, 2, 2):
        pub.publish(f"{base}/x", b"m", qos=qos).wait_for_publish(WAIT)
    pub.publish(f"{base}/kept", b"r", qos=1, retain=True).wait_for_publish(WAIT)
    box.wait(7)
    after = scrape(web)

    def grew(name: str, **labels: str) -> float:
        return metric(after, name, cluster="standalone", **labels) - metric(before, name, **labels)

    assert [grew("magnetar_mqtt_messages_in_total", qos=q) for q in "012"] == [1, 3, 3]
    assert grew("magnetar_mqtt_messages_out_total") == 7
    assert grew("magnetar_mqtt_connections_total") >= 2
    assert grew("magnetar_mqtt_messages_dropped_total", reason="queue_full") == 0
    assert metric(after, "magnetar_mqtt_connected_clients") >= 2
    assert metric(after, "magnetar_mqtt_sessions") >= 2
    assert metric(after, "magnetar_mqtt_retained_messages") >= 1
