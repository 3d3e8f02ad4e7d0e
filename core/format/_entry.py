"""Pulsar's entry format: the unit every Magnetar topic stores, whatever protocol wrote it.

Theory of operation
-------------------
An *entry* is what a Pulsar producer sends in one SEND frame and what a ledger stores
under one entry id::

    [0x0e01 u16][crc32c u32][metadataSize u32][MessageMetadata][payload]
                 '------------- checksummed (CRC-32C) -------------'

The payload is one message, or - when ``MessageMetadata.num_messages_in_batch`` is
present - a batch: a run of ``[u32 size][SingleMessageMetadata][payload_size bytes]``,
compressed as a whole with ``MessageMetadata.compression`` (``uncompressed_size`` tells
the decompressed length).  All integers are big-endian.  The compression framings are
the ones Pulsar clients write: LZ4 is a raw block (no size prefix, no frame), ZLIB is a
zlib stream, ZSTD a zstd frame, SNAPPY a raw snappy block.

A broker may put ``[0x0e02 u16][size u32][BrokerEntryMetadata]`` in front of an entry
(publish timestamp and the index of the entry's last message).

Everything that reads wire or disk bytes checks each length before using it and raises
:class:`EntryFormatError` - never ``IndexError``, ``struct.error`` or a library's own
exception - and decompression never produces more than ``uncompressed_size`` bytes
(itself bounded by ``max_uncompressed_size``).

Example::

    >>> from core.format import Message, entry_from_messages, messages_from_entry
    >>> raw = entry_from_messages([Message(payload=b"hi", key="k")],
    ...                           producer_name="p", sequence_id=0, publish_time=1)
    >>> [(m.key, m.payload) for m in messages_from_entry(raw)]
    [('k', b'hi')]
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import lz4.block
import snappy
import zstandard
from google.protobuf.message import DecodeError

from core._native import crc32c

from . import pulsar_api_pb2 as pb

__all__ = [
    "ack_set",
    "ack_set_but",
    "DEFAULT_MAX_UNCOMPRESSED_SIZE",
    "ENTRY_HEADER_SIZE",
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "EntryFormatError",
    "Message",
    "SingleMessage",
    "build_batch",
    "compress",
    "crc32c",
    "decode_broker_entry_metadata",
    "decode_entry",
    "decompress",
    "encode_broker_entry_metadata",
    "encode_entry",
    "chunk_entries",
    "entry_from_messages",
    "iter_batch",
    "key_fields",
    "messages_from_entry",
    "messages_of",
    "indexed_messages",
    "strings_are_utf8",
    "verify_checksum",
]

MAGIC_CRC32C = 0x0E01
"""Marks an entry whose metadata and payload are covered by a CRC-32C."""
MAGIC_BROKER_ENTRY_METADATA = 0x0E02
"""Marks the broker entry metadata section in front of an entry."""

DEFAULT_MAX_UNCOMPRESSED_SIZE = 64 * 1024 * 1024
"""Largest decompressed batch accepted unless the caller passes its own bound."""

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_MAGIC_CRC = struct.Struct(">HI")
ENTRY_HEADER_SIZE = 2 + 4 + 4  # magic, checksum, metadataSize

NONE = pb.NONE
LZ4 = pb.LZ4
ZLIB = pb.ZLIB
ZSTD = pb.ZSTD
SNAPPY = pb.SNAPPY


class EntryFormatError(ValueError):
    """Bytes that are not a well-formed entry (bad magic, bad checksum, truncated, ...)."""


# --------------------------------------------------------------------------- views


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One message, independent of the protocol that produced or will consume it.

    Times are milliseconds since the epoch.  ``key`` is Pulsar's partition key (a Kafka
    key, an AMQP routing key); when it carries arbitrary bytes it is base64 text and
    ``key_b64_encoded`` is set, as Pulsar clients do.
    """

    payload: bytes = b""
    key: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    event_time: int | None = None
    publish_time: int | None = None
    sequence_id: int | None = None
    producer_name: str | None = None
    ordering_key: bytes | None = None
    deliver_at_time: int | None = None
    null_value: bool = False
    key_b64_encoded: bool = False

    @property
    def key_bytes(self) -> bytes | None:
        """The key as bytes (what a Kafka consumer sees), undoing base64 when flagged."""
        if self.key is None:
            return None
        if self.key_b64_encoded:
            try:
                return base64.b64decode(self.key, validate=True)
            except binascii.Error:
                return self.key.encode()
        return self.key.encode()


