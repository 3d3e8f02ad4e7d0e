"""The Kafka session: the trio driver between one client socket and the handler.

The reader feeds the sans-IO codec and handles each request in arrival order. A request
that waits on something outside the connection (a produce waiting for durability, a
fetch long poll, a JoinGroup or SyncGroup waiting for the rest of the group) does the
order-sensitive part inline (a produce hands its entries to the topics right away) and
then either waits in a task of its own or, as a :class:`Later`, is completed by a
callback (a produce: when its last batch is stored), so the connection keeps reading.
Kafka requires responses in request order: each request takes a slot in a queue, and the
slots at its head go to the connection's :class:`~handlers._serve.Outbox` as they fill
(sent at the end of the burst that filled them, else by its writer task). At most
:data:`MAX_IN_FLIGHT` requests are open per connection; past that the reader stops
reading, which is the back-pressure a client sees.

A frame whose size prefix is negative or too large, or whose body does not decode, ends
the connection (after nothing is allocated for it), and so does an API key or version not
served, as Kafka closes it; only ApiVersions at a version not served is answered,
UNSUPPORTED_VERSION. The requests read before the one that ends the connection are
answered first, as Kafka answers them: it reads a connection's next request only once the
last one is answered.

A connection idle for ``connections.max.idle.ms`` (Kafka's broker key, default 10 minutes;
-1 never) is closed, as Kafka closes it: idle meaning that nothing arrived from the client
and it had no request open (a fetch long poll, a produce waiting for storage, a join
waiting for its group) for that long. Bytes arriving count, a complete request or not, so
a large request still coming in is not idle; a request's response being queued restarts
the clock.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from handlers._serve import Outbox, Reader
from handlers.kafka._codec import (
    MAX_SASL_TOKEN,
    NEED_DATA,
    Data,
    KafkaConnection,
    RequestReceived,
    SaslTokenReceived,
    UnsupportedRequest,
)
from handlers.kafka._errors import RemoteProtocolError
from handlers.kafka._sasl import SaslReply, SaslServer

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = ["DEFAULT_CONNECTIONS_MAX_IDLE_MS", "KafkaSession", "Later", "MAX_IN_FLIGHT"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
MAX_IN_FLIGHT = 256
DEFAULT_CONNECTIONS_MAX_IDLE_MS = 600_000
"""Kafka's default ``connections.max.idle.ms``."""


class Later(abc.ABC):
    """A response body known later, handed to the callback given to :meth:`then`. It
    costs no task: the callback runs where the body becomes known."""

    __slots__ = ()

    @abc.abstractmethod
    def then(self, reply: Callable[[Data], None]) -> None:
        """Call ``reply(body)`` once, when the body is known (now, if it already is)."""


class _Slot:
    __slots__ = ("data",)

    def __init__(self, data: list[bytes] | None = None):
        self.data = data


