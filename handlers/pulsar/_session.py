"""The Pulsar session: the trio driver between a client socket and the BrokerService.

One nursery per connection: a reader feeds the sans-IO codec and handles each command; the
connection's outbox (receipts, responses and MESSAGE frames queued by any task) is sent
with one socket write at the end of the burst that filled it (a read's commands, a stored
batch's receipts, a dispatch: :mod:`core.writes`), and by a writer task for the rest and
whenever the socket is full; a keep-alive task pings an idle client and closes the
connection when it stops answering. What the outbox can hold is bounded by the
client's own limits: MESSAGE frames by the permits its consumers granted, receipts by its
pending-message limit.

Commands that wait on storage or on another client (opening a topic, WaitForExclusive
producers) run in their own task so the connection keeps reading; SEND is never awaited
inline: the topic calls back when the entry is durable and the receipt is queued then.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from itertools import repeat
from typing import Any

import trio

from core.auth import AuthenticationError, Identity
from core.broker import (
    BrokerService,
    NamespaceNotFoundError,
    PartitionCountError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    TopicQuotaError,
)
from core.format import EntryFormatError
from core.format import pulsar_api_pb2 as pb
from core.naming import PARTITION_SUFFIX, InvalidNameError, NamespaceName, TopicName
from core.policies import ConflictError, NotFoundError
from core.schema import IncompatibleSchemaError
from core.storage import Entry, NativeError, Position, entry_metadata
from core.subscription import (
    Consumer,
    ConsumerAssignError,
    ConsumerBusyError,
    Delivery,
    Subscription,
    SubscriptionTypeMismatchError,
    SubType,
)
from core.topic import (
    BacklogQuotaExceededError,
    EncryptionRequiredError,
    NotAllowedError,
    PersistentTopic,
    Producer,
    ProducerAccessMode,
    ProducerBusyError,
    ProducerFencedError,
    PublishResult,
    PublishRun,
    StoredRows,
    TopicClosedError,
    TopicTerminatedError,
)
from core.writes import flush_at_end, write_batch
from handlers._serve import Outbox, Reader, ReadLimit
from handlers.pulsar import _events as ev
from handlers.pulsar._codec import (
    NEED_DATA,
    PlainSend,
    ProtocolError,
    PulsarConnection,
    RemoteProtocolError,
    State,
)

__all__ = ["PulsarSession", "MAX_PROTOCOL_VERSION", "SERVER_VERSION"]

log = logging.getLogger(__name__)

_tuple_new = tuple.__new__  # a Position per acknowledged id, without a Python call

MAX_PROTOCOL_VERSION = 21
SERVER_VERSION = "Magnetar 0.1.0"
READ_SIZE = 256 * 1024
#: The answer to a lookup past maxConcurrentLookupRequest (Pulsar's words).
TOO_MANY_LOOKUPS = "Failed due to too many pending lookup requests"

E = pb.ServerError

#: The request id of an answer to no request (Java's -1 as an unsigned 64-bit id): the
#: ERROR that refuses a CONNECT.
NO_REQUEST = (1 << 64) - 1
#: What Pulsar tells a client whose credentials do not authenticate it, at CONNECT or when
#: they are refreshed (ServerCnx.authenticationFailed): the reason stays in the broker's log.
FAILED_TO_AUTHENTICATE = "Failed to authenticate"
#: The challenge that asks a client for fresh credentials (Pulsar's AuthData.REFRESH_AUTH_DATA).
REFRESH_AUTH_DATA = b"PulsarAuthRefresh"


_CPP_CLIENT = re.compile(r"Pulsar-CPP-v(\d+)\.(\d+)")
LAST_CPP_WITHOUT_END_OF_TOPIC = (4, 2)
"""The newest C++ client release (under the Python, Node.js and C++ APIs alike) known to
have no handler for REACHED_END_OF_TOPIC: it takes the command for an invalid message and
closes its connection. Its consumers then subscribe again, are told again, and so on every
100 ms, with their unacknowledged messages redelivered each time."""


def _peer_address(stream: Any) -> str:
    """The client's address as Pulsar's stats show it ("/127.0.0.1:54321"), or "" for a
    stream that is not a socket."""
    try:
        host, port = stream.socket.getpeername()[:2]
    except (AttributeError, OSError, ValueError, TypeError):
        return ""
    return f"/{host}:{port}"


def understands_end_of_topic(client_version: str, protocol_version: int) -> bool:
    """Whether a client that connected with these values handles REACHED_END_OF_TOPIC.
    Pulsar sends it from protocol version 9 on; a C++ client up to
    :data:`LAST_CPP_WITHOUT_END_OF_TOPIC` is not told either, since the notification
    costs it its connection."""
    if protocol_version < 9:
        return False
    m = _CPP_CLIENT.match(client_version)
    return m is None or (int(m[1]), int(m[2])) > LAST_CPP_WITHOUT_END_OF_TOPIC


class _NotAuthorized(Exception):
    """A request the connection's role may not make (Pulsar's AuthorizationError)."""


def _server_error(exc: BaseException) -> int:
    match exc:
        case _NotAuthorized():
            return E.AuthorizationError
        case InvalidNameError():
            return E.InvalidTopicName
        case TopicNotFoundError() | NamespaceNotFoundError() | NotFoundError():
            return E.TopicNotFound
        case SubscriptionNotFoundError():
            return E.SubscriptionNotFound
        case ConsumerBusyError() | SubscriptionTypeMismatchError():
            return E.ConsumerBusy
        case ConsumerAssignError():
            return E.ConsumerAssignError
        case ProducerFencedError():
            return E.ProducerFenced
        case EncryptionRequiredError():
            return E.MetadataError
        case ProducerBusyError():
            return E.ProducerBusy
        case IncompatibleSchemaError():
            return E.IncompatibleSchema
        case TopicTerminatedError():
            return E.TopicTerminatedError
        case BacklogQuotaExceededError(policy="producer_exception"):
            return E.ProducerBlockedQuotaExceededException
        case BacklogQuotaExceededError():
            return E.ProducerBlockedQuotaExceededError
        case TopicClosedError():
            return E.ServiceNotReady
        case NotAllowedError() | TopicQuotaError() | PartitionCountError():
            return E.NotAllowedError
        case NativeError():
            # the storage failed (too few bookies, a bookie's or the metadata store's
            # error): Pulsar's PersistenceError, which clients retry
            return E.PersistenceError
    return E.UnknownError


# MessageIdData's ledgerId for MessageId.latest (Long.MAX_VALUE) and earliest (-1 as u64).
_LATEST_LEDGER = 0x7FFFFFFFFFFFFFFF
_EARLIEST_LEDGER = 0xFFFFFFFFFFFFFFFF


def _after_last(topic: PersistentTopic) -> Position:
    last = topic.ml.last_confirmed()
    return Position(last.ledger_id, last.entry_id + 1) if last else Position(0, 0)


def _position_of(topic: PersistentTopic, mid: Any, *, inclusive: bool) -> Position:
    """Where a client's message id points: latest, earliest, or the message itself
    (`inclusive`) or the one after it. Ids are Java longs in Pulsar: an entry id past the
    signed range is negative there, before the ledger's first entry."""
    if mid.ledgerId == _LATEST_LEDGER:
        return _after_last(topic)
    if mid.ledgerId == _EARLIEST_LEDGER or mid.ledgerId > _LATEST_LEDGER:
        return topic.ml.first_position() or Position(0, 0)
    if mid.entryId > _LATEST_LEDGER:
        return Position(mid.ledgerId, 0)
    return Position(mid.ledgerId, mid.entryId if inclusive else mid.entryId + 1)


