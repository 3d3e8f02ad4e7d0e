//! The managed ledger: one topic's stream of entries over a sequence of ledgers.
//!
//! Theory of operation. A managed ledger writes to exactly one ledger at a time (the
//! *current* ledger) and rolls over to a new one when the current one is full (entries,
//! bytes, age) or fails. The list of its ledgers, with per-ledger entry counts, sizes and
//! the index of each ledger's first message, is the record `/managed-ledgers/<name>`;
//! every change to it is a compare-and-set, so a second owner of the same topic makes this
//! instance *fenced* instead of silently forking the list.
//!
//! On open, the last ledger of the record may still be open from a previous owner that
//! crashed: it is opened with recovery (which fences the old writer and settles its last
//! entry), then a fresh ledger is created for writes.
//!
//! Appends go through one queue drained by a single task (see `append.rs`): everything
//! queued while one ledger write is in flight goes out as the next pipelined batch, so the
//! broker entry metadata (publish time, cumulative index) is assigned in append order.
//! Readers never wait on the writer: entry counts only grow after the ledger has confirmed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use magnetar_meta::MetadataStore;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::append::AddQueue;
use crate::cache::EntryCache;
use crate::config::ManagedLedgerConfig;
use crate::cursor::{Cursor, InitialPosition};
use crate::entry::Entry;
use crate::error::{Result, StreamError};
use crate::position::Position;
use crate::records::{self, from_json, meta_call, ml_path, to_json, CursorRecord, LedgerInfo, MlRecord};
use crate::store::{Ledger, LedgerStore, LedgerStoreError};

/// Most entries asked of one ledger in one read call.
const MAX_ENTRIES_PER_LEDGER_READ: u64 = 1000;
/// Bound on remembered (position → index, publish time) probes used by the finders.
pub(crate) const MAX_PROBES: usize = 200_000;
/// Every this many entries, an appended entry's metadata is remembered for the finders.
pub(crate) const PROBE_EVERY: i64 = 64;

/// Lifecycle of a managed ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlStatus {
    Open,
    /// Another owner changed the metadata; writes are refused.
    Fenced,
    Closed,
    Deleted,
}

/// Where one appended entry landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddResult {
    pub position: Position,
    /// Cumulative index of the entry's last message.
    pub index: u64,
    pub publish_time_ms: u64,
}

/// A snapshot of a managed ledger's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlStats {
    pub name: String,
    pub status: MlStatus,
    /// Entries retained over all ledgers.
    pub number_of_entries: u64,
    /// Bytes retained over all ledgers (entry headers included).
    pub total_size: u64,
    pub ledger_count: usize,
    pub current_ledger_id: Option<u64>,
    pub current_ledger_entries: u64,
    pub current_ledger_size: u64,
    /// When the ledger being written was created, ms since the epoch (None while there
    /// is none).
    pub current_ledger_created_ms: Option<u64>,
    pub last_confirmed: Option<Position>,
    pub first_position: Option<Position>,
    /// Index the next message will get (messages ever appended, counting from 0).
    pub next_index: u64,
    /// Entries appended since this instance opened.
    pub entries_added: u64,
    pub durable_cursors: usize,
}

pub(crate) struct MlState {
    pub(crate) status: MlStatus,
    pub(crate) ledgers: BTreeMap<u64, LedgerInfo>,
    pub(crate) current: Option<Arc<dyn Ledger>>,
    pub(crate) current_created_ms: u64,
    /// When the last entry was confirmed (0: none since open); the age of the newest entry
    /// of the current ledger while that ledger holds any.
    pub(crate) last_add_ms: u64,
    pub(crate) read_handles: HashMap<u64, Arc<dyn Ledger>>,
    pub(crate) last_confirmed: Option<Position>,
    /// Index the next message gets when its entry is assigned metadata.
    pub(crate) assign_index: u64,
    /// Index following the last confirmed message.
    pub(crate) confirmed_next_index: u64,
    pub(crate) last_publish_ms: u64,
    pub(crate) record_version: i64,
    pub(crate) created_ms: u64,
    pub(crate) properties: BTreeMap<String, String>,
    pub(crate) entries_added: u64,
    pub(crate) cache: EntryCache,
    /// position → (index, publish time), a sparse index for the finders.
    pub(crate) probes: BTreeMap<Position, (u64, u64)>,
}

