"""pika (RabbitMQ's Python client) against a real standalone broker: the exchange types,
queues, consuming and getting, acknowledgements, prefetch, confirms, returns,
transactions, and the errors RabbitMQ gives."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pika
import pika.exceptions as pex
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests._standalone import Standalone
from tests.handlers.amqp.conftest import MAX_BODY, amqp_port

WAIT = 10.0


def drain(ch: BlockingChannel, queue: str, n: int, *, auto_ack: bool = True,
          timeout: float = WAIT) -> list[tuple[Any, Any, bytes]]:
    """Consume ``n`` messages of ``queue`` (or what arrives before ``timeout``)."""
    got: list[tuple[Any, Any, bytes]] = []
    for method, props, body in ch.consume(queue, auto_ack=auto_ack, inactivity_timeout=timeout):
        if method is None:
            break
        got.append((method, props, body))
        if len(got) >= n:
            break
    ch.cancel()
    return got


def get(ch: BlockingChannel, queue: str, *, auto_ack: bool = True, timeout: float = WAIT) -> Any:
    """basic.get until a message comes (or ``timeout``)."""
    end = time.monotonic() + timeout
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None or time.monotonic() > end:
            return method, props, body
        time.sleep(0.02)


def test_default_exchange_publish_get_and_consume(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"plain-{unique}"
    ok = ch.queue_declare(q)
    assert ok.method.queue == q and ok.method.message_count == 0
    for i in range(5):
        ch.basic_publish("", q, b"m%d" % i)
    method, _, body = get(ch, q)
    assert body == b"m0" and method.routing_key == q and method.exchange == ""
    got = drain(ch, q, 4)
    assert [b for _, _, b in got] == [b"m1", b"m2", b"m3", b"m4"]
    assert ch.basic_get(q)[0] is None


def test_every_basic_property_round_trips(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"props-{unique}"
    ch.queue_declare(q)
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8",
        headers={"s": "text", "n": 42, "big": 1 << 40, "b": True, "nested": {"k": "v"},
                 "list": [1, "two"]},
        delivery_mode=2, priority=5, correlation_id="corr-1", reply_to="replies",
        expiration="60000", message_id="id-1", timestamp=1_700_000_000, type="kind",
        user_id="guest", app_id="app", cluster_id="c1")
    ch.basic_publish("", q, b"{}", props)
    _, got, body = get(ch, q)
    assert body == b"{}"
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
                 "cluster_id"):
        assert getattr(got, name) == getattr(props, name), name
    assert got.headers["s"] == b"text" or got.headers["s"] == "text"
    assert got.headers["n"] == 42 and got.headers["big"] == 1 << 40 and got.headers["b"] is True
    assert got.headers["nested"]["k"] in ("v", b"v")
    assert [x if not isinstance(x, bytes) else x.decode() for x in got.headers["list"]] == [1, "two"]


@pytest.mark.parametrize(("kind", "bindings", "published", "expect"), [
    ("direct", {"a": ["red"], "b": ["green", "red"]},
     [("red", None), ("green", None), ("blue", None)], {"a": 1, "b": 2}),
    ("fanout", {"a": [""], "b": ["ignored"]}, [("x", None), ("y", None)], {"a": 2, "b": 2}),
    ("topic", {"a": ["*.orange.*"], "b": ["*.*.rabbit", "lazy.#"]},
     [("quick.orange.rabbit", None), ("lazy.orange.elephant", None), ("quick.orange.fox", None),
      ("lazy.brown.fox", None), ("lazy", None), ("quick.brown.fox", None),
      ("quick.orange.male.rabbit", None)], {"a": 3, "b": 4}),
    ("headers", {"a": [{"x-match": "all", "format": "pdf", "type": "report"}],
                 "b": [{"x-match": "any", "format": "pdf", "type": "log"}]},
     [("", {"format": "pdf", "type": "report"}), ("", {"format": "pdf", "type": "log"}),
      ("", {"format": "zip", "type": "log"}), ("", {"format": "zip"})], {"a": 1, "b": 3}),
])
def test_exchange_types_route_as_rabbitmq(conn: pika.BlockingConnection, unique: str, kind: str,
                                          bindings: dict[str, list[Any]],
                                          published: list[tuple[str, Any]],
                                          expect: dict[str, int]) -> None:
    ch = conn.channel()
    ex = f"ex-{kind}-{unique}"
    ch.exchange_declare(ex, kind)
    for q, keys in bindings.items():
        ch.queue_declare(f"{ex}-{q}", exclusive=True)
        for k in keys:
            if isinstance(k, dict):
                ch.queue_bind(f"{ex}-{q}", ex, arguments=k)
            else:
                ch.queue_bind(f"{ex}-{q}", ex, routing_key=k)
    ch.confirm_delivery()
    for key, headers in published:
        ch.basic_publish(ex, key, b"x", pika.BasicProperties(headers=headers))
    for q, n in expect.items():
        got = drain(ch, f"{ex}-{q}", n + 1, timeout=0.5 if n == 0 else 1.5)
        assert len(got) == n, (q, [m.routing_key for m, _, _ in got])


def test_exchange_to_exchange_binding(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    up, down = f"up-{unique}", f"down-{unique}"
    ch.exchange_declare(up, "topic")
    ch.exchange_declare(down, "direct")
    ch.exchange_bind(down, up, routing_key="logs.#")
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-")
    ch.queue_bind(q, down, routing_key="logs.error")
    ch.confirm_delivery()
    for key in ("logs.error", "logs.info", "metrics.error"):
        ch.basic_publish(up, key, key.encode())
    got = drain(ch, q, 2, timeout=1.5)
    assert [b for _, _, b in got] == [b"logs.error"]


def test_ack_nack_reject_and_redelivery(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"acks-{unique}"
    ch.queue_declare(q)
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i)
    m0, _, b0 = get(ch, q, auto_ack=False)
    assert b0 == b"0" and not m0.redelivered
    ch.basic_nack(m0.delivery_tag, requeue=True)
    m0b, _, b0b = get(ch, q, auto_ack=False)
    assert b0b == b"0" and m0b.redelivered
    ch.basic_reject(m0b.delivery_tag, requeue=False)  # dropped
    m1, _, _ = get(ch, q, auto_ack=False)
    m2, _, _ = get(ch, q, auto_ack=False)
    ch.basic_ack(m2.delivery_tag, multiple=True)  # acks 1 and 2
    m3, _, b3 = get(ch, q, auto_ack=False)
    assert b3 == b"3"
    # closing the channel gives the unacknowledged one back
    ch.close()
    ch2 = conn.channel()
    m3b, _, b3b = get(ch2, q, auto_ack=True)
    assert b3b == b"3" and m3b.redelivered
    assert ch2.basic_get(q)[0] is None


def test_unknown_delivery_tag_closes_the_channel_with_precondition_failed(
        conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.basic_ack(12345)
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(f"after-{unique}")
    assert info.value.reply_code == 406 and "unknown delivery tag" in info.value.reply_text
    # the connection and its other channels are untouched
    other = conn.channel()
    assert other.queue_declare(f"after-{unique}").method.queue == f"after-{unique}"


def test_prefetch_limits_unacknowledged_deliveries(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"prefetch-{unique}"
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=3)
    got: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m))
    end = time.monotonic() + WAIT
    while len(got) < 3 and time.monotonic() < end:
        conn.process_data_events(0.05)
    conn.process_data_events(0.3)
    assert len(got) == 3, "no more than the prefetch count unacknowledged"
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    while len(got) < 6 and time.monotonic() < end:
        conn.process_data_events(0.05)
    conn.process_data_events(0.3)
    assert len(got) == 6


def test_confirms_and_mandatory_returns(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"confirmed-{unique}"
    ch.queue_declare(q, durable=True)
    for i in range(20):
        ch.basic_publish("", q, b"%d" % i, pika.BasicProperties(delivery_mode=2), mandatory=True)
    with pytest.raises(pex.UnroutableError) as info:
        ch.basic_publish("", f"nowhere-{unique}", b"lost", mandatory=True)
    assert info.value.messages[0].method.reply_code == 312
    assert info.value.messages[0].body == b"lost"
    assert len(drain(ch, q, 20)) == 20


def test_transactions_commit_and_rollback(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"tx-{unique}"
    ch.queue_declare(q)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    ch.tx_rollback()
    ch.basic_publish("", q, b"committed")
    assert ch.basic_get(q)[0] is None, "an uncommitted publish is in no queue"
    ch.tx_commit()
    method, _, body = get(ch, q, auto_ack=False)
    assert body == b"committed"
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()  # the ack is undone: the message is still unacknowledged
    ch.close()
    ch2 = conn.channel()
    again, _, body2 = get(ch2, q)
    assert body2 == b"committed" and again.redelivered
    assert ch2.basic_get(q)[0] is None


def test_declare_errors_are_rabbitmqs(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(f"missing-{unique}", passive=True)
    assert info.value.reply_code == 404
    ch = conn.channel()
    ch.queue_declare(f"d-{unique}", durable=True)
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(f"d-{unique}", durable=False)
    assert info.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.exchange_declare(f"nope-{unique}", passive=True)
    assert info.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.basic_publish(f"no-exchange-{unique}", "k", b"x")
        ch.queue_declare(f"x-{unique}")
    assert info.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare("amq.mine")
    assert info.value.reply_code == 403
    ch = conn.channel()
    ch.queue_declare(f"busy-{unique}")
    ch.basic_publish("", f"busy-{unique}", b"x")
    get(ch, f"busy-{unique}", auto_ack=False)
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_delete(f"busy-{unique}", if_empty=True)
    assert info.value.reply_code == 406


def test_exclusive_queue_is_locked_to_its_connection_and_goes_with_it(
        params: pika.ConnectionParameters, unique: str) -> None:
    owner = pika.BlockingConnection(params)
    other = pika.BlockingConnection(params)
    try:
        q = f"mine-{unique}"
        owner.channel().queue_declare(q, exclusive=True)
        with pytest.raises(pex.ChannelClosedByBroker) as info:
            other.channel().basic_consume(q, lambda *a: None)
        assert info.value.reply_code == 405
        owner.close()
        ch = other.channel()
        end = time.monotonic() + WAIT
        while True:
            try:
                ch.queue_declare(q, passive=True)
            except pex.ChannelClosedByBroker as exc:
                assert exc.reply_code == 404
                break
            assert time.monotonic() < end, "the exclusive queue outlived its connection"
            time.sleep(0.05)
    finally:
        for c in (owner, other):
            if c.is_open:
                c.close()


def test_auto_delete_queue_goes_with_its_last_consumer(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"auto-{unique}"
    ch.queue_declare(q, auto_delete=True)
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)
    end = time.monotonic() + WAIT
    while True:
        probe = conn.channel()
        try:
            probe.queue_declare(q, passive=True)
        except pex.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404
            break
        assert time.monotonic() < end
        time.sleep(0.05)


def test_large_body_over_many_frames(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"big-{unique}"
    ch.queue_declare(q)
    ch.confirm_delivery()
    # 16 MiB: 128 frames of 128 KiB in, four chunked entries of maxMessageSize stored
    body = os.urandom(16 << 20)
    ch.basic_publish("", q, body, pika.BasicProperties(headers={"h": "v"}, message_id="m-16"))
    _, props, got = get(ch, q)
    assert got == body and props.headers == {"h": "v"} and props.message_id == "m-16"
    ch.basic_publish("", q, body[:1000])  # what comes after a chunked message still does
    assert get(ch, q)[2] == body[:1000]


def test_a_body_over_the_largest_message_closes_the_channel(
        conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        # the close may come while pika still sends the body, or at the next call
        ch.basic_publish("", f"big-{unique}", b"x" * (MAX_BODY + 1))
        ch.queue_declare(f"after-big-{unique}")
    assert info.value.reply_code == 406 and "larger than configured max size" in info.value.reply_text
    assert conn.channel().queue_declare(f"after-big-{unique}").method.message_count == 0


def test_rpc_with_reply_to_and_correlation_id(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    server_q = f"rpc-{unique}"
    ch.queue_declare(server_q)
    reply_q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", server_q, b"6", pika.BasicProperties(reply_to=reply_q, correlation_id="c-7"))
    method, props, body = get(ch, server_q)
    ch.basic_publish("", props.reply_to, str(int(body) * 7).encode(),
                     pika.BasicProperties(correlation_id=props.correlation_id))
    _, rprops, answer = get(ch, reply_q)
    assert answer == b"42" and rprops.correlation_id == "c-7"


def test_wrong_credentials_are_access_refused(params: pika.ConnectionParameters) -> None:
    bad = pika.ConnectionParameters(params.host, params.port,
                                    credentials=pika.PlainCredentials("guest", "wrong"),
                                    connection_attempts=1)
    with pytest.raises(pex.ProbableAuthenticationError) as info:
        pika.BlockingConnection(bad)
    assert "ACCESS_REFUSED" in str(info.value)


def test_unknown_vhost_is_not_allowed(params: pika.ConnectionParameters) -> None:
    bad = pika.ConnectionParameters(params.host, params.port, virtual_host="no-such-vhost",
                                    credentials=params.credentials, connection_attempts=1)
    with pytest.raises(pex.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(bad)
    assert "(530)" in str(info.value) and "NOT_ALLOWED" in str(info.value)


def test_a_wrong_protocol_header_gets_ours(amqp_broker: Standalone) -> None:
    with socket.create_connection(("127.0.0.1", amqp_port(amqp_broker)), timeout=5) as s:
        s.sendall(b"AMQP\x01\x01\x00\x0a")
        assert s.recv(8) == b"AMQP\x00\x00\x09\x01"
        assert s.recv(8) == b""


def test_a_bad_frame_end_is_frame_error_and_the_broker_keeps_serving(
        amqp_broker: Standalone, conn: pika.BlockingConnection, unique: str) -> None:
    with socket.create_connection(("127.0.0.1", amqp_port(amqp_broker)), timeout=5) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        start = s.recv(65536)
        assert start[:1] == b"\x01"  # connection.start
        s.sendall(b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0b\x00")  # no 0xCE at the end
        closing = b""
        end = time.monotonic() + WAIT
        while len(closing) < 13 and time.monotonic() < end:
            chunk = s.recv(65536)
            if not chunk:
                break
            closing += chunk
        # connection.close (10, 50) with reply code 501
        assert closing[7:11] == b"\x00\x0a\x00\x32" and closing[11:13] == (501).to_bytes(2, "big")
    ch = conn.channel()
    assert ch.queue_declare(f"alive-{unique}").method.queue == f"alive-{unique}"
