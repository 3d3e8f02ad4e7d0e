"""Sans-IO codec for the Pulsar binary protocol.

Theory of operation
-------------------
:class:`PulsarConnection` turns bytes into events and events into bytes, and does
nothing else: no sockets, no trio, no broker.  The session feeds it with
:meth:`~PulsarConnection.receive_data`, pulls events with
:meth:`~PulsarConnection.next_event` until it gets :data:`NEED_DATA`, and writes what
:meth:`~PulsarConnection.send` (or the hot-path :meth:`~PulsarConnection.encode_message`)
returns.  The broker's two hot frames, MESSAGE (many per call, around stored entries) and
SEND_RECEIPT, are written by the native core (``rust/pulsar-wire``) byte for byte as the
protobuf encoder would write them; :func:`encode_message` is the reference they are
tested against.

Framing (Pulsar binary protocol, "Framing")::

    [totalSize u32][commandSize u32][BaseCommand]
        [0x0e02 u16][size u32][BrokerEntryMetadata]     MESSAGE only, optional
        [0x0e01 u16][crc32c u32][metadataSize u32][MessageMetadata][payload]
                                                        SEND and MESSAGE only

``totalSize`` counts every byte after itself.  It is checked against the frame limit
(the maximum message size plus :data:`FRAME_HEADER_ALLOWANCE`) before any byte of the
frame is waited for, so a peer cannot make us buffer more than one frame's worth.
Consumed frames are not cut from the front of the buffer one by one (that moves the rest
of the buffer each time); a read offset advances and the buffer is compacted when new data
arrives.

Rules live in one table, :data:`TRANSITIONS`: (state, who sends, command type) -> next
state.  Before CONNECT only CONNECT is legal; between CONNECT and CONNECTED only the
authentication exchange (or an ERROR refusing the connection); once connected, each side
may send the commands its role sends.  A move that is not in the table raises
:class:`RemoteProtocolError` for what the peer sent and :class:`LocalProtocolError` for
what we tried to send; both carry a Pulsar ``ServerError`` code.  After a remote error the
connection is dead: every later ``next_event`` raises again, and the only thing a server
may still send is an ERROR saying why it hangs up.

A SEND whose magic or CRC-32C is wrong is *not* a protocol error: it arrives as a
:class:`CommandSend` with ``checksum_ok=False`` so the session can answer SEND_ERROR
``ChecksumError`` and keep the connection, as Pulsar brokers do.

Example::

    >>> from core.format import pulsar_api_pb2 as pb
    >>> server = PulsarConnection(Role.SERVER)
    >>> client = PulsarConnection(Role.CLIENT)
    >>> server.receive_data(client.send(CommandConnect.build(client_version="c",
    ...                                                      protocol_version=19)))
    >>> event = server.next_event()
    >>> event.client_version, server.next_event() is NEED_DATA
    ('c', True)
    >>> client.receive_data(server.send(CommandConnected.build(server_version="s")))
    >>> client.next_event().max_message_size == DEFAULT_MAX_MESSAGE_SIZE
    True
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from google.protobuf.message import DecodeError, EncodeError

from core import native as _native
from core.format import (
    MAGIC_BROKER_ENTRY_METADATA,
    strings_are_utf8,
    verify_checksum,
)
from core.format import pulsar_api_pb2 as pb

from . import _events
from ._events import (
    COMMAND_EVENTS,
    CommandAck,
    CommandAckResponse,
    CommandActiveConsumerChange,
    CommandAuthChallenge,
    CommandAuthResponse,
    CommandCloseConsumer,
    CommandCloseProducer,
    CommandConnect,
    CommandConnected,
    CommandConsumerStats,
    CommandConsumerStatsResponse,
    CommandError,
    CommandFlow,
    CommandGetLastMessageId,
    CommandGetLastMessageIdResponse,
    CommandGetOrCreateSchema,
    CommandGetOrCreateSchemaResponse,
    CommandGetSchema,
    CommandGetSchemaResponse,
    CommandGetTopicsOfNamespace,
    CommandGetTopicsOfNamespaceResponse,
    CommandLookupTopic,
    CommandLookupTopicResponse,
    CommandMessage,
    CommandPartitionedTopicMetadata,
    CommandPartitionedTopicMetadataResponse,
    CommandPing,
    CommandPong,
    CommandProducer,
    CommandProducerSuccess,
    CommandReachedEndOfTopic,
    CommandRedeliverUnacknowledgedMessages,
    CommandSeek,
    CommandSend,
    CommandSendError,
    CommandSendReceipt,
    CommandSubscribe,
    CommandSuccess,
    CommandUnsubscribe,
    ConnectionClosed,
    Event,
    PulsarCommand,
)

__all__ = [
    "CLIENT_COMMANDS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FRAME_HEADER_ALLOWANCE",
    "NEED_DATA",
    "PlainAck",
    "PlainSend",
    "SERVER_COMMANDS",
    "TRANSITIONS",
    "LocalProtocolError",
    "encode_message",
    "ProtocolError",
    "PulsarConnection",
    "RemoteProtocolError",
    "Role",
    "State",
    *_events.__all__,
]

DEFAULT_MAX_MESSAGE_SIZE: Final = 5 * 1024 * 1024
"""Largest entry (metadata + payload) accepted by default; Pulsar's ``maxMessageSize``."""
FRAME_HEADER_ALLOWANCE: Final = 10 * 1024
"""Room for the command and headers on top of the message in one frame."""

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")