impl MlState {
    pub(crate) fn current_id(&self) -> Option<u64> {
        self.current.as_ref().map(|h| h.id())
    }

    /// The position the next appended entry would take if the current ledger stays.
    pub(crate) fn end_position(&self) -> Position {
        match self.ledgers.iter().next_back() {
            Some((id, info)) => Position::new(*id, entries_i64(info.entries)),
            None => Position::new(0, 0),
        }
    }

    /// The smallest existing entry position `>= p`, or [`MlState::end_position`].
    pub(crate) fn normalize(&self, p: Position) -> Position {
        for (id, info) in self.ledgers.range(p.ledger_id..) {
            let start = if *id == p.ledger_id { p.entry_id.max(0) } else { 0 };
            if start < entries_i64(info.entries) {
                return Position::new(*id, start);
            }
        }
        self.end_position()
    }

    /// `from` as an existing entry ([`MlState::normalize`]) with its ledger's entry
    /// count; None past the last entry.
    fn readable_at(&self, from: Position) -> Option<(Position, u64)> {
        let p = self.normalize(from);
        let info = self.ledgers.get(&p.ledger_id)?;
        (p.entry_id < entries_i64(info.entries)).then_some((p, info.entries))
    }

    /// The first existing entry after `p`, or the end position.
    pub(crate) fn next_valid(&self, p: Position) -> Position {
        self.normalize(Position::new(p.ledger_id, p.entry_id.saturating_add(1)))
    }

    /// The last existing entry `< p`, if any.
    pub(crate) fn previous_valid(&self, p: Position) -> Option<Position> {
        for (id, info) in self.ledgers.range(..=p.ledger_id).rev() {
            let n = entries_i64(info.entries);
            let last = if *id == p.ledger_id { (p.entry_id - 1).min(n - 1) } else { n - 1 };
            if last >= 0 {
                return Some(Position::new(*id, last));
            }
        }
        None
    }

    /// Entries in `(after, upto]`.
    pub(crate) fn count_between(&self, after: Position, upto: Position) -> u64 {
        if upto <= after {
            return 0;
        }
        let mut n = 0u64;
        for (id, info) in self.ledgers.range(after.ledger_id..=upto.ledger_id) {
            let count = entries_i64(info.entries);
            let lo = if *id == after.ledger_id { after.entry_id + 1 } else { 0 };
            let hi = if *id == upto.ledger_id { upto.entry_id.min(count - 1) } else { count - 1 };
            if hi >= lo {
                n += (hi - lo + 1) as u64;
            }
        }
        n
    }

    pub(crate) fn first_position(&self) -> Option<Position> {
        self.ledgers.iter().find(|(_, i)| i.entries > 0).map(|(id, _)| Position::new(*id, 0))
    }

    pub(crate) fn evict_cache(&mut self, now_ms: u64, eviction_time: std::time::Duration) {
        let age = u64::try_from(eviction_time.as_millis()).unwrap_or(u64::MAX);
        self.cache.evict_published_before(now_ms.saturating_sub(age));
    }

    pub(crate) fn remember_probe(&mut self, p: Position, index: u64, publish_ms: u64) {
        if self.probes.len() >= MAX_PROBES {
            self.probes.clear();
        }
        self.probes.insert(p, (index, publish_ms));
    }
}

pub(crate) fn entries_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

type OnClose = Box<dyn FnOnce() + Send>;

/// One topic's managed ledger. Obtain it from [`crate::ManagedLedgerFactory::open`].
pub struct ManagedLedger {
    pub(crate) name: String,
    pub(crate) config: ManagedLedgerConfig,
    pub(crate) meta: Arc<dyn MetadataStore>,
    pub(crate) store: Arc<dyn LedgerStore>,
    pub(crate) state: Mutex<MlState>,
    pub(crate) queue: Mutex<AddQueue>,
    pub(crate) record_lock: tokio::sync::Mutex<()>,
    pub(crate) trim_lock: tokio::sync::Mutex<()>,
    /// Every index below this was deleted on request ([`ManagedLedger::trim_below`]); each
    /// trim drops the ledgers wholly below it. 0: none.
    pub(crate) trim_floor: std::sync::atomic::AtomicU64,
    cursor_create_lock: tokio::sync::Mutex<()>,
    pub(crate) trim_scheduled: std::sync::atomic::AtomicBool,
    pub(crate) writer_idle: tokio::sync::Notify,
    /// Signalled when an append is queued for a drain task that is already running.
    pub(crate) add_queued: tokio::sync::Notify,
    /// Dropped on close, which ends every receiver's wait with an error.
    pub(crate) new_entries: Mutex<Option<watch::Sender<u64>>>,
    pub(crate) cursors: Mutex<BTreeMap<String, Arc<Cursor>>>,
    pub(crate) me: Weak<ManagedLedger>,
    non_durable_seq: AtomicU64,
    on_close: Mutex<Option<OnClose>>,
}

