//! The append path: one queue, drained by one task, written as pipelined batches.
//!
//! `add_entries` queues a request and, if no drain task runs, spawns one. The drain task
//! takes everything queued (up to [`MAX_ROUND_ENTRIES`]) as a round, assigns each entry its
//! broker metadata in queue order, and writes the round to the current ledger. A round that
//! fits the current ledger is handed to it at once and the task goes on with the next
//! round while it is in flight (up to [`MAX_ROUNDS_IN_FLIGHT`]): the ledger takes entry ids
//! in call order and confirms them in order, so rounds are confirmed and answered in queue
//! order. A round that does not fit (the ledger is full or missing) waits for the rounds in
//! flight, then is written on its own, split where the ledger fills up, rolling over in
//! between. If the ledger fails (not enough
//! bookies, a bookie error), the ledger is sealed at what it confirmed, a new ledger is
//! created and the unconfirmed rest of the round is written again, once; a second failure
//! fails the rest of the round and every add queued behind it (their callers resend from
//! the failed entries on, in order), and the indexes they would have taken are reused by
//! the next round. A *fenced* ledger is different: another owner has recovered it and owns the
//! topic now, so the managed ledger becomes fenced and writes nothing more (creating a
//! ledger would race the new owner for the record).
//! Because the drain task is spawned, a caller that stops waiting does not stop the write.
//! An entry larger than the ledger store takes ([`ManagedLedger::max_entry_size`]) is
//! refused with its request before it is queued, so it never fails a round or a ledger.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use crate::entry::{Entry, EntryHeader, HEADER_LEN};
use crate::error::{Result, StreamError};
use crate::managed_ledger::{entries_i64, AddResult, ManagedLedger, MlState, MlStatus, PROBE_EVERY};
use crate::position::Position;
use crate::records::LedgerInfo;
use crate::store::{Ledger, LedgerStoreError, Payload};

/// Most entries one drain round takes from the queue.
pub const MAX_ROUND_ENTRIES: usize = 10_000;

/// Most rounds one managed ledger has handed to its ledger and not seen confirmed yet.
pub const MAX_ROUNDS_IN_FLIGHT: usize = 16;

type WriteFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::result::Result<Vec<u64>, LedgerStoreError>> + Send>,
>;

/// A round handed to the current ledger, waiting for its confirmation.
struct InFlight {
    round: Vec<PendingAdd>,
    prepared: Vec<Prepared>,
    handle: Arc<dyn Ledger>,
    ledger: u64,
    /// The entry id the ledger gives the round's first entry.
    first_id: u64,
    /// Stored bytes of the round.
    bytes: u64,
    write: WriteFuture,
}

enum Submitted {
    InFlight(InFlight),
    /// Refused at once (the managed ledger is closed); the callers have their answer.
    Answered,
    /// The round does not fit the current ledger as it is: write it with nothing in flight.
    SlowPath(Vec<PendingAdd>, Vec<Prepared>),
}

/// Answer each request of a round from the confirmed results, in order; the requests past
/// what was confirmed get `err`.
fn answer(round: Vec<PendingAdd>, done: &[AddResult], err: Option<StreamError>, name: &str) {
    let mut at = 0;
    for req in round {
        let n = req.entries.len();
        let reply = if at + n <= done.len() {
            Ok(done[at..at + n].to_vec())
        } else {
            Err(err.clone().unwrap_or_else(|| StreamError::Closed(name.to_string())))
        };
        at += n;
        req.tx.send(reply);
    }
}

/// The callback of [`ManagedLedger::start_add_entries`].
pub type AddCallback = Box<dyn FnOnce(Result<Vec<AddResult>>) + Send>;

/// Where a request's results go, called where the round is answered (in the drain task):
/// exactly once, for a reply dropped unanswered (the managed ledger went away with the
/// request queued) is told the managed ledger is closed.
pub(crate) struct Reply {
    f: Option<AddCallback>,
    name: String,
}

