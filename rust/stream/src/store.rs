//! What a managed ledger needs of the ledger layer, and an in-memory implementation.
//!
//! A managed ledger writes to one ledger at a time and reads any of its ledgers. The
//! [`LedgerStore`] trait is that contract; `bookkeeper.rs` implements it over the
//! replicated ledger client, [`MemLedgerStore`] in memory (tests, tools), with fault
//! injection so that failover paths can be exercised.
//!
//! The contract, per method:
//! - `create_ledger` returns a new, empty, writable ledger.
//! - `open_ledger(id, recover = true)` fences the ledger against its old writer, settles
//!   its last entry and closes it; the handle is read-only. With `recover = false` the
//!   handle reads what is confirmed so far.
//! - `Ledger::add_entries` appends in order; entry ids are consecutive from 0; it either
//!   returns every id or fails. After a failure the handle stays broken and
//!   `last_add_confirmed` tells how far it got.
//! - `max_entry_size` bounds what one entry may hold; the managed ledger refuses a larger
//!   one before it reaches a ledger.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
pub use magnetar_ledger::entry::Payload;
use parking_lot::Mutex;

/// A boxed, sendable future; the trait methods below return these.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the ledger layer can fail with, as the managed ledger needs to tell it apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerStoreError {
    #[error("Not enough non-faulty bookies available")]
    NotEnoughBookies,
    #[error("ledger {0} is fenced")]
    Fenced(u64),
    #[error("no such ledger: {0}")]
    NoSuchLedger(u64),
    #[error("no entry {1} in ledger {0}")]
    NoSuchEntry(u64, u64),
    #[error("ledger {0} is closed")]
    Closed(u64),
    #[error("ledger layer error: {0}")]
    Other(String),
}

/// One ledger handle.
pub trait Ledger: Send + Sync + 'static {
    /// The ledger id.
    fn id(&self) -> u64;
    /// Append `entries` in order; returns their entry ids, or fails as a whole. The ledger
    /// takes the entry ids when the returned future is first polled, so calls polled one
    /// after another are pipelined: written in that order, and a call is confirmed only
    /// once every earlier one is (a failure fails every later call too).
    /// Each entry's data is its payload's two pieces, back to back.
    fn add_entries(&self, entries: Vec<Payload>) -> BoxFuture<'_, Result<Vec<u64>, LedgerStoreError>>;
    /// Read the entries `first..=last` (all must be confirmed).
    fn read_entries(&self, first: u64, last: u64) -> BoxFuture<'_, Result<Vec<(u64, Bytes)>, LedgerStoreError>>;
    /// The highest confirmed entry id, `-1` when none.
    fn last_add_confirmed(&self) -> i64;
    /// Total payload bytes of the confirmed entries.
    fn length(&self) -> u64;
    /// Seal the ledger at its last confirmed entry.
    fn close(&self) -> BoxFuture<'_, Result<(), LedgerStoreError>>;
}

/// A source of ledgers.
pub trait LedgerStore: Send + Sync + 'static {
    /// Create an empty, writable ledger on `ensemble` bookies, written to `write_quorum`,
    /// acknowledged by `ack_quorum`; `custom` is stored in the ledger's metadata.
    fn create_ledger(
        &self,
        ensemble: usize,
        write_quorum: usize,
        ack_quorum: usize,
        custom: BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<Arc<dyn Ledger>, LedgerStoreError>>;
    /// Open an existing ledger read-only; with `recover` fence and close it first.
    fn open_ledger(&self, id: u64, recover: bool) -> BoxFuture<'_, Result<Arc<dyn Ledger>, LedgerStoreError>>;
    /// Delete a ledger and its data.
    fn delete_ledger(&self, id: u64) -> BoxFuture<'_, Result<(), LedgerStoreError>>;
    /// The most bytes one entry may hold (for bookies, what fits one frame under
    /// nettyMaxFrameSizeBytes). Default: no limit.
    fn max_entry_size(&self) -> usize {
        usize::MAX
    }
}

#[derive(Default)]
struct MemLedgerData {
    entries: Vec<Bytes>,
    closed: bool,
    fenced: bool,
    custom: BTreeMap<String, String>,
}

#[derive(Default)]
struct MemInner {
    ledgers: HashMap<u64, MemLedgerData>,
    next_id: u64,
    fail_adds: usize,
    fail_creates: usize,
    fail_reads: usize,
    read_calls: u64,
    /// `max_entry_size`; an add of a larger entry fails, leaving its handle as it was.
    max_entry: Option<usize>,
}

