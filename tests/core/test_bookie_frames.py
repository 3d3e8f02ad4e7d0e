"""nettyMaxFrameSizeBytes through a real `magnetar bookie` process: a broker's storage with
the same limit splits its adds into frames the bookie takes and refuses an entry too large
for one; a connection that sends a longer frame anyway is closed, the reason logged, and
the bookie goes on serving."""

from __future__ import annotations

import socket
import struct

import pytest
import trio

from core.storage import Position, Storage
from tests.core._storage_env import ml_config, storage_env
from tests.core.test_faults import free_port, start_bookie

pytestmark = pytest.mark.slow

LIMIT = 64 * 1024
#: What one frame of LIMIT holds of an entry's payload: less an ADD_BATCH header and one
#: entry's overhead (42 bytes), the ledger entry header (13) and the broker's entry
#: header (24).
MAX_ENTRY = LIMIT - 42 - 13 - 24


def _send_oversized_header(port: int, length: int) -> bytes:
    """Send only a frame header announcing ``length`` bytes; return what comes back
    before the bookie closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(struct.pack(">II", length, 0))
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


async def test_a_bookie_process_and_a_broker_keep_to_the_frame_limit(tmp_path):
    url = f"sqlite:{tmp_path / 'meta.db'}"
    port = free_port()
    bookie = start_bookie(tmp_path / "bookie", port, url, f"nettyMaxFrameSizeBytes={LIMIT}")
    try:
        bookie.wait_for(lambda lines: any(f"(frames up to {LIMIT} bytes)" in x for x in lines))
        async with storage_env(tmp_path / "broker", bookies=0, metadata_url=url) as env:
            storage = Storage(env.bridge, env.metadata, 5000, max_frame_size=LIMIT)
            try:
                ml = await storage.open("t/ns/persistent/frames", ml_config())
                assert ml.max_entry_size == MAX_ENTRY
                # 240 KiB in one call: several frames, each within the limit.
                batch = [bytes([i]) * 6 * 1024 for i in range(40)] + [b"m" * MAX_ENTRY]
                added = await ml.add_entries(batch, [1] * len(batch))
                ledger = added[0][0].ledger_id
                with pytest.raises(ValueError, match=f"an entry of {MAX_ENTRY + 1} bytes is "
                                                     f"larger than the {MAX_ENTRY} bytes"):
                    await ml.add_entries([b"small", b"x" * (MAX_ENTRY + 1)], [1, 1])
                after = await ml.add_entries([b"after"], [1])
                assert after[0][0] == Position(ledger, len(batch)), "same ledger, no id lost"

                # A peer that ignores the limit: its connection is closed on the header.
                assert _send_oversized_header(port, LIMIT + 1) == b""
                bookie.wait_for(lambda lines: any(
                    f"closing connection: frame length {LIMIT + 1} exceeds the limit of "
                    f"{LIMIT} bytes (nettyMaxFrameSizeBytes)" in x for x in lines))

                # The broker's connection was not touched: it goes on writing and reading.
                await ml.add_entries([b"last"], [1])
                got = await ml.read_entries(Position(ledger, 0), 100)
                assert [e.data for e in got] == [*batch, b"after", b"last"]
            finally:
                await trio.to_thread.run_sync(storage.shutdown)
    finally:
        bookie.kill()
