"""Record batch v2: round trips with every compression, CRC, bounds, control batches, the
entry mapping, and fuzzing of the batch decoder."""

from __future__ import annotations

import base64
import random
import struct

import crc32c
import pytest
import snappy

from core import _native
from core.format import messages_from_entry
from handlers.kafka import _mapping
from handlers.kafka import _records as rb
from handlers.kafka._errors import ErrorCode, RemoteProtocolError

CODECS = [rb.NONE, rb.GZIP, rb.SNAPPY, rb.LZ4, rb.ZSTD]


def _records(n: int, rng: random.Random) -> list[rb.Record]:
    out = []
    for i in range(n):
        key = None if i % 5 == 4 else rng.randbytes(rng.randint(0, 8))
        value = None if i % 7 == 6 else rng.randbytes(rng.randint(0, 300))
        headers = tuple((f"h{j}", None if j == 2 else rng.randbytes(3)) for j in range(i % 4))
        out.append(rb.Record(offset_delta=i, timestamp=1_700_000_000_000 + rng.randint(0, 10**6),
                             key=key, value=value, headers=headers))
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_compression(codec: int) -> None:
    rng = random.Random(codec)
    for n in (1, 2, 17, 200):
        recs = _records(n, rng)
        raw = rb.encode_batch(recs, base_offset=1000 + n, compression=codec, producer_id=7,
                              producer_epoch=2, base_sequence=40)
        [b] = rb.decode_batches(raw)
        assert b.records == recs
        assert (b.base_offset, b.compression, b.producer_id, b.producer_epoch) == (1000 + n, codec, 7, 2)
        assert b.last_sequence == 40 + n - 1
        assert b.size == len(raw)
        assert b.max_timestamp == max(r.timestamp for r in recs)


def test_several_batches_in_one_records_field() -> None:
    rng = random.Random(5)
    raws = [rb.encode_batch(_records(3, rng), base_offset=i * 3, compression=c)
            for i, c in enumerate(CODECS)]
    batches = rb.decode_batches(b"".join(raws))
    assert [b.base_offset for b in batches] == [0, 3, 6, 9, 12]


def test_crc_mismatch_is_corrupt_message() -> None:
    raw = bytearray(rb.encode_batch([rb.Record(value=b"x" * 20, timestamp=1)], base_offset=0))
    raw[-3] ^= 0xFF
    with pytest.raises(RemoteProtocolError) as info:
        rb.decode_batches(bytes(raw))
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE


def test_old_magic_is_unsupported_for_message_format() -> None:
    raw = bytearray(rb.encode_batch([rb.Record(value=b"x", timestamp=1)], base_offset=0))
    raw[16] = 1
    with pytest.raises(RemoteProtocolError) as info:
        rb.decode_batches(bytes(raw))
    assert info.value.code == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT


@pytest.mark.parametrize("codec", [rb.GZIP, rb.SNAPPY, rb.LZ4, rb.ZSTD])
def test_decompression_is_bounded(codec: int) -> None:
    bomb = rb.encode_batch([rb.Record(value=b"\x00" * 200_000, timestamp=1)], base_offset=0,
                           compression=codec)
    assert len(bomb) < 20_000
    with pytest.raises(RemoteProtocolError) as info:
        rb.decode_batches(bomb, max_uncompressed_size=100_000)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    assert rb.decode_batches(bomb, max_uncompressed_size=300_000)[0].records[0].value == b"\x00" * 200_000


def test_xerial_framed_snappy_is_read() -> None:
    payload = b"hello xerial " * 100
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(payload), 500):
        block = snappy.compress(payload[i:i + 500])
        framed += struct.pack(">i", len(block)) + block
    assert rb.decompress(rb.SNAPPY, framed) == payload


def test_control_batch() -> None:
    raw = rb.encode_control_batch(base_offset=9, producer_id=3, producer_epoch=1, commit=True,
                                  timestamp=5)
    [b] = rb.decode_batches(raw)
    assert b.is_control and b.is_transactional
    assert b.records[0].key == struct.pack(">hh", 0, rb.CONTROL_COMMIT)


