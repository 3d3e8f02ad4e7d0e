"""Async faces of the native managed ledger and cursors, for trio code.

Each method starts the native operation through :class:`core._bridge.NativeBridge` and
awaits its completion; nothing here touches storage itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from core import _native
from core._bridge import NativeBridge
from core._native import NativeError
from core.format import EntryFormatError, MessageMetadata

__all__ = ["NativeError", "entry_metadata", "chunk_metadata", "Entry", "Position", "Storage", "ManagedLedger", "Cursor", "EARLIEST", "LATEST",
           "last_confirmed_entry"]

EARLIEST = True
LATEST = False


# Positions and entries are made once per entry stored or read, on every protocol's hot
# path. Both are named tuples: comparing, ordering and hashing a position (as dict keys and
# sorted sets of positions do several times per message) run in C, and the native rows
# become entries through tuple's own constructor, with no Python call per entry (a named
# tuple's generated ``__new__`` is one).

_tuple_new = tuple.__new__


class Position(NamedTuple):
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


class Entry(NamedTuple):
    position: Position
    publish_time: int
    index: int  # type: ignore[assignment]  # the field shadows tuple.index, unused here
    num_messages: int
    data: bytes


def entries_from_native(raw: list[tuple[int, int, int, int, int, bytes]]) -> list[Entry]:
    """The native core's (ledger id, entry id, publish time, index, messages, data) rows
    as entries."""
    return [_tuple_new(Entry, (_tuple_new(Position, t[:2]), t[2], t[3], t[4], t[5])) for t in raw]


class Storage:
    """Opens managed ledgers (one per topic) over the native core."""

    def __init__(self, bridge: NativeBridge, metadata_store: object, request_timeout_ms: int = 30000,
                 cache_size_mb: int = 256, cache_eviction_watermark: float = 0.9,
                 max_frame_size: int = _native.MAX_FRAME_SIZE):
        self.bridge = bridge
        self._factory = _native.ManagedLedgerFactory(
            metadata_store, request_timeout_ms, cache_size_mb=cache_size_mb,
            cache_eviction_watermark=cache_eviction_watermark, max_frame_size=max_frame_size)

    @property
    def cache_used_bytes(self) -> int:
        """Bytes the managed ledgers' entry caches hold now, all topics together."""
        return int(self._factory.cache_used_bytes)

    async def replace_bookie(self, ledger_id: int, lost: str, batch: int) -> tuple[str, list[str], int]:
        """Re-replicate closed ledger ``ledger_id`` off the lost bookie ``lost`` (see
        :meth:`core._native.ManagedLedgerFactory.replace_bookie`)."""
        status, bookies, entries = await self.bridge.call(self._factory.replace_bookie, ledger_id,
                                                          lost, batch)
        return str(status), list(bookies), int(entries)

    async def open(self, name: str, config: dict[str, Any]) -> ManagedLedger:
        native = await self.bridge.call(self._factory.open, name, config)
        return ManagedLedger(self.bridge, native)

    def shutdown(self) -> None:
        self._factory.shutdown()


def _added(raw: list[tuple[int, int, int, int]]) -> list[tuple[Position, int, int]]:
    """The native add's (ledger, entry, index, publish time) rows as (position, index,
    publish time)."""
    return [(Position(le, en), idx, ts) for le, en, idx, ts in raw]


def last_confirmed_entry(stats: dict[str, Any]) -> Position:
    """The last confirmed entry as Pulsar's managed ledger reports it, from the managed
    ledger's ``stats()``: before the first entry, entry -1 of the current ledger; with no
    ledger at all, (-1, -1)."""
    last = stats.get("last_confirmed")
    if last is not None:
        return Position(*last)
    current = stats.get("current_ledger_id")
    return Position(current, -1) if current is not None else Position(-1, -1)


