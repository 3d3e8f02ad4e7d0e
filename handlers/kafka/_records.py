"""Theory of operation: Kafka record batches (message format v2), sans I/O.

A produce request carries, per partition, a run of record batches; a fetch response
returns one. The layout (protocol guide, "Record Batch")::

    baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8 (= 2),
    crc uint32 (CRC-32C of everything after it), attributes int16, lastOffsetDelta int32,
    baseTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch int16,
    baseSequence int32, records [count int32, then the records, compressed as a whole]

    record = length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
             key (varint length, -1 = null), value (likewise),
             headers (varint count; each: key string, value bytes or null)

Attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3
timestamp type (1 = LogAppendTime), bit 4 transactional, bit 5 control batch. A control
record's key is ``version int16, type int16`` (0 abort, 1 commit).

Decoding checks the CRC before looking inside, bounds every length by the bytes present,
and never inflates past ``max_uncompressed_size``. Any defect raises
:class:`RemoteProtocolError` with ``CORRUPT_MESSAGE`` (or ``UNSUPPORTED_FOR_MESSAGE_FORMAT``
for magic 0/1), never a library exception. Snappy data may be a raw block (librdkafka) or
xerial-framed (the Java client); both are read, raw blocks are written.

Example::

    >>> raw = encode_batch([Record(offset_delta=0, timestamp=5, key=b"k", value=b"v")],
    ...                    base_offset=10, compression=ZSTD)
    >>> [b] = decode_batches(raw)
    >>> (b.base_offset, b.records[0].key, b.records[0].value, b.compression)
    (10, b'k', b'v', 4)
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import lz4.frame
import snappy
import zstandard

from core.format import crc32c
from handlers.kafka._errors import ErrorCode, RemoteProtocolError

__all__ = [
    "NONE",
    "GZIP",
    "SNAPPY",
    "LZ4",
    "ZSTD",
    "Record",
    "RecordBatch",
    "decode_batches",
    "with_records",
    "encode_batch",
    "encode_control_batch",
    "with_log_append_time",
    "compress",
    "decompress",
    "BATCH_HEADER_SIZE",
    "DEFAULT_MAX_UNCOMPRESSED_SIZE",
]

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

BATCH_HEADER_SIZE = 61
"""Bytes from baseOffset through the record count."""
_LOG_OVERHEAD = 12  # baseOffset + batchLength
DEFAULT_MAX_UNCOMPRESSED_SIZE = 64 * 1024 * 1024
MAX_RECORDS_PER_BATCH = 1 << 20

_HEAD = struct.Struct(">qiibIhiqqqhii")
_CRC_FROM = 21  # offset of attributes: everything from here on is checksummed
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_CRC_AT = 17
_MAX_TIMESTAMP_AT = 35
_I32 = struct.Struct(">i")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _corrupt(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, ErrorCode.CORRUPT_MESSAGE)


class Record(NamedTuple):
    """One record. ``offset_delta`` is the delta from the batch's base offset, ``timestamp``
    the absolute timestamp (ms). A tuple: decoding builds many of these."""

    offset_delta: int = 0
    timestamp: int = -1
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordBatch:
    base_offset: int
    partition_leader_epoch: int = -1
    attributes: int = 0
    last_offset_delta: int = 0
    base_timestamp: int = -1
    max_timestamp: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    records: list[Record] = field(default_factory=list)
    record_count: int = 0
    size: int = 0
    raw: bytes = b""

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def last_sequence(self) -> int:
        return -1 if self.base_sequence < 0 else self.base_sequence + self.last_offset_delta


# --------------------------------------------------------------------------- compression


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data, compresslevel=1)
    if codec == SNAPPY:
        return bytes(snappy.compress(data))
    if codec == LZ4:
        return bytes(lz4.frame.compress(data))
    if codec == ZSTD:
        return zstandard.ZstdCompressor(level=1).compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def _snappy_raw(data: bytes, limit: int) -> bytes:
    n = 0
    shift = 0
    for i in range(min(len(data), 5)):
        b = data[i]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    else:
        raise _corrupt("snappy block without a length preamble")
    if n > limit:
        raise _corrupt(f"snappy block inflates to {n} bytes, above {limit}")
    try:
        return bytes(snappy.uncompress(data))
    except Exception as exc:
        raise _corrupt(f"bad snappy data: {exc}") from None


def decompress(codec: int, data: bytes, limit: int = DEFAULT_MAX_UNCOMPRESSED_SIZE) -> bytes:
    """Inflate ``data``; more than ``limit`` bytes out is CORRUPT_MESSAGE."""
    try:
        if codec == GZIP:
            d = zlib.decompressobj(wbits=47)  # gzip or zlib header
            out = d.decompress(data, limit + 1)
            if len(out) > limit:
                raise _corrupt(f"gzip data inflates past {limit} bytes")
            if not d.eof:
                raise _corrupt("truncated gzip data")
            return out
        if codec == SNAPPY:
            if data[:8] == _XERIAL_MAGIC:
                return _xerial(data, limit)
            return _snappy_raw(data, limit)
        if codec == LZ4:
            ld = lz4.frame.LZ4FrameDecompressor()
            out = ld.decompress(data, max_length=limit + 1)
            if len(out) > limit:
                raise _corrupt(f"lz4 data inflates past {limit} bytes")
            if not ld.eof:
                raise _corrupt("truncated lz4 frame")
            return bytes(out)
        if codec == ZSTD:
            chunks: list[bytes] = []
            total = 0
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                while True:
                    chunk = reader.read(min(1 << 20, limit + 1 - total))
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > limit:
                        raise _corrupt(f"zstd data inflates past {limit} bytes")
                    chunks.append(chunk)
            return b"".join(chunks)
    except RemoteProtocolError:
        raise
    except Exception as exc:
        raise _corrupt(f"cannot decompress ({codec}): {exc}") from None
    raise _corrupt(f"unknown compression codec {codec}")


def _xerial(data: bytes, limit: int) -> bytes:
    pos = 16
    parts: list[bytes] = []
    total = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise _corrupt("truncated xerial snappy block header")
        n = _I32.unpack_from(data, pos)[0]
        pos += 4
        if n < 0 or pos + n > len(data):
            raise _corrupt("xerial snappy block runs past the data")
        block = _snappy_raw(data[pos:pos + n], limit - total)
        total += len(block)
        parts.append(block)
        pos += n
    return b"".join(parts)


# --------------------------------------------------------------------------- varints


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _varint_slow(n: int) -> bytes:
    z = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    if z < 0x80:
        return bytes((z,))
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL = 1 << 14
# The varints of 0 .. _SMALL-1, whose zigzag values (2n) take one to three bytes, built
# byte by byte rather than by _varint_slow: the table is made at every start.
_SMALL_VARINTS = [
    bytes((z,)) if z < 0x80
    else bytes(((z & 0x7F) | 0x80, z >> 7)) if z < 0x4000
    else bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80, z >> 14))
    for z in range(0, 2 * _SMALL, 2)
]
_MINUS_ONE = _varint_slow(-1)


def _varint(n: int) -> bytes:
    if 0 <= n < _SMALL:
        return _SMALL_VARINTS[n]
    if n == -1:
        return _MINUS_ONE
    return _varint_slow(n)


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _corrupt("record ends inside a varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise _corrupt("varint longer than 10 bytes")


# --------------------------------------------------------------------------- decoding


def decode_batches(data: bytes | memoryview | None, *,
                   max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE,
                   records: bool = True) -> list[RecordBatch]:
    """Decode a run of record batches (a produce request's ``records``). With
    ``records=False`` only the headers are read and the CRC is not checked: it is checked
    where the records are read (:func:`with_records`, or the native converter)."""
    if data is None:
        return []
    buf = bytes(data)
    out: list[RecordBatch] = []
    pos = 0
    end = len(buf)
    while pos < end:
        if end - pos < _LOG_OVERHEAD + 5:
            raise _corrupt("truncated record batch header")
        batch_length = _I32.unpack_from(buf, pos + 8)[0]
        magic = buf[pos + 16]
        if magic != 2:
            raise RemoteProtocolError(f"message format v{magic} is not served (v2 only)",
                                      ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT)
        total = _LOG_OVERHEAD + batch_length
        if batch_length < BATCH_HEADER_SIZE - _LOG_OVERHEAD or pos + total > end:
            raise _corrupt(f"record batch length {batch_length} does not fit the data")
        out.append(_decode_one(buf, pos, pos + total, max_uncompressed_size, records))
        pos += total
    return out


def _decode_one(buf: bytes, start: int, end: int, limit: int, with_records: bool) -> RecordBatch:
    (base_offset, _len, leader_epoch, _magic, crc, attributes, last_delta, base_ts, max_ts,
     producer_id, producer_epoch, base_seq, count) = _HEAD.unpack_from(buf, start)
    # Without its records, a batch is checked by whoever reads them (with_records, or the
    # native converter): the CRC covers them, and is computed once.
    if with_records and crc32c(memoryview(buf)[start + _CRC_FROM:end]) != crc:
        raise _corrupt("record batch CRC-32C mismatch")
    if count < 0 or count > MAX_RECORDS_PER_BATCH:
        raise _corrupt(f"record count {count} out of range")
    records: list[Record] = []
    if with_records:
        body_start = start + BATCH_HEADER_SIZE
        codec = attributes & COMPRESSION_MASK
        if codec == NONE:
            body, pos, body_end = buf, body_start, end
        else:
            body = decompress(codec, buf[body_start:end], limit)
            pos, body_end = 0, len(body)
        if count > body_end - pos:
            raise _corrupt(f"{count} records cannot fit in {body_end - pos} bytes")
        records, pos = _decode_records(body, pos, body_end, count, base_ts)
        if pos != body_end:
            raise _corrupt("unexpected bytes after the last record")
    return RecordBatch(base_offset=base_offset, partition_leader_epoch=leader_epoch,
                       attributes=attributes, last_offset_delta=last_delta,
                       base_timestamp=base_ts, max_timestamp=max_ts, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=base_seq, records=records,
                       record_count=count, size=end - start, raw=buf[start:end])


def with_records(batch: RecordBatch, *,
                 max_uncompressed_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE) -> RecordBatch:
    """``batch`` (decoded without its records) with its records decoded."""
    return _decode_one(batch.raw, 0, len(batch.raw), max_uncompressed_size, True)


def _decode_records(buf: bytes, pos: int, end: int, count: int,
                    base_ts: int) -> tuple[list[Record], int]:
    """``count`` records from ``pos``, every varint read inline (this loop is the hot path
    of a produce). Each record must end exactly where its length says."""
    out: list[Record] = []
    append = out.append
    try:
        for _ in range(count):
            fields = []
            # length, then (after the attributes byte) timestampDelta, offsetDelta, keyLength
            for step in range(4):
                if step == 1:
                    pos += 1  # attributes
                b = buf[pos]
                pos += 1
                if b < 0x80:
                    v = b
                else:
                    v = b & 0x7F
                    shift = 7
                    while True:
                        b = buf[pos]
                        pos += 1
                        v |= (b & 0x7F) << shift
                        if b < 0x80:
                            break
                        shift += 7
                        if shift > 63:
                            raise _corrupt("varint longer than 10 bytes")
                fields.append((v >> 1) ^ -(v & 1))
                if step == 0:
                    length = fields[0]
                    if length < 0 or pos + length > end:
                        raise _corrupt(f"record length {length} does not fit the batch")
                    rend = pos + length
            _, ts_delta, offset_delta, klen = fields
            if klen >= 0:
                if pos + klen > rend:
                    raise _corrupt("key runs past the end of its record")
                key: bytes | None = buf[pos:pos + klen]
                pos += klen
            elif klen == -1:
                key = None
            else:
                raise _corrupt(f"negative length {klen}")
            b = buf[pos]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                vlen, pos = _read_varint(buf, pos, rend)
            if vlen >= 0:
                if pos + vlen > rend:
                    raise _corrupt("value runs past the end of its record")
                value: bytes | None = buf[pos:pos + vlen]
                pos += vlen
            elif vlen == -1:
                value = None
            else:
                raise _corrupt(f"negative length {vlen}")
            if pos < rend and buf[pos] == 0 and pos + 1 == rend:
                append(Record(offset_delta, base_ts + ts_delta, key, value, ()))
                pos = rend
                continue
            headers, pos = _read_headers(buf, pos, rend)
            append(Record(offset_delta, base_ts + ts_delta, key, value, headers))
    except IndexError:
        raise _corrupt("record runs past the end of the batch") from None
    return out, pos


def _read_headers(buf: bytes, pos: int, rend: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    nheaders, pos = _read_varint(buf, pos, rend)
    if nheaders < 0 or nheaders > rend - pos:
        raise _corrupt(f"header count {nheaders} out of range")
    headers = []
    for _ in range(nheaders):
        hk, pos = _read_blob(buf, pos, rend)
        if hk is None:
            raise _corrupt("null header key")
        hv, pos = _read_blob(buf, pos, rend)
        try:
            name = hk.decode("utf-8")
        except UnicodeDecodeError:
            raise _corrupt("header key is not UTF-8") from None
        headers.append((name, hv))
    if pos != rend:
        raise _corrupt("record length does not match its fields")
    return tuple(headers), pos


def _read_blob(buf: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(buf, pos, end)
    if n < 0:
        if n != -1:
            raise _corrupt(f"negative length {n}")
        return None, pos
    if pos + n > end:
        raise _corrupt("field runs past the end of its record")
    return buf[pos:pos + n], pos + n


# --------------------------------------------------------------------------- encoding


def _blob(b: bytes | None) -> bytes:
    if b is None:
        return b"\x01"  # zigzag(-1)
    return _varint(len(b)) + b


def _encode_record(rec: Record, base_ts: int) -> bytes:
    if not rec.headers:
        key, value = rec.key, rec.value
        body = b"".join((b"\x00", _varint(rec.timestamp - base_ts), _varint(rec.offset_delta),
                         _MINUS_ONE if key is None else _varint(len(key)) + key,
                         _MINUS_ONE if value is None else _varint(len(value)), value or b"",
                         b"\x00"))
        return _varint(len(body)) + body
    parts = [b"\x00", _varint(rec.timestamp - base_ts), _varint(rec.offset_delta),
             _blob(rec.key), _blob(rec.value), _varint(len(rec.headers))]
    for name, value in rec.headers:
        parts.append(_blob(name.encode("utf-8")))
        parts.append(_blob(value))
    body = b"".join(parts)
    return _varint(len(body)) + body


def encode_batch(records: Sequence[Record], *, base_offset: int, compression: int = NONE,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False, control: bool = False,
                 log_append_time: int | None = None, partition_leader_epoch: int = -1,
                 last_offset_delta: int | None = None) -> bytes:
    """Build one v2 record batch. With ``log_append_time`` every record's timestamp reads
    as that time (timestamp type LogAppendTime)."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_ts = min(r.timestamp for r in records)
    max_ts = max(r.timestamp for r in records)
    attributes = compression & COMPRESSION_MASK
    if log_append_time is not None:
        attributes |= TIMESTAMP_TYPE_BIT
        max_ts = log_append_time
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    if control:
        attributes |= CONTROL_BIT
    body = b"".join([_encode_record(r, base_ts) for r in records])
    body = compress(compression, body)
    if last_offset_delta is None:
        last_offset_delta = records[-1].offset_delta
    tail = struct.pack(">hiqqqhii", attributes, last_offset_delta, base_ts, max_ts,
                       producer_id, producer_epoch, base_sequence, len(records)) + body
    crc = crc32c(tail)
    batch_length = 4 + 1 + 4 + len(tail)
    return struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, 2, crc) + tail


