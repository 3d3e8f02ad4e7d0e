//! Fencing and recovery of a ledger whose writer may be gone.
//!
//! Theory of operation (BookKeeper's ledger recovery):
//!
//! 1. The metadata goes to IN_RECOVERY with compare-and-set, so the writer can no longer
//!    change its ensemble or close the ledger.
//! 2. The last fragment's bookies are fenced with a fencing read of their last add
//!    confirmed. Once every write set has `Qw - Qa + 1` fenced bookies, no write set can
//!    gather `Qa` acks any more: the writer can confirm nothing new.
//! 3. From the highest last add confirmed reported, entries are read forward with fencing
//!    reads. An entry found on any bookie may have been confirmed, so it is re-added to its
//!    whole write set (recovery adds pass the fence). An entry that `Qw - Qa + 1` bookies
//!    of its write set do not have cannot have been confirmed, nor any after it: recovery
//!    stops there.
//! 4. The metadata is closed with the last recovered entry and its running length.
//!
//! Every entry the writer saw confirmed is at or below the recovered last entry, and
//! readable.

use std::sync::Arc;

use bytes::Bytes;

use crate::client::BkInner;
use crate::entry::{self, DecodedEntry};
use crate::error::{LedgerError, Result};
use crate::handle::LedgerHandle;
use crate::meta_client::Versioned;
use crate::metadata::{LedgerMetadata, LedgerState};
use crate::quorum::{covers, write_set};

enum Probe {
    Found(Bytes, DecodedEntry),
    Missing,
}

fn failure(id: u64, reason: impl Into<String>) -> LedgerError {
    LedgerError::Recovery { ledger: id, reason: reason.into() }
}

/// Recover ledger `id` (not closed when read as `cached`) and open it read-only.
pub(crate) async fn recover(
    bk: &Arc<BkInner>,
    runtime: tokio::runtime::Handle,
    id: u64,
    cached: Versioned,
) -> Result<LedgerHandle> {
    let (meta, version) = bk
        .meta
        .update_ledger(id, cached, |m| match m.state {
            LedgerState::Open => {
                m.state = LedgerState::InRecovery;
                Ok(true)
            }
            LedgerState::InRecovery | LedgerState::Closed => Ok(false),
        })
        .await?;
    if meta.state == LedgerState::Closed {
        return Ok(LedgerHandle::reader(Arc::clone(bk), runtime, id, meta, version, None));
    }
    let lac = fence(bk, id, &meta).await?;
    let mut length = if lac >= 0 {
        let entry = u64::try_from(lac).unwrap_or(0);
        match probe(bk, id, &meta, entry).await? {
            Probe::Found(_, decoded) => decoded.length,
            Probe::Missing => return Err(failure(id, format!("confirmed entry {entry} is missing on its bookies"))),
        }
    } else {
        0
    };
    // Probes read where the writer wrote (the fenced fragments); re-adds go to `current`,
    // which gains a fragment whenever a bookie fails during recovery. Entries are probed
    // and re-added a window at a time, so that bookies group-commit the re-adds.
    let original = Arc::new(meta.clone());
    let mut current = (meta, version);
    let mut last = lac;
    let mut next = u64::try_from(lac + 1).unwrap_or(0);
    loop {
        let (found, reached_end) = probe_window(bk, id, &original, next).await?;
        let copied = copy_window(bk, id, &current.0, &found, last).await?;
        // From the first entry that missed its ack quorum on, entries go one by one: a
        // bookie replaced for it changes where every later entry belongs.
        let mut one_by_one = false;
        for (i, (entry, framed, decoded)) in found.into_iter().enumerate() {
            one_by_one |= !copied.get(i).copied().unwrap_or(false);
            if one_by_one {
                current = replicate(bk, id, current, entry, last, framed).await?;
            }
            last = i64::try_from(entry).unwrap_or(i64::MAX);
            length = decoded.length;
            next = entry + 1;
        }
        if reached_end {
            break;
        }
    }
    log::info!("ledger {id}: recovered, last entry {last}, length {length}");
    let (meta, version) = bk
        .meta
        .update_ledger(id, current, |m| match m.state {
            LedgerState::Closed => Ok(false),
            LedgerState::Open | LedgerState::InRecovery => {
                m.state = LedgerState::Closed;
                m.last_entry_id = last;
                m.length = length;
                Ok(true)
            }
        })
        .await?;
    Ok(LedgerHandle::reader(Arc::clone(bk), runtime, id, meta, version, None))
}

