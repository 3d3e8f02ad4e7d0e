"""Fuzzing the AMQP 0-9-1 decoders with a seeded random loop (hypothesis is not installed).

Invariant: arbitrary bytes, and valid frames with bytes flipped, cut, duplicated or
inserted, fed to FrameReader (in random chunks) and then to decode_method,
decode_header and decode_table, either decode or raise AMQPError: never another
exception, and never a hang (every loop is bounded, and the reader must make progress
or ask for more bytes each time it is called). And random values round-trip: field tables,
method arguments of every method, and content properties."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from handlers.amqp._codec import (
    FRAME_HEADER,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    AMQPError,
    FrameReader,
    Properties,
    decode_array,
    decode_header,
    decode_method,
    decode_table,
    encode_array,
    encode_content,
    encode_method,
    encode_table,
)
from handlers.amqp._spec import BASIC_PROPERTIES, METHODS
from tests.handlers.amqp.test_codec import FULL, sample_args

CASES = 10000


def _corpus() -> list[bytes]:
    """Valid wire bytes to mutate: a frame of every method, content, heartbeats."""
    out = [encode_method(1, m.name, **sample_args(m)) for m in METHODS]
    out.append(encode_content(1, 60, FULL, b"payload" * 20, 4096))
    out.append(encode_content(1, 60, Properties(headers={"a": [1, {"b": None}]}), b"", 4096))
    out.append(HEARTBEAT_FRAME)
    return out


def _tables() -> list[bytes]:
    value: dict[str, Any] = {"s": "x", "b": b"\xff", "n": [1, 2.5, None, {"t": True}],
                             "big": 2 ** 40, "neg": -1}
    return [encode_table(value), encode_array([value, [value]]), encode_table({})]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 1 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 2:
            del buf[rng.randrange(len(buf) + 1):]
        elif op == 3:
            i = rng.randrange(len(buf) + 1)
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 4 and buf:
            i = rng.randrange(len(buf))
            j = rng.randrange(i, min(len(buf), i + 16) + 1)
            buf[i:i] = buf[i:j]
        elif buf:
            # a length field's octets set high: the classic over-allocation attempt
            i = rng.randrange(len(buf))
            buf[i:i + 4] = b"\xff\xff\xff\x7f"
    return bytes(buf)


def _decode_frames(rng: random.Random, data: bytes) -> int:
    """Feed ``data`` in random chunks and decode every frame; only AMQPError escapes."""
    reader = FrameReader(rng.choice((0, 4096, 131072)))
    decoded = 0
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 64)
        reader.feed(data[pos:pos + step])
        pos += step
        for _ in range(len(data) + 1):
            before = reader.buffered()
            frame = reader.next()
            if frame is None:
                break
            assert reader.buffered() < before, "the reader returned a frame but kept its bytes"
            try:
                if frame.type == FRAME_METHOD:
                    decode_method(frame.payload)
                elif frame.type == FRAME_HEADER:
                    decode_header(frame.payload)
            except AMQPError:
                pass
            decoded += 1
        else:
            raise AssertionError("the reader did not stop")
    return decoded


def test_fuzz_frames_and_payloads() -> None:
    rng = random.Random(0x414D5150)
    corpus = _corpus()
    decoded = errors = 0
    for i in range(CASES):
        if i % 10 == 0:
            data = rng.randbytes(rng.randint(0, 64))
        else:
            data = b"".join(rng.choice(corpus) for _ in range(rng.randint(1, 3)))
            data = _mutate(rng, data)
        try:
            decoded += _decode_frames(rng, data)
        except AMQPError:
            errors += 1
    # both paths were exercised: frames that decode and frames that are refused
    assert decoded > CASES // 4 and errors > CASES // 10


def test_fuzz_payload_decoders_directly() -> None:
    """Payloads straight to the decoders, past the frame layer's checks."""
    rng = random.Random(5672)
    payloads = [encode_method(0, m.name, **sample_args(m))[7:-1] for m in METHODS]
    headers = [encode_content(1, 60, FULL, b"", 0)[7:-1],
               encode_content(1, 60, Properties(), b"", 0)[7:-1]]
    ok = 0
    for i in range(CASES):
        kind = i % 3
        source = payloads if kind == 0 else headers if kind == 1 else _tables()
        data = _mutate(rng, rng.choice(source)) if i % 7 else rng.randbytes(rng.randint(0, 40))
        try:
            if kind == 0:
                decode_method(data)
            elif kind == 1:
                decode_header(data)
            else:
                start = rng.randrange(3) if data else 0
                (decode_table if i % 2 else decode_array)(data, start)
            ok += 1
        except AMQPError as exc:
            assert exc.connection and exc.text
    assert 0 < ok < CASES


