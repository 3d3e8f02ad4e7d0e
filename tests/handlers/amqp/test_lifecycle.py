"""What ends queues and connections, against a real broker: ``x-expires`` (an unused queue
goes, with its subscriptions), heartbeats (a silent client is closed after two missed
intervals, a live one stays), and the limits of ``amqpChannelMax``,
``amqpMaxConnectionsPerVhost`` and ``amqpFrameMax``."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions as pex
import pytest

from handlers.amqp._codec import (
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    FrameReader,
    Method,
    decode_method,
    encode_frame,
    encode_method,
)
from handlers.amqp._model import queue_subscription
from tests._standalone import Standalone
from tests.handlers.amqp.conftest import AMQP_CONF, amqp_port
from tests.handlers.amqp.test_pika import WAIT, get

EXPIRES = 300  # ms
CHANNEL_MAX = 2
FRAME_MAX = 8192
MAX_CONNECTIONS = 2
LIMITED_VHOST = "limited"


def until(what: Callable[[], Any], timeout: float = WAIT) -> Any:
    """``what()`` once it is true, or its last (false) value after ``timeout``."""
    end = time.monotonic() + timeout
    while not (got := what()) and time.monotonic() < end:
        time.sleep(0.02)
    return got


def _web(s: Standalone, path: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(s.addresses["web"][0] + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def _queue_names(s: Standalone) -> set[str]:
    return {q["name"] for q in _web(s, "/admin/v2/amqp/vhosts/%2F/queues")}


def _subscriptions(s: Standalone, topic: str) -> list[str]:
    return list(_web(s, f"/admin/v2/persistent/public/default/{topic}/subscriptions"))


# -- a raw client ---------------------------------------------------------------------------


class Raw:
    """An AMQP client on a plain socket: it sends exactly what a test says, nothing more
    (no heartbeats unless asked)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.frames = FrameReader(frame_max=0)

    def close(self) -> None:
        self.sock.close()

    def next_frame(self) -> Any:
        """The next frame, None when the broker closed the socket."""
        while (frame := self.frames.next()) is None:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:  # closed with bytes of ours unread
                return None
            if not chunk:
                return None
            self.frames.feed(chunk)
        return frame

    def method(self) -> Method | None:
        """The next method frame (heartbeats skipped), None when the socket is closed."""
        while (frame := self.next_frame()) is not None:
            if frame.type == FRAME_METHOD:
                return decode_method(frame.payload)
        return None

    def open(self, *, heartbeat: int = 0, vhost: str = "/") -> dict[str, Any]:
        """The handshake up to connection.open-ok; the broker's connection.tune arguments."""
        self.sock.sendall(PROTOCOL_HEADER)
        start = self.method()
        assert start is not None and start.name == "connection.start"
        self.sock.sendall(encode_method(0, "connection.start-ok", client_properties={},
                                        mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"))
        tune = self.method()
        assert tune is not None and tune.name == "connection.tune"
        self.sock.sendall(encode_method(0, "connection.tune-ok", channel_max=0,
                                        frame_max=tune.args["frame_max"], heartbeat=heartbeat))
        self.sock.sendall(encode_method(0, "connection.open", virtual_host=vhost))
        opened = self.method()
        assert opened is not None and opened.name == "connection.open-ok", opened
        return dict(tune.args)


@pytest.fixture
def raw(amqp_broker: Standalone) -> Iterator[Raw]:
    r = Raw(amqp_port(amqp_broker))
    try:
        yield r
    finally:
        r.close()


# -- x-expires ------------------------------------------------------------------------------


def test_an_unused_queue_expires_with_its_subscriptions(amqp_broker: Standalone,
                                                        conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ex, q = f"exp-{unique}", f"exp-q-{unique}"
    ch.exchange_declare(ex, "fanout", durable=True)
    ch.queue_declare(q, durable=True, arguments={"x-expires": EXPIRES})
    tag = ch.basic_consume(q, lambda *_: None)  # in use: it cannot expire meanwhile
    ch.queue_bind(q, ex)
    assert queue_subscription(q) in _subscriptions(amqp_broker, ex)
    unused_since = time.monotonic()
    ch.basic_cancel(tag)
    assert until(lambda: q not in _queue_names(amqp_broker)), "the unused queue was not deleted"
    assert time.monotonic() - unused_since >= EXPIRES / 1000
    assert until(lambda: queue_subscription(q) not in _subscriptions(amqp_broker, ex))
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 404
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(ex, "", b"to nowhere")  # the exchange stays and routes to no queue


def test_a_consumer_a_get_or_a_redeclare_keeps_a_queue_and_its_end_starts_the_clock(
        amqp_broker: Standalone, conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    args = {"x-expires": 2000}  # room for a slow round of uses on a busy machine
    consumed, got, redeclared = f"exp-c-{unique}", f"exp-g-{unique}", f"exp-d-{unique}"
    ch.queue_declare(consumed, arguments=args)
    tag = ch.basic_consume(consumed, lambda *_: None, auto_ack=True)
    ch.queue_declare(redeclared, arguments=args)
    ch.basic_publish("", redeclared, b"kept")  # a queue that expired and came back would be empty
    ch.queue_declare(got, arguments=args)
    end = time.monotonic() + 3.0
    while time.monotonic() < end:  # longer than an interval, in use
        assert ch.basic_get(got)[0] is None  # a 404 if it had expired
        assert ch.queue_declare(redeclared, arguments=args).method.message_count == 1
        conn.process_data_events(time_limit=0.05)
    assert {consumed, got, redeclared} <= _queue_names(amqp_broker)
    ch.basic_cancel(tag)
    assert until(lambda: not {consumed, got, redeclared} & _queue_names(amqp_broker))


def test_a_queue_that_expires_is_declared_again_afresh(amqp_broker: Standalone,
                                                       conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"exp-again-{unique}"
    ch.queue_declare(q, arguments={"x-expires": EXPIRES})
    ch.basic_publish("", q, b"old")
    assert until(lambda: q not in _queue_names(amqp_broker))
    assert ch.queue_declare(q).method.message_count == 0
    ch.basic_publish("", q, b"new")
    method, _, body = get(ch, q)
    assert body == b"new"
    assert q in _queue_names(amqp_broker)  # no x-expires now: it stays


# -- heartbeats -----------------------------------------------------------------------------


def test_a_silent_client_is_closed_after_two_missed_heartbeats(raw: Raw) -> None:
    raw.open(heartbeat=1)
    opened = time.monotonic()
    heartbeats = 0
    while (frame := raw.next_frame()) is not None:
        heartbeats += frame.type == FRAME_HEARTBEAT
    silent_for = time.monotonic() - opened
    assert 1.5 <= silent_for <= 4.0, silent_for
    assert heartbeats >= 2  # the broker sent its own meanwhile


def test_a_silent_client_is_closed_before_connection_open_too(amqp_broker: Standalone) -> None:
    r = Raw(amqp_port(amqp_broker))
    try:
        r.sock.sendall(PROTOCOL_HEADER)
        assert r.method() is not None  # connection.start
        r.sock.sendall(encode_method(0, "connection.start-ok", client_properties={},
                                     mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"))
        tune = r.method()
        assert tune is not None and tune.name == "connection.tune"
        r.sock.sendall(encode_method(0, "connection.tune-ok", channel_max=0,
                                     frame_max=tune.args["frame_max"], heartbeat=1))
        tuned = time.monotonic()
        while r.next_frame() is not None:
            pass
        assert time.monotonic() - tuned <= 4.0
    finally:
        r.close()


def test_a_client_that_heartbeats_stays_connected(params: pika.ConnectionParameters, unique: str) -> None:
    c = pika.BlockingConnection(pika.ConnectionParameters(params.host, params.port,
                                                          credentials=params.credentials,
                                                          connection_attempts=1, heartbeat=1))
    try:
        ch = c.channel()
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            c.process_data_events(time_limit=0.25)
        assert c.is_open
        assert ch.queue_declare(f"hb-{unique}").method.queue == f"hb-{unique}"
    finally:
        if c.is_open:
            c.close()


# -- limits ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("amqp-limits")
    s = Standalone(data, conf={**AMQP_CONF, "amqpChannelMax": CHANNEL_MAX, "amqpFrameMax": FRAME_MAX,
                               "amqpMaxConnectionsPerVhost": MAX_CONNECTIONS}).start()
    try:
        _web(s, f"/admin/v2/namespaces/public/{LIMITED_VHOST}", "PUT", {})
        yield s
    finally:
        s.kill()


def _close_of(r: Raw) -> Method:
    m = r.method()
    assert m is not None and m.name == "connection.close", m
    r.sock.sendall(encode_method(0, "connection.close-ok"))
    return m


def test_a_channel_over_channel_max_closes_the_connection(limited: Standalone) -> None:
    r = Raw(amqp_port(limited))
    try:
        tune = r.open()
        assert tune["channel_max"] == CHANNEL_MAX
        for n in range(1, CHANNEL_MAX + 1):
            r.sock.sendall(encode_method(n, "channel.open"))
            opened = r.method()
            assert opened is not None and opened.name == "channel.open-ok"
        r.sock.sendall(encode_method(CHANNEL_MAX + 1, "channel.open"))
        close = _close_of(r)
        assert close.args["reply_code"] == 530 and "NOT_ALLOWED" in close.args["reply_text"]
        assert (close.args["class_id"], close.args["method_id"]) == (20, 10)
    finally:
        r.close()
    # pika agrees to the lower channel_max, and refuses a third channel itself
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port(limited),
                                                          connection_attempts=1))
    try:
        assert c._impl.params.channel_max == CHANNEL_MAX
        c.channel(), c.channel()
        with pytest.raises(pex.NoFreeChannels):
            c.channel()
    finally:
        c.close()


@pytest.mark.parametrize("asked", [{"channel_max": CHANNEL_MAX + 1}, {"frame_max": FRAME_MAX + 1}])
def test_a_tune_ok_over_what_the_broker_offered_is_refused(limited: Standalone, asked: dict[str, int]) -> None:
    r = Raw(amqp_port(limited))
    try:
        r.sock.sendall(PROTOCOL_HEADER)
        r.method()
        r.sock.sendall(encode_method(0, "connection.start-ok", client_properties={},
                                     mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"))
        r.method()
        r.sock.sendall(encode_method(0, "connection.tune-ok", **asked))
        close = _close_of(r)
        [(what, value)] = asked.items()
        assert close.args["reply_code"] == 530
        assert close.args["reply_text"] == (f"NOT_ALLOWED - negotiated {what} = {value} is higher than "
                                            f"the maximum allowed value ({value - 1})")
        assert (close.args["class_id"], close.args["method_id"]) == (10, 31)
    finally:
        r.close()


def test_one_connection_over_the_vhost_limit_is_refused(limited: Standalone) -> None:
    def connect() -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", amqp_port(limited), virtual_host=LIMITED_VHOST, connection_attempts=1))

    conns = [connect() for _ in range(MAX_CONNECTIONS)]
    try:
        with pytest.raises(pex.ProbableAccessDeniedError) as info:
            connect()
        assert "(530)" in str(info.value) and "connection limit (2) is reached" in str(info.value)
        r = Raw(amqp_port(limited))  # the raw view: connection.close 530 in reply to connection.open
        try:
            r.sock.sendall(PROTOCOL_HEADER)
            r.method()
            r.sock.sendall(encode_method(0, "connection.start-ok", client_properties={},
                                         mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"))
            r.method()
            r.sock.sendall(encode_method(0, "connection.tune-ok", frame_max=FRAME_MAX))
            r.sock.sendall(encode_method(0, "connection.open", virtual_host=LIMITED_VHOST))
            close = _close_of(r)
            assert close.args["reply_code"] == 530
            assert (close.args["class_id"], close.args["method_id"]) == (10, 40)
        finally:
            r.close()
        # the limit is per vhost: "/" still takes connections
        other = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port(limited),
                                                                  connection_attempts=1))
        other.close()
        conns.pop().close()

        def reconnect() -> pika.BlockingConnection | None:
            try:
                return connect()
            except pex.ProbableAccessDeniedError:
                return None

        again = until(reconnect)  # a closed connection frees its place
        assert again is not None
        conns.append(again)
    finally:
        for c in conns:
            if c.is_open:
                c.close()


def test_a_frame_over_frame_max_is_frame_error_and_the_broker_keeps_serving(limited: Standalone,
                                                                            unique: str) -> None:
    r = Raw(amqp_port(limited))
    try:
        assert r.open()["frame_max"] == FRAME_MAX
        r.sock.sendall(encode_method(1, "channel.open"))
        opened = r.method()
        assert opened is not None and opened.name == "channel.open-ok"
        payload = encode_method(1, "basic.publish", exchange="", routing_key="x")[7:-1]
        r.sock.sendall(encode_frame(FRAME_METHOD, 1, payload + b"\0" * FRAME_MAX))
        close = _close_of(r)
        assert close.args["reply_code"] == 501 and "FRAME_ERROR" in close.args["reply_text"]
        assert r.next_frame() is None  # and the socket closed
    finally:
        r.close()
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port(limited),
                                                          connection_attempts=1))
    try:
        ch = c.channel()
        q = f"after-{unique}"
        ch.queue_declare(q)
        ch.basic_publish("", q, b"x" * (3 * FRAME_MAX))  # pika splits it into frames that fit
        assert get(ch, q)[2] == b"x" * (3 * FRAME_MAX)
    finally:
        c.close()

