"""The Pulsar entry format: round trips, real client bytes, and malformed input."""

from __future__ import annotations

import doctest
import random
import struct
import zlib
from pathlib import Path

import crc32c
import pytest

import core.format
import core.format._entry
from core.format import (
    LZ4,
    NONE,
    SNAPPY,
    ZLIB,
    ZSTD,
    EntryFormatError,
    Message,
    build_batch,
    compress,
    decode_broker_entry_metadata,
    decode_entry,
    decompress,
    encode_broker_entry_metadata,
    encode_entry,
    entry_from_messages,
    iter_batch,
    key_fields,
    messages_from_entry,
    verify_checksum,
)
from core.format import pulsar_api_pb2 as pb

COMPRESSIONS = [NONE, LZ4, ZLIB, ZSTD, SNAPPY]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pulsar"


def _messages(count: int, rng: random.Random) -> list[Message]:
    out = []
    for i in range(count):
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 7, 300])))
        out.append(
            Message(
                payload=payload * rng.choice([1, 5]),
                key=rng.choice([None, "", f"key-{i}", "ключ"]),
                properties=rng.choice([{}, {"a": "1"}, {"x": "y", "ünï": "cødé"}]),
                event_time=rng.choice([None, 1_700_000_000_000 + i]),
                sequence_id=rng.choice([None, 100 + i]),
                ordering_key=rng.choice([None, b"", b"\x00\xffok"]),
                null_value=rng.random() < 0.1,
            )
        )
    return out


def _same(a: Message, b: Message) -> None:
    assert b.payload == a.payload
    assert b.key == a.key
    assert dict(b.properties) == dict(a.properties)
    assert b.event_time == a.event_time
    assert b.ordering_key == a.ordering_key
    assert b.null_value == a.null_value
    if a.sequence_id is not None:
        assert b.sequence_id == a.sequence_id


