"""The events of the Pulsar binary protocol, one class per command, named as the spec names it.

Each event wraps the command's protobuf message (``event.command``) and reads through
to it, so ``event.producer_id`` is ``event.command.producer_id``.  Build one with keyword
fields: ``CommandSendReceipt.build(producer_id=1, sequence_id=7)``.  The two commands
that carry an entry after the command - :class:`CommandSend` and
:class:`CommandMessage` - also hold the entry bytes and their parsed metadata, and give
the payload after the metadata on request.

A command that adds no field of its own is a plain subclass with empty ``__slots__``,
its ``command`` annotation only narrowing the type: it inherits the dataclass's
``__init__``, equality, hash, repr and frozenness. Made a dataclass of its own, each
would only cost the broker's start about a millisecond.
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
class CommandConnect(PulsarCommand):
    __slots__ = ()
    command: pb.CommandConnect


@_command(T.CONNECTED)
class CommandConnected(PulsarCommand):
    __slots__ = ()
    command: pb.CommandConnected


@_command(T.AUTH_CHALLENGE)
class CommandAuthChallenge(PulsarCommand):
    __slots__ = ()
    command: pb.CommandAuthChallenge


@_command(T.AUTH_RESPONSE)
class CommandAuthResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandAuthResponse


@_command(T.PING)
class CommandPing(PulsarCommand):
    __slots__ = ()
    command: pb.CommandPing


@_command(T.PONG)
class CommandPong(PulsarCommand):
    __slots__ = ()
    command: pb.CommandPong


@_command(T.SUCCESS)
class CommandSuccess(PulsarCommand):
    __slots__ = ()
    command: pb.CommandSuccess


@_command(T.ERROR)
class CommandError(PulsarCommand):
    __slots__ = ()
    command: pb.CommandError


# --- producers -------------------------------------------------------------------


@_command(T.PRODUCER)
class CommandProducer(PulsarCommand):
    __slots__ = ()
    command: pb.CommandProducer


@_command(T.PRODUCER_SUCCESS)
class CommandProducerSuccess(PulsarCommand):
    __slots__ = ()
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
class CommandSendReceipt(PulsarCommand):
    __slots__ = ()
    command: pb.CommandSendReceipt


@_command(T.SEND_ERROR)
class CommandSendError(PulsarCommand):
    __slots__ = ()
    command: pb.CommandSendError


@_command(T.CLOSE_PRODUCER)
class CommandCloseProducer(PulsarCommand):
    __slots__ = ()
    command: pb.CommandCloseProducer


# --- consumers -------------------------------------------------------------------


@_command(T.SUBSCRIBE)
class CommandSubscribe(PulsarCommand):
    __slots__ = ()
    command: pb.CommandSubscribe


@_command(T.FLOW)
class CommandFlow(PulsarCommand):
    __slots__ = ()
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
class CommandAck(PulsarCommand):
    __slots__ = ()
    command: pb.CommandAck


@_command(T.ACK_RESPONSE)
class CommandAckResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandAckResponse


@_command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES)
class CommandRedeliverUnacknowledgedMessages(PulsarCommand):
    __slots__ = ()
    command: pb.CommandRedeliverUnacknowledgedMessages


@_command(T.UNSUBSCRIBE)
class CommandUnsubscribe(PulsarCommand):
    __slots__ = ()
    command: pb.CommandUnsubscribe


@_command(T.CLOSE_CONSUMER)
class CommandCloseConsumer(PulsarCommand):
    __slots__ = ()
    command: pb.CommandCloseConsumer


@_command(T.SEEK)
class CommandSeek(PulsarCommand):
    __slots__ = ()
    command: pb.CommandSeek


@_command(T.REACHED_END_OF_TOPIC)
class CommandReachedEndOfTopic(PulsarCommand):
    __slots__ = ()
    command: pb.CommandReachedEndOfTopic


@_command(T.ACTIVE_CONSUMER_CHANGE)
class CommandActiveConsumerChange(PulsarCommand):
    __slots__ = ()
    command: pb.CommandActiveConsumerChange


@_command(T.CONSUMER_STATS)
class CommandConsumerStats(PulsarCommand):
    __slots__ = ()
    command: pb.CommandConsumerStats


@_command(T.CONSUMER_STATS_RESPONSE)
class CommandConsumerStatsResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandConsumerStatsResponse


@_command(T.GET_LAST_MESSAGE_ID)
class CommandGetLastMessageId(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetLastMessageId


@_command(T.GET_LAST_MESSAGE_ID_RESPONSE)
class CommandGetLastMessageIdResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetLastMessageIdResponse


# --- lookup, discovery, schemas --------------------------------------------------


@_command(T.PARTITIONED_METADATA)
class CommandPartitionedTopicMetadata(PulsarCommand):
    __slots__ = ()
    command: pb.CommandPartitionedTopicMetadata


@_command(T.PARTITIONED_METADATA_RESPONSE)
class CommandPartitionedTopicMetadataResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandPartitionedTopicMetadataResponse


@_command(T.LOOKUP)
class CommandLookupTopic(PulsarCommand):
    __slots__ = ()
    command: pb.CommandLookupTopic


@_command(T.LOOKUP_RESPONSE)
class CommandLookupTopicResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandLookupTopicResponse


@_command(T.GET_TOPICS_OF_NAMESPACE)
class CommandGetTopicsOfNamespace(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetTopicsOfNamespace


@_command(T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
class CommandGetTopicsOfNamespaceResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetTopicsOfNamespaceResponse


@_command(T.GET_SCHEMA)
class CommandGetSchema(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetSchema


@_command(T.GET_SCHEMA_RESPONSE)
class CommandGetSchemaResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetSchemaResponse


@_command(T.GET_OR_CREATE_SCHEMA)
class CommandGetOrCreateSchema(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetOrCreateSchema


@_command(T.GET_OR_CREATE_SCHEMA_RESPONSE)
class CommandGetOrCreateSchemaResponse(PulsarCommand):
    __slots__ = ()
    command: pb.CommandGetOrCreateSchemaResponse


del T