@pytest.mark.parametrize("codec", [rb.NONE, rb.ZSTD])
def test_log_append_time_is_set_in_place(codec: int) -> None:
    """As a Kafka broker serves a batch of a LogAppendTime topic: the same records, the
    timestamp type bit and the append time as max timestamp, under a new CRC."""
    recs = _records(5, random.Random(3))
    raw = rb.encode_batch(recs, base_offset=9, compression=codec, producer_id=4)
    served = rb.with_log_append_time(raw, 1_800_000_000_000)
    assert served == rb.encode_batch(recs, base_offset=9, compression=codec, producer_id=4,
                                     log_append_time=1_800_000_000_000)
    [b] = rb.decode_batches(served)  # the CRC is checked
    assert (b.log_append_time, b.max_timestamp, b.compression) == (True, 1_800_000_000_000, codec)
    assert b.records == recs
    with pytest.raises(ValueError):
        rb.with_log_append_time(raw[:rb.BATCH_HEADER_SIZE - 1], 1)


def test_fuzz_batch_decoder() -> None:
    rng = random.Random(99)
    seeds = [rb.encode_batch(_records(5, rng), base_offset=0, compression=c) for c in CODECS]
    for i in range(3000):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(raw))
            raw[pos] = rng.randrange(256)
        if i % 3 == 0:
            # Keep the CRC valid so that the record parser itself is exercised.
            body = bytes(raw[21:])
            raw[17:21] = struct.pack(">I", crc32c.crc32c(body))
        try:
            rb.decode_batches(bytes(raw))
        except RemoteProtocolError:
            pass


# -- records <-> entries -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_batch_to_entry_and_back(codec: int) -> None:
    recs = [
        rb.Record(offset_delta=0, timestamp=111, key=b"text-key", value=b"v0", headers=(("a", b"1"),)),
        rb.Record(offset_delta=1, timestamp=222, key=b"\xff\x00bin", value=None),
        rb.Record(offset_delta=2, timestamp=333, key=None, value=b""),
    ]
    [batch] = rb.decode_batches(rb.encode_batch(recs, base_offset=0, compression=codec))
    entry = _mapping.entry_from_batch(batch, publish_time=999)
    msgs = messages_from_entry(entry)
    assert [m.payload for m in msgs] == [b"v0", b"", b""]
    assert msgs[0].key == "text-key" and msgs[0].properties == {"a": "1"}
    assert msgs[1].key_b64_encoded and base64.b64decode(msgs[1].key) == b"\xff\x00bin"
    assert msgs[1].null_value and not msgs[2].null_value
    assert [m.event_time for m in msgs] == [111, 222, 333]
    out = _mapping.batch_from_entry(entry, index=52, num_messages=3, publish_time=999)
    [back] = rb.decode_batches(out)
    assert back.base_offset == 50
    assert back.records == recs


def test_pulsar_message_without_event_time_reads_with_publish_time() -> None:
    from core.format import Message, entry_from_messages
    entry = entry_from_messages([Message(payload=b"p", key="k", properties={"x": "y"})],
                                producer_name="p", sequence_id=0, publish_time=4242)
    [b] = rb.decode_batches(_mapping.batch_from_entry(entry, index=0, num_messages=1,
                                                      publish_time=4242))
    assert b.records == [rb.Record(offset_delta=0, timestamp=4242, key=b"k", value=b"p",
                                   headers=(("x", b"y"),))]


def test_directly_written_single_metadata_matches_protobuf() -> None:
    from core.format import pulsar_api_pb2 as pb
    rng = random.Random(3)
    for rec in _records(60, rng):
        rec = rec._replace(timestamp=rng.choice([0, -1, 1_700_000_000_123]))
        raw = _mapping._single_metadata(rec, True)
        got = pb.SingleMessageMetadata.FromString(raw)
        want = pb.SingleMessageMetadata(payload_size=len(rec.value or b""))
        for name, text in _mapping.header_properties(rec.headers):
            want.properties.add(key=name, value=text)
        if rec.key is not None:
            text, b64 = _mapping._key_text(rec.key)
            want.partition_key = text
            if b64:
                want.partition_key_b64_encoded = True
        if rec.timestamp > 0:
            want.event_time = rec.timestamp
        if rec.value is None:
            want.null_value = True
        assert got == want
        assert raw == want.SerializeToString()


