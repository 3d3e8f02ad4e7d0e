"""PartitionLog.read: record batches still in the batch cache are served from it; storage
is read only from the first batch that is not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from core.storage import Position
from handlers.kafka import _records as rb
from handlers.kafka._topics import BatchCache, PartitionLog


class _Ledger:
    """A managed ledger that knows where offsets are and counts its reads; it holds no
    entries (every batch the test expects comes from the cache)."""

    def __init__(self, positions: dict[int, Position]):
        self.positions = positions
        self.reads: list[Position] = []

    async def find_by_index(self, index: int) -> Position | None:
        return self.positions.get(index)

    async def read_entries(self, pos: Position, max_entries: int) -> list[Any]:
        self.reads.append(pos)
        return []


def _batch(base: int, n: int) -> bytes:
    return rb.encode_batch([rb.Record(offset_delta=i, timestamp=1_000 + i, value=b"v%d" % (base + i))
                            for i in range(n)], base_offset=base)


def _log(positions: dict[int, Position]) -> tuple[PartitionLog, _Ledger, BatchCache]:
    ml = _Ledger(positions)
    cache = BatchCache()
    topic = SimpleNamespace(ml=ml, name="persistent://public/default/t-partition-0", policies={})
    return PartitionLog("t", 0, topic, SimpleNamespace(cache=cache)), ml, cache  # type: ignore[arg-type]


async def test_cached_batches_are_served_without_reading_storage() -> None:
    plog, ml, cache = _log({0: Position(7, 0), 1: Position(7, 0), 3: Position(7, 1)})
    first, second = _batch(0, 3), _batch(3, 2)
    cache.put(plog.cache_key(Position(7, 0)), first)
    cache.put(plog.cache_key(Position(7, 1)), second)

    assert await plog.read(1, 1 << 20, 5) == [first, second]
    assert ml.reads == []
    # The byte budget is honoured, one batch at least.
    assert await plog.read(0, 10, 5) == [first]
    # Where the cache ends, storage is read, from the next position.
    assert await plog.read(0, 1 << 20, 6) == [first, second]
    assert ml.reads == [Position(7, 2)]
    # Reading on from the end of the previous read needs no search.
    assert plog.hints[5] == Position(7, 2)