def key_fields(raw: bytes | None) -> dict[str, Any]:
    """``Message`` keyword fields for a binary key (a Kafka key, say).

    A key that is valid UTF-8 is stored as that text, so Pulsar and AMQP readers see the
    same string; any other key is stored base64-encoded with ``key_b64_encoded`` set, as
    Pulsar clients do for byte keys.  ``Message(**key_fields(k)).key_bytes == k`` always.
    """
    if raw is None:
        return {"key": None, "key_b64_encoded": False}
    try:
        return {"key": raw.decode(), "key_b64_encoded": False}
    except UnicodeDecodeError:
        return {"key": base64.b64encode(raw).decode("ascii"), "key_b64_encoded": True}


@dataclass(frozen=True, slots=True)
class SingleMessage:
    """One message of an entry as stored: its per-message metadata and its payload."""

    metadata: pb.SingleMessageMetadata
    payload: bytes


# --------------------------------------------------------------------------- entry


def _as_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def encode_entry(metadata: pb.MessageMetadata, payload: bytes | memoryview) -> bytes:
    """Serialize ``metadata`` and ``payload`` as an entry with magic and CRC-32C."""
    try:
        meta = metadata.SerializeToString()
    except Exception as exc:  # missing required fields
        raise EntryFormatError(f"metadata cannot be encoded: {exc}") from exc
    body = b"".join((_U32.pack(len(meta)), meta, payload))
    return _MAGIC_CRC.pack(MAGIC_CRC32C, crc32c(body)) + body


def verify_checksum(buf: bytes | bytearray | memoryview) -> bool:
    """True when ``buf`` starts with the 0x0e01 magic and its CRC-32C matches."""
    view = _as_view(buf)
    if len(view) < ENTRY_HEADER_SIZE:
        return False
    magic, checksum = _MAGIC_CRC.unpack_from(view, 0)
    return magic == MAGIC_CRC32C and crc32c(view[6:]) == checksum


def decode_broker_entry_metadata(
    buf: bytes | bytearray | memoryview,
) -> tuple[pb.BrokerEntryMetadata | None, int]:
    """Parse an optional 0x0e02 section; return it and the offset where the entry starts."""
    view = _as_view(buf)
    if len(view) < 2 or _U16.unpack_from(view, 0)[0] != MAGIC_BROKER_ENTRY_METADATA:
        return None, 0
    if len(view) < 6:
        raise EntryFormatError("truncated broker entry metadata header")
    (size,) = _U32.unpack_from(view, 2)
    end = 6 + size
    if end > len(view):
        raise EntryFormatError(f"broker entry metadata of {size} bytes exceeds the buffer")
    meta = pb.BrokerEntryMetadata()
    try:
        meta.ParseFromString(view[6:end])
    except DecodeError as exc:
        raise EntryFormatError(f"malformed broker entry metadata: {exc}") from exc
    return meta, end


def encode_broker_entry_metadata(publish_time: int | None, index: int | None) -> bytes:
    """The 0x0e02 section a broker writes in front of an entry for clients that ask."""
    meta = pb.BrokerEntryMetadata()
    if publish_time is not None:
        meta.broker_timestamp = publish_time
    if index is not None:
        meta.index = index
    body = meta.SerializeToString()
    return _U16.pack(MAGIC_BROKER_ENTRY_METADATA) + _U32.pack(len(body)) + body