impl std::fmt::Debug for ManagedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedLedger").field("name", &self.name).finish_non_exhaustive()
    }
}

impl ManagedLedger {
    pub(crate) async fn open(
        name: &str,
        config: ManagedLedgerConfig,
        meta: Arc<dyn MetadataStore>,
        store: Arc<dyn LedgerStore>,
    ) -> Result<Arc<ManagedLedger>> {
        if name.is_empty() || name.starts_with('/') || name.ends_with('/') {
            return Err(StreamError::InvalidArgument(format!("bad managed ledger name {name:?}")));
        }
        let path = ml_path(name);
        let now = config.clock.now_ms();
        let p = path.clone();
        let (record, version) = match meta_call(&meta, move |m| m.get(&p)).await? {
            Some((data, v)) => (from_json::<MlRecord>(&path, &data)?, v),
            None => {
                let rec = MlRecord { created_ms: now, ..Default::default() };
                let json = to_json(&rec)?;
                let p = path.clone();
                let v = meta_call(&meta, move |m| m.put(&p, &json, Some(-1))).await?;
                (rec, v)
            }
        };
        let (tx, _) = watch::channel(0u64);
        let cache = EntryCache::new(config.cache_size_bytes, config.cache_budget.clone());
        let ml = Arc::new_cyclic(|me| ManagedLedger {
            name: name.to_string(),
            meta,
            store,
            state: Mutex::new(MlState {
                status: MlStatus::Open,
                ledgers: record.ledgers.iter().map(|i| (i.ledger_id, *i)).collect(),
                current: None,
                current_created_ms: now,
                last_add_ms: 0,
                read_handles: HashMap::new(),
                last_confirmed: None,
                assign_index: record.next_index,
                confirmed_next_index: record.next_index,
                last_publish_ms: 0,
                record_version: version,
                created_ms: record.created_ms,
                properties: record.properties.clone(),
                entries_added: 0,
                cache,
                probes: BTreeMap::new(),
            }),
            config,
            queue: Mutex::new(AddQueue { pending: VecDeque::new(), running: false }),
            record_lock: tokio::sync::Mutex::new(()),
            trim_lock: tokio::sync::Mutex::new(()),
            trim_floor: std::sync::atomic::AtomicU64::new(0),
            cursor_create_lock: tokio::sync::Mutex::new(()),
            trim_scheduled: std::sync::atomic::AtomicBool::new(false),
            writer_idle: tokio::sync::Notify::new(),
            add_queued: tokio::sync::Notify::new(),
            new_entries: Mutex::new(Some(tx)),
            cursors: Mutex::new(BTreeMap::new()),
            me: me.clone(),
            non_durable_seq: AtomicU64::new(0),
            on_close: Mutex::new(None),
        });
        ml.recover(record.next_index).await?;
        ml.load_cursors().await?;
        Ok(ml)
    }

    pub(crate) fn set_on_close(&self, f: OnClose) {
        *self.on_close.lock() = Some(f);
    }

