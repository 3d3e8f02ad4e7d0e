"""The sans-IO Kafka codec: golden frames from both clients, round trips of every message
definition at every served version, byte-at-a-time feeding, bad sizes, fuzzing."""

from __future__ import annotations

import random
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from handlers.kafka._codec import (
    APIS,
    DEFAULT_MAX_REQUEST_SIZE,
    LARGE_FRAME,
    NEED_DATA,
    Data,
    Field,
    KafkaConnection,
    RequestReceived,
    UnsupportedRequest,
    api_versions_table,
    decode_body,
    decode_response,
    encode_body,
    encode_request,
)
from handlers.kafka._errors import ErrorCode, RemoteProtocolError
from handlers.kafka._records import decode_batches

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kafka"
GOLDEN = sorted(FIXTURES.glob("*.bin"))


def _one(frame: bytes) -> Any:
    conn = KafkaConnection()
    conn.receive_data(frame)
    event = conn.next_event()
    assert conn.next_event() is NEED_DATA
    return event


def test_golden_frames_exist_for_both_clients() -> None:
    names = {p.name for p in GOLDEN}
    for client in ("kafkapython", "confluent"):
        for api in ("apiversions", "metadata", "produce", "fetch", "joingroup", "syncgroup",
                    "offsetcommit", "offsetfetch", "findcoordinator", "createtopics",
                    "incrementalalterconfigs"):
            assert any(n.startswith(f"{client}_{api}_v") for n in names), (client, api)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_frame_decodes(path: Path) -> None:
    frame = path.read_bytes()
    key, version = struct.unpack(">hh", frame[4:8])
    event = _one(frame)
    spec = APIS.get(key)
    if spec is None or not spec.min_version <= version <= spec.max_version:
        assert key == 18 and isinstance(event, UnsupportedRequest)
        assert (event.api_key, event.api_version) == (key, version)
        return
    assert isinstance(event, RequestReceived)
    assert (event.api_key, event.api_version) == (key, version)
    assert event.client_id
    # Re-encoding the decoded body gives the client's exact bytes (tagged fields aside,
    # which the clients do not send in these requests).
    again = encode_request(key, version, event.correlation_id, event.client_id, event.body)
    assert again == frame


def test_golden_produce_carries_the_record() -> None:
    for path in FIXTURES.glob("*_produce_v*.bin"):
        req = _one(path.read_bytes())
        td = req.body.topic_data[0]
        assert td.name == "golden"
        [batch] = decode_batches(td.partition_data[0].records)
        [rec] = batch.records
        assert (rec.key, rec.value, rec.headers) == (b"k", b"v", (("h", b"1"),))


def test_golden_fetch_and_metadata_fields() -> None:
    for path in FIXTURES.glob("*_fetch_v*.bin"):
        req = _one(path.read_bytes())
        assert req.body.topics[0].topic == "golden"
        assert req.body.max_wait_ms > 0
    for path in FIXTURES.glob("*_metadata_v*.bin"):
        req = _one(path.read_bytes())
        assert req.body.topics is None or all(t.name for t in req.body.topics)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_frame_fed_one_byte_at_a_time(path: Path) -> None:
    frame = path.read_bytes()
    conn = KafkaConnection()
    events = []
    for i in range(len(frame) * 2):
        conn.receive_data(frame[i % len(frame):i % len(frame) + 1])
        ev = conn.next_event()
        if ev is not NEED_DATA:
            events.append(ev)
    assert len(events) == 2
    assert events[0] == events[1]


# -- a generic round trip of every definition ---------------------------------------------


