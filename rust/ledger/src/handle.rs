//! [`LedgerHandle`]: one open ledger — the read path here, the write path in `writer.rs`.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};

use crate::client::BkInner;
use crate::entry;
use crate::error::{LedgerError, Result};
use crate::metadata::{LedgerMetadata, LedgerState};
use crate::quorum::write_set;
use crate::transport::{BookieError, BookieTransport, ReadEntry};

/// An add waiting for its ack quorum.
pub(crate) struct PendingAdd {
    pub(crate) entry: u64,
    pub(crate) framed: Bytes,
    /// Ledger length once this entry is confirmed.
    pub(crate) length: u64,
    /// Ensemble slots that acknowledged the entry.
    pub(crate) acked: AckedSlots,
    pub(crate) done: Option<oneshot::Sender<Result<u64>>>,
}

/// The ensemble slots that acknowledged an entry: a bit per slot below 64 (any ensemble a
/// cluster really has), a list only past that, so that recording an ack allocates nothing.
/// Every pending add has one, and its first ack used to allocate a vector.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub(crate) struct AckedSlots {
    bits: u64,
    more: Vec<usize>,
}

impl AckedSlots {
    pub(crate) fn insert(&mut self, slot: usize) {
        if slot < 64 {
            self.bits |= 1 << slot;
        } else if !self.more.contains(&slot) {
            self.more.push(slot);
        }
    }

    pub(crate) fn remove(&mut self, slot: usize) {
        if slot < 64 {
            self.bits &= !(1 << slot);
        } else {
            self.more.retain(|s| *s != slot);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bits.count_ones() as usize + self.more.len()
    }
}

/// Everything about a handle that changes, under one lock.
pub(crate) struct State {
    pub(crate) meta: LedgerMetadata,
    pub(crate) version: i64,
    pub(crate) lac: i64,
    /// Ledger length up to `lac`, when known.
    pub(crate) length: u64,
    pub(crate) writable: bool,
    pub(crate) next_entry: u64,
    /// Ledger length including every entry handed to bookies.
    pub(crate) pushed_length: u64,
    pub(crate) pending: VecDeque<PendingAdd>,
    /// Bumped whenever a slot's bookie fails or is replaced; answers sent under an older
    /// epoch are ignored.
    pub(crate) slot_epoch: Vec<u64>,
    /// Slots whose bookie failed and has not been replaced.
    pub(crate) failed_slots: BTreeSet<usize>,
    /// Bookies that failed this handle; never picked again as replacements.
    pub(crate) excluded: HashSet<String>,
    pub(crate) changing: bool,
    pub(crate) broken: Option<LedgerError>,
    pub(crate) closing: bool,
    pub(crate) closed: bool,
}

pub(crate) struct HandleInner {
    pub(crate) id: u64,
    pub(crate) bk: Arc<BkInner>,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) state: Mutex<State>,
    /// Signalled when the pending queue drains or an ensemble change ends.
    pub(crate) idle: Notify,
}

/// An open ledger. Cheap to clone; clones share the same handle.
///
/// A handle from [`crate::BookKeeper::create_ledger`] is the ledger's one writer; handles
/// from [`crate::BookKeeper::open_ledger`] are read-only.
#[derive(Clone)]
pub struct LedgerHandle {
    pub(crate) inner: Arc<HandleInner>,
}

impl LedgerHandle {
    fn build(
        bk: Arc<BkInner>,
        runtime: tokio::runtime::Handle,
        id: u64,
        meta: LedgerMetadata,
        version: i64,
        reader_lac: Option<i64>,
    ) -> Self {
        let slots = meta.ensemble_size;
        let closed = meta.state == LedgerState::Closed;
        let writable = reader_lac.is_none();
        let (lac, length) = match reader_lac {
            None => (-1, 0),
            Some(lac) => (lac, meta.length),
        };
        let next_entry = u64::try_from(lac + 1).unwrap_or(0);
        LedgerHandle {
            inner: Arc::new(HandleInner {
                id,
                bk,
                runtime,
                state: Mutex::new(State {
                    meta,
                    version,
                    lac,
                    length,
                    writable,
                    next_entry,
                    pushed_length: length,
                    pending: VecDeque::new(),
                    slot_epoch: vec![0; slots],
                    failed_slots: BTreeSet::new(),
                    excluded: HashSet::new(),
                    changing: false,
                    broken: None,
                    closing: false,
                    closed,
                }),
                idle: Notify::new(),
            }),
        }
    }

