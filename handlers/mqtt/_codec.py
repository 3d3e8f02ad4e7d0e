"""Sans-IO codec for MQTT 3.1.1 and 5.0.

Theory of operation
-------------------
:class:`MQTTConnection` turns bytes into packets and packets into bytes, and does nothing
else: no sockets, no trio, no broker. The session feeds it with
:meth:`~MQTTConnection.receive_data`, pulls packets with
:meth:`~MQTTConnection.next_event` until it gets :data:`NEED_DATA`, and writes what
:meth:`~MQTTConnection.send` returns.

Framing (3.1.1 and 5.0 section 2.1)::

    [type << 4 | flags  u8][remaining length: variable byte integer, 1-4 bytes][rest]

The remaining length is checked against ``max_packet_size`` as soon as its last byte
has arrived, before any byte of the body is waited for, so a peer cannot make us buffer
more than one packet's worth (5.0 section 3.1.2.11.4: a packet over the limit is
answered with DISCONNECT 0x95).

The version is fixed by the CONNECT (its protocol level: 3 and 4 are 3.1.1's framing, 5
is 5.0's, which adds properties and reason codes). Rules live in one table,
:data:`TRANSITIONS`: (state, who sends, packet type) -> next state. Before CONNECT only
CONNECT is legal (3.1.1 section 3.1: "the first packet sent from the Client to the Server
MUST be a CONNECT"); a second CONNECT is a protocol violation (MQTT-3.1.0-2); AUTH exists
in 5.0 only. A move that is not in the table raises :class:`RemoteProtocolError` for what
the peer sent and :class:`LocalProtocolError` for what we tried to send; both carry the
5.0 reason code (a 3.1.1 session just closes the connection). What one side may not put
on a packet the other may send (a client's PUBLISH with a Subscription Identifier) is
the table :data:`SENDER_FORBIDDEN`. After a remote error the connection is dead: every
later ``next_event`` raises again, and all that may still be sent is, on a connected 5.0
connection, the DISCONNECT that names the error (state FAILED); before the CONNACK, the
CONNACK that refuses the connection (state REFUSING: MQTT-3.14.0-1 forbids a server's
DISCONNECT before a successful CONNACK).

Enhanced authentication (5.0 section 4.12) is bound to the Authentication Method of the
CONNECT, which the connection keeps (:attr:`MQTTConnection.auth_method`): without one no
AUTH may go either way (MQTT-4.12.0-6, -7) and the CONNACK names none; with one every AUTH
and a successful CONNACK name that same method (MQTT-4.12.0-5). Which Authenticate Reason
Code each side may send before and after the CONNACK is the table
:data:`AUTH_REASON_CODES`. What the method's data mean, and when an exchange is complete,
is the session's business.

Bad bytes raise only :class:`RemoteProtocolError` (fuzzed in the tests): every length is
checked against what is left before anything is sliced, and strings are strict UTF-8
without U+0000 (MQTT-1.5.3-1, -2).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import replace
from typing import Any, Final

from handlers.mqtt._packets import (
    NO_PROPERTIES,
    PACKET_TYPES,
    PROPERTIES_ALLOWED,
    PROPERTY_IDS,
    PROPERTY_TYPES,
    PROTOCOL_LEVELS,
    REPEATABLE,
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
    _Kind,
    _PacketAck,
)

__all__ = ["NEED_DATA", "MQTTConnection", "ProtocolError", "LocalProtocolError",
           "RemoteProtocolError", "UnsupportedProtocolVersion", "Role", "State",
           "MAX_REMAINING_LENGTH", "encode_packet", "decode_packet", "valid_topic_name"]


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()

MAX_REMAINING_LENGTH = 268_435_455
"""The largest remaining length four variable-byte digits hold (section 1.5.5)."""
MAX_VARINT = MAX_REMAINING_LENGTH
MAX_PACKET_ID = 0xFFFF

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class ProtocolError(Exception):
    """A breach of the MQTT specification, with the 5.0 reason code that names it."""

    def __init__(self, message: str, reason_code: int = ReasonCode.MALFORMED_PACKET):
        super().__init__(message)
        self.reason_code = int(reason_code)


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol forbids."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids."""


class UnsupportedProtocolVersion(RemoteProtocolError):
    """A CONNECT naming a protocol level the broker does not speak: answered with CONNACK
    0x01 (3.1.1, MQTT-3.1.2-2) or 0x84 (5.0), then the connection closes."""

    def __init__(self, level: int, name: str):
        super().__init__(f"unsupported protocol {name!r} level {level}",
                         ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)
        self.level = level


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    AWAIT_CONNECT = "await-connect"
    CONNECTING = "connecting"  # CONNECT seen, no CONNACK yet (5.0: AUTH may go both ways)
    CONNECTED = "connected"
    FAILED = "failed"  # the peer broke the protocol: a last DISCONNECT may still go out
    REFUSING = "refusing"  # the same before CONNACK: a last CONNACK may still refuse it
    CLOSED = "closed"


