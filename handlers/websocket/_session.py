"""The WebSocket sessions' common part: the trio driver between one WebSocket (an ASGI
connection on the web service) and the BrokerService, and the answer to an upgrade that
fails.

Each session is opened before the WebSocket is accepted, as Pulsar's handlers create their
producer, consumer or reader in the upgrade request: a failure answers the upgrade with an
HTTP error (:func:`handshake_status`) and no WebSocket is opened. Once open, one nursery
per session: a reader of the client's frames, and a writer that sends what the session
queued (answers, and messages that dispatch hands over from the subscription's task). What
waits to be written is bounded: by the permits a consumer or reader has (its receive queue,
or in pull mode what the client permitted), by the publishes a producer has in flight.

On a partitioned topic the session holds one producer or consumer per partition, as
Pulsar's partitioned producer and multi-topic consumer do; message ids carry the partition.
When the broker closes one of them (an unload, a seek, a fenced producer), the session
attaches again, as Pulsar's client under the WebSocket service reconnects, and the WebSocket
stays open.
"""

from __future__ import annotations

import abc
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from core.broker import NamespaceNotFoundError, TopicNotFoundError
from core.naming import InvalidNameError, TopicName
from core.policies import NotFoundError
from core.schema import IncompatibleSchemaError
from core.subscription import (
    ConsumerBusyError,
    SubscriptionTypeMismatchError,
)
from core.topic import (
    BacklogQuotaExceededError,
    ProducerBusyError,
    ProducerFencedError,
    TopicTerminatedError,
)
from handlers.websocket._codec import (
    Endpoint,
    InvalidParams,
    Kind,
    WebSocketError,
)

__all__ = ["CLOSE_SERVER_ERROR", "Receive", "Send", "Session", "Socket", "handshake_message",
           "handshake_status", "next_id"]

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

OUTBOX_LIMIT = 1024
"""Frames a session queues for its client before its consumers take no more messages."""
CLOSE_TIMEOUT = 5.0
"""Seconds a session that closes waits for what it queued, and its close frame, to go."""
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
"""The close code of a session whose client sent what Pulsar refuses (a frame that is not
its JSON). Pulsar names its own code in the reason; codes below 1000 cannot be sent in a
close frame (RFC 6455, 7.4)."""
CLOSE_SERVER_ERROR = 1011

_ids = iter(range(1, 1 << 62))


def next_id() -> int:
    """A producer or consumer id no other WebSocket session has."""
    return next(_ids)


def handshake_status(kind: Kind, exc: BaseException) -> int:
    """The HTTP status Pulsar's WebSocket handlers answer an upgrade with when the producer
    or consumer cannot be created (``AbstractWebSocketHandler.getErrorCode``); a reader
    that cannot be created is answered 500, whatever the cause, as Pulsar's is."""
    if kind is Kind.reader:
        return 500
    match exc:
        case InvalidParams() | InvalidNameError():
            return 400
        case TopicNotFoundError() | NamespaceNotFoundError() | NotFoundError():
            return 404
        case (ProducerBusyError() | ConsumerBusyError() | SubscriptionTypeMismatchError()
              | ProducerFencedError() | IncompatibleSchemaError()):
            return 409
        case BacklogQuotaExceededError() | TopicTerminatedError():
            return 503
    return 500


def handshake_message(kind: Kind, exc: BaseException) -> str:
    if kind is Kind.reader:
        return f"Failed to create reader: {exc}"
    if isinstance(exc, InvalidParams | InvalidNameError):
        return f"Invalid query params: {exc}"
    return f"Failed to create producer/consumer: {exc}"


class Socket:
    """The ASGI side of one WebSocket: frames queued by any task and sent in order by
    :meth:`run_writer`; ``on_room`` is called when a full queue has drained to half."""

    def __init__(self, send: Send):
        self._send = send
        self._frames: deque[dict[str, Any]] = deque()
        self._wake = trio.Event()
        self._full = False
        self.closed = False
        self.close_sent = trio.Event()
        self.last_active = trio.current_time()
        self.on_room: Callable[[], None] = lambda: None

    def put(self, text: str) -> None:
        if self.closed:
            return
        self._frames.append({"type": "websocket.send", "text": text})
        if len(self._frames) >= OUTBOX_LIMIT:
            self._full = True
        self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """Close after what is queued: the writer sends the close frame and returns."""
        if self.closed:
            return
        self._frames.append({"type": "websocket.close", "code": code, "reason": reason[:120]})
        self.closed = True
        self._wake.set()

    def writable(self) -> bool:
        return not self._full and not self.closed

    async def close_when_idle(self, idle_seconds: float) -> None:
        """Close the WebSocket once nothing went either way for ``idle_seconds``
        (``webSocketSessionIdleTimeoutMillis``, Jetty's idle timeout under Pulsar's)."""
        while not self.closed:
            idle_until = self.last_active + idle_seconds
            if trio.current_time() >= idle_until:
                self.close(CLOSE_GOING_AWAY, "Connection Idle Timeout")
                return
            await trio.sleep_until(idle_until)

    async def run_writer(self) -> None:
        while not self.close_sent.is_set():
            while self._frames:
                frame = self._frames.popleft()
                try:
                    await self._send(frame)
                except Exception as exc:  # the client went away: nothing more to send
                    log.debug("websocket: send failed: %s", exc)
                    self.closed = True
                    self.close_sent.set()
                    return
                self.last_active = trio.current_time()
                if frame["type"] == "websocket.close":
                    self.close_sent.set()
                    return
                if self._full and len(self._frames) <= OUTBOX_LIMIT // 2:
                    self._full = False
                    self.on_room()
            self._wake = trio.Event()
            await self._wake.wait()