# -- the native conversion -----------------------------------------------------------------------


def _header_only(raw: bytes) -> rb.RecordBatch:
    [batch] = rb.decode_batches(raw, records=False)
    return batch


@pytest.mark.parametrize("seed", range(6))
def test_native_entry_is_byte_for_byte_the_python_entry(seed: int) -> None:
    """Batches of 1..40 records with text and binary keys, headers (binary, null and
    repeated names), null and empty values, CreateTime and LogAppendTime: the native
    converter writes exactly the entry the Python mapping writes."""
    rng = random.Random(seed)
    for _ in range(40):
        recs = _records(rng.randint(1, 40), rng)
        if rng.random() < 0.3:
            name = rng.choice(["dup", "x"])
            recs[0] = recs[0]._replace(headers=((name, b"first"), ("mid", None), (name, b"\xfflast")))
        recs = [r._replace(key=f"key-{i}".encode()) if r.key is not None and i % 2 else r
                for i, r in enumerate(recs)]
        raw = rb.encode_batch(recs, base_offset=0, producer_id=rng.choice([-1, 7]),
                              producer_epoch=2, base_sequence=rng.choice([-1, 0, 30]),
                              log_append_time=rng.choice([None, 1_700_000_000_999]))
        header = _header_only(raw)
        native = _mapping.native_entry(header, publish_time=1234)
        assert native is not None
        entry, n, contiguous = native
        full = rb.with_records(header)
        want = _mapping.entry_from_batch(full, publish_time=1234,
                                         producer_name=_mapping.producer_name_of(full),
                                         sequence_id=max(full.base_sequence, 0))
        assert entry == want
        assert n == len(recs) and contiguous


def test_native_entry_reports_gaps_and_leaves_compressed_batches_to_python() -> None:
    recs = [rb.Record(offset_delta=0, value=b"a"), rb.Record(offset_delta=3, value=b"b")]
    _, n, contiguous = _mapping.native_entry(
        _header_only(rb.encode_batch(recs, base_offset=0)), publish_time=1)  # type: ignore[misc]
    assert (n, contiguous) == (2, False)
    for codec in CODECS[1:]:
        zipped = _header_only(rb.encode_batch(recs, base_offset=0, compression=codec))
        assert _mapping.native_entry(zipped, publish_time=1) is None


def test_native_entry_refuses_corrupt_records_as_corrupt_message() -> None:
    rng = random.Random(5)
    raw = bytearray(rb.encode_batch(_records(4, rng), base_offset=0))
    raw[rb.BATCH_HEADER_SIZE + 1] ^= 0x7F  # inside the first record
    raw[17:21] = struct.pack(">I", crc32c.crc32c(bytes(raw[21:])))
    with pytest.raises(RemoteProtocolError) as python:
        rb.decode_batches(bytes(raw))
    with pytest.raises(RemoteProtocolError) as native:
        _mapping.native_entry(_header_only(bytes(raw)), publish_time=1)
    assert native.value.code == python.value.code == ErrorCode.CORRUPT_MESSAGE


def test_fuzzed_batches_are_refused_alike_by_native_and_python() -> None:
    """Whatever a mutated batch holds, the native converter accepts exactly the batches the
    Python decoder accepts, and then writes the same entry."""
    rng = random.Random(17)
    seeds = [rb.encode_batch(_records(6, rng), base_offset=0) for _ in range(4)]
    for _ in range(2000):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(rb.BATCH_HEADER_SIZE, len(raw))
            raw[pos] = rng.randrange(256)
        raw[17:21] = struct.pack(">I", crc32c.crc32c(bytes(raw[21:])))
        try:
            [full] = rb.decode_batches(bytes(raw))
        except RemoteProtocolError:
            with pytest.raises(RemoteProtocolError):
                _mapping.native_entry(_header_only(bytes(raw)), publish_time=1)
            continue
        native = _mapping.native_entry(_header_only(bytes(raw)), publish_time=1)
        assert native is not None
        assert native[0] == _mapping.entry_from_batch(
            full, publish_time=1, producer_name=_mapping.producer_name_of(full),
            sequence_id=max(full.base_sequence, 0))