def with_log_append_time(batch: bytes, append_time: int) -> bytes:
    """One encoded v2 record batch as a topic with ``message.timestamp.type=LogAppendTime``
    returns it: the timestamp type bit set and ``maxTimestamp`` the append time, which a
    reader takes as every record's timestamp; the CRC is computed again. This is the change
    a Kafka broker makes in place, leaving the records (and their own deltas) as they
    were."""
    if len(batch) < BATCH_HEADER_SIZE:
        raise ValueError(f"a record batch of {len(batch)} bytes is shorter than its header")
    out = bytearray(batch)
    _I16.pack_into(out, _CRC_FROM, _I16.unpack_from(out, _CRC_FROM)[0] | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(out, _MAX_TIMESTAMP_AT, append_time)
    with memoryview(out) as view:
        crc = crc32c(view[_CRC_FROM:])
    _U32.pack_into(out, _CRC_AT, crc)
    return bytes(out)


def encode_control_batch(*, base_offset: int, producer_id: int, producer_epoch: int,
                         commit: bool, timestamp: int, coordinator_epoch: int = 0) -> bytes:
    """A transaction marker: one control record (COMMIT or ABORT)."""
    key = _I16.pack(0) + _I16.pack(CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _I16.pack(0) + _I32.pack(coordinator_epoch)
    return encode_batch([Record(offset_delta=0, timestamp=timestamp, key=key, value=value)],
                        base_offset=base_offset, producer_id=producer_id,
                        producer_epoch=producer_epoch, transactional=True, control=True)
