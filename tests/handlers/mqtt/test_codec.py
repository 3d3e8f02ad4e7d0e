"""The sans-IO MQTT codec: round trips of every packet at protocol levels 4 and 5 (and the
CONNECT of 3), golden bytes built by hand from the OASIS 3.1.1 and 5.0 specifications,
byte-at-a-time feeding, the connection state machine, bad input with its reason code, and
fuzzing."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, cast

import pytest

from handlers.mqtt._codec import (
    MAX_REMAINING_LENGTH,
    NEED_DATA,
    LocalProtocolError,
    MQTTConnection,
    RemoteProtocolError,
    Role,
    State,
    UnsupportedProtocolVersion,
    decode_packet,
    encode_packet,
)
from handlers.mqtt._packets import (
    PROPERTIES_ALLOWED,
    PROPERTY_TYPES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscribeOption,
    Unsuback,
    Unsubscribe,
    Will,
)

MALFORMED = ReasonCode.MALFORMED_PACKET
PROTOCOL = ReasonCode.PROTOCOL_ERROR
METHOD = "ü/π ☃"  # the authentication method of all_props (a UTF-8 sample)
#: A 5.0 CONNECT that starts enhanced authentication: AUTH packets may go both ways.
ENHANCED = Connect(protocol_level=5, client_id="c",
                   properties=Properties(authentication_method=METHOD))


# --------------------------------------------------------------------------- helpers


def vbi(n: int) -> bytes:
    """A variable byte integer, written from 5.0 section 1.5.5's algorithm (not the codec's)."""
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def s(text: str | bytes) -> bytes:
    """A UTF-8 encoded string or binary data: two-byte length, then the bytes (1.5.4, 1.5.6)."""
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + vbi(len(body)) + body


def connect_bytes(level: int = 4, client_id: str = "c", props: bytes = b"\x00") -> bytes:
    name = "MQIsdp" if level == 3 else "MQTT"
    body = s(name) + bytes((level, 0x02)) + b"\x00\x3c"
    if level == 5:
        body += props
    return frame(0x10, body + s(client_id))


def drain(conn: MQTTConnection) -> list[Packet]:
    out: list[Packet] = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(cast(Packet, event))
    return out


def deliver(sender: MQTTConnection, receiver: MQTTConnection, packet: Packet) -> Packet:
    receiver.receive_data(sender.send(packet))
    got = receiver.next_event()
    assert receiver.next_event() is NEED_DATA
    return cast(Packet, got)


def connack_for(connect: Connect, **kw: Any) -> Connack:
    """A successful CONNACK for ``connect``: it names the CONNECT's authentication method
    (MQTT-4.12.0-5), if any."""
    return Connack(properties=Properties(
        authentication_method=connect.properties.authentication_method), **kw)


def connected(level: int, connect: Connect | None = None) -> tuple[MQTTConnection, MQTTConnection]:
    """A client and a server past CONNECT and CONNACK."""
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    connect = connect or Connect(protocol_level=level, client_id="c")
    deliver(client, server, connect)
    deliver(server, client, connack_for(connect))
    assert client.state is server.state is State.CONNECTED
    return client, server


def server_at(level: int | None, max_packet_size: int | None = None) -> MQTTConnection:
    """A server that has read a CONNECT and sent CONNACK (``level`` None: nothing read),
    then given ``max_packet_size``."""
    server = MQTTConnection(Role.SERVER)
    if level is not None:
        server.receive_data(connect_bytes(level))
        assert isinstance(server.next_event(), Connect)
        server.send(Connack())
    if max_packet_size is not None:
        server.max_packet_size = max_packet_size
    return server


def connecting_client(level: int) -> tuple[MQTTConnection, bytes, bytes]:
    """A client past CONNECT and CONNACK (from a scratch server), and those two packets."""
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    connect = client.send(_connects()[-1] if level == 5 else _connects()[2])
    server.receive_data(connect)
    server.next_event()
    connack = server.send(Connack(properties=all_props(PacketType.CONNACK) if level == 5
                                  else Properties()))
    client.receive_data(connack)
    assert isinstance(client.next_event(), Connack)
    return client, connect, connack


def _sample(name: str, kind: str, where: PacketType | str) -> Any:
    if kind == "varint":  # subscription identifiers, the only varint property
        return (1, 127, 128, 16_384, MAX_REMAINING_LENGTH) if where is PacketType.PUBLISH \
            else (MAX_REMAINING_LENGTH,)
    return {"byte": 1, "u16": 0x1234, "u32": 0xDEADBEEF, "utf8": "ü/π ☃",
            "binary": b"\x00\xff\x10", "pair": (("k", "v"), ("k", "v2"), ("ü", ""))}[kind]


def all_props(where: PacketType | str) -> Properties:
    """Every property ``where`` may carry, repeatable ones repeated."""
    return Properties(**{name: _sample(name, kind.value, where)
                         for name, kind in PROPERTY_TYPES.values()
                         if name in PROPERTIES_ALLOWED[where]})


def test_all_props_covers_every_property_and_every_wire_type() -> None:
    names = set().union(*(all_props(where).present() for where in PROPERTIES_ALLOWED))
    assert names == {name for name, _ in PROPERTY_TYPES.values()}
    assert {kind.value for _, kind in PROPERTY_TYPES.values()} == {
        "byte", "u16", "u32", "varint", "utf8", "binary", "pair"}


# --------------------------------------------------------------------------- round trips


def _connects() -> list[Connect]:
    will = Will(topic="last/words", payload=b"\x00bye", qos=2, retain=True)
    return [
        Connect(protocol_level=3, client_id="old", keep_alive=0),
        Connect(protocol_level=4, client_id="", clean_start=True),
        Connect(protocol_level=4, client_id="c4", clean_start=False, keep_alive=0xFFFF,
                username="ü", password=b"\x00\xff", will=will),
        Connect(protocol_level=4, client_id="c4", will=Will(topic="w", qos=1)),
        Connect(protocol_level=5, client_id="c5"),
        Connect(protocol_level=5, client_id="c5", clean_start=False, password=b"only-pw"),
        Connect(protocol_level=5, client_id="c5", username="u", password=b"p",
                will=Will(topic="w/t", payload=b"x", qos=1, properties=all_props("will")),
                properties=all_props(PacketType.CONNECT)),
    ]


@pytest.mark.parametrize("connect", _connects(), ids=lambda c: f"v{c.protocol_level}")
def test_connect_round_trip(connect: Connect) -> None:
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    assert deliver(client, server, connect) == connect
    assert server.version == client.version == connect.protocol_level
    assert server.state is State.CONNECTING


@pytest.mark.parametrize("connack", [
    (4, Connack()),
    (4, Connack(session_present=True)),
    (4, Connack(reason_code=5)),
    (5, Connack(session_present=True, properties=all_props(PacketType.CONNACK))),
    (5, Connack(reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                properties=Properties(reason_string="no"))),
], ids=lambda c: f"v{c[0]}")
def test_connack_round_trip(connack: tuple[int, Connack]) -> None:
    level, packet = connack
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    method = packet.properties.authentication_method
    deliver(client, server, Connect(protocol_level=level,
                                    properties=Properties(authentication_method=method)))
    assert deliver(server, client, packet) == packet
    assert client.state is server.state is State.CONNECTED


def _both_ways(level: int) -> list[Packet]:
    v5 = level == 5

    def p(where: PacketType) -> Properties:
        return all_props(where) if v5 else Properties()

    code = 0x10 if v5 else 0
    acks: list[Packet] = []
    for cls, kind in ((Puback, PacketType.PUBACK), (Pubrec, PacketType.PUBREC),
                      (Pubrel, PacketType.PUBREL), (Pubcomp, PacketType.PUBCOMP)):
        acks += [cls(packet_id=1), cls(packet_id=0xFFFF, reason_code=code),
                 cls(packet_id=7, reason_code=code, properties=p(kind))]
    # a client may not send a subscription identifier (5.0 section 3.3.2.3.8): _server_only
    return [
        Publish(topic="a/b", payload=b"hello",
                properties=replace(p(PacketType.PUBLISH), subscription_identifiers=())),
        Publish(topic="a/b", qos=1, packet_id=1, retain=True, dup=True),
        Publish(topic="ü/€/x", payload=bytes(range(256)) * 4, qos=2, packet_id=0xFFFF),
        Publish(topic="/", payload=b""),
        *acks,
    ]


def _client_only(level: int) -> list[Packet]:
    v5 = level == 5
    subs = (SubscribeOption(topic_filter="a/+/c", qos=2, no_local=v5, retain_as_published=v5,
                            retain_handling=2 if v5 else 0),
            SubscribeOption(topic_filter="#", qos=1), SubscribeOption(topic_filter="$SYS/x"))
    out: list[Packet] = [
        Subscribe(packet_id=9, subscriptions=subs[:1]),
        Subscribe(packet_id=9, subscriptions=subs,
                  properties=all_props(PacketType.SUBSCRIBE) if v5 else Properties()),
        Unsubscribe(packet_id=10, topic_filters=("a/+/c",)),
        Unsubscribe(packet_id=10, topic_filters=("a/+/c", "#"),
                    properties=all_props(PacketType.UNSUBSCRIBE) if v5 else Properties()),
        Pingreq(),
        Disconnect(),
    ]
    if v5:
        out += [Subscribe(packet_id=3, subscriptions=(SubscribeOption(topic_filter="t",
                                                                      retain_handling=1),)),
                Publish(topic="", qos=1, packet_id=2, properties=Properties(topic_alias=3)),
                Auth(reason_code=ReasonCode.RE_AUTHENTICATE,
                     properties=Properties(authentication_method=METHOD)),
                Auth(reason_code=ReasonCode.CONTINUE_AUTHENTICATION,
                     properties=all_props(PacketType.AUTH)),
                Disconnect(reason_code=ReasonCode.DISCONNECT_WITH_WILL_MESSAGE),
                Disconnect(reason_code=0, properties=all_props(PacketType.DISCONNECT))]
    return out


def _server_only(level: int) -> list[Packet]:
    v5 = level == 5
    out: list[Packet] = [
        Suback(packet_id=9, reason_codes=(0,)),
        Suback(packet_id=9, reason_codes=(0, 1, 2, 0x80),
               properties=all_props(PacketType.SUBACK) if v5 else Properties()),
        Unsuback(packet_id=10, reason_codes=(0,) if v5 else ()),
        Pingresp(),
    ]
    if v5:
        out += [Publish(topic="a/b", payload=b"down", properties=all_props(PacketType.PUBLISH)),
                Unsuback(packet_id=10, reason_codes=(0, ReasonCode.NO_SUBSCRIPTION_EXISTED),
                         properties=all_props(PacketType.UNSUBACK)),
                Auth(reason_code=ReasonCode.CONTINUE_AUTHENTICATION,
                     properties=all_props(PacketType.AUTH)),
                Auth(properties=Properties(authentication_method=METHOD)),
                Disconnect(reason_code=ReasonCode.SERVER_SHUTTING_DOWN,
                           properties=all_props(PacketType.DISCONNECT))]
    return out


def _cases(*makers: Any) -> list[Any]:
    return [pytest.param(level, packet, id=f"v{level}-{type(packet).__name__}-{i}")
            for level in (4, 5) for maker in makers for i, packet in enumerate(maker(level))]


def _connected(level: int) -> tuple[MQTTConnection, MQTTConnection]:
    """Past CONNECT and CONNACK; on 5.0 with an authentication method, for the AUTHs."""
    return connected(level, ENHANCED if level == 5 else None)


@pytest.mark.parametrize(("level", "packet"), _cases(_both_ways, _client_only))
def test_client_to_server_round_trip(level: int, packet: Packet) -> None:
    client, server = _connected(level)
    assert deliver(client, server, packet) == packet


@pytest.mark.parametrize(("level", "packet"), _cases(_both_ways, _server_only))
def test_server_to_client_round_trip(level: int, packet: Packet) -> None:
    client, server = _connected(level)
    assert deliver(server, client, packet) == packet


@pytest.mark.parametrize("level", [4, 5])
def test_a_whole_session_both_ways(level: int) -> None:
    client, server = _connected(level)
    up = [p for p in _both_ways(level) + _client_only(level) if not isinstance(p, Disconnect)]
    down = [p for p in _both_ways(level) + _server_only(level) if not isinstance(p, Disconnect)]
    server.receive_data(b"".join(client.send(p) for p in up))
    client.receive_data(b"".join(server.send(p) for p in down))
    assert drain(server) == up
    assert drain(client) == down
    deliver(client, server, Disconnect())
    assert client.state is server.state is State.CLOSED


# --------------------------------------------------------------------------- golden bytes

GOLDEN: list[tuple[int, str, Packet, bytes]] = [
    # 3.1.1 section 3.1: protocol name, level 4, flags (clean session), keep alive 60, "a"
    (4, "c", Connect(client_id="a", keep_alive=60, clean_start=True),
     b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a"),
    (3, "c", Connect(protocol_level=3, client_id="a", keep_alive=60),
     b"\x10\x0f\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x01a"),
    # flags 0xEE: user name, password, will retain, will QoS 1, will, clean session
    (4, "c", Connect(client_id="a", username="u", password=b"p",
                     will=Will(topic="w", payload=b"x", qos=1, retain=True)),
     b"\x10\x19\x00\x04MQTT\x04\xee\x00\x3c\x00\x01a\x00\x01w\x00\x01x\x00\x01u\x00\x01p"),
    # 5.0 section 3.1.2.11: property length 5, Session Expiry Interval (0x11) = 10
    (5, "c", Connect(protocol_level=5, client_id="a",
                     properties=Properties(session_expiry_interval=10)),
     b"\x10\x13\x00\x04MQTT\x05\x02\x00\x3c\x05\x11\x00\x00\x00\x0a\x00\x01a"),
    (5, "c", Connect(protocol_level=5, client_id="a", will=Will(
        topic="w", properties=Properties(will_delay_interval=1))),
     b"\x10\x19\x00\x04MQTT\x05\x06\x00\x3c\x00\x00\x01a\x05\x18\x00\x00\x00\x01"
     b"\x00\x01w\x00\x00"),
    (4, "s", Connack(), b"\x20\x02\x00\x00"),
    (4, "s", Connack(session_present=True, reason_code=5), b"\x20\x02\x01\x05"),
    (5, "s", Connack(), b"\x20\x03\x00\x00\x00"),
    (5, "s", Connack(reason_code=0x86, properties=Properties(receive_maximum=5)),
     b"\x20\x06\x00\x86\x03\x21\x00\x05"),
    # 3.1.1 section 3.3: flags QoS 1 (0b0010), topic "a/b", packet id 10, payload
    (4, "c", Publish(topic="a/b", payload=b"hi", qos=1, packet_id=10),
     b"\x32\x09\x00\x03a/b\x00\x0ahi"),
    (4, "s", Publish(topic="a", payload=b"", qos=2, packet_id=1, dup=True, retain=True),
     b"\x3d\x05\x00\x01a\x00\x01"),
    (5, "c", Publish(topic="a", payload=b"x"), b"\x30\x05\x00\x01a\x00x"),
    # every property wire type at once (5.0 section 2.2.2.2, table 2.4)
    (5, "s", Publish(topic="t", payload=b"p", properties=Properties(
        payload_format_indicator=1, message_expiry_interval=0x01020304, content_type="ct",
        correlation_data=b"\x00\x01", subscription_identifiers=(128,), topic_alias=0x0A0B,
        user_properties=(("k", "v"), ("k", "w")))),
     b"\x30\x2a\x00\x01t\x25"
     b"\x01\x01" b"\x02\x01\x02\x03\x04" b"\x03\x00\x02ct" b"\x09\x00\x02\x00\x01"
     b"\x0b\x80\x01" b"\x23\x0a\x0b" b"\x26\x00\x01k\x00\x01v" b"\x26\x00\x01k\x00\x01w" b"p"),
    (4, "c", Puback(packet_id=10), b"\x40\x02\x00\x0a"),
    (4, "s", Pubrec(packet_id=10), b"\x50\x02\x00\x0a"),
    (4, "c", Pubrel(packet_id=10), b"\x62\x02\x00\x0a"),
    (4, "s", Pubcomp(packet_id=10), b"\x70\x02\x00\x0a"),
    # 5.0 section 3.4.2.1: reason code 0 and no properties may be left out
    (5, "c", Puback(packet_id=10), b"\x40\x02\x00\x0a"),
    (5, "c", Puback(packet_id=10, reason_code=0x10), b"\x40\x03\x00\x0a\x10"),
    (5, "s", Pubrel(packet_id=10, reason_code=0x92, properties=Properties(reason_string="r")),
     b"\x62\x08\x00\x0a\x92\x04\x1f\x00\x01r"),
    (4, "c", Subscribe(packet_id=1, subscriptions=(SubscribeOption(topic_filter="a/#", qos=1),)),
     b"\x82\x08\x00\x01\x00\x03a/#\x01"),
    # 5.0 section 3.8.3.1: QoS 1 | No Local 0x04 | Retain As Published 0x08 | handling 2 << 4
    (5, "c", Subscribe(packet_id=1, subscriptions=(SubscribeOption(
        topic_filter="a", qos=1, no_local=True, retain_as_published=True, retain_handling=2),),
        properties=Properties(subscription_identifiers=(300,))),
     b"\x82\x0a\x00\x01\x03\x0b\xac\x02\x00\x01a\x2d"),
    (4, "s", Suback(packet_id=1, reason_codes=(1, 0x80)), b"\x90\x04\x00\x01\x01\x80"),
    (5, "s", Suback(packet_id=1, reason_codes=(0,)), b"\x90\x04\x00\x01\x00\x00"),
    (4, "c", Unsubscribe(packet_id=2, topic_filters=("a/#",)), b"\xa2\x07\x00\x02\x00\x03a/#"),
    (5, "c", Unsubscribe(packet_id=2, topic_filters=("a",)), b"\xa2\x06\x00\x02\x00\x00\x01a"),
    (4, "s", Unsuback(packet_id=2), b"\xb0\x02\x00\x02"),
    (5, "s", Unsuback(packet_id=2, reason_codes=(0x11,)), b"\xb0\x04\x00\x02\x00\x11"),
    (4, "c", Pingreq(), b"\xc0\x00"),
    (4, "s", Pingresp(), b"\xd0\x00"),
    (5, "c", Pingreq(), b"\xc0\x00"),
    (4, "c", Disconnect(), b"\xe0\x00"),
    (5, "c", Disconnect(), b"\xe0\x00"),
    (5, "s", Disconnect(reason_code=0x8B), b"\xe0\x02\x8b\x00"),
    (5, "c", Auth(reason_code=0x19, properties=Properties(authentication_method="m")),
     b"\xf0\x06\x19\x04\x15\x00\x01m"),
    (5, "s", Auth(reason_code=0x18, properties=Properties(authentication_method="m")),
     b"\xf0\x06\x18\x04\x15\x00\x01m"),
    (5, "s", Auth(properties=Properties(authentication_method="m")),
     b"\xf0\x06\x00\x04\x15\x00\x01m"),
]


@pytest.mark.parametrize(("level", "sender", "packet", "wire"), GOLDEN,
                         ids=[f"v{g[0]}-{type(g[2]).__name__}-{i}" for i, g in enumerate(GOLDEN)])
def test_golden_bytes(level: int, sender: str, packet: Packet, wire: bytes) -> None:
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    if not isinstance(packet, Connect):
        method = packet.properties.authentication_method if isinstance(packet, Auth) else None
        connect = Connect(protocol_level=level, properties=Properties(authentication_method=method))
        deliver(client, server, connect)
        if not isinstance(packet, Connack):
            deliver(server, client, connack_for(connect))
    src, dst = (client, server) if sender == "c" else (server, client)
    assert src.send(packet) == wire
    assert encode_packet(packet, level) == wire
    dst.receive_data(wire)
    assert dst.next_event() == packet
    assert dst.next_event() is NEED_DATA


@pytest.mark.parametrize(("wire", "packet"), [
    # 5.0 section 3.14.2.2: the property length may be left out when the reason code ends it
    (b"\xe0\x01\x04", Disconnect(reason_code=4)),
    (b"\xf0\x01\x18", Auth(reason_code=0x18)),
    # 5.0 section 3.15.2.1: a Success without properties may be left out whole (and a
    # connection then refuses it for its missing method: test_auth_rules)
    (b"\xf0\x00", Auth()),
    (b"\x40\x04\x00\x0a\x10\x00", Puback(packet_id=10, reason_code=0x10)),
    # property order carries no meaning (5.0 section 2.2.2.2)
    (b"\x30\x0e\x00\x01t\x09\x26\x00\x01k\x00\x01v\x01\x01p",
     Publish(topic="t", payload=b"p", properties=Properties(
         payload_format_indicator=1, user_properties=(("k", "v"),)))),
])
def test_decodes_other_encodings_the_spec_allows(wire: bytes, packet: Packet) -> None:
    assert decode_packet(wire[0], wire[2:], 5) == packet


# 5.0 section 1.5.5, table 1-1
REMAINING_LENGTHS = [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"), (2_097_151, b"\xff\xff\x7f"), (2_097_152, b"\x80\x80\x80\x01"),
    (268_435_455, b"\xff\xff\xff\x7f"),
]


@pytest.mark.parametrize(("n", "digits"), REMAINING_LENGTHS)
def test_remaining_length_digits(n: int, digits: bytes) -> None:
    assert vbi(n) == digits
    header = (b"\x30" if n else b"\xc0") + digits
    # the codec read exactly n: a limit one byte lower refuses the packet, n itself waits
    exact = server_at(4, max_packet_size=len(header) + n)
    exact.receive_data(header)
    assert exact.next_event() == (NEED_DATA if n else Pingreq())
    short = server_at(4, max_packet_size=len(header) + n - 1)
    short.receive_data(header)
    with pytest.raises(RemoteProtocolError) as info:
        short.next_event()
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE


@pytest.mark.parametrize(("n", "digits"), [r for r in REMAINING_LENGTHS if 3 <= r[0] <= 2_097_152])
def test_remaining_length_encoded_and_decoded(n: int, digits: bytes) -> None:
    client, server = connected(4)
    packet = Publish(topic="t", payload=b"z" * (n - 3))
    wire = client.send(packet)
    assert wire[:1 + len(digits)] == b"\x30" + digits
    assert len(wire) == 1 + len(digits) + n
    server.receive_data(wire)
    assert server.next_event() == packet


def test_a_varint_over_four_digits_is_refused_when_sent() -> None:
    _, server = connected(5)
    with pytest.raises(LocalProtocolError):
        server.send(Publish(topic="t", properties=Properties(
            subscription_identifiers=(MAX_REMAINING_LENGTH + 1,))))


@pytest.mark.parametrize(("wire", "packet"), [
    (b"\xc0\x80\x00", Pingreq()),  # remaining length 0 in two bytes
    (b"\xc0\x80\x80\x80\x00", Pingreq()),  # ... and in four
    (b"\x30\x86\x00\x00\x01t\x80\x00x", Publish(topic="t", payload=b"x")),  # property length
    (b"\x82\x0a\x00\x01\x03\x8b\x00\x05\x00\x01t\x00",  # property identifier 0x0B
     Subscribe(packet_id=1, subscriptions=(SubscribeOption(topic_filter="t"),),
               properties=Properties(subscription_identifiers=(5,)))),
])
def test_a_non_minimal_variable_byte_integer_is_not_an_error(wire: bytes, packet: Packet) -> None:
    # MQTT-1.5.5-1 binds the sender; only a fifth byte makes the packet malformed
    server = server_at(5)
    server.receive_data(wire)
    assert drain(server) == [packet]


# --------------------------------------------------------------------------- byte at a time


@pytest.mark.parametrize("level", [4, 5])
def test_byte_at_a_time(level: int) -> None:
    client, connect_wire, _ = connecting_client(level)
    packets: list[Packet] = [_connects()[-1] if level == 5 else _connects()[2]]
    wires = [connect_wire]
    for p in [q for q in _both_ways(level) + _client_only(level)
              if not isinstance(q, Disconnect)] + [Disconnect()]:
        packets.append(p)
        wires.append(client.send(p))
    server = MQTTConnection(Role.SERVER)
    got: list[Packet] = []
    for wire, packet in zip(wires, packets, strict=True):
        for i in range(len(wire)):
            server.receive_data(wire[i:i + 1])
            event = server.next_event()
            if i < len(wire) - 1:
                assert event is NEED_DATA, (packet, i)
            else:
                assert event == packet
                got.append(event)
                assert server.next_event() is NEED_DATA
                if isinstance(event, Connect):
                    server.send(connack_for(event))
    assert got == packets
    assert server.state is State.CLOSED


# --------------------------------------------------------------------------- state machine


def _raises(conn: MQTTConnection, data: bytes, code: int,
            error: type[RemoteProtocolError] = RemoteProtocolError) -> RemoteProtocolError:
    conn.receive_data(data)
    with pytest.raises(error) as info:
        drain(conn)
    assert info.value.reason_code == code, info.value
    return info.value


@pytest.mark.parametrize("first", [b"\xc0\x00", b"\x30\x03\x00\x01t", b"\xe0\x00",
                                   b"\xf0\x00", b"\x82\x06\x00\x01\x00\x01t\x00"])
def test_first_packet_must_be_connect(first: bytes) -> None:
    _raises(MQTTConnection(Role.SERVER), first, PROTOCOL)


@pytest.mark.parametrize("connected_first", [False, True])
@pytest.mark.parametrize("level", [4, 5])
def test_second_connect_is_a_protocol_error(level: int, connected_first: bool) -> None:
    server = MQTTConnection(Role.SERVER)
    server.receive_data(connect_bytes(level))
    assert isinstance(server.next_event(), Connect)
    if connected_first:
        server.send(Connack())
    _raises(server, connect_bytes(level), PROTOCOL)  # MQTT-3.1.0-2


def test_auth_is_refused_on_level_4() -> None:
    _raises(server_at(4), b"\xf0\x00", PROTOCOL)
    client, server = connected(4)
    with pytest.raises(LocalProtocolError):
        client.send(Auth())
    with pytest.raises(LocalProtocolError):
        server.send(Auth())


def test_auth_exchange_before_connack_on_level_5() -> None:
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    method = Properties(authentication_method="SCRAM", authentication_data=b"1")
    deliver(client, server, Connect(protocol_level=5, properties=method))
    assert client.auth_method == server.auth_method == "SCRAM"
    challenge = Auth(reason_code=ReasonCode.CONTINUE_AUTHENTICATION, properties=method)
    assert deliver(server, client, challenge) == challenge
    answer = Auth(reason_code=ReasonCode.CONTINUE_AUTHENTICATION, properties=method)
    assert deliver(client, server, answer) == answer
    assert client.state is server.state is State.CONNECTING
    deliver(server, client, Connack(properties=Properties(authentication_method="SCRAM")))
    assert client.state is server.state is State.CONNECTED


def _auth(code: int, method: str | None = "m") -> Auth:
    return Auth(reason_code=code, properties=Properties(authentication_method=method))


CONTINUE, REAUTH = ReasonCode.CONTINUE_AUTHENTICATION, ReasonCode.RE_AUTHENTICATE
# 5.0 section 4.12: (the CONNECT's method, CONNACK sent yet, who sends the AUTH, the AUTH,
# whether it is allowed)
AUTH_RULES: list[tuple[str, str | None, bool, Role, Auth, bool]] = [
    # MQTT-4.12.0-6, MQTT-4.12.0-7: no AUTH either way when the CONNECT named no method
    ("no method: client", None, True, Role.CLIENT, _auth(REAUTH), False),
    ("no method: server", None, True, Role.SERVER, _auth(CONTINUE), False),
    ("no method: client before CONNACK", None, False, Role.CLIENT, _auth(CONTINUE), False),
    ("no method: server before CONNACK", None, False, Role.SERVER, _auth(CONTINUE), False),
    # MQTT-4.12.0-5, section 3.15.2.2.2: every AUTH names the CONNECT's method
    ("another method", "m", True, Role.CLIENT, _auth(REAUTH, "x"), False),
    ("another method from the server", "m", False, Role.SERVER, _auth(CONTINUE, "x"), False),
    ("no method on the AUTH", "m", True, Role.CLIENT, _auth(REAUTH, None), False),
    # MQTT-3.15.2-1 with table 3.15.2.1, and section 4.12.1
    ("continue before CONNACK: client", "m", False, Role.CLIENT, _auth(CONTINUE), True),
    ("continue before CONNACK: server", "m", False, Role.SERVER, _auth(CONTINUE), True),
    ("re-authenticate before CONNACK", "m", False, Role.CLIENT, _auth(REAUTH), False),
    ("success before CONNACK", "m", False, Role.SERVER, _auth(0), False),
    ("re-authenticate", "m", True, Role.CLIENT, _auth(REAUTH), True),
    ("continue after CONNACK: client", "m", True, Role.CLIENT, _auth(CONTINUE), True),
    ("continue after CONNACK: server", "m", True, Role.SERVER, _auth(CONTINUE), True),
    ("success after CONNACK", "m", True, Role.SERVER, _auth(0), True),
    ("success from the client", "m", True, Role.CLIENT, _auth(0), False),
    ("re-authenticate from the server", "m", True, Role.SERVER, _auth(REAUTH), False),
    ("not an authenticate reason code", "m", True, Role.CLIENT, _auth(0x87), False),
]


@pytest.mark.parametrize(("method", "acked", "sender", "packet", "allowed"),
                         [r[1:] for r in AUTH_RULES], ids=[r[0] for r in AUTH_RULES])
def test_auth_rules(method: str | None, acked: bool, sender: Role, packet: Auth,
                    allowed: bool) -> None:
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    connect = Connect(protocol_level=5, properties=Properties(authentication_method=method))
    deliver(client, server, connect)
    if acked:
        deliver(server, client, connack_for(connect))
    me, peer = (client, server) if sender is Role.CLIENT else (server, client)
    before = me.state
    if allowed:
        assert deliver(me, peer, packet) == packet
        assert me.state is peer.state is before
        return
    with pytest.raises(LocalProtocolError) as info:
        me.send(packet)
    assert info.value.reason_code == PROTOCOL
    assert me.state is before  # nothing went out
    # the same bytes, arriving, are the peer's protocol error; it may still say so
    _raises(peer, encode_packet(packet, 5), PROTOCOL)
    assert peer.state is (State.FAILED if acked else State.REFUSING)


@pytest.mark.parametrize(("method", "connack", "allowed"), [
    ("m", Connack(properties=Properties(authentication_method="m")), True),
    ("m", Connack(), False),  # MQTT-4.12.0-5: a successful CONNACK names the method
    ("m", Connack(properties=Properties(authentication_method="x")), False),
    (None, Connack(properties=Properties(authentication_method="m")), False),  # MQTT-4.12.0-6
    ("m", Connack(reason_code=ReasonCode.NOT_AUTHORIZED), True),  # a refusal need not
    ("m", Connack(reason_code=ReasonCode.BAD_AUTHENTICATION_METHOD), True),
], ids=["same method", "no method", "another method", "a method unasked", "not authorized",
        "bad authentication method"])
def test_a_connack_names_the_connects_authentication_method(method: str | None,
                                                             connack: Connack,
                                                             allowed: bool) -> None:
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    deliver(client, server, Connect(protocol_level=5,
                                    properties=Properties(authentication_method=method)))
    if allowed:
        assert deliver(server, client, connack) == connack
        return
    with pytest.raises(LocalProtocolError) as info:
        server.send(connack)
    assert info.value.reason_code == PROTOCOL
    assert server.state is State.CONNECTING
    _raises(client, encode_packet(connack, 5), PROTOCOL)


@pytest.mark.parametrize(("role", "packet"), [
    (Role.CLIENT, Suback(packet_id=1, reason_codes=(0,))),
    (Role.CLIENT, Unsuback(packet_id=1)),
    (Role.CLIENT, Pingresp()),
    (Role.CLIENT, Connack()),
    (Role.SERVER, Subscribe(packet_id=1, subscriptions=(SubscribeOption(topic_filter="t"),))),
    (Role.SERVER, Unsubscribe(packet_id=1, topic_filters=("t",))),
    (Role.SERVER, Pingreq()),
    (Role.SERVER, Connect()),
])
def test_packets_the_other_side_sends_are_refused(role: Role, packet: Packet) -> None:
    client, server = connected(4)
    me, peer = (client, server) if role is Role.CLIENT else (server, client)
    with pytest.raises(LocalProtocolError) as info:
        me.send(packet)
    assert info.value.reason_code == PROTOCOL
    # and the same bytes, arriving at the peer, are a remote error
    _raises(peer, encode_packet(packet, 4), PROTOCOL)


def test_nothing_but_connack_auth_or_disconnect_before_connack() -> None:
    client, server = MQTTConnection(Role.CLIENT), MQTTConnection(Role.SERVER)
    deliver(client, server, Connect(protocol_level=5))
    with pytest.raises(LocalProtocolError):
        server.send(Publish(topic="t"))
    with pytest.raises(LocalProtocolError):  # MQTT-3.14.0-1
        server.send(Disconnect(reason_code=ReasonCode.UNSPECIFIED_ERROR))
    with pytest.raises(LocalProtocolError):
        client.send(Pingreq())
    _raises(client, b"\x30\x04\x00\x01t\x00", PROTOCOL)


def test_data_after_disconnect() -> None:
    client, server = connected(4)
    deliver(client, server, Disconnect())
    assert server.state is State.CLOSED
    assert server.next_event() is NEED_DATA
    _raises(server, b"\xc0\x00", PROTOCOL)
    with pytest.raises(LocalProtocolError):
        client.send(Pingreq())


def test_after_an_error_every_next_event_raises_again() -> None:
    server = server_at(4)
    first = _raises(server, b"\x36\x03\x00\x01t", MALFORMED)
    assert server.state is State.CLOSED
    for _ in range(3):
        server.receive_data(b"\xc0\x00")
        with pytest.raises(RemoteProtocolError) as info:
            server.next_event()
        assert info.value is first


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_after_an_error_a_v5_connection_may_still_send_disconnect(role: Role) -> None:
    # 5.0 section 4.13.1: DISCONNECT with the reason code, then close
    client, server = connected(5)
    me, peer = (server, client) if role is Role.SERVER else (client, server)
    _raises(me, b"\x36\x03\x00\x01t", MALFORMED)
    assert me.state is State.FAILED
    with pytest.raises(LocalProtocolError):
        me.send(Pingresp() if role is Role.SERVER else Pingreq())
    peer.receive_data(me.send(Disconnect(reason_code=MALFORMED)))
    assert drain(peer) == [Disconnect(reason_code=MALFORMED)]
    assert me.state is peer.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        me.send(Disconnect())


def test_after_an_error_before_connack_a_311_server_sends_nothing_more() -> None:
    server = MQTTConnection(Role.SERVER)
    server.receive_data(connect_bytes(4))
    server.next_event()
    _raises(server, b"\xc0\x00", PROTOCOL)
    assert server.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        server.send(Connack(reason_code=2))


@pytest.mark.parametrize("data", [
    b"\xc0\x00",  # a PINGREQ before the CONNACK
    # a CONNECT with authentication data and no method (5.0 section 3.1.2.11.10)
    connect_bytes(5, props=b"\x04\x16\x00\x01x"),
], ids=["after the CONNECT", "in the CONNECT"])
def test_after_an_error_before_connack_a_v5_server_may_refuse_with_connack(data: bytes) -> None:
    # 5.0 sections 3.1.4 and 4.13.1: a CONNACK with the reason code, then close; never a
    # DISCONNECT before a successful CONNACK (MQTT-3.14.0-1)
    server = MQTTConnection(Role.SERVER)
    if not data.startswith(b"\x10"):
        server.receive_data(connect_bytes(5))
        server.next_event()
    _raises(server, data, PROTOCOL)
    assert server.state is State.REFUSING
    with pytest.raises(LocalProtocolError):
        server.send(Disconnect(reason_code=PROTOCOL))
    with pytest.raises(LocalProtocolError):
        server.send(Pingresp())
    client = MQTTConnection(Role.CLIENT)
    client.send(Connect(protocol_level=5))
    client.receive_data(server.send(Connack(reason_code=PROTOCOL)))
    assert client.next_event() == Connack(reason_code=PROTOCOL)
    assert server.state is State.CLOSED


def test_unsupported_level_is_still_answered_with_connack() -> None:
    # 3.1.1 MQTT-3.1.2-2: CONNACK 0x01, then close; the codec must let the server send it
    server = MQTTConnection(Role.SERVER)
    server.receive_data(frame(0x10, s("MQTT") + b"\x06\x02\x00\x3c" + s("c")))
    with pytest.raises(UnsupportedProtocolVersion) as info:
        server.next_event()
    assert info.value.level == 6
    assert server.send(Connack(reason_code=1)) == b"\x20\x02\x00\x01"
    with pytest.raises(UnsupportedProtocolVersion):
        server.next_event()


# --------------------------------------------------------------------------- bad input

BAD: list[tuple[str, int | None, bytes, int]] = [
    # level None: straight after the TCP connect; otherwise after CONNECT + CONNACK
    ("remaining length of five bytes", None, b"\x10\xff\xff\xff\xff\x01", MALFORMED),
    ("remaining length of five bytes, connected", 5, b"\x30\x80\x80\x80\x80\x01", MALFORMED),
    ("packet type 0", 4, b"\x00\x00", MALFORMED),
    ("SUBSCRIBE without its 0b0010 flags", 4, b"\x80\x06\x00\x01\x00\x01t\x00", MALFORMED),
    ("PUBREL without its 0b0010 flags", 4, b"\x60\x02\x00\x01", MALFORMED),
    ("PINGREQ with flags", 4, b"\xc1\x00", MALFORMED),
    ("PINGREQ with a body", 4, b"\xc0\x01\x00", MALFORMED),
    ("PUBACK too short", 4, b"\x40\x01\x00", MALFORMED),
    ("PUBACK reason code on 3.1.1", 4, b"\x40\x03\x00\x01\x10", MALFORMED),
    ("DISCONNECT body on 3.1.1", 4, b"\xe0\x01\x04", MALFORMED),
    ("topic runs past the packet", 4, b"\x30\x03\x00\x05t", MALFORMED),
    ("PUBLISH QoS 3", 4, b"\x36\x05\x00\x01t\x00\x01", MALFORMED),
    ("PUBLISH QoS 3, v5", 5, b"\x36\x06\x00\x01t\x00\x01\x00", MALFORMED),
    ("DUP on QoS 0", 4, b"\x38\x03\x00\x01t", PROTOCOL),
    ("PUBLISH topic with +", 4, b"\x30\x05\x00\x03a/+", ReasonCode.TOPIC_NAME_INVALID),
    ("PUBLISH topic with #", 5, b"\x30\x06\x00\x03a/#\x00", ReasonCode.TOPIC_NAME_INVALID),
    ("PUBLISH without a topic", 4, b"\x30\x02\x00\x00", PROTOCOL),
    ("PUBLISH without a topic or alias", 5, b"\x30\x03\x00\x00\x00", PROTOCOL),
    ("PUBLISH packet id 0", 4, b"\x32\x05\x00\x01t\x00\x00", PROTOCOL),
    ("SUBSCRIBE packet id 0", 4, b"\x82\x06\x00\x00\x00\x01t\x00", PROTOCOL),
    ("UNSUBSCRIBE packet id 0", 4, b"\xa2\x05\x00\x00\x00\x01t", PROTOCOL),
    ("topic not UTF-8", 4, b"\x30\x03\x00\x01\xff", MALFORMED),
    ("topic with an overlong encoding", 4, b"\x30\x04\x00\x02\xc0\xaf", MALFORMED),
    ("topic with a surrogate", 4, b"\x30\x05\x00\x03\xed\xa0\x80", MALFORMED),  # MQTT-1.5.4-1
    ("topic with U+0000", 4, b"\x30\x05\x00\x03a\x00b", MALFORMED),  # MQTT-1.5.4-2
    ("filter with U+0000", 4, b"\x82\x06\x00\x01\x00\x01\x00\x00", MALFORMED),
    ("user property value not UTF-8", 5,
     b"\x30\x0b\x00\x01t\x07\x26\x00\x01k\x00\x01\xfe", MALFORMED),
    ("unknown property 0x04", 5, b"\x30\x06\x00\x01t\x01\x04\x00", MALFORMED),
    ("unknown property 0x7f", 5, b"\x30\x06\x00\x01t\x02\x7f\x00", MALFORMED),
    ("property length runs past", 5, b"\x30\x05\x00\x01t\x09\x01", MALFORMED),
    ("property value runs past", 5, b"\x30\x06\x00\x01t\x02\x02\x00", MALFORMED),
    ("content type twice", 5,
     b"\x30\x0c\x00\x01t\x08\x03\x00\x01a\x03\x00\x01b", PROTOCOL),  # 5.0 3.3.2.3.9
    ("topic alias twice", 5, b"\x30\x0a\x00\x01t\x06\x23\x00\x01\x23\x00\x02", PROTOCOL),
    # 5.0 section 2.2.2.2: an identifier not valid for its packet type is malformed
    ("session expiry on PUBLISH", 5, b"\x30\x09\x00\x01t\x05\x11\x00\x00\x00\x01", MALFORMED),
    ("topic alias on PUBACK", 5, b"\x40\x07\x00\x01\x00\x03\x23\x00\x01", MALFORMED),
    ("user property is fine on DISCONNECT but topic alias is not", 5,
     b"\xe0\x05\x00\x03\x23\x00\x01", MALFORMED),
    ("topic alias 0", 5, b"\x30\x07\x00\x01t\x03\x23\x00\x00", ReasonCode.TOPIC_ALIAS_INVALID),
    ("subscription identifier 0", 5, b"\x30\x06\x00\x01t\x02\x0b\x00", PROTOCOL),
    ("payload format 2", 5, b"\x30\x06\x00\x01t\x02\x01\x02", PROTOCOL),
    ("payload marked UTF-8 is not", 5, b"\x30\x07\x00\x01t\x02\x01\x01\xff",
     ReasonCode.PAYLOAD_FORMAT_INVALID),
    ("SUBSCRIBE without filters", 4, b"\x82\x02\x00\x01", PROTOCOL),  # MQTT-3.8.3-3
    ("SUBSCRIBE without filters, v5", 5, b"\x82\x03\x00\x01\x00", PROTOCOL),
    ("UNSUBSCRIBE without filters", 4, b"\xa2\x02\x00\x01", PROTOCOL),  # MQTT-3.10.3-2
    ("UNSUBSCRIBE without filters, v5", 5, b"\xa2\x03\x00\x01\x00", PROTOCOL),
    # 5.0 section 3.3.2.3.8: a client's PUBLISH MUST NOT carry a subscription identifier
    ("client PUBLISH with a subscription identifier", 5, b"\x30\x06\x00\x01t\x02\x0b\x01",
     PROTOCOL),
    ("client PUBLISH QoS 1 with two subscription identifiers", 5,
     b"\x32\x0a\x00\x01t\x00\x01\x04\x0b\x01\x0b\x02", PROTOCOL),
    # 1.5.5: a variable byte integer has at most four bytes, wherever it is
    ("property length of five bytes", 5, b"\x30\x08\x00\x01t\x80\x80\x80\x80\x00", MALFORMED),
    ("property identifier of five bytes", 5, b"\x30\x09\x00\x01t\x05\x80\x80\x80\x80\x01",
     MALFORMED),
    ("subscription identifier of five bytes", 5,
     b"\x82\x0d\x00\x01\x06\x0b\x80\x80\x80\x80\x01\x00\x01t\x00", MALFORMED),
    ("subscription QoS 3", 4, b"\x82\x06\x00\x01\x00\x01t\x03", MALFORMED),
    ("subscription reserved bits, 3.1.1", 4, b"\x82\x06\x00\x01\x00\x01t\x04", MALFORMED),
    ("subscription reserved bits, v5", 5, b"\x82\x07\x00\x01\x00\x00\x01t\x40", MALFORMED),
    ("retain handling 3", 5, b"\x82\x07\x00\x01\x00\x00\x01t\x30", PROTOCOL),
    ("two subscription ids on SUBSCRIBE", 5,
     b"\x82\x0b\x00\x01\x04\x0b\x01\x0b\x02\x00\x01t\x00", PROTOCOL),
    ("filter without its options byte", 4, b"\x82\x05\x00\x01\x00\x01t", MALFORMED),
    ("AUTH on 3.1.1", 4, b"\xf0\x00", PROTOCOL),
    ("AUTH without enhanced authentication", 5,
     b"\xf0\x06\x19\x04\x15\x00\x01m", PROTOCOL),  # MQTT-4.12.0-7
    ("authentication data without a method", None,
     connect_bytes(5, props=b"\x04\x16\x00\x01x"), PROTOCOL),  # 5.0 section 3.1.2.11.10
    # CONNECT (after nothing)
    ("client id not UTF-8", None, frame(0x10, s("MQTT") + b"\x04\x02\x00\x3c" + s(b"\xc3")),
     MALFORMED),
    ("client id with U+0000", None, frame(0x10, s("MQTT") + b"\x04\x02\x00\x3c" + s(b"\x00")),
     MALFORMED),
    ("CONNECT reserved flag", None, frame(0x10, s("MQTT") + b"\x04\x03\x00\x3c" + s("c")),
     MALFORMED),  # MQTT-3.1.2-3
    ("will QoS without a will", None, frame(0x10, s("MQTT") + b"\x04\x0a\x00\x3c" + s("c")),
     MALFORMED),
    ("will retain without a will", None, frame(0x10, s("MQTT") + b"\x04\x22\x00\x3c" + s("c")),
     MALFORMED),
    ("will QoS 3", None,
     frame(0x10, s("MQTT") + b"\x04\x1e\x00\x3c" + s("c") + s("w") + s(b"")), MALFORMED),
    ("will topic with a wildcard", None,
     frame(0x10, s("MQTT") + b"\x04\x06\x00\x3c" + s("c") + s("w/#") + s(b"")),
     ReasonCode.TOPIC_NAME_INVALID),
    ("password without user name, 3.1.1", None,
     frame(0x10, s("MQTT") + b"\x04\x42\x00\x3c" + s("c") + s(b"p")), MALFORMED),
    ("CONNECT ends before the user name", None,
     frame(0x10, s("MQTT") + b"\x04\x82\x00\x3c" + s("c")), MALFORMED),
    ("CONNECT with a topic alias", None,
     connect_bytes(5, props=b"\x03\x23\x00\x01"), MALFORMED),
    ("receive maximum 0", None, connect_bytes(5, props=b"\x03\x21\x00\x00"), PROTOCOL),
    ("maximum packet size 0", None,
     connect_bytes(5, props=b"\x05\x27\x00\x00\x00\x00"), PROTOCOL),
    ("session expiry twice", None,
     connect_bytes(5, props=b"\x0a\x11\x00\x00\x00\x01\x11\x00\x00\x00\x02"), PROTOCOL),
    ("request problem information 2", None, connect_bytes(5, props=b"\x02\x17\x02"), PROTOCOL),
    ("will property not allowed for a will", None,
     frame(0x10, s("MQTT") + b"\x05\x06\x00\x3c\x00" + s("c") + b"\x05\x11\x00\x00\x00\x01"
           + s("w") + s(b"")), MALFORMED),
    ("other protocol name", None, frame(0x10, s("MQTX") + b"\x04\x02\x00\x3c" + s("c")),
     PROTOCOL),  # MQTT-3.1.2-1: not MQTT at all, so no CONNACK
]


@pytest.mark.parametrize(("level", "data", "code"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(level: int | None, data: bytes, code: int) -> None:
    error = _raises(server_at(level), data, code)
    assert not isinstance(error, UnsupportedProtocolVersion)
    # and just the same one byte at a time
    slow = server_at(level)
    with pytest.raises(RemoteProtocolError) as info:
        for i in range(len(data)):
            slow.receive_data(data[i:i + 1])
            drain(slow)
    assert info.value.reason_code == code


@pytest.mark.parametrize(("name", "level"), [("MQTT", 6), ("MQTT", 3), ("MQTT", 0),
                                             ("MQIsdp", 4), ("MQIsdp", 5), ("MQTT", 255)])
def test_unsupported_protocol_version(name: str, level: int) -> None:
    data = frame(0x10, s(name) + bytes((level, 0x02)) + b"\x00\x3c" + s("c"))
    error = _raises(MQTTConnection(Role.SERVER), data, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                    UnsupportedProtocolVersion)
    assert isinstance(error, UnsupportedProtocolVersion) and error.level == level


def test_too_large_is_refused_before_the_body_arrives() -> None:
    server = server_at(4, max_packet_size=100)
    server.receive_data(b"\x30" + vbi(98))  # 1 + 1 + 98 = 100: fits, waits for the body
    assert server.next_event() is NEED_DATA
    server = server_at(4, max_packet_size=100)
    server.receive_data(b"\x30" + vbi(99))  # 101 bytes, and not one byte of the body yet
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    huge = server_at(4, max_packet_size=1 << 20)
    huge.receive_data(b"\x30\xff\xff\xff\x7f")
    with pytest.raises(RemoteProtocolError) as info:
        huge.next_event()
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_a_connect_over_the_limit_is_refused() -> None:
    server = MQTTConnection(Role.SERVER, max_packet_size=10)
    _raises(server, connect_bytes(4, client_id="a-long-client-id")[:3],
            ReasonCode.PACKET_TOO_LARGE)


@pytest.mark.parametrize("level", [4, 5])
def test_sending_over_the_peers_maximum_is_a_local_error(level: int) -> None:
    client, server = connected(level)
    small = Publish(topic="t", payload=b"x" * 10)
    size = len(client.send(small))
    client.peer_max_packet_size = server.peer_max_packet_size = size
    assert deliver(client, server, small) == small  # exactly the maximum is fine
    for me in (client, server):
        with pytest.raises(LocalProtocolError) as info:
            me.send(Publish(topic="t", payload=b"x" * 11))
        assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    assert client.state is server.state is State.CONNECTED
    assert deliver(server, client, Pingresp()) == Pingresp()


@pytest.mark.parametrize(("level", "wire"), [
    (4, b"\x90\x02\x00\x01"), (5, b"\x90\x03\x00\x01\x00"),  # SUBACK without a code
    (5, b"\xb0\x03\x00\x01\x00"),  # MQTT 5 UNSUBACK without a code
])
def test_a_suback_or_unsuback_without_reason_codes_is_refused(level: int, wire: bytes) -> None:
    client, _ = connected(level)
    _raises(client, wire, PROTOCOL)


def test_a_311_unsuback_has_no_payload() -> None:
    client, _ = connected(4)
    client.receive_data(b"\xb0\x02\x00\x01")
    assert drain(client) == [Unsuback(packet_id=1)]


@pytest.mark.parametrize(("role", "packet"), [
    (Role.CLIENT, Publish(topic="t", properties=Properties(subscription_identifiers=(1,)))),
    (Role.CLIENT, Subscribe(packet_id=1, subscriptions=())),
    (Role.CLIENT, Unsubscribe(packet_id=1, topic_filters=())),
    (Role.SERVER, Suback(packet_id=1, reason_codes=())),
    (Role.SERVER, Unsuback(packet_id=1)),
])
def test_protocol_errors_on_send(role: Role, packet: Packet) -> None:
    client, server = connected(5)
    with pytest.raises(LocalProtocolError) as info:
        (client if role is Role.CLIENT else server).send(packet)
    assert info.value.reason_code == PROTOCOL
    assert client.state is server.state is State.CONNECTED


@pytest.mark.parametrize("packet", [
    Publish(topic="t", qos=1),
    Publish(topic="t", qos=3, packet_id=1),
    Publish(topic="t" * 0x10000),
    Publish(topic="t", properties=Properties(session_expiry_interval=1)),
])
def test_local_errors_on_send(packet: Packet) -> None:
    client, _ = connected(5)
    with pytest.raises(LocalProtocolError):
        client.send(packet)


# --------------------------------------------------------------------------- fuzzing


def _mutate(rng: random.Random, data: bytes, keep: int) -> bytes:
    """``data`` with its first ``keep`` bytes intact and the rest damaged."""
    head, tail = bytearray(data[:keep]), bytearray(data[keep:])
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and tail:
            tail[rng.randrange(len(tail))] = rng.randrange(256)
        elif op == 1 and tail:
            i = rng.randrange(len(tail))
            tail[i] ^= 1 << rng.randrange(8)
        elif op == 2:
            del tail[rng.randrange(len(tail) + 1):]
        elif op == 3:
            i = rng.randrange(len(tail) + 1)
            tail[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 4 and tail:
            i = rng.randrange(len(tail))
            del tail[i:i + rng.randint(1, 8)]
        else:
            tail += rng.randbytes(rng.randint(1, 40))
    return bytes(head + tail)


def _feed(conn: MQTTConnection, data: bytes, rng: random.Random) -> None:
    """Feed ``data`` in random chunks; only packets, NEED_DATA or RemoteProtocolError."""
    calls, limit = 0, 2 * len(data) + 10
    pos = 0
    try:
        while pos < len(data):
            step = rng.choice((1, 2, 7, len(data)))
            conn.receive_data(data[pos:pos + step])
            pos += step
            while True:
                calls += 1
                assert calls <= limit, "next_event does not make progress"
                event = conn.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, Connect) and conn.role is Role.SERVER:
                    conn.send(connack_for(event))
    except RemoteProtocolError:
        with pytest.raises(RemoteProtocolError):
            conn.next_event()


def _streams(level: int) -> tuple[bytes, list[bytes], list[bytes]]:
    """A CONNECT, then each packet a client sends, then each a server sends (CONNACK first)."""
    client, connect, connack = connecting_client(level)
    _, server = _connected(level)  # the method of _connects()[-1], which the AUTHs name

    def small(p: Packet) -> bool:  # mutations land in headers, not in one big payload
        return not isinstance(p, Disconnect) and len(getattr(p, "payload", b"")) < 64

    up = [client.send(p) for p in _both_ways(level) + _client_only(level) if small(p)]
    down = [server.send(p) for p in _both_ways(level) + _server_only(level) if small(p)]
    return connect, up, [connack, *down]


def _run(rng: random.Random, wires: list[bytes]) -> bytes:
    i = rng.randrange(len(wires))
    return b"".join(wires[i:i + rng.randint(1, 4)])


def test_fuzz() -> None:
    rng = random.Random(0x4D515454)
    streams = {level: _streams(level) for level in (4, 5)}
    for case in range(20_000):
        level = 5 if case % 2 else 4
        connect, up, down = streams[level]
        kind = case % 10
        if kind < 5:  # a valid CONNECT, then damaged packets
            data = _mutate(rng, connect + _run(rng, up), len(connect))
        elif kind < 7:  # a valid CONNECT, then noise
            data = connect + rng.randbytes(rng.randint(0, 64))
        elif kind < 8:  # the CONNECT itself damaged
            data = _mutate(rng, connect + _run(rng, up), 0)
        else:  # what a server sends, damaged, at a client
            client = MQTTConnection(Role.CLIENT)
            client.send(ENHANCED if level == 5 else Connect(protocol_level=level))
            data = down[0] + _run(rng, down[1:])  # kind 9 damages the CONNACK too
            _feed(client, _mutate(rng, data, 0 if kind == 9 else len(down[0])), rng)
            continue
        try:
            _feed(MQTTConnection(Role.SERVER, max_packet_size=rng.choice((256, 4096, 1 << 28))),
                  data, rng)
        except Exception as exc:
            raise AssertionError(f"case {case}: {data!r}") from exc


def test_fuzz_decode_packet() -> None:
    rng = random.Random(1883)
    for _ in range(5_000):
        first = rng.randrange(256)
        body = rng.randbytes(rng.randint(0, 24))
        for version in (4, 5):
            try:
                decode_packet(first, body, version)
            except RemoteProtocolError:
                pass