def decode_entry(buf: bytes | bytearray | memoryview) -> tuple[pb.MessageMetadata, bytes]:
    """Check and split an entry into its metadata and its (possibly compressed) payload.

    A leading broker entry metadata section is skipped.
    """
    view = _as_view(buf)
    _, start = decode_broker_entry_metadata(view)
    view = view[start:]
    if len(view) < ENTRY_HEADER_SIZE:
        raise EntryFormatError(f"entry of {len(view)} bytes is shorter than its header")
    magic, checksum = _MAGIC_CRC.unpack_from(view, 0)
    if magic != MAGIC_CRC32C:
        raise EntryFormatError(f"bad magic 0x{magic:04x}, expected 0x{MAGIC_CRC32C:04x}")
    actual = crc32c(view[6:])
    if actual != checksum:
        raise EntryFormatError(
            f"checksum mismatch: stored 0x{checksum:08x}, computed 0x{actual:08x}"
        )
    (meta_size,) = _U32.unpack_from(view, 6)
    meta_end = ENTRY_HEADER_SIZE + meta_size
    if meta_end > len(view):
        raise EntryFormatError(f"metadata of {meta_size} bytes exceeds the entry")
    return _parse_metadata(view[ENTRY_HEADER_SIZE:meta_end]), bytes(view[meta_end:])


def _parse_metadata(raw: memoryview | bytes) -> pb.MessageMetadata:
    meta = pb.MessageMetadata()
    try:
        meta.ParseFromString(raw)
    except DecodeError as exc:
        raise EntryFormatError(f"malformed message metadata: {exc}") from exc
    if not strings_are_utf8(meta):
        raise EntryFormatError("message metadata holds a string that is not UTF-8")
    return meta


def strings_are_utf8(message: Any) -> bool:
    """True when every string field of a parsed protobuf message (recursively) is UTF-8.

    proto2 parsing does not check string fields; reading an invalid one would raise
    ``UnicodeDecodeError`` later, far from the wire, so decoders check once up front
    (the parser hands such a field back as ``bytes``).  It runs on every SEND, so the
    work per message type is planned once (:func:`_plan`): only the fields that are
    strings or lead to strings are looked at, and only when set.
    """
    for name, nested, repeated in _plan(message.DESCRIPTOR):
        if repeated:
            values = getattr(message, name)
            if not values:
                continue
            if nested:
                if not all(strings_are_utf8(v) for v in values):
                    return False
            elif any(isinstance(v, bytes) for v in values):
                return False
        elif message.HasField(name):
            value = getattr(message, name)
            if nested:
                if not strings_are_utf8(value):
                    return False
            elif isinstance(value, bytes):
                return False
    return True


_PLANS: dict[Any, tuple[tuple[str, bool, bool], ...]] = {}


def _plan(descriptor: Any) -> tuple[tuple[str, bool, bool], ...]:
    """The fields of a message type that :func:`strings_are_utf8` must look at, as
    ``(name, is a message, is repeated)``: its strings and the messages that reach one."""
    plan = _PLANS.get(descriptor)
    if plan is None:
        plan = _PLANS[descriptor] = tuple(
            (fd.name, fd.message_type is not None, fd.is_repeated)
            for fd in descriptor.fields
            if fd.type == fd.TYPE_STRING
            or (fd.message_type is not None and _reaches_string(fd.message_type, set()))
        )
    return plan


def _reaches_string(descriptor: Any, seen: set[str]) -> bool:
    """Whether a message type reaches a string field at any depth."""
    seen.add(descriptor.full_name)
    for fd in descriptor.fields:
        if fd.type == fd.TYPE_STRING:
            return True
        nested = fd.message_type
        if nested is not None and nested.full_name not in seen and _reaches_string(nested, seen):
            return True
    return False


# --------------------------------------------------------------------------- compression


def compress(compression: int, data: bytes) -> bytes:
    """Compress ``data`` the way a Pulsar client does for ``compression``."""
    if compression == NONE:
        return bytes(data)
    if compression == LZ4:
        return lz4.block.compress(data, store_size=False) if data else b""
    if compression == ZLIB:
        return zlib.compress(data)
    if compression == ZSTD:
        return zstandard.ZstdCompressor(level=3).compress(data)
    if compression == SNAPPY:
        return snappy.compress(data)
    raise EntryFormatError(f"unknown compression type {compression}")