_C, _S = Role.CLIENT, Role.SERVER
_SESSION_PACKETS_BOTH = (PacketType.PUBLISH, PacketType.PUBACK, PacketType.PUBREC,
                         PacketType.PUBREL, PacketType.PUBCOMP, PacketType.DISCONNECT,
                         PacketType.AUTH)

#: (state, sender, packet type) -> next state.
TRANSITIONS: dict[tuple[State, Role, PacketType], State] = {
    (State.AWAIT_CONNECT, _C, PacketType.CONNECT): State.CONNECTING,
    (State.CONNECTING, _C, PacketType.AUTH): State.CONNECTING,
    (State.CONNECTING, _S, PacketType.AUTH): State.CONNECTING,
    (State.CONNECTING, _S, PacketType.CONNACK): State.CONNECTED,
    # MQTT-3.14.0-1: the server sends no DISCONNECT before a CONNACK under 0x80; a client
    # may give up at any time (section 3.14)
    (State.CONNECTING, _C, PacketType.DISCONNECT): State.CLOSED,
    **{(State.CONNECTED, who, t): State.CONNECTED
       for who in (_C, _S) for t in _SESSION_PACKETS_BOTH if t != PacketType.DISCONNECT},
    (State.CONNECTED, _C, PacketType.DISCONNECT): State.CLOSED,
    (State.CONNECTED, _S, PacketType.DISCONNECT): State.CLOSED,
    (State.CONNECTED, _C, PacketType.SUBSCRIBE): State.CONNECTED,
    (State.CONNECTED, _C, PacketType.UNSUBSCRIBE): State.CONNECTED,
    (State.CONNECTED, _C, PacketType.PINGREQ): State.CONNECTED,
    (State.CONNECTED, _S, PacketType.SUBACK): State.CONNECTED,
    (State.CONNECTED, _S, PacketType.UNSUBACK): State.CONNECTED,
    (State.CONNECTED, _S, PacketType.PINGRESP): State.CONNECTED,
    # 5.0 section 4.13.1: on a malformed packet or a protocol error the receiver may send
    # DISCONNECT with the reason code before it closes the connection
    (State.FAILED, _C, PacketType.DISCONNECT): State.CLOSED,
    (State.FAILED, _S, PacketType.DISCONNECT): State.CLOSED,
    # an error in or after the CONNECT, before the CONNACK: the server may answer with a
    # CONNACK naming it (5.0 sections 3.1.4, 4.13.1; MQTT-3.1.2-2 for an unsupported level)
    (State.REFUSING, _S, PacketType.CONNACK): State.CLOSED,
    (State.REFUSING, _C, PacketType.DISCONNECT): State.CLOSED,
}

#: The Authenticate Reason Codes each side may send, by state (5.0 section 3.15.2.1,
#: MQTT-3.15.2-1): Continue authentication both ways; Success only from the server and only
#: after CONNACK, in answer to a re-authentication (before it, a CONNACK ends the
#: exchange); Re-authenticate only from the client once it has its CONNACK (section 4.12.1).
AUTH_REASON_CODES: dict[tuple[State, Role], frozenset[int]] = {
    (State.CONNECTING, _C): frozenset({ReasonCode.CONTINUE_AUTHENTICATION}),
    (State.CONNECTING, _S): frozenset({ReasonCode.CONTINUE_AUTHENTICATION}),
    (State.CONNECTED, _C): frozenset({ReasonCode.CONTINUE_AUTHENTICATION,
                                      ReasonCode.RE_AUTHENTICATE}),
    (State.CONNECTED, _S): frozenset({ReasonCode.SUCCESS, ReasonCode.CONTINUE_AUTHENTICATION}),
}

#: Properties a sender may not put on a packet though the packet type allows them:
#: 5.0 section 3.3.2.3.8, "A PUBLISH packet sent from a Client to a Server MUST NOT
#: contain a Subscription Identifier" (a protocol error).
SENDER_FORBIDDEN: dict[tuple[Role, PacketType], frozenset[str]] = {
    (_C, PacketType.PUBLISH): frozenset({"subscription_identifiers"}),
}

#: Fixed-header flags each packet type must carry (section 2.1.3, table 2.2); PUBLISH's
#: are its DUP, QoS and RETAIN bits.
_REQUIRED_FLAGS = {t: 0 for t in PacketType} | {
    PacketType.PUBREL: 0b0010, PacketType.SUBSCRIBE: 0b0010, PacketType.UNSUBSCRIBE: 0b0010}