    /// Settle the last ledger of the record (recovery), learn the next index, and
    /// create the ledger new entries go to.
    async fn recover(&self, recorded_next_index: u64) -> Result<()> {
        let now = self.config.clock.now_ms();
        let mut next_index = recorded_next_index;
        let last = self.state.lock().ledgers.iter().next_back().map(|(_, i)| *i);
        if let Some(info) = last {
            match self.store.open_ledger(info.ledger_id, true).await {
                Ok(h) => {
                    let lac = h.last_add_confirmed();
                    let mut st = self.state.lock();
                    if lac < 0 {
                        st.ledgers.remove(&info.ledger_id);
                        next_index = next_index.max(info.first_index);
                    } else if let Some(i) = st.ledgers.get_mut(&info.ledger_id) {
                        i.entries = u64::try_from(lac + 1).unwrap_or(0);
                        i.size = h.length();
                        i.timestamp = now;
                        st.read_handles.insert(info.ledger_id, h);
                    }
                }
                Err(LedgerStoreError::NoSuchLedger(_)) => {
                    self.state.lock().ledgers.remove(&info.ledger_id);
                    next_index = next_index.max(info.first_index);
                }
                Err(e) => return Err(e.into()),
            }
            if !self.state.lock().ledgers.contains_key(&info.ledger_id) {
                if let Err(e) = self.store.delete_ledger(info.ledger_id).await {
                    log::debug!("managed ledger {}: empty ledger {} not deleted: {e}", self.name, info.ledger_id);
                }
            }
        }
        let last_full = self.state.lock().ledgers.values().rev().find(|i| i.entries > 0).copied();
        if let Some(info) = last_full {
            let at = Position::new(info.ledger_id, entries_i64(info.entries) - 1);
            let entry = self.read_entries(at, 1).await?.into_iter().next().ok_or_else(|| {
                StreamError::Corrupt(format!("managed ledger {}: last entry {at} is unreadable", self.name))
            })?;
            next_index = next_index.max(entry.index + 1);
            let mut st = self.state.lock();
            st.last_publish_ms = entry.publish_time_ms;
            st.last_confirmed = Some(entry.position);
        }
        {
            let mut st = self.state.lock();
            st.assign_index = next_index;
            st.confirmed_next_index = next_index;
        }
        self.rollover(next_index).await?;
        Ok(())
    }

    async fn load_cursors(&self) -> Result<()> {
        let path = ml_path(&self.name);
        let p = path.clone();
        let children = meta_call(&self.meta, move |m| m.children(&p)).await?;
        for child in children {
            let Some(cursor_name) = records::unescape_cursor_name(&child) else {
                log::warn!("managed ledger {}: ignoring unrecognised record {child}", self.name);
                continue;
            };
            let cpath = format!("{path}/{child}");
            let cp = cpath.clone();
            let Some((data, version)) = meta_call(&self.meta, move |m| m.get(&cp)).await? else { continue };
            let rec: CursorRecord = from_json(&cpath, &data)?;
            let cursor = Cursor::restore(self, cursor_name.clone(), rec, version);
            self.cursors.lock().insert(cursor_name, cursor);
        }
        Ok(())
    }

    /// Write the managed ledger's record from the in-memory state (compare-and-set).
    pub(crate) async fn persist_record(&self) -> Result<()> {
        let _guard = self.record_lock.lock().await;
        let (json, version) = {
            let st = self.state.lock();
            if st.status == MlStatus::Deleted {
                return Err(StreamError::Closed(self.name.clone()));
            }
            let rec = MlRecord {
                ledgers: st.ledgers.values().copied().collect(),
                next_index: st.confirmed_next_index,
                created_ms: st.created_ms,
                properties: st.properties.clone(),
            };
            (to_json(&rec)?, st.record_version)
        };
        let path = ml_path(&self.name);
        match meta_call(&self.meta, move |m| m.put(&path, &json, Some(version))).await {
            Ok(v) => {
                self.state.lock().record_version = v;
                Ok(())
            }
            Err(StreamError::Metadata(magnetar_meta::MetaError::BadVersion(_) | magnetar_meta::MetaError::NotFound(_))) => {
                self.state.lock().status = MlStatus::Fenced;
                Err(StreamError::Fenced(self.name.clone()))
            }
            Err(e) => Err(e),
        }
    }

    /// Name of the managed ledger.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its configuration.
    pub fn config(&self) -> &ManagedLedgerConfig {
        &self.config
    }

    /// The largest payload one entry may have (what the ledger store's entries hold, less
    /// the broker entry metadata): an add request holding a larger one is refused whole,
    /// before it is queued, and the adds around it go on.
    pub fn max_entry_size(&self) -> usize {
        self.store.max_entry_size().saturating_sub(crate::entry::HEADER_LEN)
    }

    /// Lifecycle state.
    pub fn status(&self) -> MlStatus {
        self.state.lock().status
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        match self.state.lock().status {
            MlStatus::Open => Ok(()),
            MlStatus::Fenced => Err(StreamError::Fenced(self.name.clone())),
            MlStatus::Closed | MlStatus::Deleted => Err(StreamError::Closed(self.name.clone())),
        }
    }

    fn check_readable(&self) -> Result<()> {
        match self.state.lock().status {
            MlStatus::Open | MlStatus::Fenced => Ok(()),
            MlStatus::Closed | MlStatus::Deleted => Err(StreamError::Closed(self.name.clone())),
        }
    }