class ManagedLedger:
    def __init__(self, bridge: NativeBridge, native: Any):
        self.bridge = bridge
        self.native = native

    @property
    def name(self) -> str:
        return str(self.native.name)

    @property
    def max_entry_size(self) -> int:
        """The largest entry :meth:`add_entries` takes: what one bookie frame holds
        (``nettyMaxFrameSizeBytes``), less the headers stored with it."""
        return int(self.native.max_entry_size)

    async def add_entries(self, entries: list[bytes], num_messages: list[int]) -> list[tuple[Position, int, int]]:
        """Append a batch; returns (position, index, publish_time) per entry, in order."""
        return _added(await self.bridge.call(self.native.add_entries, entries, num_messages))

    def start_add_entries(self, entries: list[bytes], num_messages: list[int],
                          done: Callable[[list[tuple[int, int, int, int]] | BaseException], None]
                          ) -> None:
        """Append a batch without a waiting task: ``done`` gets a (ledger id, entry id,
        index, publish time) row per entry, in order, or the exception
        :meth:`add_entries` would raise."""
        self.bridge.start(self.native.add_entries, entries, num_messages,
                          done=lambda ok, value: done(value))

    async def read_entries(self, start: Position, max_entries: int) -> list[Entry]:
        raw = await self.bridge.call(self.native.read_entries, start.ledger_id, start.entry_id, max_entries)
        return entries_from_native(raw)

    async def wait_entries_after(self, position: Position) -> None:
        await self.bridge.call(self.native.wait_entries_after, position.ledger_id, position.entry_id)

    async def open_cursor(self, name: str, earliest: bool) -> Cursor:
        return Cursor(self.bridge, await self.bridge.call(self.native.open_cursor, name, earliest))

    def new_non_durable_cursor(self, start: Position) -> Cursor:
        return Cursor(self.bridge, self.native.new_non_durable_cursor(start.ledger_id, start.entry_id))

    async def delete_cursor(self, name: str) -> None:
        await self.bridge.call(self.native.delete_cursor, name)

    def cursor_names(self) -> list[str]:
        return list(self.native.cursor_names())

    def last_confirmed(self) -> Position | None:
        p = self.native.last_confirmed()
        return Position(*p) if p is not None else None

    def next_index(self) -> int:
        """One past the broker index of the last confirmed message (what ``stats()`` says
        as ``next_index``, without building the rest)."""
        return int(self.native.next_index())

    def first_position(self) -> Position | None:
        p = self.native.first_position()
        return Position(*p) if p is not None else None

    async def find_by_index(self, index: int) -> Position | None:
        p = await self.bridge.call(self.native.find_by_index, index)
        return Position(*p) if p is not None else None

    async def find_by_publish_time(self, publish_time_ms: int) -> Position | None:
        p = await self.bridge.call(self.native.find_by_publish_time, publish_time_ms)
        return Position(*p) if p is not None else None

    def stats(self) -> dict[str, Any]:
        return dict(self.native.stats())

    def ledgers(self) -> list[dict[str, Any]]:
        return list(self.native.ledgers())

    async def trim(self) -> None:
        await self.bridge.call(self.native.trim)

    def raise_trim_floor(self, floor: int) -> None:
        """Messages below index ``floor`` were deleted on request: every later trim also
        drops the ledgers wholly below it once every durable cursor has passed them,
        whatever retention says."""
        self.native.raise_trim_floor(floor)

    async def check_rollover(self) -> bool:
        """Seal the current ledger if it is past its rollover rules; True if it did."""
        return bool(await self.bridge.call(self.native.check_rollover))

    async def close(self) -> None:
        await self.bridge.call(self.native.close)

    async def delete(self) -> None:
        await self.bridge.call(self.native.delete)