    /// The writing handle of a ledger just created.
    pub(crate) fn writer(
        bk: Arc<BkInner>,
        runtime: tokio::runtime::Handle,
        id: u64,
        meta: LedgerMetadata,
        version: i64,
    ) -> Self {
        Self::build(bk, runtime, id, meta, version, None)
    }

    /// A read-only handle; `lac` overrides the closed ledger's last entry id.
    pub(crate) fn reader(
        bk: Arc<BkInner>,
        runtime: tokio::runtime::Handle,
        id: u64,
        meta: LedgerMetadata,
        version: i64,
        lac: Option<i64>,
    ) -> Self {
        let lac = lac.unwrap_or(meta.last_entry_id);
        Self::build(bk, runtime, id, meta, version, Some(lac))
    }

    /// The ledger id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The last entry id known to be confirmed (-1 when none).
    pub fn last_add_confirmed(&self) -> i64 {
        self.inner.state.lock().lac
    }

    /// Payload bytes up to the last add confirmed (for read-only handles of open ledgers,
    /// the length recorded in metadata, i.e. 0 until the ledger is closed).
    pub fn length(&self) -> u64 {
        self.inner.state.lock().length
    }

    /// The metadata as this handle last saw it.
    pub fn metadata(&self) -> LedgerMetadata {
        self.inner.state.lock().meta.clone()
    }

    /// Whether this handle may add entries.
    pub fn is_writable(&self) -> bool {
        self.inner.state.lock().writable
    }

    /// Whether this handle is closed (or reads a closed ledger).
    pub fn is_closed(&self) -> bool {
        self.inner.state.lock().closed
    }

    /// For a read-only handle of a ledger that is not closed: refresh the metadata and the
    /// last add confirmed from the bookies, and return it. For other handles, the current
    /// last add confirmed.
    pub async fn read_last_add_confirmed(&self) -> Result<i64> {
        {
            let st = self.inner.state.lock();
            if st.writable || st.closed {
                return Ok(st.lac);
            }
        }
        let (meta, version) = self.inner.bk.meta.read_ledger(self.inner.id).await?;
        if meta.state == LedgerState::Closed {
            let mut st = self.inner.state.lock();
            st.lac = meta.last_entry_id;
            st.length = meta.length;
            st.closed = true;
            st.meta = meta;
            st.version = version;
            return Ok(st.lac);
        }
        let lac = self.inner.bookie_lac(&meta).await?;
        let mut st = self.inner.state.lock();
        st.lac = st.lac.max(lac);
        st.meta = meta;
        st.version = version;
        Ok(st.lac)
    }

    /// Read entries `first..=last`, which must not go past the last add confirmed. Each
    /// entry is read from the bookies of its write set in turn until one returns it.
    pub async fn read_entries(&self, first: u64, last: u64) -> Result<Vec<(u64, Bytes)>> {
        if first > last {
            return Err(LedgerError::InvalidArgument(format!("first entry {first} is after last entry {last}")));
        }
        let (meta, lac) = {
            let st = self.inner.state.lock();
            (st.meta.clone(), st.lac)
        };
        if i64::try_from(last).map_or(true, |l| l > lac) {
            return Err(LedgerError::ReadBeyondLac { first, last, lac });
        }
        let meta = Arc::new(meta);
        let parallelism = self.inner.bk.config.read_parallelism.max(1);
        let mut entries = first..=last;
        let mut tasks = tokio::task::JoinSet::new();
        let mut ready: std::collections::BTreeMap<u64, Bytes> = std::collections::BTreeMap::new();
        let mut out = Vec::new();
        let mut emitted = first;
        loop {
            while tasks.len() < parallelism {
                let Some(entry) = entries.next() else { break };
                let inner = Arc::clone(&self.inner);
                let meta = Arc::clone(&meta);
                tasks.spawn(async move { (entry, inner.read_entry(&meta, entry).await) });
            }
            let Some(joined) = tasks.join_next().await else { break };
            let (entry, result) = joined.map_err(|e| LedgerError::Runtime(format!("read task failed: {e}")))?;
            ready.insert(entry, result?);
            while let Some(data) = ready.remove(&emitted) {
                out.push((emitted, data));
                emitted = emitted.saturating_add(1);
            }
        }
        Ok(out)
    }
}

impl std::fmt::Debug for LedgerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.state.lock();
        f.debug_struct("LedgerHandle")
            .field("id", &self.inner.id)
            .field("writable", &st.writable)
            .field("last_add_confirmed", &st.lac)
            .field("pending", &st.pending.len())
            .field("closed", &st.closed)
            .field("broken", &st.broken)
            .finish()
    }
}

