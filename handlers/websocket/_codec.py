"""Pulsar's WebSocket API, sans-IO: the endpoint a request path names, the query parameters
each endpoint takes, and the JSON of every frame both ways.

Nothing here does I/O. The WebSocket framing itself (RFC 6455) is the web server's
(hypercorn's wsproto); what rides in each text frame is Pulsar's JSON, decoded into the
small typed vocabulary below under the names Pulsar's ``org.apache.pulsar.websocket.data``
gives it (``ProducerMessage``, ``ProducerAck``, ``ConsumerCommand``, ``ConsumerMessage``,
``EndOfTopicResponse``). A malformed frame is a :class:`FrameError` carrying Pulsar's
``WebSocketError`` code, never an exception of another kind.

Message ids travel as base64 of a serialized ``MessageIdData``, as Pulsar's
``MessageIdImpl.toByteArray`` writes it: ledger and entry, the partition on a partitioned
topic, a batch message's index, and the batch size (0 for a message that is not in a
batch). Times travel as ISO-8601 text with the broker's UTC offset (Pulsar's
``DateFormatter``).
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from core.format import (
    LZ4,
    NONE,
    SNAPPY,
    ZLIB,
    ZSTD,
    EntryFormatError,
    Message,
    MessageIdData,
    MessageMetadata,
    SingleMessageMetadata,
    ack_set,
    compress,
    decode_entry,
    encode_entry,
    entry_from_messages,
    iter_batch,
)
from core.hashing import murmur3_32
from core.naming import InvalidNameError, NamespaceName, TopicName, is_valid_name

__all__ = [
    "DEFAULT_BATCHING_MAX_BYTES",
    "DEFAULT_RECEIVER_QUEUE_SIZE",
    "Chunk",
    "ConsumerCommand",
    "ConsumerParams",
    "Delivered",
    "Endpoint",
    "FrameError",
    "InvalidParams",
    "Kind",
    "MessageId",
    "ProducerMessage",
    "ProducerParams",
    "ReaderParams",
    "WebSocketError",
    "Undecryptable",
    "ack_set_without",
    "choose_partition",
    "chunked_message",
    "consumer_messages",
    "decode_consumer_command",
    "decode_message_id",
    "decode_producer_message",
    "encode_message_id",
    "encryption_context",
    "end_of_topic",
    "format_time",
    "java_string_hash",
    "parse_endpoint",
    "parse_time",
    "producer_ack",
    "producer_batch_entry",
    "producer_entry",
    "producer_error",
]

DEFAULT_RECEIVER_QUEUE_SIZE = 1000
"""A consumer's or reader's receive queue when the request names none, and the largest
one it may name (Pulsar's WebSocket handlers cap ``receiverQueueSize`` at 1000)."""

DEFAULT_BATCHING_MAX_MESSAGES = 1000
DEFAULT_BATCHING_MAX_DELAY_MS = 1
DEFAULT_BATCHING_MAX_BYTES = 128 * 1024
"""A batching producer's batch closes at this many messages, this many ms after its first,
or this many payload bytes, unless the request says (Pulsar's client defaults)."""

DEFAULT_SEND_TIMEOUT_MS = 30_000
"""How long a producer's message may wait to be stored before it is answered with a
failure, unless the request says (``sendTimeoutMillis``; 0 waits as long as it takes)."""

DEFAULT_NACK_DELAY_MS = 60_000
"""How long a negatively acknowledged message waits to be delivered again when the request
does not say (``negativeAckRedeliveryDelay``; Pulsar's client default)."""

MIN_ACK_TIMEOUT_MS = 1000
"""The shortest ``ackTimeoutMillis`` Pulsar's client takes (0 turns it off)."""

_UINT64 = 1 << 64
_LATEST_LEDGER = (1 << 63) - 1


class WebSocketError(enum.IntEnum):
    """Pulsar's ``WebSocketError`` codes (``send-error:<code>`` in a producer's answer)."""

    FailedToCreateProducer = 1
    FailedToSubscribe = 2
    FailedToDeserializeFromJSON = 3
    FailedToSerializeToJSON = 4
    AuthenticationError = 5
    NotAuthorizedError = 6
    PayloadEncodingError = 7
    UnknownError = 8

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    WebSocketError.FailedToCreateProducer: "Failed to create producer",
    WebSocketError.FailedToSubscribe: "Failed to subscribe",
    WebSocketError.FailedToDeserializeFromJSON: "Failed to de-serialize from JSON",
    WebSocketError.FailedToSerializeToJSON: "Failed to serialize to JSON",
    WebSocketError.AuthenticationError: "Failed to authenticate client",
    WebSocketError.NotAuthorizedError: "Client is not authorized",
    WebSocketError.PayloadEncodingError: "Invalid payload encoding",
    WebSocketError.UnknownError: "Unknown error",
}


