//! Managed ledgers and cursors for Python: every slow or blocking operation is spawned on
//! the native runtime and reports through a `CompletionQueue`; quick state reads are plain
//! methods.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::FrameLimit;
use magnetar_ledger::{BookKeeper, ClientConfig, Replacement};
use magnetar_stream::{
    AddResult, BookKeeperStore, CacheBudget, Cursor, Entry, InitialPosition, LedgerStoreError, ManagedLedger,
    ManagedLedgerConfig, ManagedLedgerFactory, Position, StreamError,
};
use pyo3::exceptions::PyValueError;
use pyo3::pybacked::PyBackedBytes;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::completions::{CompletionQueue, Completer, Outcome};
use crate::errors::{
    CursorNotFoundError, FencedError, LedgerClosedError, MetadataError, NativeError, NoSuchLedgerError,
    NotEnoughBookiesError,
};
use crate::meta::PyMetadataStore;
use crate::runtime::runtime;

fn stream_err(e: StreamError) -> PyErr {
    match &e {
        StreamError::Closed(_) => LedgerClosedError::new_err(e.to_string()),
        StreamError::Fenced(_) => FencedError::new_err(e.to_string()),
        StreamError::Metadata(_) => MetadataError::new_err(e.to_string()),
        StreamError::NoSuchCursor(_) => CursorNotFoundError::new_err(e.to_string()),
        StreamError::Ledger(LedgerStoreError::NoSuchLedger(_)) => NoSuchLedgerError::new_err(e.to_string()),
        StreamError::Ledger(LedgerStoreError::NotEnoughBookies) => NotEnoughBookiesError::new_err(e.to_string()),
        StreamError::InvalidPosition(_) | StreamError::InvalidArgument(_) => PyValueError::new_err(e.to_string()),
        _ => NativeError::new_err(e.to_string()),
    }
}

/// Run `fut` on the runtime; convert its output under the GIL when trio drains the queue.
fn spawn<T, F, C>(queue: &CompletionQueue, token: u64, fut: F, convert: C)
where
    T: Send + 'static,
    F: Future<Output = Result<T, StreamError>> + Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let completer = queue.completer();
    runtime().spawn(async move {
        completer.complete(token, outcome(fut.await, convert));
    });
}

/// A native result, to be converted under the GIL when trio drains the queue.
fn outcome<T, C>(result: Result<T, StreamError>, convert: C) -> Outcome
where
    T: Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    Box::new(move |py| match result {
        Ok(v) => convert(py, v),
        Err(e) => Err(stream_err(e)),
    })
}

fn added_list(py: Python<'_>, results: Vec<AddResult>) -> PyResult<Py<PyAny>> {
    let list = PyList::empty(py);
    for r in results {
        list.append((r.position.ledger_id, r.position.entry_id, r.index, r.publish_time_ms))?;
    }
    Ok(list.into_any().unbind())
}

fn none(py: Python<'_>, _: ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

fn pos_tuple(py: Python<'_>, p: Position) -> PyResult<Py<PyAny>> {
    Ok((p.ledger_id, p.entry_id).into_pyobject(py)?.into_any().unbind())
}

fn entries_list(py: Python<'_>, entries: Vec<Entry>) -> PyResult<Py<PyAny>> {
    let list = PyList::empty(py);
    for e in entries {
        let data = PyBytes::new(py, &e.data);
        list.append((e.position.ledger_id, e.position.entry_id, e.publish_time_ms, e.index, e.num_messages, data))?;
    }
    Ok(list.into_any().unbind())
}

fn get<'py, T>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<T>>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    match d.get_item(key)? {
        Some(v) if !v.is_none() => match v.extract::<T>() {
            Ok(t) => Ok(Some(t)),
            Err(_) => Err(PyValueError::new_err(format!("managed ledger config {key}: bad value {v}"))),
        },
        _ => Ok(None),
    }
}

