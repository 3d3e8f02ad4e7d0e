"""What every protocol plugin does with an accepted connection: run its session, count it
under its protocol in the broker's stats, and log (never raise) how it ended, so one
connection's failure never reaches the listener or the broker."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

__all__ = ["Session", "run_session"]

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