class InvalidParams(ValueError):
    """A request path or query parameter Pulsar refuses (its ``IllegalArgumentException``:
    the handshake is answered 400, "Invalid query params: ...")."""


@dataclass(frozen=True, slots=True)
class FrameError(Exception):
    """A text frame that cannot be taken: Pulsar's error ``code``, its message and the
    request's context, when it was read."""

    code: WebSocketError
    message: str | None
    context: str | None = None


# -- endpoints -----------------------------------------------------------------------------


class Kind(enum.Enum):
    producer = "producer"
    consumer = "consumer"
    reader = "reader"
    pingpong = "pingpong"


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """What a request path names: the kind of handler, its topic and (a consumer) its
    subscription. A v1 path names its topic with a cluster (``v1_topic``, Pulsar's
    ``persistent://tenant/cluster/namespace/topic``) and has no ``topic``: this broker
    keeps no namespaces under a cluster (see :mod:`core.naming`), so such a topic cannot
    exist here and the handshake is refused as Pulsar refuses a topic of a namespace that
    does not exist."""

    kind: Kind
    topic: TopicName | None = None
    subscription: str = ""
    v1_topic: str | None = None


def parse_endpoint(raw_path: str) -> Endpoint | None:
    """The endpoint of a request path as sent (percent-encoding intact); None for a path
    that names no WebSocket endpoint. Pulsar's paths
    (``AbstractWebSocketHandler.extractTopicName``), v2:
    ``/ws/v2/{producer,reader}/{domain}/{tenant}/{namespace}/{topic...}`` and
    ``/ws/v2/consumer/{domain}/{tenant}/{namespace}/{topic...}/{subscription}``; v1, the
    same without ``v2`` and with the cluster after the tenant:
    ``/ws/{producer,reader}/{domain}/{tenant}/{cluster}/{namespace}/{topic...}`` and
    ``/ws/consumer/{domain}/{tenant}/{cluster}/{namespace}/{topic...}/{subscription}``. The
    topic name's own ``/`` are joined back and percent-decoded once. And ``/ws/pingpong``
    (or ``/ws/v2/pingpong``).

    Raises :class:`InvalidParams` for a path under an endpoint that names its topic wrongly
    (too few parts, another domain, an empty subscription, an invalid name)."""
    parts = raw_path.split("?", 1)[0].split("/")
    if parts in (["", "ws", "pingpong"], ["", "ws", "v2", "pingpong"]):
        return Endpoint(kind=Kind.pingpong)
    if len(parts) < 3 or parts[1] != "ws":
        return None
    v2 = parts[2] == "v2"
    at = 3 if v2 else 2  # where the kind is; the domain follows it
    try:
        kind = Kind(parts[at])
    except (ValueError, IndexError):
        return None
    if kind is Kind.pingpong:
        return None
    if len(parts) < 8:
        raise InvalidParams("Invalid topic name format")
    domain = parts[at + 1]
    if domain not in ("persistent", "non-persistent"):
        raise InvalidParams(f"Invalid topic domain: {unquote(domain)}")
    subscription = ""
    end = len(parts)
    if kind is Kind.consumer:
        if len(parts) < 9:
            raise InvalidParams("Invalid topic name format")
        subscription = unquote(parts[-1])
        if not subscription:
            raise InvalidParams("Empty subscription name")
        end -= 1
    # as Pulsar joins the topic name's segments: empty ones (a doubled /) are skipped
    local = unquote("/".join([parts[7], *(p for p in parts[8:end] if p)]))
    names = [unquote(p) for p in parts[at + 2:7]]  # tenant, namespace; v1: tenant, cluster, namespace
    try:
        if not v2:
            for what, name in zip(("tenant", "cluster", "namespace"), names, strict=True):
                if not is_valid_name(name):
                    raise InvalidNameError(f"Invalid {what} name: {name!r}")
            TopicName.parse(f"{domain}://{names[0]}/{names[2]}/{local}")  # the same rules for the rest
            return Endpoint(kind=kind, subscription=subscription,
                            v1_topic=f"{domain}://{'/'.join(names)}/{local}")
        ns = NamespaceName(*names)
        NamespaceName.parse(str(ns))
        topic = TopicName.parse(f"{domain}://{ns}/{local}")
    except InvalidNameError as exc:
        raise InvalidParams(str(exc)) from None
    return Endpoint(kind=kind, topic=topic, subscription=subscription)


