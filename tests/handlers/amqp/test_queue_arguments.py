"""RabbitMQ's queue arguments with pika against a real broker: TTLs (x-message-ttl and the
expiration property), length limits with both overflow behaviours, dead-lettering with
the x-death header, single active consumer, priorities, and the checks on the
arguments themselves."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pika
import pika.exceptions as pex
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.handlers.amqp.test_pika import WAIT, get

TTL = 200  # ms


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def until(what: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Whether ``what`` becomes true before ``timeout``."""
    end = time.monotonic() + timeout
    while not what():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def ready(ch: BlockingChannel, q: str) -> int:
    return int(ch.queue_declare(q, passive=True).method.message_count)


def gets(ch: BlockingChannel, q: str) -> list[bytes]:
    """Every message the queue has ready now, by basic.get."""
    out = []
    while True:
        method, _, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def pump(conn: pika.BlockingConnection, what: Callable[[], bool], timeout: float = WAIT) -> bool:
    end = time.monotonic() + timeout
    while not what():
        if time.monotonic() > end:
            return False
        conn.process_data_events(0.02)
    return True


# -- TTL -----------------------------------------------------------------------------------


def test_message_ttl_expires_what_waits_too_long(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"ttl-{unique}"
    ch.queue_declare(q, arguments={"x-message-ttl": TTL})
    ch.basic_publish("", q, b"fresh")
    assert get(ch, q)[2] == b"fresh", "delivered before its TTL"
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    assert until(lambda: ready(ch, q) == 0), "expired messages leave the queue by themselves"
    assert ch.basic_get(q)[0] is None


def test_per_message_expiration(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"expiration-{unique}"
    ch.queue_declare(q)
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration=str(TTL)))
    ch.basic_publish("", q, b"keeps")
    assert until(lambda: ready(ch, q) == 1), "the expired head goes"
    assert gets(ch, q) == [b"keeps"]


def test_expiration_zero_is_delivered_only_at_once(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"now-or-never-{unique}"
    ch.queue_declare(q)
    ch.basic_publish("", q, b"nobody", pika.BasicProperties(expiration="0"))
    ch.basic_publish("", q, b"marker")
    assert get(ch, q)[2] == b"marker", "with no consumer, expiration 0 is dropped"
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"taken", pika.BasicProperties(expiration="0"))
    assert pump(conn, lambda: got == [b"taken"]), "a consumer with room gets it at once"


# -- length limits -------------------------------------------------------------------------


