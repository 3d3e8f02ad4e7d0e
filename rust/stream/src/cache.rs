//! A bounded cache of recently added entries, so that tailing readers are served from
//! memory rather than from the bookies. Oldest entries are evicted first: when the cache
//! is over its own size, when the caches sharing a [`CacheBudget`] hold more than it
//! allows together (down to its watermark), and once they are older than the eviction time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::entry::Entry;
use crate::position::Position;

/// The bytes the entry caches of many managed ledgers may hold together, as Pulsar's
/// `managedLedgerCacheSizeMB` is one amount for the whole broker. A cache that adds past
/// the limit evicts its own oldest entries: the ledgers being written are the ones that
/// grow, and a cache left alone empties by age.
///
/// Eviction goes below the limit, down to the watermark (Pulsar's
/// `managedLedgerCacheEvictionWatermark`, a fraction of the limit): a full cache then makes
/// room for a run of adds at once, rather than evicting on every add that follows.
#[derive(Debug)]
pub struct CacheBudget {
    limit: usize,
    /// What the caches are brought down to once they go over `limit`.
    low: usize,
    used: AtomicUsize,
    /// Told when the caches go from holding nothing to holding something, so that a
    /// sweep of an empty budget can wait instead of waking on a timer.
    filled: Notify,
}

impl CacheBudget {
    /// A budget evicted down to the limit itself (a watermark of 1).
    pub fn new(limit: usize) -> Arc<CacheBudget> {
        CacheBudget::with_watermark(limit, 1.0)
    }

    /// A budget evicted down to `watermark` × `limit` once over `limit`; `watermark` is
    /// clamped to 0..=1.
    pub fn with_watermark(limit: usize, watermark: f64) -> Arc<CacheBudget> {
        let low = (limit as f64 * watermark.clamp(0.0, 1.0)) as usize;
        Arc::new(CacheBudget { limit, low, used: AtomicUsize::new(0), filled: Notify::new() })
    }

    /// Bytes cached now, over every cache sharing this budget.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What eviction brings the caches down to (the watermark × the limit).
    pub fn low_watermark(&self) -> usize {
        self.low
    }

    /// End a [`wait_filled`](Self::wait_filled) now (its owner is going away).
    pub(crate) fn wake(&self) {
        self.filled.notify_one();
    }

    /// Wait until the caches hold something (at once if they do now, or if they were
    /// filled since the last wait).
    pub async fn wait_filled(&self) {
        let filled = self.filled.notified();
        if self.used() == 0 {
            filled.await;
        }
    }

    fn over(&self) -> bool {
        self.used() > self.limit
    }
}

#[derive(Debug, Default)]
pub(crate) struct EntryCache {
    entries: BTreeMap<Position, Entry>,
    bytes: usize,
    capacity: usize,
    budget: Option<Arc<CacheBudget>>,
}

impl Drop for EntryCache {
    fn drop(&mut self) {
        self.clear();
    }
}

impl EntryCache {
    pub(crate) fn new(capacity: usize, budget: Option<Arc<CacheBudget>>) -> Self {
        EntryCache { entries: BTreeMap::new(), bytes: 0, capacity, budget }
    }

    fn add_bytes(&mut self, n: usize) {
        self.bytes += n;
        if let Some(b) = &self.budget {
            if b.used.fetch_add(n, Ordering::Relaxed) == 0 && n > 0 {
                b.filled.notify_one();
            }
        }
    }

