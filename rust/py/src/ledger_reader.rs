//! `LedgerRangeReader`: read a confirmed range of a ledger straight from its bookies and
//! hand the messages over as Arrow-layout column buffers (for the Spark data source).
//!
//! # Theory of operation
//!
//! The caller (a Spark executor) knows the ledger's metadata record (ensembles, write
//! quorum; from the admin API) and a range of entries every one of which is confirmed:
//! the ledger is closed at or after the range's end, or the range ends at or before the
//! broker's last confirmed entry. Confirmed entries never change, so reading them needs
//! no coordination with the writer: no fencing, no metadata writes, no last-add-confirmed
//! round trip. Each entry is read from the bookies of its write set in turn until one
//! returns it intact (bookies that failed are tried last afterwards).
//!
//! Reads run on the native runtime, up to [`READ_AHEAD`] entries ahead of the decoder, in
//! entry order; they go on while Python turns the previous batch into Arrow arrays.
//! `next_batch` waits for entries and decodes them (ledger frame, managed-ledger header,
//! Pulsar entry) into `magnetar_format::MessageColumns` with the GIL released, and returns
//! the columns' buffers as `bytes`: no Python object per message.

use std::collections::{HashSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_format::{EntryPosition, MessageColumns, Validity, VarColumn};
use magnetar_ledger::metadata::{LedgerMetadata, LedgerState};
use magnetar_ledger::{read_from_replicas, BookiePool, ReplicaFailure};
use magnetar_stream::EntryHeader;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tokio::task::JoinHandle;

use crate::errors::{BookieError, NativeError};
use crate::runtime::runtime;

/// Entries requested from the bookies ahead of the one being decoded.
pub const READ_AHEAD: usize = 16;

/// Why reading a range stopped.
enum ReadError {
    /// No bookie of the write set returned the entry.
    Bookies(String),
    /// An entry did not decode.
    Format(String),
}

impl From<ReadError> for PyErr {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Bookies(m) => BookieError::new_err(m),
            ReadError::Format(m) => NativeError::new_err(m),
        }
    }
}

/// What every read task of one range shares.
struct Source {
    ledger_id: u64,
    metadata: LedgerMetadata,
    pool: BookiePool,
    failed: Mutex<HashSet<String>>,
}

impl Source {
    /// Entry `entry`'s payload (the managed-ledger entry), from the first bookie of its
    /// write set that returns it intact. Reads never fence.
    async fn read(&self, entry: u64) -> Result<Bytes, ReadError> {
        let read = read_from_replicas(
            &self.pool,
            &self.metadata,
            self.ledger_id,
            entry,
            |addr| self.failed.lock().contains(addr),
            |addr| {
                self.failed.lock().insert(addr.to_string());
            },
        )
        .await;
        read.map_err(|failures| {
            let errors: Vec<String> = failures
                .into_iter()
                .map(|(addr, f)| match f {
                    ReplicaFailure::Corrupt(e) => format!("{addr}: corrupt entry: {e}"),
                    ReplicaFailure::Bookie(e) => format!("{addr}: {e}"),
                })
                .collect();
            ReadError::Bookies(format!(
                "ledger {} entry {entry}: no bookie returned it ({})",
                self.ledger_id,
                errors.join("; ")
            ))
        })
    }
}

struct State {
    next_entry: u64,
    last_entry: u64,
    inflight: VecDeque<(u64, JoinHandle<Result<Bytes, ReadError>>)>,
    done: bool,
    entries_read: u64,
}

/// Reads entries `first_entry..=last_entry` of one ledger from its bookies and yields the
/// rows whose offsets fall in `[from_offset, to_offset)` as column buffers.
#[pyclass(module = "core._native", name = "LedgerRangeReader")]
pub struct PyLedgerRangeReader {
    source: Arc<Source>,
    offsets: Range<i64>,
    state: Mutex<State>,
    /// Refilled for every batch; its buffers keep their capacity from one to the next.
    columns: Mutex<MessageColumns>,
}

