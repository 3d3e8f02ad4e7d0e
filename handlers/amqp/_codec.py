"""Sans-IO wire codec for AMQP 0-9-1: frames, method arguments, content headers and field
tables.

Theory of operation
-------------------
Nothing here does I/O. :class:`FrameReader` is fed whatever bytes arrive and hands back
whole :class:`Frame` objects (``None`` until one is complete); :func:`decode_method` and
:func:`decode_header` turn a frame's payload into a :class:`Method` or a content header;
:func:`encode_method`, :func:`encode_content` and :func:`encode_frame` return bytes ready to
write. The method table (ids, argument names and wire types) is data, in
:mod:`handlers.amqp._spec`; the codec walks it, so adding a method is one line there.

Framing (spec 4.2.3)::

    [type u8][channel u16][size u32][payload: size octets][frame-end 0xCE]

The reader checks the frame type, the channel of a heartbeat and the size against
``frame_max`` as soon as the seven header octets are in, before it waits for any payload,
so a peer cannot make it buffer more than one frame's worth past the negotiated limit.
Its buffer is one ``bytearray`` and an offset: consumed bytes are dropped only once they
are at least half the buffer, so feeding N bytes costs O(N) however they are split.

Errors have one shape, :class:`AMQPError`, carrying the spec's reply code: framing
problems are FRAME_ERROR, undecodable arguments SYNTAX_ERROR, an unknown class
NOT_IMPLEMENTED and an unknown method of a known class COMMAND_INVALID; all of them are
connection errors (spec 1.2, "hard errors"). Bad input raises nothing else (fuzzed in the
tests): every length is checked against what is left before it is used, strings are strict
UTF-8, and tables nest at most :data:`MAX_TABLE_DEPTH` deep. Encoding our own values that
do not fit the wire (a shortstr over 255 octets, an int out of range, a type a field table
cannot carry) is a bug on our side and raises ``ValueError`` or ``TypeError`` instead.

Field tables follow RabbitMQ's type letters (its AMQP 0-9-1 errata), not the spec's
grammar, because that is what every client speaks: ``s`` is a signed short, ``l`` a signed
64-bit integer, and there is no ``U`` or ``L``.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from handlers.amqp._spec import (
    BASIC_CLASS_ID,
    BASIC_PROPERTIES,
    CLASSES,
    METHODS,
    METHODS_BY_ID,
    METHODS_BY_NAME,
    FieldType,
    MethodSpec,
)

__all__ = [
    "PROTOCOL_HEADER", "FRAME_METHOD", "FRAME_HEADER", "FRAME_BODY", "FRAME_HEARTBEAT",
    "FRAME_END", "FRAME_MIN_SIZE", "HEARTBEAT_FRAME", "MAX_TABLE_DEPTH", "ReplyCode",
    "AMQPError", "Frame", "FrameReader", "encode_frame", "Method", "decode_method",
    "encode_method", "method_frame_name", "Properties", "decode_header", "encode_content",
    "encode_table", "decode_table", "encode_array", "decode_array",
]

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
"""What a client sends first (spec 4.2.2); a server that does not speak it answers with
this and closes."""

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_MIN_SIZE: Final = 4096
"""The smallest frame_max a peer may ask for in connection.tune-ok (spec 4.2.3)."""

MAX_TABLE_DEPTH: Final = 64
"""How deep field tables and arrays may nest, so a hostile table cannot exhaust the stack."""

_FRAME_TYPES: Final = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))
_FRAME_HEAD: Final = struct.Struct(">BHI")
_FRAME_END_BYTES: Final = bytes((FRAME_END,))
_METHOD_HEAD: Final = struct.Struct(">HH")
_HEADER_HEAD: Final = struct.Struct(">HHQ")  # class-id, weight, body size (spec 4.2.6.1)
_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_DECIMAL: Final = struct.Struct(">BI")
_SHORTSTR_MAX: Final = 0xFF
_LONGSTR_MAX: Final = 0xFFFF_FFFF
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class ReplyCode(enum.IntEnum):
    """The spec's reply codes (its ``constant`` list)."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