/// Entries probed (and re-added) concurrently during recovery.
const RECOVERY_WINDOW: u64 = 64;

/// An entry found by recovery: its id, stored frame and decoded header.
type Found = (u64, Bytes, DecodedEntry);

/// Probe `RECOVERY_WINDOW` entries from `first` at once. Returns the entries found before
/// the first missing one, and whether a missing one was met.
async fn probe_window(
    bk: &Arc<BkInner>,
    id: u64,
    meta: &Arc<LedgerMetadata>,
    first: u64,
) -> Result<(Vec<Found>, bool)> {
    let mut tasks = tokio::task::JoinSet::new();
    for entry in first..first.saturating_add(RECOVERY_WINDOW) {
        let (bk, meta) = (Arc::clone(bk), Arc::clone(meta));
        tasks.spawn(async move { (entry, probe(&bk, id, &meta, entry).await) });
    }
    let mut results = std::collections::BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (entry, result) = joined.map_err(|e| LedgerError::Runtime(e.to_string()))?;
        results.insert(entry, result);
    }
    let mut found = Vec::new();
    for (entry, result) in results {
        match result? {
            Probe::Found(framed, decoded) => found.push((entry, framed, decoded)),
            Probe::Missing => return Ok((found, true)),
        }
    }
    Ok((found, false))
}

/// Re-add the `found` entries to their write sets in `meta`, all at once; tells for each
/// whether an ack quorum stored it (the others go through [`replicate`]).
async fn copy_window(
    bk: &Arc<BkInner>,
    id: u64,
    meta: &LedgerMetadata,
    found: &[Found],
    lac: i64,
) -> Result<Vec<bool>> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (entry, framed, _)) in found.iter().enumerate() {
        let ensemble = meta.ensemble_for(*entry);
        for slot in write_set(*entry, ensemble.len(), meta.write_quorum_size) {
            let Some(addr) = ensemble.get(slot).cloned() else { continue };
            let (bk, framed, entry) = (Arc::clone(bk), framed.clone(), *entry);
            tasks.spawn(async move { (i, bk.transport.add(&addr, id, entry, lac, framed, true).await.is_ok()) });
        }
    }
    let mut acks = vec![0usize; found.len()];
    while let Some(joined) = tasks.join_next().await {
        let (i, ok) = joined.map_err(|e| LedgerError::Runtime(e.to_string()))?;
        if ok {
            if let Some(a) = acks.get_mut(i) {
                *a += 1;
            }
        }
    }
    Ok(acks.into_iter().map(|a| a >= meta.ack_quorum_size).collect())
}

/// Fence the last fragment and return the highest last add confirmed it reports.
async fn fence(bk: &Arc<BkInner>, id: u64, meta: &LedgerMetadata) -> Result<i64> {
    let ensemble = meta.current_ensemble().to_vec();
    let mut tasks = tokio::task::JoinSet::new();
    for (slot, addr) in ensemble.iter().cloned().enumerate() {
        let bk = Arc::clone(bk);
        tasks.spawn(async move { (slot, bk.transport.read_lac(&addr, id, true).await) });
    }
    let mut responded = vec![false; ensemble.len()];
    let mut lac = meta.ensembles.last().map_or(-1, |(first, _)| i64::try_from(*first).unwrap_or(i64::MAX) - 1);
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (slot, result) = joined.map_err(|e| LedgerError::Runtime(e.to_string()))?;
        match result {
            Ok(l) => {
                responded[slot] = true;
                lac = lac.max(l);
            }
            Err(e) if e.is_missing() => responded[slot] = true,
            Err(e) => {
                if e.is_bookie_failure() {
                    bk.mark_failed(&ensemble[slot]);
                }
                errors.push(format!("{}: {e}", ensemble[slot]));
            }
        }
    }
    if !covers(ensemble.len(), meta.write_quorum_size, meta.ack_quorum_size, |slot| responded[slot]) {
        return Err(failure(id, format!("could not fence enough bookies ({})", errors.join("; "))));
    }
    Ok(lac)
}