class KafkaSession:
    def __init__(self, handler: KafkaProtocolHandler, stream: trio.abc.Stream):
        self.handler = handler
        self.stream = stream
        self.codec = KafkaConnection(max_request_size=handler.max_request_size,
                                     client_host=_client_host(stream))
        self._read = Reader(stream)
        self._slots: deque[_Slot] = deque()
        self.outbox = Outbox(stream)
        self._room = trio.Semaphore(MAX_IN_FLIGHT)
        self._nursery: trio.Nursery | None = None
        self._active_at = 0.0  # when bytes last arrived or a response was last queued
        # With authentication on, nothing but SASL (and ApiVersions) is served until the
        # client authenticated (handlers.kafka._sasl); then every request carries its role.
        auth = handler.broker.auth
        self.sasl = SaslServer(auth, self.codec.client_host) if auth.authentication_enabled else None
        self.principal: str | None = None
        if self.sasl is not None:
            # Before it authenticates, a client may send no more than a SASL exchange needs
            # (Kafka's sasl.server.max.receive.size).
            self.codec.max_request_size = MAX_SASL_TOKEN

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._active_at = trio.current_time()
                nursery.start_soon(self.outbox.run_writer)
                if self.handler.connections_max_idle >= 0:
                    nursery.start_soon(self._close_when_idle, self.handler.connections_max_idle)
                await self._reader()
                nursery.cancel_scope.cancel()
        finally:
            await trio.aclose_forcefully(self.stream)

    async def _receive(self) -> bool:
        """Read what the socket has into the codec; False at end of stream. A large frame
        under way is read straight into its own buffer."""
        # A socket stream is read straight into a large frame's buffer.
        view = self.codec.receive_buffer() if self._read.direct else None
        if view is None:
            data = await self._read.receive(READ_SIZE)
            self._active_at = trio.current_time()
            self.codec.receive_data(data)
            return bool(data)
        with view:
            n = await self._read.receive_into(view)
        self._active_at = trio.current_time()
        self.codec.received_into(n)
        return n > 0

    async def _close_when_idle(self, max_idle: float) -> None:
        """Close the connection once it has been idle (see the module docs) for
        ``max_idle`` seconds."""
        while True:
            await trio.sleep_until(self._active_at + max_idle)
            if self._room.value < MAX_IN_FLIGHT:
                # A request is open: not idle; its response restarts the clock.
                await trio.sleep(max_idle)
                continue
            idle = trio.current_time() - self._active_at
            if idle >= max_idle:
                log.info("kafka: closing connection idle for %.0f ms (connections.max.idle.ms=%.0f)",
                         idle * 1000, max_idle * 1000)
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                return

    async def _reader(self) -> None:
        while True:
            if not await self._receive():
                return
            while True:
                try:
                    event = self.codec.next_event()
                except RemoteProtocolError as exc:
                    log.info("kafka: closing connection: %s", exc)
                    await self._answer_open_requests()
                    return
                if event is NEED_DATA:
                    break
                try:
                    self._room.acquire_nowait()  # no trip through the scheduler when free
                except trio.WouldBlock:
                    await self._room.acquire()
                if isinstance(event, UnsupportedRequest):
                    log.debug("kafka: unsupported ApiVersions v%d", event.api_version)
                    self._push(_Slot([self.codec.unsupported_response(event)]))
                    continue
                if self.sasl is not None and not self.sasl.authenticated:
                    reply = self.sasl.receive(event)
                    if not reply.serve:
                        if not self._answer_sasl(event, reply):
                            await self._answer_open_requests()
                            return
                        continue
                assert isinstance(event, RequestReceived)
                await self._handle(event)

    def _answer_sasl(self, event: RequestReceived | SaslTokenReceived, reply: SaslReply) -> bool:
        """Answer ``event``, received before the client authenticated (its room in the
        queue taken), as ``reply`` says; False when the connection must close (once
        answered)."""
        assert self.sasl is not None
        if isinstance(reply.body, Data):
            assert isinstance(event, RequestReceived)
            self._push(_Slot(self.codec.send_response_parts(event, reply.body)))
        elif isinstance(reply.body, bytes):
            self._push(_Slot([self.codec.send_sasl_token(reply.body)]))
        else:
            self._room.release()
        self.codec.expect_sasl_token = self.sasl.expects_token
        self.principal = self.sasl.principal
        if self.sasl.authenticated:
            self.codec.max_request_size = self.handler.max_request_size
        return not reply.close

    async def _answer_open_requests(self) -> None:
        """Wait until every request read so far is answered and its response sent (a peer
        that does not read them is closed once idle, as any other)."""
        for _ in range(MAX_IN_FLIGHT):
            await self._room.acquire()
        for _ in range(MAX_IN_FLIGHT):
            self._room.release()
        await self.outbox.drained()

    async def _handle(self, req: RequestReceived) -> None:
        self.handler.broker.stats.record_request("kafka")
        if self.principal is not None:
            req = dataclasses.replace(req, principal=self.principal)
        result = await self.handler.dispatch(req)
        if result is None:
            self._room.release()
            return
        if isinstance(result, Data):
            self._push(_Slot(self.codec.send_response_parts(req, result)))
            return
        slot = _Slot()
        self._slots.append(slot)
        if isinstance(result, Later):
            result.then(lambda body: self._fill(req, slot, body))
            return
        assert self._nursery is not None
        self._nursery.start_soon(self._complete, req, slot, result)

    async def _complete(self, req: RequestReceived, slot: _Slot,
                        deferred: Callable[[], Awaitable[Data | None]]) -> None:
        body = await deferred()
        slot.data = [] if body is None else self.codec.send_response_parts(req, body)
        self._release()

    def _fill(self, req: RequestReceived, slot: _Slot, body: Data) -> None:
        try:
            slot.data = self.codec.send_response_parts(req, body)
        except Exception:
            # Runs in whoever completed the body (a topic's flusher): the failure ends
            # this connection only.
            log.exception("kafka: cannot encode the %s response", req.api_name)
            slot.data = []
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
        self._release()

    def _push(self, slot: _Slot) -> None:
        self._slots.append(slot)
        self._release()

    def _release(self) -> None:
        """Hand the filled slots at the head of the queue, in request order, to the outbox."""
        slots = self._slots
        if slots and slots[0].data is not None:
            self._active_at = trio.current_time()
        while slots and slots[0].data is not None:
            self.outbox.put_all(slots.popleft().data)  # type: ignore[arg-type]
            self._room.release()


def _client_host(stream: trio.abc.Stream) -> str:
    """The peer's address as Kafka's DescribeGroups shows a member's host: ``/1.2.3.4``."""
    try:
        return "/" + str(stream.socket.getpeername()[0])  # type: ignore[attr-defined]
    except (AttributeError, OSError, IndexError):
        return ""