def _value(rng: random.Random, f: Field, version: int) -> Any:
    t = f.type
    if f.is_nullable(version) and rng.random() < 0.2:
        return None
    if t == "int8":
        return rng.randint(-128, 127)
    if t == "int16":
        return rng.randint(-32768, 32767)
    if t == "int32":
        return rng.randint(-2**31, 2**31 - 1)
    if t == "int64":
        return rng.randint(-2**63, 2**63 - 1)
    if t == "bool":
        return rng.random() < 0.5
    if t == "string":
        return "".join(rng.choice("abcé-_.xyz") for _ in range(rng.randint(0, 12)))
    if t in ("bytes", "records"):
        return rng.randbytes(rng.randint(0, 40))
    if t == "uuid":
        return rng.randbytes(16)
    if t == "{}":
        assert f.fields is not None
        return _struct(rng, f.fields, version)
    if t.startswith("[]"):
        elem = t[2:]
        n = rng.randint(0, 3)
        if elem:
            sub = Field("x", elem, (0, 0x7FFF), (1, 0), None, None, None)
            return [_value(rng, sub, version) for _ in range(n)]
        assert f.fields is not None
        return [_struct(rng, f.fields, version) for _ in range(n)]
    raise AssertionError(t)


def _struct(rng: random.Random, fields: tuple[Field, ...], version: int) -> Data:
    d = Data()
    for f in fields:
        if f.present(version) and (f.tag is None or rng.random() < 0.7):
            setattr(d, f.name, _value(rng, f, version))
    return d


def _same(fields: tuple[Field, ...], version: int, sent: Data, got: Data) -> None:
    for f in fields:
        if not f.present(version):
            continue
        want = sent.get(f.name, f.default)
        have = getattr(got, f.name)
        if f.type.startswith("[]") and not f.type[2:] and want is not None:
            assert f.fields is not None
            assert len(want) == len(have)
            for a, b in zip(want, have, strict=True):
                _same(f.fields, version, a, b)
        elif f.type == "{}" and (want is not None or not f.is_nullable(version)):
            assert f.fields is not None
            _same(f.fields, version, want or Data(), have)
        elif f.type == "uuid" and want is None:
            assert have == b"\x00" * 16
        else:
            if want is None and not f.is_nullable(version) and f.tag is None:
                want = {"string": "", "bytes": b"", "records": b""}.get(f.type, want)
                if f.type.startswith("[]"):
                    want = []
            elif want is None and f.tag is not None and f.type.startswith("[]"):
                want = []  # a tagged array not sent is empty
            assert have == want, (f.name, want, have)


CASES = [(key, v) for key, spec in sorted(APIS.items())
         for v in range(spec.min_version, spec.max_version + 1)]


@pytest.mark.parametrize(("key", "version"), CASES, ids=[f"{APIS[k].name}-v{v}" for k, v in CASES])
def test_round_trip_every_definition(key: int, version: int) -> None:
    spec = APIS[key]
    rng = random.Random(key * 100 + version)
    for _ in range(25):
        for response in (False, True):
            fields = spec.response if response else spec.request
            body = _struct(rng, fields, version)
            raw = encode_body(spec, version, body, response=response)
            got = decode_body(spec, version, raw, response=response)
            _same(fields, version, body, got)


def test_request_and_response_framing() -> None:
    frame = encode_request(3, 12, 42, "me", Data(topics=[Data(name="a", topic_id=b"\x00" * 16)],
                                                  allow_auto_topic_creation=False))
    req = _one(frame)
    assert isinstance(req, RequestReceived)
    assert req.api_name == "Metadata"
    assert req.body.topics[0].name == "a"
    assert req.body.allow_auto_topic_creation is False
    conn = KafkaConnection()
    out = conn.send_response(req, Data(brokers=[Data(node_id=0, host="h", port=1)], topics=[]))
    cid, body = decode_response(3, 12, out[4:])
    assert cid == 42
    assert body.brokers[0].host == "h"
    assert body.controller_id == -1


def test_api_versions_response_header_is_v0_even_when_flexible() -> None:
    req = _one(encode_request(18, 3, 9, "c", Data(client_software_name="x",
                                                  client_software_version="1")))
    out = KafkaConnection().send_response(req, Data(error_code=0, api_keys=api_versions_table()))
    # size, correlation id, then directly the error code (no tagged-field byte).
    assert out[4:8] == struct.pack(">i", 9)
    assert out[8:10] == b"\x00\x00"
    _, body = decode_response(18, 3, out[4:])
    assert {k.api_key for k in body.api_keys} == set(APIS)


