//! Cursors: a subscription's read and acknowledgement state over a managed ledger.
//!
//! Theory of operation. A cursor's acknowledgement state is its *mark-delete position*
//! (every entry at or before it is acknowledged) plus the *individually deleted* ranges
//! above it. Whenever the first range reaches the entry right after the mark-delete
//! position (possibly the first entry of a later ledger), the mark-delete position jumps
//! to the end of that range, so the set stays small for consumers that acknowledge
//! roughly in order. The *read position* is where the next read starts; reads skip
//! acknowledged entries.
//!
//! A durable cursor persists its state as `/managed-ledgers/<ml>/<escaped name>` at most
//! `mark_delete_rate_per_sec` times a second; a change that arrives sooner is written by a
//! delayed flush, and `flush`/`close` write whatever is pending. A crash can therefore
//! lose only the newest acknowledgements (those entries are delivered again), never mark
//! as acknowledged something that was not.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::entry::Entry;
use crate::error::{Result, StreamError};
use crate::managed_ledger::ManagedLedger;
use crate::position::Position;
use crate::ranges::PositionRangeSet;
use crate::records::{cursor_path, meta_call, to_json, CursorRecord};

/// Where a new durable cursor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialPosition {
    /// Before the oldest retained entry: everything retained is unacknowledged.
    Earliest,
    /// After the last confirmed entry: only entries added from now on are delivered.
    Latest,
}

struct CursorState {
    mark_delete: Position,
    read_position: Position,
    deleted: PositionRangeSet,
    properties: BTreeMap<String, String>,
    /// Batch-index acknowledgements of entries not wholly acknowledged: the ack set of
    /// each (its set bits are the messages still unacknowledged).
    batch_acks: BTreeMap<Position, Vec<i64>>,
    /// Bumped on every change of persisted state.
    generation: u64,
    persisted_generation: u64,
    /// Bumped when the read position is moved by seek/rewind/reset.
    read_epoch: u64,
    last_persist: Option<Instant>,
    closed: bool,
}

/// A cursor. Obtain one from [`ManagedLedger::open_cursor`] or
/// [`ManagedLedger::new_non_durable_cursor`].
pub struct Cursor {
    name: String,
    durable: bool,
    ml: Weak<ManagedLedger>,
    ml_name: String,
    state: Mutex<CursorState>,
    /// Serializes record writes; holds the record's version.
    persist: tokio::sync::Mutex<i64>,
    read_lock: tokio::sync::Mutex<()>,
    flush_scheduled: AtomicBool,
    me: Weak<Cursor>,
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor").field("ml", &self.ml_name).field("name", &self.name).finish_non_exhaustive()
    }
}