_CHANNEL_ERRORS: Final = frozenset((
    ReplyCode.CONTENT_TOO_LARGE, ReplyCode.NO_ROUTE, ReplyCode.NO_CONSUMERS,
    ReplyCode.ACCESS_REFUSED, ReplyCode.NOT_FOUND, ReplyCode.RESOURCE_LOCKED,
    ReplyCode.PRECONDITION_FAILED))
"""The spec's soft errors: they close a channel. Every other code closes the connection."""


class AMQPError(Exception):
    """A breach of AMQP 0-9-1, with the reply code that names it and the method it concerns
    (0, 0 when none). ``connection`` is True for a hard error, which closes the connection,
    and False for a soft one, which closes only the channel."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(code, text, class_id, method_id)
        try:
            self.code: int = ReplyCode(code)
        except ValueError:
            self.code = int(code)
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        self.connection: bool = self.code not in _CHANNEL_ERRORS

    def __str__(self) -> str:
        return f"{int(self.code)} {self.text}"


def _error(code: ReplyCode, detail: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    """An error whose text reads like RabbitMQ's: ``"SYNTAX_ERROR - <detail>"``."""
    return AMQPError(code, f"{code.name} - {detail}", class_id, method_id)


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: its type (``FRAME_METHOD`` ...), channel and payload."""

    type: int
    channel: int
    payload: bytes


def encode_frame(type: int, channel: int, payload: bytes) -> bytes:
    """The bytes of one frame (spec 4.2.3)."""
    try:
        head = _FRAME_HEAD.pack(type, channel, len(payload))
    except struct.error:
        raise ValueError(f"frame type {type}, channel {channel} or size {len(payload)} "
                         "does not fit its field") from None
    return b"".join((head, payload, _FRAME_END_BYTES))


HEARTBEAT_FRAME: Final = encode_frame(FRAME_HEARTBEAT, 0, b"")
"""The heartbeat frame (spec 4.2.7): type 8 on channel 0, no payload."""


class FrameReader:
    """Splits a byte stream into frames. ``frame_max`` is the largest frame accepted,
    header and frame-end included (0: no limit); set it again once tune-ok agrees one.

    After an error the stream cannot be resynchronised: every later :meth:`next` raises
    the same error again.
    """

    __slots__ = ("frame_max", "_buf", "_pos", "_error")

    def __init__(self, frame_max: int = 131072) -> None:
        self.frame_max = frame_max
        self._buf = bytearray()
        self._pos = 0
        self._error: AMQPError | None = None

    def feed(self, data: bytes) -> None:
        """Append bytes received from the peer."""
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def buffered(self) -> int:
        """How many bytes are fed but not yet returned as frames."""
        return len(self._buf) - self._pos

    def next(self) -> Frame | None:
        """The next whole frame, or None when more bytes are needed."""
        if self._error is not None:
            raise self._error
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _FRAME_HEAD.size:
            return None
        ftype, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
        if ftype not in _FRAME_TYPES:
            self._fail(f"unknown frame type {ftype}")
        if ftype == FRAME_HEARTBEAT and channel != 0:
            self._fail(f"heartbeat frame on channel {channel}")
        if self.frame_max and size + 8 > self.frame_max:
            self._fail(f"frame of {size + 8} octets is over frame_max {self.frame_max}")
        end = pos + _FRAME_HEAD.size + size
        if len(buf) <= end:
            return None
        if buf[end] != FRAME_END:
            self._fail(f"frame-end octet is 0x{buf[end]:02x}, not 0xce")
        with memoryview(buf) as view:
            payload = view[pos + _FRAME_HEAD.size:end].tobytes()
        self._pos = end + 1
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        return Frame(ftype, channel, payload)

    def _fail(self, detail: str) -> None:
        self._error = _error(ReplyCode.FRAME_ERROR, detail)
        raise self._error


# --------------------------------------------------------------------------- primitives


def _syntax(detail: str) -> AMQPError:
    return _error(ReplyCode.SYNTAX_ERROR, detail)


def _need(pos: int, n: int, end: int, what: str) -> int:
    """The position after ``n`` more octets, or SYNTAX_ERROR if they run past ``end``."""
    after = pos + n
    if after > end:
        raise _syntax(f"{what} runs past the end of its frame")
    return after


def _read_text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _syntax(f"{what} is not valid UTF-8") from None


def _read_shortstr(buf: bytes | memoryview, pos: int, end: int, what: str) -> tuple[str, int]:
    start = _need(pos, 1, end, what)
    stop = _need(start, buf[pos], end, what)
    return _read_text(bytes(buf[start:stop]), what), stop


def _read_longstr(buf: bytes | memoryview, pos: int, end: int, what: str) -> tuple[bytes, int]:
    start = _need(pos, 4, end, what)
    stop = _need(start, _U32.unpack_from(buf, pos)[0], end, what)
    return bytes(buf[start:stop]), stop


_Text = str | bytes | bytearray | memoryview


def _raw_str(value: _Text, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


def _put_shortstr(out: bytearray, value: _Text, what: str) -> None:
    raw = _raw_str(value, what)
    if len(raw) > _SHORTSTR_MAX:
        raise ValueError(f"{what} is {len(raw)} octets, over a shortstr's 255")
    out.append(len(raw))
    out += raw


def _put_longstr(out: bytearray, value: _Text, what: str) -> None:
    raw = _raw_str(value, what)
    if len(raw) > _LONGSTR_MAX:
        raise ValueError(f"{what} is {len(raw)} octets, over a longstr's 2**32 - 1")
    out += _U32.pack(len(raw))
    out += raw


def _reply_text(value: _Text) -> bytes:
    """A reply-text cut to fit its shortstr, as RabbitMQ does: 252 octets and "..."."""
    raw = _raw_str(value, "reply_text")
    if len(raw) <= _SHORTSTR_MAX:
        return raw
    return raw[:252].decode("utf-8", errors="ignore").encode("utf-8") + b"..."


# --------------------------------------------------------------------------- field tables

_FIXED: Final[dict[int, struct.Struct]] = {
    ord(letter): struct.Struct(fmt) for letter, fmt in (
        ("b", ">b"), ("B", ">B"), ("s", ">h"), ("u", ">H"), ("I", ">i"), ("i", ">I"),
        ("l", ">q"), ("f", ">f"), ("d", ">d"))}
"""Field-value types that are one number, by type letter (RabbitMQ's errata)."""

_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")
_DOUBLE: Final = struct.Struct(">d")


def decode_table(buf: bytes | memoryview, pos: int) -> tuple[dict[str, Any], int]:
    """Decode the field table at ``pos`` (a four-octet size, then name/value pairs, spec
    4.2.5.5); return it and the position just past it. A name given twice keeps its last
    value."""
    if pos < 0:
        raise ValueError(f"negative position {pos}")
    return _decode_table(buf, pos, len(buf), 0)


def decode_array(buf: bytes | memoryview, pos: int) -> tuple[list[Any], int]:
    """Decode the field array at ``pos`` (a four-octet size, then values); return it and the
    position just past it."""
    if pos < 0:
        raise ValueError(f"negative position {pos}")
    return _decode_array(buf, pos, len(buf), 0)


def _decode_table(buf: bytes | memoryview, pos: int, end: int,
                  depth: int) -> tuple[dict[str, Any], int]:
    if depth >= MAX_TABLE_DEPTH:
        raise _syntax(f"field tables nested over {MAX_TABLE_DEPTH} deep")
    start = _need(pos, 4, end, "field table size")
    stop = _need(start, _U32.unpack_from(buf, pos)[0], end, "field table")
    out: dict[str, Any] = {}
    pos = start
    while pos < stop:
        name, pos = _read_shortstr(buf, pos, stop, "field table name")
        out[name], pos = _decode_value(buf, pos, stop, depth)
    return out, stop


def _decode_array(buf: bytes | memoryview, pos: int, end: int,
                  depth: int) -> tuple[list[Any], int]:
    if depth >= MAX_TABLE_DEPTH:
        raise _syntax(f"field arrays nested over {MAX_TABLE_DEPTH} deep")
    start = _need(pos, 4, end, "field array size")
    stop = _need(start, _U32.unpack_from(buf, pos)[0], end, "field array")
    out: list[Any] = []
    pos = start
    while pos < stop:
        value, pos = _decode_value(buf, pos, stop, depth)
        out.append(value)
    return out, stop


def _decode_value(buf: bytes | memoryview, pos: int, end: int, depth: int) -> tuple[Any, int]:
    """One field value: its type letter, then the value."""
    pos = _need(pos, 1, end, "field value")
    letter = buf[pos - 1]
    fixed = _FIXED.get(letter)
    if fixed is not None:
        after = _need(pos, fixed.size, end, "field value")
        return fixed.unpack_from(buf, pos)[0], after
    if letter == 0x74:  # t
        after = _need(pos, 1, end, "field value")
        return buf[pos] != 0, after
    if letter == 0x53:  # S
        raw, pos = _read_longstr(buf, pos, end, "field value")
        try:
            return raw.decode("utf-8"), pos
        except UnicodeDecodeError:
            return raw, pos
    if letter == 0x78:  # x
        return _read_longstr(buf, pos, end, "field value")
    if letter == 0x46:  # F
        return _decode_table(buf, pos, end, depth + 1)
    if letter == 0x41:  # A
        return _decode_array(buf, pos, end, depth + 1)
    if letter == 0x56:  # V
        return None, pos
    if letter == 0x54:  # T
        after = _need(pos, 8, end, "field value")
        seconds = _U64.unpack_from(buf, pos)[0]
        try:
            return _EPOCH + timedelta(seconds=seconds), after
        except OverflowError:
            raise _syntax(f"timestamp {seconds} is past the year 9999") from None
    if letter == 0x44:  # D
        after = _need(pos, _DECIMAL.size, end, "field value")
        scale, value = _DECIMAL.unpack_from(buf, pos)
        return Decimal((0, tuple(int(d) for d in str(value)), -scale)), after
    raise _syntax(f"unknown field value type {chr(letter)!r} (0x{letter:02x})")


def encode_table(t: Mapping[str, Any]) -> bytes:
    """The field table ``t`` on the wire, its four-octet size first. Values map to type
    letters: bool t, int I (or l past 32 bits), float d, str and bytes S, Mapping F, list
    and tuple A, None V, Decimal D, datetime T (a naive one is taken as UTC)."""
    out = bytearray()
    _put_table(out, t, 0)
    return bytes(out)


def encode_array(items: Iterable[Any]) -> bytes:
    """The field array of ``items``, its four-octet size first; values as in
    :func:`encode_table`."""
    out = bytearray()
    _put_array(out, items, 0)
    return bytes(out)


def _put_table(out: bytearray, t: Mapping[str, Any], depth: int) -> None:
    if depth >= MAX_TABLE_DEPTH:
        raise ValueError(f"field tables nested over {MAX_TABLE_DEPTH} deep")
    at = len(out)
    out += b"\0\0\0\0"
    for name, value in t.items():
        if not isinstance(name, str):
            raise TypeError(f"a field table name must be str, not {type(name).__name__}")
        _put_shortstr(out, name, "field table name")
        _put_value(out, value, depth)
    _put_size(out, at)


def _put_array(out: bytearray, items: Iterable[Any], depth: int) -> None:
    if depth >= MAX_TABLE_DEPTH:
        raise ValueError(f"field arrays nested over {MAX_TABLE_DEPTH} deep")
    at = len(out)
    out += b"\0\0\0\0"
    for value in items:
        _put_value(out, value, depth)
    _put_size(out, at)


def _put_size(out: bytearray, at: int) -> None:
    size = len(out) - at - 4
    if size > _LONGSTR_MAX:
        raise ValueError(f"a field table of {size} octets")
    _U32.pack_into(out, at, size)


def _put_value(out: bytearray, v: Any, depth: int) -> None:
    if isinstance(v, bool):
        out += b"t\x01" if v else b"t\x00"
    elif isinstance(v, int):
        if -0x8000_0000 <= v <= 0x7FFF_FFFF:
            out += b"I" + _INT32.pack(v)
        elif -0x8000_0000_0000_0000 <= v <= 0x7FFF_FFFF_FFFF_FFFF:
            out += b"l" + _INT64.pack(v)
        else:
            raise ValueError(f"{v} does not fit a field table's 64-bit integer")
    elif isinstance(v, float):
        out += b"d" + _DOUBLE.pack(v)
    elif isinstance(v, str | bytes | bytearray | memoryview):
        out += b"S"
        _put_longstr(out, v, "field value")
    elif isinstance(v, Mapping):
        out += b"F"
        _put_table(out, v, depth + 1)
    elif isinstance(v, list | tuple):
        out += b"A"
        _put_array(out, v, depth + 1)
    elif v is None:
        out += b"V"
    elif isinstance(v, Decimal):
        out += b"D" + _encode_decimal(v)
    elif isinstance(v, datetime):
        aware = v if v.tzinfo is not None else v.replace(tzinfo=UTC)
        seconds = (aware - _EPOCH) // timedelta(seconds=1)
        if seconds < 0:
            raise ValueError(f"timestamp {v} is before 1970")
        out += b"T" + _U64.pack(seconds)
    else:
        raise TypeError(f"a field table cannot hold a {type(v).__name__}")


def _encode_decimal(d: Decimal) -> bytes:
    """A decimal as a scale octet and an unsigned 32-bit value (spec 4.2.5.5)."""
    sign, digits, exponent = d.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"{d} is not a finite decimal")
    value = int("".join(map(str, digits)) or "0")
    if exponent > 0:
        value, exponent = value * 10 ** exponent, 0
    if sign and value:
        raise ValueError(f"a field table decimal cannot be negative: {d}")
    if -exponent > 0xFF or value > 0xFFFF_FFFF:
        raise ValueError(f"{d} does not fit a field table decimal")
    return _DECIMAL.pack(-exponent, value)


