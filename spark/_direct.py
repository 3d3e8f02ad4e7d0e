"""Reading a range straight from the bookies: entries in, Arrow record batches out.

Theory of operation
-------------------
The driver plans each input partition inside one ledger and, when the admin API gave it
the ledger's metadata record (``internalStats?metadata=true``), passes that record along.
Every entry the planner hands out is confirmed (the layout stops at the topic's last
confirmed entry, and a closed ledger's entries are all final), so an executor can read
them from any bookie of their write set without asking the broker or fencing anything.

:class:`core._native.LedgerRangeReader` does the reading and the decoding in Rust (see
rust/py/src/ledger_reader.rs and the ``magnetar_format`` crate): it returns each batch of
rows as column buffers in Arrow's layout, which become arrays here with
``pa.Array.from_buffers`` - no Python object per message. Only two columns are derived
in Python, per distinct value rather than per row: ``protocol`` (from the few producer
names of a batch) and, with ``decodeSchema``, the schema's columns (which need the
schema's own decoder on each value).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._source import MagnetarPartition

__all__ = ["read_direct", "direct_read_errors", "BOOKIE_TIMEOUT_MS"]

#: How long one bookie may take to answer a read before the next replica is asked.
BOOKIE_TIMEOUT_MS = 10_000
#: Column data one Arrow batch may hold before it is handed over.
MAX_BATCH_BYTES = 64 * 1024 * 1024


def _var(pa: Any, cols: dict[str, Any], name: str, typ: Any, n: int) -> Any:
    validity = cols[f"{name}_validity"]
    return pa.Array.from_buffers(
        typ, n, [None if validity is None else pa.py_buffer(validity),
                 pa.py_buffer(cols[f"{name}_offsets"]), pa.py_buffer(cols[f"{name}_data"])],
        null_count=cols[f"{name}_nulls"])


def _fixed(pa: Any, cols: dict[str, Any], name: str, typ: Any, n: int) -> Any:
    validity = cols.get(f"{name}_validity")
    return pa.Array.from_buffers(
        typ, n, [None if validity is None else pa.py_buffer(validity), pa.py_buffer(cols[name])],
        null_count=cols.get(f"{name}_nulls", 0))


def _protocols(pa: Any, producers: Any) -> Any:
    from ._source import protocol_of

    encoded = producers.dictionary_encode()
    names = pa.array([protocol_of(p) for p in encoded.dictionary.to_pylist()], pa.string())
    return names.take(encoded.indices)


def record_batch(split: MagnetarPartition, schema: Any, cols: dict[str, Any], state: dict[str, Any]) -> Any:
    """One Arrow record batch of ``schema`` from the column buffers of a native batch."""
    import pyarrow as pa

    n = cols["rows"]
    by_name = {f.name: f.type for f in schema}
    entries = len(cols["property_keys_offsets"]) // 4 - 1
    properties = pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(cols["properties_offsets"])]),
        _var(pa, cols, "property_keys", pa.string(), entries),
        _var(pa, cols, "property_values", pa.string(), entries),
        type=by_name["properties"])
    producers = _var(pa, cols, "producer_name", pa.string(), n)
    value = _var(pa, cols, "value", pa.binary(), n)
    arrays = [
        pa.repeat(pa.scalar(split.label, pa.string()), n),
        pa.repeat(pa.scalar(split.partition, pa.int32()), n),
        _fixed(pa, cols, "offset", pa.int64(), n),
        _var(pa, cols, "message_id", pa.string(), n),
        _var(pa, cols, "key", pa.binary(), n),
        value,
        properties,
        _fixed(pa, cols, "publish_time", by_name["publishTime"], n),
        _fixed(pa, cols, "event_time", by_name["eventTime"], n),
        producers,
        _protocols(pa, producers),
    ]
    if split.decoder is not None:
        decoded = [split.decoder.decode(v, state) for v in value.to_pylist()]
        types = split.decoder.arrow_types(pa)
        arrays += [pa.array([row[i] for row in decoded], type=t) for i, t in enumerate(types)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def direct_read_errors() -> tuple[type[Exception], ...]:
    """What a direct read raises when it cannot go on (the Reader takes over then)."""
    try:
        from core._native import NativeError
    except ImportError:
        return (ImportError, ValueError)
    return (ImportError, ValueError, NativeError)


def read_direct(split: MagnetarPartition, schema: Any, batch_rows: int) -> Iterator[Any]:
    """The rows of ``split`` read from its ledger's bookies, as Arrow record batches.

    Raises ``core._native.NativeError`` (``BookieError`` when no replica answers) or
    ``ValueError`` (metadata that does not allow the read) - possibly after some batches
    were yielded; the caller resumes from the next offset another way.
    """
    from core._native import LedgerRangeReader

    assert split.ledger_metadata is not None
    reader = LedgerRangeReader(split.ledger_id, split.ledger_metadata.encode(), split.entry_id,
                               split.last_entry_id, split.from_offset, split.to_offset,
                               timeout_ms=BOOKIE_TIMEOUT_MS)
    state: dict[str, Any] = {}
    while (cols := reader.next_batch(batch_rows, MAX_BATCH_BYTES)) is not None:
        yield record_batch(split, schema, cols, state)
