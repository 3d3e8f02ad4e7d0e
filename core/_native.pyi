# The native core's Python interface (rust/py). Checked against the extension with
# `python -m mypy.stubtest core._native`.
#
# Asynchronous operations take a CompletionQueue and a token, return at once, and later
# push (token, ok, value) onto the queue; core._bridge.NativeBridge awaits them.

from typing import Any, final

__version__: str
#: The range of nettyMaxFrameSizeBytes: the smallest limit a bookie frame may be given, and
#: the hard cap on any frame.
MIN_FRAME_SIZE: int
MAX_FRAME_SIZE: int
__all__ = [
    "__version__", "MIN_FRAME_SIZE", "MAX_FRAME_SIZE",
    "BookieError", "BookieServer", "CompletionQueue", "Cursor", "CursorNotFoundError",
    "FencedError", "LedgerClosedError", "LedgerRangeReader", "ManagedLedger", "ManagedLedgerFactory",
    "MetadataError", "NativeError", "NoSuchLedgerError", "NotEnoughBookiesError",
    "crc32c", "kafka_batch_from_entry", "kafka_entry_from_batch",
    "encode_pulsar_messages", "encode_pulsar_send_receipts", "scan_pulsar_send",
    "scan_pulsar_sends", "scan_pulsar_acks",
    "allocator_options", "log_to_stderr",
]


@final
class CompletionQueue:
    def __new__(cls) -> CompletionQueue: ...
    def fileno(self) -> int: ...
    def drain(self) -> list[tuple[int, bool, Any]]: ...

class NativeError(Exception): ...
class NotEnoughBookiesError(NativeError): ...
class FencedError(NativeError): ...
class LedgerClosedError(NativeError): ...
class NoSuchLedgerError(NativeError): ...
class MetadataError(NativeError): ...
class BookieError(NativeError): ...
class CursorNotFoundError(NativeError): ...

@final
class BookieServer:
    """A bookie serving on its own TCP port from `data_dir` (journal replayed on start).
    Its ledgers live in `data_dir` too, or spread over `ledger_dirs` when given. A
    connection sending a frame longer than `max_frame_size` (nettyMaxFrameSizeBytes,
    MIN_FRAME_SIZE to MAX_FRAME_SIZE, else ValueError) is closed."""

    def __new__(
        cls,
        data_dir: str,
        host: str,
        port: int,
        journal_sync_data: bool = True,
        journal_max_group_wait_ms: float = 2.0,
        journal_buffered_writes_threshold: int = 524288,
        journal_max_size_mb: int = 2048,
        journal_flush_when_queue_empty: bool = True,
        journal_pre_alloc_size_mb: int = 16,
        flush_entry_log_bytes: int = 67108864,
        flush_interval_ms: int = 60000,
        journal_max_backups: int = 0,
        ledger_dirs: list[str] = ...,
        max_frame_size: int = ...,
        advertised_host: str = "",
    ) -> BookieServer: ...
    @property
    def address(self) -> str:
        """Where it serves, or ``advertised_host`` with the port it serves on: what it is
        registered and named in ledger ensembles by."""
    def stats(self) -> dict[str, int]: ...
    def ledgers(self) -> list[int]: ...
    def delete_ledger(self, ledger: int) -> None: ...
    def shutdown(self) -> None: ...

# An entry as read: (ledger_id, entry_id, publish_time_ms, index, num_messages, data)
_Entry = tuple[int, int, int, int, int, bytes]
# (ledger_id, entry_id)
_Position = tuple[int, int]

@final
class ManagedLedgerFactory:
    """Opens managed ledgers whose ledgers live on the bookies listed in `metadata_store`.
    With `local_bookies`, bookies running in this process are called directly, not over TCP.
    `cache_size_mb` bounds the entry caches of all its managed ledgers together; once over
    it, they are evicted down to `cache_eviction_watermark` (0 to 1) of it. No request goes
    to a bookie in a frame longer than `max_frame_size` (nettyMaxFrameSizeBytes)."""

    def __new__(
        cls, metadata_store: object, request_timeout_ms: int = 30000, local_bookies: bool = True,
        cache_size_mb: int = 256, cache_eviction_watermark: float = 0.9,
        max_frame_size: int = ...,
    ) -> ManagedLedgerFactory: ...
    def replace_bookie(self, queue: CompletionQueue, token: int, ledger_id: int, lost: str,
                       batch: int) -> None:
        """Give lost bookie `lost`'s place in closed ledger `ledger_id` to other bookies,
        after copying what it held there, `batch` entries at a time. Completes with
        `(status, new bookies, entries copied)`; status is `replaced`, `not-closed` or
        `not-in-ledger`."""
    @property
    def cache_used_bytes(self) -> int:
        """Bytes the entry caches hold now, over every managed ledger."""
    def open(self, queue: CompletionQueue, token: int, name: str, config: dict[str, Any]) -> None:
        """Completes with a ManagedLedger."""
    def shutdown(self) -> None: ...