impl Reply {
    fn send(mut self, result: Result<Vec<AddResult>>) {
        if let Some(f) = self.f.take() {
            f(result);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(f) = self.f.take() {
            f(Err(StreamError::Closed(std::mem::take(&mut self.name))));
        }
    }
}

pub(crate) struct PendingAdd {
    entries: Vec<(Bytes, u32)>,
    tx: Reply,
}

pub(crate) enum Request {
    Add(PendingAdd),
    /// Roll over if the current ledger is due (age, size, entries); answers whether it did.
    Rollover(oneshot::Sender<Result<bool>>),
}

impl Request {
    /// Answer the request with `err`, unserved.
    fn fail(self, err: &StreamError) {
        match self {
            Request::Add(add) => add.tx.send(Err(err.clone())),
            Request::Rollover(tx) => {
                let _ = tx.send(Err(err.clone()));
            }
        }
    }
}

pub(crate) struct AddQueue {
    pub(crate) pending: VecDeque<Request>,
    pub(crate) running: bool,
}

enum Round {
    Adds(Vec<PendingAdd>),
    Rollover(oneshot::Sender<Result<bool>>),
}

struct Prepared {
    /// The encoded `header`, stored in front of the payload.
    head: Bytes,
    payload: Bytes,
    header: EntryHeader,
}

impl Prepared {
    /// Bytes the entry takes in the ledger.
    fn stored_len(&self) -> u64 {
        (self.head.len() + self.payload.len()) as u64
    }

    fn data(&self) -> Payload {
        Payload { head: self.head.clone(), body: self.payload.clone() }
    }

    fn first_index(&self) -> u64 {
        (self.header.index + 1).saturating_sub(u64::from(self.header.num_messages))
    }
}

impl ManagedLedger {
    /// Append a batch of entries, each `(payload, number of messages in it)`; returns
    /// where each landed, in order. Entries of concurrent calls are written in the order
    /// the calls were made, pipelined with one another.
    pub async fn add_entries(&self, entries: Vec<(Bytes, u32)>) -> Result<Vec<AddResult>> {
        let (tx, rx) = oneshot::channel();
        self.start_add_entries(entries, Box::new(move |result| {
            let _ = tx.send(result);
        }));
        rx.await.map_err(|_| StreamError::Closed(self.name.clone()))?
    }

    /// [`add_entries`](Self::add_entries) without a future to await: `done` gets its
    /// result, exactly once, from the task that writes the entries (or at once, for a
    /// request refused before it is queued). A caller that needs no task of its own so
    /// spares the wake-up between the writer and that task. Needs a tokio runtime
    /// context, as appends do.
    pub fn start_add_entries(&self, entries: Vec<(Bytes, u32)>, done: AddCallback) {
        if entries.is_empty() {
            return done(Ok(Vec::new()));
        }
        if entries.iter().any(|(_, n)| *n == 0) {
            return done(Err(StreamError::InvalidArgument("an entry must hold at least one message".into())));
        }
        let max = self.max_entry_size();
        if let Some((big, _)) = entries.iter().find(|(data, _)| data.len() > max) {
            return done(Err(StreamError::InvalidArgument(format!(
                "an entry of {} bytes is larger than the {max} bytes one entry may hold here",
                big.len()
            ))));
        }
        let reply = Reply { f: Some(done), name: self.name.clone() };
        // A refusal here has answered the request already.
        let _ = self.enqueue(Request::Add(PendingAdd { entries, tx: reply }));
    }

    /// Seal the current ledger and start a new one if it is due: older than
    /// `max_rollover_time`, or past `min_rollover_time` and full by entries or size.
    /// Appends only check this when they come, so a broker calls it on a timer to seal
    /// the ledgers of idle topics (which retention by time then measures). Two rules only
    /// this check applies, to a ledger holding entries that has received none for a while
    /// (see `idle_seal`): `inactive_rollover_time`, and a positive retention time that
    /// every entry of the ledger has outlived. Returns whether it rolled over. Ordered with
    /// the appends queued before it.
    pub async fn check_rollover(&self) -> Result<bool> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(Request::Rollover(tx))?;
        rx.await.map_err(|_| StreamError::Closed(self.name.clone()))?
    }