fn ml_config(d: &Bound<'_, PyDict>) -> PyResult<ManagedLedgerConfig> {
    let mut c = ManagedLedgerConfig::default();
    if let Some(v) = get::<usize>(d, "ensemble_size")? { c.ensemble_size = v; }
    if let Some(v) = get::<usize>(d, "write_quorum")? { c.write_quorum = v; }
    if let Some(v) = get::<usize>(d, "ack_quorum")? { c.ack_quorum = v; }
    if let Some(v) = get::<u64>(d, "max_entries_per_ledger")? { c.max_entries_per_ledger = v; }
    if let Some(v) = get::<u64>(d, "min_rollover_time_ms")? { c.min_rollover_time = Duration::from_millis(v); }
    if let Some(v) = get::<i64>(d, "max_rollover_time_ms")? {
        c.max_rollover_time = u64::try_from(v).ok().filter(|ms| *ms > 0).map(Duration::from_millis);
    }
    if let Some(v) = get::<i64>(d, "inactive_rollover_time_ms")? {
        c.inactive_rollover_time = u64::try_from(v).ok().filter(|ms| *ms > 0).map(Duration::from_millis);
    }
    if let Some(v) = get::<u64>(d, "max_ledger_size_mb")? { c.max_ledger_size_mb = v; }
    if let Some(v) = get::<i64>(d, "retention_time_ms")? {
        c.retention_time = u64::try_from(v).ok().map(Duration::from_millis);
    }
    if let Some(v) = get::<i64>(d, "retention_size_mb")? { c.retention_size_mb = v; }
    if let Some(v) = get::<f64>(d, "mark_delete_rate_per_sec")? { c.mark_delete_rate_per_sec = v; }
    if let Some(v) = get::<usize>(d, "cache_size_bytes")? { c.cache_size_bytes = v; }
    if let Some(v) = get::<u64>(d, "cache_eviction_time_ms")? { c.cache_eviction_time = Duration::from_millis(v); }
    if let Some(v) = get::<BTreeMap<String, String>>(d, "ledger_metadata")? { c.ledger_metadata = v; }
    Ok(c)
}

/// The entries as `Bytes`. A Python `bytes` object is shared, not copied: the `Bytes` holds
/// a reference to it, so an entry's payload is copied once on its way to the bookies, into
/// its ledger frame. Anything else holding bytes is copied.
fn share_batch(entries: &[Bound<'_, PyAny>]) -> PyResult<Vec<Bytes>> {
    entries
        .iter()
        .map(|e| match e.extract::<PyBackedBytes>() {
            Ok(b) => Ok(Bytes::from_owner(b)),
            Err(_) => Ok(Bytes::from(e.extract::<Vec<u8>>()?)),
        })
        .collect()
}

#[pyclass(module = "core._native", name = "ManagedLedgerFactory")]
pub struct PyFactory {
    factory: Arc<ManagedLedgerFactory>,
    /// The factory's ledger store, for re-replication.
    store: Arc<BookKeeperStore>,
}

#[pymethods]
impl PyFactory {
    #[new]
    /// With `local_bookies`, bookies running in this process (a standalone's) are called
    /// directly rather than over TCP. `cache_size_mb` is what the entry caches of all the
    /// managed ledgers opened here may hold together; once over it, they are evicted down to
    /// `cache_eviction_watermark` of it. No request goes to a bookie in a frame longer than
    /// `max_frame_size` (nettyMaxFrameSizeBytes).
    #[pyo3(signature = (metadata_store, request_timeout_ms=30000, local_bookies=true, cache_size_mb=256,
                        cache_eviction_watermark=0.9, max_frame_size=magnetar_bookie::proto::MAX_FRAME_SIZE))]
    fn new(
        metadata_store: Py<PyAny>,
        request_timeout_ms: u64,
        local_bookies: bool,
        cache_size_mb: u64,
        cache_eviction_watermark: f64,
        max_frame_size: usize,
    ) -> PyResult<Self> {
        if !(0.0..=1.0).contains(&cache_eviction_watermark) {
            return Err(PyValueError::new_err("cache_eviction_watermark must be between 0 and 1"));
        }
        let max_frame_size = FrameLimit::new(max_frame_size).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let meta: Arc<dyn magnetar_meta::MetadataStore> = Arc::new(PyMetadataStore::new(metadata_store));
        let _guard = runtime().enter();
        let config = ClientConfig {
            request_timeout: Duration::from_millis(request_timeout_ms),
            local_bookies,
            max_frame_size,
            ..ClientConfig::default()
        };
        let bk = BookKeeper::new(meta.clone(), config);
        let store = Arc::new(BookKeeperStore::new(bk));
        let cache_bytes = usize::try_from(cache_size_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let budget = CacheBudget::with_watermark(cache_bytes, cache_eviction_watermark);
        Ok(Self { factory: Arc::new(ManagedLedgerFactory::with_cache(meta, store.clone(), budget)), store })
    }

    /// Bytes the entry caches hold now, over every managed ledger.
    #[getter]
    fn cache_used_bytes(&self) -> usize {
        self.factory.cache_budget().map_or(0, |b| b.used())
    }

    /// Completes with a `ManagedLedger`.
    fn open(&self, queue: &CompletionQueue, token: u64, name: String, config: &Bound<'_, PyDict>) -> PyResult<()> {
        let explicit = config.contains("cache_size_bytes")?;
        let mut config = ml_config(config)?;
        if !explicit {
            // Bounded by the factory's budget alone, as every topic is in Pulsar.
            config.cache_size_bytes = usize::MAX;
        }
        let factory = self.factory.clone();
        spawn(queue, token, async move { factory.open(&name, config).await }, |py, ml| {
            Ok(Py::new(py, PyManagedLedger { ml })?.into_any())
        });
        Ok(())
    }

    /// Give lost bookie `lost`'s place in closed ledger `ledger_id` to other bookies, after
    /// copying what it held there, `batch` entries at a time. Completes with `(status,
    /// new bookies, entries copied)`, status being `replaced`, `not-closed` or
    /// `not-in-ledger`.
    fn replace_bookie(&self, queue: &CompletionQueue, token: u64, ledger_id: u64, lost: String, batch: usize) {
        let store = self.store.clone();
        spawn(
            queue,
            token,
            async move { store.replace_bookie(ledger_id, &lost, batch).await.map_err(StreamError::Ledger) },
            |py, done| {
                let (status, bookies, entries) = match done {
                    Replacement::Replaced { bookies, entries } => ("replaced", bookies, entries),
                    Replacement::NotClosed => ("not-closed", Vec::new(), 0),
                    Replacement::NotInLedger => ("not-in-ledger", Vec::new(), 0),
                };
                Ok((status, bookies, entries).into_pyobject(py)?.into_any().unbind())
            },
        );
    }

    /// Close every managed ledger still open (their cursors are persisted first).
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let factory = self.factory.clone();
        py.detach(|| runtime().block_on(factory.shutdown())).map_err(stream_err)
    }
}

