"""The Pulsar entry format every Magnetar topic stores, and Pulsar's protobuf messages.

Every protocol reads and writes this one format: an entry is
``[0x0e01][crc32c][metadataSize][MessageMetadata][payload]`` where the payload is one
message or a (possibly compressed) batch.  :mod:`core.format.pulsar_api_pb2` holds the
generated protobuf classes (``MessageMetadata``, ``BaseCommand``, ...).

Example::

    >>> from core.format import Message, entry_from_messages, messages_from_entry, ZSTD
    >>> raw = entry_from_messages([Message(payload=b"a"), Message(payload=b"b")],
    ...                           producer_name="p", sequence_id=7, publish_time=1,
    ...                           compression=ZSTD)
    >>> [(m.sequence_id, m.payload) for m in messages_from_entry(raw)]
    [(7, b'a'), (8, b'b')]
"""

from . import pulsar_api_pb2
from ._entry import (
    DEFAULT_MAX_UNCOMPRESSED_SIZE,
    ENTRY_HEADER_SIZE,
    LZ4,
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C,
    NONE,
    SNAPPY,
    ZLIB,
    ZSTD,
    EntryFormatError,
    Message,
    SingleMessage,
    ack_set,
    ack_set_but,
    build_batch,
    chunk_entries,
    compress,
    crc32c,
    decode_broker_entry_metadata,
    decode_entry,
    decompress,
    encode_broker_entry_metadata,
    encode_entry,
    entry_from_messages,
    iter_batch,
    key_fields,
    messages_from_entry,
    messages_of,
    strings_are_utf8,
    verify_checksum,
)
from .pulsar_api_pb2 import (
    BaseCommand,
    BrokerEntryMetadata,
    CompressionType,
    MessageIdData,
    MessageMetadata,
    SingleMessageMetadata,
)

__all__ = [
    "DEFAULT_MAX_UNCOMPRESSED_SIZE",
    "ENTRY_HEADER_SIZE",
    "LZ4",
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "NONE",
    "SNAPPY",
    "ZLIB",
    "ZSTD",
    "BaseCommand",
    "BrokerEntryMetadata",
    "CompressionType",
    "EntryFormatError",
    "Message",
    "MessageIdData",
    "MessageMetadata",
    "SingleMessage",
    "SingleMessageMetadata",
    "ack_set",
    "ack_set_but",
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
    "pulsar_api_pb2",
    "strings_are_utf8",
    "verify_checksum",
]
