"""The AMQP 0-9-1 method table: every class and method Magnetar speaks, with each
method's arguments in wire order and their wire types.

Transcribed from rabbitmq-codegen's ``amqp-rabbitmq-0.9.1.json`` (commit 5df4512d), which is
the spec's ``amqp0-9-1.xml`` with RabbitMQ's extensions: exchange.bind/unbind (40.30-40.51),
basic.nack (60.120), confirm (85), connection.blocked/unblocked (10.60/61) and
connection.update-secret (10.70/71). Domains are resolved to their wire types (spec 4.2.5).

Names: a method is ``"<class>.<method>"`` in the spec's spelling (``"basic.consume-ok"``);
an argument is the spec's name with ``-`` turned into ``_`` (``"no-ack"`` -> ``"no_ack"``,
``"nowait"`` stays ``"nowait"``, basic.qos keeps ``"global"``).

The access class (30) is left out: 0-9-1 deprecates it and RabbitMQ does not implement it,
so its ids decode as an unknown class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["FieldType", "MethodSpec", "CLASSES", "METHODS", "METHODS_BY_ID", "METHODS_BY_NAME",
           "BASIC_CLASS_ID", "BASIC_PROPERTIES"]

FieldType = Literal["bit", "octet", "short", "long", "longlong", "shortstr", "longstr",
                    "table", "timestamp"]
"""A wire type (spec 4.2.5): bit; octet, short, long, longlong are unsigned 8, 16, 32 and 64
bit integers; shortstr has a one-octet length, longstr a four-octet one; table is a field
table; timestamp is 64-bit POSIX seconds."""


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """One method: its ids, its name, its arguments in wire order, whether the peer must
    answer it before sending anything else on the channel (``synchronous``) and whether
    content (a header frame and body frames) follows it (``content``)."""

    class_id: int
    method_id: int
    name: str
    fields: tuple[tuple[str, FieldType], ...] = ()
    synchronous: bool = False
    content: bool = False


CLASSES: Final[dict[int, str]] = {
    10: "connection", 20: "channel", 40: "exchange", 50: "queue", 60: "basic", 85: "confirm",
    90: "tx"}

METHODS: Final[tuple[MethodSpec, ...]] = (
    # connection (10)
    MethodSpec(10, 10, "connection.start", synchronous=True, fields=(
        ("version_major", "octet"), ("version_minor", "octet"), ("server_properties", "table"),
        ("mechanisms", "longstr"), ("locales", "longstr"))),
    MethodSpec(10, 11, "connection.start-ok", fields=(
        ("client_properties", "table"), ("mechanism", "shortstr"), ("response", "longstr"),
        ("locale", "shortstr"))),
    MethodSpec(10, 20, "connection.secure", synchronous=True, fields=(("challenge", "longstr"),)),
    MethodSpec(10, 21, "connection.secure-ok", fields=(("response", "longstr"),)),
    MethodSpec(10, 30, "connection.tune", synchronous=True, fields=(
        ("channel_max", "short"), ("frame_max", "long"), ("heartbeat", "short"))),
    MethodSpec(10, 31, "connection.tune-ok", fields=(
        ("channel_max", "short"), ("frame_max", "long"), ("heartbeat", "short"))),
    MethodSpec(10, 40, "connection.open", synchronous=True, fields=(
        ("virtual_host", "shortstr"), ("capabilities", "shortstr"), ("insist", "bit"))),
    MethodSpec(10, 41, "connection.open-ok", fields=(("known_hosts", "shortstr"),)),
    MethodSpec(10, 50, "connection.close", synchronous=True, fields=(
        ("reply_code", "short"), ("reply_text", "shortstr"), ("class_id", "short"),
        ("method_id", "short"))),
    MethodSpec(10, 51, "connection.close-ok"),
    MethodSpec(10, 60, "connection.blocked", fields=(("reason", "shortstr"),)),
    MethodSpec(10, 61, "connection.unblocked"),
    MethodSpec(10, 70, "connection.update-secret", synchronous=True, fields=(
        ("new_secret", "longstr"), ("reason", "shortstr"))),
    MethodSpec(10, 71, "connection.update-secret-ok"),
    # channel (20)
    MethodSpec(20, 10, "channel.open", synchronous=True, fields=(("out_of_band", "shortstr"),)),
    MethodSpec(20, 11, "channel.open-ok", fields=(("channel_id", "longstr"),)),
    MethodSpec(20, 20, "channel.flow", synchronous=True, fields=(("active", "bit"),)),
    MethodSpec(20, 21, "channel.flow-ok", fields=(("active", "bit"),)),
    MethodSpec(20, 40, "channel.close", synchronous=True, fields=(
        ("reply_code", "short"), ("reply_text", "shortstr"), ("class_id", "short"),
        ("method_id", "short"))),
    MethodSpec(20, 41, "channel.close-ok"),
    # exchange (40)
    MethodSpec(40, 10, "exchange.declare", synchronous=True, fields=(
        ("ticket", "short"), ("exchange", "shortstr"), ("type", "shortstr"), ("passive", "bit"),
        ("durable", "bit"), ("auto_delete", "bit"), ("internal", "bit"), ("nowait", "bit"),
        ("arguments", "table"))),
    MethodSpec(40, 11, "exchange.declare-ok"),
    MethodSpec(40, 20, "exchange.delete", synchronous=True, fields=(
        ("ticket", "short"), ("exchange", "shortstr"), ("if_unused", "bit"), ("nowait", "bit"))),
    MethodSpec(40, 21, "exchange.delete-ok"),
    MethodSpec(40, 30, "exchange.bind", synchronous=True, fields=(
        ("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
        ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table"))),
    MethodSpec(40, 31, "exchange.bind-ok"),
    MethodSpec(40, 40, "exchange.unbind", synchronous=True, fields=(
        ("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
        ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table"))),
    MethodSpec(40, 51, "exchange.unbind-ok"),
    # queue (50)
    MethodSpec(50, 10, "queue.declare", synchronous=True, fields=(
        ("ticket", "short"), ("queue", "shortstr"), ("passive", "bit"), ("durable", "bit"),
        ("exclusive", "bit"), ("auto_delete", "bit"), ("nowait", "bit"), ("arguments", "table"))),
    MethodSpec(50, 11, "queue.declare-ok", fields=(
        ("queue", "shortstr"), ("message_count", "long"), ("consumer_count", "long"))),
    MethodSpec(50, 20, "queue.bind", synchronous=True, fields=(
        ("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
        ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table"))),
    MethodSpec(50, 21, "queue.bind-ok"),
    MethodSpec(50, 30, "queue.purge", synchronous=True, fields=(
        ("ticket", "short"), ("queue", "shortstr"), ("nowait", "bit"))),
    MethodSpec(50, 31, "queue.purge-ok", fields=(("message_count", "long"),)),
    MethodSpec(50, 40, "queue.delete", synchronous=True, fields=(
        ("ticket", "short"), ("queue", "shortstr"), ("if_unused", "bit"), ("if_empty", "bit"),
        ("nowait", "bit"))),
    MethodSpec(50, 41, "queue.delete-ok", fields=(("message_count", "long"),)),
    MethodSpec(50, 50, "queue.unbind", synchronous=True, fields=(
        ("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
        ("routing_key", "shortstr"), ("arguments", "table"))),
    MethodSpec(50, 51, "queue.unbind-ok"),
    # basic (60)
    MethodSpec(60, 10, "basic.qos", synchronous=True, fields=(
        ("prefetch_size", "long"), ("prefetch_count", "short"), ("global", "bit"))),
    MethodSpec(60, 11, "basic.qos-ok"),
    MethodSpec(60, 20, "basic.consume", synchronous=True, fields=(
        ("ticket", "short"), ("queue", "shortstr"), ("consumer_tag", "shortstr"),
        ("no_local", "bit"), ("no_ack", "bit"), ("exclusive", "bit"), ("nowait", "bit"),
        ("arguments", "table"))),
    MethodSpec(60, 21, "basic.consume-ok", fields=(("consumer_tag", "shortstr"),)),
    MethodSpec(60, 30, "basic.cancel", synchronous=True, fields=(
        ("consumer_tag", "shortstr"), ("nowait", "bit"))),
    MethodSpec(60, 31, "basic.cancel-ok", fields=(("consumer_tag", "shortstr"),)),
    MethodSpec(60, 40, "basic.publish", content=True, fields=(
        ("ticket", "short"), ("exchange", "shortstr"), ("routing_key", "shortstr"),
        ("mandatory", "bit"), ("immediate", "bit"))),
    MethodSpec(60, 50, "basic.return", content=True, fields=(
        ("reply_code", "short"), ("reply_text", "shortstr"), ("exchange", "shortstr"),
        ("routing_key", "shortstr"))),
    MethodSpec(60, 60, "basic.deliver", content=True, fields=(
        ("consumer_tag", "shortstr"), ("delivery_tag", "longlong"), ("redelivered", "bit"),
        ("exchange", "shortstr"), ("routing_key", "shortstr"))),
    MethodSpec(60, 70, "basic.get", synchronous=True, fields=(
        ("ticket", "short"), ("queue", "shortstr"), ("no_ack", "bit"))),
    MethodSpec(60, 71, "basic.get-ok", content=True, fields=(
        ("delivery_tag", "longlong"), ("redelivered", "bit"), ("exchange", "shortstr"),
        ("routing_key", "shortstr"), ("message_count", "long"))),
    MethodSpec(60, 72, "basic.get-empty", fields=(("cluster_id", "shortstr"),)),
    MethodSpec(60, 80, "basic.ack", fields=(("delivery_tag", "longlong"), ("multiple", "bit"))),
    MethodSpec(60, 90, "basic.reject", fields=(("delivery_tag", "longlong"), ("requeue", "bit"))),
    MethodSpec(60, 100, "basic.recover-async", fields=(("requeue", "bit"),)),
    MethodSpec(60, 110, "basic.recover", synchronous=True, fields=(("requeue", "bit"),)),
    MethodSpec(60, 111, "basic.recover-ok"),
    MethodSpec(60, 120, "basic.nack", fields=(
        ("delivery_tag", "longlong"), ("multiple", "bit"), ("requeue", "bit"))),
    # confirm (85)
    MethodSpec(85, 10, "confirm.select", synchronous=True, fields=(("nowait", "bit"),)),
    MethodSpec(85, 11, "confirm.select-ok"),
    # tx (90)
    MethodSpec(90, 10, "tx.select", synchronous=True),
    MethodSpec(90, 11, "tx.select-ok"),
    MethodSpec(90, 20, "tx.commit", synchronous=True),
    MethodSpec(90, 21, "tx.commit-ok"),
    MethodSpec(90, 30, "tx.rollback", synchronous=True),
    MethodSpec(90, 31, "tx.rollback-ok"),
)

METHODS_BY_ID: Final[dict[tuple[int, int], MethodSpec]] = {
    (m.class_id, m.method_id): m for m in METHODS}
METHODS_BY_NAME: Final[dict[str, MethodSpec]] = {m.name: m for m in METHODS}

BASIC_CLASS_ID: Final = 60
"""The only class whose methods carry content, so the only one with content properties."""

BASIC_PROPERTIES: Final[tuple[tuple[str, FieldType], ...]] = (
    ("content_type", "shortstr"), ("content_encoding", "shortstr"), ("headers", "table"),
    ("delivery_mode", "octet"), ("priority", "octet"), ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"), ("expiration", "shortstr"), ("message_id", "shortstr"),
    ("timestamp", "timestamp"), ("type", "shortstr"), ("user_id", "shortstr"),
    ("app_id", "shortstr"), ("cluster_id", "shortstr"))
"""basic's content properties in property-flag order: the first is flag bit 15 (spec 4.2.6.1)."""
