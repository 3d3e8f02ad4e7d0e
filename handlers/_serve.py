"""What every protocol plugin does with an accepted connection: run its session, count it
under its protocol in the broker's stats, and log (never raise) how it ended, so one
connection's failure never reaches the listener or the broker; how a session writes
what it has queued (:class:`Outbox`, :func:`send_pieces`); and when it stops reading
(:class:`ReadLimit`); and opening its listeners (:func:`open_listeners`), whose failure
names the address and the setting (:class:`ListenError`); and how it reads its socket (:class:`Reader`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import trio

from core.writes import IOV_MAX, drop_sent, flush_at_end, write_now

__all__ = ["ListenError", "Outbox", "ReadLimit", "Reader", "Session", "listen_error", "open_listeners",
           "open_url_listeners", "run_session", "send_pieces"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class ListenError(OSError):
    """A listener that cannot be opened (the address in use, not this host's, or a port
    that needs privileges): an operator's error, which names the address and the setting."""

    def __str__(self) -> str:
        return str(self.strerror)


def listen_error(exc: OSError, host: str | None, port: int, setting: str) -> ListenError:
    """``exc``, raised binding ``host``:``port``, as a :class:`ListenError` naming them."""
    why = exc.strerror or str(exc)
    return ListenError(exc.errno, f"cannot listen on {host or '*'}:{port} ({setting}): {why}")


async def open_listeners(port: int, host: str | None, setting: str) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners``, failing with a :class:`ListenError` that names the
    address and ``setting``, the key that gave it."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise listen_error(exc, host, port, setting) from exc


async def open_url_listeners(raw: Any, setting: str, scheme: str,
                             default: str) -> tuple[list[trio.SocketListener], list[str]]:
    """The listeners of a ``scheme://host:port`` list setting (a comma-separated string
    or a list; ``default`` when empty), and the URL each answers on (its port when 0
    was asked for)."""
    items = raw or [default]
    if isinstance(items, str):
        items = [x for x in items.split(",") if x.strip()]
    listeners: list[trio.SocketListener] = []
    urls: list[str] = []
    for item in items:
        rest = str(item).split("://", 1)[-1]
        host, _, port = rest.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"{setting}: {item!r} is not {scheme}://host:port")
        host = host.strip("[]") or "0.0.0.0"
        opened = await open_listeners(int(port), host, setting)
        listeners.extend(opened)
        urls.append(f"{scheme}://{host}:{opened[0].socket.getsockname()[1]}")
    return listeners, urls


class Session(Protocol):
    async def run(self) -> None: ...


async def run_session(protocol: str, broker: Any, sessions: set[Any], session: Session) -> None:
    sessions.add(session)
    try:
        with broker.stats.connection(protocol):
            await session.run()
    except Exception as exc:
        if _peer_went_away(exc):
            log.debug("%s connection ended: %s", protocol, exc)
        else:
            log.exception("%s connection failed", protocol)
    finally:
        sessions.discard(session)


_PEER_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