def _epoch_of(producer: Producer) -> dict[str, int]:
    """PRODUCER_SUCCESS's ``topic_epoch``: the topic's epoch once an exclusive producer has
    taken it (the client brings it back when it reconnects)."""
    return {} if producer.topic_epoch is None else {"topic_epoch": producer.topic_epoch}


def _largest_batch_index(entry: Entry) -> int:
    """The index of the last message of a batch entry, -1 for an entry that is not a batch.
    As Pulsar's ``getLargestBatchIndexWhenPossible``, a batch of one is a batch (its
    message's id has batch index 0, as the producer was told)."""
    try:
        md = entry_metadata(entry.data)
    except EntryFormatError:
        return -1
    return md.num_messages_in_batch - 1 if md.HasField("num_messages_in_batch") else -1


def _delivery_delay(entry: bytes) -> int:
    """How long after its publish time an entry asks to be delivered (0: not delayed)."""
    try:
        md = entry_metadata(entry)
    except EntryFormatError:
        return 0
    return md.deliver_at_time - md.publish_time if md.HasField("deliver_at_time") else 0


def _last_set_bit(words: list[int]) -> int:
    """The highest index set in an ack set (64-bit words, lowest first); -1 if none is."""
    for i in range(len(words) - 1, -1, -1):
        word = words[i] & 0xFFFF_FFFF_FFFF_FFFF
        if word:
            return i * 64 + word.bit_length() - 1
    return -1


def _entry_of(mid: Any) -> Position | None:
    """The entry an acknowledged or redelivered message id names; None when an id is
    past the signed range, where no entry is (negative in Pulsar's longs)."""
    if mid.ledgerId > _LATEST_LEDGER or mid.entryId > _LATEST_LEDGER:
        return None
    return Position(mid.ledgerId, mid.entryId)