# --------------------------------------------------------------------------- methods


@dataclass(slots=True)
class Method:
    """A decoded method frame: its name as the spec spells it (``"basic.publish"``), its
    arguments by name, its ids, and whether content follows it."""

    name: str
    args: dict[str, Any]
    class_id: int
    method_id: int
    has_content: bool


_Plan = tuple[tuple[FieldType, tuple[str, ...]], ...]


def _plan(spec: MethodSpec) -> _Plan:
    """A method's fields in wire order, with runs of bits gathered eight to an octet
    (spec 4.2.5.2: contiguous bits share octets, starting from the low bit)."""
    steps: list[tuple[FieldType, tuple[str, ...]]] = []
    for name, kind in spec.fields:
        if kind == "bit" and steps and steps[-1][0] == "bit" and len(steps[-1][1]) < 8:
            steps[-1] = ("bit", (*steps[-1][1], name))
        else:
            steps.append((kind, (name,)))
    return tuple(steps)


_PLANS: Final[dict[str, _Plan]] = {m.name: _plan(m) for m in METHODS}
_ZERO: Final[dict[FieldType, Any]] = {
    "bit": False, "octet": 0, "short": 0, "long": 0, "longlong": 0, "timestamp": 0,
    "shortstr": "", "longstr": b"", "table": {}}
