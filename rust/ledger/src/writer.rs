//! The write path: striped adds, quorum acks, in-order confirmation, ensemble change, close.
//!
//! Theory of operation. Every add gets the next entry id and joins the pending queue; its
//! framed bytes are sent to the `Qw` slots of its write set. A batch of adds
//! ([`LedgerHandle::add_entries`]) takes consecutive ids under one lock and goes to each
//! bookie as few ADD_BATCH requests (one task each, at most [`MAX_BATCH_BYTES`] of data per
//! request, and never a frame longer than the client's `max_frame_size`, see [`batches`]),
//! and only its last entry carries a completion: entries confirm in order, so the
//! batch is done when its last entry is. An answer is applied under the handle lock: an ack
//! marks the slot of every entry it covers, and the queue head is confirmed while it holds
//! `Qa` acks, so confirmations and the last add confirmed advance strictly in entry-id order.
//!
//! When a bookie fails (I/O error, timeout, server error) its slot is marked failed and its
//! epoch bumped, so late answers from it no longer count, and one ensemble-change task
//! runs: it picks replacements outside the ensemble, writes the fragment
//! `[last add confirmed + 1, new ensemble]` into the metadata with compare-and-set, then
//! re-sends every pending entry to the new bookies of its write set. Entries below the new
//! fragment are confirmed, so nothing acknowledged moves. If no replacement exists but
//! every write set still holds `Qa` working bookies, writing goes on without the failed
//! one; otherwise the handle breaks.
//!
//! A broken handle (fenced, no bookies, metadata failure) fails every pending add and every
//! later one with the same error: the caller opens a new ledger. An entry too large for one
//! frame is refused before it takes an id ([`LedgerError::EntryTooLarge`]): nothing is sent,
//! and the handle goes on.

use std::sync::Arc;

use bytes::Bytes;
use magnetar_bookie::FrameLimit;
use tokio::sync::oneshot;

use crate::entry::{self, Payload};
use crate::error::{LedgerError, Result};
use crate::handle::{AckedSlots, HandleInner, LedgerHandle, PendingAdd, State};
use crate::metadata::LedgerState;
use crate::quorum::{min_over_write_sets, write_set};
use crate::transport::BookieError;

/// The most entry bytes one ADD_BATCH request to a bookie carries; a larger batch of adds
/// goes as several requests, pipelined.
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// The most entries one ADD_BATCH request carries.
pub const MAX_BATCH_ENTRIES: usize = 4096;

/// Split `entries` (framed, in entry order) into the groups that go as one ADD_BATCH
/// request each: at most [`MAX_BATCH_BYTES`] of data (or one larger entry alone) and
/// [`MAX_BATCH_ENTRIES`] entries, in a frame no longer than `limit`. Every entry must fit a
/// frame on its own ([`FrameLimit::max_entry`]).
pub(crate) fn batches(entries: Vec<(u64, Bytes)>, limit: FrameLimit) -> Vec<Vec<(u64, Bytes)>> {
    let mut out = Vec::new();
    let mut chunk: Vec<(u64, Bytes)> = Vec::new();
    let mut bytes = 0usize;
    for (entry, framed) in entries {
        let more = bytes + framed.len();
        if !chunk.is_empty()
            && (more > MAX_BATCH_BYTES || chunk.len() >= MAX_BATCH_ENTRIES || !limit.fits_batch(chunk.len() + 1, more))
        {
            out.push(std::mem::take(&mut chunk));
            bytes = 0;
        }
        bytes += framed.len();
        chunk.push((entry, framed));
    }
    if !chunk.is_empty() {
        out.push(chunk);
    }
    out
}

impl LedgerHandle {
    /// Append one entry; resolves to its entry id once an ack quorum has stored it and
    /// every earlier entry is confirmed.
    pub async fn add_entry(&self, data: Bytes) -> Result<u64> {
        let rx = self.inner.submit(data);
        recv(rx).await
    }