class PulsarSession:
    def __init__(self, handler: Any, stream: trio.abc.Stream):
        self.handler = handler
        self.broker: BrokerService = handler.broker
        self.config = handler.config
        self.stream = stream
        self.codec = PulsarConnection(max_message_size=int(self.config.get("maxMessageSize")))
        self.outbox = Outbox(stream)
        self._read = Reader(stream)
        self.outbox.on_writable = self._writable_again
        self._held: set[PersistentTopic] = set()
        self.producers: dict[int, Producer] = {}
        # Producer ids this broker closed (CLOSE_PRODUCER): the client may have SENDs for
        # them on the wire already, and resends those once it has created the producer
        # again, so they are dropped without an answer (as Pulsar does) until it does.
        self._closed_by_broker: set[int] = set()
        self._tell_end_of_topic = True
        self.client_version = ""
        self.peer_address = _peer_address(stream)
        self.consumers: dict[int, Consumer] = {}
        self.consumer_topics: dict[int, PersistentTopic] = {}
        self.last_received = time.monotonic()
        self.closed = False
        #: The client's authenticated role (None while authentication is off or pending).
        self.role: str | None = None
        # When the role's credentials expire (None: never), whether the client can refresh
        # them (FeatureFlags.supports_auth_refresh), and whether a refresh is asked for.
        self._credentials_expire: float | None = None
        self._refreshable = False
        self._refresh_pending = False
        # Set when a refused CONNECT's ERROR is queued: nothing more is read, the
        # connection closes once the ERROR is written.
        self._refused = False
        self._nursery: trio.Nursery | None = None
        # Publishes read from this client and not yet answered (Pulsar's
        # maxPendingPublishRequestsPerConnection): past it, nothing more is read from it.
        self._sends = ReadLimit(int(self.config.get("maxPendingPublishRequestsPerConnection")))
        # WaitForExclusive producers queued for their topic, by producer id
        self._waiting_producers: dict[int, Producer] = {}
        # SEND_RECEIPT rows answered in the current write batch, not yet encoded
        self._receipts: list[tuple[int, int, int, int, int, int]] = []

    # -- driver ----------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.outbox.run_writer)
                nursery.start_soon(self._keepalive)
                await self._reader()
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            self._release_all()
            await trio.aclose_forcefully(self.stream)

    async def _reader(self) -> None:
        while True:
            self.handler.publish_buffer.refresh()
            if self._reads_paused():
                await self._wait_reads_resumed()
            data = await self._read.receive(READ_SIZE)
            if not data:
                return
            self.last_received = time.monotonic()
            try:
                # the answers to what this read brought leave together, in one write
                with write_batch():
                    more = self._handle_read(data)
                if not more:
                    if self._refused:
                        await self.outbox.flush()
                    return
            except RemoteProtocolError as exc:
                log.info("pulsar: closing connection: %s", exc)
                self._send(ev.CommandError.build(request_id=0, error=exc.code, message=str(exc)))
                self.closed = True
                await self.outbox.flush()
                return

    def _reads_paused(self) -> bool:
        """Whether this side has stopped reading the client: this connection's publishes
        or every connection's are past their limit."""
        return self._sends.paused or self.handler.publish_buffer.paused

    async def _wait_reads_resumed(self) -> None:
        """Wait until neither this connection's publishes nor every connection's are past
        their limit."""
        limits = (self._sends, self.handler.publish_buffer)
        while (paused := next((limit for limit in limits if limit.paused), None)) is not None:
            await paused.wait_resumed()
        self.last_received = time.monotonic()  # not idle: it was this side not reading

    def _handle_read(self, data: bytes | bytearray) -> bool:
        """Handle every command ``data`` completes; False once the client closed."""
        handled = 0
        try:
            self.codec.receive_data(data)
            while True:
                # the run of plain SENDs a producer mostly sends, decoded in one call
                sends = self.codec.next_sends()
                if sends:
                    handled += len(sends)
                    self._publish_sends(sends)
                # and the run of individual ACKs a consumer mostly sends
                acks = self.codec.next_acks()
                if acks:
                    handled += len(acks)
                    for consumer_id, request_id, ids, ack_sets in acks:
                        self._ack_individual(consumer_id, request_id, ids, ack_sets)
                event = self.codec.next_event()
                if event is NEED_DATA:
                    return True
                if isinstance(event, ev.ConnectionClosed):
                    return False
                handled += 1
                self._handle(event)
                if self._refused:
                    return False
        finally:
            if handled:
                self.broker.stats.record_request("pulsar", handled)
            if self._held:  # what this read published starts storing now, together
                held, self._held = self._held, set()
                for topic in held:
                    topic.flush()

    async def _keepalive(self) -> None:
        """keepAliveIntervalSeconds, as Pulsar's keep-alive: each interval, a connection
        that has not completed its CONNECT is closed; one that has sent nothing since the
        PING of the interval before is closed; one idle for an interval gets a PING. While
        this side has stopped reading (publish limits), nothing counts against the client."""
        interval = float(self.config.get("keepAliveIntervalSeconds"))
        if interval <= 0:
            return
        ping_sent_at: float | None = None
        while True:
            await trio.sleep(interval)
            idle = time.monotonic() - self.last_received
            if self.codec.state is not State.CONNECTED and idle >= interval:
                why = "sent no CONNECT"
            elif self._reads_paused():
                ping_sent_at = None
                continue
            elif ping_sent_at is not None and self.last_received < ping_sent_at:
                why = "did not answer a ping"
            else:
                ping_sent_at = None
                if idle >= interval:
                    self._send(ev.CommandPing.build())
                    ping_sent_at = time.monotonic()
                continue
            log.info("pulsar: closing connection that %s for %.0fs", why, idle)
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            return

    def _send(self, event: Any) -> None:
        """Queue one frame (see :meth:`_queue`)."""
        self._queue(type(event).__name__, self.codec.send, event)

    def _queue(self, what: str, encode: Callable[..., bytes], *args: Any) -> None:
        """Queue the frames ``encode(*args)`` makes (``what`` they are, for the log).
        Called from other tasks too (topic flushers, dispatchers), so what the connection
        can no longer carry is dropped here, never raised there."""
        if self.closed:
            return
        try:
            frame = encode(*args)
        except ProtocolError as exc:
            log.info("pulsar: not sending %s: %s", what, exc)
            return
        self._put(frame)

    def _put(self, frame: bytes) -> None:
        """Queue an encoded frame behind the receipts still gathered (they were due first)."""
        if self._receipts:
            self._put_receipts()
        self.outbox.put(frame)

    def _put_receipts(self) -> None:
        """Queue the gathered SEND_RECEIPTs, encoded together: the receipts of a stored
        batch are gathered until the end of the write batch they were answered in, and
        leave as one piece."""
        rows, self._receipts = self._receipts, []
        if rows and not self.closed:
            try:
                frames = self.codec.encode_send_receipts(rows)
            except ProtocolError as exc:
                log.info("pulsar: not sending %d SEND_RECEIPT: %s", len(rows), exc)
                return
            self.outbox.put(frames)

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def _release_all(self) -> None:
        for producer in self.producers.values():
            producer.topic.remove_producer(producer)
        for cid, consumer in self.consumers.items():
            topic = self.consumer_topics.get(cid)
            if topic is not None:
                topic.consumer_closed(consumer)
        self.producers.clear()
        self.consumers.clear()

    # -- dispatch of commands ------------------------------------------------------------------------

    def _handle(self, event: Any) -> None:
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is None:
            raise RemoteProtocolError(f"unexpected command {type(event).__name__}")
        handler(event)

    def _error(self, request_id: int, exc: BaseException | int, message: str = "") -> None:
        code = exc if isinstance(exc, int) else _server_error(exc)
        self._send(ev.CommandError.build(request_id=request_id, error=code, message=message or str(exc)))

    def _denied(self, request_id: int, allowed: bool, action: str) -> bool:
        """Answer ``request_id`` with Pulsar's AuthorizationError unless ``allowed``;
        whether it was refused."""
        if allowed:
            return False
        log.warning("pulsar: %s not authorized to %s with role %s", self.peer_address, action, self.role)
        self._error(request_id, E.AuthorizationError, f"Client is not authorized to {action}")
        return True

    def _success(self, request_id: int) -> None:
        self._send(ev.CommandSuccess.build(request_id=request_id))

    def _on_CommandConnect(self, event: Any) -> None:
        cmd = event.command
        if self.broker.auth.authentication_enabled:
            # ServerCnx.handleConnect: the role comes from the CONNECT's credentials; a
            # client without valid ones gets ERROR(AuthenticationError) and is closed.
            identity = self._authenticate(
                cmd.auth_method_name if cmd.HasField("auth_method_name") else None,
                cmd.auth_data if cmd.HasField("auth_data") else None)
            if identity is None:
                return
            self.role = identity.role
            self._credentials_expire = identity.expires_at
            self._refreshable = cmd.feature_flags.supports_auth_refresh
            log.info("pulsar: %s authenticated with role %s", self.peer_address, self.role)
            interval = int(self.config.get("authenticationRefreshCheckSeconds", 60))
            if interval > 0:
                self._spawn(self._refresh_credentials, interval)
        version = min(cmd.protocol_version, MAX_PROTOCOL_VERSION)
        self._tell_end_of_topic = understands_end_of_topic(cmd.client_version, cmd.protocol_version)
        self.client_version = cmd.client_version
        self._send(ev.CommandConnected.build(
            server_version=SERVER_VERSION,
            protocol_version=version,
            max_message_size=int(self.config.get("maxMessageSize")),
            feature_flags=pb.FeatureFlags(supports_broker_entry_metadata=True,
                                          supports_partial_producer=True),
        ))

    def _authenticate(self, method: str | None, data: bytes | None) -> Identity | None:
        """The identity ``method`` and ``data`` prove; None, with the client told
        AuthenticationError and the connection closing, when they prove none."""
        try:
            return self.broker.auth.authenticate(method, data)
        except AuthenticationError as exc:
            log.warning("pulsar: %s %s (role %s): %s", self.peer_address, FAILED_TO_AUTHENTICATE,
                        self.role, exc)
            self._send(ev.CommandError.build(request_id=NO_REQUEST, error=E.AuthenticationError,
                                             message=FAILED_TO_AUTHENTICATE))
            self._refused = True
            return None

    async def _refresh_credentials(self, interval: int) -> None:
        """Every ``interval`` seconds (authenticationRefreshCheckSeconds), as Pulsar's
        ServerCnx: once the role's credentials expired, ask the client for fresh ones
        (AUTH_CHALLENGE); close the connection of a client that cannot refresh them, or
        that did not answer the last challenge."""
        while True:
            await trio.sleep(interval)
            expires = self._credentials_expire
            if self.closed or expires is None or time.time() < expires:
                continue
            if not self._refreshable or self._refresh_pending:
                log.warning("pulsar: %s: closing connection: %s", self.peer_address,
                            "the client's credentials expired and it cannot refresh them"
                            if not self._refreshable else
                            "timeout on refreshing auth credentials")
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                return
            log.info("pulsar: %s: refreshing the credentials of role %s", self.peer_address, self.role)
            self._refresh_pending = True
            self._send(ev.CommandAuthChallenge.build(
                server_version=SERVER_VERSION, protocol_version=self.codec.protocol_version or 0,
                challenge=pb.AuthData(auth_method_name="token", auth_data=REFRESH_AUTH_DATA)))

    def _on_CommandAuthResponse(self, event: Any) -> None:
        """A client's fresh credentials: they must prove the same role (Pulsar:
        "Principal cannot change during an authentication refresh")."""
        self._refresh_pending = False
        response = event.command.response
        identity = self._authenticate(response.auth_method_name or None, response.auth_data)
        if identity is None:
            return
        if identity.role != self.role:
            log.warning("pulsar: %s: closing connection: the role cannot change from %s to %s "
                        "during an authentication refresh", self.peer_address, self.role, identity.role)
            self._refused = True
            return
        self._credentials_expire = identity.expires_at
        log.info("pulsar: %s: refreshed the credentials of role %s", self.peer_address, self.role)

    def _on_CommandPing(self, event: Any) -> None:
        self._send(ev.CommandPong.build())

    def _on_CommandPong(self, event: Any) -> None:
        pass

    # -- lookup -------------------------------------------------------------------------------------

    def _on_CommandLookupTopic(self, event: Any) -> None:
        self._take_lookup(event.command, self._lookup, ev.CommandLookupTopicResponse)

    def _take_lookup(self, cmd: Any, answer: Callable[[Any], Awaitable[None]], response: Any) -> None:
        """Answer `cmd` in a task of its own, counted against maxConcurrentLookupRequest over
        every connection; past it, fail it at once with a `response` of TooManyRequests."""
        if self.handler.pending_lookups >= self.handler.max_lookups:
            self._send(response.build(request_id=cmd.request_id, response=response.PB.Failed,
                                      error=pb.TooManyRequests, message=TOO_MANY_LOOKUPS))
            return
        self.handler.pending_lookups += 1
        self._spawn(self._counted_lookup, answer, cmd)

    async def _counted_lookup(self, answer: Callable[[Any], Awaitable[None]], cmd: Any) -> None:
        try:
            await answer(cmd)
        finally:
            self.handler.pending_lookups -= 1

    async def _lookup(self, cmd: Any) -> None:
        try:
            name = TopicName.parse(cmd.topic)
            self.broker.namespace_policies(name.namespace_name)
        except Exception as exc:
            self._send(ev.CommandLookupTopicResponse.build(
                request_id=cmd.request_id, response=pb.CommandLookupTopicResponse.Failed,
                error=_server_error(exc), message=str(exc)))
            return
        if not self.broker.auth.can_lookup(name, self.role):
            self._send(ev.CommandLookupTopicResponse.build(
                request_id=cmd.request_id, response=pb.CommandLookupTopicResponse.Failed,
                error=E.AuthorizationError, message="Client is not authorized to Lookup"))
            return
        wanted = cmd.advertised_listener_name if cmd.HasField("advertised_listener_name") else ""
        urls = self.broker.pulsar_listener(wanted)
        if urls is None:
            self._send(ev.CommandLookupTopicResponse.build(
                request_id=cmd.request_id, response=pb.CommandLookupTopicResponse.Failed,
                error=pb.ServiceNotReady,
                message=f"the broker has no advertised listener named {wanted!r}"))
            return
        tls = {"brokerServiceUrlTls": urls["pulsar+ssl"]} if "pulsar+ssl" in urls else {}
        self._send(ev.CommandLookupTopicResponse.build(
            request_id=cmd.request_id, response=pb.CommandLookupTopicResponse.Connect,
            brokerServiceUrl=urls.get("pulsar", ""), authoritative=True,
            proxy_through_service_url=False, **tls))

    def _on_CommandPartitionedTopicMetadata(self, event: Any) -> None:
        self._take_lookup(event.command, self._partitioned_metadata,
                          ev.CommandPartitionedTopicMetadataResponse)

    async def _partitioned_metadata(self, cmd: Any) -> None:
        R = pb.CommandPartitionedTopicMetadataResponse
        try:
            name = TopicName.parse(cmd.topic)
            if not self.broker.auth.can_lookup(name, self.role):
                self._send(ev.CommandPartitionedTopicMetadataResponse.build(
                    request_id=cmd.request_id, response=R.Failed, error=E.AuthorizationError,
                    message="Client is not authorized to Get Partition Metadata"))
                return
            n = await self.broker.partitioned_metadata(name)
        except Exception as exc:
            self._send(ev.CommandPartitionedTopicMetadataResponse.build(
                request_id=cmd.request_id, response=R.Failed, error=_server_error(exc), message=str(exc)))
            return
        self._send(ev.CommandPartitionedTopicMetadataResponse.build(
            request_id=cmd.request_id, response=R.Success, partitions=n))

    def _on_CommandGetTopicsOfNamespace(self, event: Any) -> None:
        self._spawn(self._topics_of_namespace, event.command)

    async def _topics_of_namespace(self, cmd: Any) -> None:
        limit = self.codec.peer_max_frame_size
        try:
            ns = NamespaceName.parse(cmd.namespace)
            if self._denied(cmd.request_id, self.broker.auth.can_list_topics(ns, self.role), "Get Topics"):
                return
            # sorted: non-persistent:// names come before persistent:// ones
            domains = sorted({0: ["persistent"], 1: ["non-persistent"],
                              2: ["persistent", "non-persistent"]}[cmd.mode])
            # A partition's name takes its bytes and two of field overhead in the answer;
            # partitions no frame the client takes can hold are refused before their names
            # are made (ten million would take the broker half a minute).
            partitioned = [p for d in domains for p in self.broker.partitioned_topics(ns, d)]
            size = sum(n * (len(str(name)) + len(PARTITION_SUFFIX) + len(str(n)) + 2)
                       for name, n in partitioned)
            if size > limit:
                self._error(cmd.request_id, E.NotAllowedError,
                            f"The topics of {ns} ({sum(n for _, n in partitioned)} partitions "
                            f"alone) take more than the {limit} bytes of one frame")
                return
            topics = [t for d in domains for t in await self.broker.topic_names(ns, d)]
        except Exception as exc:
            self._error(cmd.request_id, exc)
            return
        answer = ev.CommandGetTopicsOfNamespaceResponse.build(
            request_id=cmd.request_id, topics=topics, filtered=False, changed=True)
        try:
            frame = self.codec.send(answer)
        except ProtocolError as exc:  # over the frame with the other topics counted too
            self._error(cmd.request_id, E.NotAllowedError, f"The topics of {ns}: {exc}")
            return
        self._put(frame)

    # -- producers ------------------------------------------------------------------------------------

    def _on_CommandProducer(self, event: Any) -> None:
        self._spawn(self._producer, event.command)

    async def _producer(self, cmd: Any) -> None:
        self._closed_by_broker.discard(cmd.producer_id)
        if cmd.producer_id in self.producers:
            p = self.producers[cmd.producer_id]
            self._send(ev.CommandProducerSuccess.build(
                request_id=cmd.request_id, producer_name=p.name, last_sequence_id=-1,
                producer_ready=True, **_epoch_of(p)))
            return
        try:
            name = TopicName.parse(cmd.topic)
            auth = self.broker.auth
            if self._denied(cmd.request_id, auth.can_produce(name, self.role) and (
                    not cmd.initial_subscription_name or auth.can_consume(name, self.role)), "Produce"):
                return
            topic = await self.broker.get_topic(name)
            schema_version = await self.broker.schemas.add_or_check(
                topic, cmd.schema if cmd.HasField("schema") else None)
            pname = cmd.producer_name if cmd.HasField("producer_name") and cmd.producer_name \
                else self.handler.new_producer_name()
            mode = ProducerAccessMode(cmd.producer_access_mode) if cmd.HasField("producer_access_mode") \
                else ProducerAccessMode.Shared
            producer = Producer(topic, cmd.producer_id, pname, mode,
                                metadata={kv.key: kv.value for kv in cmd.metadata},
                                address=self.peer_address, client_version=self.client_version,
                                topic_epoch=cmd.topic_epoch if cmd.HasField("topic_epoch") else None)
            producer.on_fenced = lambda: self._fenced(producer)
            if topic.encryption_required and not cmd.encrypted:
                raise EncryptionRequiredError(f"Encryption is required in {name}")
            if cmd.initial_subscription_name:
                await self._create_initial_subscription(topic, cmd.initial_subscription_name)

            def queued() -> None:
                # As Pulsar's broker answers a WaitForExclusive producer it queues: not
                # ready yet, so the client waits for the second answer without a timeout.
                self._waiting_producers[cmd.producer_id] = producer
                self._send(ev.CommandProducerSuccess.build(
                    request_id=cmd.request_id, producer_name=pname, last_sequence_id=-1,
                    producer_ready=False))

            try:
                await topic.add_producer(producer, on_queued=queued)
            finally:
                self._waiting_producers.pop(cmd.producer_id, None)
        except Exception as exc:
            self._error(cmd.request_id, exc)
            return
        if self.closed:
            topic.remove_producer(producer)
            return
        self.producers[cmd.producer_id] = producer
        last = topic.dedup_persisted.get(pname, -1) if topic.dedup_enabled else -1
        self._send(ev.CommandProducerSuccess.build(
            request_id=cmd.request_id, producer_name=pname, last_sequence_id=last,
            schema_version=schema_version, producer_ready=True, **_epoch_of(producer)))

    async def _create_initial_subscription(self, topic: PersistentTopic, sub: str) -> None:
        """The subscription a producer asks to exist before it publishes (what a client's
        dead-letter policy asks for its dead-letter topic), from the earliest message, as
        Pulsar creates it: on persistent topics, where auto subscription creation is
        allowed."""
        if not topic.name.persistent or sub in topic.subscriptions:
            return
        if not topic.auto_subscription_creation_allowed:
            raise NotAllowedError("Failed to create the initial subscription: Could not create "
                                  "the initial subscription due to the auto subscription "
                                  "creation is not allowed.")
        try:
            await topic.create_subscription(sub, None, earliest=True)
        except ConflictError:
            pass  # another producer's request created it meanwhile

    def _fenced(self, producer: Producer) -> None:
        self.producers.pop(producer.producer_id, None)
        self._closed_by_broker.add(producer.producer_id)
        self._send(ev.CommandCloseProducer.build(producer_id=producer.producer_id, request_id=0))

    def _on_CommandSend(self, event: Any) -> None:
        cmd, md = event.command, event.metadata
        self._publish(cmd.producer_id, cmd.sequence_id, cmd.num_messages, cmd.highest_sequence_id,
                      event.entry, event.checksum_ok, md is not None and md.HasField("deliver_at_time"),
                      encrypted=md is not None and bool(md.encryption_keys),
                      chunked=md is not None and md.num_chunks_from_msg > 1)

    def _publish_sends(self, sends: list[PlainSend]) -> None:
        """Store the plain SENDs of a read: each producer's run of them, back to back, as
        one :class:`PublishRun` when nothing in it needs a look of its own (see
        :meth:`_publish_run`), else one by one."""
        start, n = 0, len(sends)
        while start < n:
            pid = sends[start][0]
            end = start + 1
            while end < n and sends[end][0] == pid:
                end += 1
            run = sends[start:end] if start or end < n else sends
            if not self._publish_run(pid, run):
                for _, seq, num, highest, entry, checksum_ok, delayed in run:
                    self._publish(pid, seq, num, highest, entry, checksum_ok, delayed, encrypted=False)
            start = end

    def _publish_run(self, pid: int, sends: list[PlainSend]) -> bool:
        """Store ``sends`` (plain SENDs of producer ``pid``) as one run, answered with a
        receipt each as :meth:`_publish` answers one; False, with nothing done, when one of
        them needs an answer or a look of its own (no such producer, a bad checksum, a
        delivery time, a topic that wants encryption, or one the run cannot go to)."""
        producer = self.producers.get(pid)
        if producer is None:
            return False
        _, seqs, nums, highs, entries, checksums_ok, delayed = zip(*sends, strict=True)
        topic = producer.topic
        if not all(checksums_ok) or any(delayed) or topic.encryption_required:
            return False
        # a receipt names the batch's highest sequence id, never one below the SEND's own
        highest = [h if h > s else s for s, h in zip(seqs, highs, strict=True)]
        size = sum(map(len, entries))
        partition = topic.partition_index

        def done(part: PublishRun, rows: StoredRows | None, error: BaseException | None) -> None:
            self._sends.give(len(part.entries))
            self.handler.publish_buffer.give(sum(map(len, part.entries)))
            if rows is None:
                for seq in part.context:
                    self._publish_failed(pid, seq, error)
                return
            receipts = self._receipts
            first = not receipts
            receipts.extend([(pid, seq, row[0], row[1], partition, hi)
                             for seq, hi, row in zip(part.context, part.sequence_ids, rows, strict=True)])
            if first and not flush_at_end(self._put_receipts):
                self._put_receipts()  # not inside a write batch: at once

        run = PublishRun(list(entries), list(nums), producer.name, highest, list(seqs), done)
        # pending from the moment the topic has them: a topic may answer at once
        self._sends.take(len(sends))
        self.handler.publish_buffer.take(size)
        if not topic.publish_run(run, hold=True):
            self._sends.give(len(sends))
            self.handler.publish_buffer.give(size)
            return False
        producer.msg_in += sum(nums)
        producer.bytes_in += size
        self._held.add(topic)
        return True

    def _publish_failed(self, pid: int, seq: int, error: BaseException | None) -> None:
        """SEND_ERROR for a SEND that could not be stored."""
        code = _server_error(error) if error is not None else E.UnknownError
        self._send_error(pid, seq, E.PersistenceError if code == E.UnknownError else code, str(error))

    def _publish(self, pid: int, seq: int, num: int, highest: int, entry: bytes, checksum_ok: bool,
                 delayed: bool, *, encrypted: bool, chunked: bool = False) -> None:
        """Store a SEND's ``entry`` and answer it: the receipt once it is durable, or
        SEND_ERROR. ``num`` messages (1 when the SEND did not say), ``highest`` the batch's
        highest sequence id (0 when not said, so never above ``seq``); ``chunked`` when it
        is a chunk of a large message (the plain SENDs of the fast path never are)."""
        producer = self.producers.get(pid)
        if producer is None:
            if pid in self._closed_by_broker:
                return
            self._send_error(pid, seq, E.NotAllowedError, "Producer is not connected")
            return
        if not checksum_ok:
            self._send_error(pid, seq, E.ChecksumError, "Checksum failed on the broker")
            return
        topic = producer.topic
        if topic.encryption_required and not encrypted:
            self._send_error(pid, seq, E.MetadataError, "Messages must be encrypted")
            return
        if delayed:
            limit = topic.max_delivery_delay_ms
            if limit > 0 and _delivery_delay(entry) > limit:
                self._send_error(pid, seq, E.NotAllowedError,
                                 f"Exceeds max allowed delivery delay of {limit} milliseconds")
                return
            topic.note_delayed()
        if chunked:
            topic.note_chunked()
        if highest < seq:
            highest = seq
        size = len(entry)
        producer.msg_in += num
        producer.bytes_in += size
        partition = topic.partition_index
        self._sends.take(1)
        self.handler.publish_buffer.take(size)

        def done(result: PublishResult) -> None:
            self._sends.give(1)
            self.handler.publish_buffer.give(size)
            if result.error is not None:
                self._publish_failed(pid, seq, result.error)
                return
            pos = result.position
            ledger, entry_id = (pos.ledger_id, pos.entry_id) if pos else (_EARLIEST_LEDGER, _EARLIEST_LEDGER)
            receipts = self._receipts
            receipts.append((pid, seq, ledger, entry_id, partition, highest))
            if len(receipts) == 1 and not flush_at_end(self._put_receipts):
                self._put_receipts()  # not inside a write batch: at once

        topic.publish(entry, num, producer.name, highest, done, hold=True, chunked=chunked)
        self._held.add(topic)

    def _send_error(self, producer_id: int, sequence_id: int, code: int, message: str) -> None:
        self._send(ev.CommandSendError.build(producer_id=producer_id, sequence_id=sequence_id,
                                             error=code, message=message))

    def _on_CommandCloseProducer(self, event: Any) -> None:
        cmd = event.command
        producer = self.producers.pop(cmd.producer_id, None) or \
            self._waiting_producers.get(cmd.producer_id)  # one that waits gives up
        self._closed_by_broker.discard(cmd.producer_id)
        if producer is not None:
            producer.topic.remove_producer(producer)
        self._success(cmd.request_id)

    # -- consumers ------------------------------------------------------------------------------------

    def _on_CommandSubscribe(self, event: Any) -> None:
        self._spawn(self._subscribe, event.command)

    async def _subscribe(self, cmd: Any) -> None:
        if cmd.consumer_id in self.consumers:
            self._success(cmd.request_id)
            return
        try:
            name = TopicName.parse(cmd.topic)
            if not cmd.subscription.strip():
                # Pulsar's clients refuse it before they send; a subscription is stored by name
                raise NotAllowedError("Empty subscription name")
            refusal = self.broker.auth.subscribe_refusal(name, self.role, cmd.subscription)
            if refusal is not None:
                log.warning("pulsar: %s not authorized to subscribe to %s with role %s: %s",
                            self.peer_address, name, self.role, refusal)
                self._error(cmd.request_id, E.AuthorizationError, refusal)
                return
            topic = await self.broker.get_topic(name, create=not cmd.HasField("force_topic_creation")
                                                or cmd.force_topic_creation)
            if cmd.HasField("schema"):
                await self.broker.schemas.check_consumer(topic, cmd.schema)
            sticky = None
            if cmd.HasField("keySharedMeta") and cmd.keySharedMeta.keySharedMode == pb.STICKY:
                sticky = [(r.start, r.end) for r in cmd.keySharedMeta.hashRanges]
            sub_type = SubType(cmd.subType)
            if cmd.read_compacted and (not name.persistent
                                       or sub_type not in (SubType.Exclusive, SubType.Failover)):
                raise NotAllowedError("Read compacted can only be used with exclusive or failover "
                                      "persistent subscriptions")
            consumer = Consumer(cmd.consumer_id, cmd.consumer_name or f"consumer-{cmd.consumer_id}",
                                self, priority=cmd.priority_level, sticky_ranges=sticky,
                                read_compacted=cmd.read_compacted,
                                metadata={kv.key: kv.value for kv in cmd.metadata},
                                allow_out_of_order=cmd.HasField("keySharedMeta")
                                and cmd.keySharedMeta.allowOutOfOrderDelivery)
            durable = not cmd.HasField("durable") or cmd.durable
            if durable and name.persistent and cmd.subscription not in topic.subscriptions \
                    and not topic.auto_subscription_creation_allowed:
                raise SubscriptionNotFoundError("Subscription does not exist")
            start = None
            if not durable and cmd.HasField("start_message_id"):
                start = await self._reader_start(topic, cmd)
            created = cmd.subscription not in topic.subscriptions
            sub = await topic.subscribe(cmd.subscription, consumer, sub_type,
                                        earliest=cmd.initialPosition == pb.CommandSubscribe.Earliest,
                                        durable=durable, start=start,
                                        replicated=cmd.replicate_subscription_state)
            if created and cmd.subscription_properties:
                # as in Pulsar, a subscription takes its properties when it is created
                await sub.cursor.set_properties({kv.key: kv.value for kv in cmd.subscription_properties})
        except Exception as exc:
            self._error(cmd.request_id, exc)
            return
        if self.closed:
            topic.consumer_closed(consumer)
            return
        self.consumers[cmd.consumer_id] = consumer
        self.consumer_topics[cmd.consumer_id] = topic
        self._success(cmd.request_id)

    async def _reader_start(self, topic: PersistentTopic, cmd: Any) -> Position:
        mid = cmd.start_message_id
        if cmd.start_message_rollback_duration_sec > 0:
            t = int(time.time() * 1000) - cmd.start_message_rollback_duration_sec * 1000
            pos = await topic.ml.find_by_publish_time(t)
            if pos is not None:
                return pos
        # A reader starts at the given message, as Pulsar's broker starts it: the client
        # drops that message itself unless the reader is inclusive (and the messages of a
        # batch before it, which an entry's start cannot skip).
        return _position_of(topic, mid, inclusive=True)

    def send_messages(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        topic = self.consumer_topics.get(consumer.consumer_id)
        partition = topic.partition_index if topic is not None else -1
        self._queue("MESSAGE", self.codec.encode_messages, consumer.consumer_id, partition, [
            (e.position.ledger_id, e.position.entry_id, d.redelivery_count, d.ack_set,
             e.publish_time, e.index, e.data)
            for d in deliveries for e in (d.entry,)])

    def writable(self) -> bool:
        """Whether this connection takes more messages now: a client that does not read
        its socket gets no more dispatched, as Pulsar skips a consumer whose channel is not
        writable, until it has read most of what waits."""
        return self.outbox.writable()

    def _writable_again(self) -> None:
        for consumer in list(self.consumers.values()):
            if consumer.subscription is not None:
                consumer.subscription.wake_for_room()

    def reached_end_of_topic(self, consumer: Consumer) -> None:
        if not self._tell_end_of_topic:
            return
        self._send(ev.CommandReachedEndOfTopic.build(consumer_id=consumer.consumer_id))

    def active_consumer_changed(self, consumer: Consumer, active: bool) -> None:
        self._send(ev.CommandActiveConsumerChange.build(consumer_id=consumer.consumer_id, is_active=active))

    def _on_CommandFlow(self, event: Any) -> None:
        consumer = self.consumers.get(event.command.consumer_id)
        if consumer is not None:
            consumer.flow(event.command.messagePermits)

    def _acking(self, consumer_id: int, request_id: int | None) -> Consumer | None:
        """The attached consumer an ACK names; None, answered ConsumerNotFound when the
        client asked for a response, when there is none."""
        consumer = self.consumers.get(consumer_id)
        if consumer is None or consumer.subscription is None:
            self._ack_response(consumer_id, request_id, error=E.ConsumerNotFound, message="Consumer not found")
            return None
        return consumer

    def _ack_response(self, consumer_id: int, request_id: int | None, **error: Any) -> None:
        """ACK_RESPONSE, when the ACK asked for one (``request_id``)."""
        if request_id is not None:
            self._send(ev.CommandAckResponse.build(consumer_id=consumer_id, request_id=request_id, **error))

    def _ack_individual(self, consumer_id: int, request_id: int | None, ids: list[tuple[int, int]],
                        ack_sets: list[list[int] | None] | None) -> None:
        """An individual ACK (see :data:`PlainAck`): whole entries, or with ``ack_sets``
        batch indexes too; ACK_RESPONSE when ``request_id`` asks for one."""
        consumer = self._acking(consumer_id, request_id)
        if consumer is None:
            return
        sub = consumer.subscription
        assert sub is not None
        positions = list(map(_tuple_new, repeat(Position), ids))
        if ack_sets is None:
            sub.ack_entries(consumer, positions)
        else:
            sub.ack_individual(consumer, list(zip(positions, ack_sets, strict=True)))
        self._ack_response(consumer_id, request_id)

    def _on_CommandAck(self, event: Any) -> None:
        """An ACK in a shape :meth:`PulsarConnection.next_acks` leaves to the general
        decoder: a cumulative one, or one with properties or a transaction."""
        cmd = event.command
        request_id = cmd.request_id if cmd.HasField("request_id") else None
        if cmd.ack_type != pb.CommandAck.Cumulative:
            top = _LATEST_LEDGER  # ids past a long's range name no entry (_entry_of)
            named = [m for m in cmd.message_id if m.ledgerId <= top and m.entryId <= top]
            sets = [list(m.ack_set) if m.ack_set else None for m in named]
            self._ack_individual(cmd.consumer_id, request_id, [(m.ledgerId, m.entryId) for m in named],
                                 sets if any(sets) else None)
            return
        consumer = self._acking(cmd.consumer_id, request_id)
        if consumer is None:
            return
        sub = consumer.subscription
        assert sub is not None
        if len(cmd.message_id) != 1 or sub.sub_type in (SubType.Shared, SubType.Key_Shared):
            # Pulsar's broker ignores these too: a cumulative ack names one message, and on
            # a subscription whose consumers share the messages it would acknowledge theirs.
            log.warning("pulsar: ignoring a cumulative ack of %d message ids on %s subscription %s",
                        len(cmd.message_id), SubType(sub.sub_type).name, sub.name)
        elif (pos := _entry_of(mid := cmd.message_id[0])) is not None:
            if mid.ack_set:
                # A cumulative ack inside a batch acknowledges up to the previous entry.
                sub.ack_individual(consumer, [(pos, list(mid.ack_set))])
                pos = Position(mid.ledgerId, mid.entryId - 1)
            if pos.entry_id >= 0:
                sub.ack_cumulative(consumer, pos)
        self._ack_response(cmd.consumer_id, request_id)

    def _on_CommandRedeliverUnacknowledgedMessages(self, event: Any) -> None:
        cmd = event.command
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None or consumer.subscription is None:
            return
        if not cmd.message_ids:
            consumer.subscription.redeliver(consumer, None)  # all its unacknowledged
            return
        positions = [pos for m in cmd.message_ids if (pos := _entry_of(m)) is not None]
        if positions:
            consumer.subscription.redeliver(consumer, positions)

    def _on_CommandUnsubscribe(self, event: Any) -> None:
        self._spawn(self._unsubscribe, event.command)

    def _attached(self, cmd: Any) -> tuple[Consumer, PersistentTopic, Subscription] | None:
        """The consumer a command names, its topic and subscription; or answers
        ConsumerNotFound and returns None."""
        consumer = self.consumers.get(cmd.consumer_id)
        topic = self.consumer_topics.get(cmd.consumer_id)
        if consumer is None or topic is None or consumer.subscription is None:
            self._error(cmd.request_id, E.ConsumerNotFound, "Consumer not found")
            return None
        return consumer, topic, consumer.subscription

    async def _unsubscribe(self, cmd: Any) -> None:
        attached = self._attached(cmd)
        if attached is None:
            return
        consumer, topic, sub = attached
        if len(sub.consumers) > 1:
            if not cmd.force:
                # Pulsar's answer (a ServerMetadataException) to a consumer that is not alone
                self._error(cmd.request_id, E.MetadataError,
                            "Unconnected or shared consumer attempting to unsubscribe")
                return
            sub.disconnect_consumers(keep=consumer)  # a forced unsubscribe
        topic.consumer_closed(consumer)
        del self.consumers[cmd.consumer_id]
        try:
            await topic.unsubscribe(sub.name)
        except Exception as exc:
            self._error(cmd.request_id, exc)
            return
        self._success(cmd.request_id)

    def _on_CommandCloseConsumer(self, event: Any) -> None:
        cmd = event.command
        consumer = self.consumers.pop(cmd.consumer_id, None)
        topic = self.consumer_topics.pop(cmd.consumer_id, None)
        if consumer is not None and topic is not None:
            topic.consumer_closed(consumer)
        self._success(cmd.request_id)

    def _on_CommandSeek(self, event: Any) -> None:
        self._spawn(self._seek, event.command)

    async def _seek(self, cmd: Any) -> None:
        attached = self._attached(cmd)
        if attached is None:
            return
        _, topic, sub = attached
        if not topic.name.persistent:
            self._error(cmd.request_id, E.NotAllowedError, "Seek is not allowed on a non-persistent topic")
            return
        try:
            if cmd.HasField("message_publish_time"):
                pos = await topic.ml.find_by_publish_time(cmd.message_publish_time) or _after_last(topic)
            else:
                pos = _position_of(topic, cmd.message_id, inclusive=True)
            await sub.reset_to(pos)
        except Exception as exc:
            self._error(cmd.request_id, exc)
            return
        # As Pulsar does, the subscription's consumers are disconnected before the seek is
        # answered; the clients reconnect and receive from the new position. The other
        # order let the client take the answer for a finished seek and subscribe again
        # from where it had read, after the reset.
        sub.disconnect_consumers(reset=True)
        self._success(cmd.request_id)

    def broker_closed_consumer(self, consumer: Consumer, *, reset: bool = False) -> None:
        topic = self.consumer_topics.pop(consumer.consumer_id, None)
        self.consumers.pop(consumer.consumer_id, None)
        if topic is not None:
            topic.consumer_closed(consumer, reset=reset)
        self._send(ev.CommandCloseConsumer.build(consumer_id=consumer.consumer_id, request_id=0))

    def _on_CommandGetLastMessageId(self, event: Any) -> None:
        self._spawn(self._last_message_id, event.command)

    async def _last_message_id(self, cmd: Any) -> None:
        attached = self._attached(cmd)
        if attached is None:
            return
        consumer, topic, sub = attached
        if not topic.name.persistent:
            self._error(cmd.request_id, E.NotAllowedError,
                        "GetLastMessageId is not allowed on a non-persistent topic")
            return
        partition = topic.name.partition_index
        last = topic.ml.last_confirmed()
        view = topic.compacted_view() if consumer.read_compacted else None
        if view is not None and last is not None and view[1] >= last:
            # As Pulsar answers a compacted read once compaction covers the whole topic: the
            # last message the compacted view keeps (its tombstoned tail is never read)
            kept, _, masks = view
            if not kept:
                mid = pb.MessageIdData(ledgerId=_EARLIEST_LEDGER, entryId=_EARLIEST_LEDGER,
                                       partition=partition)
            else:
                pos = kept[-1]
                if pos in masks:
                    batch_index = _last_set_bit(masks[pos])
                else:
                    entries = await topic.ml.read_entries(pos, 1)
                    batch_index = _largest_batch_index(entries[0]) if entries else -1
                mid = pb.MessageIdData(ledgerId=pos.ledger_id, entryId=pos.entry_id,
                                       partition=partition, batch_index=batch_index)
        elif last is None:
            mid = pb.MessageIdData(ledgerId=_EARLIEST_LEDGER, entryId=_EARLIEST_LEDGER,
                                   partition=partition)
        else:
            entries = await topic.ml.read_entries(last, 1)
            batch_index = _largest_batch_index(entries[0]) if entries else -1
            mid = pb.MessageIdData(ledgerId=last.ledger_id, entryId=last.entry_id,
                                   partition=partition, batch_index=batch_index)
        md = sub.cursor.mark_delete_position()
        self._send(ev.CommandGetLastMessageIdResponse.build(
            last_message_id=mid, request_id=cmd.request_id,
            consumer_mark_delete_position=pb.MessageIdData(
                ledgerId=md.ledger_id & _EARLIEST_LEDGER, entryId=md.entry_id & _EARLIEST_LEDGER)))

    def _on_CommandConsumerStats(self, event: Any) -> None:
        cmd = event.command
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None or consumer.subscription is None:
            self._send(ev.CommandConsumerStatsResponse.build(
                request_id=cmd.request_id, error_code=E.ConsumerNotFound, error_message="Consumer not found"))
            return
        sub = consumer.subscription
        self._send(ev.CommandConsumerStatsResponse.build(
            request_id=cmd.request_id,
            consumerName=consumer.name,
            availablePermits=max(consumer.permits, 0),
            unackedMessages=consumer.unacked_messages,
            blockedConsumerOnUnackedMsgs=consumer.blocked_on_unacked,
            address=str(getattr(self.stream, "socket", "")),
            connectedSince=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(consumer.connected_since)),
            type=SubType(sub.sub_type).name,
            msgBacklog=sub.backlog(),
        ))

    # -- schemas -------------------------------------------------------------------------------------------

    def _on_CommandGetSchema(self, event: Any) -> None:
        cmd = event.command
        try:
            name = TopicName.parse(cmd.topic)
            if not self.broker.auth.can_lookup(name, self.role):
                # a schema is read by those who may produce or consume the topic
                raise _NotAuthorized("Client is not authorized to Get Schema")
            found = self.broker.schemas.get(name, cmd.schema_version if cmd.HasField("schema_version") else None)
        except Exception as exc:
            self._send(ev.CommandGetSchemaResponse.build(request_id=cmd.request_id, error_code=_server_error(exc),
                                                         error_message=str(exc)))
            return
        if found is None:
            self._send(ev.CommandGetSchemaResponse.build(request_id=cmd.request_id, error_code=E.TopicNotFound,
                                                         error_message="Schema not found"))
            return
        schema, version = found
        self._send(ev.CommandGetSchemaResponse.build(request_id=cmd.request_id, schema=schema,
                                                     schema_version=version))

    def _on_CommandGetOrCreateSchema(self, event: Any) -> None:
        self._spawn(self._get_or_create_schema, event.command)

    async def _get_or_create_schema(self, cmd: Any) -> None:
        try:
            name = TopicName.parse(cmd.topic)
            if not self.broker.auth.can_produce(name, self.role):
                raise _NotAuthorized("Client is not authorized to Produce")
            topic = await self.broker.get_topic(name)
            version = await self.broker.schemas.add_or_check(topic, cmd.schema)
        except Exception as exc:
            self._send(ev.CommandGetOrCreateSchemaResponse.build(
                request_id=cmd.request_id, error_code=_server_error(exc), error_message=str(exc)))
            return
        self._send(ev.CommandGetOrCreateSchemaResponse.build(request_id=cmd.request_id, schema_version=version))