    /// Position of the last confirmed entry, `None` while there is none.
    pub fn last_confirmed(&self) -> Option<Position> {
        self.state.lock().last_confirmed
    }

    /// Position of the oldest retained entry, `None` while there is none.
    /// Drop cached entries older than the cache eviction time. Appends do this as they go;
    /// a periodic sweep over every open ledger does it for those no longer written, so an
    /// idle topic does not keep a shared cache budget to itself.
    pub fn evict_expired_cache(&self) {
        let now = self.config.clock.now_ms();
        self.state.lock().evict_cache(now, self.config.cache_eviction_time);
    }

    pub fn first_position(&self) -> Option<Position> {
        self.state.lock().first_position()
    }

    /// Index of the oldest retained message (Kafka's log start offset); equal to
    /// [`MlStats::next_index`] while nothing is retained.
    pub fn first_index(&self) -> u64 {
        let st = self.state.lock();
        st.ledgers.values().find(|i| i.entries > 0).map_or(st.confirmed_next_index, |i| i.first_index)
    }

    /// Index the next message will get (Kafka's high watermark / log end offset).
    pub fn next_index(&self) -> u64 {
        self.state.lock().confirmed_next_index
    }

    /// Properties stored in the managed ledger's record.
    pub fn properties(&self) -> BTreeMap<String, String> {
        self.state.lock().properties.clone()
    }

    /// Set (or with `None` remove) a property and write the record.
    pub async fn set_property(&self, key: &str, value: Option<String>) -> Result<()> {
        self.check_open()?;
        {
            let mut st = self.state.lock();
            match value {
                Some(v) => st.properties.insert(key.to_string(), v),
                None => st.properties.remove(key),
            };
        }
        self.persist_record().await
    }

    /// The first existing entry after `p`, or the position the next entry will take.
    pub fn next_valid_position(&self, p: Position) -> Position {
        self.state.lock().next_valid(p)
    }

    /// Number of entries in `(after, upto]`.
    pub fn count_entries_between(&self, after: Position, upto: Position) -> u64 {
        self.state.lock().count_between(after, upto)
    }

    /// A receiver whose value (entries appended since open) changes after every append:
    /// readers wait on it (`changed().await`) instead of polling. Once the managed ledger
    /// is closed or deleted, `changed()` fails.
    pub fn new_entries(&self) -> watch::Receiver<u64> {
        match self.new_entries.lock().as_ref() {
            Some(tx) => tx.subscribe(),
            None => watch::channel(0).1,
        }
    }

    /// Every ledger of the managed ledger, oldest first.
    pub fn ledgers_info(&self) -> Vec<LedgerInfo> {
        self.state.lock().ledgers.values().copied().collect()
    }

    /// Counters.
    pub fn stats(&self) -> MlStats {
        let durable_cursors = self.cursors.lock().len();
        let st = self.state.lock();
        let current = st.current_id().and_then(|id| st.ledgers.get(&id));
        MlStats {
            name: self.name.clone(),
            status: st.status,
            number_of_entries: st.ledgers.values().map(|i| i.entries).sum(),
            total_size: st.ledgers.values().map(|i| i.size).sum(),
            ledger_count: st.ledgers.len(),
            current_ledger_id: st.current_id(),
            current_ledger_entries: current.map_or(0, |i| i.entries),
            current_ledger_size: current.map_or(0, |i| i.size),
            current_ledger_created_ms: st.current.as_ref().map(|_| st.current_created_ms),
            last_confirmed: st.last_confirmed,
            first_position: st.first_position(),
            next_index: st.confirmed_next_index,
            entries_added: st.entries_added,
            durable_cursors,
        }
    }