    /// Queue `req` for the writer task (started if it is not running). A request refused
    /// (the managed ledger not open, or no runtime to write on) is answered with the error
    /// returned.
    fn enqueue(&self, req: Request) -> Result<()> {
        if let Err(e) = self.check_open() {
            req.fail(&e);
            return Err(e);
        }
        let spawn = {
            let mut q = self.queue.lock();
            q.pending.push_back(req);
            !std::mem::replace(&mut q.running, true)
        };
        if !spawn {
            self.add_queued.notify_one();
        } else {
            let started = match (self.arc(), tokio::runtime::Handle::try_current()) {
                (Ok(me), Ok(rt)) => {
                    rt.spawn(async move { me.drain().await });
                    Ok(())
                }
                (Err(e), _) => Err(e),
                (_, Err(_)) => Err(StreamError::InvalidArgument("appends need a tokio runtime".into())),
            };
            if let Err(e) = started {
                self.queue.lock().running = false;
                self.fail_pending(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    async fn rollover_if_due(&self) -> Result<bool> {
        self.check_open()?;
        let (due, sealed_at, next_index) = {
            let now = self.config.clock.now_ms();
            let mut st = self.state.lock();
            st.evict_cache(now, self.config.cache_eviction_time);
            let idle = self.idle_seal(&st, now);
            (st.current.is_none() || self.is_full(&st, now) || idle.is_some(), idle, st.assign_index)
        };
        if due {
            self.rollover_sealed_at(next_index, sealed_at).await?;
        }
        Ok(due)
    }

    /// Whether the periodic check seals the current ledger for having received no entry
    /// for long enough, and if so the close time to record for it. Only a ledger holding
    /// entries is sealed (the next one is created empty, and an empty one never is).
    /// Past a positive retention time, every entry of the ledger has outlived retention
    /// (Kafka rolls such an active segment so it can be deleted): the recorded close time is
    /// when its last entry was added, so that retention, which counts from a ledger's close,
    /// lets the trim that follows delete it. Past `inactive_rollover_time` (Pulsar's rule)
    /// it closes now, as any rollover does. A ledger written to within both stays.
    fn idle_seal(&self, st: &MlState, now: u64) -> Option<u64> {
        let info = st.ledgers.get(&st.current_id()?)?;
        if info.entries == 0 {
            return None;
        }
        let idle = now.saturating_sub(st.last_add_ms);
        if let Some(retention) = self.config.retention_time.filter(|t| !t.is_zero()) {
            if idle >= duration_ms(retention) {
                return Some(st.last_add_ms);
            }
        }
        match self.config.inactive_rollover_time {
            Some(t) if idle >= duration_ms(t) => Some(now),
            _ => None,
        }
    }

    /// Append one entry of `num_messages` messages.
    pub async fn add_entry(&self, data: Bytes, num_messages: u32) -> Result<AddResult> {
        let mut r = self.add_entries(vec![(data, num_messages)]).await?;
        r.pop().ok_or_else(|| StreamError::Closed(self.name.clone()))
    }

    /// Take the next round off the queue: a rollover, or adds merged up to
    /// [`MAX_ROUND_ENTRIES`]. `None` when nothing is queued.
    fn next_round(&self) -> Option<Round> {
        let mut q = self.queue.lock();
        match q.pending.pop_front()? {
            Request::Rollover(tx) => Some(Round::Rollover(tx)),
            Request::Add(first) => {
                let mut count = first.entries.len();
                let mut taken = vec![first];
                while let Some(Request::Add(next)) = q.pending.front() {
                    if count + next.entries.len() > MAX_ROUND_ENTRIES {
                        break;
                    }
                    count += next.entries.len();
                    if let Some(Request::Add(req)) = q.pending.pop_front() {
                        taken.push(req);
                    }
                }
                Some(Round::Adds(taken))
            }
        }
    }

    async fn drain(self: Arc<Self>) {
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        loop {
            if in_flight.len() < MAX_ROUNDS_IN_FLIGHT {
                match self.next_round() {
                    Some(Round::Adds(adds)) => {
                        match self.submit_round(adds, &in_flight) {
                            Submitted::InFlight(item) => in_flight.push_back(item),
                            Submitted::Answered => {}
                            Submitted::SlowPath(adds, prepared) => {
                                self.settle_all(&mut in_flight).await;
                                self.write_round(adds, prepared).await;
                            }
                        }
                        continue;
                    }
                    Some(Round::Rollover(tx)) => {
                        self.settle_all(&mut in_flight).await;
                        let _ = tx.send(self.rollover_if_due().await);
                        continue;
                    }
                    None => {}
                }
            }
            let room = in_flight.len() < MAX_ROUNDS_IN_FLIGHT;
            let Some(head) = in_flight.front_mut() else {
                let mut q = self.queue.lock();
                if q.pending.is_empty() {
                    q.running = false;
                    self.writer_idle.notify_waiters();
                    return;
                }
                continue;
            };
            if room {
                // Wait for the oldest write, or for more appends to put in flight beside it.
                let completed = tokio::select! {
                    biased;
                    result = &mut head.write => Some(result),
                    () = self.add_queued.notified() => None,
                };
                if let Some(result) = completed {
                    if let Some(item) = in_flight.pop_front() {
                        self.settle(item, result, &mut in_flight).await;
                    }
                }
            } else if let Some(mut item) = in_flight.pop_front() {
                let result = (&mut item.write).await;
                self.settle(item, result, &mut in_flight).await;
            }
        }
    }

    /// Assign the round's entries their metadata and, when the whole round fits the current
    /// ledger, hand it to the ledger now (ids are taken in call order) without waiting.
    fn submit_round(&self, round: Vec<PendingAdd>, in_flight: &VecDeque<InFlight>) -> Submitted {
        if let Err(e) = self.check_open() {
            for req in round {
                req.tx.send(Err(e.clone()));
            }
            return Submitted::Answered;
        }
        let prepared = self.prepare(&round);
        let handle = {
            let now = self.config.clock.now_ms();
            let st = self.state.lock();
            match &st.current {
                Some(h) if !self.is_full(&st, now) => h.clone(),
                _ => return Submitted::SlowPath(round, prepared),
            }
        };
        let lid = handle.id();
        // Rounds in flight count towards the ledger's size limits as if confirmed.
        let (flying, flying_bytes) = in_flight
            .iter()
            .filter(|f| f.ledger == lid)
            .fold((0u64, 0u64), |(n, b), f| (n + f.prepared.len() as u64, b + f.bytes));
        if self.chunk_len_after(lid, &prepared, flying, flying_bytes) < prepared.len() {
            return Submitted::SlowPath(round, prepared);
        }
        let first_id = match in_flight.back() {
            Some(last) if last.ledger == lid => last.first_id + last.prepared.len() as u64,
            Some(_) => return Submitted::SlowPath(round, prepared),
            None => self.state.lock().ledgers.get(&lid).map_or(0, |i| i.entries),
        };
        let data: Vec<Payload> = prepared.iter().map(Prepared::data).collect();
        let bytes = prepared.iter().map(Prepared::stored_len).sum();
        let ledger = handle.clone();
        let mut write: WriteFuture = Box::pin(async move { ledger.add_entries(data).await });
        // Poll once here so the ledger takes the entry ids now, in round order; the drain
        // task polls it again (with its own waker) until it completes.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let std::task::Poll::Ready(result) = write.as_mut().poll(&mut cx) {
            write = Box::pin(std::future::ready(result));
        }
        Submitted::InFlight(InFlight { round, prepared, handle, ledger: lid, first_id, bytes, write })
    }

    /// Wait for every round in flight and settle each, in order.
    async fn settle_all(&self, in_flight: &mut VecDeque<InFlight>) {
        while let Some(mut item) = in_flight.pop_front() {
            let result = (&mut item.write).await;
            self.settle(item, result, in_flight).await;
        }
    }

    /// Confirm and answer a round whose write completed. If it failed, the rounds behind it
    /// (on the same ledger, so failed too) are collected and everything unconfirmed is
    /// written again in order, as one round, the way a failed round is retried.
    async fn settle(
        &self,
        item: InFlight,
        result: std::result::Result<Vec<u64>, LedgerStoreError>,
        in_flight: &mut VecDeque<InFlight>,
    ) {
        let n = item.prepared.len();
        let mut done: Vec<AddResult> = Vec::with_capacity(n);
        let err: StreamError = match result {
            Ok(ids) if ids.len() == n => {
                self.confirm(item.ledger, &item.prepared, &ids, &mut done);
                answer(item.round, &done, None, &self.name);
                return;
            }
            Err(e) => e.into(),
            Ok(ids) => StreamError::Corrupt(format!("ledger {} confirmed {} entries of {n}", item.ledger, ids.len())),
        };
        let lac = item.handle.last_add_confirmed();
        let acked = (lac + 1 - entries_i64(item.first_id)).clamp(0, entries_i64(n as u64));
        let acked = usize::try_from(acked).unwrap_or(0);
        if acked > 0 {
            let ids: Vec<u64> = (item.first_id..item.first_id + acked as u64).collect();
            self.confirm(item.ledger, &item.prepared[..acked], &ids, &mut done);
        }
        log::warn!("managed ledger {}: ledger {} failed after {acked} of {n} entries: {err}", self.name, item.ledger);
        let mut round = item.round;
        let mut rest: Vec<Prepared> = item.prepared.into_iter().skip(acked).collect();
        while let Some(mut later) = in_flight.pop_front() {
            // Ids are confirmed in order, so nothing behind a failed round was confirmed.
            let _ = (&mut later.write).await;
            round.extend(later.round);
            rest.extend(later.prepared);
        }
        let (more, failed) = if matches!(err, StreamError::Ledger(LedgerStoreError::Fenced(_))) {
            // Another owner recovered our ledger: it owns the topic now (see write_prepared).
            self.state.lock().status = MlStatus::Fenced;
            (Vec::new(), Some(StreamError::Fenced(self.name.clone())))
        } else {
            self.abandon_current(item.handle).await;
            self.write_prepared(&rest, true).await
        };
        if failed.is_some() {
            if let Some(first_failed) = rest.get(more.len()) {
                self.state.lock().assign_index = first_failed.first_index();
            }
        }
        done.extend(more);
        self.answer_round(round, &done, failed);
    }

    pub(crate) async fn wait_writer_idle(&self) {
        loop {
            let idle = self.writer_idle.notified();
            if !self.queue.lock().running {
                return;
            }
            idle.await;
        }
    }

    /// Answer a round written in the slow path or settled: from `done`, the rest with
    /// `err`. A round that failed for good fails the adds queued behind it too, as a ledger
    /// fails every add pending behind a failed one. They were made before their callers
    /// could know of the failure, and a caller resends from its first failed entry on, in
    /// order: an add queued behind the failure and stored would land ahead of that resend
    /// (out of order, and for a deduplicating caller, as a newer sequence id that makes the
    /// resend look like a duplicate). Rollover requests stay queued.
    fn answer_round(&self, round: Vec<PendingAdd>, done: &[AddResult], err: Option<StreamError>) {
        let behind = err.clone();
        answer(round, done, err, &self.name);
        if let Some(err) = behind {
            self.fail_queued(&err, |r| matches!(r, Request::Add(_)));
        }
    }

    /// Fail every queued request.
    pub(crate) fn fail_pending(&self, err: &StreamError) {
        self.fail_queued(err, |_| true);
    }

    /// Fail the queued requests that `which` picks; the others stay queued, in order.
    fn fail_queued(&self, err: &StreamError, which: impl Fn(&Request) -> bool) {
        let failed: Vec<Request> = {
            let mut q = self.queue.lock();
            let (failed, kept): (VecDeque<Request>, VecDeque<Request>) = q.pending.drain(..).partition(which);
            q.pending = kept;
            failed.into()
        };
        for req in failed {
            req.fail(err);
        }
    }

    /// Give each entry of the round its broker metadata, in queue order.
    fn prepare(&self, round: &[PendingAdd]) -> Vec<Prepared> {
        let now = self.config.clock.now_ms();
        let mut st = self.state.lock();
        let count = round.iter().map(|r| r.entries.len()).sum();
        let mut out = Vec::with_capacity(count);
        // The headers share one buffer; each payload is copied once, into its ledger frame.
        let mut heads = BytesMut::with_capacity(count * HEADER_LEN);
        for req in round {
            for (payload, n) in &req.entries {
                let publish = now.max(st.last_publish_ms);
                st.last_publish_ms = publish;
                let index = st.assign_index + u64::from(*n) - 1;
                st.assign_index += u64::from(*n);
                let header = EntryHeader { num_messages: *n, publish_time_ms: publish, index };
                header.put(&mut heads);
                out.push(Prepared { head: heads.split().freeze(), payload: payload.clone(), header });
            }
        }
        out
    }

    /// Write a prepared round with nothing else in flight: split where the ledger fills up,
    /// roll over, and retry once on a new ledger (see the module docs).
    async fn write_round(&self, round: Vec<PendingAdd>, prepared: Vec<Prepared>) {
        let (done, err) = self.write_prepared(&prepared, false).await;
        if err.is_some() {
            if let Some(first_failed) = prepared.get(done.len()) {
                self.state.lock().assign_index = first_failed.first_index();
            }
        }
        self.answer_round(round, &done, err);
    }

    /// Write `prepared` in order; `retried` when a ledger already failed under these entries
    /// (one more failure then fails the rest).
    async fn write_prepared(&self, prepared: &[Prepared], mut retried: bool) -> (Vec<AddResult>, Option<StreamError>) {
        let mut done: Vec<AddResult> = Vec::with_capacity(prepared.len());
        while done.len() < prepared.len() {
            let rest = &prepared[done.len()..];
            let handle = match self.writable_ledger(rest[0].first_index()).await {
                Ok(h) => h,
                Err(e) => return (done, Some(e)),
            };
            let lid = handle.id();
            let chunk_len = self.chunk_len(lid, rest);
            let chunk = &rest[..chunk_len];
            let first_id = self.state.lock().ledgers.get(&lid).map_or(0, |i| i.entries);
            let data: Vec<Payload> = chunk.iter().map(Prepared::data).collect();
            match handle.add_entries(data).await {
                Ok(ids) if ids.len() == chunk_len => {
                    self.confirm(lid, chunk, &ids, &mut done);
                    if self.current_full_by_volume() {
                        let next_first = prepared.get(done.len()).map(Prepared::first_index);
                        let first_index = next_first.unwrap_or_else(|| self.state.lock().assign_index);
                        if let Err(e) = self.rollover(first_index).await {
                            log::warn!("managed ledger {}: rollover after ledger {lid} filled failed: {e}", self.name);
                        }
                    }
                }
                outcome => {
                    let err: StreamError = match outcome {
                        Err(e) => e.into(),
                        Ok(ids) => StreamError::Corrupt(format!(
                            "ledger {lid} confirmed {} entries of {chunk_len}",
                            ids.len()
                        )),
                    };
                    let lac = handle.last_add_confirmed();
                    let acked = (lac + 1 - entries_i64(first_id)).clamp(0, entries_i64(chunk_len as u64));
                    let acked = usize::try_from(acked).unwrap_or(0);
                    if acked > 0 {
                        let ids: Vec<u64> = (first_id..first_id + acked as u64).collect();
                        self.confirm(lid, &chunk[..acked], &ids, &mut done);
                    }
                    log::warn!("managed ledger {}: ledger {lid} failed after {acked} of {chunk_len} entries: {err}", self.name);
                    if matches!(err, StreamError::Ledger(LedgerStoreError::Fenced(_))) {
                        // Another owner recovered our ledger: it owns the topic now. Rolling
                        // over would race it for the managed ledger's record, so stop here.
                        self.state.lock().status = MlStatus::Fenced;
                        return (done, Some(StreamError::Fenced(self.name.clone())));
                    }
                    self.abandon_current(handle).await;
                    if retried {
                        return (done, Some(err));
                    }
                    retried = true;
                }
            }
        }
        (done, None)
    }

    /// How many of `rest` go to ledger `lid` before it is full.
    fn chunk_len(&self, lid: u64, rest: &[Prepared]) -> usize {
        self.chunk_len_after(lid, rest, 0, 0)
    }

    /// [`chunk_len`](Self::chunk_len) with `in_flight_entries` entries of
    /// `in_flight_bytes` bytes already handed to the ledger and not confirmed yet.
    fn chunk_len_after(&self, lid: u64, rest: &[Prepared], in_flight_entries: u64, in_flight_bytes: u64) -> usize {
        let now = self.config.clock.now_ms();
        let st = self.state.lock();
        let (entries, size) = st.ledgers.get(&lid).map_or((0, 0), |i| (i.entries, i.size));
        let (entries, size) = (entries + in_flight_entries, size + in_flight_bytes);
        let young = now.saturating_sub(st.current_created_ms) < duration_ms(self.config.min_rollover_time);
        let cap = if young {
            rest.len()
        } else {
            let room = self.config.max_entries_per_ledger.saturating_sub(entries).max(1);
            let max_size = self.config.max_ledger_size_mb.saturating_mul(1 << 20);
            let mut size_so_far = size;
            let mut n = 0usize;
            for p in rest.iter().take(usize::try_from(room).unwrap_or(usize::MAX)) {
                n += 1;
                size_so_far += p.stored_len();
                if size_so_far >= max_size {
                    break;
                }
            }
            n.max(1)
        };
        cap.min(rest.len())
    }

    fn confirm(&self, lid: u64, chunk: &[Prepared], ids: &[u64], done: &mut Vec<AddResult>) {
        let now = self.config.clock.now_ms();
        let mut st = self.state.lock();
        st.evict_cache(now, self.config.cache_eviction_time);
        if let Some(info) = st.ledgers.get_mut(&lid) {
            // Ids come in order: the last is the highest.
            if let Some(last) = ids.last() {
                info.entries = info.entries.max(last + 1);
            }
            info.size += chunk.iter().zip(ids).map(|(p, _)| p.stored_len()).sum::<u64>();
        }
        for (p, id) in chunk.iter().zip(ids) {
            let position = Position::new(lid, entries_i64(*id));
            st.last_confirmed = Some(position);
            st.confirmed_next_index = p.header.index + 1;
            st.cache.insert(Entry {
                position,
                publish_time_ms: p.header.publish_time_ms,
                index: p.header.index,
                num_messages: p.header.num_messages,
                data: p.payload.clone(),
            });
            if position.entry_id % PROBE_EVERY == 0 {
                st.remember_probe(position, p.header.index, p.header.publish_time_ms);
            }
            done.push(AddResult { position, index: p.header.index, publish_time_ms: p.header.publish_time_ms });
        }
        st.entries_added += chunk.len() as u64;
        st.last_add_ms = now;
        drop(st);
        if let Some(tx) = self.new_entries.lock().as_ref() {
            tx.send_modify(|v| *v += chunk.len() as u64);
        }
    }

    fn is_full(&self, st: &MlState, now: u64) -> bool {
        let Some(id) = st.current_id() else { return true };
        let Some(info) = st.ledgers.get(&id) else { return true };
        if info.entries == 0 {
            return false;
        }
        let age = now.saturating_sub(st.current_created_ms);
        if let Some(max) = self.config.max_rollover_time {
            if age >= duration_ms(max) {
                return true;
            }
        }
        if age < duration_ms(self.config.min_rollover_time) {
            return false;
        }
        info.entries >= self.config.max_entries_per_ledger
            || info.size >= self.config.max_ledger_size_mb.saturating_mul(1 << 20)
    }

    fn current_full_by_volume(&self) -> bool {
        let now = self.config.clock.now_ms();
        let st = self.state.lock();
        st.current.is_some() && self.is_full(&st, now)
    }

    async fn writable_ledger(&self, first_index: u64) -> Result<Arc<dyn Ledger>> {
        {
            let now = self.config.clock.now_ms();
            let st = self.state.lock();
            if let Some(h) = &st.current {
                if !self.is_full(&st, now) {
                    return Ok(h.clone());
                }
            }
        }
        self.rollover(first_index).await
    }

    /// Seal the current ledger (if any) and start a new one whose first message will have
    /// index `first_index`.
    pub(crate) async fn rollover(&self, first_index: u64) -> Result<Arc<dyn Ledger>> {
        self.rollover_sealed_at(first_index, None).await
    }

    /// [`rollover`](Self::rollover), recording `sealed_at` (default: now) as the sealed
    /// ledger's close time.
    async fn rollover_sealed_at(&self, first_index: u64, sealed_at: Option<u64>) -> Result<Arc<dyn Ledger>> {
        let old = self.state.lock().current.take();
        if let Some(old) = old {
            let id = old.id();
            if let Err(e) = old.close().await {
                log::warn!("managed ledger {}: closing ledger {id} on rollover: {e}", self.name);
            }
            let now = self.config.clock.now_ms();
            let mut st = self.state.lock();
            if let Some(i) = st.ledgers.get_mut(&id) {
                i.timestamp = sealed_at.unwrap_or(now);
            }
            st.read_handles.insert(id, old);
        }
        let mut custom: BTreeMap<String, String> = self.config.ledger_metadata.clone();
        custom.insert("application".into(), "magnetar".into());
        custom.insert("component".into(), "managed-ledger".into());
        custom.insert("managed-ledger".into(), self.name.clone());
        let handle = self
            .store
            .create_ledger(self.config.ensemble_size, self.config.write_quorum, self.config.ack_quorum, custom)
            .await?;
        let id = handle.id();
        {
            let now = self.config.clock.now_ms();
            let mut st = self.state.lock();
            st.ledgers.insert(id, LedgerInfo { ledger_id: id, entries: 0, size: 0, timestamp: 0, first_index });
            st.current = Some(handle.clone());
            st.current_created_ms = now;
        }
        if let Err(e) = self.persist_record().await {
            {
                let mut st = self.state.lock();
                st.ledgers.remove(&id);
                st.current = None;
            }
            if let Err(del) = self.store.delete_ledger(id).await {
                log::debug!("managed ledger {}: orphan ledger {id} not deleted: {del}", self.name);
            }
            return Err(e);
        }
        Ok(handle)
    }

    /// Stop writing to a failed ledger: seal it at what it confirmed.
    async fn abandon_current(&self, handle: Arc<dyn Ledger>) {
        let id = handle.id();
        {
            let mut st = self.state.lock();
            if st.current_id() == Some(id) {
                st.current = None;
            }
        }
        if let Err(e) = handle.close().await {
            log::debug!("managed ledger {}: closing failed ledger {id}: {e}", self.name);
        }
        let now = self.config.clock.now_ms();
        if let Some(i) = self.state.lock().ledgers.get_mut(&id) {
            i.timestamp = now;
        }
    }
}

pub(crate) fn duration_ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
