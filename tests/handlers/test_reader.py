"""How sessions read their sockets (handlers._serve.Reader): what a client sends arrives
whole and in order, the end of the stream and a reset are told apart, and a client that
never stops sending neither starves the other connections nor escapes a cancellation."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.lowlevel
import trio.testing

from handlers._serve import READS_PER_CHECKPOINT, Reader


def _pair() -> tuple[trio.SocketStream, socket.socket]:
    """A trio socket stream (the session's side) and the plain socket of its peer."""
    ours, theirs = socket.socketpair()
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs


async def test_what_the_peer_sends_arrives_in_order_then_the_end() -> None:
    stream, peer = _pair()
    reader = Reader(stream)
    assert reader.direct
    sent = bytes(range(256)) * 64

    async def send() -> None:
        for i in range(0, len(sent), 1000):
            await trio.lowlevel.checkpoint()
            peer.send(sent[i:i + 1000])
        peer.shutdown(socket.SHUT_WR)

    got = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while data := await reader.receive(4096):
            got += data
    assert bytes(got) == sent
    assert await reader.receive(4096) == b""  # the end stays the end
    peer.close()
    await stream.aclose()


async def test_receive_into_fills_the_buffer_given() -> None:
    stream, peer = _pair()
    reader = Reader(stream)
    peer.send(b"0123456789")
    buf = bytearray(4)
    assert await reader.receive_into(memoryview(buf)) == 4
    assert buf == b"0123"
    rest = bytearray(16)
    assert await reader.receive_into(memoryview(rest)) == 6
    assert rest[:6] == b"456789"
    peer.close()
    assert await reader.receive_into(memoryview(rest)) == 0
    await stream.aclose()


async def test_a_reset_is_a_broken_resource_not_an_end() -> None:
    # a reset needs TCP (the socket pair is AF_UNIX): a loopback connection, closed by
    # its client with linger 0
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(server))
    reader = Reader(stream)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
    with pytest.raises(trio.BrokenResourceError):
        await reader.receive(4096)
    await stream.aclose()


async def test_a_client_that_never_pauses_lets_other_tasks_run() -> None:
    """One-byte reads of a full socket always find data: the reader still passes through
    the scheduler every READS_PER_CHECKPOINT reads, so another task runs meanwhile (with
    receive_some's strategy it would run at each read, with none at all never)."""
    stream, peer = _pair()
    reader = Reader(stream)
    peer.send(b"x" * (READS_PER_CHECKPOINT * 20))
    ticks = 0
    reads_at_first_tick: int | None = None
    reads = 0

    async def other() -> None:
        nonlocal ticks, reads_at_first_tick
        while True:
            if reads_at_first_tick is None and reads:
                reads_at_first_tick = reads
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        for _ in range(READS_PER_CHECKPOINT * 20):
            assert await reader.receive(1) == b"x"
            reads += 1
        nursery.cancel_scope.cancel()
    # the other task runs at the reader's first checkpoint, before or after the reader's
    # next run of reads (trio orders a batch of runnable tasks as it likes)
    assert reads_at_first_tick is not None and reads_at_first_tick <= 2 * READS_PER_CHECKPOINT
    assert ticks >= 20
    peer.close()
    await stream.aclose()


async def test_a_cancelled_reader_stops_though_data_keeps_coming() -> None:
    stream, peer = _pair()
    reader = Reader(stream)
    peer.send(b"y" * (READS_PER_CHECKPOINT * 4))
    reads = 0
    with trio.CancelScope() as scope:
        scope.cancel()
        while True:
            await reader.receive(1)
            reads += 1
    assert scope.cancelled_caught
    assert reads < READS_PER_CHECKPOINT
    peer.close()
    await stream.aclose()


async def test_a_stream_that_is_not_a_socket_is_read_through_it() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader = Reader(trio.StapledStream(send, receive))  # type: ignore[arg-type]
    assert not reader.direct
    await send.send_all(b"hello")
    assert await reader.receive(100) == b"hello"
