"""How a session's end is logged: a peer going away is routine, a fault is an error."""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
import trio

from handlers._serve import run_session


class _Stats:
    @contextlib.contextmanager
    def connection(self, protocol: str):  # type: ignore[no-untyped-def]
        yield


class _Session:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def run(self) -> None:
        raise self.exc


def _group(*excs: Exception) -> ExceptionGroup:
    return ExceptionGroup("session", list(excs))


@pytest.mark.parametrize("exc, logged", [
    (ConnectionResetError(104, "Connection reset by peer"), False),
    (trio.BrokenResourceError("socket send failed"), False),
    # a session's nursery wraps what its tasks raise
    (_group(trio.BrokenResourceError("reset")), False),
    (_group(ConnectionResetError(104, "reset"), _group(trio.ClosedResourceError())), False),
    (ValueError("a fault of ours"), True),
    (_group(trio.BrokenResourceError("reset"), KeyError("ours")), True),
])
async def test_only_a_fault_is_logged_as_an_error(caplog: pytest.LogCaptureFixture,
                                                  exc: Exception, logged: bool) -> None:
    broker = SimpleNamespace(stats=_Stats())
    sessions: set = set()
    with caplog.at_level(logging.DEBUG, logger="handlers._serve"):
        await run_session("kafka", broker, sessions, _Session(exc))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert bool(errors) == logged
    assert not sessions