@final
class ManagedLedger:
    @property
    def name(self) -> str: ...
    @property
    def max_entry_size(self) -> int:
        """The largest entry `add_entries` takes (what one bookie frame holds, less the
        headers stored with it); a call holding a larger one fails with ValueError."""
    def add_entries(
        self, queue: CompletionQueue, token: int, entries: list[bytes], num_messages: list[int]
    ) -> None:
        """Completes with [(ledger_id, entry_id, index, publish_time_ms), ...] in order."""
    def read_entries(
        self, queue: CompletionQueue, token: int, ledger_id: int, entry_id: int, max_entries: int
    ) -> None:
        """Completes with [_Entry, ...] starting at the position (inclusive)."""
    def wait_entries_after(self, queue: CompletionQueue, token: int, ledger_id: int, entry_id: int) -> None:
        """Completes (with None) once an entry after the position is confirmed."""
    def open_cursor(self, queue: CompletionQueue, token: int, name: str, earliest: bool) -> None:
        """Completes with a Cursor (durable)."""
    def new_non_durable_cursor(self, ledger_id: int, entry_id: int) -> Cursor: ...
    def delete_cursor(self, queue: CompletionQueue, token: int, name: str) -> None: ...
    def cursor_names(self) -> list[str]: ...
    def last_confirmed(self) -> _Position | None: ...
    def first_position(self) -> _Position | None: ...
    def next_index(self) -> int:
        """One past the broker index of the last confirmed message."""
    def find_by_index(self, queue: CompletionQueue, token: int, index: int) -> None:
        """Completes with the _Position of the entry holding message `index`, or None."""
    def find_by_publish_time(self, queue: CompletionQueue, token: int, publish_time_ms: int) -> None:
        """Completes with the first _Position published at or after the time, or None."""
    def stats(self) -> dict[str, Any]: ...
    def ledgers(self) -> list[dict[str, Any]]: ...
    def check_rollover(self, queue: CompletionQueue, token: int) -> None:
        """Completes with True when the current ledger was sealed."""
    def trim(self, queue: CompletionQueue, token: int) -> None: ...
    def raise_trim_floor(self, floor: int) -> None:
        """Messages below index `floor` were deleted on request: later trims also drop the
        ledgers wholly below it once every durable cursor has passed them."""
    def close(self, queue: CompletionQueue, token: int) -> None: ...
    def delete(self, queue: CompletionQueue, token: int) -> None: ...

@final
class Cursor:
    @property
    def name(self) -> str: ...
    def read_entries(self, queue: CompletionQueue, token: int, max_entries: int) -> None:
        """Completes with [_Entry, ...] from the read position (possibly empty)."""
    def read_cached(self, max_entries: int) -> list[_Entry] | None:
        """What read_entries would complete with, now, when the entry cache holds it."""
    def mark_delete(self, ledger_id: int, entry_id: int) -> None: ...
    def delete(self, positions: list[_Position]) -> None: ...
    def properties(self) -> dict[str, str]:
        """The cursor's properties, persisted with it."""
    def set_properties(self, queue: CompletionQueue, token: int, properties: dict[str, str]) -> None:
        """Replace the cursor's properties; completes once persisted."""
    def set_batch_acks(self, acks: list[tuple[int, int, list[int]]]) -> None:
        """Batch-index acknowledgements (ledger_id, entry_id, ack_set), persisted."""
    def batch_acks(self) -> list[tuple[int, int, list[int]]]:
        """The batch-index acknowledgements held, in position order."""
    def rewind(self) -> None: ...
    def seek(self, ledger_id: int, entry_id: int) -> None: ...
    def reset(self, queue: CompletionQueue, token: int, ledger_id: int, entry_id: int) -> None: ...
    def mark_delete_position(self) -> _Position: ...
    def read_position(self) -> _Position: ...
    def individually_deleted(self) -> list[tuple[_Position, _Position]]: ...
    def backlog(self) -> int: ...
    def has_more(self) -> bool: ...
    def flush(self, queue: CompletionQueue, token: int) -> None: ...