fn var_column<'py>(py: Python<'py>, out: &Bound<'py, PyDict>, name: &str, c: &VarColumn) -> PyResult<()> {
    out.set_item(format!("{name}_offsets"), le_i32(py, &c.offsets)?)?;
    out.set_item(format!("{name}_data"), PyBytes::new(py, &c.data))?;
    validity(py, out, name, &c.validity)
}

fn validity<'py>(py: Python<'py>, out: &Bound<'py, PyDict>, name: &str, v: &Validity) -> PyResult<()> {
    out.set_item(format!("{name}_nulls"), v.null_count())?;
    if v.null_count() > 0 {
        out.set_item(format!("{name}_validity"), PyBytes::new(py, v.bits()))?;
    } else {
        out.set_item(format!("{name}_validity"), py.None())?;
    }
    Ok(())
}

/// `v` as little-endian bytes, written straight into a new `bytes` object.
fn le_bytes<'py, T, const N: usize>(py: Python<'py>, v: &[T], to_le: fn(&T) -> [u8; N]) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, v.len() * N, |buf| {
        for (chunk, x) in buf.chunks_exact_mut(N).zip(v) {
            chunk.copy_from_slice(&to_le(x));
        }
        Ok(())
    })
}

fn le_i32<'py>(py: Python<'py>, v: &[i32]) -> PyResult<Bound<'py, PyBytes>> {
    le_bytes(py, v, |x| x.to_le_bytes())
}

fn le_i64<'py>(py: Python<'py>, v: &[i64]) -> PyResult<Bound<'py, PyBytes>> {
    le_bytes(py, v, |x| x.to_le_bytes())
}

fn columns_dict<'py>(py: Python<'py>, c: &MessageColumns) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("rows", c.rows())?;
    out.set_item("offset", le_i64(py, &c.offset)?)?;
    var_column(py, &out, "message_id", &c.message_id)?;
    var_column(py, &out, "key", &c.key)?;
    var_column(py, &out, "value", &c.value)?;
    out.set_item("properties_offsets", le_i32(py, &c.property_offsets)?)?;
    var_column(py, &out, "property_keys", &c.property_keys)?;
    var_column(py, &out, "property_values", &c.property_values)?;
    out.set_item("publish_time", le_i64(py, &c.publish_time)?)?;
    out.set_item("event_time", le_i64(py, &c.event_time)?)?;
    validity(py, &out, "event_time", &c.event_time_validity)?;
    var_column(py, &out, "producer_name", &c.producer_name)?;
    Ok(out)
}

impl PyLedgerRangeReader {
    /// Keep up to [`READ_AHEAD`] reads in flight.
    fn fill(&self, st: &mut State) {
        while st.inflight.len() < READ_AHEAD && st.next_entry <= st.last_entry {
            let entry = st.next_entry;
            let source = Arc::clone(&self.source);
            st.inflight.push_back((entry, runtime().spawn(async move { source.read(entry).await })));
            st.next_entry += 1;
        }
    }

    /// Decode entries into `columns` until it holds `max_rows` rows or `max_bytes` bytes
    /// in one column, or the range is read.
    fn decode_into(&self, columns: &mut MessageColumns, max_rows: usize, max_bytes: usize) -> Result<(), ReadError> {
        let mut st = self.state.lock();
        while !st.done && columns.rows() < max_rows && columns.data_bytes() < max_bytes {
            self.fill(&mut st);
            let Some((entry, task)) = st.inflight.pop_front() else {
                st.done = true;
                break;
            };
            let stored = runtime()
                .block_on(task)
                .map_err(|e| ReadError::Bookies(format!("read task failed: {e}")))??;
            st.entries_read += 1;
            let (header, pulsar_entry) = EntryHeader::decode(&stored).map_err(|e| ReadError::Format(e.to_string()))?;
            let index = i64::try_from(header.index).map_err(|_| ReadError::Format(format!("entry index {} out of range", header.index)))?;
            let first_offset = index + 1 - i64::from(header.num_messages.max(1));
            if first_offset >= self.offsets.end {
                st.done = true;
                break;
            }
            let at = EntryPosition {
                ledger_id: i64::try_from(self.source.ledger_id).unwrap_or(i64::MAX),
                entry_id: i64::try_from(entry).unwrap_or(i64::MAX),
                first_offset,
            };
            columns
                .push_entry(at, &pulsar_entry, self.offsets.clone())
                .map_err(|e| ReadError::Format(format!("ledger {} entry {entry}: {e}", self.source.ledger_id)))?;
            if index + 1 >= self.offsets.end {
                st.done = true;
            }
        }
        if st.done {
            for (_, task) in st.inflight.drain(..) {
                task.abort();
            }
        }
        Ok(())
    }
}