PlainSend = tuple[int, int, int, int, bytes, bool, bool]
"""A plain SEND from :meth:`PulsarConnection.next_sends`: ``(producer_id, sequence_id,
num_messages, highest_sequence_id, entry, checksum_ok, delayed)``, the entry being every
byte after the command and ``delayed`` whether its metadata holds ``deliver_at_time``
(a plain SEND's metadata holds no encryption keys)."""

PlainAck = tuple[int, int | None, list[tuple[int, int]], list[list[int] | None] | None]
"""A plain individual ACK from :meth:`PulsarConnection.next_acks`: ``(consumer_id,
request_id or None, ids, ack_sets)``, ``ids`` the acknowledged ``(ledger_id, entry_id)``
pairs (those past a signed 64-bit range, which name no entry, left out) and ``ack_sets``
None when no id carries a batch-index ack set, else one list or None per id."""


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Final = _Sentinel("NEED_DATA")
"""Returned by :meth:`PulsarConnection.next_event` when no complete frame is buffered."""


class ProtocolError(Exception):
    """A violation of the Pulsar protocol; ``code`` is a ``ServerError`` value."""

    def __init__(self, message: str, code: int = pb.UnknownError) -> None:
        super().__init__(message)
        self.code = code

    @property
    def code_name(self) -> str:
        return pb.ServerError.Name(self.code)


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow (or bytes that do not parse)."""


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    AWAIT_CONNECT = "await-connect"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"
    ERROR = "error"


_T = pb.BaseCommand

CLIENT_COMMANDS: Final[frozenset[int]] = frozenset(
    c.TYPE
    for c in (
        CommandConnect,
        CommandAuthResponse,
        CommandPing,
        CommandPong,
        CommandProducer,
        CommandSend,
        CommandCloseProducer,
        CommandSubscribe,
        CommandFlow,
        CommandAck,
        CommandRedeliverUnacknowledgedMessages,
        CommandUnsubscribe,
        CommandCloseConsumer,
        CommandSeek,
        CommandConsumerStats,
        CommandGetLastMessageId,
        CommandPartitionedTopicMetadata,
        CommandLookupTopic,
        CommandGetTopicsOfNamespace,
        CommandGetSchema,
        CommandGetOrCreateSchema,
    )
)
"""Commands a client sends."""

SERVER_COMMANDS: Final[frozenset[int]] = frozenset(
    c.TYPE
    for c in (
        CommandConnected,
        CommandAuthChallenge,
        CommandPing,
        CommandPong,
        CommandSuccess,
        CommandError,
        CommandProducerSuccess,
        CommandSendReceipt,
        CommandSendError,
        CommandCloseProducer,
        CommandCloseConsumer,
        CommandMessage,
        CommandAckResponse,
        CommandReachedEndOfTopic,
        CommandActiveConsumerChange,
        CommandConsumerStatsResponse,
        CommandGetLastMessageIdResponse,
        CommandPartitionedTopicMetadataResponse,
        CommandLookupTopicResponse,
        CommandGetTopicsOfNamespaceResponse,
        CommandGetSchemaResponse,
        CommandGetOrCreateSchemaResponse,
    )
)
"""Commands a server (broker) sends."""

_C, _S = Role.CLIENT, Role.SERVER
TRANSITIONS: Final[dict[tuple[State, Role, int], State]] = {
    (State.AWAIT_CONNECT, _C, _T.CONNECT): State.CONNECTING,
    (State.CONNECTING, _S, _T.AUTH_CHALLENGE): State.CONNECTING,
    (State.CONNECTING, _C, _T.AUTH_RESPONSE): State.CONNECTING,
    (State.CONNECTING, _S, _T.CONNECTED): State.CONNECTED,
    (State.CONNECTING, _S, _T.ERROR): State.CLOSED,
    # A server may explain why it drops a connection that broke the protocol.
    (State.ERROR, _S, _T.ERROR): State.ERROR,
    **{(State.CONNECTED, _C, t): State.CONNECTED for t in CLIENT_COMMANDS - {_T.CONNECT}},
    **{(State.CONNECTED, _S, t): State.CONNECTED for t in SERVER_COMMANDS - {_T.CONNECTED}},
}
"""The whole state machine: (state, sender, command type) -> next state."""

_MOVES: Final[dict[tuple[State, Role], dict[int, State]]] = {
    (state, role): {t: nxt for (st, r, t), nxt in TRANSITIONS.items() if st is state and r is role}
    for state in State
    for role in Role
}
""":data:`TRANSITIONS` indexed by (state, sender): what each command type moves to."""

_WITH_ENTRY: Final = frozenset({_T.SEND, _T.MESSAGE})
_COPY_THROUGH_VIEW: Final = 4096
"""From this size on, an entry is copied out of the buffer through a memoryview (one copy)
rather than by slicing (two copies, but cheaper for small ones)."""
_SEND_TYPE_FIELD: Final = bytes((1 << 3, _T.SEND))
"""``BaseCommand.type = SEND``, the first field of every SEND a client writes."""


def _type_name(value: int) -> str:
    try:
        return pb.BaseCommand.Type.Name(value)
    except ValueError:
        return f"type {value}"


class PulsarConnection:
    """One end of a Pulsar connection (``our_role`` says which), as a pure state machine.

    ``max_message_size`` bounds what we accept (and is announced in CONNECTED when we are
    the server); the frame limit is that plus ``frame_allowance``.
    """

    def __init__(
        self,
        our_role: Role = Role.SERVER,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        frame_allowance: int = FRAME_HEADER_ALLOWANCE,
    ) -> None:
        self.our_role = our_role
        self.their_role = Role.CLIENT if our_role is Role.SERVER else Role.SERVER
        self._our_moves: dict[int, State] = {}
        self._their_moves: dict[int, State] = {}
        self.state = State.AWAIT_CONNECT
        self.max_message_size = max_message_size
        self.frame_allowance = frame_allowance
        self.peer_max_message_size = DEFAULT_MAX_MESSAGE_SIZE
        self.client_protocol_version: int | None = None
        self.protocol_version: int | None = None
        self.client_features = pb.FeatureFlags()
        self._buf = bytearray()
        self._pos = 0
        self._eof = False

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        self._our_moves = _MOVES[state, self.our_role]
        self._their_moves = _MOVES[state, self.their_role]

    # -- limits and negotiated facts --------------------------------------------

    @property
    def max_frame_size(self) -> int:
        """Largest ``totalSize`` accepted from the peer."""
        return self.max_message_size + self.frame_allowance

    @property
    def peer_max_frame_size(self) -> int:
        """Largest ``totalSize`` the peer accepts from us."""
        return self.peer_max_message_size + self.frame_allowance

    @property
    def peer_supports_broker_entry_metadata(self) -> bool:
        return self.client_features.supports_broker_entry_metadata

    @property
    def buffered(self) -> int:
        """Bytes received and not yet turned into events."""
        return len(self._buf) - self._pos

    # -- receiving ----------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes read from the socket; ``b""`` means the peer closed its side."""
        if self._eof and data:
            raise LocalProtocolError("received data after end of stream")
        if data:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            self._buf += data
        else:
            self._eof = True

    def next_event(self) -> Event | _Sentinel:
        """The next complete event, or :data:`NEED_DATA`."""
        if self._state is State.ERROR:
            raise RemoteProtocolError("connection already failed", pb.NotAllowedError)
        try:
            return self._next_event()
        except RemoteProtocolError:
            self.state = State.ERROR
            raise

    def next_sends(self) -> list[PlainSend]:
        """The plain SEND frames buffered next, all decoded in one native call: what a
        producing client mostly sends, without an event object each. Empty when the next
        frame is anything else or incomplete, or when the peer may not send a SEND now;
        :meth:`next_event` decodes that frame (and refuses it if it must)."""
        return self._scan_run(_T.SEND, _native.scan_pulsar_sends)

    def next_acks(self) -> list[PlainAck]:
        """The plain individual ACK frames buffered next, all decoded in one native call:
        what a consuming client mostly sends, without a protobuf object per message id.
        Empty when the next frame is anything else or incomplete, or when the peer may not
        send an ACK now; :meth:`next_event` decodes that frame (and refuses it if it must)."""
        return self._scan_run(_T.ACK, _native.scan_pulsar_acks)

    def _scan_run(self, command_type: int,
                  scan: Callable[[bytearray, int, int], tuple[list[Any], int]]) -> list[Any]:
        """The rows ``scan`` (a native scanner) takes from the buffered frames of
        ``command_type``, consumed; none while the peer may not send that command."""
        if self._their_moves.get(command_type) is not self._state:
            return []
        rows, self._pos = scan(self._buf, self._pos, self.max_frame_size)
        return rows

    def _next_event(self) -> Event | _Sentinel:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return self._incomplete()
        (total,) = _U32.unpack_from(buf, pos)
        if total > self.max_frame_size:
            raise RemoteProtocolError(
                f"frame of {total} bytes exceeds the limit of {self.max_frame_size}",
                pb.NotAllowedError,
            )
        if total < 4:
            raise RemoteProtocolError(f"frame of {total} bytes cannot hold a command size")
        end = pos + 4 + total
        if len(buf) < end:
            return self._incomplete()
        (command_size,) = _U32.unpack_from(buf, pos + 4)
        if command_size > total - 4:
            raise RemoteProtocolError(
                f"command of {command_size} bytes exceeds its {total}-byte frame"
            )
        split = pos + 8 + command_size
        command = bytes(buf[pos + 8 : split])
        if end - split < _COPY_THROUGH_VIEW:
            rest = bytes(buf[split:end])
        else:
            with memoryview(buf) as view:
                rest = bytes(view[split:end])
        self._pos = end
        return self._decode(command, rest)

    def _incomplete(self) -> Event | _Sentinel:
        if not self._eof:
            return NEED_DATA
        if self.buffered:
            raise RemoteProtocolError(f"connection closed inside a frame ({self.buffered} bytes)")
        if self.state is not State.ERROR:
            self.state = State.CLOSED
        return ConnectionClosed()

    def _decode(self, command: bytes, rest: bytes) -> Event:
        """The event of a frame: its ``command`` and the ``rest`` after it."""
        if command.startswith(_SEND_TYPE_FIELD):
            event = self._decode_plain_send(command, rest)
            if event is not None:
                return event
        return self._decode_general(command, rest)

    def _decode_plain_send(self, command: bytes, entry: bytes) -> CommandSend | None:
        """A SEND in the plain shape clients write, found by the native scan
        (``rust/pulsar-wire``: command fields, CRC-32C, metadata fields, their UTF-8 and
        the required ones checked without building objects); None for anything else, which
        :meth:`_decode_general` then decodes and, if it must, refuses."""
        scan = _native.scan_pulsar_send(command, entry)
        if scan is None:
            return None
        body_start, body_end, checksum_ok, meta_start, meta_end = scan
        try:
            body = pb.CommandSend.FromString(command[body_start:body_end])
            metadata = pb.MessageMetadata.FromString(entry[meta_start:meta_end]) if checksum_ok else None
        except DecodeError:
            return None
        self._advance(self.their_role, _T.SEND, RemoteProtocolError)
        if metadata is None:
            return CommandSend(command=body, entry=entry, checksum_ok=False)
        return CommandSend(command=body, entry=entry, metadata=metadata)

    def _decode_general(self, command: bytes, rest: bytes) -> Event:
        base = pb.BaseCommand()
        try:
            base.ParseFromString(command)
        except DecodeError as exc:
            raise RemoteProtocolError(f"malformed command: {exc}") from exc
        if not base.HasField("type"):
            raise RemoteProtocolError("command of unknown type")
        cls = COMMAND_EVENTS.get(base.type)
        if cls is None:
            raise RemoteProtocolError(
                f"unsupported command {_type_name(base.type)}", pb.UnsupportedVersionError
            )
        body = getattr(base, cls.FIELD)
        if not body.IsInitialized():
            missing = ", ".join(body.FindInitializationErrors())
            raise RemoteProtocolError(f"{cls.__name__} lacks required fields: {missing}")
        if not strings_are_utf8(body):
            raise RemoteProtocolError(f"{cls.__name__} holds a string that is not UTF-8")
        self._advance(self.their_role, base.type, RemoteProtocolError)
        event: PulsarCommand
        if base.type in _WITH_ENTRY:
            event = self._decode_entry_command(cls, body, rest)
        elif rest:
            raise RemoteProtocolError(f"{len(rest)} unexpected bytes after {cls.__name__}")
        else:
            event = cls(command=body)
        self._on_event(event, received=True)
        return event

    def _decode_entry_command(self, cls: Any, body: Any, rest: bytes) -> PulsarCommand:
        broker_meta = None
        entry = rest
        if cls is CommandMessage and len(rest) >= 2:
            if _U16.unpack_from(rest, 0)[0] == MAGIC_BROKER_ENTRY_METADATA:
                if len(rest) < 6:
                    raise RemoteProtocolError("truncated broker entry metadata")
                (size,) = _U32.unpack_from(rest, 2)
                if 6 + size > len(rest):
                    raise RemoteProtocolError("broker entry metadata exceeds the frame")
                broker_meta = pb.BrokerEntryMetadata()
                try:
                    broker_meta.ParseFromString(memoryview(rest)[6 : 6 + size])
                except DecodeError as exc:
                    raise RemoteProtocolError(f"malformed broker entry metadata: {exc}") from exc
                entry = rest[6 + size :]
        fields: dict[str, Any] = {"command": body, "entry": entry}
        if broker_meta is not None:
            fields["broker_entry_metadata"] = broker_meta
        if not verify_checksum(entry):
            return cls(checksum_ok=False, **fields)
        (meta_size,) = _U32.unpack_from(entry, 6)
        if 10 + meta_size > len(entry):
            raise RemoteProtocolError(f"message metadata of {meta_size} bytes exceeds the frame")
        metadata = pb.MessageMetadata()
        try:
            metadata.ParseFromString(entry[10 : 10 + meta_size])
        except DecodeError as exc:
            raise RemoteProtocolError(f"malformed message metadata: {exc}") from exc
        if not metadata.IsInitialized():
            raise RemoteProtocolError("message metadata lacks required fields")
        if not strings_are_utf8(metadata):
            raise RemoteProtocolError("message metadata holds a string that is not UTF-8")
        return cls(metadata=metadata, **fields)

    # -- sending --------------------------------------------------------------------

    def send(self, event: Event) -> bytes:
        """Encode ``event`` as one frame, after checking that we may send it now.

        A CONNECTED without ``max_message_size`` gets this connection's limit filled in
        (on the event's command), so clients learn the limit we enforce.
        """
        if not isinstance(event, PulsarCommand):
            raise LocalProtocolError(f"cannot send {type(event).__name__}")
        if isinstance(event, CommandConnected) and not event.command.HasField("max_message_size"):
            event.command.max_message_size = self.max_message_size
        self._advance(self.our_role, event.TYPE, LocalProtocolError)
        base = pb.BaseCommand(type=event.TYPE)  # type: ignore[arg-type]
        getattr(base, event.FIELD).CopyFrom(event.command)
        tail: bytes = b""
        if isinstance(event, CommandSend):
            tail = event.entry
        elif isinstance(event, CommandMessage):
            prefix = b""
            if event.broker_entry_metadata is not None and self.peer_supports_broker_entry_metadata:
                body = event.broker_entry_metadata.SerializeToString()
                prefix = _U16.pack(MAGIC_BROKER_ENTRY_METADATA) + _U32.pack(len(body)) + body
            tail = prefix + event.entry
        data = self._frame(base, tail)
        self._on_event(event, received=False)
        return data

    def encode_message(
        self,
        consumer_id: int,
        message_id: pb.MessageIdData | tuple[int, int],
        redelivery_count: int,
        entry_bytes: bytes | memoryview,
        broker_entry_metadata: bytes | None = None,
        ack_set: Sequence[int] | None = None,
        consumer_epoch: int | None = None,
    ) -> bytes:
        """:func:`encode_message`, checked against this connection.

        Refused unless we are a connected server; the broker entry metadata is dropped
        for clients that did not announce support for it, and the frame must fit what
        the client accepts.
        """
        self._advance(self.our_role, _T.MESSAGE, LocalProtocolError)
        if not self.peer_supports_broker_entry_metadata:
            broker_entry_metadata = None
        frame = encode_message(
            consumer_id,
            message_id,
            redelivery_count,
            entry_bytes,
            broker_entry_metadata,
            ack_set,
            consumer_epoch,
        )
        self._check_outgoing(len(frame) - 4)
        return frame

    def encode_messages(
        self,
        consumer_id: int,
        partition: int,
        deliveries: list[tuple[int, int, int, list[int] | None, int, int, bytes]],
    ) -> bytes:
        """MESSAGE frames for many deliveries at once, concatenated (the native encoder).

        Each delivery is ``(ledger_id, entry_id, redelivery_count, ack_set or None,
        publish_time, index, entry)``; the frames carry broker entry metadata (publish time,
        and the index when it is not negative) for clients that asked for it, and equal
        what :meth:`encode_message` gives one by one (a message id's partition of -1, its
        default, is left out).  A frame over the client's limit
        raises :class:`LocalProtocolError` and nothing is encoded.
        """
        self._advance(self.our_role, _T.MESSAGE, LocalProtocolError)
        try:
            return _native.encode_pulsar_messages(
                consumer_id,
                partition,
                deliveries,
                self.peer_supports_broker_entry_metadata,
                self.peer_max_frame_size,
            )
        except ValueError as exc:
            raise LocalProtocolError(str(exc), pb.NotAllowedError) from exc

    def encode_send_receipts(self, rows: list[tuple[int, int, int, int, int, int]]) -> bytes:
        """SEND_RECEIPT frames, concatenated (the native encoder), one per
        ``(producer_id, sequence_id, ledger_id, entry_id, partition, highest_sequence_id)``
        row: the same bytes as :meth:`send` of a :class:`CommandSendReceipt` with those
        fields each (a message id's partition of -1, its default, is left out)."""
        self._advance(self.our_role, _T.SEND_RECEIPT, LocalProtocolError)
        return _native.encode_pulsar_send_receipts(rows)

    def _frame(self, base: pb.BaseCommand, tail: bytes) -> bytes:
        try:
            command = base.SerializeToString()
        except EncodeError as exc:
            raise LocalProtocolError(f"command lacks required fields: {exc}") from exc
        total = 4 + len(command) + len(tail)
        self._check_outgoing(total)
        return _TWO_U32.pack(total, len(command)) + command + tail

    def _check_outgoing(self, total: int) -> None:
        limit = self.peer_max_frame_size
        if total > limit:
            raise LocalProtocolError(
                f"frame of {total} bytes exceeds the peer's limit of {limit}", pb.NotAllowedError
            )

    # -- the state machine ------------------------------------------------------------

    def _advance(self, sender: Role, command_type: int, error: type[ProtocolError]) -> None:
        moves = self._their_moves if sender is self.their_role else self._our_moves
        next_state = moves.get(command_type)
        if next_state is None:
            raise error(
                f"{sender.value} may not send {_type_name(command_type)} "
                f"in state {self.state.value}",
                pb.NotAllowedError,
            )
        if next_state is not self._state:
            self.state = next_state

    def _on_event(self, event: PulsarCommand, *, received: bool) -> None:
        """Remember what the handshake negotiated."""
        if isinstance(event, CommandConnect):
            self.client_protocol_version = event.command.protocol_version
            self.client_features = pb.FeatureFlags()
            self.client_features.CopyFrom(event.command.feature_flags)
        elif isinstance(event, CommandConnected):
            self.protocol_version = event.command.protocol_version
            if event.command.HasField("max_message_size"):
                # Received: the broker's limit binds what we send.  Sent: clients honour
                # what we announced, so that is what we may deliver to them.
                self.peer_max_message_size = event.command.max_message_size