/// Ledgers kept in memory. Cloning shares the same ledgers.
///
/// Fault injection: [`MemLedgerStore::fail_next_adds`] makes the next add calls fail with
/// `NotEnoughBookies` (breaking their handles), [`MemLedgerStore::fail_next_creates`] and
/// [`MemLedgerStore::fail_next_reads`] fail creates and reads, [`MemLedgerStore::fence`]
/// fences a ledger as a recovering reader would.
#[derive(Clone, Default)]
pub struct MemLedgerStore {
    inner: Arc<Mutex<MemInner>>,
}

impl MemLedgerStore {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ids of the ledgers that exist, sorted.
    pub fn ledger_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.inner.lock().ledgers.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Number of entries stored in ledger `id` (confirmed or not), if it exists.
    pub fn entry_count(&self, id: u64) -> Option<usize> {
        self.inner.lock().ledgers.get(&id).map(|l| l.entries.len())
    }

    /// Custom metadata the ledger was created with.
    pub fn custom_metadata(&self, id: u64) -> Option<BTreeMap<String, String>> {
        self.inner.lock().ledgers.get(&id).map(|l| l.custom.clone())
    }

    /// Make the next `n` calls to `add_entries` (on any ledger) fail with `NotEnoughBookies`.
    pub fn fail_next_adds(&self, n: usize) {
        self.inner.lock().fail_adds = n;
    }

    /// Make the next `n` calls to `create_ledger` fail with `NotEnoughBookies`.
    pub fn fail_next_creates(&self, n: usize) {
        self.inner.lock().fail_creates = n;
    }

    /// How many `read_entries` calls were made (on any ledger) so far.
    pub fn read_calls(&self) -> u64 {
        self.inner.lock().read_calls
    }

    /// Make the next `n` calls to `read_entries` (on any ledger) fail.
    pub fn fail_next_reads(&self, n: usize) {
        self.inner.lock().fail_reads = n;
    }

    /// Hold at most `bytes` per entry, as bookies with a frame limit do: an add of a larger
    /// entry fails (the handle goes on).
    pub fn set_max_entry_size(&self, bytes: usize) {
        self.inner.lock().max_entry = Some(bytes);
    }

    /// Fence ledger `id`: its writer's later adds fail with `Fenced`.
    pub fn fence(&self, id: u64) {
        if let Some(l) = self.inner.lock().ledgers.get_mut(&id) {
            l.fenced = true;
        }
    }
}

struct MemLedger {
    store: Arc<Mutex<MemInner>>,
    id: u64,
    writable: bool,
    state: Mutex<HandleState>,
}

struct HandleState {
    lac: i64,
    broken: Option<LedgerStoreError>,
}

impl Ledger for MemLedger {
    fn id(&self) -> u64 {
        self.id
    }