impl HandleInner {
    /// Read and unwrap one entry from the first bookie of its write set that has it, trying
    /// bookies that recently failed last.
    pub(crate) async fn read_entry(&self, meta: &LedgerMetadata, entry: u64) -> Result<Bytes> {
        let failures = read_from_replicas(
            self.bk.transport.as_ref(),
            meta,
            self.id,
            entry,
            |addr| self.bk.is_quarantined(addr),
            |addr| self.bk.mark_failed(addr),
        )
        .await;
        let failures = match failures {
            Ok(payload) => return Ok(payload),
            Err(f) => f,
        };
        let mut last_err = LedgerError::NoSuchEntry { ledger: self.id, entry };
        for (addr, failure) in failures {
            match failure {
                ReplicaFailure::Corrupt(reason) => {
                    log::warn!("ledger {}: entry {entry} from {addr} is corrupt: {reason}", self.id);
                    last_err = LedgerError::CorruptEntry { ledger: self.id, entry, reason };
                }
                ReplicaFailure::Bookie(e) if e.is_missing() => {}
                ReplicaFailure::Bookie(e) => last_err = e.into(),
            }
        }
        Err(last_err)
    }

    /// The highest last add confirmed reported by the bookies of the last fragment, not
    /// below the entry before that fragment starts (a fragment only starts after every
    /// earlier entry was confirmed).
    pub(crate) async fn bookie_lac(&self, meta: &LedgerMetadata) -> Result<i64> {
        let floor = meta.ensembles.last().map_or(-1, |(first, _)| i64::try_from(*first).unwrap_or(i64::MAX) - 1);
        let mut tasks = tokio::task::JoinSet::new();
        for addr in meta.current_ensemble().to_vec() {
            let bk = Arc::clone(&self.bk);
            let id = self.id;
            tasks.spawn(async move { bk.transport.read_lac(&addr, id, false).await });
        }
        let mut best: Option<i64> = None;
        let mut last_err = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(lac)) => best = Some(best.map_or(lac, |b| b.max(lac))),
                Ok(Err(e)) if e.is_missing() => best = Some(best.unwrap_or(-1)),
                Ok(Err(e)) => last_err = Some(LedgerError::from(e)),
                Err(e) => last_err = Some(LedgerError::Runtime(e.to_string())),
            }
        }
        match (best, last_err) {
            (Some(lac), _) => Ok(lac.max(floor)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(floor),
        }
    }
}

/// Why one replica did not give an entry.
#[derive(Debug)]
pub enum ReplicaFailure {
    /// The bookie answered with an error (or not at all).
    Bookie(BookieError),
    /// What it returned did not decode as the entry.
    Corrupt(String),
}

/// Entry `entry` of `ledger`, unwrapped, from the first bookie of its write set that returns
/// it intact. The write set is tried in order, bookies `failed` says recently failed last;
/// a bookie that fails now is passed to `mark_failed`. Reads never fence. On failure, what
/// each bookie tried answered, in the order tried.
pub async fn read_from_replicas(
    transport: &dyn BookieTransport,
    meta: &LedgerMetadata,
    ledger: u64,
    entry: u64,
    failed: impl Fn(&str) -> bool,
    mark_failed: impl Fn(&str),
) -> std::result::Result<Bytes, Vec<(String, ReplicaFailure)>> {
    let ensemble = meta.ensemble_for(entry);
    let mut order: Vec<&String> =
        write_set(entry, ensemble.len(), meta.write_quorum_size).filter_map(|slot| ensemble.get(slot)).collect();
    order.sort_by_key(|addr| failed(addr));
    let mut failures = Vec::new();
    for addr in order {
        match transport.read(addr, ledger, entry, false).await {
            Ok(ReadEntry { data, .. }) => match entry::decode(ledger, entry, &data) {
                Ok(decoded) => return Ok(decoded.payload),
                Err(e) => failures.push((addr.clone(), ReplicaFailure::Corrupt(e.to_string()))),
            },
            Err(e) => {
                if e.is_bookie_failure() {
                    mark_failed(addr);
                }
                failures.push((addr.clone(), ReplicaFailure::Bookie(e)));
            }
        }
    }
    Err(failures)
}

#[cfg(test)]
mod tests {
    use super::AckedSlots;

    #[test]
    fn acked_slots_count_each_slot_once_and_forget_removed_ones() {
        let mut a = AckedSlots::default();
        for slot in [0, 2, 2, 63, 64, 200, 200] {
            a.insert(slot);
        }
        assert_eq!(a.len(), 5);
        a.remove(2);
        a.remove(200);
        a.remove(7);
        assert_eq!(a.len(), 3);
        a.insert(2);
        assert_eq!(a.len(), 4);
    }
}
