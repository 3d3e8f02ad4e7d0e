"""The AMQP 0-9-1 wire codec: the method table against the spec, round trips of every method
with arguments generated from the table, golden bytes derived by hand from the spec's
frame and field grammar, every field-table type, content headers and body framing,
byte-at-a-time frame reading, and bad input with its reply code."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from handlers.amqp._codec import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    MAX_TABLE_DEPTH,
    PROTOCOL_HEADER,
    AMQPError,
    Frame,
    FrameReader,
    Properties,
    ReplyCode,
    decode_array,
    decode_header,
    decode_method,
    decode_table,
    encode_array,
    encode_content,
    encode_frame,
    encode_method,
    encode_table,
    method_frame_name,
)
from handlers.amqp._spec import (
    BASIC_PROPERTIES,
    CLASSES,
    METHODS,
    METHODS_BY_ID,
    METHODS_BY_NAME,
    MethodSpec,
)

# --------------------------------------------------------------------------- helpers


def sample_args(spec: MethodSpec) -> dict[str, Any]:
    """Non-zero arguments for every field of ``spec``: bits alternate so a bit landing in
    the wrong position of its octet shows, integers use every octet of their width."""
    samples: dict[str, Any] = {
        "octet": 0xAB, "short": 0xBEEF, "long": 0xDEADBEEF, "longlong": 0xFEED_FACE_CAFE_BEEF,
        "timestamp": 1_700_000_000, "longstr": b"\x00long\xffstr",
        "table": {"k": "v", "n": -7, "nested": {"on": True}}}
    args: dict[str, Any] = {}
    for i, (name, kind) in enumerate(spec.fields):
        if kind == "bit":
            args[name] = i % 2 == 0
        elif kind == "shortstr":
            args[name] = f"{name}-é"
        else:
            args[name] = samples[kind]
    return args


def frames_of(data: bytes, frame_max: int = 0) -> list[Frame]:
    reader = FrameReader(frame_max)
    reader.feed(data)
    out = []
    while (frame := reader.next()) is not None:
        out.append(frame)
    assert reader.buffered() == 0
    return out


def one_method(frame_bytes: bytes) -> tuple[int, Any]:
    (frame,) = frames_of(frame_bytes)
    assert frame.type == FRAME_METHOD
    return frame.channel, decode_method(frame.payload)


def method_payload(name: str, **args: Any) -> bytes:
    (frame,) = frames_of(encode_method(0, name, **args))
    return frame.payload


def raises(code: ReplyCode, fn: Any, *args: Any) -> AMQPError:
    with pytest.raises(AMQPError) as info:
        fn(*args)
    assert info.value.code == code, info.value.text
    assert info.value.text.startswith(code.name + " - ")
    return info.value


# --------------------------------------------------------------------------- the table

# (class, method, name) of every method of the classes we speak, from amqp0-9-1.xml plus
# RabbitMQ's extensions, written out independently of _spec.py.
SPEC_IDS = {
    (10, 10): "connection.start", (10, 11): "connection.start-ok",
    (10, 20): "connection.secure", (10, 21): "connection.secure-ok",
    (10, 30): "connection.tune", (10, 31): "connection.tune-ok",
    (10, 40): "connection.open", (10, 41): "connection.open-ok",
    (10, 50): "connection.close", (10, 51): "connection.close-ok",
    (10, 60): "connection.blocked", (10, 61): "connection.unblocked",
    (10, 70): "connection.update-secret", (10, 71): "connection.update-secret-ok",
    (20, 10): "channel.open", (20, 11): "channel.open-ok", (20, 20): "channel.flow",
    (20, 21): "channel.flow-ok", (20, 40): "channel.close", (20, 41): "channel.close-ok",
    (40, 10): "exchange.declare", (40, 11): "exchange.declare-ok",
    (40, 20): "exchange.delete", (40, 21): "exchange.delete-ok",
    (40, 30): "exchange.bind", (40, 31): "exchange.bind-ok",
    (40, 40): "exchange.unbind", (40, 51): "exchange.unbind-ok",
    (50, 10): "queue.declare", (50, 11): "queue.declare-ok", (50, 20): "queue.bind",
    (50, 21): "queue.bind-ok", (50, 30): "queue.purge", (50, 31): "queue.purge-ok",
    (50, 40): "queue.delete", (50, 41): "queue.delete-ok", (50, 50): "queue.unbind",
    (50, 51): "queue.unbind-ok",
    (60, 10): "basic.qos", (60, 11): "basic.qos-ok", (60, 20): "basic.consume",
    (60, 21): "basic.consume-ok", (60, 30): "basic.cancel", (60, 31): "basic.cancel-ok",
    (60, 40): "basic.publish", (60, 50): "basic.return", (60, 60): "basic.deliver",
    (60, 70): "basic.get", (60, 71): "basic.get-ok", (60, 72): "basic.get-empty",
    (60, 80): "basic.ack", (60, 90): "basic.reject", (60, 100): "basic.recover-async",
    (60, 110): "basic.recover", (60, 111): "basic.recover-ok", (60, 120): "basic.nack",
    (85, 10): "confirm.select", (85, 11): "confirm.select-ok",
    (90, 10): "tx.select", (90, 11): "tx.select-ok", (90, 20): "tx.commit",
    (90, 21): "tx.commit-ok", (90, 30): "tx.rollback", (90, 31): "tx.rollback-ok",
}


def test_table_holds_every_method_once() -> None:
    assert {(m.class_id, m.method_id): m.name for m in METHODS} == SPEC_IDS
    assert len(METHODS) == len(METHODS_BY_ID) == len(METHODS_BY_NAME) == len(SPEC_IDS)
    for m in METHODS:
        assert m.name.split(".")[0] == CLASSES[m.class_id]
        assert method_frame_name(m.class_id, m.method_id) == m.name
        assert all("-" not in field for field, _ in m.fields)
    assert method_frame_name(60, 99) == "60.99"


def test_table_spot_checks_against_the_spec() -> None:
    fields = {m.name: [f for f, _ in m.fields] for m in METHODS}
    assert fields["basic.publish"] == ["ticket", "exchange", "routing_key", "mandatory",
                                       "immediate"]
    assert fields["basic.consume"] == ["ticket", "queue", "consumer_tag", "no_local", "no_ack",
                                       "exclusive", "nowait", "arguments"]
    assert fields["queue.declare"] == ["ticket", "queue", "passive", "durable", "exclusive",
                                       "auto_delete", "nowait", "arguments"]
    assert fields["basic.nack"] == ["delivery_tag", "multiple", "requeue"]
    assert fields["connection.start"] == ["version_major", "version_minor",
                                          "server_properties", "mechanisms", "locales"]
    assert fields["exchange.delete"] == ["ticket", "exchange", "if_unused", "nowait"]
    assert fields["basic.qos"] == ["prefetch_size", "prefetch_count", "global"]
    assert dict(METHODS_BY_NAME["basic.deliver"].fields)["delivery_tag"] == "longlong"
    assert dict(METHODS_BY_NAME["queue.declare-ok"].fields)["message_count"] == "long"
    content = {m.name for m in METHODS if m.content}
    assert content == {"basic.publish", "basic.return", "basic.deliver", "basic.get-ok"}


def test_properties_follow_the_flag_order() -> None:
    assert [f for f, _ in BASIC_PROPERTIES] == list(Properties.__dataclass_fields__)
    assert len(BASIC_PROPERTIES) == 14


def test_reply_codes_and_their_level() -> None:
    hard = {320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541}
    soft = {311, 312, 313, 403, 404, 405, 406}
    assert {int(c) for c in ReplyCode} == hard | soft | {200}
    for code in hard:
        assert AMQPError(code, "x").connection
    for code in soft:
        assert not AMQPError(code, "x").connection
    e = AMQPError(ReplyCode.NOT_FOUND, "NOT_FOUND - no queue 'q'", 50, 10)
    assert (e.code, e.text, e.class_id, e.method_id) == (404, "NOT_FOUND - no queue 'q'", 50, 10)
    assert e.code is ReplyCode.NOT_FOUND
    assert AMQPError(599, "odd").code == 599 and AMQPError(599, "odd").connection


# --------------------------------------------------------------------------- golden bytes

GOLDEN: list[tuple[int, str, dict[str, Any], str]] = [
    # frame: type 1, channel, size; payload: class 10, method 31, channel-max short,
    # frame-max long, heartbeat short (spec 4.2.3, 4.2.4, connection.tune-ok)
    (0, "connection.tune-ok", {"channel_max": 2047, "frame_max": 131072, "heartbeat": 60},
     "01 0000 0000000c  000a 001f  07ff 00020000 003c  ce"),
    # basic.publish: ticket short 0, exchange shortstr "", routing-key shortstr "hello",
    # then mandatory (bit 0) and immediate (bit 1) packed into one octet (spec 4.2.5.2)
    (1, "basic.publish", {"routing_key": "hello", "mandatory": True},
     "01 0001 0000000e  003c 0028  0000 00 05 68656c6c6f 01  ce"),
    # basic.deliver: consumer-tag, delivery-tag longlong, redelivered bit, exchange, key
    (5, "basic.deliver", {"consumer_tag": "ctag", "delivery_tag": 1, "redelivered": True,
                          "exchange": "ex", "routing_key": "rk"},
     "01 0005 00000018  003c 003c  04 63746167 0000000000000001 01 02 6578 02 726b  ce"),
    # exchange.declare: passive, durable, auto-delete, internal, nowait share one octet,
    # low bit first: durable (1) + auto-delete (2) + nowait (4) = 0b10110; an empty table
    (2, "exchange.declare", {"exchange": "x", "type": "fanout", "durable": True,
                             "auto_delete": True, "nowait": True},
     "01 0002 00000014  0028 000a  0000 01 78 06 66616e6f7574 16 00000000  ce"),
    # connection.close: reply-code 320, reply-text, class-id 0, method-id 0
    (0, "connection.close", {"reply_code": 320, "reply_text": "bye"},
     "01 0000 0000000e  000a 0032  0140 03 627965 0000 0000  ce"),
    # basic.nack: delivery-tag, then multiple (bit 0) and requeue (bit 1)
    (3, "basic.nack", {"delivery_tag": 258, "requeue": True},
     "01 0003 0000000d  003c 0078  0000000000000102 02  ce"),
    # connection.start-ok: a table, a shortstr, a longstr, a shortstr
    (0, "connection.start-ok", {"client_properties": {"a": 1}, "mechanism": "PLAIN",
                                "response": b"\x00u\x00p", "locale": "en_US"},
     "01 0000 00000023  000a 000b  00000007 01 61 49 00000001  05 504c41494e"
     " 00000004 00750070 05 656e5f5553  ce"),
]


@pytest.mark.parametrize(("channel", "name", "args", "wire"), GOLDEN,
                         ids=[g[1] for g in GOLDEN])
def test_golden_method_frames(channel: int, name: str, args: dict[str, Any], wire: str) -> None:
    expected = bytes.fromhex(wire)
    assert encode_method(channel, name, **args) == expected
    got_channel, method = one_method(expected)
    assert got_channel == channel
    assert method.name == name
    for key, value in args.items():
        assert method.args[key] == value


def test_golden_constants() -> None:
    assert PROTOCOL_HEADER == b"AMQP\x00\x00\x09\x01"
    assert HEARTBEAT_FRAME == bytes.fromhex("08 0000 00000000 ce")
    assert (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT, FRAME_END) == (1, 2, 3, 8, 0xCE)
    assert encode_frame(FRAME_BODY, 7, b"hi") == bytes.fromhex("03 0007 00000002 6869 ce")


def test_golden_content_header() -> None:
    # class 60, weight 0, body size 5, flags: content-type (bit 15) and delivery-mode
    # (bit 12); then the shortstr and the octet (spec 4.2.6.1)
    header = bytes.fromhex("003c 0000 0000000000000005 9000 0a 746578742f706c61696e 02")
    props = Properties(content_type="text/plain", delivery_mode=2)
    wire = encode_content(1, 60, props, b"hello", 4096)
    assert wire == (encode_frame(FRAME_HEADER, 1, header) + encode_frame(FRAME_BODY, 1, b"hello"))
    assert decode_header(header) == (60, 5, props)


def test_golden_table() -> None:
    wire = bytes.fromhex("00000014 01 61 49 ffffffff 01 62 74 01 01 63 53 00000002 6869")
    assert encode_table({"a": -1, "b": True, "c": "hi"}) == wire
    assert decode_table(wire, 0) == ({"a": -1, "b": True, "c": "hi"}, len(wire))


# --------------------------------------------------------------------------- methods


@pytest.mark.parametrize("spec", METHODS, ids=[m.name for m in METHODS])
def test_every_method_round_trips(spec: MethodSpec) -> None:
    args = sample_args(spec)
    channel, method = one_method(encode_method(9, spec.name, **args))
    assert channel == 9
    assert (method.name, method.class_id, method.method_id) == (
        spec.name, spec.class_id, spec.method_id)
    assert method.has_content == spec.content
    assert method.args == args
    # left out, every argument takes its type's zero
    _, zero = one_method(encode_method(0, spec.name))
    zeros = {"bit": False, "shortstr": "", "longstr": b"", "table": {}}
    assert zero.args == {f: zeros.get(kind, 0) for f, kind in spec.fields}


@pytest.mark.parametrize("spec", [m for m in METHODS if m.fields],
                         ids=[m.name for m in METHODS if m.fields])
def test_every_truncation_is_a_syntax_error(spec: MethodSpec) -> None:
    payload = method_payload(spec.name, **sample_args(spec))
    for cut in range(4, len(payload)):
        err = raises(ReplyCode.SYNTAX_ERROR, decode_method, payload[:cut])
        assert (err.class_id, err.method_id) == (spec.class_id, spec.method_id)
        assert err.connection


def test_bits_pack_eight_to_an_octet_low_bit_first() -> None:
    for i in range(5):
        names = ["passive", "durable", "auto_delete", "internal", "nowait"]
        payload = method_payload("exchange.declare", **{names[i]: True})
        assert payload[-5] == 1 << i
        assert decode_method(payload).args[names[i]] is True


def test_longstr_takes_str_or_bytes_and_decodes_to_bytes() -> None:
    _, m = one_method(encode_method(0, "connection.secure-ok", response="ü"))
    assert m.args["response"] == "ü".encode()


def test_global_argument_of_basic_qos() -> None:
    _, m = one_method(encode_method(1, "basic.qos", prefetch_count=10, **{"global": True}))
    assert m.args == {"prefetch_size": 0, "prefetch_count": 10, "global": True}


def test_long_reply_text_is_cut_to_fit() -> None:
    _, m = one_method(encode_method(1, "channel.close", reply_code=404, reply_text="é" * 200))
    text = m.args["reply_text"]
    assert len(text.encode()) <= 255 and text.endswith("...") and text.startswith("éé")


def test_encode_method_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        encode_method(1, "basic.frobnicate")
    with pytest.raises(TypeError, match="no argument"):
        encode_method(1, "basic.ack", delivery_tags=1)
    with pytest.raises(ValueError, match="shortstr"):
        encode_method(1, "queue.declare", queue="q" * 256)
    with pytest.raises(ValueError, match="does not fit"):
        encode_method(1, "basic.ack", delivery_tag=-1)
    with pytest.raises(ValueError, match="does not fit"):
        encode_method(1, "basic.qos", prefetch_count=70000)
    with pytest.raises(ValueError):
        encode_method(70000, "basic.ack")


def test_unknown_class_and_method() -> None:
    err = raises(ReplyCode.COMMAND_INVALID, decode_method, bytes.fromhex("003c 0063"))
    assert "unknown method 60.99" in err.text and (err.class_id, err.method_id) == (60, 99)
    err = raises(ReplyCode.NOT_IMPLEMENTED, decode_method, bytes.fromhex("001e 000a 00"))
    assert "unknown class 30" in err.text and err.connection


def test_short_and_overlong_method_payloads() -> None:
    raises(ReplyCode.FRAME_ERROR, decode_method, b"\x00\x3c\x00")
    err = raises(ReplyCode.SYNTAX_ERROR, decode_method, method_payload("basic.ack") + b"\x00")
    assert "past the end" in err.text and (err.class_id, err.method_id) == (60, 80)
    # a shortstr that is not UTF-8
    raises(ReplyCode.SYNTAX_ERROR, decode_method, bytes.fromhex("003c 001e 01 ff 00"))


# --------------------------------------------------------------------------- field tables

TABLE_CASES: list[tuple[str, Any]] = [
    ("74 01", True), ("74 00", False), ("74 07", True),
    ("62 ff", -1), ("42 ff", 255), ("73 fffe", -2), ("75 ffff", 65535),
    ("49 fffffffd", -3), ("69 ffffffff", 0xFFFF_FFFF), ("6c 8000000000000000", -2 ** 63),
    ("66 3fc00000", 1.5), ("64 400921fb54442d18", 3.141592653589793),
    ("44 02 0000013a", Decimal("3.14")), ("44 00 00000007", Decimal(7)),
    ("53 00000003 616263", "abc"), ("53 00000002 ff00", b"\xff\x00"),
    ("78 00000002 0001", b"\x00\x01"),
    ("41 0000000a 49 00000001 53 00000000", [1, ""]),
    ("54 0000000065538580", datetime(2023, 11, 14, 14, 34, 40, tzinfo=UTC)),
    ("46 00000007 01 7a 74 01 01 79 56", {"z": True, "y": None}),
    ("56", None),
]


@pytest.mark.parametrize(("wire", "value"), TABLE_CASES, ids=[c[0][:2] for c in TABLE_CASES])
def test_every_table_type_decodes(wire: str, value: Any) -> None:
    entry = bytes.fromhex("01 6b") + bytes.fromhex(wire)
    table = len(entry).to_bytes(4, "big") + entry
    decoded, end = decode_table(b"\xaa" + table + b"\xbb", 1)
    assert decoded == {"k": value} and end == len(table) + 1
    assert type(decoded["k"]) is type(value)


def test_table_encoding_chooses_types() -> None:
    value = {
        "bool": True, "int": -5, "big": 2 ** 40, "float": 0.25, "str": "héllo", "bytes": b"\xff",
        "table": {"inner": [1, "two", None]}, "list": [[], {}], "tuple": (1,), "none": None,
        "decimal": Decimal("12.500"),
        "when": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        "naive": datetime(2024, 1, 2, 3, 4, 5),
    }
    decoded, _ = decode_table(encode_table(value), 0)
    assert decoded == {**value, "tuple": [1], "naive": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}
    assert type(decoded["decimal"]) is Decimal and str(decoded["decimal"]) == "12.500"
    letters = {name: encode_table({name: v})[5 + len(name)] for name, v in value.items()}
    assert letters == {
        "bool": ord("t"), "int": ord("I"), "big": ord("l"), "float": ord("d"), "str": ord("S"),
        "bytes": ord("S"), "table": ord("F"), "list": ord("A"), "tuple": ord("A"),
        "none": ord("V"), "decimal": ord("D"), "when": ord("T"), "naive": ord("T")}


def test_arrays() -> None:
    wire = encode_array([1, "a", [True]])
    assert decode_array(wire, 0) == ([1, "a", [True]], len(wire))
    assert encode_array([]) == b"\0\0\0\0"


def test_table_encoding_refuses_what_does_not_fit() -> None:
    with pytest.raises(TypeError):
        encode_table({"o": object()})
    with pytest.raises(TypeError):
        encode_table({1: "x"})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        encode_table({"n": 2 ** 63})
    with pytest.raises(ValueError):
        encode_table({"d": Decimal("-1.5")})
    with pytest.raises(ValueError):
        encode_table({"d": Decimal("NaN")})
    with pytest.raises(ValueError):
        encode_table({"t": datetime(1969, 12, 31, tzinfo=UTC)})
    with pytest.raises(ValueError):
        encode_table({"k" * 256: 1})
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="nested"):
        encode_table(cyclic)


def test_bad_tables_are_syntax_errors() -> None:
    bad = [
        "00000003 01 6b 51",                 # unknown type letter Q
        "00000010 01 6b 56",                 # size past the end
        "00000004 01 6b 49",                 # value past the table's size
        "00000003 01 ff 56",                 # name not UTF-8
        "0000000a 01 6b 54 ffffffffffffffff",  # timestamp past the year 9999
        "000000",                            # no size
        "00000006 01 6b 46 00000001",        # nested table past its parent
    ]
    for wire in bad:
        raises(ReplyCode.SYNTAX_ERROR, decode_table, bytes.fromhex(wire), 0)
    raises(ReplyCode.SYNTAX_ERROR, decode_table, b"", 5)


def test_nesting_is_bounded() -> None:
    value: Any = 1
    for _ in range(MAX_TABLE_DEPTH - 1):
        value = [value]
    assert decode_table(encode_table({"deep": value}), 0)[0] == {"deep": value}
    wire = b"V"
    for _ in range(5000):  # far deeper than Python's recursion limit would allow
        wire = b"A" + len(wire).to_bytes(4, "big") + wire
    raises(ReplyCode.SYNTAX_ERROR, decode_array, len(wire).to_bytes(4, "big") + wire, 0)


# --------------------------------------------------------------------------- content

FULL = Properties(
    content_type="application/json", content_encoding="gzip",
    headers={"x-match": "all", "n": 1, "nested": {"l": [1, 2]}}, delivery_mode=2,
    priority=9, correlation_id="corr", reply_to="amq.rabbitmq.reply-to", expiration="60000",
    message_id="m-1", timestamp=1_700_000_000, type="event", user_id="guest", app_id="app",
    cluster_id="c1")


@pytest.mark.parametrize("props", [FULL, Properties()], ids=["all", "none"])
def test_content_header_round_trips(props: Properties) -> None:
    header, body = frames_of(encode_content(4, 60, props, b"body", 4096))
    assert (header.type, header.channel, body.type, body.payload) == (
        FRAME_HEADER, 4, FRAME_BODY, b"body")
    assert decode_header(header.payload) == (60, 4, props)


def test_no_properties_is_an_all_zero_flag_word() -> None:
    (header,) = frames_of(encode_content(1, 60, Properties(), b"", 4096))
    assert header.payload == bytes.fromhex("003c 0000 0000000000000000 0000")


def test_each_property_has_its_own_flag_bit() -> None:
    for i, (name, _) in enumerate(BASIC_PROPERTIES):
        props = Properties(**{name: getattr(FULL, name)})
        (header,) = frames_of(encode_content(1, 60, props, b"", 0))
        assert int.from_bytes(header.payload[12:14], "big") == 1 << (15 - i)
        assert decode_header(header.payload)[2] == props


def test_property_flag_continuation() -> None:
    # flags 0x8001 (content-type, continued), then an empty continuation word
    payload = bytes.fromhex("003c 0000 0000000000000000 8001 0000 01 61")
    assert decode_header(payload) == (60, 0, Properties(content_type="a"))
    payload = bytes.fromhex("003c 0000 0000000000000000 0001 0001 0000")
    assert decode_header(payload) == (60, 0, Properties())


def test_bad_content_headers() -> None:
    base = "003c 0000 0000000000000003"
    raises(ReplyCode.FRAME_ERROR, decode_header, bytes.fromhex(base))
    raises(ReplyCode.FRAME_ERROR, decode_header, bytes.fromhex("0032 0000 0000000000000000 0000"))
    for tail in ("0002",             # bit 1 names no property
                 "0001",             # continuation word missing
                 "0001 8000",        # continuation word flags a 16th property
                 "8000 05 61",       # content-type shortstr runs past the end
                 "8000 01 ff",       # content-type not UTF-8
                 "2000 00000009",    # headers table runs past the end
                 "0000 00"):         # an octet past the properties
        raises(ReplyCode.SYNTAX_ERROR, decode_header, bytes.fromhex(base + tail))


def test_body_is_split_at_frame_max() -> None:
    body = bytes(range(256)) * 40  # 10240 octets
    frames = frames_of(encode_content(2, 60, Properties(), body, 4096), frame_max=4096)
    assert [f.type for f in frames] == [FRAME_HEADER] + [FRAME_BODY] * 3
    assert [len(f.payload) for f in frames[1:]] == [4088, 4088, 2064]
    assert b"".join(f.payload for f in frames[1:]) == body
    assert decode_header(frames[0].payload)[1] == len(body)
    # exactly one frame's worth, and an empty body
    assert len(frames_of(encode_content(2, 60, Properties(), body[:4088], 4096))) == 2
    assert len(frames_of(encode_content(2, 60, Properties(), b"", 4096))) == 1
    # no limit: one body frame
    assert len(frames_of(encode_content(2, 60, Properties(), body, 0))) == 2


def test_encode_content_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError):
        encode_content(1, 50, Properties(), b"x", 4096)
    with pytest.raises(ValueError):
        encode_content(1, 60, Properties(), b"x", 8)
    with pytest.raises(ValueError, match="frame_max"):
        encode_content(1, 60, Properties(headers={"h": "x" * 5000}), b"x", 4096)
    with pytest.raises(ValueError):
        encode_content(1, 60, Properties(priority=256), b"x", 4096)


# --------------------------------------------------------------------------- frame reader


def _stream() -> bytes:
    return b"".join([
        encode_method(0, "connection.tune-ok", channel_max=10, frame_max=4096, heartbeat=5),
        HEARTBEAT_FRAME,
        encode_method(1, "basic.publish", exchange="ex", routing_key="rk"),
        encode_content(1, 60, FULL, b"x" * 5000, 4096),
        encode_method(1, "basic.ack", delivery_tag=3, multiple=True),
    ])


def test_reader_byte_by_byte_matches_all_at_once() -> None:
    data = _stream()
    whole = frames_of(data, 4096)
    assert [f.type for f in whole] == [1, 8, 1, 2, 3, 3, 1]
    reader = FrameReader(4096)
    got = []
    for i in range(len(data)):
        reader.feed(data[i:i + 1])
        while (frame := reader.next()) is not None:
            got.append(frame)
    assert got == whole
    assert reader.buffered() == 0 and reader.next() is None


def test_reader_drains_many_frames_from_one_feed() -> None:
    frame = encode_method(1, "basic.ack", delivery_tag=1)
    reader = FrameReader()
    reader.feed(frame * 20000 + frame[:5])
    count = 0
    while reader.next() is not None:
        count += 1
    assert count == 20000 and reader.buffered() == 5
    reader.feed(frame[5:])
    assert reader.next() == Frame(FRAME_METHOD, 1, frame[7:-1])


def test_reader_bad_frame_end() -> None:
    reader = FrameReader()
    reader.feed(HEARTBEAT_FRAME[:-1] + b"\x00")
    err = raises(ReplyCode.FRAME_ERROR, reader.next)
    assert err.connection
    raises(ReplyCode.FRAME_ERROR, reader.next)  # the stream stays broken


def test_reader_unknown_frame_type() -> None:
    reader = FrameReader()
    reader.feed(PROTOCOL_HEADER)  # 'A' = 65, as when a client repeats its header
    assert "unknown frame type 65" in raises(ReplyCode.FRAME_ERROR, reader.next).text


def test_reader_heartbeat_on_a_channel() -> None:
    reader = FrameReader()
    reader.feed(encode_frame(FRAME_HEARTBEAT, 1, b""))
    raises(ReplyCode.FRAME_ERROR, reader.next)


def test_reader_oversized_frame_fails_before_its_payload() -> None:
    reader = FrameReader(frame_max=4096)
    reader.feed(encode_frame(FRAME_BODY, 1, b"x" * 4089)[:7])  # only the header
    assert "over frame_max 4096" in raises(ReplyCode.FRAME_ERROR, reader.next).text
    reader = FrameReader(frame_max=4096)
    reader.feed(encode_frame(FRAME_BODY, 1, b"x" * 4088))
    assert reader.next() is not None
    reader = FrameReader(frame_max=0)
    reader.feed(encode_frame(FRAME_BODY, 1, b"x" * 200_000))
    assert reader.next() is not None


def test_reader_frame_max_can_change() -> None:
    reader = FrameReader(frame_max=131072)
    reader.feed(encode_frame(FRAME_BODY, 1, b"x" * 5000) * 2)
    assert reader.next() is not None
    reader.frame_max = 4096
    raises(ReplyCode.FRAME_ERROR, reader.next)