# --------------------------------------------------------------------------- round trips


def _text(rng: random.Random, most: int) -> str:
    chars = "aZ09-._/é€\U0001f600"
    out = ""
    while True:
        c = rng.choice(chars)
        if len((out + c).encode()) > most:
            return out
        out += c
        if rng.random() < 0.2:
            return out


def _value(rng: random.Random, depth: int) -> Any:
    """A random field-table value, in the type the decoder gives back."""
    pick = rng.randrange(12 if depth < 4 else 10)
    if pick == 0:
        return rng.random() < 0.5
    if pick == 1:
        return rng.randint(-2 ** 31, 2 ** 31 - 1)
    if pick == 2:
        return rng.randint(-2 ** 63, 2 ** 63 - 1)
    if pick == 3:
        return rng.uniform(-1e300, 1e300)
    if pick == 4:
        return _text(rng, 40)
    if pick == 5:
        return b"\xff" + rng.randbytes(rng.randint(0, 8))  # not UTF-8: stays bytes
    if pick == 6:
        return None
    if pick == 7:
        return Decimal((0, tuple(int(d) for d in str(rng.randrange(2 ** 32))),
                        -rng.randrange(256)))
    if pick == 8:
        return datetime.fromtimestamp(rng.randrange(2 ** 34), UTC)
    if pick == 9:
        return rng.choice(("", "plain"))
    if pick == 10:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return _table(rng, depth + 1)


def _table(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {_text(rng, 255): _value(rng, depth) for _ in range(rng.randint(0, 5))}


def test_random_tables_round_trip() -> None:
    rng = random.Random(0x46)
    for _ in range(1000):
        table = _table(rng)
        wire = encode_table(table)
        assert decode_table(wire, 0) == (table, len(wire))


def _arg(rng: random.Random, kind: str) -> Any:
    if kind == "bit":
        return rng.random() < 0.5
    if kind == "shortstr":
        return _text(rng, 255)
    if kind == "longstr":
        return rng.randbytes(rng.randint(0, 20))
    if kind == "table":
        return _table(rng)
    bits = {"octet": 8, "short": 16, "long": 32, "longlong": 64, "timestamp": 64}[kind]
    return rng.choice((0, 2 ** bits - 1, rng.randrange(2 ** bits)))


def test_random_method_arguments_round_trip() -> None:
    rng = random.Random(0x4D)
    for _ in range(2000):
        spec = rng.choice(METHODS)
        args = {name: _arg(rng, kind) for name, kind in spec.fields}
        if "reply_text" in args:
            args["reply_text"] = args["reply_text"][:60]  # a long one is cut, not kept
        channel = rng.randrange(2 ** 16)
        reader = FrameReader(0)
        reader.feed(encode_method(channel, spec.name, **args))
        frame = reader.next()
        assert frame is not None and frame.channel == channel
        method = decode_method(frame.payload)
        assert (method.name, method.args) == (spec.name, args)


def test_random_properties_round_trip() -> None:
    rng = random.Random(0x50)
    for _ in range(1000):
        values = {name: _arg(rng, kind) for name, kind in BASIC_PROPERTIES
                  if rng.random() < 0.5}
        props = Properties(**values)
        body = rng.randbytes(rng.randint(0, 300))
        frame_max = rng.choice((0, 4096, 4096 + rng.randrange(64)))
        reader = FrameReader(frame_max)
        reader.feed(encode_content(3, 60, props, body, frame_max))
        header = reader.next()
        assert header is not None and header.type == FRAME_HEADER
        assert decode_header(header.payload) == (60, len(body), props)
        parts = []
        while (frame := reader.next()) is not None:
            parts.append(frame.payload)
        assert b"".join(parts) == body