#[pyclass(module = "core._native", name = "ManagedLedger")]
pub struct PyManagedLedger {
    ml: Arc<ManagedLedger>,
}

#[pymethods]
impl PyManagedLedger {
    #[getter]
    fn name(&self) -> String {
        self.ml.name().to_string()
    }

    /// The largest entry `add_entries` takes: what one bookie frame of the factory's
    /// `max_frame_size` holds, less the headers stored with it.
    #[getter]
    fn max_entry_size(&self) -> usize {
        self.ml.max_entry_size()
    }

    /// Entries are copied once, into one buffer for the whole batch, which the stored
    /// entries then share.
    fn add_entries(
        &self,
        queue: &CompletionQueue,
        token: u64,
        entries: Vec<Bound<'_, PyAny>>,
        num_messages: Vec<u32>,
    ) -> PyResult<()> {
        if entries.len() != num_messages.len() {
            return Err(PyValueError::new_err("entries and num_messages differ in length"));
        }
        let batch = share_batch(&entries)?.into_iter().zip(num_messages).collect();
        // No task of its own: the managed ledger's writer answers the completion queue
        // directly when the round is confirmed.
        let completer = queue.completer();
        let _rt = runtime().enter();
        self.ml.start_add_entries(batch, Box::new(move |result| {
            completer.complete(token, outcome(result, added_list));
        }));
        Ok(())
    }

