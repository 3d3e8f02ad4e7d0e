"""Record batch v2: round trips with every compression, CRC, bounds, control batches, the
entry mapping, and fuzzing of the batch decoder."""

from __future__ import annotations

import base64
import random
import struct

import crc32c
import pytest
import snappy

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
        for name, value in rec.headers:
            want.properties.add(key=name, value=_mapping._header_text(value))
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