    fn sub_bytes(&mut self, n: usize) {
        self.bytes -= n;
        if let Some(b) = &self.budget {
            b.used.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Drop entries published before `cutoff_ms` (entries are kept in publish order).
    pub(crate) fn evict_published_before(&mut self, cutoff_ms: u64) {
        while let Some(first) = self.entries.first_key_value() {
            if first.1.publish_time_ms >= cutoff_ms {
                break;
            }
            if let Some((_, e)) = self.entries.pop_first() {
                self.sub_bytes(e.data.len());
            }
        }
    }

    pub(crate) fn insert(&mut self, entry: Entry) {
        let limit = self.budget.as_ref().map_or(self.capacity, |b| b.limit.min(self.capacity));
        if limit == 0 || entry.data.len() > limit {
            return;
        }
        self.add_bytes(entry.data.len());
        if let Some(old) = self.entries.insert(entry.position, entry) {
            self.sub_bytes(old.data.len());
        }
        while self.bytes > self.capacity {
            self.pop_oldest();
        }
        if let Some(b) = self.budget.clone() {
            if b.over() {
                while b.used() > b.low && self.pop_oldest() {}
            }
        }
    }

    /// Evict the oldest entry; false when there was none.
    fn pop_oldest(&mut self) -> bool {
        match self.entries.pop_first() {
            Some((_, e)) => {
                self.sub_bytes(e.data.len());
                true
            }
            None => false,
        }
    }

    /// Consecutive cached entries of `ledger` from entry `first`, at most `max`.
    pub(crate) fn get_run(&self, ledger: u64, first: i64, max: usize) -> Vec<Entry> {
        let run = self.entries.range(Position::new(ledger, first)..Position::new(ledger, i64::MAX));
        (first..)
            .zip(run)
            .take_while(|(want, (p, _))| p.entry_id == *want)
            .take(max)
            .map(|(_, (_, e))| e.clone())
            .collect()
    }

    /// Drop every cached entry of the ledgers `ids`.
    pub(crate) fn remove_ledgers(&mut self, ids: &[u64]) {
        for id in ids {
            let keys: Vec<Position> =
                self.entries.range(Position::new(*id, i64::MIN)..=Position::new(*id, i64::MAX)).map(|(p, _)| *p).collect();
            for k in keys {
                if let Some(e) = self.entries.remove(&k) {
                    self.sub_bytes(e.data.len());
                }
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        let n = self.bytes;
        self.sub_bytes(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn entry(ledger: u64, id: i64, size: usize) -> Entry {
        Entry {
            position: Position::new(ledger, id),
            publish_time_ms: 1,
            index: id as u64,
            num_messages: 1,
            data: Bytes::from(vec![0u8; size]),
        }
    }

    #[test]
    fn caches_sharing_a_budget_stay_under_it_together() {
        let budget = CacheBudget::new(1000);
        let mut a = EntryCache::new(10_000, Some(budget.clone()));
        let mut b = EntryCache::new(10_000, Some(budget.clone()));
        for i in 0..8 {
            a.insert(entry(1, i, 100));
        }
        assert_eq!(budget.used(), 800);
        for i in 0..5 {
            b.insert(entry(2, i, 100));
            assert!(budget.used() <= 1000, "used {} after {} inserts", budget.used(), i + 1);
        }
        // The cache that grew past the budget gave up its own oldest entries.
        assert_eq!(a.get_run(1, 0, 100).len(), 8);
        assert_eq!(b.get_run(2, 3, 100).len(), 2);
        assert!(b.get_run(2, 0, 100).is_empty());
        drop(a);
        assert_eq!(budget.used(), 200, "a dropped cache gives its bytes back");
        b.remove_ledgers(&[2]);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_full_budget_is_evicted_down_to_its_watermark() {
        let budget = CacheBudget::with_watermark(1000, 0.6);
        assert_eq!(budget.low_watermark(), 600);
        let mut c = EntryCache::new(10_000, Some(budget.clone()));
        for i in 0..10 {
            c.insert(entry(1, i, 100));
        }
        assert_eq!(budget.used(), 1000, "at the limit, nothing is evicted");
        c.insert(entry(1, 10, 100));
        // Over the limit: the oldest go until the caches hold the watermark.
        assert_eq!(budget.used(), 600);
        assert_eq!(c.get_run(1, 5, 100).len(), 6);
        assert!(c.get_run(1, 4, 1).is_empty());
        // The room made takes the next adds without evicting.
        for i in 11..15 {
            c.insert(entry(1, i, 100));
        }
        assert_eq!(budget.used(), 1000);
        assert_eq!(c.get_run(1, 5, 100).len(), 10);
    }

    #[test]
    fn an_entry_larger_than_the_budget_is_not_cached() {
        let budget = CacheBudget::new(100);
        let mut c = EntryCache::new(10_000, Some(budget.clone()));
        c.insert(entry(1, 0, 101));
        assert_eq!(budget.used(), 0);
        assert!(c.get_run(1, 0, 1).is_empty());
    }
}