impl Cursor {
    fn build(ml: &ManagedLedger, name: String, durable: bool, mark_delete: Position, read: Position, rec: Option<(CursorRecord, i64)>) -> Arc<Cursor> {
        let (deleted, properties, batch_acks, version) = match rec {
            Some((r, v)) => {
                let mut set = PositionRangeSet::new();
                for (l, a, b) in r.individually_deleted {
                    set.insert_range(l, a, b);
                }
                let batch_acks = r.batch_acks.into_iter().map(|(l, e, ack_set)| (Position::new(l, e), ack_set)).collect();
                (set, r.properties, batch_acks, v)
            }
            None => (PositionRangeSet::new(), BTreeMap::new(), BTreeMap::new(), -1),
        };
        Arc::new_cyclic(|me| Cursor {
            name,
            durable,
            ml: ml.me.clone(),
            ml_name: ml.name.clone(),
            state: Mutex::new(CursorState {
                mark_delete,
                read_position: read,
                deleted,
                properties,
                batch_acks,
                generation: 0,
                persisted_generation: 0,
                read_epoch: 0,
                last_persist: None,
                closed: false,
            }),
            persist: tokio::sync::Mutex::new(version),
            read_lock: tokio::sync::Mutex::new(()),
            flush_scheduled: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    pub(crate) fn restore(ml: &ManagedLedger, name: String, rec: CursorRecord, version: i64) -> Arc<Cursor> {
        let md = rec.mark_delete;
        let read = ml.next_valid_position(md);
        let c = Cursor::build(ml, name, true, md, read, Some((rec, version)));
        {
            let st = ml.state.lock();
            let mut cs = c.state.lock();
            cs.deleted.remove_up_to(md);
            advance_mark_delete(&st, &mut cs);
            prune_batch_acks(&mut cs);
            cs.read_position = st.next_valid(cs.mark_delete);
        }
        c
    }

    pub(crate) async fn create(ml: &ManagedLedger, name: &str, initial: InitialPosition) -> Result<Arc<Cursor>> {
        let md = {
            let st = ml.state.lock();
            match initial {
                InitialPosition::Latest => st.last_confirmed.unwrap_or_else(|| st.end_position().just_before()),
                InitialPosition::Earliest => st.first_position().unwrap_or_else(|| st.end_position()).just_before(),
            }
        };
        let read = ml.next_valid_position(md);
        let c = Cursor::build(ml, name.to_string(), true, md, read, None);
        let rec = c.record(ml.config.clock.now_ms(), ml.config.max_unacked_ranges_to_persist);
        let json = to_json(&rec)?;
        let path = cursor_path(&ml.name, name);
        let version = match meta_call(&ml.meta, move |m| m.put(&path, &json, Some(-1))).await {
            Ok(v) => v,
            Err(StreamError::Metadata(magnetar_meta::MetaError::AlreadyExists(p))) => {
                return Err(StreamError::Fenced(format!("{}: cursor record {p} created by another owner", ml.name)));
            }
            Err(e) => return Err(e),
        };
        *c.persist.lock().await = version;
        Ok(c)
    }

    pub(crate) fn non_durable(ml: &ManagedLedger, name: String, start: Position) -> Arc<Cursor> {
        let md = start.just_before();
        let read = ml.state.lock().normalize(start);
        Cursor::build(ml, name, false, md, read, None)
    }

    fn record(&self, now_ms: u64, max_ranges: usize) -> CursorRecord {
        let st = self.state.lock();
        let mut ranges = st.deleted.ranges();
        ranges.truncate(max_ranges);
        CursorRecord {
            mark_delete: st.mark_delete,
            individually_deleted: ranges,
            properties: st.properties.clone(),
            batch_acks: st.batch_acks.iter().map(|(p, ack_set)| (p.ledger_id, p.entry_id, ack_set.clone())).collect(),
            last_active: now_ms,
        }
    }

    fn ml(&self) -> Result<Arc<ManagedLedger>> {
        self.ml.upgrade().ok_or_else(|| StreamError::Closed(self.ml_name.clone()))
    }

    fn check_open(&self) -> Result<()> {
        if self.state.lock().closed {
            return Err(StreamError::Closed(format!("{} (cursor {})", self.ml_name, self.name)));
        }
        Ok(())
    }

    pub(crate) fn mark_closed(&self) {
        self.state.lock().closed = true;
    }

    /// The cursor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the cursor's state is persisted and holds back trimming.
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// Everything at or before this position is acknowledged.
    pub fn mark_delete_position(&self) -> Position {
        self.state.lock().mark_delete
    }

    /// Where the next read starts (it may name an entry that is not written yet).
    pub fn read_position(&self) -> Position {
        self.state.lock().read_position
    }

    /// The individually acknowledged ranges above the mark-delete position, as inclusive
    /// `(first, last)` position pairs.
    pub fn individually_deleted_ranges(&self) -> Vec<(Position, Position)> {
        self.state
            .lock()
            .deleted
            .ranges()
            .into_iter()
            .map(|(l, a, b)| (Position::new(l, a), Position::new(l, b)))
            .collect()
    }

    /// Whether `p` is acknowledged (at or before mark-delete, or individually).
    pub fn is_acknowledged(&self, p: Position) -> bool {
        let st = self.state.lock();
        p <= st.mark_delete || st.deleted.contains(p)
    }

    /// Entries after the mark-delete position that are not individually acknowledged.
    pub fn number_of_entries_in_backlog(&self) -> u64 {
        let Ok(ml) = self.ml() else { return 0 };
        let st = ml.state.lock();
        let cs = self.state.lock();
        let Some(last) = st.last_confirmed else { return 0 };
        st.count_between(cs.mark_delete, last).saturating_sub(cs.deleted.len())
    }

    /// Properties kept with the cursor (persisted with its state).
    pub fn properties(&self) -> BTreeMap<String, String> {
        self.state.lock().properties.clone()
    }

    /// Set (or with `None` remove) one property; persisted like an acknowledgement.
    pub async fn set_property(&self, key: &str, value: Option<String>) -> Result<()> {
        self.check_open()?;
        {
            let mut st = self.state.lock();
            match value {
                Some(v) => st.properties.insert(key.to_string(), v),
                None => st.properties.remove(key),
            };
            st.generation += 1;
        }
        self.after_change(false).await
    }

    /// Replace all of the cursor's properties with `properties`; persisted.
    pub async fn set_properties(&self, properties: BTreeMap<String, String>) -> Result<()> {
        self.check_open()?;
        {
            let mut st = self.state.lock();
            if st.properties == properties {
                return Ok(());
            }
            st.properties = properties;
            st.generation += 1;
        }
        self.after_change(false).await
    }

    /// Read up to `max` unacknowledged entries from the read position and move the read
    /// position past them. Returns an empty vector at the end of the managed ledger.
    pub async fn read_entries(&self, max: usize) -> Result<Vec<Entry>> {
        self.check_open()?;
        let ml = self.ml()?;
        let _reading = self.read_lock.lock().await;
        let mut out = Vec::new();
        while out.len() < max {
            let (from, epoch) = self.read_from();
            let batch = ml.read_entries(from, max - out.len()).await?;
            match self.take_read(&ml, batch, epoch) {
                Some(kept) => out.extend(kept),
                None => break,
            }
        }
        Ok(out)
    }

    /// The read position and its epoch (which a rewind, seek or reset changes).
    fn read_from(&self) -> (Position, u64) {
        let cs = self.state.lock();
        (cs.read_position, cs.read_epoch)
    }

    /// Move the read position past `batch`, read from where it was at `epoch`, and keep
    /// its unacknowledged entries; None when `batch` is empty or the position was moved
    /// meanwhile (the read is then dropped).
    fn take_read(&self, ml: &ManagedLedger, batch: Vec<Entry>, epoch: u64) -> Option<Vec<Entry>> {
        let last = batch.last()?.position;
        let next = ml.next_valid_position(last);
        let mut cs = self.state.lock();
        if cs.read_epoch != epoch {
            return None;
        }
        cs.read_position = next;
        Some(batch.into_iter().filter(|e| e.position > cs.mark_delete && !cs.deleted.contains(e.position)).collect())
    }

    /// What [`Cursor::read_entries`] would return when the entry cache holds it, without
    /// waiting, moving the read position past it; None (and nothing moved) when the next
    /// entry is not cached or a read is under way. Dispatchers of new entries, which are
    /// in the cache, need no trip through the runtime for them.
    pub fn read_cached(&self, max: usize) -> Option<Vec<Entry>> {
        self.check_open().ok()?;
        let ml = self.ml().ok()?;
        let _reading = self.read_lock.try_lock().ok()?;
        let (from, epoch) = self.read_from();
        self.take_read(&ml, ml.read_cached(from, max), epoch)
    }

    /// Like [`Cursor::read_entries`], but when nothing is available wait until entries
    /// are added (or the managed ledger closes, which is an error). Cancel by dropping.
    pub async fn read_entries_or_wait(&self, max: usize) -> Result<Vec<Entry>> {
        let ml = self.ml()?;
        let mut added = ml.new_entries();
        loop {
            added.borrow_and_update();
            let entries = self.read_entries(max).await?;
            if !entries.is_empty() {
                return Ok(entries);
            }
            ml.check_open()?;
            if added.changed().await.is_err() {
                return Err(StreamError::Closed(self.ml_name.clone()));
            }
        }
    }

    /// Whether entries are available to read at the read position.
    pub fn has_more_entries(&self) -> bool {
        let Ok(ml) = self.ml() else { return false };
        let st = ml.state.lock();
        let read = self.state.lock().read_position;
        st.last_confirmed.is_some_and(|last| st.normalize(read) <= last)
    }

    /// Acknowledge everything up to and including `pos` (cumulative acknowledgement).
    /// A position at or before the current mark-delete position changes nothing.
    pub async fn mark_delete(&self, pos: Position) -> Result<()> {
        self.check_open()?;
        let ml = self.ml()?;
        let ledger_changed = {
            let st = ml.state.lock();
            match st.last_confirmed {
                Some(last) if pos <= last => {}
                _ => return Err(StreamError::InvalidPosition(format!("{pos} is beyond the last entry"))),
            }
            let mut cs = self.state.lock();
            if pos <= cs.mark_delete {
                return Ok(());
            }
            let before = cs.mark_delete.ledger_id;
            cs.mark_delete = pos;
            cs.deleted.remove_up_to(pos);
            advance_mark_delete(&st, &mut cs);
            prune_batch_acks(&mut cs);
            let first_unacked = st.next_valid(cs.mark_delete);
            if cs.read_position < first_unacked {
                cs.read_position = first_unacked;
            }
            cs.generation += 1;
            cs.mark_delete.ledger_id != before
        };
        self.after_change(ledger_changed).await
    }

    /// Acknowledge individual entries. Positions at or before the mark-delete position are
    /// ignored; a position beyond the last confirmed entry is an error (and nothing changes).
    pub async fn delete(&self, positions: &[Position]) -> Result<()> {
        self.check_open()?;
        let ml = self.ml()?;
        let ledger_changed = {
            let st = ml.state.lock();
            let last = st.last_confirmed;
            let mut cs = self.state.lock();
            let missing = |p: &Position| last.is_none_or(|l| *p > l) || p.entry_id < 0 || st.normalize(*p) != *p;
            if let Some(bad) = positions.iter().find(|p| **p > cs.mark_delete && missing(p)) {
                return Err(StreamError::InvalidPosition(format!("{bad} is not a written entry")));
            }
            let before = cs.mark_delete.ledger_id;
            let mut changed = false;
            for p in positions {
                if *p > cs.mark_delete && !cs.deleted.contains(*p) {
                    cs.deleted.insert(*p);
                    cs.batch_acks.remove(p);
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
            advance_mark_delete(&st, &mut cs);
            prune_batch_acks(&mut cs);
            let first_unacked = st.next_valid(cs.mark_delete);
            if cs.read_position < first_unacked {
                cs.read_position = first_unacked;
            }
            cs.generation += 1;
            cs.mark_delete.ledger_id != before
        };
        self.after_change(ledger_changed).await
    }

    /// Record batch-index acknowledgements: for each entry, the ack set whose set bits
    /// are the messages still unacknowledged (replacing what was recorded for it). An
    /// entry at or before the mark-delete position, or wholly acknowledged, is skipped.
    pub async fn set_batch_acks(&self, acks: &[(Position, Vec<i64>)]) -> Result<()> {
        self.check_open()?;
        {
            let mut cs = self.state.lock();
            let mut changed = false;
            for (p, ack_set) in acks {
                if *p > cs.mark_delete && !cs.deleted.contains(*p) && cs.batch_acks.get(p) != Some(ack_set) {
                    cs.batch_acks.insert(*p, ack_set.clone());
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
            cs.generation += 1;
        }
        self.after_change(false).await
    }

    /// The batch-index acknowledgements recorded (see [`Cursor::set_batch_acks`]), in
    /// position order.
    pub fn batch_acks(&self) -> Vec<(Position, Vec<i64>)> {
        self.state.lock().batch_acks.iter().map(|(p, a)| (*p, a.clone())).collect()
    }

    /// Move the read position back to the first unacknowledged entry.
    pub fn rewind(&self) {
        let Ok(ml) = self.ml() else { return };
        let st = ml.state.lock();
        let mut cs = self.state.lock();
        cs.read_position = st.next_valid(cs.mark_delete);
        cs.read_epoch += 1;
    }

    /// Move the read position to `pos` (not before the first unacknowledged entry);
    /// acknowledgements are unchanged.
    pub fn seek(&self, pos: Position) {
        let Ok(ml) = self.ml() else { return };
        let st = ml.state.lock();
        let mut cs = self.state.lock();
        let first_unacked = st.next_valid(cs.mark_delete);
        cs.read_position = st.normalize(pos).max(first_unacked);
        cs.read_epoch += 1;
    }

    /// Reset the subscription to `pos`: everything before it becomes acknowledged, it and
    /// everything after unacknowledged, and reading restarts at it. Persisted at once.
    pub async fn reset_cursor(&self, pos: Position) -> Result<()> {
        self.check_open()?;
        let ml = self.ml()?;
        {
            let st = ml.state.lock();
            let target = st.normalize(pos);
            let mut cs = self.state.lock();
            cs.mark_delete = match st.previous_valid(target) {
                Some(prev) => prev,
                None => target.just_before(),
            };
            cs.deleted.clear();
            cs.batch_acks.clear();
            cs.read_position = target;
            cs.read_epoch += 1;
            cs.generation += 1;
        }
        self.flush().await?;
        ml.schedule_trim();
        Ok(())
    }

    /// Persist the state now if it changed since the last write.
    pub async fn flush(&self) -> Result<()> {
        if !self.durable {
            return Ok(());
        }
        let ml = self.ml()?;
        if ml.status() == crate::managed_ledger::MlStatus::Fenced {
            return Err(StreamError::Fenced(self.ml_name.clone()));
        }
        let mut version = self.persist.lock().await;
        let (json, generation) = {
            let rec = self.record(ml.config.clock.now_ms(), ml.config.max_unacked_ranges_to_persist);
            let st = self.state.lock();
            if st.closed || st.generation == st.persisted_generation {
                return Ok(());
            }
            (to_json(&rec)?, st.generation)
        };
        let path = cursor_path(&self.ml_name, &self.name);
        let expected = *version;
        let v = meta_call(&ml.meta, move |m| m.put(&path, &json, Some(expected))).await?;
        *version = v;
        let mut st = self.state.lock();
        st.persisted_generation = st.persisted_generation.max(generation);
        st.last_persist = Some(Instant::now());
        Ok(())
    }

    /// Flush and stop accepting changes.
    pub async fn close(&self) -> Result<()> {
        let r = self.flush().await;
        self.mark_closed();
        r
    }

    /// After a change: persist now when the rate limit allows, else schedule a flush.
    async fn after_change(&self, ledger_changed: bool) -> Result<()> {
        if !self.durable {
            return Ok(());
        }
        let ml = self.ml()?;
        let rate = ml.config.mark_delete_rate_per_sec;
        let wait = if rate > 0.0 {
            let interval = Duration::from_secs_f64(1.0 / rate);
            let last = self.state.lock().last_persist;
            last.and_then(|t| interval.checked_sub(t.elapsed())).filter(|d| !d.is_zero())
        } else {
            None
        };
        match wait {
            None => self.flush().await?,
            Some(delay) => self.schedule_flush(delay),
        }
        if ledger_changed {
            ml.schedule_trim();
        }
        Ok(())
    }

    fn schedule_flush(&self, delay: Duration) {
        if self.flush_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let (Some(me), Ok(rt)) = (self.me.upgrade(), tokio::runtime::Handle::try_current()) else {
            // Nothing to run the delayed write on: the next change, flush or close writes it.
            self.flush_scheduled.store(false, Ordering::Release);
            return;
        };
        rt.spawn(async move {
            tokio::time::sleep(delay).await;
            me.flush_scheduled.store(false, Ordering::Release);
            if let Err(e) = me.flush().await {
                log::warn!("cursor {} of {}: delayed flush failed: {e}", me.name, me.ml_name);
            }
        });
    }
}

/// Fold individually deleted ranges that continue the mark-delete position into it.
/// Drop the batch-index acknowledgements of entries now wholly acknowledged.
fn prune_batch_acks(cs: &mut CursorState) {
    let md = cs.mark_delete;
    let deleted = &cs.deleted;
    cs.batch_acks.retain(|p, _| *p > md && !deleted.contains(*p));
}

fn advance_mark_delete(st: &crate::managed_ledger::MlState, cs: &mut CursorState) {
    loop {
        let next = st.next_valid(cs.mark_delete);
        match cs.deleted.range_containing(next) {
            Some((_, last)) => {
                cs.mark_delete = Position::new(next.ledger_id, last);
                let md = cs.mark_delete;
                cs.deleted.remove_up_to(md);
            }
            None => break,
        }
    }
}
