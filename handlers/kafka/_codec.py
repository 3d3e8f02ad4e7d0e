"""Theory of operation: the Kafka wire protocol, sans I/O.

Every Kafka request and response is a size-prefixed frame (``int32`` length, then the
bytes)::

    request  = [int32 size][request header][request body]
    response = [int32 size][response header][response body]

The header (protocol guide, "Headers"): request header v1 is ``api_key int16,
api_version int16, correlation_id int32, client_id nullable string``; v2 adds a tagged
field section. Response header v0 is ``correlation_id int32``; v1 adds tagged fields.
An API version at or above the API's first *flexible* version uses header v2/v1 and the
compact encodings in the body (unsigned-varint lengths plus one, tagged fields at the end
of every struct); ApiVersions is the exception whose response header stays v0.

One table, :data:`APIS`, describes every message Magnetar serves: for each API key its
served version range, its first flexible version and its request and response fields
with the versions in which each field exists (as in Kafka's message definitions). One
generic reader and one generic writer interpret the table, each struct of it compiled on
first use, per version, into a function of its own (with nothing left to decide about a
field's versions, type or nullability); nothing else in this module knows a message's
layout. A decoded body is a :class:`Data` (attribute access by the
spec's field names in snake case); a field absent in the decoded version takes its
default.

:class:`KafkaConnection` is the server side of one connection: ``receive_data(bytes)``
buffers, ``next_event()`` returns a :class:`RequestReceived`, an
:class:`UnsupportedRequest` (ApiVersions at a version not served: answer it with
:meth:`KafkaConnection.unsupported_response`) or :data:`NEED_DATA`, and
``send_response(request, body)`` returns the framed bytes. A size prefix that is negative
or above ``max_request_size`` raises :class:`RemoteProtocolError` before anything is
allocated for it; the session then closes the connection. So does any other API key or
version not served: a Kafka broker cannot parse such a request, and closes the connection
rather than answer it (only ApiVersions is answered at any version, in its v0 layout, so
that a client learns what to speak). Any other prefix is taken as
a claim, not a promise: what is held for a frame grows with its bytes as they arrive
(at most twice them plus :data:`LARGE_FRAME`), never with the size announced. Malformed
bodies raise :class:`RemoteProtocolError` (``INVALID_REQUEST``) and nothing else (bytes
after a complete body are ignored, as Kafka does): every length read from the wire is
checked against the bytes actually present before it is used.

Example::

    >>> conn = KafkaConnection()
    >>> frame = encode_request(18, 0, 7, "cli", Data())
    >>> conn.receive_data(frame)
    >>> req = conn.next_event()
    >>> (req.api_key, req.api_version, req.correlation_id, req.client_id)
    (18, 0, 7, 'cli')
    >>> conn.next_event() is NEED_DATA
    True
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from handlers.kafka._errors import ErrorCode, RemoteProtocolError

__all__ = [
    "APIS",
    "ApiSpec",
    "Data",
    "Field",
    "KafkaConnection",
    "NEED_DATA",
    "RequestReceived",
    "SaslTokenReceived",
    "UnsupportedRequest",
    "DEFAULT_MAX_REQUEST_SIZE",
    "LARGE_FRAME",
    "MAX_SASL_TOKEN",
    "decode_body",
    "encode_body",
    "encode_request",
    "decode_response",
    "api_versions_table",
]

DEFAULT_MAX_REQUEST_SIZE = 100 * 1024 * 1024
"""Largest request frame accepted (Kafka's ``socket.request.max.bytes``)."""

LARGE_FRAME = 64 * 1024

MAX_SASL_TOKEN = 512 * 1024
"""Largest unframed SASL token accepted (Kafka's ``sasl.server.max.receive.size``)."""
"""A request frame this large is received into a buffer of its own (see
:class:`KafkaConnection`)."""

LARGE_PIECE = 16 * 1024
"""A response part this large (a fetch's record batch) is sent as it is, not copied into
the frame (see :meth:`KafkaConnection.send_response_parts`)."""

MAX_VERSION = 0x7FFF

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

_NEED_DATA_T = type("NEED_DATA", (), {"__repr__": lambda self: "NEED_DATA"})
NEED_DATA: Any = _NEED_DATA_T()
"""Returned by :meth:`KafkaConnection.next_event` when a whole frame is not buffered yet."""


# --------------------------------------------------------------------------- values


class Data:
    """A decoded (or to-be-encoded) struct: fields as attributes, named as the spec in
    snake case. Missing attributes read as ``AttributeError``; encoding uses defaults."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        # Only reached for a missing field (it tells type checkers fields are dynamic).
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__[name] = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Data) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"Data({inner})"

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)


# --------------------------------------------------------------------------- the table


def _versions(text: str) -> tuple[int, int]:
    if text == "none":
        return (1, 0)
    if text.endswith("+"):
        return (int(text[:-1]), MAX_VERSION)
    if "-" in text:
        lo, hi = text.split("-")
        return (int(lo), int(hi))
    return (int(text), int(text))


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message definition.

    ``type`` is a primitive name (``int8 int16 int32 int64 uint16 float64 bool string
    bytes records uuid``), ``[]name`` for an array of primitives, ``[]`` with ``fields``
    for an array of structs, or ``{}`` with ``fields`` for one struct (a nullable one is
    preceded on the wire by an ``int8``: -1 for null, 1 for present). ``nullable`` gives
    the versions in which the field may be null; ``tag`` makes it a tagged field
    (flexible versions only). A ``records`` value to
    be encoded may also be a list of record batches, written back to back.
    """

    name: str
    type: str
    versions: tuple[int, int]
    nullable: tuple[int, int]
    tag: int | None
    default: Any
    fields: tuple[Field, ...] | None

    def present(self, version: int) -> bool:
        return self.versions[0] <= version <= self.versions[1]

    def is_nullable(self, version: int) -> bool:
        return self.nullable[0] <= version <= self.nullable[1]


_DEFAULTS = {"int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint16": 0, "float64": 0.0,
             "bool": False, "string": "", "bytes": b"", "records": None,
             "uuid": b"\x00" * 16}


def F(name: str, type_: str, versions: str = "0+", *fields: Field, nullable: str = "none",
      tag: int | None = None, default: Any = None) -> Field:
    if default is None and type_ in _DEFAULTS and nullable == "none":
        default = _DEFAULTS[type_]
    return Field(name, type_, _versions(versions), _versions(nullable), tag, default,
                 tuple(fields) if fields else None)


@dataclass(frozen=True, slots=True)
class ApiSpec:
    key: int
    name: str
    min_version: int
    max_version: int
    flexible: int
    request: tuple[Field, ...]
    response: tuple[Field, ...]

    def is_flexible(self, version: int) -> bool:
        return version >= self.flexible


def _api(key: int, name: str, versions: str, flexible: int,
         request: list[Field], response: list[Field]) -> ApiSpec:
    lo, hi = _versions(versions)
    return ApiSpec(key, name, lo, hi, flexible, tuple(request), tuple(response))


def _topic_partitions(*fields: Field) -> Field:
    """``topics``: each a ``name`` and its ``partitions``, each with ``fields``: the shape
    most per-partition requests and responses share."""
    return F("topics", "[]", "0+", F("name", "string"), F("partitions", "[]", "0+", *fields))


_THROTTLE = F("throttle_time_ms", "int32", "0+")


def _alter_configs_request(*, incremental: bool) -> list[Field]:
    """AlterConfigs and IncrementalAlterConfigs (KIP-339) requests: the latter adds each
    config's operation."""
    operation = [F("config_operation", "int8")] if incremental else []
    return [
        F("resources", "[]", "0+",
          F("resource_type", "int8"),
          F("resource_name", "string"),
          F("configs", "[]", "0+",
            F("name", "string"),
            *operation,
            F("value", "string", nullable="0+"))),
        F("validate_only", "bool"),
    ]


_ALTER_CONFIGS_RESPONSE = [
    _THROTTLE,
    F("responses", "[]", "0+",
      F("error_code", "int16"),
      F("error_message", "string", nullable="0+"),
      F("resource_type", "int8"),
      F("resource_name", "string")),
]

def _acl(*, filter_: bool) -> list[Field]:
    """An ACL binding's fields (CreateAcls' creations, DeleteAcls' matches), or a filter
    of them (DescribeAcls, DeleteAcls), whose names and principal and host may be null."""
    suffix, nullable = ("_filter", "0+") if filter_ else ("", "none")
    return [
        F("resource_type" + suffix, "int8"),
        F("resource_name" + suffix, "string", nullable=nullable),
        F("pattern_type" + suffix, "int8", "1+", default=3),
        F("principal" + suffix, "string", nullable=nullable),
        F("host" + suffix, "string", nullable=nullable),
        F("operation", "int8"),
        F("permission_type", "int8"),
    ]


# Protocol guide, "The Messages": one entry per API key, fields in wire order.
APIS: dict[int, ApiSpec] = {a.key: a for a in [
    _api(0, "Produce", "3-9", 9, [
        F("transactional_id", "string", "3+", nullable="3+"),
        F("acks", "int16"),
        F("timeout_ms", "int32"),
        F("topic_data", "[]", "0+",
          F("name", "string"),
          F("partition_data", "[]", "0+",
            F("index", "int32"),
            F("records", "records", nullable="0+"))),
    ], [
        F("responses", "[]", "0+",
          F("name", "string"),
          F("partition_responses", "[]", "0+",
            F("index", "int32"),
            F("error_code", "int16"),
            F("base_offset", "int64"),
            F("log_append_time_ms", "int64", "2+", default=-1),
            F("log_start_offset", "int64", "5+", default=-1),
            F("record_errors", "[]", "8+",
              F("batch_index", "int32"),
              F("batch_index_error_message", "string", nullable="0+")),
            F("error_message", "string", "8+", nullable="0+"))),
        F("throttle_time_ms", "int32", "1+"),
    ]),
    _api(1, "Fetch", "4-12", 12, [
        F("cluster_id", "string", "12+", nullable="12+", tag=0),
        F("replica_id", "int32", "0-14", default=-1),
        F("max_wait_ms", "int32"),
        F("min_bytes", "int32"),
        F("max_bytes", "int32", "3+", default=0x7FFFFFFF),
        F("isolation_level", "int8", "4+"),
        F("session_id", "int32", "7+"),
        F("session_epoch", "int32", "7+", default=-1),
        F("topics", "[]", "0+",
          F("topic", "string", "0-12"),
          F("partitions", "[]", "0+",
            F("partition", "int32"),
            F("current_leader_epoch", "int32", "9+", default=-1),
            F("fetch_offset", "int64"),
            F("last_fetched_epoch", "int32", "12+", default=-1),
            F("log_start_offset", "int64", "5+", default=-1),
            F("partition_max_bytes", "int32"))),
        F("forgotten_topics_data", "[]", "7+",
          F("topic", "string", "7-12"),
          F("partitions", "[]int32", "0+")),
        F("rack_id", "string", "11+"),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "7+"),
        F("session_id", "int32", "7+"),
        F("responses", "[]", "0+",
          F("topic", "string", "0-12"),
          F("partitions", "[]", "0+",
            F("partition_index", "int32"),
            F("error_code", "int16"),
            F("high_watermark", "int64"),
            F("last_stable_offset", "int64", "4+", default=-1),
            F("log_start_offset", "int64", "5+", default=-1),
            F("aborted_transactions", "[]", "4+",
              F("producer_id", "int64"),
              F("first_offset", "int64"), nullable="4+"),
            F("preferred_read_replica", "int32", "11+", default=-1),
            F("records", "records", nullable="0+"))),
    ]),
    _api(2, "ListOffsets", "1-9", 6, [
        F("replica_id", "int32", default=-1),
        F("isolation_level", "int8", "2+"),
        _topic_partitions(
          F("partition_index", "int32"),
          F("current_leader_epoch", "int32", "4+", default=-1),
          F("timestamp", "int64"),
          F("max_num_offsets", "int32", "0", default=1)),
    ], [
        F("throttle_time_ms", "int32", "2+"),
        _topic_partitions(
          F("partition_index", "int32"),
          F("error_code", "int16"),
          F("old_style_offsets", "[]int64", "0"),
          F("timestamp", "int64", "1+", default=-1),
          F("offset", "int64", "1+", default=-1),
          F("leader_epoch", "int32", "4+", default=-1)),
    ]),
    _api(3, "Metadata", "1-12", 9, [
        F("topics", "[]", "0+",
          F("topic_id", "uuid", "10+"),
          F("name", "string", "0+", nullable="10+"), nullable="1+"),
        F("allow_auto_topic_creation", "bool", "4+", default=True),
        F("include_cluster_authorized_operations", "bool", "8-10"),
        F("include_topic_authorized_operations", "bool", "8+"),
    ], [
        F("throttle_time_ms", "int32", "3+"),
        F("brokers", "[]", "0+",
          F("node_id", "int32"),
          F("host", "string"),
          F("port", "int32"),
          F("rack", "string", "1+", nullable="1+")),
        F("cluster_id", "string", "2+", nullable="2+"),
        F("controller_id", "int32", "1+", default=-1),
        F("topics", "[]", "0+",
          F("error_code", "int16"),
          F("name", "string", "0+", nullable="12+"),
          F("topic_id", "uuid", "10+"),
          F("is_internal", "bool", "1+"),
          F("partitions", "[]", "0+",
            F("error_code", "int16"),
            F("partition_index", "int32"),
            F("leader_id", "int32"),
            F("leader_epoch", "int32", "7+", default=-1),
            F("replica_nodes", "[]int32"),
            F("isr_nodes", "[]int32"),
            F("offline_replicas", "[]int32", "5+")),
          F("topic_authorized_operations", "int32", "8+", default=-2147483648)),
        F("cluster_authorized_operations", "int32", "8-10", default=-2147483648),
    ]),
    _api(8, "OffsetCommit", "0-8", 8, [
        F("group_id", "string"),
        F("generation_id_or_member_epoch", "int32", "1+", default=-1),
        F("member_id", "string", "1+"),
        F("group_instance_id", "string", "7+", nullable="7+"),
        F("retention_time_ms", "int64", "2-4", default=-1),
        _topic_partitions(
          F("partition_index", "int32"),
          F("committed_offset", "int64"),
          F("committed_leader_epoch", "int32", "6+", default=-1),
          F("commit_timestamp", "int64", "1", default=-1),
          F("committed_metadata", "string", nullable="0+")),
    ], [
        F("throttle_time_ms", "int32", "3+"),
        _topic_partitions(
          F("partition_index", "int32"),
          F("error_code", "int16")),
    ]),
    _api(9, "OffsetFetch", "0-7", 6, [
        F("group_id", "string"),
        F("topics", "[]", "0+",
          F("name", "string"),
          F("partition_indexes", "[]int32"), nullable="2+"),
        F("require_stable", "bool", "7+"),
    ], [
        F("throttle_time_ms", "int32", "3+"),
        _topic_partitions(
          F("partition_index", "int32"),
          F("committed_offset", "int64"),
          F("committed_leader_epoch", "int32", "5+", default=-1),
          F("metadata", "string", nullable="0+"),
          F("error_code", "int16")),
        F("error_code", "int16", "2+"),
    ]),
    _api(10, "FindCoordinator", "0-4", 3, [
        F("key", "string", "0-3"),
        F("key_type", "int8", "1+"),
        F("coordinator_keys", "[]string", "4+"),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "0-3"),
        F("error_message", "string", "1-3", nullable="1-3"),
        F("node_id", "int32", "0-3"),
        F("host", "string", "0-3"),
        F("port", "int32", "0-3"),
        F("coordinators", "[]", "4+",
          F("key", "string"),
          F("node_id", "int32"),
          F("host", "string"),
          F("port", "int32"),
          F("error_code", "int16"),
          F("error_message", "string", nullable="0+")),
    ]),
    _api(11, "JoinGroup", "0-9", 6, [
        F("group_id", "string"),
        F("session_timeout_ms", "int32"),
        F("rebalance_timeout_ms", "int32", "1+", default=-1),
        F("member_id", "string"),
        F("group_instance_id", "string", "5+", nullable="5+"),
        F("protocol_type", "string"),
        F("protocols", "[]", "0+",
          F("name", "string"),
          F("metadata", "bytes")),
        F("reason", "string", "8+", nullable="8+"),
    ], [
        F("throttle_time_ms", "int32", "2+"),
        F("error_code", "int16"),
        F("generation_id", "int32", default=-1),
        F("protocol_type", "string", "7+", nullable="7+"),
        F("protocol_name", "string", "0+", nullable="7+"),
        F("leader", "string"),
        F("skip_assignment", "bool", "9+"),
        F("member_id", "string"),
        F("members", "[]", "0+",
          F("member_id", "string"),
          F("group_instance_id", "string", "5+", nullable="5+"),
          F("metadata", "bytes")),
    ]),
    _api(12, "Heartbeat", "0-4", 4, [
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+"),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
    ]),
    _api(13, "LeaveGroup", "0-5", 4, [
        F("group_id", "string"),
        F("member_id", "string", "0-2"),
        F("members", "[]", "3+",
          F("member_id", "string"),
          F("group_instance_id", "string", nullable="0+"),
          F("reason", "string", "5+", nullable="5+")),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("members", "[]", "3+",
          F("member_id", "string"),
          F("group_instance_id", "string", nullable="0+"),
          F("error_code", "int16")),
    ]),
    _api(14, "SyncGroup", "0-5", 4, [
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+"),
        F("protocol_type", "string", "5+", nullable="5+"),
        F("protocol_name", "string", "5+", nullable="5+"),
        F("assignments", "[]", "0+",
          F("member_id", "string"),
          F("assignment", "bytes")),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("protocol_type", "string", "5+", nullable="5+"),
        F("protocol_name", "string", "5+", nullable="5+"),
        F("assignment", "bytes"),
    ]),
    _api(15, "DescribeGroups", "0-5", 5, [
        F("groups", "[]string"),
        F("include_authorized_operations", "bool", "3+"),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("groups", "[]", "0+",
          F("error_code", "int16"),
          F("group_id", "string"),
          F("group_state", "string"),
          F("protocol_type", "string"),
          F("protocol_data", "string"),
          F("members", "[]", "0+",
            F("member_id", "string"),
            F("group_instance_id", "string", "4+", nullable="4+"),
            F("client_id", "string"),
            F("client_host", "string"),
            F("member_metadata", "bytes"),
            F("member_assignment", "bytes")),
          F("authorized_operations", "int32", "3+", default=-2147483648)),
    ]),
    _api(16, "ListGroups", "0-5", 3, [
        F("states_filter", "[]string", "4+"),
        F("types_filter", "[]string", "5+"),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("groups", "[]", "0+",
          F("group_id", "string"),
          F("protocol_type", "string"),
          F("group_state", "string", "4+"),
          F("group_type", "string", "5+")),
    ]),
    # KIP-43, KIP-152: after v0 the client sends its SASL tokens unframed (a size and the
    # bytes: :class:`SaslTokenReceived`), after v1 in SaslAuthenticate. Never flexible.
    _api(17, "SaslHandshake", "0-1", 2, [
        F("mechanism", "string"),
    ], [
        F("error_code", "int16"),
        F("mechanisms", "[]string"),
    ]),
    # v4 (KAFKA-17011) lists supported features whose min version is 0, which v3 leaves out.
    _api(18, "ApiVersions", "0-4", 3, [
        F("client_software_name", "string", "3+"),
        F("client_software_version", "string", "3+"),
    ], [
        F("error_code", "int16"),
        F("api_keys", "[]", "0+",
          F("api_key", "int16"),
          F("min_version", "int16"),
          F("max_version", "int16")),
        F("throttle_time_ms", "int32", "1+"),
        F("supported_features", "[]", "3+",
          F("name", "string"),
          F("min_version", "int16"),
          F("max_version", "int16"), tag=0),
        F("finalized_features_epoch", "int64", "3+", tag=1, default=-1),
        F("finalized_features", "[]", "3+",
          F("name", "string"),
          F("max_version_level", "int16"),
          F("min_version_level", "int16"), tag=2),
        F("zk_migration_ready", "bool", "3+", tag=3),
    ]),
    _api(19, "CreateTopics", "0-7", 5, [
        F("topics", "[]", "0+",
          F("name", "string"),
          F("num_partitions", "int32"),
          F("replication_factor", "int16"),
          F("assignments", "[]", "0+",
            F("partition_index", "int32"),
            F("broker_ids", "[]int32")),
          F("configs", "[]", "0+",
            F("name", "string"),
            F("value", "string", nullable="0+"))),
        F("timeout_ms", "int32"),
        F("validate_only", "bool", "1+"),
    ], [
        F("throttle_time_ms", "int32", "2+"),
        F("topics", "[]", "0+",
          F("name", "string"),
          F("topic_id", "uuid", "7+"),
          F("error_code", "int16"),
          F("error_message", "string", "1+", nullable="0+"),
          F("topic_config_error_code", "int16", "5+", tag=0),
          F("num_partitions", "int32", "5+", default=-1),
          F("replication_factor", "int16", "5+", default=-1),
          F("configs", "[]", "5+",
            F("name", "string"),
            F("value", "string", nullable="0+"),
            F("read_only", "bool"),
            F("config_source", "int8", default=-1),
            F("is_sensitive", "bool"), nullable="5+")),
    ]),
    _api(20, "DeleteTopics", "0-5", 4, [
        F("topic_names", "[]string", "0-5"),
        F("timeout_ms", "int32"),
    ], [
        F("throttle_time_ms", "int32", "1+"),
        F("responses", "[]", "0+",
          F("name", "string"),
          F("error_code", "int16"),
          F("error_message", "string", "5+", nullable="5+")),
    ]),
    _api(21, "DeleteRecords", "0-2", 2, [
        _topic_partitions(
          F("partition_index", "int32"),
          F("offset", "int64")),
        F("timeout_ms", "int32"),
    ], [
        _THROTTLE,
        _topic_partitions(
          F("partition_index", "int32"),
          F("low_watermark", "int64"),
          F("error_code", "int16")),
    ]),
    _api(22, "InitProducerId", "0-4", 2, [
        F("transactional_id", "string", nullable="0+"),
        F("transaction_timeout_ms", "int32"),
        F("producer_id", "int64", "3+", default=-1),
        F("producer_epoch", "int16", "3+", default=-1),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
        F("producer_id", "int64", default=-1),
        F("producer_epoch", "int16"),
    ]),
    _api(24, "AddPartitionsToTxn", "0-3", 3, [
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("topics", "[]", "0+",
          F("name", "string"),
          F("partitions", "[]int32")),
    ], [
        _THROTTLE,
        F("results", "[]", "0+",
          F("name", "string"),
          F("results", "[]", "0+",
            F("partition_index", "int32"),
            F("error_code", "int16"))),
    ]),
    _api(25, "AddOffsetsToTxn", "0-3", 3, [
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("group_id", "string"),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
    ]),
    _api(26, "EndTxn", "0-3", 3, [
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("committed", "bool"),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
    ]),
    _api(28, "TxnOffsetCommit", "0-3", 3, [
        F("transactional_id", "string"),
        F("group_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("generation_id", "int32", "3+", default=-1),
        F("member_id", "string", "3+"),
        F("group_instance_id", "string", "3+", nullable="3+"),
        _topic_partitions(
          F("partition_index", "int32"),
          F("committed_offset", "int64"),
          F("committed_leader_epoch", "int32", "2+", default=-1),
          F("committed_metadata", "string", nullable="0+")),
    ], [
        _THROTTLE,
        _topic_partitions(
          F("partition_index", "int32"),
          F("error_code", "int16")),
    ]),
    _api(32, "DescribeConfigs", "0-4", 4, [
        F("resources", "[]", "0+",
          F("resource_type", "int8"),
          F("resource_name", "string"),
          F("configuration_keys", "[]string", nullable="0+")),
        F("include_synonyms", "bool", "1+"),
        F("include_documentation", "bool", "3+"),
    ], [
        _THROTTLE,
        F("results", "[]", "0+",
          F("error_code", "int16"),
          F("error_message", "string", nullable="0+"),
          F("resource_type", "int8"),
          F("resource_name", "string"),
          F("configs", "[]", "0+",
            F("name", "string"),
            F("value", "string", nullable="0+"),
            F("read_only", "bool"),
            F("is_default", "bool", "0"),
            F("config_source", "int8", "1+", default=-1),
            F("is_sensitive", "bool"),
            F("synonyms", "[]", "1+",
              F("name", "string"),
              F("value", "string", nullable="0+"),
              F("source", "int8")),
            F("config_type", "int8", "3+"),
            F("documentation", "string", "3+", nullable="0+"))),
    ]),
    _api(33, "AlterConfigs", "0-2", 2, _alter_configs_request(incremental=False),
         _ALTER_CONFIGS_RESPONSE),
    _api(36, "SaslAuthenticate", "0-2", 2, [
        F("auth_bytes", "bytes"),
    ], [
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("auth_bytes", "bytes"),
        F("session_lifetime_ms", "int64", "1+"),
    ]),
    _api(37, "CreatePartitions", "0-3", 2, [
        F("topics", "[]", "0+",
          F("name", "string"),
          F("count", "int32"),
          F("assignments", "[]", "0+",
            F("broker_ids", "[]int32"), nullable="0+")),
        F("timeout_ms", "int32"),
        F("validate_only", "bool"),
    ], [
        _THROTTLE,
        F("results", "[]", "0+",
          F("name", "string"),
          F("error_code", "int16"),
          F("error_message", "string", nullable="0+")),
    ]),
    _api(42, "DeleteGroups", "0-2", 2, [
        F("groups_names", "[]string"),
    ], [
        _THROTTLE,
        F("results", "[]", "0+",
          F("group_id", "string"),
          F("error_code", "int16")),
    ]),
    _api(44, "IncrementalAlterConfigs", "0-1", 1, _alter_configs_request(incremental=True),
         _ALTER_CONFIGS_RESPONSE),
    _api(47, "OffsetDelete", "0-0", 1, [
        F("group_id", "string"),
        _topic_partitions(
          F("partition_index", "int32")),
    ], [
        F("error_code", "int16"),
        _THROTTLE,
        _topic_partitions(
          F("partition_index", "int32"),
          F("error_code", "int16")),
    ]),
    _api(60, "DescribeCluster", "0-1", 0, [
        F("include_cluster_authorized_operations", "bool"),
        F("endpoint_type", "int8", "1+", default=1),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("endpoint_type", "int8", "1+", default=1),
        F("cluster_id", "string"),
        F("controller_id", "int32", default=-1),
        F("brokers", "[]", "0+",
          F("broker_id", "int32"),
          F("host", "string"),
          F("port", "int32"),
          F("rack", "string", nullable="0+")),
        F("cluster_authorized_operations", "int32", default=-2147483648),
    ]),
    # With no authorizer every one is refused: see handlers.kafka._admin.handle_acls.
    _api(29, "DescribeAcls", "1-3", 2, _acl(filter_=True), [
        _THROTTLE,
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("resources", "[]", "0+",
          F("resource_type", "int8"),
          F("resource_name", "string"),
          F("pattern_type", "int8", "1+", default=3),
          F("acls", "[]", "0+",
            F("principal", "string"),
            F("host", "string"),
            F("operation", "int8"),
            F("permission_type", "int8"))),
    ]),
    _api(30, "CreateAcls", "1-3", 2, [
        F("creations", "[]", "0+", *_acl(filter_=False)),
    ], [
        _THROTTLE,
        F("results", "[]", "0+",
          F("error_code", "int16"),
          F("error_message", "string", nullable="0+")),
    ]),
    _api(31, "DeleteAcls", "1-3", 2, [
        F("filters", "[]", "0+", *_acl(filter_=True)),
    ], [
        _THROTTLE,
        F("filter_results", "[]", "0+",
          F("error_code", "int16"),
          F("error_message", "string", nullable="0+"),
          F("matching_acls", "[]", "0+",
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            *_acl(filter_=False))),
    ]),
    # KIP-460: every partition has one replica, led here; see handlers.kafka._admin.
    _api(43, "ElectLeaders", "0-2", 2, [
        F("election_type", "int8", "1+"),
        F("topic_partitions", "[]", "0+",
          F("topic", "string"),
          F("partition_id", "[]int32"), nullable="0+"),
        F("timeout_ms", "int32", default=60000),
    ], [
        _THROTTLE,
        F("error_code", "int16", "1+"),
        F("replica_election_results", "[]", "0+",
          F("topic", "string"),
          F("partition_result", "[]", "0+",
            F("partition_id", "int32"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"))),
    ]),
    # KIP-554's read half: no listener here authenticates with SASL, so no user has one.
    _api(50, "DescribeUserScramCredentials", "0", 0, [
        F("users", "[]", "0+",
          F("name", "string"), nullable="0+"),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("results", "[]", "0+",
          F("user", "string"),
          F("error_code", "int16"),
          F("error_message", "string", nullable="0+"),
          F("credential_infos", "[]", "0+",
            F("mechanism", "int8"),
            F("iterations", "int32"))),
    ]),
    _api(35, "DescribeLogDirs", "1-4", 2, [
        F("topics", "[]", "0+",
          F("topic", "string"),
          F("partitions", "[]int32"), nullable="0+"),
    ], [
        _THROTTLE,
        F("error_code", "int16", "3+"),
        F("results", "[]", "0+",
          F("error_code", "int16"),
          F("log_dir", "string"),
          _topic_partitions(
            F("partition_index", "int32"),
            F("partition_size", "int64"),
            F("offset_lag", "int64"),
            F("is_future_key", "bool")),
          F("total_bytes", "int64", "4+", default=-1),
          F("usable_bytes", "int64", "4+", default=-1)),
    ]),
    _api(46, "ListPartitionReassignments", "0", 0, [
        F("timeout_ms", "int32", default=60000),
        F("topics", "[]", "0+",
          F("name", "string"),
          F("partition_indexes", "[]int32"), nullable="0+"),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        _topic_partitions(
          F("partition_index", "int32"),
          F("replicas", "[]int32"),
          F("adding_replicas", "[]int32"),
          F("removing_replicas", "[]int32")),
    ]),
    _api(61, "DescribeProducers", "0", 0, [
        F("topics", "[]", "0+",
          F("name", "string"),
          F("partition_indexes", "[]int32")),
    ], [
        _THROTTLE,
        _topic_partitions(
          F("partition_index", "int32"),
          F("error_code", "int16"),
          F("error_message", "string", nullable="0+"),
          F("active_producers", "[]", "0+",
            F("producer_id", "int64"),
            F("producer_epoch", "int32"),
            F("last_sequence", "int32", default=-1),
            F("last_timestamp", "int64", default=-1),
            F("coordinator_epoch", "int32"),
            F("current_txn_start_offset", "int64", default=-1))),
    ]),
    _api(65, "DescribeTransactions", "0", 0, [
        F("transactional_ids", "[]string"),
    ], [
        _THROTTLE,
        F("transaction_states", "[]", "0+",
          F("error_code", "int16"),
          F("transactional_id", "string"),
          F("transaction_state", "string"),
          F("transaction_timeout_ms", "int32"),
          F("transaction_start_time_ms", "int64"),
          F("producer_id", "int64"),
          F("producer_epoch", "int16"),
          F("topics", "[]", "0+",
            F("topic", "string"),
            F("partitions", "[]int32"))),
    ]),
    _api(66, "ListTransactions", "0", 0, [
        F("state_filters", "[]string"),
        F("producer_id_filters", "[]int64"),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
        F("unknown_state_filters", "[]string"),
        F("transaction_states", "[]", "0+",
          F("transactional_id", "string"),
          F("producer_id", "int64"),
          F("transaction_state", "string")),
    ]),
    # Served only to refuse it: see handlers.kafka._group.refuse_consumer_protocol.
    _api(68, "ConsumerGroupHeartbeat", "0-1", 0, [
        F("group_id", "string"),
        F("member_id", "string"),
        F("member_epoch", "int32"),
        F("instance_id", "string", nullable="0+"),
        F("rack_id", "string", nullable="0+"),
        F("rebalance_timeout_ms", "int32", default=-1),
        F("subscribed_topic_names", "[]string", nullable="0+"),
        F("subscribed_topic_regex", "string", "1+", nullable="1+"),
        F("server_assignor", "string", nullable="0+"),
        F("topic_partitions", "[]", "0+",
          F("topic_id", "uuid"),
          F("partitions", "[]int32"), nullable="0+"),
    ], [
        _THROTTLE,
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("member_id", "string", nullable="0+"),
        F("member_epoch", "int32"),
        F("heartbeat_interval_ms", "int32"),
        # The nullable Assignment struct, always null here: its int8 marker, -1.
        F("assignment", "int8", default=-1),
    ]),
    # KIP-966: Metadata's topic part, paged by a cursor (kafka-topics.sh --describe, 3.8+).
    _api(75, "DescribeTopicPartitions", "0", 0, [
        F("topics", "[]", "0+",
          F("name", "string")),
        F("response_partition_limit", "int32", default=2000),
        F("cursor", "{}", "0+",
          F("topic_name", "string"),
          F("partition_index", "int32"), nullable="0+"),
    ], [
        _THROTTLE,
        F("topics", "[]", "0+",
          F("error_code", "int16"),
          F("name", "string", nullable="0+"),
          F("topic_id", "uuid"),
          F("is_internal", "bool"),
          F("partitions", "[]", "0+",
            F("error_code", "int16"),
            F("partition_index", "int32"),
            F("leader_id", "int32"),
            F("leader_epoch", "int32", default=-1),
            F("replica_nodes", "[]int32"),
            F("isr_nodes", "[]int32"),
            F("eligible_leader_replicas", "[]int32", nullable="0+"),
            F("last_known_elr", "[]int32", nullable="0+"),
            F("offline_replicas", "[]int32")),
          F("topic_authorized_operations", "int32", default=-2147483648)),
        F("next_cursor", "{}", "0+",
          F("topic_name", "string"),
          F("partition_index", "int32"), nullable="0+"),
    ]),
]}

API_VERSIONS = 18


def api_versions_table() -> list[Data]:
    """The ``api_keys`` of an ApiVersions response: exactly what :data:`APIS` serves."""
    return [Data(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
            for a in sorted(APIS.values(), key=lambda a: a.key)]


# --------------------------------------------------------------------------- reading


def _bad(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, ErrorCode.INVALID_REQUEST)


class _Reader:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def take(self, n: int) -> memoryview | bytes:
        if n < 0 or self.pos + n > self.end:
            raise _bad(f"field of {n} bytes runs past the end of the frame")
        start = self.pos
        self.pos += n
        return self.buf[start:self.pos]

    def unpack(self, s: struct.Struct) -> Any:
        if self.pos + s.size > self.end:
            raise _bad("frame ends inside a fixed-size field")
        v = s.unpack_from(self.buf, self.pos)[0]
        self.pos += s.size
        return v

    def uvarint(self) -> int:
        value, self.pos = _uvarint_at(self.buf, self.pos, self.end)
        return value

    def remaining(self) -> int:
        return self.end - self.pos


# Positional readers: each takes (buffer, position, end) and returns (value, new position).
# The compiled readers call them directly; the _Reader functions below wrap them.

def _uvarint_at(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _bad("frame ends inside a varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise _bad("varint longer than 5 bytes")


def _len_at(buf: bytes | memoryview, pos: int, end: int, compact: bool,
            wide: bool = False) -> tuple[int, int]:
    """A length prefix: -1 means null."""
    if compact:
        n, pos = _uvarint_at(buf, pos, end)
        return n - 1, pos
    s = _I32 if wide else _I16
    if pos + s.size > end:
        raise _bad("frame ends inside a fixed-size field")
    return s.unpack_from(buf, pos)[0], pos + s.size


def _string_at(buf: bytes | memoryview, pos: int, end: int, compact: bool,
               nullable: bool) -> tuple[str | None, int]:
    n, pos = _len_at(buf, pos, end, compact)
    if n < 0:
        if nullable:
            return None, pos
        raise _bad("null in a non-nullable string")
    if pos + n > end:
        raise _bad(f"field of {n} bytes runs past the end of the frame")
    try:
        return str(buf[pos:pos + n], "utf-8"), pos + n
    except UnicodeDecodeError as exc:
        raise _bad(f"string is not UTF-8: {exc}") from None


def _bytes_at(buf: bytes | memoryview, pos: int, end: int, compact: bool,
              nullable: bool) -> tuple[bytes | None, int]:
    n, pos = _len_at(buf, pos, end, compact, wide=True)
    if n < 0:
        if nullable:
            return None, pos
        raise _bad("null in non-nullable bytes")
    if pos + n > end:
        raise _bad(f"field of {n} bytes runs past the end of the frame")
    return bytes(buf[pos:pos + n]), pos + n


def _read_string(r: _Reader, compact: bool, nullable: bool) -> str | None:
    value, r.pos = _string_at(r.buf, r.pos, r.end, compact, nullable)
    return value


def _read_bytes(r: _Reader, compact: bool, nullable: bool) -> bytes | None:
    value, r.pos = _bytes_at(r.buf, r.pos, r.end, compact, nullable)
    return value


_PRIMS = {"int8": _I8, "int16": _I16, "int32": _I32, "int64": _I64, "uint16": _U16,
          "float64": _F64}


def _read_value(r: _Reader, type_: str, compact: bool, nullable: bool,
                fields: tuple[Field, ...] | None, version: int) -> Any:
    s = _PRIMS.get(type_)
    if s is not None:
        return r.unpack(s)
    if type_ == "string":
        return _read_string(r, compact, nullable)
    if type_ in ("bytes", "records"):
        return _read_bytes(r, compact, nullable)
    if type_ == "bool":
        return r.unpack(_I8) != 0
    if type_ == "uuid":
        return bytes(r.take(16))
    if type_ == "{}":
        assert fields is not None
        if nullable and r.unpack(_I8) < 0:
            return None
        return _read_struct(r, fields, version, compact)
    if type_.startswith("[]"):
        elem = type_[2:]
        if elem:
            def item(buf: bytes | memoryview, pos: int, end: int) -> tuple[Any, int]:
                return _value_at(buf, pos, end, elem, compact, False, None, version)
        else:
            assert fields is not None
            item = _reader_for(fields, version, compact)
        value, r.pos = _array_at(r.buf, r.pos, r.end, compact, nullable, item)
        return value
    raise _bad(f"unknown field type {type_}")


def _value_at(buf: bytes | memoryview, pos: int, end: int, type_: str, compact: bool,
              nullable: bool, fields: tuple[Field, ...] | None, version: int
              ) -> tuple[Any, int]:
    """:func:`_read_value` at a position: (value, new position)."""
    r = _Reader(buf, pos, end)
    return _read_value(r, type_, compact, nullable, fields, version), r.pos


def _read_struct(r: _Reader, fields: tuple[Field, ...], version: int, flexible: bool) -> Data:
    out, r.pos = _reader_for(fields, version, flexible)(r.buf, r.pos, r.end)
    return out  # type: ignore[no-any-return]


def _read_tagged(r: _Reader, known: dict[int, Field], d: dict[str, Any], version: int) -> None:
    count = r.uvarint()
    if count > r.remaining():
        raise _bad("tagged field count exceeds the frame")
    last = -1
    for _ in range(count):
        tag = r.uvarint()
        if tag <= last:
            raise _bad("tagged fields out of order")
        last = tag
        size = r.uvarint()
        if size > r.remaining():
            raise _bad("tagged field runs past the end of the frame")
        f = known.get(tag)
        if f is None:
            r.pos += size
            continue
        sub = _Reader(r.buf, r.pos, r.pos + size)
        d[f.name] = _read_value(sub, f.type, True, f.is_nullable(version), f.fields, version)
        r.pos += size



def decode_body(spec: ApiSpec, version: int, payload: bytes | memoryview, *,
                response: bool = False, offset: int = 0, strict: bool = True) -> Data:
    """Decode a request (or response) body of ``spec`` at ``version``; trailing bytes are
    an error when ``strict``."""
    r = _Reader(payload, offset)
    fields = spec.response if response else spec.request
    body = _read_struct(r, fields, version, spec.is_flexible(version))
    if strict and r.pos != r.end:
        raise _bad(f"{r.end - r.pos} unexpected bytes after the {spec.name} body")
    return body


# --------------------------------------------------------------------------- writing


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _write_len(out: list[bytes], n: int, compact: bool, wide: bool = False) -> None:
    if compact:
        out.append(_uvarint(n + 1))
    else:
        out.append((_I32 if wide else _I16).pack(n))


def _write_value(out: list[bytes], value: Any, type_: str, compact: bool, nullable: bool,
                 fields: tuple[Field, ...] | None, version: int) -> None:
    s = _PRIMS.get(type_)
    if s is not None:
        out.append(s.pack(value))
        return
    if type_ == "bool":
        out.append(b"\x01" if value else b"\x00")
        return
    if type_ == "{}":
        assert fields is not None
        if nullable:
            out.append(b"\xff" if value is None else b"\x01")
            if value is None:
                return
        _write_struct(out, Data() if value is None else value, fields, version, compact)
        return
    if value is None:
        if not nullable:
            if type_ == "string":
                value = ""
            elif type_ in ("bytes", "records"):
                value = b""
            elif type_.startswith("[]"):
                value = []
        if value is None:
            _write_len(out, -1, compact, wide=type_ != "string")
            return
    if type_ == "string":
        raw = value.encode("utf-8")
        _write_len(out, len(raw), compact)
        out.append(raw)
    elif type_ == "records" and isinstance(value, list):
        # Record batches to be written back to back (joined once, with the whole frame).
        _write_len(out, sum(map(len, value)), compact, wide=True)
        out.extend(value)
    elif type_ in ("bytes", "records"):
        _write_len(out, len(value), compact, wide=True)
        out.append(bytes(value) if isinstance(value, memoryview) else value)
    elif type_ == "uuid":
        if len(value) != 16:
            raise ValueError("a uuid is 16 bytes")
        out.append(bytes(value))
    elif type_.startswith("[]"):
        elem = type_[2:]
        if elem:
            def item(out: list[bytes], v: Any) -> None:
                _write_value(out, v, elem, compact, False, None, version)
        else:
            assert fields is not None
            item = _writer_for(fields, version, compact)
        _write_array(out, value, compact, nullable, item)
    else:
        raise ValueError(f"unknown field type {type_}")


def _write_struct(out: list[bytes], obj: Any, fields: tuple[Field, ...], version: int,
                  flexible: bool) -> None:
    _writer_for(fields, version, flexible)(out, obj)


def encode_body(spec: ApiSpec, version: int, body: Any, *, response: bool = True) -> bytes:
    """Encode a response (or request) body of ``spec`` at ``version`` (no header, no size)."""
    out: list[bytes] = []
    fields = spec.response if response else spec.request
    _write_struct(out, body, fields, version, spec.is_flexible(version))
    return b"".join(out)


# --------------------------------------------------------------------------- compiled
#
# A struct's fields at one version are compiled once into a reader and a writer function:
# the generated code has no test of a field's versions, type or nullability left, reads
# runs of fixed-size fields with one ``unpack_from`` and writes them with one ``pack``.
# Strings and bytes are read by the positional readers; other leaf values (uuids, arrays
# of primitives, tagged fields) go through the generic functions above. Arrays, compiled
# or not, are read and written by one function each (_array_at, _write_array).

_FORMAT = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H",
           "float64": "d"}

_Cache = dict[tuple[int, int, bool], tuple[tuple[Field, ...], Any]]
_READERS: _Cache = {}
_WRITERS: _Cache = {}


def _array_at(buf: bytes | memoryview, pos: int, end: int, compact: bool, nullable: bool,
              item: Any) -> tuple[list[Any] | None, int]:
    """An array whose elements ``item(buf, pos, end)`` reads: (list or None, new position)."""
    n, pos = _len_at(buf, pos, end, compact, wide=True)
    if n < 0:
        if nullable:
            return None, pos
        raise _bad("null in a non-nullable array")
    if n > end - pos:
        raise _bad(f"array of {n} elements cannot fit in {end - pos} bytes")
    out = []
    for _ in range(n):
        value, pos = item(buf, pos, end)
        out.append(value)
    return out, pos


def _tagged_tail(buf: bytes | memoryview, pos: int, end: int, known: dict[int, Field],
                 d: dict[str, Any], version: int) -> int:
    if pos < end and buf[pos] == 0:
        return pos + 1
    r = _Reader(buf, pos, end)
    _read_tagged(r, known, d, version)
    return r.pos


def _fixed_run(ns: dict[str, Any], types: list[str]) -> tuple[str, struct.Struct]:
    """The struct for a run of fixed-size fields, put in the namespace ``ns`` of the code
    being generated: (its name there, the struct)."""
    s = struct.Struct(">" + "".join(_FORMAT[t] for t in types))
    name = f"S{len(ns)}"
    ns[name] = s
    return name, s


def _compile_reader(fields: tuple[Field, ...], version: int, flexible: bool) -> Any:
    ns: dict[str, Any] = {"_new": Data.__new__, "Data": Data, "_bad": _bad, "_value_at": _value_at,
                          "_array_at": _array_at, "_tagged_tail": _tagged_tail,
                          "_string_at": _string_at, "_bytes_at": _bytes_at}
    lines = ["def read(buf, pos, end):", "    o = _new(Data)", "    d = o.__dict__"]
    run: list[Field] = []

    def flush() -> None:
        if not run:
            return
        k, s = _fixed_run(ns, [f.type for f in run])
        names = ", ".join(f"d[{f.name!r}]" for f in run)
        lines.append(f"    if pos + {s.size} > end: raise _bad('frame ends inside a fixed-size field')")
        lines.append(f"    {names}{',' if len(run) == 1 else ''} = {k}.unpack_from(buf, pos)")
        lines.append(f"    pos += {s.size}")
        run.clear()

    tagged: dict[int, Field] = {}
    for i, f in enumerate(fields):
        ns[f"F{i}"] = f
        if not f.present(version) or f.tag is not None:
            if f.present(version) and flexible:
                tagged[f.tag] = f  # type: ignore[index]
            flush()
            if f.type.startswith("[]") and f.default is None:
                lines.append(f"    d[{f.name!r}] = []")
            else:
                ns[f"D{i}"] = f.default
                lines.append(f"    d[{f.name!r}] = D{i}")
            continue
        if f.type in _FORMAT:
            run.append(f)
            continue
        flush()
        if f.type == "bool":
            lines.append("    if pos >= end: raise _bad('frame ends inside a fixed-size field')")
            lines.append(f"    d[{f.name!r}] = buf[pos] != 0")
            lines.append("    pos += 1")
        elif f.type == "[]" and f.fields is not None:
            ns[f"R{i}"] = _reader_for(f.fields, version, flexible)
            lines.append(f"    d[{f.name!r}], pos = _array_at(buf, pos, end, {flexible}, "
                         f"{f.is_nullable(version)}, R{i})")
        elif f.type == "string":
            lines.append(f"    d[{f.name!r}], pos = _string_at(buf, pos, end, {flexible}, "
                         f"{f.is_nullable(version)})")
        elif f.type in ("bytes", "records"):
            lines.append(f"    d[{f.name!r}], pos = _bytes_at(buf, pos, end, {flexible}, "
                         f"{f.is_nullable(version)})")
        else:
            lines.append(f"    d[{f.name!r}], pos = _value_at(buf, pos, end, F{i}.type, {flexible}, "
                         f"{f.is_nullable(version)}, F{i}.fields, {version})")
    flush()
    if flexible:
        ns["TAGGED"] = tagged
        lines.append(f"    pos = _tagged_tail(buf, pos, end, TAGGED, d, {version})")
    lines.append("    return o, pos")
    exec("\n".join(lines), ns)  # noqa: S102 - source built above from the message table
    return ns["read"]


def _compiled(cache: _Cache, compile_: Any,
              fields: tuple[Field, ...], version: int, flexible: bool) -> Any:
    """The function ``compile_`` makes for ``fields`` at ``version``, made once. The cache
    keeps the fields alive with it, so their id stays theirs."""
    key = (id(fields), version, flexible)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = (fields, compile_(fields, version, flexible))
    return hit[1]


def _reader_for(fields: tuple[Field, ...], version: int, flexible: bool) -> Any:
    return _compiled(_READERS, _compile_reader, fields, version, flexible)


def _getter(obj: Any) -> Any:
    if type(obj) is Data:
        return obj.__dict__.get
    if isinstance(obj, dict):
        return obj.get
    return lambda name, default: getattr(obj, name, default)


def _write_tagged(out: list[bytes], get: Any, fields: list[Field], version: int) -> None:
    tagged: list[tuple[int, bytes]] = []
    for f in fields:
        value = get(f.name, f.default)
        if value is not None and value != f.default:
            sub: list[bytes] = []
            _write_value(sub, value, f.type, True, f.is_nullable(version), f.fields, version)
            tagged.append((f.tag, b"".join(sub)))  # type: ignore[arg-type]
    out.append(_uvarint(len(tagged)))
    for tag, raw in sorted(tagged):
        out.append(_uvarint(tag))
        out.append(_uvarint(len(raw)))
        out.append(raw)


def _write_array(out: list[bytes], value: Any, compact: bool, nullable: bool,
                 item: Any) -> None:
    """An array whose elements ``item(out, element)`` writes; None is null when nullable,
    empty otherwise."""
    if value is None:
        if nullable:
            _write_len(out, -1, compact, wide=True)
            return
        value = []
    items = list(value)
    _write_len(out, len(items), compact, wide=True)
    for v in items:
        item(out, v)


def _compile_writer(fields: tuple[Field, ...], version: int, flexible: bool) -> Any:
    ns: dict[str, Any] = {"_getter": _getter, "_write_value": _write_value,
                          "_write_tagged": _write_tagged,
                          "_write_array": _write_array}
    lines = ["def write(out, obj):", "    g = _getter(obj)"]
    run: list[int] = []

    def flush() -> None:
        if not run:
            return
        k, _ = _fixed_run(ns, [fields[i].type for i in run])
        args = ", ".join(f"g({fields[i].name!r}, D{i})" for i in run)
        lines.append(f"    out.append({k}.pack({args}))")
        run.clear()

    tagged: list[Field] = []
    for i, f in enumerate(fields):
        if not f.present(version):
            continue
        ns[f"F{i}"] = f
        ns[f"D{i}"] = f.default
        if f.tag is not None:
            if flexible:
                tagged.append(f)
            continue
        if f.type in _FORMAT:
            run.append(i)
            continue
        flush()
        if f.type == "bool":
            lines.append(f"    out.append(b'\\x01' if g({f.name!r}, D{i}) else b'\\x00')")
        elif f.type == "[]" and f.fields is not None:
            ns[f"W{i}"] = _writer_for(f.fields, version, flexible)
            lines.append(f"    _write_array(out, g({f.name!r}, D{i}), {flexible}, "
                         f"{f.is_nullable(version)}, W{i})")
        else:
            lines.append(f"    _write_value(out, g({f.name!r}, D{i}), F{i}.type, {flexible}, "
                         f"{f.is_nullable(version)}, F{i}.fields, {version})")
    flush()
    if flexible:
        if tagged:
            ns["TAGGED"] = tagged
            lines.append(f"    _write_tagged(out, g, TAGGED, {version})")
        else:
            lines.append("    out.append(b'\\x00')")
    exec("\n".join(lines), ns)  # noqa: S102 - source built above from the message table
    return ns["write"]


def _writer_for(fields: tuple[Field, ...], version: int, flexible: bool) -> Any:
    return _compiled(_WRITERS, _compile_writer, fields, version, flexible)


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestReceived:
    """One decoded request: header fields and the body (a :class:`Data`)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Data
    size: int
    client_host: str = ""
    """The client's address as Kafka names it (``/127.0.0.1``); empty when unknown."""
    principal: str | None = None
    """The connection's authenticated role (Kafka's ``RequestContext.principal``), set by
    the session; None while authentication is off."""

    @property
    def api_name(self) -> str:
        return APIS[self.api_key].name


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslTokenReceived:
    """A SASL token sent unframed, after a SaslHandshake v0 (KIP-43): answered with
    :meth:`KafkaConnection.send_sasl_token`."""

    token: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class UnsupportedRequest:
    """An ApiVersions request at a version not served; answer UNSUPPORTED_VERSION (see
    :meth:`KafkaConnection.unsupported_response`)."""

    api_key: int
    api_version: int
    correlation_id: int


class KafkaConnection:
    """The server side of one Kafka connection (see the module docs).

    Small frames collect in one buffer. A frame of :data:`LARGE_FRAME` bytes or more gets a
    buffer of its own as soon as its size prefix is in, and :meth:`receive_buffer` offers
    room after the bytes received so far, so the caller can read the socket straight into
    it. The size prefix is only a claim: the frame's buffer grows with what arrives, the
    room offered being at most as large as what is already in (and at least
    :data:`LARGE_FRAME`), so a client that announces a large frame and sends little of it
    holds little; growing by doubling keeps the copying linear in the frame. Either way a
    request is decoded from a view of the bytes as they arrived: a produce request's records
    are copied once, out of the frame, and nothing else of it is."""

    def __init__(self, max_request_size: int = DEFAULT_MAX_REQUEST_SIZE, client_host: str = ""):
        self.max_request_size = max_request_size
        self.client_host = client_host
        self._buf = bytearray()
        # The large frame under way: its first ``_filled`` bytes arrived, the rest of the
        # buffer is room for the next read; ``_size`` is what its prefix announced.
        self._frame: bytearray | None = None
        self._size = 0
        self._filled = 0
        #: Set by the server once it answered a SaslHandshake v0: the next frame is an
        #: unframed SASL token, not a request.
        self.expect_sasl_token = False

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        frame = self._frame
        if frame is not None:
            n = min(len(data), self._size - self._filled)
            # Overwrites the room, and grows the buffer past it as needed.
            frame[self._filled:self._filled + n] = data[:n]
            self._filled += n
            if n == len(data):
                return
            data = data[n:]
        self._buf += data

    def receive_buffer(self) -> memoryview | None:
        """Room after the large frame's bytes received so far, for the caller to read into
        (then :meth:`received_into`, the view released first, as the buffer may grow);
        None when no large frame is under way."""
        frame = self._frame
        if frame is None or self._filled == self._size:
            return None
        if self._filled == len(frame):
            missing = self._size - self._filled
            frame.extend(bytes(min(missing, max(self._filled, LARGE_FRAME))))
        return memoryview(frame)[self._filled:]

    def received_into(self, n: int) -> None:
        """``n`` bytes were written at the start of :meth:`receive_buffer`'s view."""
        assert self._frame is not None and 0 <= n <= len(self._frame) - self._filled
        self._filled += n

    @property
    def buffered(self) -> int:
        return len(self._buf) + self._filled

    def next_event(self) -> RequestReceived | UnsupportedRequest | SaslTokenReceived | Any:
        if self.expect_sasl_token:
            return self._next_sasl_token()
        frame = self._frame
        if frame is not None:
            if self._filled < self._size:
                return NEED_DATA
            self._frame, self._size, self._filled = None, 0, 0
            return _parse_view(frame, 0, len(frame), self.client_host)
        buf = self._buf
        if len(buf) < 4:
            return NEED_DATA
        size = _I32.unpack_from(buf, 0)[0]
        if size < 8 or size > self.max_request_size:
            raise RemoteProtocolError(
                f"request size {size} outside 8..{self.max_request_size}", ErrorCode.INVALID_REQUEST)
        if len(buf) < 4 + size:
            if size >= LARGE_FRAME:
                # What arrived, not what the prefix claims (see the class docs).
                self._frame = bytearray(memoryview(buf)[4:])
                self._size, self._filled = size, len(buf) - 4
                buf.clear()
            return NEED_DATA
        try:
            event = _parse_view(buf, 4, 4 + size, self.client_host)
        except RemoteProtocolError:
            # The connection ends. The error's traceback may still hold views of the
            # buffer, which therefore cannot shrink: let it go instead.
            self._buf = bytearray()
            raise
        del buf[:4 + size]
        return event

    def _next_sasl_token(self) -> SaslTokenReceived | Any:
        buf = self._buf
        if len(buf) < 4:
            return NEED_DATA
        size = _I32.unpack_from(buf, 0)[0]
        if not 0 <= size <= MAX_SASL_TOKEN:
            raise RemoteProtocolError(f"SASL token size {size} outside 0..{MAX_SASL_TOKEN}",
                                      ErrorCode.ILLEGAL_SASL_STATE)
        if len(buf) < 4 + size:
            return NEED_DATA
        token = bytes(buf[4:4 + size])
        del buf[:4 + size]
        self.expect_sasl_token = False
        return SaslTokenReceived(token=token)

    def send_sasl_token(self, token: bytes) -> bytes:
        """An unframed SASL token (the answer to a :class:`SaslTokenReceived`)."""
        return _I32.pack(len(token)) + token

    def send_response(self, request: RequestReceived, body: Any) -> bytes:
        return _size_prefixed(_response(request, body))

    def send_response_parts(self, request: RequestReceived, body: Any) -> list[bytes]:
        """The response frame as pieces to be written back to back (a vectored send):
        the record batches of a fetch are pieces of their own, not copied into the frame;
        everything between them is joined."""
        return _pieces(_response(request, body))

    def unsupported_response(self, request: UnsupportedRequest) -> bytes:
        """UNSUPPORTED_VERSION in ApiVersions' v0 layout, with the served table (so the
        client can pick a version), as Kafka answers (``RequestContext``: an unsupported
        ApiVersions request is answered as v0)."""
        parts = [_I32.pack(request.correlation_id)]
        _write_struct(parts, Data(error_code=ErrorCode.UNSUPPORTED_VERSION,
                                  api_keys=api_versions_table()),
                      APIS[API_VERSIONS].response, 0, False)
        return _size_prefixed(parts)


def _response(request: RequestReceived, body: Any) -> list[bytes]:
    """A response's header and body as parts, unframed."""
    spec = APIS[request.api_key]
    flexible = spec.is_flexible(request.api_version)
    parts = [_I32.pack(request.correlation_id)]
    if flexible and request.api_key != API_VERSIONS:
        parts.append(b"\x00")
    _write_struct(parts, body, spec.response, request.api_version, flexible)
    return parts


def _size_prefixed(parts: list[bytes]) -> bytes:
    """A frame in one piece: the parts' total size, then the parts, joined once."""
    return b"".join([_I32.pack(sum(map(len, parts))), *parts])


def _pieces(parts: list[bytes]) -> list[bytes]:
    """A frame as few pieces: its size, then the parts, runs of small ones joined and
    those of :data:`LARGE_PIECE` bytes or more kept as they are."""
    out: list[bytes] = []
    run: list[bytes] = [_I32.pack(sum(map(len, parts)))]
    for p in parts:
        if len(p) >= LARGE_PIECE:
            out.append(b"".join(run))
            out.append(p)
            run = []
        else:
            run.append(p)
    if run:
        out.append(b"".join(run))
    return out


def _parse_view(buf: bytearray, start: int, end: int,
                client_host: str) -> RequestReceived | UnsupportedRequest:
    """Decode the frame at ``buf[start:end]`` through a view, released before the caller
    may resize ``buf`` (fields that keep bytes copy them out)."""
    with memoryview(buf) as whole, whole[start:end] as view:
        return parse_request(view, client_host)


def parse_request(frame: bytes | memoryview,
                  client_host: str = "") -> RequestReceived | UnsupportedRequest:
    """Decode one request frame (without its size prefix). An API key or version not
    served raises :class:`RemoteProtocolError` (``UNSUPPORTED_VERSION``), but for
    ApiVersions (see the module docs)."""
    r = _Reader(frame)
    api_key = r.unpack(_I16)
    api_version = r.unpack(_I16)
    correlation_id = r.unpack(_I32)
    spec = APIS.get(api_key)
    if spec is None or not spec.min_version <= api_version <= spec.max_version:
        if api_key == API_VERSIONS:
            return UnsupportedRequest(api_key=api_key, api_version=api_version,
                                      correlation_id=correlation_id)
        raise RemoteProtocolError(f"API key {api_key} version {api_version} is not served",
                                  ErrorCode.UNSUPPORTED_VERSION)
    client_id = _read_string(r, False, True)
    if spec.is_flexible(api_version):
        _read_tagged(r, {}, {}, api_version)
    # Bytes after the body are ignored, as Kafka brokers do: librdkafka sends a few after
    # some Metadata requests.
    body = decode_body(spec, api_version, frame, offset=r.pos, strict=False)
    return RequestReceived(api_key=api_key, api_version=api_version,
                           correlation_id=correlation_id, client_id=client_id, body=body,
                           size=len(frame), client_host=client_host)


# --------------------------------------------------------------------------- client side


def encode_request(api_key: int, api_version: int, correlation_id: int,
                   client_id: str | None, body: Any) -> bytes:
    """Frame a request as a client would (tests and tools use it)."""
    spec = APIS[api_key]
    parts = [_I16.pack(api_key), _I16.pack(api_version), _I32.pack(correlation_id)]
    _write_value(parts, client_id, "string", False, True, None, api_version)
    if spec.is_flexible(api_version):
        parts.append(b"\x00")
    _write_struct(parts, body, spec.request, api_version, spec.is_flexible(api_version))
    return _size_prefixed(parts)


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Data]:
    """Decode a response frame (without its size prefix): (correlation id, body)."""
    spec = APIS[api_key]
    r = _Reader(frame)
    correlation_id = r.unpack(_I32)
    if spec.is_flexible(api_version) and api_key != API_VERSIONS:
        _read_tagged(r, {}, {}, api_version)
    return correlation_id, decode_body(spec, api_version, frame, response=True, offset=r.pos)


def topic_uuid(name: str) -> bytes:
    """A stable topic id derived from the topic's full name."""
    return uuid.uuid5(uuid.NAMESPACE_URL, name).bytes


def iter_frames(data: bytes) -> Iterable[bytes]:
    """Split a byte string of size-prefixed frames (tests and tools)."""
    pos = 0
    while pos + 4 <= len(data):
        size = _I32.unpack_from(data, pos)[0]
        yield data[pos + 4:pos + 4 + size]
        pos += 4 + size