def kafka_entry_from_batch(
    batch: bytes, producer_name: str, sequence_id: int, publish_time: int
) -> tuple[bytes, int, bool] | None:
    """The entry storing the one Kafka record batch ``batch`` holds: (entry, records,
    contiguous offset deltas), or None for a compressed, control or non-v2 batch. A
    malformed batch raises ValueError."""

def kafka_batch_from_entry(
    entry: bytes, index: int, num_messages: int, publish_time: int
) -> bytes | None:
    """The Kafka record batch for a stored entry whose last message has broker index
    ``index``; None for an entry left to the caller (compressed, encrypted, damaged, or not
    in canonical form)."""

@final
class LedgerRangeReader:
    """Confirmed entries of one ledger read straight from its bookies, as column buffers."""

    def __new__(cls, ledger_id: int, metadata: bytes, first_entry: int, last_entry: int,
                from_offset: int, to_offset: int, timeout_ms: int = 10000) -> LedgerRangeReader: ...
    def next_batch(self, max_rows: int = 65536, max_bytes: int = 67108864) -> dict[str, Any] | None: ...
    @property
    def entries_read(self) -> int: ...

# The Pulsar protocol's hot frames (rust/pulsar-wire), for handlers/pulsar.

def encode_pulsar_messages(
    consumer_id: int,
    partition: int,
    deliveries: list[tuple[int, int, int, list[int] | None, int, int, bytes]],
    broker_entry_metadata: bool,
    max_frame: int,
) -> bytes:
    """MESSAGE frames, concatenated, for (ledger_id, entry_id, redelivery_count, ack_set,
    publish_time, index, entry) deliveries; ValueError when a frame exceeds max_frame."""
def encode_pulsar_send_receipts(rows: list[tuple[int, int, int, int, int, int]]) -> bytes:
    """SEND_RECEIPT frames, concatenated, for (producer_id, sequence_id, ledger_id,
    entry_id, partition, highest_sequence_id) rows."""
def scan_pulsar_send(command: bytes, entry: bytes) -> tuple[int, int, bool, int, int] | None:
    """(body_start, body_end, checksum_ok, metadata_start, metadata_end) of a plain SEND
    (the body in the command, the metadata in the entry after it), else None."""

def scan_pulsar_sends(
    buf: bytes | bytearray, start: int, max_frame: int
) -> tuple[list[tuple[int, int, int, int, bytes, bool, bool]], int]:
    """The plain SEND frames from ``buf[start:]`` on, one after another, and the position
    after them: ``(producer_id, sequence_id, num_messages, highest_sequence_id, entry,
    checksum_ok, delayed)`` each (``delayed``: the metadata holds ``deliver_at_time``).
    Stops at the first frame that is incomplete, over ``max_frame``, or not a plain SEND."""

def scan_pulsar_acks(
    buf: bytes | bytearray, start: int, max_frame: int
) -> tuple[list[tuple[int, int | None, list[tuple[int, int]], list[list[int] | None] | None]], int]:
    """The plain individual ACK frames from ``buf[start:]`` on, one after another, and the
    position after them: ``(consumer_id, request_id or None, ids, ack_sets)`` each, ``ids``
    the ``(ledger_id, entry_id)`` pairs (those past a signed 64-bit range left out) and
    ``ack_sets`` None when no id has one, else one list or None per id. Stops at the first
    frame that is incomplete, over ``max_frame``, or not a plain individual ACK."""

def allocator_options() -> dict[str, int]:
    """The native allocator's settings that Magnetar changes (``purge_delay_ms``: -1, freed
    memory is kept for reuse rather than handed back to the OS from a hot thread)."""
    ...

def log_to_stderr(level: str, fmt: str) -> None:
    """Write the native core's log records to stderr at `level` and above (a level name
    of gateway._logging) as `fmt` ("text" or "json") lines, as gateway._logging writes
    them. ValueError for an unknown level or format."""

def crc32c(data: bytes | bytearray | memoryview) -> int:
    """The CRC-32C (Castagnoli) of a contiguous bytes-like object, read in place."""
