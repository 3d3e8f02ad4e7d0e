//! Re-replication: restoring the copies a lost bookie held (BookKeeper's autorecovery).
//!
//! [`BookKeeper::replace_bookie`] takes one closed ledger and one bookie that is gone. For
//! each fragment whose ensemble has that bookie, it picks a bookie outside the ensemble,
//! copies to it every entry of the fragment whose write set included the lost slot (each
//! read from a surviving replica and checked before it is written), and only then puts the
//! new bookie in the lost one's slot with a compare-and-set of the ledger's record. Until
//! that update, readers use the surviving copies as before; after it, they find the new
//! copy where the lost one was. A crash in between leaves a copy nothing refers to, which
//! the bookie's garbage collection later removes.
//!
//! Ledgers that are not closed are left alone: their writer changes its ensemble itself
//! when a bookie fails under it, and a ledger is closed at its next rollover.

use bytes::Bytes;

use crate::client::BookKeeper;
use crate::entry;
use crate::error::{LedgerError, Result};
use crate::metadata::{LedgerMetadata, LedgerState};
use crate::quorum::write_set;

/// What [`BookKeeper::replace_bookie`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replacement {
    /// The lost bookie's slots were given to these bookies (one per fragment it was in),
    /// after copying `entries` entries to them.
    Replaced { bookies: Vec<String>, entries: u64 },
    /// The ledger is not closed yet; nothing was done.
    NotClosed,
    /// The ledger does not list the bookie (any more).
    NotInLedger,
}

/// One fragment to repair: its index, the lost bookie's slot, its entries, the new bookie.
struct Repair {
    fragment: usize,
    slot: usize,
    first: u64,
    last: i64,
    target: String,
}

impl BookKeeper {
    /// Give the lost bookie `lost`'s place in closed ledger `id` to other bookies, copying
    /// what it held there first, `batch` entries at a time (rereplicationEntryBatchSize).
    pub async fn replace_bookie(&self, id: u64, lost: &str, batch: usize) -> Result<Replacement> {
        let (meta, version) = self.inner.meta.read_ledger(id).await?;
        if meta.state != LedgerState::Closed {
            return Ok(Replacement::NotClosed);
        }
        let mut repairs = Vec::new();
        for (fragment, (first, ensemble)) in meta.ensembles.iter().enumerate() {
            let Some(slot) = ensemble.iter().position(|b| b == lost) else { continue };
            let last = match meta.ensembles.get(fragment + 1) {
                Some((next, _)) => i64::try_from(*next).unwrap_or(i64::MAX) - 1,
                None => meta.last_entry_id,
            };
            // A bookie appears once in an ensemble, so each fragment has one slot to fill,
            // from outside the fragment's ensemble.
            let target = self
                .inner
                .pick_up_to(1, ensemble)
                .await?
                .into_iter()
                .next()
                .ok_or(LedgerError::NotEnoughBookies)?;
            repairs.push(Repair { fragment, slot, first: *first, last, target });
        }
        if repairs.is_empty() {
            return Ok(Replacement::NotInLedger);
        }
        let mut copied = 0u64;
        for r in &repairs {
            copied += self.copy_fragment(id, &meta, r, batch.max(1)).await?;
        }
        self.inner
            .meta
            .update_ledger(id, (meta, version), |m| {
                let mut changed = false;
                for r in &repairs {
                    let Some((first, ensemble)) = m.ensembles.get_mut(r.fragment) else { continue };
                    if *first == r.first && ensemble.get(r.slot).is_some_and(|b| b == lost) {
                        ensemble[r.slot].clone_from(&r.target);
                        changed = true;
                    }
                }
                Ok(changed)
            })
            .await?;
        log::info!(
            "ledger {id}: bookie {lost} replaced by {:?}, {copied} entries copied",
            repairs.iter().map(|r| r.target.as_str()).collect::<Vec<_>>()
        );
        Ok(Replacement::Replaced { bookies: repairs.into_iter().map(|r| r.target).collect(), entries: copied })
    }

    /// Copy the entries of repair `r` that the lost slot held to the new bookie, `batch`
    /// read at a time and written in as few frames as the frame limit allows. Returns how
    /// many were copied.
    async fn copy_fragment(&self, id: u64, meta: &LedgerMetadata, r: &Repair, batch: usize) -> Result<u64> {
        let ensemble = &meta.ensembles[r.fragment].1;
        let (e, qw) = (ensemble.len(), meta.write_quorum_size);
        let Ok(last) = u64::try_from(r.last) else { return Ok(0) };
        let held: Vec<u64> = (r.first..=last).filter(|entry| write_set(*entry, e, qw).any(|s| s == r.slot)).collect();
        for chunk in held.chunks(batch) {
            let mut reads = tokio::task::JoinSet::new();
            for &entry in chunk {
                let sources: Vec<String> = write_set(entry, e, qw)
                    .filter(|s| *s != r.slot)
                    .filter_map(|s| ensemble.get(s).cloned())
                    .collect();
                let bk = self.clone();
                reads.spawn(async move { (entry, bk.read_replica(id, entry, &sources).await) });
            }
            let mut entries: Vec<(u64, Bytes)> = Vec::with_capacity(chunk.len());
            while let Some(joined) = reads.join_next().await {
                let (entry, got) = joined.map_err(|err| LedgerError::Runtime(err.to_string()))?;
                entries.push((entry, got?));
            }
            entries.sort_unstable_by_key(|(entry, _)| *entry);
            for part in crate::writer::batches(entries, self.inner.config.max_frame_size) {
                self.inner
                    .transport
                    .add_batch(&r.target, id, meta.last_entry_id, part, true)
                    .await?;
            }
        }
        Ok(held.len() as u64)
    }

    /// Entry `entry` of ledger `id` as stored (framed), from the first of `sources` that
    /// returns it intact.
    async fn read_replica(&self, id: u64, entry: u64, sources: &[String]) -> Result<Bytes> {
        let mut last_err = LedgerError::NoSuchEntry { ledger: id, entry };
        for addr in sources {
            match self.inner.transport.read(addr, id, entry, false).await {
                Ok(read) => match entry::decode(id, entry, &read.data) {
                    Ok(_) => return Ok(read.data),
                    Err(err) => {
                        last_err = LedgerError::CorruptEntry { ledger: id, entry, reason: err.to_string() }
                    }
                },
                Err(err) if err.is_missing() => {}
                Err(err) => last_err = err.into(),
            }
        }
        Err(last_err)
    }
}
