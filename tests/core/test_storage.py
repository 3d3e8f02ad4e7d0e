"""The native storage core driven from trio: append/read, cursors, rollover, trimming."""

from __future__ import annotations

import pytest
import trio

from core import _native
from core.storage import Position
from tests.core._storage_env import ml_config, storage_env


async def test_append_and_read_round_trip(tmp_path):
    async with storage_env(tmp_path) as env:
        ml = await env.storage.open("t/ns/persistent/round-trip", ml_config())
        payloads = [f"payload-{i}".encode() * (i + 1) for i in range(100)]
        done = await ml.add_entries(payloads, [1] * 100)
        assert [idx for _, idx, _ in done] == list(range(100))
        positions = [p for p, _, _ in done]
        assert positions == sorted(positions)
        entries = await ml.read_entries(positions[0], 1000)
        assert [e.data for e in entries] == payloads
        assert [e.index for e in entries] == list(range(100))
        assert ml.last_confirmed() == positions[-1]


async def test_batches_advance_the_message_index(tmp_path):
    async with storage_env(tmp_path) as env:
        ml = await env.storage.open("t/ns/persistent/index", ml_config())
        done = await ml.add_entries([b"a", b"b", b"c"], [5, 1, 10])
        assert [idx for _, idx, _ in done] == [4, 5, 15]
        assert await ml.find_by_index(5) == done[1][0]
        assert await ml.find_by_index(12) == done[2][0]


async def test_cursor_state_survives_restart(tmp_path):
    name = "t/ns/persistent/cursor"
    async with storage_env(tmp_path) as env:
        ml = await env.storage.open(name, ml_config())
        cursor = await ml.open_cursor("sub", True)
        done = await ml.add_entries([f"e{i}".encode() for i in range(10)], [1] * 10)
        pos = [p for p, _, _ in done]
        assert [e.data for e in await cursor.read_entries(100)] == [f"e{i}".encode() for i in range(10)]
        cursor.mark_delete(pos[2])
        cursor.delete([pos[5], pos[6], pos[8]])
        await cursor.flush()
        assert cursor.backlog() == 4
        await ml.close()
    async with storage_env(tmp_path) as env:
        ml = await env.storage.open(name, ml_config())
        assert ml.cursor_names() == ["sub"]
        cursor = await ml.open_cursor("sub", True)
        assert cursor.mark_delete_position() == pos[2]
        assert cursor.backlog() == 4
        got = [e.data for e in await cursor.read_entries(100)]
        assert got == [b"e3", b"e4", b"e7", b"e9"]


async def test_rollover_and_trimming_delete_exactly_consumed_ledgers(tmp_path):
    async with storage_env(tmp_path) as env:
        config = ml_config(max_entries_per_ledger=10, min_rollover_time_ms=0)
        ml = await env.storage.open("t/ns/persistent/trim", config)
        cursor = await ml.open_cursor("sub", True)
        done = []
        for i in range(45):
            done += await ml.add_entries([f"e{i}".encode()], [1])
        ledgers = [le["ledgerId"] for le in ml.ledgers()]
        assert len(ledgers) == 5
        assert [le["entries"] for le in ml.ledgers()][:4] == [10, 10, 10, 10]
        # Consume into the third ledger: the first two are fully passed.
        cursor.mark_delete(done[24][0])
        await cursor.flush()
        await ml.trim()
        assert [le["ledgerId"] for le in ml.ledgers()] == ledgers[2:]
        assert env.metadata.get(f"/ledgers/ledger/{ledgers[0]}") is None
        assert env.metadata.get(f"/ledgers/ledger/{ledgers[2]}") is not None
        # Reading from a trimmed position starts at the first retained entry, as Pulsar does.
        assert [e.data for e in await ml.read_entries(done[0][0], 1)] == [b"e20"]
        assert [e.data for e in await ml.read_entries(done[25][0], 100)][0] == b"e25"


async def test_retention_keeps_consumed_ledgers(tmp_path):
    async with storage_env(tmp_path) as env:
        config = ml_config(max_entries_per_ledger=10, min_rollover_time_ms=0,
                           retention_time_ms=3_600_000, retention_size_mb=-1)
        ml = await env.storage.open("t/ns/persistent/retained", config)
        cursor = await ml.open_cursor("sub", True)
        done = []
        for i in range(30):
            done += await ml.add_entries([f"e{i}".encode()], [1])
        before = [le["ledgerId"] for le in ml.ledgers()]
        cursor.mark_delete(done[-1][0])
        await cursor.flush()
        await ml.trim()
        assert [le["ledgerId"] for le in ml.ledgers()] == before