    /// Append many entries with all of them in flight at once; the ids come back in order.
    /// Fails with the first failing add's error. A batch holding an entry larger than one
    /// frame holds ([`BookKeeper::max_entry_size`](crate::BookKeeper::max_entry_size)) is
    /// refused whole, with [`LedgerError::EntryTooLarge`]; the handle goes on.
    /// Entries may be [`Bytes`] or two-piece [`Payload`]s.
    pub async fn add_entries<P: Into<Payload>>(&self, entries: Vec<P>) -> Result<Vec<u64>> {
        let entries: Vec<Payload> = entries.into_iter().map(Into::into).collect();
        for data in &entries {
            self.inner.bk.check_entry_size(data.len())?;
        }
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let count = entries.len() as u64;
        let rx = self.inner.submit_batch(entries);
        let last = recv(rx).await?;
        let first = (last + 1).saturating_sub(count);
        Ok((first..=last).collect())
    }

    /// Start an add without waiting: the entry id is assigned now, in call order, and the
    /// returned future resolves when the add is confirmed. Needs no runtime context of
    /// the caller, so bindings can pipeline adds from any thread.
    pub fn add_entry_pipelined(&self, data: Bytes) -> impl std::future::Future<Output = Result<u64>> + Send + 'static {
        let rx = self.inner.submit(data);
        recv(rx)
    }

    /// Wait for the pending adds, then close the ledger: its metadata becomes CLOSED with
    /// the last add confirmed as `lastEntryId` and the confirmed length. Later adds fail
    /// with [`LedgerError::LedgerClosed`]. Closing a read-only handle only marks it closed.
    pub async fn close(&self) -> Result<()> {
        let inner = &self.inner;
        {
            let mut st = inner.state.lock();
            if !st.writable || st.closed {
                st.closed = true;
                return Ok(());
            }
            st.closing = true;
        }
        loop {
            let notified = inner.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = inner.state.lock();
                if st.pending.is_empty() && !st.changing {
                    break;
                }
            }
            notified.await;
        }
        let (cached, lac, length) = {
            let st = inner.state.lock();
            ((st.meta.clone(), st.version), st.lac, st.length)
        };
        let updated = inner
            .bk
            .meta
            .update_ledger(inner.id, cached, |m| match m.state {
                LedgerState::Open => {
                    m.state = LedgerState::Closed;
                    m.last_entry_id = lac;
                    m.length = length;
                    Ok(true)
                }
                // Recovery closed it and kept everything this writer confirmed.
                LedgerState::Closed if m.last_entry_id >= lac => Ok(false),
                LedgerState::Closed | LedgerState::InRecovery => Err(LedgerError::Fenced),
            })
            .await?;
        let mut st = inner.state.lock();
        st.meta = updated.0;
        st.version = updated.1;
        st.closed = true;
        Ok(())
    }
}

async fn recv(rx: oneshot::Receiver<Result<u64>>) -> Result<u64> {
    rx.await.unwrap_or_else(|_| Err(LedgerError::Runtime("add dropped before completion".into())))
}