_INTS: Final[dict[FieldType, struct.Struct]] = {
    "octet": _U8, "short": _U16, "long": _U32, "longlong": _U64, "timestamp": _U64}


def method_frame_name(class_id: int, method_id: int) -> str:
    """The spec's name of a method (``"basic.publish"``), or ``"<class>.<method>"`` in
    digits for ids the table does not hold."""
    spec = METHODS_BY_ID.get((class_id, method_id))
    return spec.name if spec is not None else f"{class_id}.{method_id}"


def decode_method(payload: bytes) -> Method:
    """Decode a method frame's payload (spec 4.2.4): class id, method id, arguments.
    Shortstr arguments decode to str, longstr to bytes, tables to dicts, bits to bools."""
    if len(payload) < _METHOD_HEAD.size:
        raise _error(ReplyCode.FRAME_ERROR,
                     f"method frame of {len(payload)} octets has no class and method id")
    class_id, method_id = _METHOD_HEAD.unpack_from(payload)
    spec = METHODS_BY_ID.get((class_id, method_id))
    if spec is None:
        if class_id not in CLASSES:
            raise _error(ReplyCode.NOT_IMPLEMENTED,
                         f"unknown class {class_id} (method {class_id}.{method_id})",
                         class_id, method_id)
        raise _error(ReplyCode.COMMAND_INVALID, f"unknown method {class_id}.{method_id}",
                     class_id, method_id)
    try:
        args = _decode_args(payload, _PLANS[spec.name], spec.name)
    except AMQPError as exc:
        exc.class_id, exc.method_id = class_id, method_id
        raise
    return Method(spec.name, args, class_id, method_id, spec.content)


