"""What every protocol plugin does with an accepted connection: run its session, count it
under its protocol in the broker's stats, and log (never raise) how it ended, so one
connection's failure never reaches the listener or the broker; and how a session writes
what it has queued (:func:`send_pieces`)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from core.writes import IOV_MAX, drop_sent

__all__ = ["Session", "run_session", "send_pieces"]

log = logging.getLogger(__name__)


class Session(Protocol):
    async def run(self) -> None: ...


async def run_session(protocol: str, broker: Any, sessions: set[Any], session: Session) -> None:
    sessions.add(session)
    try:
        with broker.stats.connection(protocol):
            await session.run()
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError) as exc:
        log.debug("%s connection ended: %s", protocol, exc)
    except Exception:
        log.exception("%s connection failed", protocol)
    finally:
        sessions.discard(session)


async def send_pieces(sock: trio.socket.SocketType, pieces: list[bytes]) -> None:
    """Send ``pieces`` back to back with vectored writes (``sendmsg``), so that they are
    not first copied into one buffer. ``pieces`` is consumed."""
    try:
        while pieces:
            n: int = await sock.sendmsg(pieces[:IOV_MAX])
            drop_sent(pieces, n)
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket send failed: {exc}") from exc