    fn read_entries(&self, queue: &CompletionQueue, token: u64, ledger_id: u64, entry_id: i64, max_entries: usize) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.read_entries(Position::new(ledger_id, entry_id), max_entries).await }, entries_list);
    }

    fn wait_entries_after(&self, queue: &CompletionQueue, token: u64, ledger_id: u64, entry_id: i64) {
        let ml = self.ml.clone();
        let after = Position::new(ledger_id, entry_id);
        spawn(queue, token, async move {
            let mut rx = ml.new_entries();
            loop {
                if ml.last_confirmed().is_some_and(|p| p > after) {
                    return Ok(());
                }
                if rx.changed().await.is_err() {
                    return Err(StreamError::Closed(ml.name().to_string()));
                }
            }
        }, none);
    }

    fn open_cursor(&self, queue: &CompletionQueue, token: u64, name: String, earliest: bool) {
        let ml = self.ml.clone();
        let initial = if earliest { InitialPosition::Earliest } else { InitialPosition::Latest };
        spawn(queue, token, async move { ml.open_cursor(&name, initial).await }, |py, cursor| {
            Ok(Py::new(py, PyCursor::new(cursor))?.into_any())
        });
    }

    fn new_non_durable_cursor(&self, ledger_id: u64, entry_id: i64) -> PyResult<PyCursor> {
        let cursor = self.ml.new_non_durable_cursor(Position::new(ledger_id, entry_id)).map_err(stream_err)?;
        Ok(PyCursor::new(cursor))
    }

    fn delete_cursor(&self, queue: &CompletionQueue, token: u64, name: String) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.delete_cursor(&name).await }, none);
    }

    fn cursor_names(&self) -> Vec<String> {
        self.ml.cursors().iter().filter(|c| c.is_durable()).map(|c| c.name().to_string()).collect()
    }

    fn last_confirmed(&self) -> Option<(u64, i64)> {
        self.ml.last_confirmed().map(|p| (p.ledger_id, p.entry_id))
    }

    fn next_index(&self) -> u64 {
        self.ml.next_index()
    }

    fn first_position(&self) -> Option<(u64, i64)> {
        self.ml.first_position().map(|p| (p.ledger_id, p.entry_id))
    }

    fn find_by_index(&self, queue: &CompletionQueue, token: u64, index: u64) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.find_position_by_index(index).await }, pos_tuple);
    }

    fn find_by_publish_time(&self, queue: &CompletionQueue, token: u64, publish_time_ms: u64) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.find_position_by_publish_time(publish_time_ms).await }, pos_tuple);
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.ml.stats();
        let d = PyDict::new(py);
        d.set_item("name", s.name)?;
        d.set_item("status", format!("{:?}", s.status))?;
        d.set_item("number_of_entries", s.number_of_entries)?;
        d.set_item("total_size", s.total_size)?;
        d.set_item("ledger_count", s.ledger_count)?;
        d.set_item("current_ledger_id", s.current_ledger_id)?;
        d.set_item("current_ledger_entries", s.current_ledger_entries)?;
        d.set_item("current_ledger_size", s.current_ledger_size)?;
        d.set_item("current_ledger_created_ms", s.current_ledger_created_ms)?;
        d.set_item("last_confirmed", s.last_confirmed.map(|p| (p.ledger_id, p.entry_id)))?;
        d.set_item("first_position", s.first_position.map(|p| (p.ledger_id, p.entry_id)))?;
        d.set_item("next_index", s.next_index)?;
        d.set_item("entries_added", s.entries_added)?;
        d.set_item("durable_cursors", s.durable_cursors)?;
        Ok(d)
    }

    fn ledgers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for l in self.ml.ledgers_info() {
            let d = PyDict::new(py);
            d.set_item("ledgerId", l.ledger_id)?;
            d.set_item("entries", l.entries)?;
            d.set_item("size", l.size)?;
            d.set_item("timestamp", l.timestamp)?;
            d.set_item("firstIndex", l.first_index)?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn check_rollover(&self, queue: &CompletionQueue, token: u64) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.check_rollover().await }, |py, rolled| {
            Ok(pyo3::types::PyBool::new(py, rolled).to_owned().into_any().unbind())
        });
    }

    fn trim(&self, queue: &CompletionQueue, token: u64) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.trim().await.map(|_| ()) }, none);
    }

    fn raise_trim_floor(&self, floor: u64) {
        self.ml.raise_trim_floor(floor);
    }

    fn close(&self, queue: &CompletionQueue, token: u64) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.close().await }, none);
    }

    fn delete(&self, queue: &CompletionQueue, token: u64) {
        let ml = self.ml.clone();
        spawn(queue, token, async move { ml.delete().await }, none);
    }
}

fn complete_unit(completer: &Completer, token: u64, result: Result<(), StreamError>) {
    completer.complete(token, outcome(result, none));
}

enum Ack {
    Cumulative(Position),
    Individual(Vec<Position>),
    /// Batch-index acknowledgements: each entry's ack set.
    BatchIndex(Vec<(Position, Vec<i64>)>),
    /// Persist now, after every acknowledgement queued before it; then complete `token`.
    Flush(Completer, u64),
    /// Move mark-delete and read position before `Position`, after the queued acks.
    Reset(Position, Completer, u64),
}

#[pyclass(module = "core._native", name = "Cursor")]
pub struct PyCursor {
    cursor: Arc<Cursor>,
    /// Acknowledgements are applied in the order Python made them, by one task per cursor.
    acks: tokio::sync::mpsc::UnboundedSender<Ack>,
}