def _peer(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"/{client[0]}:{client[1]}" if client else ""


def _user_agent(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"user-agent":
            return str(value.decode("latin-1"))
    return ""


class Session(abc.ABC):
    """What the three endpoints share: the socket, the topic's partitions, and the loop
    reading the client's text frames. Each endpoint's session opens its producer,
    consumer or reader (:meth:`open`), reads the client's frames (:meth:`on_text`) and
    lets go of what it opened (:meth:`release`)."""

    def __init__(self, broker: Any, config: Any, scope: dict[str, Any], endpoint: Endpoint,
                 send: Send):
        assert endpoint.topic is not None
        self.broker = broker
        self.config = config
        self.name = endpoint.topic
        self.peer_address = _peer(scope)
        self.client_version = _user_agent(scope)
        self.query = scope.get("query_string", b"")
        # frames queued before the WebSocket is accepted (dispatch may start as soon as a
        # consumer is attached) go out once it is
        self.socket = Socket(send)
        self.socket.on_room = self.wake_all
        self.partitions = 0
        self._nursery: trio.Nursery | None = None
        self.closed = False

    def topic_name(self, partition: int) -> TopicName:
        return self.name.partition(partition) if self.partitions else self.name

    async def resolve_partitions(self) -> None:
        self.partitions = await self.broker.partitioned_metadata(self.name)

    @abc.abstractmethod
    async def open(self) -> None:
        """Create the endpoint's producer, consumer or reader; raises what the upgrade
        is refused with."""

    async def run(self, receive: Receive) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.socket.run_writer)
                idle_ms = int(self.config.get("webSocketSessionIdleTimeoutMillis"))
                if idle_ms > 0:
                    nursery.start_soon(self.socket.close_when_idle, idle_ms / 1000)
                self.started(nursery)
                while not self.socket.closed:
                    message = await receive()
                    self.socket.last_active = trio.current_time()
                    if message["type"] == "websocket.disconnect":
                        break
                    text = message.get("text") if message["type"] == "websocket.receive" else None
                    if text is None:
                        continue  # as Pulsar's handlers, binary frames are not read
                    self.broker.stats.record_request("websocket")
                    try:
                        await self.on_text(text)
                    except Exception:
                        # a fault of the broker's: this session ends, the broker serves on
                        log.exception("websocket %s: session on %s failed", self.peer_address, self.name)
                        self.socket.close(CLOSE_SERVER_ERROR, WebSocketError.UnknownError.description)
                if self.socket.closed:
                    # what the session queued, and its close frame, go out before it ends
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await self.socket.close_sent.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            self.socket.closed = True  # answers still due (stored publishes) have no one to go to
            self.release()

    @abc.abstractmethod
    def started(self, nursery: trio.Nursery) -> None:
        """Start the session's own tasks, once its socket is open."""

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is not None and not self.closed:
            self._nursery.start_soon(fn, *args)

    def send(self, text: str) -> None:
        self.socket.put(text)

    def close_for(self, error: WebSocketError, detail: str = "") -> None:
        """Close the session as Pulsar does for a frame it cannot read."""
        reason = error.description + (f": {detail}" if detail else "")
        log.info("websocket %s: closing session on %s: %s", self.peer_address, self.name, reason)
        self.socket.close(CLOSE_PROTOCOL_ERROR, reason)

    def wake_all(self) -> None:  # noqa: B027 (a hook; a producer has nothing to wake)
        """The socket has room again: resume what waited for it (a consumer's dispatch)."""

    @abc.abstractmethod
    async def on_text(self, text: str) -> None:
        """Handle one text frame from the client."""

    @abc.abstractmethod
    def release(self) -> None:
        """Let go of what :meth:`open` created (the session is over)."""


# -- producer ----------------------------------------------------------------------------------------