class Cursor:
    def __init__(self, bridge: NativeBridge, native: Any):
        self.bridge = bridge
        self.native = native

    @property
    def name(self) -> str:
        return str(self.native.name)

    async def read_entries(self, max_entries: int) -> list[Entry]:
        cached = self.read_cached(max_entries)  # new entries: no trip to the runtime
        if cached is not None:
            return cached
        raw = await self.bridge.call(self.native.read_entries, max_entries)
        return entries_from_native(raw)

    def read_cached(self, max_entries: int) -> list[Entry] | None:
        """What :meth:`read_entries` would return, now, when the entry cache holds it
        (moving the read position past it); None when the read has to go to the bookies."""
        raw = self.native.read_cached(max_entries)
        return None if raw is None else entries_from_native(raw)

    def mark_delete(self, position: Position) -> None:
        self.native.mark_delete(position.ledger_id, position.entry_id)

    def delete(self, positions: list[Position]) -> None:
        self.native.delete(positions)  # positions are (ledger id, entry id) tuples already

    def properties(self) -> dict[str, str]:
        """The cursor's properties (a subscription's properties)."""
        return dict(self.native.properties())

    async def set_properties(self, properties: dict[str, str]) -> None:
        """Replace the cursor's properties, persisted before this returns."""
        await self.bridge.call(self.native.set_properties, dict(properties))

    def set_batch_acks(self, acks: list[tuple[Position, list[int]]]) -> None:
        """Record batch-index acknowledgements (each entry's ack set, its set bits the
        messages still unacknowledged); persisted with the cursor's other acknowledgements,
        in the order they were made."""
        self.native.set_batch_acks([(p.ledger_id, p.entry_id, a) for p, a in acks])

    def batch_acks(self) -> dict[Position, list[int]]:
        """The batch-index acknowledgements the cursor holds (those of entries not wholly
        acknowledged)."""
        return {Position(le, en): list(a) for le, en, a in self.native.batch_acks()}

    def rewind(self) -> None:
        self.native.rewind()

    def seek(self, position: Position) -> None:
        self.native.seek(position.ledger_id, position.entry_id)

    async def reset(self, position: Position) -> None:
        await self.bridge.call(self.native.reset, position.ledger_id, position.entry_id)

    def mark_delete_position(self) -> Position:
        return Position(*self.native.mark_delete_position())

    def read_position(self) -> Position:
        return Position(*self.native.read_position())

    def individually_deleted(self) -> list[tuple[Position, Position]]:
        return [(Position(*a), Position(*b)) for a, b in self.native.individually_deleted()]

    def backlog(self) -> int:
        return int(self.native.backlog())

    def has_more(self) -> bool:
        return bool(self.native.has_more())

    async def flush(self) -> None:
        await self.bridge.call(self.native.flush)


_MD_HEADER = 10  # magic u16 + crc32c u32 + metadata size u32


def entry_metadata(data: bytes) -> MessageMetadata:
    """The MessageMetadata of a stored entry, without checking its checksum or copying its
    payload (the dispatch path reads keys and delivery times this way)."""
    if len(data) < _MD_HEADER or data[0] != 0x0E or data[1] != 0x01:
        raise EntryFormatError("stored entry does not start with the 0x0e01 magic")
    size = int.from_bytes(data[6:10], "big")
    if _MD_HEADER + size > len(data):
        raise EntryFormatError("stored entry metadata exceeds the entry")
    md = MessageMetadata()
    try:
        md.ParseFromString(memoryview(data)[_MD_HEADER:_MD_HEADER + size])
    except Exception as exc:
        raise EntryFormatError(f"malformed message metadata: {exc}") from exc
    return md


def chunk_metadata(data: bytes) -> MessageMetadata | None:
    """The metadata of a stored entry that is one chunk of a message its producer split
    (``num_chunks_from_msg`` > 1: its ``uuid`` names the message, ``chunk_id`` orders the
    chunks); None for any other entry. Only the metadata is parsed."""
    try:
        md = entry_metadata(data)
    except EntryFormatError:
        return None
    return md if md.num_chunks_from_msg > 1 else None