def _peer_went_away(exc: BaseException) -> bool:
    """Whether ``exc`` is only the peer going away (a reset, a closed socket), also when a
    session's nursery wrapped it in an exception group: no fault of the broker's to log."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_peer_went_away(e) for e in exc.exceptions)
    return isinstance(exc, _PEER_GONE)


class Reader:
    """Reads a session's stream with fewer trips through the scheduler than
    ``trio.SocketStream.receive_some``.

    That tries the socket, and when it found data passes through the scheduler once more
    before returning it (a checkpoint), or else waits for the socket and tries again. A
    busy connection mostly finds data, so that extra pass is most of what a read costs.
    This reader tries the socket too, and waits only when it finds nothing; but after
    finding data it returns at once, and lets the scheduler run other tasks (and deliver
    a cancellation) only every :data:`READS_PER_CHECKPOINT` reads in a row that found
    data. A stream that is not a plain socket (TLS, a test's memory stream) is read
    through ``receive_some``.

    A reset or failed socket raises :class:`trio.BrokenResourceError`, as
    ``receive_some`` does; the end of the stream reads as empty."""

    __slots__ = ("stream", "_fd", "_streak")

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        sock = getattr(stream, "socket", None)
        self._fd: int = sock.fileno() if sock is not None else -1
        self._streak = 0

    @property
    def direct(self) -> bool:
        """Whether reads go straight to the socket (and :meth:`receive_into` may be used)."""
        return self._fd >= 0

    async def receive(self, max_bytes: int) -> bytes | bytearray:
        """Up to ``max_bytes`` bytes; empty at the end of the stream."""
        if self._fd < 0:
            return await self.stream.receive_some(max_bytes)
        return await self._read(os.read, self._fd, max_bytes)

    async def receive_into(self, view: memoryview) -> int:
        """Read into ``view`` (only when :attr:`direct`); the bytes read, 0 at the end of
        the stream."""
        assert self._fd >= 0
        return await self._read(os.readv, self._fd, [view])

    async def _read(self, read: Callable[[int, Any], _T], fd: int, arg: Any) -> _T:
        try:
            got = read(fd, arg)
        except BlockingIOError:
            self._streak = 0
            while True:
                await trio.lowlevel.wait_readable(fd)
                try:
                    return read(fd, arg)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise trio.BrokenResourceError(f"socket read failed: {exc}") from exc
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket read failed: {exc}") from exc
        self._streak += 1
        if self._streak >= READS_PER_CHECKPOINT:
            self._streak = 0
            await trio.lowlevel.checkpoint()
        return got


READS_PER_CHECKPOINT = 8
"""Reads in a row that found data after which :class:`Reader` passes through the
scheduler: other tasks run, and a cancellation is delivered."""


class ReadLimit:
    """Work read from clients and not yet answered (requests, or their bytes): once it
    reaches ``limit``, the sessions it covers read nothing more until it is down to half.
    ``limit`` <= 0 is no limit. ``announce``, when given, is logged at each pause.

    ``source``, when given, says what the limit is now (a dynamic configuration key):
    :meth:`refresh` takes it again, at the sessions' natural points (before each read from
    a socket), rather than at each :meth:`take`."""

    def __init__(self, limit: int, announce: str | None = None,
                 source: Callable[[], int] | None = None) -> None:
        self.limit = limit
        self.announce = announce
        self._source = source
        self.used = 0
        self.paused = False
        self._resumed = trio.Event()

    def take(self, n: int) -> None:
        self.used += n
        if 0 < self.limit <= self.used and not self.paused:
            self.paused = True
            self._resumed = trio.Event()
            if self.announce:
                log.info("%s (%d pending)", self.announce, self.used)

    def give(self, n: int) -> None:
        self.used -= n
        if self.paused and self.used <= self.limit // 2:
            self.paused = False
            self._resumed.set()

    def refresh(self) -> None:
        """Take the limit from ``source`` again. A lower limit pauses at the next
        :meth:`take` past it; a higher one (or none) ends a pause it no longer calls for
        (sessions that are paused read nothing, so a pause in place when the limit changes
        ends as the old limit says, or when a session that still reads refreshes it)."""
        if self._source is None:
            return
        self.limit = self._source()
        if self.paused and (self.limit <= 0 or self.used <= self.limit // 2):
            self.paused = False
            self._resumed.set()

    async def wait_resumed(self) -> None:
        await self._resumed.wait()


async def send_pieces(sock: trio.socket.SocketType, pieces: list[bytes]) -> None:
    """Send ``pieces`` back to back with vectored writes (``sendmsg``), so that they are
    not first copied into one buffer. ``pieces`` is consumed."""
    try:
        while pieces:
            n: int = await sock.sendmsg(pieces[:IOV_MAX])
            drop_sent(pieces, n)
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket send failed: {exc}") from exc


WRITABLE_HIGH = 1 << 20
"""Bytes queued and not yet taken by the socket at which an :class:`Outbox` stops being
writable (what the peer does not read is not read from storage for it either)..."""
WRITABLE_LOW = 256 << 10
"""... and to which they must fall before it is writable again."""


class Outbox:
    """The frames a session has to send, and how they leave. The first frame queued after a
    send asks for the next one: at the end of the current write batch when there is one
    (:mod:`core.writes`), with one non-blocking write; else, and whenever the socket is
    full, from the writer task (:meth:`run_writer`), which waits for the socket.

    It counts the bytes queued that the socket has not taken. Past :data:`WRITABLE_HIGH`
    it is not :meth:`writable` (a peer that does not read makes the socket full), and
    ``on_writable`` is called once they are down to :data:`WRITABLE_LOW` again."""

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        # A socket stream's frames leave with vectored writes, not joined first.
        self._sock: trio.socket.SocketType | None = getattr(stream, "socket", None)
        self.frames: list[bytes] = []
        self._ready = trio.Event()
        self._flush_asked = False
        self._writing = False
        self.unsent = 0
        self._unwritable = False
        self._drained: trio.Event | None = None
        self.on_writable: Callable[[], None] | None = None

    def put(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.unsent += len(frame)
        self._ask_flush()

    def put_all(self, frames: list[bytes]) -> None:
        self.frames += frames
        self.unsent += sum(map(len, frames))
        self._ask_flush()

    def writable(self) -> bool:
        """Whether more may be queued: fewer than :data:`WRITABLE_HIGH` bytes wait."""
        if self.unsent < WRITABLE_HIGH:
            return True
        self._unwritable = True
        return False

    async def drained(self) -> None:
        """Return once every frame queued so far has left (through the writer task, which
        must be running, or at the end of a write batch)."""
        while self.unsent > 0:
            self._drained = trio.Event()
            if self.frames and not self._writing:
                self._ready.set()
            await self._drained.wait()

    def _sent(self, n: int) -> None:
        self.unsent -= n
        if self.unsent <= 0 and self._drained is not None:
            self._drained.set()
        if self._unwritable and self.unsent <= WRITABLE_LOW:
            self._unwritable = False
            if self.on_writable is not None:
                self.on_writable()

    def _ask_flush(self) -> None:
        if not self._flush_asked:
            self._flush_asked = True
            if not flush_at_end(self._write_direct):
                self._ready.set()

    async def run_writer(self) -> None:
        while True:
            await self._ready.wait()
            self._ready = trio.Event()
            await self.flush()

    async def flush(self) -> None:
        """Send everything queued, waiting for the socket as long as it takes."""
        self._flush_asked = False
        frames = self.frames
        if frames:
            self.frames = []
            self._writing = True
            size = sum(map(len, frames))
            try:
                if self._sock is not None:
                    await send_pieces(self._sock, frames)
                else:
                    await self.stream.send_all(b"".join(frames))
            finally:
                self._writing = False
            self._sent(size)

    def _write_direct(self) -> None:
        """The end of a write batch: send what is queued with one non-blocking write, unless
        a send is under way; what the socket does not take now is left to the writer."""
        self._flush_asked = False
        if not self.frames:
            return
        fd = self._sock.fileno() if self._sock is not None else -1
        if self._writing or fd < 0:
            self._ready.set()
            return
        frames, self.frames = self.frames, []
        size = sum(map(len, frames))
        try:
            rest = write_now(fd, frames)
        except OSError:
            rest = frames  # the writer meets the error and ends the connection
        if rest:
            self.frames[:0] = rest
            self._ready.set()
            size -= sum(map(len, rest))
        self._sent(size)
