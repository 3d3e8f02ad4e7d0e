"""QoS 2 exactly once when the flow breaks off midway: across a reconnect, and across a
broker restart (the packet ids awaiting PUBREL and PUBCOMP are the session's, kept in the
metadata store)."""

from __future__ import annotations

from pathlib import Path

from handlers.mqtt._packets import Disconnect, Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests._standalone import Standalone

from ._clients import V5, WAIT, Raw, subscribe, unique
from .conftest import MQTT_CONF


def test_a_qos2_publish_cut_off_before_pubrel_is_delivered_once(connect, mqtt_addr):
    base, cid = unique("eo"), unique("pub")
    sub, box = connect(unique("s"), V5)
    subscribe(sub, base, qos=2)
    raw = Raw(mqtt_addr, cid, session_expiry_interval=60)
    raw.send(Publish(topic=base, payload=b"once", qos=2, packet_id=7))
    assert raw.read() == Pubrec(packet_id=7)
    raw.close()  # before PUBREL
    raw = Raw(mqtt_addr, cid, clean=False, session_expiry_interval=60)
    try:
        assert raw.connack.session_present
        # as a client that never saw the PUBREC: the PUBLISH again, with DUP, then PUBREL
        raw.send(Publish(topic=base, payload=b"once", qos=2, dup=True, packet_id=7))
        assert raw.read() == Pubrec(packet_id=7)
        raw.send(Pubrel(packet_id=7))
        assert raw.read() == Pubcomp(packet_id=7)  # 0x00: the session knew the id
        raw.send(Publish(topic=base, payload=b"marker", qos=1, packet_id=8))
        assert raw.read() == Puback(packet_id=8)
    finally:
        raw.close()
    # one topic, so in order: a second "once" would come before the marker
    assert [m.payload for m in box.wait(2)][:2] == [b"once", b"marker"]
    assert len(box.items) == 2


def test_a_pubrel_lost_with_the_connection_is_resent_on_reconnect(connect, mqtt_addr):
    base, cid = unique("rel"), unique("sub")
    raw = Raw(mqtt_addr, cid, session_expiry_interval=60)
    raw.subscribe(base, 2)
    pub, _ = connect(unique("p"), V5)
    pub.publish(base, b"once", qos=2).wait_for_publish(WAIT)
    got = raw.read()
    assert isinstance(got, Publish) and (got.payload, got.qos) == (b"once", 2)
    pid = got.packet_id
    assert pid is not None
    raw.send(Pubrec(packet_id=pid))
    assert raw.read() == Pubrel(packet_id=pid)  # lost: the connection drops before PUBCOMP
    raw.close()
    raw = Raw(mqtt_addr, cid, clean=False, session_expiry_interval=60)
    try:
        assert raw.connack.session_present
        assert raw.read() == Pubrel(packet_id=pid)  # MQTT-4.4.0-1, the original packet id
        raw.send(Pubcomp(packet_id=pid))
        pub.publish(base, b"marker", qos=2).wait_for_publish(WAIT)
        got = raw.read()
        assert isinstance(got, Publish) and got.payload == b"marker"  # not "once" again
    finally:
        raw.close()


def test_qos2_is_exactly_once_across_a_broker_restart(tmp_path: Path):
    s = Standalone(tmp_path, conf=MQTT_CONF).start()
    try:
        base, pcid, scid = unique("rs"), unique("p"), unique("s")
        sub = Raw(_addr(s), scid, session_expiry_interval=600)
        sub.subscribe(base, 2)
        pub = Raw(_addr(s), pcid, session_expiry_interval=600)
        pub.send(Publish(topic=base, payload=b"once", qos=2, packet_id=3))
        assert pub.read() == Pubrec(packet_id=3)
        pub.close()  # the publisher's PUBREL is still to come
        got = sub.read()
        assert isinstance(got, Publish) and got.payload == b"once" and got.packet_id is not None
        pid = got.packet_id
        sub.send(Pubrec(packet_id=pid))
        assert sub.read() == Pubrel(packet_id=pid)
        sub.close()  # and the subscriber's PUBCOMP
        assert s.stop() == 0
        s.start()
        sub = Raw(_addr(s), scid, clean=False, session_expiry_interval=600)
        assert sub.connack.session_present
        assert sub.read() == Pubrel(packet_id=pid)
        sub.send(Pubcomp(packet_id=pid))
        pub = Raw(_addr(s), pcid, clean=False, session_expiry_interval=600)
        assert pub.connack.session_present
        pub.send(Publish(topic=base, payload=b"once", qos=2, dup=True, packet_id=3))
        assert pub.read() == Pubrec(packet_id=3)  # known: not stored a second time
        pub.send(Pubrel(packet_id=3))
        assert pub.read() == Pubcomp(packet_id=3)
        pub.send(Publish(topic=base, payload=b"marker", qos=1, packet_id=4))
        assert pub.read() == Puback(packet_id=4)
        got = sub.read()
        assert isinstance(got, Publish) and got.payload == b"marker", got
        for c in (pub, sub):
            c.send(Disconnect())
            c.close()
    finally:
        s.kill()


def _addr(s: Standalone) -> tuple[str, int]:
    host, port = s.addresses["mqtt"][0].rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)