def test_api_versions_at_an_unsupported_version_gets_the_v0_table() -> None:
    frame = struct.pack(">ihhi", 8, 18, 99, 5)
    ev = _one(frame)
    assert isinstance(ev, UnsupportedRequest)
    out = KafkaConnection().unsupported_response(ev)
    _, body = decode_response(18, 0, out[4:])
    assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [k.api_key for k in body.api_keys] == sorted(APIS)


@pytest.mark.parametrize(("key", "version"), [(3, 99), (3, 0), (777, 0), (-1, 0)])
def test_other_unknown_keys_and_versions_are_not_parsed(key: int, version: int) -> None:
    """Kafka cannot parse such a request and closes the connection: an error, not an event."""
    conn = KafkaConnection()
    conn.receive_data(struct.pack(">ihhi", 8, key, version, 6))
    with pytest.raises(RemoteProtocolError) as err:
        conn.next_event()
    assert err.value.code == ErrorCode.UNSUPPORTED_VERSION


def _produce_frame(correlation_id: int, records: bytes) -> bytes:
    return encode_request(0, 9, correlation_id, "p", Data(
        transactional_id=None, acks=-1, timeout_ms=1000,
        topic_data=[Data(name="t", partition_data=[Data(index=0, records=records)])]))


def _records_of(event: Any) -> bytes:
    assert isinstance(event, RequestReceived)
    return bytes(event.body.topic_data[0].partition_data[0].records)