def test_max_length_drop_head_dead_letters_the_oldest(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q, dlq, dlx = f"maxlen-{unique}", f"maxlen-dead-{unique}", f"maxlen-dlx-{unique}"
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-dead-letter-exchange": dlx})
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    assert until(lambda: ready(ch, dlq) == 3), "three over the limit"
    assert gets(ch, q) == [b"3", b"4"]
    dead = []
    for _ in range(3):
        _, props, body = get(ch, dlq)
        dead.append(body)
        assert _s(props.headers["x-death"][0]["reason"]) == "maxlen"
    assert dead == [b"0", b"1", b"2"]


def test_max_length_bytes_counts_ready_bodies(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q, dlq, dlx = f"maxbytes-{unique}", f"maxbytes-dead-{unique}", f"maxbytes-dlx-{unique}"
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    ch.queue_declare(q, arguments={"x-max-length-bytes": 10, "x-dead-letter-exchange": dlx})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        ch.basic_publish("", q, body)
    assert until(lambda: ready(ch, dlq) == 1)
    assert gets(ch, q) == [b"bbbb", b"cccc"]
    assert get(ch, dlq)[2] == b"aaaa"


def test_reject_publish_nacks_with_confirms_and_drops_without(
        conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"reject-publish-{unique}"
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(pex.NackError):
        ch.basic_publish("", q, b"3")
    plain = conn.channel()
    plain.basic_publish("", q, b"4")  # no confirms: dropped for this queue, silently
    assert get(ch, q)[2] == b"1"
    assert get(ch, q)[2] == b"2"
    plain.basic_publish("", q, b"5")
    assert get(ch, q)[2] == b"5", "the refused ones never reached the queue"
    assert ch.basic_get(q)[0] is None


# -- dead-lettering ------------------------------------------------------------------------


def test_rejected_messages_are_dead_lettered_with_x_death(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q1, q2 = f"dl-one-{unique}", f"dl-two-{unique}"
    # each dead-letters into the other through the default exchange
    ch.queue_declare(q1, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q2})
    ch.queue_declare(q2, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q1})
    ch.basic_publish("", q1, b"m", pika.BasicProperties(headers={"app": "kept"}))
    method, _, _ = get(ch, q1, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get(ch, q2, auto_ack=False)
    assert body == b"m" and method.routing_key == q2 and method.exchange == ""
    h = props.headers
    assert _s(h["app"]) == "kept"
    (death,) = h["x-death"]
    assert death["count"] == 1 and _s(death["reason"]) == "rejected" and _s(death["queue"]) == q1
    assert _s(death["exchange"]) == "" and [_s(k) for k in death["routing-keys"]] == [q1]
    assert isinstance(death["time"], datetime)
    assert (_s(h["x-first-death-reason"]), _s(h["x-first-death-queue"]),
            _s(h["x-first-death-exchange"])) == ("rejected", q1, "")
    ch.basic_nack(method.delivery_tag, requeue=False)
    method, props, _ = get(ch, q1, auto_ack=False)
    assert [(_s(d["queue"]), d["count"]) for d in props.headers["x-death"]] == [(q2, 1), (q1, 1)]
    ch.basic_reject(method.delivery_tag, requeue=False)
    _, props, _ = get(ch, q2)
    deaths = props.headers["x-death"]
    assert [(_s(d["queue"]), d["count"]) for d in deaths] == [(q1, 2), (q2, 1)], \
        "the same queue and reason again: counted, and first"
    assert _s(props.headers["x-first-death-queue"]) == q1


def test_expired_messages_go_to_the_dlx_with_its_routing_key(
        conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q, dlq, dlx = f"delay-{unique}", f"delay-dead-{unique}", f"delay-dlx-{unique}"
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, routing_key="dead")
    ch.queue_declare(q, arguments={"x-message-ttl": TTL, "x-dead-letter-exchange": dlx,
                                   "x-dead-letter-routing-key": "dead"})
    ch.basic_publish("", q, b"late")
    ch.basic_publish("", q, b"later", pika.BasicProperties(expiration="100"))
    method, props, body = get(ch, dlq)
    assert body == b"late" and method.exchange == dlx and method.routing_key == "dead"
    (death,) = props.headers["x-death"]
    assert _s(death["reason"]) == "expired" and _s(death["queue"]) == q
    assert [_s(k) for k in death["routing-keys"]] == [q]
    _, props, body = get(ch, dlq)
    assert body == b"later"
    assert props.expiration is None, "the expiration does not follow it"
    assert _s(props.headers["x-death"][0]["original-expiration"]) == "100"


def test_without_a_dlx_a_rejected_message_is_dropped(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"no-dlx-{unique}"
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": f"missing-{unique}"})
    ch.basic_publish("", q, b"x")
    method, _, _ = get(ch, q, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.basic_get(q)[0] is None


# -- single active consumer ----------------------------------------------------------------


def test_single_active_consumer_hands_over_in_order(conn: pika.BlockingConnection, unique: str) -> None:
    pub = conn.channel()
    pub.confirm_delivery()
    q = f"sac-{unique}"
    pub.queue_declare(q, arguments={"x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"a": [], "b": [], "c": []}
    chans = {}
    for name in "abc":
        chans[name] = conn.channel()
        chans[name].basic_consume(q, lambda c, m, p, b, n=name: got[n].append(b), auto_ack=True,
                                  consumer_tag=f"{name}-{unique}")
    for i in range(4):
        pub.basic_publish("", q, b"%d" % i)
    assert pump(conn, lambda: len(got["a"]) == 4)
    assert got["b"] == [] and got["c"] == []
    chans["a"].basic_cancel(f"a-{unique}")
    pub.basic_publish("", q, b"4")
    assert pump(conn, lambda: got["b"] == [b"4"])
    chans["b"].close()
    pub.basic_publish("", q, b"5")
    assert pump(conn, lambda: got["c"] == [b"5"])
    assert got["a"] == [b"0", b"1", b"2", b"3"]


# -- priorities ----------------------------------------------------------------------------


def test_max_priority_serves_the_highest_first(conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"prio-{unique}"
    ch.queue_declare(q, arguments={"x-max-priority": 10})
    for body, priority in ((b"p1", 1), (b"p5a", 5), (b"none", None), (b"p5b", 5),
                           (b"p20", 20), (b"p10", 10), (b"p3", 3)):
        ch.basic_publish("", q, body, pika.BasicProperties(priority=priority))
    assert until(lambda: ready(ch, q) == 7)
    assert gets(ch, q) == [b"p20", b"p10", b"p5a", b"p5b", b"p3", b"p1", b"none"], \
        "over the max counts as the max; FIFO within a priority"


# -- the arguments themselves --------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "problem"), [
    ({"x-message-ttl": "1000"}, "{unacceptable_type,longstr}"),
    ({"x-message-ttl": -1}, "{value_negative,-1}"),
    ({"x-max-length": -5}, "{value_negative,-5}"),
    ({"x-max-length-bytes": "big"}, "{unacceptable_type,longstr}"),
    ({"x-overflow": "bogus"}, "invalid_overflow"),
    ({"x-single-active-consumer": "yes"}, "{unacceptable_type,longstr}"),
    ({"x-max-priority": 300}, "{max_value_exceeded,300}"),
    ({"x-dead-letter-exchange": 5}, "{unacceptable_type,signedint}"),
])
def test_invalid_arguments_are_precondition_failed(conn: pika.BlockingConnection, unique: str,
                                                   arguments: dict[str, Any], problem: str) -> None:
    ch = conn.channel()
    q = f"bad-args-{unique}"
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(q, arguments=arguments)
    name = next(iter(arguments))
    assert info.value.reply_code == 406
    assert info.value.reply_text.startswith(
        f"PRECONDITION_FAILED - invalid arg '{name}' for queue '{q}' in vhost '/': ")
    assert problem in info.value.reply_text
    assert conn.channel().queue_declare(q).method.queue == q, "nothing was declared"


def test_redeclaring_with_other_arguments_is_precondition_failed(
        conn: pika.BlockingConnection, unique: str) -> None:
    ch = conn.channel()
    q = f"args-differ-{unique}"
    ch.queue_declare(q, arguments={"x-message-ttl": 1000})
    ch.queue_declare(q, arguments={"x-message-ttl": 1000})
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(q, arguments={"x-message-ttl": 2000})
    assert info.value.reply_code == 406 and "inequivalent arg" in info.value.reply_text