def test_docstring_examples_run() -> None:
    assert doctest.testmod(core.format).failed == 0
    assert doctest.testmod(core.format._entry).failed == 0


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=pb.CompressionType.Name)
@pytest.mark.parametrize("count", [1, 2, 17])
def test_batch_round_trip_every_compression(compression: int, count: int) -> None:
    rng = random.Random(count * 31 + compression)
    for _ in range(20):
        messages = _messages(count, rng)
        raw = entry_from_messages(
            messages,
            producer_name="prod",
            sequence_id=42,
            publish_time=1_700_000_000_123,
            compression=compression,
            batched=True,
        )
        assert verify_checksum(raw)
        metadata, payload = decode_entry(raw)
        assert metadata.num_messages_in_batch == count
        assert metadata.compression == compression
        singles = iter_batch(metadata, payload)
        assert [s.payload for s in singles] == [m.payload for m in messages]
        back = messages_from_entry(raw)
        assert len(back) == count
        for index, (want, got) in enumerate(zip(messages, back, strict=True)):
            _same(want, got)
            assert got.publish_time == 1_700_000_000_123
            assert got.producer_name == "prod"
            if want.sequence_id is None:
                assert got.sequence_id == 42 + index


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=pb.CompressionType.Name)
def test_plain_entry_round_trip_every_compression(compression: int) -> None:
    rng = random.Random(compression)
    for _ in range(20):
        (message,) = _messages(1, rng)
        message = Message(
            payload=message.payload,
            key=message.key,
            properties=message.properties,
            event_time=message.event_time,
            ordering_key=message.ordering_key,
            deliver_at_time=1_800_000_000_000,
            null_value=message.null_value,
        )
        raw = entry_from_messages(
            [message], producer_name="p", sequence_id=9, publish_time=5, compression=compression
        )
        metadata, _ = decode_entry(raw)
        assert not metadata.HasField("num_messages_in_batch")
        (got,) = messages_from_entry(raw)
        _same(message, got)
        assert got.sequence_id == 9
        assert got.deliver_at_time == 1_800_000_000_000


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=pb.CompressionType.Name)
def test_compress_decompress_round_trip(compression: int) -> None:
    rng = random.Random(7)
    for size in [0, 1, 2, 100, 65_536, 300_001]:
        data = bytes(rng.getrandbits(8) for _ in range(min(size, 1000))) * (size // 1000 or 1)
        data = data[:size]
        assert decompress(compression, compress(compression, data), len(data)) == data


def test_compression_framings_are_the_pulsar_clients() -> None:
    data = b"pulsar " * 50
    # LZ4: a raw block, no size prefix and no frame magic.
    assert not compress(LZ4, data).startswith(b"\x04\x22\x4d\x18")
    # ZLIB: a zlib stream (header byte 0x78).
    assert compress(ZLIB, data)[0] == 0x78
    assert zlib.decompress(compress(ZLIB, data)) == data
    # ZSTD: a zstd frame.
    assert compress(ZSTD, data).startswith(b"\x28\xb5\x2f\xfd")
    # SNAPPY: a raw block opening with the varint uncompressed length.
    assert compress(SNAPPY, data)[:2] == bytes([len(data) & 0x7F | 0x80, len(data) >> 7])


@pytest.mark.parametrize("compression", [LZ4, ZLIB, ZSTD, SNAPPY], ids=pb.CompressionType.Name)
def test_decompress_never_exceeds_the_declared_size(compression: int) -> None:
    bomb = compress(compression, b"\x00" * 1_000_000)
    with pytest.raises(EntryFormatError):
        decompress(compression, bomb, 1000)
    with pytest.raises(EntryFormatError):
        decompress(compression, bomb, 1_000_000, max_uncompressed_size=999_999)
    assert len(decompress(compression, bomb, 1_000_000)) == 1_000_000


def test_native_crc32c_is_castagnolis() -> None:
    from core._native import crc32c as native_crc32c

    assert native_crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert native_crc32c(b"") == 0
    rng = random.Random(7)
    for size in (1, 7, 64, 1000, 65537):
        data = rng.randbytes(size)
        assert native_crc32c(data) == crc32c.crc32c(data)
        assert native_crc32c(bytearray(data)) == crc32c.crc32c(data)
        assert native_crc32c(memoryview(data)[1:]) == crc32c.crc32c(data[1:])
    with pytest.raises(ValueError, match="contiguous"):
        native_crc32c(memoryview(b"abcdef")[::2])


def test_encode_entry_layout() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    raw = encode_entry(metadata, b"payload")
    magic, checksum, meta_size = struct.unpack_from(">HII", raw)
    assert magic == 0x0E01
    assert checksum == crc32c.crc32c(raw[6:])
    assert raw[10 : 10 + meta_size] == metadata.SerializeToString()
    assert raw[10 + meta_size :] == b"payload"
    assert decode_entry(raw) == (metadata, b"payload")


def test_broker_entry_metadata_prefix() -> None:
    prefix = encode_broker_entry_metadata(1_700_000_000_000, 41)
    assert prefix[:2] == b"\x0e\x02"
    meta, offset = decode_broker_entry_metadata(prefix + b"rest")
    assert meta is not None
    assert (meta.broker_timestamp, meta.index, offset) == (1_700_000_000_000, 41, len(prefix))
    raw = entry_from_messages(
        [Message(payload=b"x")], producer_name="p", sequence_id=0, publish_time=1
    )
    assert messages_from_entry(prefix + raw)[0].payload == b"x"
    assert decode_broker_entry_metadata(raw) == (None, 0)


def test_bad_magic_checksum_and_truncation_raise_entry_format_error() -> None:
    raw = entry_from_messages(
        [Message(payload=b"hello")], producer_name="p", sequence_id=0, publish_time=1
    )
    assert verify_checksum(raw)
    with pytest.raises(EntryFormatError, match="magic"):
        decode_entry(b"\x0e\x03" + raw[2:])
    flipped = bytearray(raw)
    flipped[-1] ^= 0x01
    assert not verify_checksum(flipped)
    with pytest.raises(EntryFormatError, match="checksum"):
        decode_entry(bytes(flipped))
    for cut in range(len(raw)):
        assert not verify_checksum(raw[:cut])
        with pytest.raises(EntryFormatError):
            decode_entry(raw[:cut])


def test_encrypted_entries_are_refused_rather_than_misread() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    metadata.encryption_keys.add(key="k", value=b"wrapped")
    raw = encode_entry(metadata, b"ciphertext")
    assert decode_entry(raw)[1] == b"ciphertext"
    with pytest.raises(EntryFormatError, match="encrypted"):
        messages_from_entry(raw)


@pytest.mark.parametrize(
    "raw", [None, b"", b"k1", "ключ".encode(), b"\xff\x00\x80", bytes(range(256))]
)
def test_binary_keys_survive_an_entry(raw: bytes | None) -> None:
    message = Message(payload=b"v", **key_fields(raw))
    assert message.key_bytes == raw
    if raw is not None and raw.isascii():
        assert message.key == raw.decode()  # readable keys stay readable for other protocols
    raw_entry = entry_from_messages(
        [message, Message(payload=b"w")], producer_name="p", sequence_id=0, publish_time=1
    )
    (got, _) = messages_from_entry(raw_entry)
    assert got.key_bytes == raw
    assert got.key_b64_encoded == message.key_b64_encoded


def test_build_batch_fields() -> None:
    fields, payload = build_batch([Message(payload=b"a" * 100)] * 3, LZ4)
    assert fields["num_messages_in_batch"] == 3
    assert fields["compression"] == LZ4
    assert len(decompress(LZ4, payload, fields["uncompressed_size"])) == fields["uncompressed_size"]
    with pytest.raises(EntryFormatError):
        build_batch([], NONE)


def _corrupt(rng: random.Random, good: bytes) -> bytes:
    kind = rng.randrange(5)
    data = bytearray(good)
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(64)))
    if kind == 1 and data:
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
    elif kind == 2:
        data = data[: rng.randrange(len(data) + 1)]
    elif kind == 3:
        data += bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16)))
    else:
        pos = rng.randrange(len(data) + 1)
        data[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 8)))
    return bytes(data)


