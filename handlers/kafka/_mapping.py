"""Kafka record batches ↔ Magnetar entries (the Pulsar entry format), without I/O.

One record batch is one entry; each record one message of it:

* value ↔ payload (a null value is a message with ``null_value``),
* key ↔ partition key (UTF-8 text as is; other bytes base64 with ``partition_key_b64_encoded``,
  as Pulsar clients write binary keys),
* headers ↔ properties (values are text; a header whose value is not UTF-8 is carried
  base64-encoded under the same name, a null header value as the empty string),
* CreateTime ↔ event time; LogAppendTime (and any record without an event time) ↔ the
  entry's publish time.

The Kafka offset of a message is its broker index: an entry holding ``n`` messages whose
last index is ``i`` is the batch with base offset ``i - n + 1``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from core.format import LZ4, NONE, ZLIB, ZSTD, Message, entry_from_messages, messages_from_entry
from core.format import SNAPPY as P_SNAPPY
from handlers.kafka import _records as rb

__all__ = ["entry_from_batch", "batch_from_entry", "messages_from_batch", "records_from_entry"]

# Kafka codec -> the entry compression it is stored with.
_TO_PULSAR = {rb.NONE: NONE, rb.GZIP: ZLIB, rb.SNAPPY: P_SNAPPY, rb.LZ4: LZ4, rb.ZSTD: ZSTD}


def _key_text(key: bytes) -> tuple[str, bool]:
    try:
        return key.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(key).decode("ascii"), True


def _header_text(value: bytes | None) -> str:
    if value is None:
        return ""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii")


def messages_from_batch(batch: rb.RecordBatch) -> list[Message]:
    out = []
    use_time = not batch.log_append_time
    for rec in batch.records:
        key = None
        b64 = False
        if rec.key is not None:
            key, b64 = _key_text(rec.key)
        props = {name: _header_text(value) for name, value in rec.headers} if rec.headers else {}
        out.append(Message(
            payload=rec.value if rec.value is not None else b"",
            key=key,
            key_b64_encoded=b64,
            properties=props,
            event_time=rec.timestamp if use_time and rec.timestamp > 0 else None,
            null_value=rec.value is None,
        ))
    return out


def entry_from_batch(batch: rb.RecordBatch, *, publish_time: int, producer_name: str = "kafka",
                     sequence_id: int = 0) -> bytes:
    """The entry that stores ``batch`` (compressed with the batch's own codec)."""
    return entry_from_messages(messages_from_batch(batch), producer_name=producer_name,
                               sequence_id=sequence_id, publish_time=publish_time,
                               compression=_TO_PULSAR.get(batch.compression, NONE))


def _key_bytes(m: Message) -> bytes | None:
    if m.key is None:
        return None
    if m.key_b64_encoded:
        try:
            return base64.b64decode(m.key, validate=True)
        except (binascii.Error, ValueError):
            return m.key.encode("utf-8")
    return m.key.encode("utf-8")


def records_from_entry(data: bytes, publish_time: int) -> list[rb.Record]:
    messages = messages_from_entry(data)
    return [rb.Record(
        offset_delta=i,
        timestamp=m.event_time or m.publish_time or publish_time,
        key=_key_bytes(m),
        value=None if m.null_value else m.payload,
        headers=tuple((k, v.encode("utf-8")) for k, v in m.properties.items()),
    ) for i, m in enumerate(messages)]


def batch_from_entry(data: bytes, *, index: int, num_messages: int, publish_time: int,
                     compression: int = rb.NONE) -> bytes:
    """The record batch a fetch returns for the entry whose last message has ``index``."""
    records: Sequence[rb.Record] = records_from_entry(data, publish_time)
    base = index - num_messages + 1
    if not records:
        return b""
    return rb.encode_batch(records, base_offset=base, compression=compression,
                           last_offset_delta=max(num_messages - 1, records[-1].offset_delta))