async def test_three_bookies_replicate_with_quorums(tmp_path):
    async with storage_env(tmp_path, bookies=3) as env:
        ml = await env.storage.open("t/ns/persistent/q", ml_config(ensemble_size=3, write_quorum=2, ack_quorum=2))
        done = await ml.add_entries([f"e{i}".encode() for i in range(30)], [1] * 30)
        ledger = done[0][0].ledger_id
        import json
        meta = json.loads(env.metadata.get(f"/ledgers/ledger/{ledger}")[0])
        assert (meta["ensembleSize"], meta["writeQuorumSize"], meta["ackQuorumSize"]) == (3, 2, 2)
        assert len(meta["ensembles"][0][1]) == 3
        entries = await ml.read_entries(done[0][0], 100)
        assert [e.data for e in entries] == [f"e{i}".encode() for i in range(30)]


async def test_too_few_bookies_is_a_clear_error(tmp_path):
    async with storage_env(tmp_path, bookies=1) as env:
        with pytest.raises(_native.NativeError, match="Not enough non-faulty bookies available"):
            ml = await env.storage.open("t/ns/persistent/few", ml_config(ensemble_size=3, write_quorum=2, ack_quorum=2))
            await ml.add_entries([b"x"], [1])


async def test_reading_before_the_first_position_is_refused_cleanly(tmp_path):
    async with storage_env(tmp_path) as env:
        ml = await env.storage.open("t/ns/persistent/empty", ml_config())
        assert ml.last_confirmed() is None
        assert await ml.read_entries(Position(0, 0), 10) == []


@pytest.mark.parametrize("cache_mb", [1, 0])
async def test_entry_cache_is_bounded_by_managed_ledger_cache_size(tmp_path, cache_mb):
    """managedLedgerCacheSizeMB bounds what all topics cache together; tailing reads are
    served from it while the bookies are gone, and with 0 nothing is cached."""
    from core.storage import Storage

    async with storage_env(tmp_path) as env:
        storage = Storage(env.bridge, env.metadata, 5000, cache_size_mb=cache_mb)
        a = await storage.open("t/ns/persistent/cache-a", ml_config())
        b = await storage.open("t/ns/persistent/cache-b", ml_config())
        chunk = [bytes(64 * 1024)] * 8
        for _ in range(4):
            await a.add_entries(chunk, [1] * len(chunk))
            await b.add_entries(chunk, [1] * len(chunk))
            assert storage.cache_used_bytes <= cache_mb << 20
        if cache_mb == 0:
            assert storage.cache_used_bytes == 0
            return
        assert storage.cache_used_bytes > (cache_mb << 20) // 2
        # The newest entries of the topic written last are in memory: readable with no bookie.
        last = (await b.add_entries([b"tail"], [1]))[0][0]
        env.stop_bookie(env.bookies[0])
        got = await b.read_entries(last, 10)
        assert [e.data for e in got] == [b"tail"]


@pytest.mark.parametrize("watermark", [0.5, 1.0])
async def test_a_full_cache_is_evicted_down_to_its_watermark(tmp_path, watermark):
    """managedLedgerCacheEvictionWatermark: the add that takes the cache over its size
    evicts the oldest entries until the cache holds that fraction of its size."""
    from core.storage import Storage

    async with storage_env(tmp_path) as env:
        storage = Storage(env.bridge, env.metadata, 5000, cache_size_mb=1,
                          cache_eviction_watermark=watermark)
        ml = await storage.open("t/ns/persistent/watermark", ml_config())
        used = []
        for _ in range(20):
            await ml.add_entries([bytes(64 * 1024)], [1])
            used.append(storage.cache_used_bytes)
        assert used[15] == 1 << 20  # 16 entries: full, nothing evicted yet
        assert max(used) <= 1 << 20
        # The 17th entry went over: evicted down to the watermark, then refilled.
        assert used[16] <= watermark * (1 << 20)
        assert used[16] > watermark * (1 << 20) - 64 * 1024
        assert used[19] == used[16] + 3 * 64 * 1024 or watermark == 1.0