impl PyCursor {
    fn new(cursor: Arc<Cursor>) -> Self {
        let (acks, mut rx) = tokio::sync::mpsc::unbounded_channel::<Ack>();
        let c = cursor.clone();
        runtime().spawn(async move {
            while let Some(ack) = rx.recv().await {
                let (what, result) = match ack {
                    Ack::Cumulative(p) => ("mark-delete", c.mark_delete(p).await),
                    Ack::Individual(ps) => ("delete", c.delete(&ps).await),
                    Ack::BatchIndex(acks) => ("batch-index ack", c.set_batch_acks(&acks).await),
                    Ack::Flush(completer, token) => {
                        complete_unit(&completer, token, c.flush().await);
                        continue;
                    }
                    Ack::Reset(p, completer, token) => {
                        complete_unit(&completer, token, c.reset_cursor(p).await);
                        continue;
                    }
                };
                if let Err(e) = result {
                    eprintln!("magnetar: cursor {}: {what} failed: {e}", c.name());
                }
            }
        });
        Self { cursor, acks }
    }
}

fn pos(p: Position) -> (u64, i64) {
    (p.ledger_id, p.entry_id)
}

#[pymethods]
impl PyCursor {
    #[getter]
    fn name(&self) -> String {
        self.cursor.name().to_string()
    }

    /// The entries `read_entries` would complete with, now, when the entry cache holds
    /// them; None when a read has to go to the bookies.
    fn read_cached(&self, py: Python<'_>, max_entries: usize) -> PyResult<Option<Py<PyAny>>> {
        match self.cursor.read_cached(max_entries) {
            Some(entries) => entries_list(py, entries).map(Some),
            None => Ok(None),
        }
    }

    fn read_entries(&self, queue: &CompletionQueue, token: u64, max_entries: usize) {
        let c = self.cursor.clone();
        spawn(queue, token, async move { c.read_entries(max_entries).await }, entries_list);
    }

    /// Cumulative acknowledgement; persisted by the cursor at its rate limit.
    fn mark_delete(&self, ledger_id: u64, entry_id: i64) {
        let _ = self.acks.send(Ack::Cumulative(Position::new(ledger_id, entry_id)));
    }

    /// Individual acknowledgements.
    fn delete(&self, positions: Vec<(u64, i64)>) {
        let positions: Vec<Position> = positions.into_iter().map(|(l, e)| Position::new(l, e)).collect();
        let _ = self.acks.send(Ack::Individual(positions));
    }

    /// Batch-index acknowledgements, `(ledger_id, entry_id, ack_set)` each, the ack set's
    /// set bits being the messages still unacknowledged; persisted with the cursor.
    fn set_batch_acks(&self, acks: Vec<(u64, i64, Vec<i64>)>) {
        let acks = acks.into_iter().map(|(l, e, a)| (Position::new(l, e), a)).collect();
        let _ = self.acks.send(Ack::BatchIndex(acks));
    }

    /// The batch-index acknowledgements the cursor holds, in position order.
    fn batch_acks(&self) -> Vec<(u64, i64, Vec<i64>)> {
        self.cursor.batch_acks().into_iter().map(|(p, a)| (p.ledger_id, p.entry_id, a)).collect()
    }

    fn rewind(&self) {
        self.cursor.rewind();
    }

    fn seek(&self, ledger_id: u64, entry_id: i64) {
        self.cursor.seek(Position::new(ledger_id, entry_id));
    }

    fn reset(&self, queue: &CompletionQueue, token: u64, ledger_id: u64, entry_id: i64) {
        let _ = self.acks.send(Ack::Reset(Position::new(ledger_id, entry_id), queue.completer(), token));
    }

    fn mark_delete_position(&self) -> (u64, i64) {
        pos(self.cursor.mark_delete_position())
    }

    fn read_position(&self) -> (u64, i64) {
        pos(self.cursor.read_position())
    }

    fn individually_deleted(&self) -> Vec<((u64, i64), (u64, i64))> {
        self.cursor.individually_deleted_ranges().into_iter().map(|(a, b)| (pos(a), pos(b))).collect()
    }

    fn backlog(&self) -> u64 {
        self.cursor.number_of_entries_in_backlog()
    }

    fn has_more(&self) -> bool {
        self.cursor.has_more_entries()
    }

    fn flush(&self, queue: &CompletionQueue, token: u64) {
        let _ = self.acks.send(Ack::Flush(queue.completer(), token));
    }

    /// The cursor's properties (a subscription's properties), persisted with it.
    fn properties(&self) -> std::collections::BTreeMap<String, String> {
        self.cursor.properties()
    }

    /// Replace the cursor's properties; completes once they are persisted.
    fn set_properties(&self, queue: &CompletionQueue, token: u64, properties: std::collections::BTreeMap<String, String>) {
        let c = self.cursor.clone();
        spawn(queue, token, async move { c.set_properties(properties).await }, none);
    }
}