def test_a_large_frame_is_read_into_its_own_buffer() -> None:
    """Once a large frame's size is in, the codec offers room after its bytes to read into,
    never past the frame's end; what follows the frame is decoded as usual."""
    big = bytes(range(256)) * (LARGE_FRAME // 128)
    first, after = _produce_frame(1, big), _produce_frame(2, b"small")
    conn = KafkaConnection()
    assert conn.receive_buffer() is None
    conn.receive_data(first[:1000])
    assert conn.next_event() is NEED_DATA
    view = conn.receive_buffer()
    assert view is not None and len(view) == LARGE_FRAME  # more than arrived: one read's room
    with view:
        view[:5000] = first[1000:6000]
    conn.received_into(5000)
    assert conn.next_event() is NEED_DATA
    rest = conn.receive_buffer()
    assert rest is not None and len(rest) == LARGE_FRAME - 5000  # the room not written yet
    with rest:
        rest[:] = first[6000:1000 + LARGE_FRAME]
    conn.received_into(LARGE_FRAME - 5000)
    last = conn.receive_buffer()
    assert last is not None and len(last) == len(first) - 1000 - LARGE_FRAME  # not past the frame
    last.release()
    # The tail arrives through receive_data together with the next request.
    conn.receive_data(first[1000 + LARGE_FRAME:] + after)
    assert conn.receive_buffer() is None
    assert _records_of(conn.next_event()) == big
    assert _records_of(conn.next_event()) == b"small"
    assert conn.next_event() is NEED_DATA
    assert conn.buffered == 0


def test_a_large_size_prefix_alone_holds_only_what_arrived() -> None:
    """A size prefix is a claim: a frame announced just under the request limit, of which
    a header's worth arrived, holds that and one read's room (the room the driver reads
    into), not the size announced."""
    conn = KafkaConnection()
    tracemalloc.start()
    try:
        conn.receive_data(struct.pack(">i", DEFAULT_MAX_REQUEST_SIZE - 16)
                          + struct.pack(">hhi", 18, 3, 1))
        assert conn.next_event() is NEED_DATA
        view = conn.receive_buffer()
        assert view is not None and len(view) <= LARGE_FRAME
        view.release()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert conn.buffered == 8
    assert peak < 4 * LARGE_FRAME and held < 4 * LARGE_FRAME


def test_a_large_frame_fed_in_pieces_holds_what_arrived_and_decodes_exactly() -> None:
    """A 3 MB produce fed in pieces of every size, through both ways in (receive_data and
    reading into receive_buffer), decodes to exactly the records sent; all along, the
    memory held stays within twice the bytes fed plus one read's room."""
    rng = random.Random(7)
    records = rng.randbytes(3 * 1024 * 1024)
    frame = memoryview(_produce_frame(1, records) + _produce_frame(2, b"after"))
    conn = KafkaConnection()
    fed = 0
    tracemalloc.start()
    try:
        while fed < len(frame):
            n = rng.choice((1, 7, 100, 4096, 50_000, 300_000))
            view = conn.receive_buffer()
            if view is not None and rng.random() < 0.5:
                with view:
                    n = min(n, len(view))
                    view[:n] = frame[fed:fed + n]
                conn.received_into(n)
            else:
                if view is not None:
                    view.release()
                n = min(n, len(frame) - fed)
                conn.receive_data(frame[fed:fed + n])
            fed += n
            if fed < len(records):
                assert conn.next_event() is NEED_DATA
                held = tracemalloc.get_traced_memory()[0]
                assert held <= 2 * fed + 2 * LARGE_FRAME, (fed, held)
    finally:
        tracemalloc.stop()
    assert _records_of(conn.next_event()) == records
    assert _records_of(conn.next_event()) == b"after"
    assert conn.next_event() is NEED_DATA and conn.buffered == 0


def test_requests_decode_from_a_view_and_leave_the_buffer_reusable() -> None:
    """Requests are decoded from the buffer in place; each one is consumed from it, and
    a malformed request ends with a protocol error, not a buffer error."""
    frames = b"".join(_produce_frame(i, b"r%d" % i) for i in range(5))
    conn = KafkaConnection()
    conn.receive_data(frames)
    assert [_records_of(conn.next_event()) for _ in range(5)] == [b"r%d" % i for i in range(5)]
    assert conn.buffered == 0
    bad = bytearray(_produce_frame(9, b"x"))
    bad[14] = 0xFF  # inside the client id: not UTF-8
    conn.receive_data(bytes(bad))
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


@pytest.mark.parametrize("size", [-1, -2**31, 7, 2**31 - 1, 100 * 1024 * 1024 + 1])
def test_absurd_size_prefix_is_refused_before_buffering(size: int) -> None:
    conn = KafkaConnection()
    conn.receive_data(struct.pack(">i", size))
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.code == ErrorCode.INVALID_REQUEST


def test_truncated_bodies_raise_protocol_errors() -> None:
    frame = encode_request(0, 9, 1, "c", Data(transactional_id=None, acks=-1, timeout_ms=1,
                                               topic_data=[Data(name="t", partition_data=[
                                                   Data(index=0, records=b"abc")])]))
    for cut in range(8, len(frame) - 4):
        body = frame[4:4 + cut]
        conn = KafkaConnection()
        conn.receive_data(struct.pack(">i", len(body)) + body)
        with pytest.raises(RemoteProtocolError):
            conn.next_event()


def test_fuzz_request_decoder() -> None:
    """Mutated golden frames and random bytes: a request, unsupported, or RemoteProtocolError."""
    rng = random.Random(1234)
    seeds = [p.read_bytes() for p in GOLDEN]
    for i in range(4000):
        base = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            op = rng.random()
            pos = rng.randrange(4, len(base))
            if op < 0.5:
                base[pos] = rng.randrange(256)
            elif op < 0.75:
                del base[pos:pos + rng.randint(1, 8)]
            else:
                base[pos:pos] = rng.randbytes(rng.randint(1, 8))
        if i % 7 == 0:
            base = bytearray(rng.randbytes(rng.randint(0, 60)))
        body = bytes(base[4:])
        conn = KafkaConnection()
        conn.receive_data(struct.pack(">i", len(body)) + body)
        try:
            ev = conn.next_event()
        except RemoteProtocolError:
            continue
        assert ev is NEED_DATA or isinstance(ev, RequestReceived | UnsupportedRequest)