def _snappy_length(data: bytes | memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its varint preamble)."""
    length = 0
    for i in range(min(len(data), 5)):
        byte = data[i]
        length |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return length
    raise EntryFormatError("snappy block has no valid length preamble")


def decompress(
    compression: int,
    data: bytes | memoryview,
    uncompressed_size: int,
    *,
    max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE,
) -> bytes:
    """Undo :func:`compress`; the result must be exactly ``uncompressed_size`` bytes."""
    if compression == NONE:
        return bytes(data)
    if uncompressed_size < 0 or uncompressed_size > max_uncompressed_size:
        raise EntryFormatError(
            f"uncompressed size {uncompressed_size} outside 0..{max_uncompressed_size}"
        )
    if uncompressed_size == 0:
        if compression == LZ4 and len(data) <= 1:
            return b""
    try:
        if compression == LZ4:
            out = lz4.block.decompress(bytes(data), uncompressed_size=uncompressed_size)
        elif compression == ZLIB:
            inflater = zlib.decompressobj()
            out = inflater.decompress(bytes(data), uncompressed_size + 1)
            if not inflater.eof:
                raise EntryFormatError("zlib stream is truncated or longer than declared")
        elif compression == ZSTD:
            reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bytes(data)))
            chunks: list[bytes] = []
            wanted = uncompressed_size + 1
            while wanted > 0:
                chunk = reader.read(wanted)
                if not chunk:
                    break
                chunks.append(chunk)
                wanted -= len(chunk)
            out = b"".join(chunks)
        elif compression == SNAPPY:
            declared = _snappy_length(data)
            if declared != uncompressed_size:
                raise EntryFormatError(
                    f"snappy block declares {declared} bytes, metadata says {uncompressed_size}"
                )
            out = snappy.uncompress(bytes(data))
        else:
            raise EntryFormatError(f"unknown compression type {compression}")
    except EntryFormatError:
        raise
    except Exception as exc:  # each codec library raises its own error types
        raise EntryFormatError(f"cannot decompress {_name(compression)} payload: {exc}") from exc
    if len(out) != uncompressed_size:
        raise EntryFormatError(
            f"{_name(compression)} payload inflated to {len(out)} bytes, expected {uncompressed_size}"
        )
    return bytes(out)


def _name(compression: int) -> str:
    try:
        return pb.CompressionType.Name(compression)
    except ValueError:
        return str(compression)


# --------------------------------------------------------------------------- batches


def _is_batch(metadata: pb.MessageMetadata) -> bool:
    return metadata.HasField("num_messages_in_batch")


def iter_batch(
    metadata: pb.MessageMetadata,
    payload: bytes | memoryview,
    *,
    max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE,
) -> list[SingleMessage]:
    """The messages of an entry, decompressed.

    For a batch entry, one :class:`SingleMessage` per batch slot (including slots marked
    ``compacted_out``).  For a non-batch entry, one message whose
    ``SingleMessageMetadata`` is taken from the entry's ``MessageMetadata``.  A chunk of
    a chunked message is returned as-is (reassembly is the reader's job); an encrypted
    entry raises :class:`EntryFormatError`.
    """
    if len(metadata.encryption_keys):
        # Producers compress, then encrypt: only a consumer holding the key can open it.
        raise EntryFormatError("entry payload is encrypted by its producer")
    data = decompress(
        metadata.compression,
        payload,
        metadata.uncompressed_size,
        max_uncompressed_size=max_uncompressed_size,
    )
    if not _is_batch(metadata):
        single = pb.SingleMessageMetadata(payload_size=len(data))
        single.properties.extend(metadata.properties)
        for name in (
            "partition_key",
            "event_time",
            "partition_key_b64_encoded",
            "ordering_key",
            "sequence_id",
            "null_value",
            "null_partition_key",
        ):
            if metadata.HasField(name):
                setattr(single, name, getattr(metadata, name))
        return [SingleMessage(single, data)]

    count = metadata.num_messages_in_batch
    if count < 1:
        raise EntryFormatError(f"batch declares {count} messages")
    view = memoryview(data)
    out: list[SingleMessage] = []
    pos = 0
    for index in range(count):
        if pos + 4 > len(view):
            raise EntryFormatError(f"batch truncated before message {index} of {count}")
        (meta_size,) = _U32.unpack_from(view, pos)
        pos += 4
        if pos + meta_size > len(view):
            raise EntryFormatError(f"metadata of batch message {index} exceeds the payload")
        single = pb.SingleMessageMetadata()
        try:
            single.ParseFromString(view[pos : pos + meta_size])
        except DecodeError as exc:
            raise EntryFormatError(f"malformed metadata of batch message {index}: {exc}") from exc
        if not strings_are_utf8(single):
            raise EntryFormatError(f"metadata of batch message {index} holds a non-UTF-8 string")
        pos += meta_size
        size = single.payload_size
        if size < 0 or pos + size > len(view):
            raise EntryFormatError(
                f"payload of batch message {index} ({size} bytes) exceeds the batch"
            )
        out.append(SingleMessage(single, bytes(view[pos : pos + size])))
        pos += size
    if pos != len(view):
        raise EntryFormatError(f"{len(view) - pos} stray bytes after the last batch message")
    return out


def _single_metadata(message: Message, payload_size: int) -> pb.SingleMessageMetadata:
    single = pb.SingleMessageMetadata(payload_size=payload_size)
    for name, value in message.properties.items():
        single.properties.add(key=name, value=value)
    if message.key is not None:
        single.partition_key = message.key
        if message.key_b64_encoded:
            single.partition_key_b64_encoded = True
    if message.event_time:
        single.event_time = message.event_time
    if message.ordering_key is not None:
        single.ordering_key = message.ordering_key
    if message.sequence_id is not None:
        single.sequence_id = message.sequence_id
    if message.null_value:
        single.null_value = True
    return single


def build_batch(
    messages: Sequence[Message], compression: int = NONE
) -> tuple[dict[str, Any], bytes]:
    """Lay ``messages`` out as a batch payload and compress it.

    Returns the ``MessageMetadata`` fields the batch needs (``num_messages_in_batch``,
    ``compression`` and, when compressed, ``uncompressed_size``) and the payload.
    """
    if not messages:
        raise EntryFormatError("a batch holds at least one message")
    parts: list[bytes] = []
    for message in messages:
        meta = _single_metadata(message, len(message.payload)).SerializeToString()
        parts += (_U32.pack(len(meta)), meta, message.payload)
    raw = b"".join(parts)
    fields: dict[str, Any] = {"num_messages_in_batch": len(messages), "compression": compression}
    if compression != NONE:
        fields["uncompressed_size"] = len(raw)
    return fields, compress(compression, raw)


def entry_from_messages(
    messages: Sequence[Message],
    *,
    producer_name: str,
    sequence_id: int,
    publish_time: int,
    compression: int = NONE,
    batched: bool | None = None,
) -> bytes:
    """Build one entry from ``messages`` (how non-Pulsar protocols write to a topic).

    ``batched=None`` writes a batch entry when there is more than one message and a
    plain entry otherwise; a plain entry holds exactly one message.
    """
    if not messages:
        raise EntryFormatError("an entry holds at least one message")
    if batched is None:
        batched = len(messages) > 1
    metadata = pb.MessageMetadata(
        producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time
    )
    if batched:
        fields, payload = build_batch(messages, compression)
        for name, value in fields.items():
            setattr(metadata, name, value)
        last = messages[-1].sequence_id
        if last is not None and last != sequence_id:
            metadata.highest_sequence_id = last
        return encode_entry(metadata, payload)

    if len(messages) != 1:
        raise EntryFormatError("a plain (non-batch) entry holds exactly one message")
    message = messages[0]
    _describe(metadata, message)
    if compression != NONE:
        metadata.compression = compression  # type: ignore[assignment]
        metadata.uncompressed_size = len(message.payload)
    return encode_entry(metadata, compress(compression, message.payload))


def _describe(metadata: pb.MessageMetadata, message: Message) -> None:
    """Put what a plain entry says of its one message into its metadata."""
    for name, value in message.properties.items():
        metadata.properties.add(key=name, value=value)
    if message.key is not None:
        metadata.partition_key = message.key
        if message.key_b64_encoded:
            metadata.partition_key_b64_encoded = True
    if message.event_time:
        metadata.event_time = message.event_time
    if message.ordering_key is not None:
        metadata.ordering_key = message.ordering_key
    if message.deliver_at_time is not None:
        metadata.deliver_at_time = message.deliver_at_time
    if message.null_value:
        metadata.null_value = True


def chunk_entries(message: Message, *, producer_name: str, sequence_id: int,
                  publish_time: int, max_entry: int) -> list[bytes]:
    """``message`` as the entries of a chunked message, none larger than ``max_entry``:
    Pulsar's chunking (each chunk a plain entry with the message's metadata and a slice
    of its payload, named by ``uuid``, ordered by ``chunk_id``), so Pulsar clients put it
    back together as they do their own producers' large messages."""
    metadata = pb.MessageMetadata(producer_name=producer_name, sequence_id=sequence_id,
                                  publish_time=publish_time)
    _describe(metadata, message)
    payload = message.payload
    metadata.uuid = f"{producer_name}-{sequence_id}"
    metadata.total_chunk_msg_size = len(payload)
    metadata.num_chunks_from_msg = 1 << 30  # as wide as the real count will be
    metadata.chunk_id = 1 << 30
    size = max_entry - ENTRY_HEADER_SIZE - metadata.ByteSize() - 16
    if size <= 0:
        raise EntryFormatError(f"the metadata of a message leaves no room in {max_entry} bytes")
    count = max(1, -(-len(payload) // size))
    metadata.num_chunks_from_msg = count
    view = memoryview(payload)
    out = []
    for chunk_id in range(count):
        metadata.chunk_id = chunk_id
        out.append(encode_entry(metadata, view[chunk_id * size:(chunk_id + 1) * size]))
    return out


def messages_from_entry(
    buf: bytes | bytearray | memoryview,
    *,
    max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE,
) -> list[Message]:
    """Decode an entry into :class:`Message` views (compacted-out slots are skipped).

    Batch members inherit what only the entry carries: publish time, producer name,
    deliver-at time, and - when they have none of their own - a sequence id counted
    from the entry's.
    """
    return [m for _, m in indexed_messages(buf, max_uncompressed_size=max_uncompressed_size)]


def indexed_messages(
    buf: bytes | bytearray | memoryview,
    *,
    max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE,
) -> list[tuple[int, Message]]:
    """:func:`messages_from_entry`, each message with its index in the entry's batch (what
    an acknowledgement of that one message names)."""
    metadata, payload = decode_entry(buf)
    return messages_of(metadata, payload, max_uncompressed_size=max_uncompressed_size)


def messages_of(
    metadata: pb.MessageMetadata,
    payload: bytes | memoryview,
    *,
    max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE,
) -> list[tuple[int, Message]]:
    """:func:`indexed_messages` of an entry already split by :func:`decode_entry`."""
    singles = iter_batch(metadata, payload, max_uncompressed_size=max_uncompressed_size)
    out: list[tuple[int, Message]] = []
    for index, single in enumerate(singles):
        meta = single.metadata
        if meta.compacted_out:
            continue
        if meta.HasField("sequence_id"):
            sequence_id = meta.sequence_id
        else:
            sequence_id = metadata.sequence_id + index
        out.append((index,
            Message(
                payload=single.payload,
                key=meta.partition_key if meta.HasField("partition_key") else None,
                properties={kv.key: kv.value for kv in meta.properties},
                event_time=meta.event_time or None,
                publish_time=metadata.publish_time,
                sequence_id=sequence_id,
                producer_name=metadata.producer_name,
                ordering_key=meta.ordering_key if meta.HasField("ordering_key") else None,
                deliver_at_time=(
                    metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None
                ),
                null_value=meta.null_value,
                key_b64_encoded=meta.partition_key_b64_encoded,
            )
        ))
    return out

def ack_set_but(index: int, size: int) -> list[int]:
    """The ack set of a batch of ``size`` messages all still to deliver but ``index``
    (what acknowledging that one message says), without a loop over the batch."""
    n = (size + 63) // 64
    words = [-1] * n
    if size % 64:
        last = (1 << (size % 64)) - 1
        words[-1] = last - (1 << 64) if last >= 1 << 63 else last
    w, bit = divmod(index, 64)
    v = (words[w] & ((1 << 64) - 1)) & ~(1 << bit)
    words[w] = v - (1 << 64) if v >= 1 << 63 else v
    return words


def ack_set(indexes: set[int], size: int) -> list[int]:
    """Pulsar's ack set for a batch of ``size`` messages of which ``indexes`` are still to
    be delivered: 64-bit words, least significant bit first, as signed int64."""
    words = [0] * ((size + 63) // 64)
    for i in indexes:
        words[i // 64] |= 1 << (i % 64)
    return [w - (1 << 64) if w >= 1 << 63 else w for w in words]