    fn add_entries(&self, entries: Vec<Payload>) -> BoxFuture<'_, Result<Vec<u64>, LedgerStoreError>> {
        Box::pin(async move {
            if !self.writable {
                return Err(LedgerStoreError::Closed(self.id));
            }
            let mut st = self.state.lock();
            if let Some(e) = &st.broken {
                return Err(e.clone());
            }
            let mut inner = self.store.lock();
            if inner.fail_adds > 0 {
                inner.fail_adds -= 1;
                st.broken = Some(LedgerStoreError::NotEnoughBookies);
                return Err(LedgerStoreError::NotEnoughBookies);
            }
            let max = inner.max_entry.unwrap_or(usize::MAX);
            if let Some(big) = entries.iter().find(|e| e.len() > max) {
                return Err(LedgerStoreError::Other(format!("entry of {} bytes is over {max}", big.len())));
            }
            let data = inner.ledgers.get_mut(&self.id).ok_or(LedgerStoreError::NoSuchLedger(self.id))?;
            if data.fenced {
                st.broken = Some(LedgerStoreError::Fenced(self.id));
                return Err(LedgerStoreError::Fenced(self.id));
            }
            if data.closed {
                return Err(LedgerStoreError::Closed(self.id));
            }
            let mut ids = Vec::with_capacity(entries.len());
            for e in entries {
                ids.push(data.entries.len() as u64);
                data.entries.push(if e.head.is_empty() { e.body } else { [e.head, e.body].concat().into() });
            }
            st.lac = data.entries.len() as i64 - 1;
            Ok(ids)
        })
    }

    fn read_entries(&self, first: u64, last: u64) -> BoxFuture<'_, Result<Vec<(u64, Bytes)>, LedgerStoreError>> {
        Box::pin(async move {
            let lac = self.state.lock().lac;
            let mut inner = self.store.lock();
            inner.read_calls += 1;
            if inner.fail_reads > 0 {
                inner.fail_reads -= 1;
                return Err(LedgerStoreError::Other("injected read failure".into()));
            }
            let data = inner.ledgers.get(&self.id).ok_or(LedgerStoreError::NoSuchLedger(self.id))?;
            let mut out = Vec::new();
            for id in first..=last {
                let e = i64::try_from(id)
                    .ok()
                    .filter(|i| *i <= lac)
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| data.entries.get(i))
                    .ok_or(LedgerStoreError::NoSuchEntry(self.id, id))?;
                out.push((id, e.clone()));
            }
            Ok(out)
        })
    }

    fn last_add_confirmed(&self) -> i64 {
        self.state.lock().lac
    }

    fn length(&self) -> u64 {
        let lac = self.state.lock().lac;
        let inner = self.store.lock();
        inner.ledgers.get(&self.id).map_or(0, |d| {
            d.entries.iter().take(usize::try_from(lac + 1).unwrap_or(0)).map(|e| e.len() as u64).sum()
        })
    }

    fn close(&self) -> BoxFuture<'_, Result<(), LedgerStoreError>> {
        Box::pin(async move {
            if !self.writable {
                return Ok(());
            }
            let lac = self.state.lock().lac;
            let mut inner = self.store.lock();
            let data = inner.ledgers.get_mut(&self.id).ok_or(LedgerStoreError::NoSuchLedger(self.id))?;
            if data.fenced {
                return Err(LedgerStoreError::Fenced(self.id));
            }
            data.entries.truncate(usize::try_from(lac + 1).unwrap_or(0));
            data.closed = true;
            Ok(())
        })
    }
}

impl LedgerStore for MemLedgerStore {
    fn max_entry_size(&self) -> usize {
        self.inner.lock().max_entry.unwrap_or(usize::MAX)
    }

    fn create_ledger(
        &self,
        ensemble: usize,
        write_quorum: usize,
        ack_quorum: usize,
        custom: BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<Arc<dyn Ledger>, LedgerStoreError>> {
        Box::pin(async move {
            if !(ack_quorum <= write_quorum && write_quorum <= ensemble && ack_quorum > 0) {
                return Err(LedgerStoreError::Other(format!(
                    "invalid quorum: ensemble {ensemble}, write {write_quorum}, ack {ack_quorum}"
                )));
            }
            let mut inner = self.inner.lock();
            if inner.fail_creates > 0 {
                inner.fail_creates -= 1;
                return Err(LedgerStoreError::NotEnoughBookies);
            }
            let id = inner.next_id;
            inner.next_id += 1;
            inner.ledgers.insert(id, MemLedgerData { custom, ..Default::default() });
            let handle = MemLedger {
                store: self.inner.clone(),
                id,
                writable: true,
                state: Mutex::new(HandleState { lac: -1, broken: None }),
            };
            Ok(Arc::new(handle) as Arc<dyn Ledger>)
        })
    }

    fn open_ledger(&self, id: u64, recover: bool) -> BoxFuture<'_, Result<Arc<dyn Ledger>, LedgerStoreError>> {
        Box::pin(async move {
            let mut inner = self.inner.lock();
            let data = inner.ledgers.get_mut(&id).ok_or(LedgerStoreError::NoSuchLedger(id))?;
            if recover && !data.closed {
                data.fenced = true;
                data.closed = true;
            }
            let lac = data.entries.len() as i64 - 1;
            let handle = MemLedger {
                store: self.inner.clone(),
                id,
                writable: false,
                state: Mutex::new(HandleState { lac, broken: None }),
            };
            Ok(Arc::new(handle) as Arc<dyn Ledger>)
        })
    }

    fn delete_ledger(&self, id: u64) -> BoxFuture<'_, Result<(), LedgerStoreError>> {
        Box::pin(async move {
            self.inner.lock().ledgers.remove(&id).map(|_| ()).ok_or(LedgerStoreError::NoSuchLedger(id))
        })
    }
}