def _reseal(data: bytes) -> bytes:
    """Fix the CRC so corruption reaches the metadata and batch parsers."""
    if len(data) < 10:
        return data
    return b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(data[6:])) + data[6:]


def test_random_and_mutated_bytes_raise_only_entry_format_error() -> None:
    rng = random.Random(20261122)
    goods = [
        entry_from_messages(
            _messages(count, rng),
            producer_name="p",
            sequence_id=1,
            publish_time=2,
            compression=c,
            batched=count > 1 or rng.random() < 0.5,
        )
        for c in COMPRESSIONS
        for count in (1, 1, 3, 3)
    ]
    for _ in range(3000):
        data = _corrupt(rng, rng.choice(goods))
        if rng.random() < 0.6:
            data = _reseal(data)
        try:
            messages_from_entry(data, max_uncompressed_size=1 << 20)
        except EntryFormatError:
            pass


# --------------------------------------------------------------------------- generated code


def test_generated_module_matches_the_proto(tmp_path: Path) -> None:
    from core.format import _generate

    written = _generate.generate(tmp_path)
    committed = Path(core.format.pulsar_api_pb2.__file__)
    assert written.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8")
    stub = committed.with_suffix(".pyi")
    assert (tmp_path / stub.name).read_text(encoding="utf-8") == stub.read_text(encoding="utf-8")
    assert (
        committed.read_text(encoding="utf-8")
        .splitlines()[0]
        .startswith("# Generated by grpc_tools.protoc")
    )


def test_wire_numbers_of_key_fields() -> None:
    fields = pb.MessageMetadata.DESCRIPTOR.fields_by_name
    assert fields["num_messages_in_batch"].number == 11
    assert fields["null_value"].number == 25
    assert fields["chunk_id"].number == 29
    assert pb.BaseCommand.DESCRIPTOR.fields_by_name["getOrCreateSchemaResponse"].number == 40
    assert pb.ServerError.Value("ProducerFenced") == 25
    assert pb.CompressionType.Value("SNAPPY") == 4


# --------------------------------------------------------------------------- real client bytes


def _entry_of_send_frame(raw: bytes) -> bytes:
    total, command_size = struct.unpack_from(">II", raw)
    assert total == len(raw) - 4
    return raw[8 + command_size :]


@pytest.mark.parametrize("compression", ["none", "lz4", "zlib", "zstd", "snappy"])
@pytest.mark.parametrize("kind", ["single", "batch"])
def test_entries_written_by_the_real_pulsar_client(compression: str, kind: str) -> None:
    path = FIXTURES / f"send_{compression}_{kind}.bin"
    entry = _entry_of_send_frame(path.read_bytes())
    assert verify_checksum(entry)
    metadata, payload = decode_entry(entry)
    assert pb.CompressionType.Name(metadata.compression).lower() == compression
    assert metadata.producer_name == f"golden-{compression}-{kind}"
    count = 3 if kind == "batch" else 1
    assert metadata.HasField("num_messages_in_batch") is (kind == "batch")
    if compression != "none":
        assert metadata.uncompressed_size > len(payload)
    messages = messages_from_entry(entry)
    assert len(messages) == count
    for i, message in enumerate(messages):
        label = compression.upper()
        assert message.payload == f"golden-{label}-{kind}-{i} ".encode() * 8
        assert message.key == f"key-{i}"
        assert message.event_time == 1_700_000_000_000 + i
        assert dict(message.properties) == {"index": str(i), "codec": label}
        assert message.publish_time == metadata.publish_time > 1_700_000_000_000
    # What we build from those messages reads back the same.
    rebuilt = entry_from_messages(
        messages,
        producer_name=metadata.producer_name,
        sequence_id=metadata.sequence_id,
        publish_time=metadata.publish_time,
        compression=metadata.compression,
        batched=kind == "batch",
    )
    assert [m.payload for m in messages_from_entry(rebuilt)] == [m.payload for m in messages]