def encode_message(
    consumer_id: int,
    message_id: pb.MessageIdData | tuple[int, int],
    redelivery_count: int,
    entry_bytes: bytes | memoryview,
    broker_entry_metadata: bytes | None = None,
    ack_set: Sequence[int] | None = None,
    consumer_epoch: int | None = None,
) -> bytes:
    """A MESSAGE frame around a stored entry - the dispatch hot path.

    ``entry_bytes`` is the stored entry (``[0x0e01][crc32c][metadataSize]...``), spliced
    in unchanged; ``broker_entry_metadata`` is the ``0x0e02`` section from
    :func:`core.format.encode_broker_entry_metadata`, written in front of it when given
    (pass it only to clients whose CONNECT announced ``supports_broker_entry_metadata``).
    ``message_id`` is a ``MessageIdData`` or a ``(ledger_id, entry_id)`` pair.  This
    function keeps no state; :meth:`PulsarConnection.encode_message` is the checked form.
    """
    base = pb.BaseCommand(type=_T.MESSAGE)
    message = base.message
    message.consumer_id = consumer_id
    if isinstance(message_id, tuple):
        message.message_id.ledgerId, message.message_id.entryId = message_id
    else:
        message.message_id.CopyFrom(message_id)
    if redelivery_count:
        message.redelivery_count = redelivery_count
    if ack_set:
        message.ack_set.extend(ack_set)
    if consumer_epoch is not None:
        message.consumer_epoch = consumer_epoch
    command = base.SerializeToString()
    if broker_entry_metadata:
        total = 4 + len(command) + len(broker_entry_metadata) + len(entry_bytes)
        return b"".join(
            (_TWO_U32.pack(total, len(command)), command, broker_entry_metadata, entry_bytes)
        )
    total = 4 + len(command) + len(entry_bytes)
    return b"".join((_TWO_U32.pack(total, len(command)), command, entry_bytes))