# --------------------------------------------------------------------------- primitives


def _varint(n: int) -> bytes:
    if not 0 <= n <= MAX_VARINT:
        raise LocalProtocolError(f"{n} does not fit a variable byte integer")
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        if n:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


def _utf8(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise LocalProtocolError("a string is longer than 65535 bytes")
    return _U16.pack(len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise LocalProtocolError("binary data is longer than 65535 bytes")
    return _U16.pack(len(data)) + bytes(data)


class _Reader:
    """Reads fields off one packet's body, bound-checked: running past the end is a
    malformed packet, never an IndexError."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise RemoteProtocolError("packet ends inside a field")
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def byte(self) -> int:
        if self.pos >= self.end:
            raise RemoteProtocolError("packet ends inside a field")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def u16(self) -> int:
        return int(_U16.unpack(self.take(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def varint(self) -> int:
        value, shift = 0, 0
        for _ in range(4):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise RemoteProtocolError("variable byte integer longer than four bytes")

    def binary(self) -> bytes:
        return self.take(self.u16())

    def utf8(self) -> str:
        return _decode_utf8(self.binary())


def _decode_utf8(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"string is not valid UTF-8: {exc.reason}") from None
    if "\x00" in text:
        raise RemoteProtocolError("string holds U+0000")
    return text


def valid_topic_name(topic: str) -> bool:
    """A PUBLISH topic name: not empty and without wildcards (MQTT-4.7.3-1, MQTT-3.3.2-2)."""
    return bool(topic) and "+" not in topic and "#" not in topic


# --------------------------------------------------------------------------- properties


def _encode_properties(props: Properties, where: PacketType | str) -> bytes:
    allowed = PROPERTIES_ALLOWED[where]
    out = bytearray()
    for name in props.present():
        if name not in allowed:
            raise LocalProtocolError(f"property {name} is not allowed on {where}",
                                     ReasonCode.PROTOCOL_ERROR)
        pid = PROPERTY_IDS[name]
        kind = PROPERTY_TYPES[pid][1]
        value = getattr(props, name)
        values = value if name in REPEATABLE else (value,)
        for v in values:
            out.append(pid)
            out += _encode_value(kind, v)
    return _varint(len(out)) + bytes(out)


def _encode_value(kind: _Kind, v: Any) -> bytes:
    if kind is _Kind.BYTE:
        return bytes((int(v),))
    if kind is _Kind.U16:
        return _U16.pack(int(v))
    if kind is _Kind.U32:
        return _U32.pack(int(v))
    if kind is _Kind.VARINT:
        return _varint(int(v))
    if kind is _Kind.UTF8:
        return _utf8(v)
    if kind is _Kind.BINARY:
        return _binary(v)
    return _utf8(v[0]) + _utf8(v[1])


def _decode_properties(r: _Reader, where: PacketType | str) -> Properties:
    length = r.varint()
    if length > r.left():
        raise RemoteProtocolError("property length runs past the packet")
    end = r.pos + length
    allowed = PROPERTIES_ALLOWED[where]
    fields: dict[str, Any] = {}
    sub = _Reader(r.buf, r.pos, end)
    while sub.left():
        pid = sub.varint()
        spec = PROPERTY_TYPES.get(pid)
        if spec is None:
            raise RemoteProtocolError(f"unknown property identifier 0x{pid:02x}")
        name, kind = spec
        if name not in allowed:
            # 5.0 section 2.2.2.2: an identifier not valid for its packet type is malformed
            raise RemoteProtocolError(
                f"property {name} is not allowed on {getattr(where, 'name', where)}")
        value = _decode_value(sub, kind)
        if name in REPEATABLE:
            fields[name] = (*fields.get(name, ()), value)
        elif name in fields:
            # 5.0 section 2.2.2.2: a property other than these twice is a protocol error
            raise RemoteProtocolError(f"property {name} given twice", ReasonCode.PROTOCOL_ERROR)
        else:
            fields[name] = value
    r.pos = end
    props = Properties(**fields) if fields else NO_PROPERTIES
    _check_property_values(props)
    return props


def _decode_value(r: _Reader, kind: _Kind) -> Any:
    if kind is _Kind.BYTE:
        return r.byte()
    if kind is _Kind.U16:
        return r.u16()
    if kind is _Kind.U32:
        return r.u32()
    if kind is _Kind.VARINT:
        return r.varint()
    if kind is _Kind.UTF8:
        return r.utf8()
    if kind is _Kind.BINARY:
        return r.binary()
    return (r.utf8(), r.utf8())


def _check_property_values(p: Properties) -> None:
    """The value rules of 5.0 section 3.x.2.2 that are protocol errors."""
    if p.payload_format_indicator not in (None, 0, 1):
        raise RemoteProtocolError("payload format indicator is neither 0 nor 1",
                                  ReasonCode.PROTOCOL_ERROR)
    for name in ("request_problem_information", "request_response_information"):
        if getattr(p, name) not in (None, 0, 1):
            raise RemoteProtocolError(f"{name} is neither 0 nor 1", ReasonCode.PROTOCOL_ERROR)
    if p.receive_maximum == 0:
        raise RemoteProtocolError("receive maximum of 0", ReasonCode.PROTOCOL_ERROR)
    if p.maximum_packet_size == 0:
        raise RemoteProtocolError("maximum packet size of 0", ReasonCode.PROTOCOL_ERROR)
    if p.topic_alias == 0:
        raise RemoteProtocolError("topic alias 0", ReasonCode.TOPIC_ALIAS_INVALID)
    if any(not 0 < s <= MAX_VARINT for s in p.subscription_identifiers):
        raise RemoteProtocolError("subscription identifier 0", ReasonCode.PROTOCOL_ERROR)


# --------------------------------------------------------------------------- packets


def encode_packet(packet: Packet, version: int) -> bytes:
    """The bytes of ``packet`` in protocol level ``version`` (3, 4 or 5)."""
    kind = PACKET_TYPES[type(packet)]
    v5 = version >= 5
    flags = _REQUIRED_FLAGS[kind]
    body: bytes
    if isinstance(packet, Connect):
        body = _encode_connect(packet)
    elif isinstance(packet, Connack):
        body = bytes((int(packet.session_present), packet.reason_code))
        if v5:
            body += _encode_properties(packet.properties, kind)
    elif isinstance(packet, Publish):
        if packet.qos not in (0, 1, 2):
            raise LocalProtocolError(f"QoS {packet.qos}")
        flags = (packet.dup << 3) | (packet.qos << 1) | int(packet.retain)
        body = _utf8(packet.topic)
        if packet.qos:
            if not packet.packet_id:
                raise LocalProtocolError("a QoS 1 or 2 PUBLISH needs a packet identifier")
            body += _U16.pack(packet.packet_id)
        if v5:
            body += _encode_properties(packet.properties, kind)
        body += packet.payload
    elif isinstance(packet, _PacketAck):
        body = _U16.pack(packet.packet_id)
        # 5.0 section 3.4.2.1: reason code and properties may be left out when 0 and none
        if v5 and (packet.reason_code or packet.properties.present()):
            body += bytes((packet.reason_code,))
            if packet.properties.present():
                body += _encode_properties(packet.properties, kind)
    elif isinstance(packet, Subscribe):
        if not packet.subscriptions:
            raise LocalProtocolError("a SUBSCRIBE needs a topic filter", ReasonCode.PROTOCOL_ERROR)
        body = _U16.pack(packet.packet_id)
        if v5:
            body += _encode_properties(packet.properties, kind)
        for s in packet.subscriptions:
            opts = s.qos
            if v5:
                opts |= (s.no_local << 2) | (s.retain_as_published << 3) | (s.retain_handling << 4)
            body += _utf8(s.topic_filter) + bytes((opts,))
    elif isinstance(packet, Suback):
        if not packet.reason_codes:
            raise LocalProtocolError("a SUBACK needs a reason code", ReasonCode.PROTOCOL_ERROR)
        body = _U16.pack(packet.packet_id)
        if v5:
            body += _encode_properties(packet.properties, kind)
        body += bytes(packet.reason_codes)
    elif isinstance(packet, Unsubscribe):
        if not packet.topic_filters:
            raise LocalProtocolError("an UNSUBSCRIBE needs a topic filter",
                                     ReasonCode.PROTOCOL_ERROR)
        body = _U16.pack(packet.packet_id)
        if v5:
            body += _encode_properties(packet.properties, kind)
        body += b"".join(_utf8(f) for f in packet.topic_filters)
    elif isinstance(packet, Unsuback):
        body = _U16.pack(packet.packet_id)
        if v5 and not packet.reason_codes:
            raise LocalProtocolError("an MQTT 5 UNSUBACK needs a reason code",
                                     ReasonCode.PROTOCOL_ERROR)
        if v5:
            body += _encode_properties(packet.properties, kind) + bytes(packet.reason_codes)
    elif isinstance(packet, Pingreq | Pingresp):
        body = b""
    elif isinstance(packet, Disconnect):
        body = b""
        if v5 and (packet.reason_code or packet.properties.present()):
            body = bytes((packet.reason_code,)) + _encode_properties(packet.properties, kind)
    else:  # Auth
        if not v5:
            raise LocalProtocolError("AUTH exists in MQTT 5 only", ReasonCode.PROTOCOL_ERROR)
        body = b""
        if packet.reason_code or packet.properties.present():
            body = bytes((packet.reason_code,)) + _encode_properties(packet.properties, kind)
    return bytes(((kind << 4) | flags,)) + _varint(len(body)) + body


def _encode_connect(c: Connect) -> bytes:
    name = PROTOCOL_LEVELS.get(c.protocol_level)
    if name is None:
        raise LocalProtocolError(f"protocol level {c.protocol_level}")
    v5 = c.protocol_level >= 5
    flags = (c.clean_start << 1)
    if c.will is not None:
        flags |= 0b100 | (c.will.qos << 3) | (c.will.retain << 5)
    if c.password is not None:
        flags |= 0x40
    if c.username is not None:
        flags |= 0x80
    out = _utf8(name) + bytes((c.protocol_level, flags)) + _U16.pack(c.keep_alive)
    if v5:
        out += _encode_properties(c.properties, PacketType.CONNECT)
    out += _utf8(c.client_id)
    if c.will is not None:
        if v5:
            out += _encode_properties(c.will.properties, "will")
        out += _utf8(c.will.topic) + _binary(c.will.payload)
    if c.username is not None:
        out += _utf8(c.username)
    if c.password is not None:
        out += _binary(c.password)
    return out


_ACK_CLASSES: Final[dict[PacketType, type[Puback | Pubrec | Pubrel | Pubcomp]]] = {
    PacketType.PUBACK: Puback, PacketType.PUBREC: Pubrec,
    PacketType.PUBREL: Pubrel, PacketType.PUBCOMP: Pubcomp}


def decode_packet(first: int, body: bytes | memoryview, version: int) -> Packet:
    """Decode one packet: its fixed header's first byte and its body (the remaining
    length's bytes), in protocol level ``version`` (0 before the CONNECT says which)."""
    try:
        kind = PacketType(first >> 4)
    except ValueError:
        raise RemoteProtocolError("packet type 0 is reserved") from None
    flags = first & 0x0F
    if kind is not PacketType.PUBLISH and flags != _REQUIRED_FLAGS[kind]:
        raise RemoteProtocolError(f"{kind.name} with fixed-header flags {flags:04b}")
    r = _Reader(body)
    v5 = version >= 5
    packet: Packet
    if kind is PacketType.CONNECT:
        packet = _decode_connect(r)
    elif kind is PacketType.CONNACK:
        ack_flags = r.byte()
        if ack_flags & 0xFE:
            raise RemoteProtocolError("CONNACK reserved flags set")
        code = r.byte()
        props = _decode_properties(r, kind) if v5 else NO_PROPERTIES
        packet = Connack(session_present=bool(ack_flags & 1), reason_code=code, properties=props)
    elif kind is PacketType.PUBLISH:
        packet = _decode_publish(flags, r, v5)
    elif kind in (PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP):
        packet_id = r.u16()
        code, props = 0, NO_PROPERTIES
        if v5 and r.left():
            code = r.byte()
            if r.left():
                props = _decode_properties(r, kind)
        cls = _ACK_CLASSES[kind]
        packet = cls(packet_id=packet_id, reason_code=code, properties=props)
    elif kind is PacketType.SUBSCRIBE:
        packet = _decode_subscribe(r, v5)
    elif kind is PacketType.SUBACK:
        packet_id = r.u16()
        props = _decode_properties(r, kind) if v5 else NO_PROPERTIES
        if not r.left():
            # 3.1.1 section 3.9.3, 5.0 section 3.9.3: one code per filter of the SUBSCRIBE,
            # which has at least one
            raise RemoteProtocolError("SUBACK without a reason code", ReasonCode.PROTOCOL_ERROR)
        packet = Suback(packet_id=packet_id, reason_codes=tuple(r.take(r.left())), properties=props)
    elif kind is PacketType.UNSUBSCRIBE:
        packet_id = _packet_id(r)
        props = _decode_properties(r, kind) if v5 else NO_PROPERTIES
        filters = []
        while r.left():
            filters.append(r.utf8())
        if not filters:
            # MQTT-3.10.3-2: at least one topic filter
            raise RemoteProtocolError("UNSUBSCRIBE without a topic filter", ReasonCode.PROTOCOL_ERROR)
        packet = Unsubscribe(packet_id=packet_id, topic_filters=tuple(filters), properties=props)
    elif kind is PacketType.UNSUBACK:
        packet_id = r.u16()
        props = _decode_properties(r, kind) if v5 else NO_PROPERTIES
        if v5 and not r.left():
            # 5.0 section 3.11.3: one reason code per filter of the UNSUBSCRIBE (3.1.1's
            # UNSUBACK has no payload)
            raise RemoteProtocolError("UNSUBACK without a reason code", ReasonCode.PROTOCOL_ERROR)
        packet = Unsuback(packet_id=packet_id, reason_codes=tuple(r.take(r.left())) if v5 else (),
                          properties=props)
    elif kind in (PacketType.PINGREQ, PacketType.PINGRESP):
        packet = Pingreq() if kind is PacketType.PINGREQ else Pingresp()
    elif kind is PacketType.DISCONNECT:
        code, props = 0, NO_PROPERTIES
        if v5 and r.left():
            code = r.byte()
            if r.left():
                props = _decode_properties(r, kind)
        packet = Disconnect(reason_code=code, properties=props)
    else:
        if not v5:
            raise RemoteProtocolError("AUTH exists in MQTT 5 only", ReasonCode.PROTOCOL_ERROR)
        code, props = 0, NO_PROPERTIES
        if r.left():
            code = r.byte()
            if r.left():
                props = _decode_properties(r, kind)
        packet = Auth(reason_code=code, properties=props)
    if r.left():
        raise RemoteProtocolError(f"{kind.name} has {r.left()} bytes past its end")
    return packet


def _packet_id(r: _Reader) -> int:
    packet_id = r.u16()
    if packet_id == 0:
        # MQTT-2.3.1-1: a packet identifier is non-zero
        raise RemoteProtocolError("packet identifier 0", ReasonCode.PROTOCOL_ERROR)
    return packet_id


def _decode_connect(r: _Reader) -> Connect:
    name = r.utf8()
    level = r.byte()
    if PROTOCOL_LEVELS.get(level) != name:
        if name in ("MQTT", "MQIsdp"):
            raise UnsupportedProtocolVersion(level, name)
        # MQTT-3.1.2-1: another protocol name: close without a CONNACK
        raise RemoteProtocolError(f"protocol name {name!r} is not MQTT", ReasonCode.PROTOCOL_ERROR)
    v5 = level >= 5
    flags = r.byte()
    if flags & 0x01:
        raise RemoteProtocolError("CONNECT reserved flag set")  # MQTT-3.1.2-3
    will_flag = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if not will_flag and (will_qos or will_retain):
        raise RemoteProtocolError("will QoS or retain set without a will")  # MQTT-3.1.2-11,13,15
    if will_qos == 3:
        raise RemoteProtocolError("will QoS 3")  # MQTT-3.1.2-14
    has_password = bool(flags & 0x40)
    has_username = bool(flags & 0x80)
    if has_password and not has_username and not v5:
        raise RemoteProtocolError("password without a user name")  # MQTT-3.1.2-22
    keep_alive = r.u16()
    props = _decode_properties(r, PacketType.CONNECT) if v5 else NO_PROPERTIES
    client_id = r.utf8()
    will = None
    if will_flag:
        will_props = _decode_properties(r, "will") if v5 else NO_PROPERTIES
        topic = r.utf8()
        if not valid_topic_name(topic):
            raise RemoteProtocolError(f"will topic {topic!r} is not a topic name",
                                      ReasonCode.TOPIC_NAME_INVALID)
        will = Will(topic=topic, payload=r.binary(), qos=will_qos, retain=will_retain,
                    properties=will_props)
    username = r.utf8() if has_username else None
    password = r.binary() if has_password else None
    return Connect(protocol_level=level, client_id=client_id, clean_start=bool(flags & 0x02),
                   keep_alive=keep_alive, username=username, password=password, will=will,
                   properties=props)


def _decode_publish(flags: int, r: _Reader, v5: bool) -> Publish:
    dup, qos, retain = bool(flags & 0x08), (flags >> 1) & 0x03, bool(flags & 0x01)
    if qos == 3:
        raise RemoteProtocolError("PUBLISH with QoS 3")  # MQTT-3.3.1-4
    if dup and qos == 0:
        raise RemoteProtocolError("DUP set on a QoS 0 PUBLISH", ReasonCode.PROTOCOL_ERROR)
    topic = r.utf8()
    if "+" in topic or "#" in topic:
        raise RemoteProtocolError(f"wildcard in PUBLISH topic {topic!r}", ReasonCode.TOPIC_NAME_INVALID)
    packet_id = _packet_id(r) if qos else None
    props = _decode_properties(r, PacketType.PUBLISH) if v5 else NO_PROPERTIES
    if not topic and (not v5 or props.topic_alias is None):
        raise RemoteProtocolError("PUBLISH without a topic name", ReasonCode.PROTOCOL_ERROR)
    payload = r.take(r.left())
    if props.payload_format_indicator == 1:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            # 5.0 section 3.3.2.3.2: the receiver may check, and answers 0x99
            raise RemoteProtocolError("payload marked UTF-8 is not UTF-8",
                                      ReasonCode.PAYLOAD_FORMAT_INVALID) from None
    return Publish(topic=topic, payload=payload, qos=qos, retain=retain, dup=dup,
                   packet_id=packet_id, properties=props)


def _decode_subscribe(r: _Reader, v5: bool) -> Subscribe:
    packet_id = _packet_id(r)
    props = _decode_properties(r, PacketType.SUBSCRIBE) if v5 else NO_PROPERTIES
    if len(props.subscription_identifiers) > 1:
        raise RemoteProtocolError("SUBSCRIBE with two subscription identifiers",
                                  ReasonCode.PROTOCOL_ERROR)
    subs = []
    while r.left():
        topic_filter = r.utf8()
        opts = r.byte()
        qos = opts & 0x03
        if qos == 3:
            raise RemoteProtocolError("subscription QoS 3")  # MQTT-3.8.3-4
        if v5:
            if opts & 0xC0:
                raise RemoteProtocolError("subscription options reserved bits set")  # MQTT-3.8.3-5
            handling = (opts >> 4) & 0x03
            if handling == 3:
                raise RemoteProtocolError("retain handling 3", ReasonCode.PROTOCOL_ERROR)
            subs.append(SubscribeOption(topic_filter=topic_filter, qos=qos,
                                        no_local=bool(opts & 0x04),
                                        retain_as_published=bool(opts & 0x08),
                                        retain_handling=handling))
        else:
            if opts & 0xFC:
                raise RemoteProtocolError("subscription options reserved bits set")  # MQTT-3.8.3-4
            subs.append(SubscribeOption(topic_filter=topic_filter, qos=qos))
    if not subs:
        # MQTT-3.8.3-3: at least one topic filter
        raise RemoteProtocolError("SUBSCRIBE without a topic filter", ReasonCode.PROTOCOL_ERROR)
    return Subscribe(packet_id=packet_id, subscriptions=tuple(subs), properties=props)


# --------------------------------------------------------------------------- connection


class MQTTConnection:
    """One side of an MQTT connection, as a state machine over bytes.

    ``max_packet_size`` bounds what the peer may send us (the fixed header included);
    ``peer_max_packet_size`` what we may send (a 5.0 client's CONNECT property; the
    session sets it). ``version`` is 0 until a CONNECT fixes it.

    >>> server, client = MQTTConnection(Role.SERVER), MQTTConnection(Role.CLIENT)
    >>> server.receive_data(client.send(Connect(protocol_level=5, client_id="c1")))
    >>> server.next_event().client_id, server.version
    ('c1', 5)
    >>> client.receive_data(server.send(Connack()))
    >>> client.next_event()
    Connack(session_present=False, reason_code=0, properties=Properties())
    """

    def __init__(self, role: Role, *, max_packet_size: int = MAX_REMAINING_LENGTH + 5,
                 version: int = 0):
        self.role = role
        self.peer = Role.SERVER if role is Role.CLIENT else Role.CLIENT
        self.state = State.AWAIT_CONNECT
        self.version = version
        self.max_packet_size = max_packet_size
        self.peer_max_packet_size: int | None = None
        #: The CONNECT's Authentication Method (5.0 section 3.1.2.11.9): None, no enhanced
        #: authentication.
        self.auth_method: str | None = None
        self._buf = bytearray()
        self._pos = 0
        self._error: RemoteProtocolError | None = None

    def receive_data(self, data: bytes) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def next_event(self) -> Packet | _NeedData:
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except RemoteProtocolError as exc:
            self._error = exc
            # MQTT-3.1.2-2 and 5.0 section 3.1.2.2: an unsupported version is still answered
            # with a CONNACK; so is a 5.0 CONNECT with an error found once it is decoded, or
            # an error before the CONNACK (section 4.13.1)
            if isinstance(exc, UnsupportedProtocolVersion):
                self.state = State.REFUSING
            elif self.state is State.CONNECTED and self.version >= 5:
                self.state = State.FAILED
            elif self.state in (State.AWAIT_CONNECT, State.CONNECTING) and self.version >= 5:
                self.state = State.REFUSING
            else:
                self.state = State.CLOSED
            raise

    def _next(self) -> Packet | _NeedData:
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have < 2:
            return NEED_DATA
        length, shift, i = 0, 0, 1
        while True:
            if i >= have:
                if i > 4:
                    raise RemoteProtocolError("remaining length longer than four bytes")
                return NEED_DATA
            b = buf[pos + i]
            length |= (b & 0x7F) << shift
            i += 1
            if not b & 0x80:
                break
            if i > 4:
                raise RemoteProtocolError("remaining length longer than four bytes")
            shift += 7
        if i + length > self.max_packet_size:
            raise RemoteProtocolError(
                f"packet of {i + length} bytes exceeds the maximum packet size "
                f"{self.max_packet_size}", ReasonCode.PACKET_TOO_LARGE)
        if have < i + length:
            return NEED_DATA
        first = buf[pos]
        kind = first >> 4
        if kind and self.state is not State.CLOSED:
            self._check(self.peer, PacketType(kind), RemoteProtocolError)
        elif self.state is State.CLOSED:
            raise RemoteProtocolError("data after DISCONNECT", ReasonCode.PROTOCOL_ERROR)
        body = memoryview(buf)[pos + i:pos + i + length]
        try:
            packet = decode_packet(first, body, self.version)
        finally:
            body.release()
        self._pos = pos + i + length
        if isinstance(packet, Connect):
            self.version = packet.protocol_level
        ptype = PACKET_TYPES[type(packet)]
        self._check_properties(self.peer, ptype, packet, RemoteProtocolError)
        self._check_auth(self.peer, packet, RemoteProtocolError)
        self._advance(self.peer, ptype)
        return packet

    def send(self, packet: Packet) -> bytes:
        kind = PACKET_TYPES[type(packet)]
        self._check(self.role, kind, LocalProtocolError)
        if isinstance(packet, Connect):
            self.version = packet.protocol_level
        self._check_properties(self.role, kind, packet, LocalProtocolError)
        self._check_auth(self.role, packet, LocalProtocolError)
        data = encode_packet(packet, self.version)
        if self.peer_max_packet_size is not None and len(data) > self.peer_max_packet_size:
            raise LocalProtocolError(f"packet of {len(data)} bytes exceeds the peer's maximum "
                                     f"{self.peer_max_packet_size}", ReasonCode.PACKET_TOO_LARGE)
        self._advance(self.role, kind)
        return data

    def _check(self, who: Role, kind: PacketType, error: type[ProtocolError]) -> None:
        if kind is PacketType.AUTH and self.version and self.version < 5:
            raise error("AUTH exists in MQTT 5 only", ReasonCode.PROTOCOL_ERROR)
        if (self.state, who, kind) not in TRANSITIONS:
            raise error(f"{who.value} may not send {kind.name} in state {self.state.value}",
                        ReasonCode.PROTOCOL_ERROR)

    def _check_properties(self, who: Role, kind: PacketType, packet: Packet,
                          error: type[ProtocolError]) -> None:
        forbidden = SENDER_FORBIDDEN.get((who, kind))
        props = getattr(packet, "properties", None)
        if forbidden and props is not None:
            for name in forbidden.intersection(props.present()):
                raise error(f"a {who.value} may not send {name} on {kind.name}",
                            ReasonCode.PROTOCOL_ERROR)

    def _check_auth(self, who: Role, packet: Packet, error: type[ProtocolError]) -> None:
        """The rules of enhanced authentication (5.0 section 4.12) on ``packet``."""
        if isinstance(packet, Connect):
            props = packet.properties
            if props.authentication_data is not None and props.authentication_method is None:
                # 5.0 section 3.1.2.11.10
                raise error("authentication data without an authentication method",
                            ReasonCode.PROTOCOL_ERROR)
            self.auth_method = props.authentication_method
        elif isinstance(packet, Auth):
            method = packet.properties.authentication_method
            if self.auth_method is None:
                raise error("AUTH on a connection whose CONNECT named no authentication method",
                            ReasonCode.PROTOCOL_ERROR)  # MQTT-4.12.0-6, MQTT-4.12.0-7
            if method != self.auth_method:
                # section 3.15.2.2.2 (a method is required) and MQTT-4.12.0-5
                raise error(f"AUTH names the authentication method {method!r}, the CONNECT "
                            f"{self.auth_method!r}", ReasonCode.PROTOCOL_ERROR)
            if packet.reason_code not in AUTH_REASON_CODES.get((self.state, who), ()):
                raise error(f"a {who.value} may not send AUTH 0x{packet.reason_code:02x} in "
                            f"state {self.state.value}", ReasonCode.PROTOCOL_ERROR)
        elif (isinstance(packet, Connack) and self.version >= 5 and packet.reason_code < 0x80
              and packet.properties.authentication_method != self.auth_method):
            # MQTT-4.12.0-5: a successful CONNACK names the CONNECT's method; MQTT-4.12.0-6:
            # none when the CONNECT named none
            raise error(f"CONNACK names the authentication method "
                        f"{packet.properties.authentication_method!r}, the CONNECT "
                        f"{self.auth_method!r}", ReasonCode.PROTOCOL_ERROR)

    def _advance(self, who: Role, kind: PacketType) -> None:
        self.state = TRANSITIONS[(self.state, who, kind)]

    def with_topic(self, packet: Publish, topic: str) -> Publish:
        """``packet`` with its topic filled in (a 5.0 topic alias resolved by the session)."""
        return replace(packet, topic=topic)
