"""The events of the Pulsar binary protocol, one class per command, named as the spec names it.

Each event wraps the command's protobuf message (``event.command``) and reads through
to it, so ``event.producer_id`` is ``event.command.producer_id``.  Build one with keyword
fields: ``CommandSendReceipt.build(producer_id=1, sequence_id=7)``.  The two commands
that carry an entry after the command - :class:`CommandSend` and
:class:`CommandMessage` - also hold the entry bytes and their parsed metadata, and give
the payload after the metadata on request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from core.format import ENTRY_HEADER_SIZE
from core.format import pulsar_api_pb2 as pb

__all__ = [
    "COMMAND_EVENTS",
    "ConnectionClosed",
    "Event",
    "PulsarCommand",
]

_T = TypeVar("_T", bound="type[PulsarCommand]")

COMMAND_EVENTS: dict[int, type[PulsarCommand]] = {}
"""BaseCommand.Type value -> the event class for that command."""

_FIELD_OF_MESSAGE = {
    f.message_type.name: f.name
    for f in pb.BaseCommand.DESCRIPTOR.fields
    if f.message_type is not None
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Anything :meth:`PulsarConnection.next_event` returns or ``send`` accepts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionClosed(Event):
    """The peer closed its side of the connection at a frame boundary."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PulsarCommand(Event):
    """A command frame: ``command`` is the protobuf body (``pb.CommandXxx``)."""

    TYPE: ClassVar[int]
    FIELD: ClassVar[str]
    PB: ClassVar[Any]

    command: Any

    def __getattr__(self, name: str) -> Any:
        if name == "command" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.command, name)

    @classmethod
    def build(cls, **fields: Any) -> Any:
        """An event whose command has ``fields`` set (protobuf keyword construction)."""
        return cls(command=cls.PB(**fields))

    @property
    def type_name(self) -> str:
        return pb.BaseCommand.Type.Name(self.TYPE)


def _command(type_value: int):  # type: ignore[no-untyped-def]
    def register(cls: _T) -> _T:
        cls.TYPE = type_value
        cls.PB = getattr(pb, cls.__name__)
        cls.FIELD = _FIELD_OF_MESSAGE[cls.__name__]
        COMMAND_EVENTS[type_value] = cls
        __all__.append(cls.__name__)
        return cls

    return register


T = pb.BaseCommand


def _payload(entry: bytes, metadata: pb.MessageMetadata | None) -> bytes:
    """The (possibly compressed) payload after an entry's metadata, cut out when asked
    for (the broker stores and forwards whole entries and never needs it); empty when
    the entry's checksum was wrong."""
    if metadata is None:
        return b""
    return entry[ENTRY_HEADER_SIZE + int.from_bytes(entry[6:ENTRY_HEADER_SIZE], "big") :]




# --- connection ------------------------------------------------------------------


@_command(T.CONNECT)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandConnect(PulsarCommand):
    command: pb.CommandConnect


@_command(T.CONNECTED)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandConnected(PulsarCommand):
    command: pb.CommandConnected