async def test_an_idle_topic_gives_its_cached_entries_back(tmp_path):
    """Entries past managedLedgerCacheEvictionTimeThresholdMillis leave the cache even when
    their topic is not written again, so an idle topic does not hold the shared budget."""
    import trio

    from core.storage import Storage

    async with storage_env(tmp_path) as env:
        storage = Storage(env.bridge, env.metadata, 5000, cache_size_mb=16)
        ml = await storage.open("t/ns/persistent/idle", ml_config(cache_eviction_time_ms=200))
        await ml.add_entries([bytes(1024)] * 10, [1] * 10)
        assert storage.cache_used_bytes >= 10 * 1024
        for _ in range(100):  # the sweep runs every 100 ms: at most 5 s
            if storage.cache_used_bytes == 0:
                break
            await trio.sleep(0.05)
        assert storage.cache_used_bytes == 0


def test_the_native_allocator_keeps_freed_memory_for_reuse():
    """Handing freed memory back to the OS stalled whichever native thread did it (11 ms
    of madvise in a runtime thread, every add behind it waiting, when a burst's cached
    entries aged out); the native core keeps it for reuse instead."""
    assert _native.allocator_options() == {"purge_delay_ms": -1}


async def test_a_bookie_down_during_a_delete_collects_the_ledgers_it_missed(tmp_path):
    """gcWaitTime's garbage collection: ledgers deleted while a bookie was down stay on
    its disk until it compares what it holds with the metadata store."""
    from gateway._bookies import collect_garbage

    async with storage_env(tmp_path, bookies=2) as env:
        quorum = {"ensemble_size": 2, "write_quorum": 2, "ack_quorum": 2,
                  "max_entries_per_ledger": 5, "min_rollover_time_ms": 0}
        gone = await env.storage.open("t/ns/persistent/deleted", ml_config(**quorum))
        kept = await env.storage.open("t/ns/persistent/kept", ml_config(**quorum))
        for i in range(12):
            await gone.add_entries([b"g%d" % i], [1])
            await kept.add_entries([b"k%d" % i], [1])
        held = env.bookies[1].ledgers()
        assert len(held) >= 6  # both topics rolled over: several ledgers each
        assert collect_garbage(env.bookies[1], env.metadata) == []  # all still listed

        env.stop_bookie(env.bookies[1])
        await gone.delete()  # bookie 1 misses the deletes
        back = env.add_bookie(index=1)
        assert back.ledgers() == held
        assert env.bookies[0].ledgers() != held  # the live bookie did delete

        collected = collect_garbage(back, env.metadata)
        assert collected and set(collected) < set(held)
        assert back.ledgers() == env.bookies[0].ledgers()
        # What was not deleted is untouched and still readable from both copies.
        first = kept.first_position()
        assert first is not None
        got = await kept.read_entries(first, 20)
        assert [e.data for e in got] == [b"k%d" % i for i in range(12)]
        assert collect_garbage(back, env.metadata) == []


async def test_garbage_collection_spares_a_bookie_on_another_clusters_metadata(tmp_path, caplog):
    """A bookie whose ledgers the metadata store never issued (wrong metadataStoreUrl)
    deletes nothing."""
    from core.metadata import open_metadata_store
    from gateway._bookies import collect_garbage

    async with storage_env(tmp_path) as env:
        ml = await env.storage.open("t/ns/persistent/mine", ml_config())
        await ml.add_entries([b"x"], [1])
        held = env.bookies[0].ledgers()
        other = open_metadata_store(f"sqlite:{tmp_path / 'other.db'}")
        try:
            assert collect_garbage(env.bookies[0], other) == []
        finally:
            other.close()
        assert env.bookies[0].ledgers() == held
        assert "garbage collection skipped" in caplog.text


async def test_the_garbage_collector_runs_every_gc_wait_time():
    from gateway._bookies import garbage_collector

    class Bookie:
        address = "127.0.0.1:1"

        def __init__(self) -> None:
            self.held = [0, 1]
            self.passes = 0
            self.third_pass = trio.Event()

        def ledgers(self) -> list[int]:  # called in a worker thread
            self.passes += 1
            if self.passes == 3:
                trio.from_thread.run_sync(self.third_pass.set)
            return list(self.held)

        def delete_ledger(self, ledger: int) -> None:
            self.held.remove(ledger)

    class Store:
        def get(self, path: str):
            return (b"5", 0)

        def children(self, path: str) -> list[str]:
            return ["1"]

        def exists(self, path: str) -> bool:
            return path.endswith("/1")

    bookie = Bookie()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(garbage_collector, [bookie], Store(), 20)
            await bookie.third_pass.wait()
            nursery.cancel_scope.cancel()
    assert bookie.held == [1]
