"""Kafka record batches ↔ Magnetar entries (the Pulsar entry format), without I/O.

One record batch is one entry; each record one message of it:

* value ↔ payload (a null value is a message with ``null_value``),
* key ↔ partition key (UTF-8 text as is; other bytes base64 with ``partition_key_b64_encoded``,
  as Pulsar clients write binary keys),
* headers ↔ properties, one property per header, in order, repeated names kept. A header
  value that is UTF-8 text is the property value as is; when any header of a record is not
  (a non-UTF-8 value is written base64-encoded, a null value as the empty string), one more
  property follows them, ``__kafka_header_kinds``, with one letter per header in order: ``t``
  text, ``b`` base64 of the bytes, ``n`` null. Records whose headers are all text carry no
  such property (nor do entries written by Pulsar producers or before it existed): their
  properties read back as text headers. (A record whose last header is itself named
  ``__kafka_header_kinds`` always gets the marker, so that it reads back as a header.)
  Pulsar consumers see the text forms as a map (one value per name: pulsar-client keeps
  the first of a repeated name), the marker among them,
* CreateTime ↔ event time; LogAppendTime (and any record without an event time) ↔ the
  entry's publish time.

A Kafka consumer reading a batch shortly after it was produced through Kafka is served the
producer's own bytes from the batch cache (only the base offset rewritten); from storage it
reads the mapped form, which gives the headers back byte for byte.

An uncompressed, non-transactional batch is converted by the native core in one pass
(:func:`native_entry`), writing the same bytes :func:`entry_from_batch` writes; the others
are decoded record by record here.

The Kafka offset of a message is its broker index: an entry holding ``n`` messages whose
last index is ``i`` is the batch with base offset ``i - n + 1``.

A message a Pulsar producer split into chunks (one entry per chunk, see
:func:`chunk_metadata`) is one record, at the offset of its last chunk, built by
:func:`batch_from_chunks` from all its chunks; the offsets of the chunks before the last
are gaps in the Kafka log (see :meth:`handlers.kafka._topics.PartitionLog.read`).
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence

from core import native as _native
from core.format import (
    LZ4,
    NONE,
    ZLIB,
    ZSTD,
    MessageMetadata,
    compress,
    decode_entry,
    encode_entry,
    iter_batch,
)
from core.format import SNAPPY as P_SNAPPY
from core.storage import chunk_metadata
from handlers.kafka import _records as rb
from handlers.kafka._errors import ErrorCode, RemoteProtocolError

__all__ = ["entry_from_batch", "batch_from_entry", "records_from_entry", "native_entry",
           "producer_name_of", "HEADER_KINDS", "header_properties", "headers_of", "chunk_metadata",
           "batch_from_chunks"]

# Kafka codec -> the entry compression it is stored with.
_TO_PULSAR = {rb.NONE: NONE, rb.GZIP: ZLIB, rb.SNAPPY: P_SNAPPY, rb.LZ4: LZ4, rb.ZSTD: ZSTD}


def _key_text(key: bytes) -> tuple[str, bool]:
    try:
        return key.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(key).decode("ascii"), True


HEADER_KINDS = "__kafka_header_kinds"
"""The property that follows a record's headers when they are not all text: one letter per
header, ``t`` text as is, ``b`` base64 of the bytes, ``n`` null."""


def header_properties(headers: Sequence[tuple[str, bytes | None]]) -> list[tuple[str, str]]:
    """A record's headers as the properties that store them, in order: each header's text
    form, then :data:`HEADER_KINDS` when one is needed (a header that is not text, or a
    last header itself named so)."""
    props: list[tuple[str, str]] = []
    kinds = ""
    text = True
    for name, value in headers:
        if value is None:
            props.append((name, ""))
            kinds += "n"
            text = False
            continue
        try:
            props.append((name, value.decode("utf-8")))
            kinds += "t"
        except UnicodeDecodeError:
            props.append((name, base64.b64encode(value).decode("ascii")))
            kinds += "b"
            text = False
    if not text or (props and props[-1][0] == HEADER_KINDS):
        props.append((HEADER_KINDS, kinds))
    return props


def headers_of(props: Sequence[tuple[str, str]]) -> tuple[tuple[str, bytes | None], ...]:
    """The headers stored as ``props`` (the inverse of :func:`header_properties`); without a
    well-formed :data:`HEADER_KINDS` last, every property is a text header."""
    n = len(props)
    if n and props[-1][0] == HEADER_KINDS:
        kinds = props[-1][1]
        if len(kinds) == n - 1 and not kinds.strip("tbn"):
            return tuple((name, _header_value(value, kind))
                         for (name, value), kind in zip(props, kinds, strict=False))
    return tuple((name, value.encode("utf-8")) for name, value in props)


def _header_value(text: str, kind: str) -> bytes | None:
    if kind == "n":
        return None
    if kind == "b":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            pass
    return text.encode("utf-8")


def _uv(n: int) -> bytes:
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_BYTE = [bytes((i,)) for i in range(256)]
_U32 = struct.Struct(">I")


def _single_metadata(rec: rb.Record, use_time: bool) -> bytes:
    """A SingleMessageMetadata in protobuf wire format (fields in number order: properties
    1, partition_key 2, payload_size 3, event_time 5, partition_key_b64_encoded 6,
    null_value 9), written directly: one per record is the hot path of a produce."""
    parts: list[bytes] = []
    for name, text in header_properties(rec.headers) if rec.headers else ():
        k = name.encode("utf-8")
        v = text.encode("utf-8")
        kv = b"\x0a" + _uv(len(k)) + k + b"\x12" + _uv(len(v)) + v
        parts.append(b"\x0a" + _uv(len(kv)) + kv)
    b64 = False
    key = rec.key
    if key is not None:
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            key = base64.b64encode(key)
            b64 = True
        parts.append(b"\x12" + _uv(len(key)) + key)
    value = rec.value
    parts.append(b"\x18" + _uv(len(value) if value is not None else 0))
    if use_time and rec.timestamp > 0:
        parts.append(b"\x28" + _uv(rec.timestamp))
    if b64:
        parts.append(b"\x30\x01")
    if value is None:
        parts.append(b"\x48\x01")
    return b"".join(parts)


def entry_from_batch(batch: rb.RecordBatch, *, publish_time: int, producer_name: str = "kafka",
                     sequence_id: int = 0) -> bytes:
    """The entry that stores ``batch`` (compressed with the batch's own codec). One record
    is a plain entry; more are a Pulsar batch."""
    records = batch.records
    compression = _TO_PULSAR.get(batch.compression, NONE)
    use_time = not batch.log_append_time
    metadata = MessageMetadata(producer_name=producer_name, sequence_id=sequence_id,
                               publish_time=publish_time)
    if len(records) == 1:
        rec = records[0]
        for name, value in header_properties(rec.headers) if rec.headers else ():
            metadata.properties.add(key=name, value=value)
        if rec.key is not None:
            metadata.partition_key, b64 = _key_text(rec.key)
            if b64:
                metadata.partition_key_b64_encoded = True
        if use_time and rec.timestamp > 0:
            metadata.event_time = rec.timestamp
        if rec.value is None:
            metadata.null_value = True
        raw = rec.value or b""
    else:
        parts: list[bytes] = []
        for rec in records:
            meta = _single_metadata(rec, use_time)
            parts.append(_U32.pack(len(meta)))
            parts.append(meta)
            if rec.value:
                parts.append(rec.value)
        raw = b"".join(parts)
        metadata.num_messages_in_batch = len(records)
    if compression != NONE:
        metadata.compression = compression  # type: ignore[assignment]
        metadata.uncompressed_size = len(raw)
        raw = compress(compression, raw)
    return encode_entry(metadata, raw)


def producer_name_of(batch: rb.RecordBatch) -> str:
    """The producer name an entry of ``batch`` carries: idempotent producers are told
    apart by id and epoch."""
    if batch.producer_id >= 0:
        return f"kafka-{batch.producer_id}-{batch.producer_epoch}"
    return "kafka"


def native_entry(batch: rb.RecordBatch, *, publish_time: int) -> tuple[bytes, int, bool] | None:
    """``(entry, records, contiguous)`` for a batch decoded without its records, converted
    by the native core; None for a batch it leaves to :func:`entry_from_batch` (compressed,
    transactional or control). ``contiguous``: the records' offset deltas run 0, 1, 2, ..."""
    if batch.is_transactional or batch.is_control or batch.compression != rb.NONE:
        return None
    try:
        return _native.kafka_entry_from_batch(batch.raw, producer_name_of(batch),
                                              max(batch.base_sequence, 0), publish_time)
    except ValueError as exc:
        raise RemoteProtocolError(str(exc), ErrorCode.CORRUPT_MESSAGE) from None


def records_from_entry(data: bytes, publish_time: int) -> list[rb.Record]:
    """The records of a stored entry, read straight from its per-message metadata."""
    metadata, payload = decode_entry(data)
    default_ts = metadata.publish_time or publish_time
    out = []
    for i, single in enumerate(iter_batch(metadata, payload)):
        meta = single.metadata
        if meta.compacted_out:
            continue
        key = None
        if meta.HasField("partition_key"):
            key = _key_of(meta.partition_key, meta.partition_key_b64_encoded)
        headers = headers_of([(kv.key, kv.value) for kv in meta.properties]) \
            if len(meta.properties) else ()
        out.append(rb.Record(i, meta.event_time or default_ts, key,
                             None if meta.null_value else single.payload, headers))
    return out


def _key_of(text: str, b64: bool) -> bytes:
    if b64:
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            pass
    return text.encode("utf-8")


def batch_from_entry(data: bytes, *, index: int, num_messages: int, publish_time: int,
                     compression: int = rb.NONE, chunks: bool = False) -> bytes | None:
    """The record batch a fetch returns for the entry whose last message has ``index``.
    An uncompressed batch of an uncompressed entry comes from the native core (the same
    bytes); the rest is built here. With ``chunks``, None for an entry that is a chunk of
    a chunked message, which only :func:`batch_from_chunks` puts together (looked for only
    in an entry the native core refuses: it refuses chunks)."""
    if compression == rb.NONE:
        native = _native.kafka_batch_from_entry(data, index, num_messages, publish_time)
        if native is not None:
            return native
    if chunks and chunk_metadata(data) is not None:
        return None
    return python_batch_from_entry(data, index=index, num_messages=num_messages,
                                   publish_time=publish_time, compression=compression)


def python_batch_from_entry(data: bytes, *, index: int, num_messages: int, publish_time: int,
                            compression: int = rb.NONE) -> bytes:
    """:func:`batch_from_entry` decoded and encoded record by record."""
    records: Sequence[rb.Record] = records_from_entry(data, publish_time)
    base = index - num_messages + 1
    if not records:
        return b""
    return rb.encode_batch(records, base_offset=base, compression=compression,
                           last_offset_delta=max(num_messages - 1, records[-1].offset_delta))


_CHUNK_FIELDS = ("uuid", "chunk_id", "num_chunks_from_msg", "total_chunk_msg_size")


def batch_from_chunks(chunks: Sequence[bytes], *, index: int, publish_time: int) -> bytes:
    """The record batch of one chunked message, from its chunk entries in chunk order (the
    last one's broker index ``index`` and publish time ``publish_time``): one record, at
    offset ``index``, whose value is the chunks' payloads joined. Producers compress a
    message and then split it, so the joined payload is what a plain entry with the last
    chunk's metadata (less its chunk fields) carries, and is converted as that entry is:
    decompressed, with its key, properties and times."""
    payloads: list[bytes] = []
    metadata: MessageMetadata | None = None
    for data in chunks:
        metadata, payload = decode_entry(data)
        payloads.append(payload)
    if metadata is None:
        return b""
    for name in _CHUNK_FIELDS:
        metadata.ClearField(name)
    entry = encode_entry(metadata, b"".join(payloads))
    del payloads
    batch = batch_from_entry(entry, index=index, num_messages=1, publish_time=publish_time)
    assert batch is not None  # a chunk's fields are cleared: the entry is a plain one
    return batch