/// Fencing-read `entry` from its write set until it is found or known not confirmed.
async fn probe(bk: &Arc<BkInner>, id: u64, meta: &LedgerMetadata, entry: u64) -> Result<Probe> {
    let ensemble = meta.ensemble_for(entry);
    let need_missing = meta.write_quorum_size.saturating_sub(meta.ack_quorum_size) + 1;
    let mut missing = 0;
    let mut errors = Vec::new();
    for slot in write_set(entry, ensemble.len(), meta.write_quorum_size) {
        let Some(addr) = ensemble.get(slot) else { continue };
        match bk.transport.read(addr, id, entry, true).await {
            Ok(read) => match entry::decode(id, entry, &read.data) {
                Ok(decoded) => return Ok(Probe::Found(read.data, decoded)),
                Err(e) => errors.push(format!("{addr}: {e}")),
            },
            Err(e) if e.is_missing() => {
                missing += 1;
                if missing >= need_missing {
                    return Ok(Probe::Missing);
                }
            }
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    Err(failure(id, format!("entry {entry} neither found nor known missing ({})", errors.join("; "))))
}

/// Rounds of bookie replacement one recovered entry may go through.
const MAX_REPLICATION_ROUNDS: usize = 8;

/// Re-add a recovered entry to its whole write set until `Qa` bookies hold it, replacing
/// bookies that fail (a new fragment starting at `entry`). Returns the metadata to write on.
async fn replicate(
    bk: &Arc<BkInner>,
    id: u64,
    cached: Versioned,
    entry: u64,
    lac: i64,
    framed: Bytes,
) -> Result<Versioned> {
    let mut current = cached;
    let mut excluded: Vec<String> = Vec::new();
    for _ in 0..MAX_REPLICATION_ROUNDS {
        let meta = &current.0;
        let ensemble = meta.ensemble_for(entry).to_vec();
        let mut tasks = tokio::task::JoinSet::new();
        for slot in write_set(entry, ensemble.len(), meta.write_quorum_size) {
            let Some(addr) = ensemble.get(slot).cloned() else { continue };
            let bk = Arc::clone(bk);
            let framed = framed.clone();
            tasks.spawn(async move {
                let r = bk.transport.add(&addr, id, entry, lac, framed, true).await;
                (slot, r)
            });
        }
        let mut acks = 0;
        let mut failed = Vec::new();
        let mut errors = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (slot, result) = joined.map_err(|e| LedgerError::Runtime(e.to_string()))?;
            match result {
                Ok(()) => acks += 1,
                Err(e) => {
                    if e.is_bookie_failure() {
                        bk.mark_failed(&ensemble[slot]);
                        failed.push(slot);
                    }
                    errors.push(format!("{}: {e}", ensemble[slot]));
                }
            }
        }
        if acks >= meta.ack_quorum_size {
            return Ok(current);
        }
        if failed.is_empty() {
            return Err(failure(
                id,
                format!("entry {entry} re-replicated to {acks} bookies only ({})", errors.join("; ")),
            ));
        }
        let starts_last = meta.ensembles.last().is_some_and(|(first, _)| *first <= entry);
        if !starts_last {
            return Err(failure(id, format!("entry {entry} cannot be re-replicated ({})", errors.join("; "))));
        }
        excluded.extend(failed.iter().map(|slot| ensemble[*slot].clone()));
        let mut exclude = ensemble.clone();
        exclude.extend(excluded.iter().cloned());
        let candidates = bk.pick_up_to(failed.len(), &exclude).await?;
        if candidates.len() < failed.len() {
            return Err(failure(
                id,
                format!("entry {entry}: {} ({})", LedgerError::NotEnoughBookies, errors.join("; ")),
            ));
        }
        let mut fragment = ensemble.clone();
        for (slot, addr) in failed.iter().zip(candidates) {
            if let Some(s) = fragment.get_mut(*slot) {
                *s = addr;
            }
        }
        log::info!("ledger {id}: recovery moves entry {entry} on to {fragment:?}");
        current = bk
            .meta
            .update_ledger(id, current, |m| {
                if m.state != LedgerState::InRecovery {
                    return Err(failure(id, format!("ledger state changed to {:?} during recovery", m.state)));
                }
                match m.ensembles.last_mut() {
                    Some((first, bookies)) if *first == entry => bookies.clone_from(&fragment),
                    Some((first, _)) if *first < entry => m.ensembles.push((entry, fragment.clone())),
                    _ => return Err(failure(id, format!("a fragment starts after entry {entry}"))),
                }
                Ok(true)
            })
            .await?;
    }
    Err(failure(id, format!("entry {entry}: bookies kept failing")))
}