def _pulsar_entries(rng: random.Random) -> list[bytes]:
    """Entries as Pulsar producers and the other protocols write them: plain and batched,
    text and base64 keys, properties, event times or none, null values."""
    from core.format import Message, encode_broker_entry_metadata, entry_from_messages
    out = []
    for i in range(60):
        msgs = []
        for j in range(rng.randint(1, 6)):
            raw_key = rng.choice([None, b"k", rng.randbytes(5), f"key-{j}".encode()])
            b64 = raw_key is not None and not raw_key.isascii()
            msgs.append(Message(
                payload=rng.randbytes(rng.randint(0, 50)),
                key=None if raw_key is None else (
                    base64.b64encode(raw_key).decode() if b64 else raw_key.decode()),
                key_b64_encoded=b64,
                properties={f"p{n}": rng.choice(["", "v", "ünï"]) for n in range(rng.randint(0, 3))},
                event_time=rng.choice([None, 1_700_000_000_000 + j]),
                null_value=rng.random() < 0.1))
        entry = entry_from_messages(msgs, producer_name="p", sequence_id=i,
                                    publish_time=rng.choice([0, 1_600_000_000_000]),
                                    batched=rng.choice([None, True]))
        if i % 3 == 0:
            entry = encode_broker_entry_metadata(1_650_000_000_000, 100 + i) + entry
        out.append(entry)
    return out


def test_native_fetch_batch_is_byte_for_byte_the_python_batch() -> None:
    rng = random.Random(11)
    entries = _pulsar_entries(rng)
    for _ in range(20):
        recs = _records(rng.randint(1, 12), rng)
        [batch] = rb.decode_batches(rb.encode_batch(recs, base_offset=0))
        entries.append(_mapping.entry_from_batch(batch, publish_time=77))
    for entry in entries:
        n = len(messages_from_entry(entry))
        native = _native.kafka_batch_from_entry(entry, 500, n, 42)
        assert native is not None
        assert native == _mapping.python_batch_from_entry(entry, index=500, num_messages=n,
                                                          publish_time=42)


@pytest.mark.parametrize("codec", ["LZ4", "ZLIB", "ZSTD", "SNAPPY"])
def test_native_fetch_reads_compressed_entries_as_python_does(codec: str) -> None:
    from core import format as fmt
    zipped = fmt.entry_from_messages(
        [fmt.Message(payload=b"x" * 100, key="k"), fmt.Message(payload=b"y", properties={"a": "b"})],
        producer_name="p", sequence_id=0, publish_time=1, compression=getattr(fmt, codec))
    native = _native.kafka_batch_from_entry(zipped, 1, 2, 1)
    assert native is not None
    assert native == _mapping.python_batch_from_entry(zipped, index=1, num_messages=2,
                                                      publish_time=1)


def test_native_fetch_leaves_damaged_entries_to_python() -> None:
    good = _pulsar_entries(random.Random(2))[1]
    assert _native.kafka_batch_from_entry(good[:-1], 1, 1, 1) is None  # checksum


def test_fuzzed_entries_read_alike_natively_and_in_python() -> None:
    from core.format import EntryFormatError
    rng = random.Random(23)
    seeds = _pulsar_entries(rng)
    for _ in range(2000):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(raw))
            raw[pos] = rng.randrange(256)
        # Keep the checksum right, so that the metadata and batch parsers are exercised.
        at = 6 + struct.unpack_from(">I", raw, 2)[0] if raw[:2] == b"\x0e\x02" else 0
        if raw[at:at + 2] == b"\x0e\x01":
            raw[at + 2:at + 6] = struct.pack(">I", crc32c.crc32c(bytes(raw[at + 6:])))
        native = _native.kafka_batch_from_entry(bytes(raw), 9, 3, 5)
        try:
            want = _mapping.python_batch_from_entry(bytes(raw), index=9, num_messages=3,
                                                    publish_time=5)
        except (EntryFormatError, RemoteProtocolError, UnicodeDecodeError, ValueError):
            assert native is None
            continue
        if native is not None:
            assert native == want