impl HandleInner {
    /// Queue an add and send it to its write set.
    pub(crate) fn submit(self: &Arc<Self>, data: Bytes) -> oneshot::Receiver<Result<u64>> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.lock();
        let refused = if !st.writable {
            Some(LedgerError::ReadOnly)
        } else if let Some(e) = &st.broken {
            Some(e.clone())
        } else if st.closing || st.closed {
            Some(LedgerError::LedgerClosed)
        } else {
            self.bk.check_entry_size(data.len()).err()
        };
        if let Some(e) = refused {
            let _ = tx.send(Err(e));
            return rx;
        }
        let entry = st.next_entry;
        st.next_entry += 1;
        st.pushed_length = st.pushed_length.saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
        let length = st.pushed_length;
        let framed = entry::encode(self.id, entry, length, &data);
        let slots: Vec<usize> = write_set(entry, st.meta.ensemble_size, st.meta.write_quorum_size)
            .filter(|slot| !st.failed_slots.contains(slot))
            .collect();
        st.pending.push_back(PendingAdd { entry, framed: framed.clone(), length, acked: AckedSlots::default(), done: Some(tx) });
        for slot in slots {
            self.send(&st, entry, slot, framed.clone());
        }
        rx
    }

    /// Queue a batch of adds with consecutive entry ids and send it, grouped per bookie of
    /// the write sets. The receiver resolves with the last entry's id once every entry of the
    /// batch is confirmed, or with the error that broke the handle.
    pub(crate) fn submit_batch(self: &Arc<Self>, entries: Vec<Payload>) -> oneshot::Receiver<Result<u64>> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.lock();
        let refused = if !st.writable {
            Some(LedgerError::ReadOnly)
        } else if let Some(e) = &st.broken {
            Some(e.clone())
        } else if st.closing || st.closed {
            Some(LedgerError::LedgerClosed)
        } else {
            None
        };
        if let Some(e) = refused {
            let _ = tx.send(Err(e));
            return rx;
        }
        let (ensemble, write_quorum) = (st.meta.ensemble_size, st.meta.write_quorum_size);
        let mut per_slot: Vec<Vec<(u64, Bytes)>> = vec![Vec::new(); ensemble];
        let last_index = entries.len().saturating_sub(1);
        let mut done = Some(tx);
        for (i, data) in entries.into_iter().enumerate() {
            let entry = st.next_entry;
            st.next_entry += 1;
            st.pushed_length = st.pushed_length.saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
            let length = st.pushed_length;
            let framed = entry::encode_parts(self.id, entry, length, &data.head, &data.body);
            for slot in write_set(entry, ensemble, write_quorum) {
                if !st.failed_slots.contains(&slot) {
                    if let Some(group) = per_slot.get_mut(slot) {
                        group.push((entry, framed.clone()));
                    }
                }
            }
            let done = if i == last_index { done.take() } else { None };
            st.pending.push_back(PendingAdd { entry, framed, length, acked: AckedSlots::default(), done });
        }
        let limit = self.bk.config.max_frame_size;
        for (slot, group) in per_slot.into_iter().enumerate() {
            for chunk in batches(group, limit) {
                self.send_batch(&st, slot, chunk);
            }
        }
        rx
    }

    /// Send `entries` to the bookie in `slot`: one ADD_BATCH, or a plain ADD for one entry.
    fn send_batch(self: &Arc<Self>, st: &State, slot: usize, mut entries: Vec<(u64, Bytes)>) {
        if entries.len() == 1 {
            if let Some((entry, framed)) = entries.pop() {
                self.send(st, entry, slot, framed);
            }
            return;
        }
        let Some(addr) = st.meta.current_ensemble().get(slot).cloned() else { return };
        let epoch = st.slot_epoch.get(slot).copied().unwrap_or(0);
        let lac = st.lac;
        let this = Arc::clone(self);
        self.runtime.spawn(async move {
            let ids: Vec<u64> = entries.iter().map(|(e, _)| *e).collect();
            let result = this.bk.transport.add_batch(&addr, this.id, lac, entries, false).await;
            this.on_batch_result(&ids, slot, epoch, &addr, result);
        });
    }

    fn on_batch_result(
        self: &Arc<Self>,
        ids: &[u64],
        slot: usize,
        epoch: u64,
        addr: &str,
        result: Result<(), BookieError>,
    ) {
        let mut st = self.state.lock();
        if st.broken.is_some() || st.slot_epoch.get(slot).copied() != Some(epoch) {
            return;
        }
        match result {
            Ok(()) => {
                for &entry in ids {
                    self.mark_acked(&mut st, entry, slot);
                }
                self.complete_ready(&mut st);
            }
            Err(BookieError::Fenced) => self.fail(&mut st, LedgerError::Fenced),
            Err(BookieError::BadRequest(reason)) => self.fail(
                &mut st,
                LedgerError::Bookie(format!("bookie {addr} rejected a batch of {} entries: {reason}", ids.len())),
            ),
            Err(e) => {
                log::warn!("ledger {}: bookie {addr} failed a batch of {} entries: {e}", self.id, ids.len());
                self.bookie_failed(&mut st, slot, addr);
            }
        }
    }

    /// Record that the bookie in `slot` stored `entry`, if it is still pending.
    fn mark_acked(&self, st: &mut State, entry: u64, slot: usize) {
        let head = st.pending.front().map(|p| p.entry);
        let index = head.and_then(|h| entry.checked_sub(h)).and_then(|i| usize::try_from(i).ok());
        if let Some(p) = index.and_then(|i| st.pending.get_mut(i)) {
            if p.entry == entry {
                p.acked.insert(slot);
            }
        }
    }

    /// Send `entry` to the bookie in `slot` of the current ensemble.
    fn send(self: &Arc<Self>, st: &State, entry: u64, slot: usize, framed: Bytes) {
        let Some(addr) = st.meta.current_ensemble().get(slot).cloned() else { return };
        let epoch = st.slot_epoch.get(slot).copied().unwrap_or(0);
        let lac = st.lac;
        let this = Arc::clone(self);
        self.runtime.spawn(async move {
            let result = this.bk.transport.add(&addr, this.id, entry, lac, framed, false).await;
            this.on_add_result(entry, slot, epoch, &addr, result);
        });
    }

    fn on_add_result(
        self: &Arc<Self>,
        entry: u64,
        slot: usize,
        epoch: u64,
        addr: &str,
        result: Result<(), BookieError>,
    ) {
        let mut st = self.state.lock();
        if st.broken.is_some() || st.slot_epoch.get(slot).copied() != Some(epoch) {
            return;
        }
        match result {
            Ok(()) => {
                self.mark_acked(&mut st, entry, slot);
                self.complete_ready(&mut st);
            }
            Err(BookieError::Fenced) => self.fail(&mut st, LedgerError::Fenced),
            Err(BookieError::BadRequest(reason)) => {
                self.fail(&mut st, LedgerError::Bookie(format!("bookie {addr} rejected entry {entry}: {reason}")))
            }
            Err(e) => {
                log::warn!("ledger {}: bookie {addr} failed entry {entry}: {e}", self.id);
                self.bookie_failed(&mut st, slot, addr);
            }
        }
    }

    /// Confirm the queue head while it has an ack quorum.
    fn complete_ready(&self, st: &mut State) {
        let ack_quorum = st.meta.ack_quorum_size;
        while st.pending.front().is_some_and(|p| p.acked.len() >= ack_quorum) {
            let Some(mut p) = st.pending.pop_front() else { break };
            st.lac = i64::try_from(p.entry).unwrap_or(i64::MAX);
            st.length = p.length;
            if let Some(done) = p.done.take() {
                let _ = done.send(Ok(p.entry));
            }
        }
        if st.pending.is_empty() {
            self.idle.notify_waiters();
        }
    }

    /// Break the handle: fail every pending add, and every later one, with `err`.
    pub(crate) fn fail(&self, st: &mut State, err: LedgerError) {
        if st.broken.is_none() {
            log::warn!("ledger {}: writer broken: {err}", self.id);
            st.broken = Some(err.clone());
        }
        for mut p in st.pending.drain(..) {
            if let Some(done) = p.done.take() {
                let _ = done.send(Err(err.clone()));
            }
        }
        self.idle.notify_waiters();
    }

    fn bookie_failed(self: &Arc<Self>, st: &mut State, slot: usize, addr: &str) {
        if st.failed_slots.insert(slot) {
            if let Some(epoch) = st.slot_epoch.get_mut(slot) {
                *epoch += 1;
            }
            for p in st.pending.iter_mut() {
                p.acked.remove(slot);
            }
            st.excluded.insert(addr.to_string());
            self.bk.mark_failed(addr);
        }
        if !st.changing {
            st.changing = true;
            let this = Arc::clone(self);
            self.runtime.spawn(async move { this.change_ensemble().await });
        }
    }

    fn end_change(&self, st: &mut State) {
        st.changing = false;
        self.idle.notify_waiters();
    }

    /// Replace failed bookies until none is left to replace (see the module docs).
    async fn change_ensemble(self: Arc<Self>) {
        loop {
            let (failed, ensemble, cached, excluded, start) = {
                let mut st = self.state.lock();
                if st.broken.is_some() || st.failed_slots.is_empty() {
                    self.end_change(&mut st);
                    return;
                }
                let excluded: Vec<String> = st.excluded.iter().cloned().collect();
                let start = u64::try_from(st.lac + 1).unwrap_or(0);
                (
                    st.failed_slots.clone(),
                    st.meta.current_ensemble().to_vec(),
                    (st.meta.clone(), st.version),
                    excluded,
                    start,
                )
            };
            let (e, qw, qa) = (cached.0.ensemble_size, cached.0.write_quorum_size, cached.0.ack_quorum_size);
            let mut exclude = ensemble.clone();
            exclude.extend(excluded);
            let candidates = match self.bk.pick_up_to(failed.len(), &exclude).await {
                Ok(c) => c,
                Err(err) => {
                    let mut st = self.state.lock();
                    self.fail(&mut st, err);
                    self.end_change(&mut st);
                    return;
                }
            };
            let replaced: Vec<(usize, String)> = failed.iter().copied().zip(candidates).collect();
            let unreplaced = |slot: usize| failed.contains(&slot) && !replaced.iter().any(|(s, _)| *s == slot);
            if min_over_write_sets(e, qw, |slot| !unreplaced(slot)) < qa {
                let mut st = self.state.lock();
                self.fail(&mut st, LedgerError::NotEnoughBookies);
                self.end_change(&mut st);
                return;
            }
            if replaced.is_empty() {
                // Degraded: every write set still reaches Qa without the failed bookies.
                let mut st = self.state.lock();
                if st.failed_slots == failed {
                    log::warn!("ledger {}: no replacement for slots {failed:?}; writing on without them", self.id);
                    self.end_change(&mut st);
                    return;
                }
                continue;
            }
            let mut new_ensemble = ensemble.clone();
            for (slot, addr) in &replaced {
                if let Some(s) = new_ensemble.get_mut(*slot) {
                    s.clone_from(addr);
                }
            }
            let fragment = new_ensemble.clone();
            let updated = self
                .bk
                .meta
                .update_ledger(self.id, cached, |m| {
                    if m.state != LedgerState::Open {
                        return Err(LedgerError::Fenced);
                    }
                    match m.ensembles.last_mut() {
                        Some((first, bookies)) if *first == start => bookies.clone_from(&fragment),
                        Some((first, _)) if *first < start => m.ensembles.push((start, fragment.clone())),
                        _ => {
                            return Err(LedgerError::BadMetadata {
                                path: crate::metadata::ledger_path(self.id),
                                reason: format!("a fragment starts after entry {start}, which is not confirmed"),
                            })
                        }
                    }
                    Ok(true)
                })
                .await;
            let mut st = self.state.lock();
            let (meta, version) = match updated {
                Ok(v) => v,
                Err(err) => {
                    self.fail(&mut st, err);
                    self.end_change(&mut st);
                    return;
                }
            };
            if st.broken.is_some() {
                self.end_change(&mut st);
                return;
            }
            log::info!("ledger {}: ensemble change at entry {start}: {ensemble:?} -> {new_ensemble:?}", self.id);
            st.meta = meta;
            st.version = version;
            for (slot, _) in &replaced {
                st.failed_slots.remove(slot);
                if let Some(epoch) = st.slot_epoch.get_mut(*slot) {
                    *epoch += 1;
                }
            }
            let mut resend = Vec::new();
            for p in st.pending.iter_mut() {
                for (slot, _) in &replaced {
                    if write_set(p.entry, e, qw).any(|s| s == *slot) {
                        p.acked.remove(*slot);
                        resend.push((p.entry, *slot, p.framed.clone()));
                    }
                }
            }
            for (entry, slot, framed) in resend {
                self.send(&st, entry, slot, framed);
            }
        }
    }
}
