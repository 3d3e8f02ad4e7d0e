"""Connection writes gathered to the end of a burst (core.writes)."""

from __future__ import annotations

import socket

from core.writes import flush_at_end, write_batch, write_now


def test_flushes_registered_in_a_batch_run_once_at_the_outermost_end() -> None:
    ran: list[str] = []
    assert not flush_at_end(lambda: ran.append("outside"))  # no batch: the caller wakes its writer
    with write_batch():
        assert flush_at_end(lambda: ran.append("a"))
        with write_batch():
            assert flush_at_end(lambda: ran.append("b"))
        assert ran == []  # the inner end is not the end
    assert ran == ["a", "b"]


def test_a_flush_that_queues_more_registers_a_flush_run_at_the_same_end() -> None:
    # Gathered frames put to an outbox at the end register that outbox's write: it runs in
    # the same end, after them, instead of waking a writer task.
    ran: list[str] = []

    def gathered() -> None:
        ran.append("gathered")
        assert flush_at_end(lambda: ran.append("write"))

    with write_batch():
        flush_at_end(gathered)
    assert ran == ["gathered", "write"]
    assert not flush_at_end(lambda: ran.append("after"))  # and the batch is over


def test_a_failing_flush_does_not_stop_the_others() -> None:
    ran: list[str] = []

    def broken() -> None:
        raise OSError("reset by peer")

    with write_batch():
        flush_at_end(broken)
        flush_at_end(lambda: ran.append("next"))
    assert ran == ["next"]


def test_write_now_sends_what_the_socket_takes_and_returns_the_rest() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        pieces = [b"x" * 1000, b"y" * 5_000_000]
        rest = write_now(a.fileno(), list(pieces))
        assert rest, "a 5 MB burst does not fit a small socket buffer"
        sent = 5_001_000 - sum(len(r) for r in rest)
        got = bytearray()
        while len(got) < sent:
            got += b.recv(1 << 20)
        assert bytes(got) == (b"x" * 1000 + b"y" * 5_000_000)[:sent]
        # the rest continues exactly where the socket stopped
        assert bytes(rest[0])[:1] == b"y"
        assert write_now(a.fileno(), [b""]) == []