def _decode_args(buf: bytes, plan: _Plan, method: str) -> dict[str, Any]:
    pos, end = _METHOD_HEAD.size, len(buf)
    args: dict[str, Any] = {}
    for kind, names in plan:
        what = f"{method} {names[0]}"
        if kind == "bit":
            pos = _need(pos, 1, end, what)
            octet = buf[pos - 1]
            for i, name in enumerate(names):
                args[name] = bool(octet & (1 << i))
        elif kind == "shortstr":
            args[names[0]], pos = _read_shortstr(buf, pos, end, what)
        elif kind == "longstr":
            args[names[0]], pos = _read_longstr(buf, pos, end, what)
        elif kind == "table":
            args[names[0]], pos = _decode_table(buf, pos, end, 0)
        else:
            unpack = _INTS[kind]
            after = _need(pos, unpack.size, end, what)
            args[names[0]] = unpack.unpack_from(buf, pos)[0]
            pos = after
    if pos != end:
        raise _syntax(f"{end - pos} octets past the end of {method}'s arguments")
    return args


def encode_method(channel: int, name: str, /, **args: Any) -> bytes:
    """A whole method frame for method ``name`` (``"basic.deliver"``) on ``channel``.
    Arguments left out take their type's zero ("", 0, False, {}); shortstr and longstr
    arguments take str or bytes. A reply_text over 255 octets is cut to fit, as RabbitMQ
    does; any other value that does not fit raises ValueError, an unknown argument
    TypeError. basic.qos's ``global`` is passed as ``**{"global": True}``."""
    spec = METHODS_BY_NAME.get(name)
    if spec is None:
        raise ValueError(f"unknown method {name!r}")
    if args:
        unknown = args.keys() - {field for field, _ in spec.fields}
        if unknown:
            raise TypeError(f"{name} has no argument {', '.join(sorted(unknown))}")
    out = bytearray(_METHOD_HEAD.pack(spec.class_id, spec.method_id))
    for kind, names in _PLANS[name]:
        if kind == "bit":
            octet = 0
            for i, field in enumerate(names):
                if args.get(field):
                    octet |= 1 << i
            out.append(octet)
            continue
        field = names[0]
        value = args.get(field, _ZERO[kind])
        what = f"{name} {field}"
        if kind == "shortstr":
            if field == "reply_text":
                raw = _reply_text(value)
                out.append(len(raw))
                out += raw
            else:
                _put_shortstr(out, value, what)
        elif kind == "longstr":
            _put_longstr(out, value, what)
        elif kind == "table":
            _put_table(out, value if value is not None else {}, 0)
        else:
            _put_int(out, kind, value, what)
    return encode_frame(FRAME_METHOD, channel, bytes(out))


