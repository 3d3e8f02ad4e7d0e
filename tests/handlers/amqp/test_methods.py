"""The rest of the methods a RabbitMQ application uses: AMQPLAIN logins, purge, unbind,
recover, global prefetch and prefetch size, server-sent cancel when a queue is deleted,
internal and auto-delete exchanges, and a method on a channel that is not open."""

from __future__ import annotations

import socket
import time
from typing import Any

import pika
import pika.exceptions as pex
import pytest

from handlers.amqp._codec import (
    FRAME_METHOD,
    PROTOCOL_HEADER,
    FrameReader,
    decode_method,
    encode_method,
    encode_table,
)
from tests._standalone import Standalone
from tests.handlers.amqp.conftest import amqp_port
from tests.handlers.amqp.test_pika import drain, get

WAIT = 10.0


class Raw:
    """A bare AMQP client socket: sends method frames, reads method frames."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.frames = FrameReader(frame_max=0)
        self.sock.sendall(PROTOCOL_HEADER)

    def method(self) -> Any:
        end = time.monotonic() + WAIT
        while time.monotonic() < end:
            frame = self.frames.next()
            if frame is None:
                data = self.sock.recv(65536)
                assert data, "the broker closed the connection"
                self.frames.feed(data)
                continue
            if frame.type == FRAME_METHOD:
                return frame.channel, decode_method(frame.payload)
        raise AssertionError("no method frame")

    def send(self, channel: int, name: str, **args: Any) -> None:
        self.sock.sendall(encode_method(channel, name, **args))

    def open(self, mechanism: str, response: bytes) -> Any:
        _, start = self.method()
        assert start.name == "connection.start"
        assert b"AMQPLAIN" in start.args["mechanisms"]
        self.send(0, "connection.start-ok", client_properties={}, mechanism=mechanism,
                  response=response, locale="en_US")
        return self.method()[1]


def _amqplain(login: str, password: str) -> bytes:
    return encode_table({"LOGIN": login, "PASSWORD": password})[4:]  # no length prefix


def test_amqplain_logins(amqp_broker: Standalone) -> None:
    ok = Raw(amqp_port(amqp_broker))
    try:
        tune = ok.open("AMQPLAIN", _amqplain("guest", "guest"))
        assert tune.name == "connection.tune"
        ok.send(0, "connection.tune-ok", channel_max=tune.args["channel_max"],
                frame_max=tune.args["frame_max"], heartbeat=0)
        ok.send(0, "connection.open", virtual_host="/")
        assert ok.method()[1].name == "connection.open-ok"
        # a method on a channel that was never opened: CHANNEL_ERROR closes the connection
        ok.send(5, "queue.declare", queue="x")
        _, close = ok.method()
        assert (close.name, close.args["reply_code"]) == ("connection.close", 504)
    finally:
        ok.sock.close()
    bad = Raw(amqp_port(amqp_broker))
    try:
        close = bad.open("AMQPLAIN", _amqplain("guest", "nope"))
        assert (close.name, close.args["reply_code"]) == ("connection.close", 403)
    finally:
        bad.sock.close()


def test_purge_unbind_and_recover(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ex, q = f"pu-{unique}", f"pu-q-{unique}"
    ch.exchange_declare(ex, "direct")
    ch.queue_declare(q)
    ch.queue_bind(q, ex, routing_key="k")
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish(ex, "k", b"%d" % i)
    get(ch, q, auto_ack=False)  # one unacknowledged: purge leaves it
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    assert ch.queue_purge(q).method.message_count == 2
    assert ch.basic_get(q)[0] is None
    ch.basic_recover(requeue=True)  # the unacknowledged one comes back
    method, _, body = get(ch, q)
    assert body == b"0" and method.redelivered
    ch.queue_unbind(q, ex, routing_key="k")
    ch.basic_publish(ex, "k", b"after unbind")
    assert ch.basic_get(q)[0] is None


def test_global_prefetch_and_prefetch_size(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q1, q2 = f"g1-{unique}", f"g2-{unique}"
    for q in (q1, q2):
        ch.queue_declare(q)
    ch.confirm_delivery()
    for _ in range(5):
        ch.basic_publish("", q1, b"a" * 100)
        ch.basic_publish("", q2, b"b" * 100)
    ch.basic_qos(prefetch_count=3, global_qos=True)  # for the channel, over both consumers
    got: list[Any] = []
    for q in (q1, q2):
        ch.basic_consume(q, lambda c, m, p, b: got.append(m))
    end = time.monotonic() + WAIT
    while len(got) < 3 and time.monotonic() < end:
        conn.process_data_events(0.05)
    conn.process_data_events(0.3)
    assert len(got) == 3
    ch.close()
    ch = conn.channel()
    q3 = f"size-{unique}"
    ch.queue_declare(q3)
    ch.confirm_delivery()
    for _ in range(4):
        ch.basic_publish("", q3, b"c" * 1000)
    ch.basic_qos(prefetch_size=2500, global_qos=True)  # room for two 1000-byte bodies
    sized: list[Any] = []
    ch.basic_consume(q3, lambda c, m, p, b: sized.append(m))
    end = time.monotonic() + WAIT
    while len(sized) < 2 and time.monotonic() < end:
        conn.process_data_events(0.05)
    conn.process_data_events(0.3)
    assert len(sized) == 2


def test_deleting_a_queue_cancels_its_consumers(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"cancelled-{unique}"
    ch.queue_declare(q)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume(q, lambda *a: None)
    other = conn.channel()
    other.queue_delete(q)
    end = time.monotonic() + WAIT
    while not cancelled and time.monotonic() < end:
        conn.process_data_events(0.05)
    assert cancelled and cancelled[0].method.NAME == "Basic.Cancel"


def test_internal_and_auto_delete_exchanges(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    internal, auto = f"int-{unique}", f"auto-{unique}"
    ch.exchange_declare(internal, "fanout", internal=True)
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.basic_publish(internal, "", b"x")
        ch.queue_declare(f"probe-{unique}")
    assert info.value.reply_code == 403
    ch = conn.channel()
    ch.exchange_declare(auto, "fanout", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, auto)
    ch.queue_unbind(q, auto)  # its last binding: the exchange goes
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.exchange_declare(auto, "fanout", passive=True)
    assert info.value.reply_code == 404
    # a transient exchange deleted (nothing of it was stored) goes too, the connection serving on
    ch = conn.channel()
    ch.exchange_declare(f"gone-{unique}", "direct")
    ch.exchange_delete(f"gone-{unique}")
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.exchange_declare(f"gone-{unique}", "direct", passive=True)
    assert info.value.reply_code == 404 and conn.is_open


def test_mqtt_and_amqp_share_a_topic(amqp_broker: Standalone, conn: pika.BlockingConnection,
                                     unique: str) -> None:
    import paho.mqtt.client as mqtt

    topic = f"readings-{unique}"
    ch = conn.channel()
    ch.exchange_declare(topic, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, topic)
    host, port = amqp_broker.addresses["mqtt"][0].rsplit("/", 1)[1].rsplit(":", 1)
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dev-{unique}")
    got: list[bytes] = []
    c.on_message = lambda client, userdata, msg: got.append(msg.payload)
    c.connect(host, int(port))
    c.loop_start()
    try:
        c.subscribe(topic, qos=1)
        c.publish(topic, b"from-mqtt", qos=1).wait_for_publish(WAIT)
        method, _, body = get(ch, q)
        assert body == b"from-mqtt"
        assert drain(ch, q, 1, timeout=0.3) == []
        ch.basic_publish(topic, "", b"from-amqp")
        end = time.monotonic() + WAIT
        while b"from-amqp" not in got and time.monotonic() < end:
            time.sleep(0.02)
        assert b"from-amqp" in got
    finally:
        c.loop_stop()
        c.disconnect()
