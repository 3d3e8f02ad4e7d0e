"""Responses leave as pieces: a fetch's record batches are sent as they are (vectored
writes), not copied into one frame first, and the bytes on the wire are the same."""

from __future__ import annotations

import socket

import trio

from handlers._serve import send_pieces
from handlers.kafka._codec import Data, KafkaConnection, encode_request, parse_request


def _fetch_response(batches: list[bytes]) -> Data:
    part = Data(partition_index=0, error_code=0, high_watermark=9, last_stable_offset=9,
                log_start_offset=0, aborted_transactions=[], preferred_read_replica=-1,
                records=batches)
    return Data(throttle_time_ms=0, error_code=0, session_id=0,
                responses=[Data(topic="t", partitions=[part])])


def _fetch_request() -> object:
    frame = encode_request(1, 11, 5, "c", Data(
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[Data(topic="t", partitions=[Data(
            partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
            partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id=""))
    return parse_request(frame[4:])


def test_record_batches_are_pieces_of_their_own() -> None:
    big = [bytes([i]) * 40_000 for i in range(3)]
    small = b"s" * 100
    conn = KafkaConnection()
    req = _fetch_request()
    pieces = conn.send_response_parts(req, _fetch_response([big[0], small, big[1], big[2]]))  # type: ignore[arg-type]
    assert all(any(p is b for p in pieces) for b in big)
    assert len(pieces) <= 6  # the small parts around them are joined: head, b0, s, b1, b2, tail
    assert b"".join(pieces) == conn.send_response(req, _fetch_response(  # type: ignore[arg-type]
        [big[0], small, big[1], big[2]]))
    frame = b"".join(pieces)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4


def test_pieces_arrive_whole_through_partial_writes() -> None:
    # More bytes than the socket buffers hold, so sendmsg returns partial counts that
    # end inside a piece.
    pieces = [bytes([i % 251]) * (50_000 + i * 7) for i in range(40)] + [b"end"]
    expected = b"".join(pieces)

    async def main() -> bytes:
        a, b = trio.socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        got = bytearray()

        async def read() -> None:
            while len(got) < len(expected):
                data = await b.recv(100_000)
                assert data
                got.extend(data)

        with a, b:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await send_pieces(a, list(pieces))
        return bytes(got)

    assert trio.run(main) == expected


def test_a_closed_peer_is_a_broken_resource() -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        b.close()
        with a:
            try:
                for _ in range(100):
                    await send_pieces(a, [b"x" * 100_000])
            except trio.BrokenResourceError:
                return
        raise AssertionError("sending to a closed peer did not fail")

    trio.run(main)
