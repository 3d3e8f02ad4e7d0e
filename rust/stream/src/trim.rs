//! Trimming: deleting ledgers nobody needs any more.
//!
//! A ledger may go when (1) it is not the current ledger, (2) every durable cursor has
//! acknowledged all of it (the first unacknowledged entry of the slowest cursor is in a
//! later ledger) and (3) retention no longer keeps it. Retention follows Pulsar: walking
//! from the oldest ledger, a consumed ledger is deleted when its retention time has passed
//! (measured from its close time: when it was sealed, or for a ledger sealed because all its
//! entries had outlived retention, when its last entry was added) OR the consumed data
//! retained would exceed the size quota; the walk stops at the first ledger retention keeps.
//! Empty sealed ledgers always go.
//! Non-durable cursors do not hold ledgers back.

use std::sync::atomic::Ordering;

use crate::append::duration_ms;
use crate::error::Result;
use crate::managed_ledger::{ManagedLedger, MlStatus};
use crate::store::LedgerStoreError;

impl ManagedLedger {
    /// Delete the ledgers that every durable cursor has passed and that retention does
    /// not need, or that lie wholly below the trim floor ([`ManagedLedger::raise_trim_floor`]);
    /// returns their ids.
    pub async fn trim(&self) -> Result<Vec<u64>> {
        let floor = self.trim_floor.load(std::sync::atomic::Ordering::Relaxed);
        self.trim_with((floor > 0).then_some(floor)).await
    }

    /// Records below index `floor` were deleted by an explicit request (such as Kafka's
    /// DeleteRecords): from now on every trim also deletes, whatever retention says, the
    /// ledgers whose messages all lie below it, once every durable cursor has passed them.
    /// The floor only rises.
    pub fn raise_trim_floor(&self, floor: u64) {
        self.trim_floor.fetch_max(floor, std::sync::atomic::Ordering::Relaxed);
    }

    /// One trim as if the trim floor were at least `floor` (the floor itself stays).
    pub async fn trim_below(&self, floor: u64) -> Result<Vec<u64>> {
        let floor = floor.max(self.trim_floor.load(std::sync::atomic::Ordering::Relaxed));
        self.trim_with(Some(floor)).await
    }

    async fn trim_with(&self, floor: Option<u64>) -> Result<Vec<u64>> {
        let _trimming = self.trim_lock.lock().await;
        self.check_open()?;
        let slowest_ledger = {
            let marks: Vec<crate::position::Position> =
                self.cursors.lock().values().map(|c| c.mark_delete_position()).collect();
            let st = self.state.lock();
            marks.into_iter().map(|md| st.next_valid(md).ledger_id).min()
        };
        let now = self.config.clock.now_ms();
        let victims: Vec<u64> = {
            let mut st = self.state.lock();
            st.evict_cache(now, self.config.cache_eviction_time);
            let current = st.current_id();
            // The last ledger is never trimmed: it is the current one, or (between a
            // failure and its replacement) the one the next ledger continues from.
            let last = st.ledgers.keys().next_back().copied().unwrap_or(0);
            let limit = slowest_ledger.or(current).unwrap_or(u64::MAX).min(last);
            let total: u64 = st.ledgers.values().map(|i| i.size).sum();
            let quota = u64::try_from(self.config.retention_size_mb).ok().map(|mb| mb.saturating_mul(1 << 20));
            let mut freed = 0u64;
            let mut out = Vec::new();
            for (id, info) in st.ledgers.range(..limit) {
                if Some(*id) == current {
                    break;
                }
                let expired = match self.config.retention_time {
                    None => false,
                    Some(t) => now.saturating_sub(info.timestamp) >= duration_ms(t),
                };
                let over_quota = quota.is_some_and(|q| total - freed > q);
                // The next ledger starts where this one ends (`limit` is never past the last).
                let below_floor = floor.is_some_and(|f| {
                    st.ledgers.range(id + 1..).next().is_some_and(|(_, next)| next.first_index <= f)
                });
                if info.entries == 0 || expired || over_quota || below_floor {
                    out.push(*id);
                    freed += info.size;
                } else {
                    break;
                }
            }
            for id in &out {
                st.ledgers.remove(id);
                st.read_handles.remove(id);
            }
            st.cache.remove_ledgers(&out);
            let first_kept = st.ledgers.keys().next().copied().unwrap_or(u64::MAX);
            st.probes.retain(|p, _| p.ledger_id >= first_kept);
            out
        };
        if victims.is_empty() {
            return Ok(victims);
        }
        self.persist_record().await?;
        for id in &victims {
            match self.store.delete_ledger(*id).await {
                Ok(()) | Err(LedgerStoreError::NoSuchLedger(_)) => {}
                Err(e) => log::warn!("managed ledger {}: trimmed ledger {id} not deleted: {e}", self.name),
            }
        }
        Ok(victims)
    }

    /// Run [`ManagedLedger::trim`] in the background (coalescing repeated requests).
    pub(crate) fn schedule_trim(&self) {
        if self.state.lock().status != MlStatus::Open || self.trim_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(me) = self.arc() else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.trim_scheduled.store(false, Ordering::Release);
            return;
        };
        rt.spawn(async move {
            me.trim_scheduled.store(false, Ordering::Release);
            if let Err(e) = me.trim().await {
                log::debug!("managed ledger {}: background trim: {e}", me.name);
            }
        });
    }
}