# -- query parameters ------------------------------------------------------------------------


def _query(query_string: bytes | str) -> dict[str, str]:
    """Query parameters, the first value of each (as Pulsar's handlers read them)."""
    text = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
    out: dict[str, str] = {}
    for k, v in parse_qsl(text, keep_blank_values=True):
        out.setdefault(k, v)
    return out


def _int(params: Mapping[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidParams(f"For input string: \"{raw}\" ({name})") from None


def _choice(params: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = params.get(name)
    if raw is None:
        return default
    if raw not in choices:
        raise InvalidParams(f"Invalid {name} {raw}")
    return raw


_COMPRESSION = {"NONE": NONE, "LZ4": LZ4, "ZLIB": ZLIB, "ZSTD": ZSTD, "SNAPPY": SNAPPY}
ROUTING_MODES = ("RoundRobinPartition", "SinglePartition", "CustomPartition")
HASHING_SCHEMES = ("JavaStringHash", "Murmur3_32Hash")
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
SUBSCRIPTION_MODES = ("Durable", "NonDurable")
CRYPTO_FAILURE_ACTIONS = ("FAIL", "DISCARD", "CONSUME")


def _crypto_failure_action(p: Mapping[str, str]) -> str:
    """``cryptoFailureAction``: what a consumer or reader does with a message its
    producer encrypted, which it has no key to open (the broker holds none). Pulsar's
    handlers log a value they do not know and keep the default, FAIL."""
    raw = p.get("cryptoFailureAction", "FAIL")
    return raw if raw in CRYPTO_FAILURE_ACTIONS else "FAIL"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerParams:
    """The producer endpoint's query parameters that change what reaches the topic.
    Pulsar's WebSocket producer does not batch unless asked, and routes by
    ``SinglePartition`` (a custom router cannot be named over WebSocket)."""

    producer_name: str | None = None
    initial_sequence_id: int | None = None
    hashing_scheme: str = "JavaStringHash"
    routing_mode: str = "SinglePartition"
    compression: int = NONE
    max_pending_messages: int = 0
    encryption_keys: str | None = None
    batching: bool = False
    batching_max_messages: int = DEFAULT_BATCHING_MAX_MESSAGES
    batching_max_delay_ms: int = DEFAULT_BATCHING_MAX_DELAY_MS
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS

    @classmethod
    def parse(cls, query_string: bytes | str) -> ProducerParams:
        p = _query(query_string)
        send_timeout = _int(p, "sendTimeoutMillis", DEFAULT_SEND_TIMEOUT_MS)
        _check(send_timeout >= 0, "sendTimeout needs to be >= 0")
        max_messages = _int(p, "batchingMaxMessages", DEFAULT_BATCHING_MAX_MESSAGES)
        max_delay = _int(p, "batchingMaxPublishDelay", DEFAULT_BATCHING_MAX_DELAY_MS)
        _check(max_messages > 0, "batchingMaxMessages needs to be > 0")
        _check(max_delay >= 0, "configured value for batch delay must be at least 1ms")
        initial = p.get("initialSequenceId")
        routing = _choice(p, "messageRoutingMode", ROUTING_MODES, "SinglePartition")
        return cls(
            producer_name=p.get("producerName") or None,
            initial_sequence_id=_int(p, "initialSequenceId", 0) if initial is not None else None,
            hashing_scheme=_choice(p, "hashingScheme", HASHING_SCHEMES, "JavaStringHash"),
            routing_mode="SinglePartition" if routing == "CustomPartition" else routing,
            compression=_COMPRESSION[_choice(p, "compressionType", tuple(_COMPRESSION), "NONE")],
            max_pending_messages=max(0, _int(p, "maxPendingMessages", 0)),
            encryption_keys=p.get("encryptionKeys"),
            batching=p.get("batchingEnabled", "").lower() == "true",  # Java's parseBoolean
            batching_max_messages=max_messages,
            batching_max_delay_ms=max_delay,
            send_timeout_ms=send_timeout,
        )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidParams(message)


def _receiver_queue_size(p: Mapping[str, str]) -> int:
    return min(_int(p, "receiverQueueSize", DEFAULT_RECEIVER_QUEUE_SIZE), DEFAULT_RECEIVER_QUEUE_SIZE)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerParams:
    subscription_type: str = "Exclusive"
    durable: bool = True
    receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE
    consumer_name: str | None = None
    priority_level: int = 0
    ack_timeout_ms: int = 0
    nack_delay_ms: int = DEFAULT_NACK_DELAY_MS
    max_redeliver_count: int = 0
    dead_letter_topic: str | None = None
    pull_mode: bool = False
    crypto_failure_action: str = "FAIL"

    @classmethod
    def parse(cls, query_string: bytes | str, topic: TopicName, subscription: str) -> ConsumerParams:
        p = _query(query_string)
        max_redeliver = _int(p, "maxRedeliverCount", 0)
        dlq = p.get("deadLetterTopic")
        if dlq is None and "maxRedeliverCount" in p:
            dlq = f"{topic}-{subscription}-DLQ"  # Pulsar's WebSocket handler's default
        # the checks Pulsar's ConsumerBuilder makes of these
        ack_timeout = _int(p, "ackTimeoutMillis", 0)
        _check(ack_timeout == 0 or ack_timeout >= MIN_ACK_TIMEOUT_MS,
               f"Ack timeout should be greater than {MIN_ACK_TIMEOUT_MS} ms")
        nack_delay = _int(p, "negativeAckRedeliveryDelay", DEFAULT_NACK_DELAY_MS)
        _check(nack_delay >= 0, "redeliveryDelay needs to be >= 0")
        priority = _int(p, "priorityLevel", 0)
        _check(priority >= 0, "priorityLevel needs to be >= 0")
        queue = _receiver_queue_size(p)
        _check(queue >= 0, "receiverQueueSize needs to be >= 0")
        _check(dlq is None or max_redeliver > 0, "MaxRedeliverCount must be > 0.")
        return cls(
            subscription_type=_choice(p, "subscriptionType", SUBSCRIPTION_TYPES, "Exclusive"),
            durable=_choice(p, "subscriptionMode", SUBSCRIPTION_MODES, "Durable") == "Durable",
            receiver_queue_size=queue,
            consumer_name=p.get("consumerName") or None,
            priority_level=priority,
            ack_timeout_ms=ack_timeout,
            nack_delay_ms=nack_delay,
            max_redeliver_count=max_redeliver if dlq is not None else 0,
            dead_letter_topic=dlq,
            pull_mode=p.get("pullMode", "").lower() == "true",
            crypto_failure_action=_crypto_failure_action(p),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderParams:
    reader_name: str | None = None
    receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE
    start: str | MessageId = "latest"
    crypto_failure_action: str = "FAIL"

    @classmethod
    def parse(cls, query_string: bytes | str) -> ReaderParams:
        p = _query(query_string)
        raw = p.get("messageId", "").strip()
        start: str | MessageId = "latest"
        if raw == "earliest":
            start = "earliest"
        elif raw and raw != "latest":
            try:
                start = decode_message_id(raw)
            except FrameError as exc:
                raise InvalidParams(exc.message or "Invalid messageId") from None
        return cls(reader_name=p.get("readerName") or None,
                   receiver_queue_size=_receiver_queue_size(p), start=start,
                   crypto_failure_action=_crypto_failure_action(p))


# -- message ids ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageId:
    """A message id as the WebSocket API carries it; ``partition`` and ``batch_index`` -1
    when absent."""

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1
    batch_size: int = 0
    first_chunk: MessageId | None = None
    """A chunked message's id is its last chunk's, with its first chunk's id."""


def _id_data(mid: MessageId) -> MessageIdData:
    data = MessageIdData(ledgerId=mid.ledger_id % _UINT64, entryId=mid.entry_id % _UINT64,
                         batch_size=mid.batch_size)
    if mid.partition >= 0:
        data.partition = mid.partition
    if mid.batch_index >= 0:
        data.batch_index = mid.batch_index
    if mid.first_chunk is not None:
        data.first_chunk_message_id.CopyFrom(_id_data(mid.first_chunk))
    return data


def encode_message_id(mid: MessageId) -> str:
    """Base64 of the ``MessageIdData`` Pulsar's ``toByteArray`` writes: a batch size is
    always there (0 outside a batch), a partition only on a partitioned topic, a chunked
    message's first chunk's id (``ChunkMessageIdImpl``)."""
    return base64.b64encode(_id_data(mid).SerializeToString()).decode("ascii")


def _signed(value: int) -> int:
    return value - _UINT64 if value > _LATEST_LEDGER else value


def _message_id(data: MessageIdData) -> MessageId:
    first = _message_id(data.first_chunk_message_id) if data.HasField("first_chunk_message_id") else None
    return MessageId(_signed(data.ledgerId), _signed(data.entryId), data.partition, data.batch_index,
                     data.batch_size, first)


def _b64decode(text: str) -> bytes:
    """Strict base64 as Java's ``Base64.getDecoder()`` reads it: the basic alphabet, the
    padding optional."""
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def decode_message_id(text: Any) -> MessageId:
    if not isinstance(text, str):
        raise FrameError(WebSocketError.FailedToDeserializeFromJSON, "messageId is not a string")
    try:
        data = MessageIdData()
        data.ParseFromString(_b64decode(text))
        data.SerializeToString()  # the required ledger and entry ids are there
    except Exception as exc:
        raise FrameError(WebSocketError.FailedToDeserializeFromJSON,
                         f"Invalid message id {text!r}: {exc}") from None
    return _message_id(data)


# -- times ------------------------------------------------------------------------------------------


def format_time(epoch_ms: int) -> str:
    """Pulsar's ``DateFormatter.format``: ISO-8601 with the broker's offset, the fraction
    of a second as long as it needs to be (none on a whole second)."""
    t = datetime.fromtimestamp(epoch_ms / 1000).astimezone()
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    ms = epoch_ms % 1000
    if ms:
        text += f".{ms:03d}".rstrip("0")
    offset = t.strftime("%z")
    return text + ("Z" if offset in ("+0000", "") else f"{offset[:3]}:{offset[3:]}")


def parse_time(text: str) -> int:
    """Pulsar's ``DateFormatter.parse``: ISO-8601 with an offset, to epoch ms."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"Text '{text}' could not be parsed") from None
    if t.tzinfo is None:
        raise ValueError(f"Text '{text}' could not be parsed: no offset")
    return int(t.timestamp() * 1000)


# -- producer frames --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerMessage:
    """One message to publish (Pulsar's ``ProducerMessage``)."""

    payload: bytes
    properties: dict[str, str] = field(default_factory=dict)
    context: str | None = None
    key: str | None = None
    replication_clusters: list[str] | None = None
    event_time: int | None = None
    deliver_at: int = 0
    deliver_after_ms: int = 0


def _text(value: Any) -> str | None:
    """A JSON value where Pulsar reads a string: numbers and booleans are taken as text, as
    Jackson takes them."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise TypeError(f"Cannot deserialize a String from {type(value).__name__}")


def _long(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"Cannot deserialize a long from {value!r}")
    return int(value)


def _json_object(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FrameError(WebSocketError.FailedToDeserializeFromJSON, str(exc)) from None
    if not isinstance(obj, dict):
        raise FrameError(WebSocketError.FailedToDeserializeFromJSON,
                         f"Cannot deserialize from a JSON {type(obj).__name__}")
    return obj


def decode_producer_message(text: str) -> ProducerMessage:
    """A producer's text frame; :class:`FrameError` as Pulsar's producer answers it:
    JSON it cannot read is error 3, a payload that is missing or not base64, or an event
    time it cannot parse, error 7."""
    obj = _json_object(text)
    try:
        context = _text(obj.get("context"))
        props = obj.get("properties")
        if props is not None and not isinstance(props, dict):
            raise TypeError("properties is not an object")
        properties = {str(k): t for k, v in (props or {}).items() if (t := _text(v)) is not None}
        clusters = obj.get("replicationClusters")
        if clusters is not None and not isinstance(clusters, list):
            raise TypeError("replicationClusters is not an array")
        key = _text(obj.get("key"))
        event_text = _text(obj.get("eventTime"))
        deliver_at, deliver_after = _long(obj.get("deliverAt")), _long(obj.get("deliverAfterMs"))
        payload_text = _text(obj.get("payload"))
    except (TypeError, ValueError) as exc:
        raise FrameError(WebSocketError.FailedToDeserializeFromJSON, str(exc)) from None
    if payload_text is None:
        raise FrameError(WebSocketError.PayloadEncodingError, None, context)
    try:
        payload = _b64decode(payload_text)
    except (binascii.Error, ValueError) as exc:
        raise FrameError(WebSocketError.PayloadEncodingError,
                         f"Invalid Base64 message-payload error={exc}", context) from None
    event_time = None
    if event_text is not None:
        try:
            event_time = parse_time(event_text)
        except ValueError as exc:
            raise FrameError(WebSocketError.PayloadEncodingError, str(exc), context) from None
    return ProducerMessage(payload=payload, properties=properties, context=context, key=key,
                           replication_clusters=[str(c) for c in clusters] if clusters else None,
                           event_time=event_time, deliver_at=deliver_at,
                           deliver_after_ms=deliver_after)


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def producer_ack(message_id: str, context: str | None) -> str:
    """A publish stored: Pulsar's ``ProducerAck`` (its null fields left out, its two
    numbers always there)."""
    out: dict[str, Any] = {"result": "ok", "messageId": message_id}
    if context is not None:
        out["context"] = context
    return _dumps({**out, "errorCode": 0, "schemaVersion": 0})


def producer_error(code: WebSocketError, message: str | None, context: str | None) -> str:
    out: dict[str, Any] = {"result": f"send-error:{int(code)}"}
    if message is not None:
        out["errorMsg"] = message
    if context is not None:
        out["context"] = context
    return _dumps({**out, "errorCode": 0, "schemaVersion": 0})


def producer_entry(msg: ProducerMessage, *, producer_name: str, sequence_id: int,
                   publish_time: int, compression: int = NONE) -> bytes:
    """The entry one message is stored as: a plain (non-batch) entry, as Pulsar's
    WebSocket producer sends without batching."""
    md = MessageMetadata(producer_name=producer_name, sequence_id=sequence_id,
                         publish_time=publish_time)
    for k, v in msg.properties.items():
        md.properties.add(key=k, value=v)
    if msg.key is not None:
        md.partition_key = msg.key
    if msg.event_time:
        md.event_time = msg.event_time
    if msg.replication_clusters:
        md.replicate_to.extend(msg.replication_clusters)
    if msg.deliver_after_ms > 0:
        md.deliver_at_time = publish_time + msg.deliver_after_ms
    elif msg.deliver_at > 0:
        md.deliver_at_time = msg.deliver_at
    payload = msg.payload
    if compression != NONE and payload:
        md.compression = compression  # type: ignore[assignment]
        md.uncompressed_size = len(payload)
        payload = compress(compression, payload)
    return encode_entry(md, payload)


def producer_batch_entry(msgs: list[ProducerMessage], *, producer_name: str, sequence_id: int,
                         publish_time: int, compression: int = NONE) -> bytes:
    """The batch entry of a batching producer's messages, their sequence ids counted from
    ``sequence_id`` (messages with a delivery time are never batched, as Pulsar's
    producer sends them on their own)."""
    return entry_from_messages(
        [Message(payload=m.payload, key=m.key, properties=m.properties, event_time=m.event_time,
                 sequence_id=sequence_id + i) for i, m in enumerate(msgs)],
        producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time,
        compression=compression, batched=True)


# -- partition routing ------------------------------------------------------------------------------


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def choose_partition(key: str | None, partitions: int, scheme: str, fallback: int) -> int:
    """The partition a keyed message goes to, as Pulsar's routers pick it (the key's hash,
    ``& Integer.MAX_VALUE``, modulo the partitions); ``fallback`` for a message without a
    key."""
    if key is None:
        return fallback
    if scheme == "Murmur3_32Hash":
        h = murmur3_32(key.encode()) & 0x7FFFFFFF
    else:
        h = java_string_hash(key) & 0x7FFFFFFF
    return h % partitions


# -- consumer frames -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerCommand:
    """A consumer's or reader's text frame (Pulsar's ``ConsumerCommand``): an ack when
    ``type`` is absent (or any other word), else ``permit``, ``unsubscribe``,
    ``negativeAcknowledge`` or ``isEndOfTopic``."""

    type: str | None = None
    message_id: str | None = None
    permit_messages: int | None = None


def decode_consumer_command(text: str) -> ConsumerCommand:
    obj = _json_object(text)
    try:
        permits = obj.get("permitMessages")
        if permits is not None and (isinstance(permits, bool) or not isinstance(permits, int)):
            permits = int(str(permits))
        return ConsumerCommand(type=_text(obj.get("type")), message_id=_text(obj.get("messageId")),
                               permit_messages=permits)
    except (TypeError, ValueError) as exc:
        raise FrameError(WebSocketError.FailedToDeserializeFromJSON, str(exc)) from None


def end_of_topic(reached: bool) -> str:
    return _dumps({"endOfTopic": reached})


@dataclass(frozen=True, slots=True)
class Delivered:
    """One message of an entry as the session sends it: its id, and the frame."""

    message_id: MessageId
    frame: str


def _one(mid: MessageId, single: SingleMessageMetadata, payload: bytes, publish_time: int,
         redelivery_count: int, encryption_context: dict[str, Any] | None = None) -> Delivered:
    out: dict[str, Any] = {
        "messageId": encode_message_id(mid),
        "payload": base64.b64encode(payload).decode("ascii"),
        "properties": {kv.key: kv.value for kv in single.properties},
        "publishTime": format_time(publish_time),
        "redeliveryCount": redelivery_count,
    }
    if single.event_time:
        out["eventTime"] = format_time(single.event_time)
    if single.HasField("partition_key"):
        out["key"] = single.partition_key
    if encryption_context is not None:
        out["encryptionContext"] = encryption_context
    return Delivered(mid, _dumps(out))


_COMPRESSION_NAMES = {v: k for k, v in _COMPRESSION.items()}


def encryption_context(md: MessageMetadata) -> dict[str, Any]:
    """What Pulsar's consumer tells of an encrypted message it could not open
    (``EncryptionContext``, as its ``createEncryptionContext`` fills it): the data key
    encrypted under each of the producer's keys, the cipher's parameter (the IV), the
    algorithm, the compression applied before encryption, the size uncompressed, and the
    number of messages in an encrypted batch (null outside a batch). Bytes are base64, as
    Jackson writes a ``byte[]``."""
    return {
        "keys": {k.key: {"keyValue": base64.b64encode(k.value).decode("ascii"),
                         "metadata": {kv.key: kv.value for kv in k.metadata}}
                 for k in md.encryption_keys},
        "param": base64.b64encode(md.encryption_param).decode("ascii") if md.HasField("encryption_param") else None,
        "algorithm": md.encryption_algo if md.HasField("encryption_algo") else None,
        "compressionType": _COMPRESSION_NAMES.get(md.compression, "NONE"),
        "uncompressedMessageSize": md.uncompressed_size,
        "batchSize": md.num_messages_in_batch if md.HasField("num_messages_in_batch") else None,
    }


@dataclass(frozen=True, slots=True)
class Undecryptable:
    """An entry its producer encrypted, which a consumer with ``cryptoFailureAction``
    FAIL or DISCARD is not given: DISCARD acknowledges it, as Pulsar's consumer discards
    it (an acknowledgement with a decryption error); FAIL leaves it unacknowledged in the
    subscription's backlog."""

    discard: bool


def _encrypted(md: MessageMetadata, payload: bytes, mid: MessageId, redelivery_count: int,
               crypto_failure_action: str) -> list[Delivered] | Undecryptable:
    if crypto_failure_action != "CONSUME":
        return Undecryptable(discard=crypto_failure_action == "DISCARD")
    # as Pulsar's consumer delivers what it cannot open: the payload as stored (still
    # compressed, a batch still whole) under the entry's id, with its context
    single = SingleMessageMetadata(payload_size=len(payload))
    single.properties.extend(md.properties)
    if md.HasField("partition_key"):
        single.partition_key = md.partition_key
    if md.event_time:
        single.event_time = md.event_time
    return [_one(mid, single, payload, md.publish_time, redelivery_count, encryption_context(md))]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a message too large for one entry (its producer's chunking): the
    consumer puts the chunks of ``uuid`` together, in ``chunk_id`` order, before the
    message can be read."""

    uuid: str
    chunk_id: int
    num_chunks: int
    metadata: MessageMetadata
    payload: bytes


_CHUNK_FIELDS = ("uuid", "chunk_id", "num_chunks_from_msg", "total_chunk_msg_size")


def chunked_message(chunks: list[Chunk], first: MessageId, last: MessageId,
                    redelivery_count: int) -> Delivered | None:
    """The message ``chunks`` (all of them, in order) carry, as one ``ConsumerMessage``
    with the chunked message's id; None when it cannot be read."""
    whole = MessageMetadata()
    whole.CopyFrom(chunks[0].metadata)
    for name in _CHUNK_FIELDS:
        whole.ClearField(name)
    try:
        [single] = iter_batch(whole, b"".join(c.payload for c in chunks))
    except (EntryFormatError, ValueError):
        return None
    mid = MessageId(last.ledger_id, last.entry_id, last.partition, first_chunk=first)
    return _one(mid, single.metadata, single.payload, whole.publish_time, redelivery_count)


def consumer_messages(data: bytes, ledger_id: int, entry_id: int, partition: int,
                      redelivery_count: int, ack_set: list[int] | None = None,
                      crypto_failure_action: str = "FAIL") -> list[Delivered] | Chunk | Undecryptable:
    """The messages of a stored entry as Pulsar's ``ConsumerMessage`` frames, a batch's
    one by one with batch message ids; those ``ack_set`` marks acknowledged (a clear bit)
    left out, and none of an entry that cannot be read. A chunk of a larger message is
    returned as such, to be put together with the others. An encrypted entry (each chunk
    of a chunked message is encrypted on its own) is one message with its encryption
    context under ``cryptoFailureAction`` CONSUME, else :class:`Undecryptable`."""
    try:
        md, payload = decode_entry(data)
        if len(md.encryption_keys):
            return _encrypted(md, payload, MessageId(ledger_id, entry_id, partition), redelivery_count,
                              crypto_failure_action)
        if md.num_chunks_from_msg > 1 and md.HasField("uuid"):
            return Chunk(md.uuid, md.chunk_id, md.num_chunks_from_msg, md, payload)
        singles = iter_batch(md, payload)
    except EntryFormatError:
        return []
    batch = md.HasField("num_messages_in_batch")
    out: list[Delivered] = []
    for i, single in enumerate(singles):
        if batch and (single.metadata.compacted_out or (
                ack_set is not None and not (i // 64 < len(ack_set) and ack_set[i // 64] >> (i % 64) & 1))):
            continue
        mid = MessageId(ledger_id, entry_id, partition, i if batch else -1, len(singles) if batch else 0)
        out.append(_one(mid, single.metadata, single.payload, md.publish_time, redelivery_count))
    return out


def ack_set_without(batch_size: int, index: int) -> list[int]:
    """A batch's ack set with every message still to acknowledge but ``index``: words of
    64 bits, lowest first, as the signed longs Pulsar sends."""
    return ack_set(set(range(batch_size)) - {index}, batch_size)