impl Drop for PyLedgerRangeReader {
    /// A reader dropped before the end of its range (a query that stopped early) stops
    /// its reads ahead.
    fn drop(&mut self) {
        for (_, task) in self.state.get_mut().inflight.drain(..) {
            task.abort();
        }
    }
}

#[pymethods]
impl PyLedgerRangeReader {
    /// `metadata` is the ledger's metadata record (JSON, as the metadata store holds it).
    /// Entries past a closed ledger's last entry are refused here; for a ledger that is not
    /// closed the caller vouches that `last_entry` is confirmed.
    #[new]
    #[pyo3(signature = (ledger_id, metadata, first_entry, last_entry, from_offset, to_offset, timeout_ms=10_000))]
    fn new(
        ledger_id: u64,
        metadata: &[u8],
        first_entry: u64,
        last_entry: u64,
        from_offset: i64,
        to_offset: i64,
        timeout_ms: u64,
    ) -> PyResult<Self> {
        let path = magnetar_ledger::metadata::ledger_path(ledger_id);
        let metadata = LedgerMetadata::from_json(&path, metadata).map_err(|e| PyValueError::new_err(e.to_string()))?;
        if first_entry > last_entry {
            return Err(PyValueError::new_err(format!("first entry {first_entry} is after last entry {last_entry}")));
        }
        if metadata.state == LedgerState::Closed && i64::try_from(last_entry).map_or(true, |l| l > metadata.last_entry_id) {
            return Err(PyValueError::new_err(format!(
                "ledger {ledger_id} is closed at entry {}, before {last_entry}",
                metadata.last_entry_id
            )));
        }
        let source = Source {
            ledger_id,
            metadata,
            pool: BookiePool::new(Duration::from_millis(timeout_ms.max(1))),
            failed: Mutex::new(HashSet::new()),
        };
        Ok(PyLedgerRangeReader {
            source: Arc::new(source),
            offsets: from_offset..to_offset,
            state: Mutex::new(State { next_entry: first_entry, last_entry, inflight: VecDeque::new(), done: false, entries_read: 0 }),
            columns: Mutex::new(MessageColumns::new()),
        })
    }

    /// The next rows as a dict of column buffers (little-endian; see
    /// `magnetar_format::columns`), or `None` once the range is read. Raises `BookieError`
    /// when no bookie returns an entry and `NativeError` when an entry does not decode.
    #[pyo3(signature = (max_rows=65_536, max_bytes=67_108_864))]
    fn next_batch<'py>(&self, py: Python<'py>, max_rows: usize, max_bytes: usize) -> PyResult<Option<Bound<'py, PyDict>>> {
        let mut guard = self.columns.lock();
        let columns: &mut MessageColumns = &mut guard;
        columns.clear();
        loop {
            py.detach(|| self.decode_into(columns, max_rows.max(1), max_bytes.max(1)))?;
            if columns.rows() > 0 {
                return Ok(Some(columns_dict(py, columns)?));
            }
            if self.state.lock().done {
                return Ok(None);
            }
        }
    }

    /// Entries read from the bookies so far.
    #[getter]
    fn entries_read(&self) -> u64 {
        self.state.lock().entries_read
    }
}