@_command(T.AUTH_CHALLENGE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandAuthChallenge(PulsarCommand):
    command: pb.CommandAuthChallenge


@_command(T.AUTH_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandAuthResponse(PulsarCommand):
    command: pb.CommandAuthResponse


@_command(T.PING)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandPing(PulsarCommand):
    command: pb.CommandPing


@_command(T.PONG)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandPong(PulsarCommand):
    command: pb.CommandPong


@_command(T.SUCCESS)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSuccess(PulsarCommand):
    command: pb.CommandSuccess


@_command(T.ERROR)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandError(PulsarCommand):
    command: pb.CommandError


# --- producers -------------------------------------------------------------------


@_command(T.PRODUCER)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandProducer(PulsarCommand):
    command: pb.CommandProducer


@_command(T.PRODUCER_SUCCESS)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandProducerSuccess(PulsarCommand):
    command: pb.CommandProducerSuccess


@_command(T.SEND)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSend(PulsarCommand):
    """A SEND and the entry after it.

    ``entry`` is every byte after the command (``[0x0e01][crc32c][metadataSize]
    [MessageMetadata][payload]`` from a well-behaved client), ready to be stored as is.
    ``checksum_ok`` is False when the magic or the CRC-32C is wrong; then ``metadata``
    is None and the session answers SEND_ERROR with ``ChecksumError``.
    """

    command: pb.CommandSend
    entry: bytes = b""
    checksum_ok: bool = True
    metadata: pb.MessageMetadata | None = None

    @property
    def payload(self) -> bytes:
        return _payload(self.entry, self.metadata)


@_command(T.SEND_RECEIPT)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSendReceipt(PulsarCommand):
    command: pb.CommandSendReceipt


@_command(T.SEND_ERROR)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSendError(PulsarCommand):
    command: pb.CommandSendError


@_command(T.CLOSE_PRODUCER)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandCloseProducer(PulsarCommand):
    command: pb.CommandCloseProducer


# --- consumers -------------------------------------------------------------------


@_command(T.SUBSCRIBE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSubscribe(PulsarCommand):
    command: pb.CommandSubscribe


@_command(T.FLOW)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandFlow(PulsarCommand):
    command: pb.CommandFlow


@_command(T.MESSAGE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandMessage(PulsarCommand):
    """A MESSAGE, the optional broker entry metadata, and the stored entry.

    When sending, ``entry`` is the stored entry bytes and ``broker_entry_metadata``
    is written in front of it only if the client announced support for it.
    """

    command: pb.CommandMessage
    entry: bytes = b""
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None
    checksum_ok: bool = True
    metadata: pb.MessageMetadata | None = None

    @property
    def payload(self) -> bytes:
        return _payload(self.entry, self.metadata)


@_command(T.ACK)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandAck(PulsarCommand):
    command: pb.CommandAck


@_command(T.ACK_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandAckResponse(PulsarCommand):
    command: pb.CommandAckResponse


@_command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandRedeliverUnacknowledgedMessages(PulsarCommand):
    command: pb.CommandRedeliverUnacknowledgedMessages


@_command(T.UNSUBSCRIBE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandUnsubscribe(PulsarCommand):
    command: pb.CommandUnsubscribe


@_command(T.CLOSE_CONSUMER)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandCloseConsumer(PulsarCommand):
    command: pb.CommandCloseConsumer


@_command(T.SEEK)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSeek(PulsarCommand):
    command: pb.CommandSeek


@_command(T.REACHED_END_OF_TOPIC)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandReachedEndOfTopic(PulsarCommand):
    command: pb.CommandReachedEndOfTopic


@_command(T.ACTIVE_CONSUMER_CHANGE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandActiveConsumerChange(PulsarCommand):
    command: pb.CommandActiveConsumerChange


@_command(T.CONSUMER_STATS)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandConsumerStats(PulsarCommand):
    command: pb.CommandConsumerStats


@_command(T.CONSUMER_STATS_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandConsumerStatsResponse(PulsarCommand):
    command: pb.CommandConsumerStatsResponse


@_command(T.GET_LAST_MESSAGE_ID)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetLastMessageId(PulsarCommand):
    command: pb.CommandGetLastMessageId


@_command(T.GET_LAST_MESSAGE_ID_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetLastMessageIdResponse(PulsarCommand):
    command: pb.CommandGetLastMessageIdResponse


# --- lookup, discovery, schemas --------------------------------------------------


@_command(T.PARTITIONED_METADATA)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandPartitionedTopicMetadata(PulsarCommand):
    command: pb.CommandPartitionedTopicMetadata


@_command(T.PARTITIONED_METADATA_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandPartitionedTopicMetadataResponse(PulsarCommand):
    command: pb.CommandPartitionedTopicMetadataResponse


@_command(T.LOOKUP)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandLookupTopic(PulsarCommand):
    command: pb.CommandLookupTopic


@_command(T.LOOKUP_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandLookupTopicResponse(PulsarCommand):
    command: pb.CommandLookupTopicResponse


@_command(T.GET_TOPICS_OF_NAMESPACE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetTopicsOfNamespace(PulsarCommand):
    command: pb.CommandGetTopicsOfNamespace


@_command(T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetTopicsOfNamespaceResponse(PulsarCommand):
    command: pb.CommandGetTopicsOfNamespaceResponse


@_command(T.GET_SCHEMA)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetSchema(PulsarCommand):
    command: pb.CommandGetSchema


@_command(T.GET_SCHEMA_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetSchemaResponse(PulsarCommand):
    command: pb.CommandGetSchemaResponse


@_command(T.GET_OR_CREATE_SCHEMA)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetOrCreateSchema(PulsarCommand):
    command: pb.CommandGetOrCreateSchema


@_command(T.GET_OR_CREATE_SCHEMA_RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandGetOrCreateSchemaResponse(PulsarCommand):
    command: pb.CommandGetOrCreateSchemaResponse


del T