def _put_int(out: bytearray, kind: FieldType, value: Any, what: str) -> None:
    try:
        out += _INTS[kind].pack(value)
    except struct.error:
        raise ValueError(f"{what}={value!r} does not fit an unsigned {kind}") from None


# --------------------------------------------------------------------------- content


@dataclass(slots=True)
class Properties:
    """basic's content properties (spec 4.2.6.1, the basic class); None is absent.
    ``timestamp`` is POSIX seconds; ``delivery_mode`` is 1 (transient) or 2 (persistent)."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


def decode_header(payload: bytes) -> tuple[int, int, Properties]:
    """Decode a content header frame's payload (spec 4.2.6.1): class id, weight (ignored),
    body size, property flags (continued while bit 0 is set) and the properties flagged."""
    if len(payload) < _HEADER_HEAD.size + 2:
        raise _error(ReplyCode.FRAME_ERROR,
                     f"content header of {len(payload)} octets is under the 14 it needs")
    class_id, _weight, body_size = _HEADER_HEAD.unpack_from(payload)
    if class_id != BASIC_CLASS_ID:
        raise _error(ReplyCode.FRAME_ERROR,
                     f"content header for class {class_id}, which carries no content")
    end = len(payload)
    pos = _HEADER_HEAD.size
    flags = _U16.unpack_from(payload, pos)[0]
    pos += 2
    if flags & 0b10:
        raise _syntax("property flag bit 1 names no basic property")
    more = flags & 1
    while more:
        after = _need(pos, 2, end, "property flags")
        extra = _U16.unpack_from(payload, pos)[0]
        pos = after
        if extra & ~1:
            raise _syntax("a continued property flag word names no basic property")
        more = extra & 1
    values: dict[str, Any] = {}
    for i, (name, kind) in enumerate(BASIC_PROPERTIES):
        if not flags & (1 << (15 - i)):
            continue
        what = f"property {name}"
        if kind == "shortstr":
            values[name], pos = _read_shortstr(payload, pos, end, what)
        elif kind == "table":
            values[name], pos = _decode_table(payload, pos, end, 0)
        else:
            unpack = _INTS[kind]
            after = _need(pos, unpack.size, end, what)
            values[name] = unpack.unpack_from(payload, pos)[0]
            pos = after
    if pos != end:
        raise _syntax(f"{end - pos} octets past the end of the content properties")
    return class_id, body_size, Properties(**values)


def _encode_header(class_id: int, props: Properties, body_size: int) -> bytes:
    flags = 0
    out = bytearray()
    for i, (name, kind) in enumerate(BASIC_PROPERTIES):
        value = getattr(props, name)
        if value is None:
            continue
        flags |= 1 << (15 - i)
        what = f"property {name}"
        if kind == "shortstr":
            _put_shortstr(out, value, what)
        elif kind == "table":
            _put_table(out, value, 0)
        else:
            _put_int(out, kind, value, what)
    return _HEADER_HEAD.pack(class_id, 0, body_size) + _U16.pack(flags) + bytes(out)


def encode_content(channel: int, class_id: int, props: Properties, body: bytes,
                   frame_max: int) -> bytes:
    """The content header frame for ``props`` and ``body``, then the body in frames of at
    most ``frame_max`` octets, framing included (0: one body frame); an empty body sends
    no body frame (spec 4.2.6)."""
    if class_id != BASIC_CLASS_ID:
        raise ValueError(f"class {class_id} carries no content")
    if frame_max and frame_max <= 8:
        raise ValueError(f"frame_max {frame_max} leaves no room for a payload")
    header = _encode_header(class_id, props, len(body))
    if frame_max and len(header) + 8 > frame_max:
        raise ValueError(f"a content header of {len(header)} octets is over frame_max "
                         f"{frame_max}")
    parts: list[bytes | memoryview] = [encode_frame(FRAME_HEADER, channel, header)]
    chunk = frame_max - 8 if frame_max else max(len(body), 1)
    view = memoryview(body)
    for start in range(0, len(body), chunk):
        piece = view[start:start + chunk]
        parts += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, _FRAME_END_BYTES)
    return b"".join(parts)