    /// Read up to `max_entries` entries starting at `from` (or at the first entry after it
    /// when `from` does not exist), crossing ledger boundaries. Returns fewer (possibly
    /// none) when the end is reached.
    pub async fn read_entries(&self, from: Position, max_entries: usize) -> Result<Vec<Entry>> {
        self.check_readable()?;
        let mut out: Vec<Entry> = Vec::new();
        let mut pos = from;
        while out.len() < max_entries {
            let want = max_entries - out.len();
            let plan = {
                let st = self.state.lock();
                match st.readable_at(pos) {
                    Some((p, entries)) => {
                        let cached = st.cache.get_run(p.ledger_id, p.entry_id, want);
                        if cached.is_empty() {
                            let span = (want as u64).min(MAX_ENTRIES_PER_LEDGER_READ);
                            let first = p.entry_id as u64;
                            let last = (first + span - 1).min(entries - 1);
                            let handle = if st.current_id() == Some(p.ledger_id) {
                                st.current.clone()
                            } else {
                                st.read_handles.get(&p.ledger_id).cloned()
                            };
                            ReadPlan::Ledger(p.ledger_id, first, last, handle)
                        } else {
                            ReadPlan::Cached(cached)
                        }
                    }
                    None => ReadPlan::End,
                }
            };
            match plan {
                ReadPlan::End => break,
                ReadPlan::Cached(entries) => {
                    if let Some(last) = entries.last() {
                        pos = Position::new(last.position.ledger_id, last.position.entry_id + 1);
                    }
                    out.extend(entries);
                }
                ReadPlan::Ledger(lid, first, last, handle) => {
                    let handle = match handle {
                        Some(h) => Ok(h),
                        None => self.open_read_handle(lid).await,
                    };
                    let raw = match handle {
                        Ok(h) => h.read_entries(first, last).await.map_err(StreamError::from),
                        Err(e) => Err(e),
                    };
                    let raw = match raw {
                        Ok(raw) => raw,
                        // Trimmed while being read: go on with the next ledger.
                        Err(_) if !self.state.lock().ledgers.contains_key(&lid) => {
                            pos = Position::new(lid.saturating_add(1), 0);
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if raw.is_empty() {
                        break;
                    }
                    let mut st_probes = Vec::with_capacity(raw.len());
                    for (id, data) in raw {
                        let entry_id = i64::try_from(id)
                            .map_err(|_| StreamError::Corrupt(format!("entry id {id} out of range")))?;
                        let entry = Entry::from_stored(Position::new(lid, entry_id), &data)?;
                        st_probes.push((entry.position, entry.index, entry.publish_time_ms));
                        out.push(entry);
                    }
                    if let Some((p, i, t)) = st_probes.last().copied() {
                        self.state.lock().remember_probe(p, i, t);
                    }
                    pos = Position::new(lid, i64::try_from(last).unwrap_or(i64::MAX).saturating_add(1));
                }
            }
        }
        Ok(out)
    }

    /// The entries from `from` on that the entry cache holds, up to `max_entries` of one
    /// ledger, without waiting: what [`ManagedLedger::read_entries`] would return first,
    /// or nothing when that needs a read from the bookies.
    pub fn read_cached(&self, from: Position, max_entries: usize) -> Vec<Entry> {
        if self.check_readable().is_err() {
            return Vec::new();
        }
        let st = self.state.lock();
        st.readable_at(from)
            .map_or_else(Vec::new, |(p, _)| st.cache.get_run(p.ledger_id, p.entry_id, max_entries))
    }

    async fn open_read_handle(&self, ledger_id: u64) -> Result<Arc<dyn Ledger>> {
        let h = self.store.open_ledger(ledger_id, false).await?;
        self.state.lock().read_handles.insert(ledger_id, h.clone());
        Ok(h)
    }

    /// Open (or create) the durable cursor `name`. A new cursor starts at `initial`: with
    /// `Earliest` nothing is acknowledged, with `Latest` everything written so far is.
    pub async fn open_cursor(&self, name: &str, initial: InitialPosition) -> Result<Arc<Cursor>> {
        self.check_open()?;
        let _creating = self.cursor_create_lock.lock().await;
        if let Some(c) = self.cursors.lock().get(name) {
            return Ok(c.clone());
        }
        let cursor = Cursor::create(self, name, initial).await?;
        let mut cursors = self.cursors.lock();
        Ok(cursors.entry(name.to_string()).or_insert(cursor).clone())
    }

    /// The durable cursors, by name.
    pub fn cursors(&self) -> Vec<Arc<Cursor>> {
        self.cursors.lock().values().cloned().collect()
    }

    /// The durable cursor `name`, if open.
    pub fn cursor(&self, name: &str) -> Option<Arc<Cursor>> {
        self.cursors.lock().get(name).cloned()
    }

    /// Remove the durable cursor `name` and its record; it no longer holds back trimming.
    pub async fn delete_cursor(&self, name: &str) -> Result<()> {
        let cursor = self.cursors.lock().remove(name).ok_or_else(|| StreamError::NoSuchCursor(name.to_string()))?;
        cursor.mark_closed();
        let path = records::cursor_path(&self.name, name);
        match meta_call(&self.meta, move |m| m.delete(&path, None)).await {
            Ok(()) | Err(StreamError::Metadata(magnetar_meta::MetaError::NotFound(_))) => {}
            Err(e) => return Err(e),
        }
        self.schedule_trim();
        Ok(())
    }

    /// A cursor that reads from `start` and is neither persisted nor counted by trimming.
    pub fn new_non_durable_cursor(&self, start: Position) -> Result<Arc<Cursor>> {
        self.check_readable()?;
        let n = self.non_durable_seq.fetch_add(1, Ordering::Relaxed);
        Ok(Cursor::non_durable(self, format!("non-durable-{n}"), start))
    }

    pub(crate) fn arc(&self) -> Result<Arc<ManagedLedger>> {
        self.me.upgrade().ok_or_else(|| StreamError::Closed(self.name.clone()))
    }

    /// Flush cursors, seal the current ledger and release the managed ledger. Pending
    /// appends fail with `Closed`.
    pub async fn close(&self) -> Result<()> {
        let was_fenced = {
            let mut st = self.state.lock();
            if matches!(st.status, MlStatus::Closed | MlStatus::Deleted) {
                return Ok(());
            }
            std::mem::replace(&mut st.status, MlStatus::Closed) == MlStatus::Fenced
        };
        self.wait_writer_idle().await;
        let mut first_err = None;
        for c in self.cursors() {
            if !was_fenced {
                if let Err(e) = c.flush().await {
                    first_err.get_or_insert(e);
                }
            }
            c.mark_closed();
        }
        let current = {
            let mut st = self.state.lock();
            st.current.take()
        };
        if let Some(h) = current {
            if let Err(e) = h.close().await {
                first_err.get_or_insert(e.into());
            }
            let now = self.config.clock.now_ms();
            if let Some(i) = self.state.lock().ledgers.get_mut(&h.id()) {
                i.timestamp = now;
            }
            // A fenced instance no longer owns the record.
            if !was_fenced {
                if let Err(e) = self.persist_record().await {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.release();
        first_err.map_or(Ok(()), Err)
    }

    /// Delete the managed ledger: its ledgers, its cursors and its record.
    pub async fn delete(&self) -> Result<()> {
        {
            let mut st = self.state.lock();
            if st.status == MlStatus::Deleted {
                return Ok(());
            }
            st.status = MlStatus::Closed;
        }
        self.wait_writer_idle().await;
        let cursors: Vec<(String, Arc<Cursor>)> = std::mem::take(&mut *self.cursors.lock()).into_iter().collect();
        for (name, c) in cursors {
            c.mark_closed();
            let path = records::cursor_path(&self.name, &name);
            match meta_call(&self.meta, move |m| m.delete(&path, None)).await {
                Ok(()) | Err(StreamError::Metadata(magnetar_meta::MetaError::NotFound(_))) => {}
                Err(e) => return Err(e),
            }
        }
        let (ids, current) = {
            let mut st = self.state.lock();
            st.status = MlStatus::Deleted;
            st.read_handles.clear();
            st.cache.clear();
            (st.ledgers.keys().copied().collect::<Vec<u64>>(), st.current.take())
        };
        if let Some(h) = current {
            if let Err(e) = h.close().await {
                log::debug!("managed ledger {}: closing ledger {} before delete: {e}", self.name, h.id());
            }
        }
        for id in ids {
            match self.store.delete_ledger(id).await {
                Ok(()) | Err(LedgerStoreError::NoSuchLedger(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let path = ml_path(&self.name);
        match meta_call(&self.meta, move |m| m.delete(&path, None)).await {
            Ok(()) | Err(StreamError::Metadata(magnetar_meta::MetaError::NotFound(_))) => {}
            Err(e) => return Err(e),
        }
        self.release();
        Ok(())
    }

    fn release(&self) {
        self.fail_pending(&StreamError::Closed(self.name.clone()));
        drop(self.new_entries.lock().take());
        if let Some(f) = self.on_close.lock().take() {
            f();
        }
    }
}

enum ReadPlan {
    End,
    Cached(Vec<Entry>),
    Ledger(u64, u64, u64, Option<Arc<dyn Ledger>>),
}
