//! A bounded cache of recently added entries, so that tailing readers are served from
//! memory rather than from the bookies. Oldest entries are evicted first: when the cache
//! is over its own size, when the caches sharing a [`CacheBudget`] hold more than it
//! allows together (down to its watermark), and once they are older than the eviction time.
//!
//! Entries arrive in position order (a managed ledger caches what it confirms, in order) and
//! leave oldest first, so the cache is a queue in position order: adding and evicting are
//! pushes and pops at its ends, and a read finds its first entry by binary search.

use std::collections::VecDeque;
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

/// Below this many slots, a queue keeps whatever room it has.
const MIN_SPARE_ROOM: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct EntryCache {
    /// In position order, oldest first.
    entries: VecDeque<Entry>,
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
        EntryCache { entries: VecDeque::new(), bytes: 0, capacity, budget }
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
        while self.entries.front().is_some_and(|e| e.publish_time_ms < cutoff_ms) {
            self.pop_oldest();
        }
    }

    pub(crate) fn insert(&mut self, entry: Entry) {
        let limit = self.budget.as_ref().map_or(self.capacity, |b| b.limit.min(self.capacity));
        if limit == 0 || entry.data.len() > limit {
            return;
        }
        self.add_bytes(entry.data.len());
        match self.entries.back() {
            Some(last) if last.position >= entry.position => {
                // Not the add path's order: keep the queue sorted, replacing an entry cached
                // under the same position.
                let at = self.first_at_or_after(entry.position);
                if self.entries.get(at).is_some_and(|e| e.position == entry.position) {
                    let old = std::mem::replace(&mut self.entries[at], entry);
                    self.sub_bytes(old.data.len());
                } else {
                    self.entries.insert(at, entry);
                }
            }
            _ => self.entries.push_back(entry),
        }
        while self.bytes > self.capacity {
            self.pop_oldest();
        }
        if self.budget.as_ref().is_some_and(|b| b.over()) {
            while self.budget.as_ref().is_some_and(|b| b.used() > b.low) && self.pop_oldest() {}
        }
    }

    /// Where the first entry at or after `position` is (the length when there is none).
    fn first_at_or_after(&self, position: Position) -> usize {
        self.entries.partition_point(|e| e.position < position)
    }

    /// Evict the oldest entry; false when there was none.
    fn pop_oldest(&mut self) -> bool {
        match self.entries.pop_front() {
            Some(e) => {
                self.sub_bytes(e.data.len());
                self.release_spare_room();
                true
            }
            None => false,
        }
    }

    /// Give back the queue's memory once it holds less than a quarter of its capacity: a
    /// burst of small entries must not keep its room for good.
    fn release_spare_room(&mut self) {
        let cap = self.entries.capacity();
        if cap > MIN_SPARE_ROOM && self.entries.len() < cap / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
        }
    }

    /// Consecutive cached entries of `ledger` from entry `first`, at most `max`.
    pub(crate) fn get_run(&self, ledger: u64, first: i64, max: usize) -> Vec<Entry> {
        let at = self.first_at_or_after(Position::new(ledger, first));
        (first..)
            .zip(self.entries.range(at..))
            .take_while(|(want, e)| e.position == Position::new(ledger, *want))
            .take(max)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Drop every cached entry of the ledgers `ids`.
    pub(crate) fn remove_ledgers(&mut self, ids: &[u64]) {
        let mut freed = 0;
        self.entries.retain(|e| {
            let keep = !ids.contains(&e.position.ledger_id);
            if !keep {
                freed += e.data.len();
            }
            keep
        });
        self.sub_bytes(freed);
        self.release_spare_room();
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
    fn runs_stop_at_a_gap_and_at_the_end_of_their_ledger() {
        let mut c = EntryCache::new(10_000, None);
        for (ledger, id) in [(1, 0), (1, 1), (1, 3), (2, 0), (2, 1)] {
            c.insert(entry(ledger, id, 10));
        }
        let ids = |run: Vec<Entry>| run.iter().map(|e| (e.position.ledger_id, e.position.entry_id)).collect::<Vec<_>>();
        assert_eq!(ids(c.get_run(1, 0, 100)), [(1, 0), (1, 1)]);
        assert_eq!(ids(c.get_run(1, 3, 100)), [(1, 3)]);
        assert_eq!(ids(c.get_run(2, 0, 1)), [(2, 0)]);
        assert!(c.get_run(1, 2, 100).is_empty());
        assert!(c.get_run(3, 0, 100).is_empty());
        c.remove_ledgers(&[1]);
        assert!(c.get_run(1, 0, 100).is_empty());
        assert_eq!(ids(c.get_run(2, 0, 100)), [(2, 0), (2, 1)]);
        assert_eq!(c.bytes, 20);
    }

    #[test]
    fn an_entry_cached_out_of_order_takes_its_place_or_replaces_its_twin() {
        let mut c = EntryCache::new(10_000, None);
        for id in [0, 2, 3] {
            c.insert(entry(1, id, 10));
        }
        c.insert(entry(1, 1, 10));
        c.insert(entry(1, 2, 30));
        let run = c.get_run(1, 0, 100);
        assert_eq!(run.iter().map(|e| e.position.entry_id).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(run[2].data.len(), 30);
        assert_eq!(c.bytes, 60);
        // Eviction still goes oldest first.
        c.evict_published_before(2);
        assert!(c.get_run(1, 0, 100).is_empty());
        assert_eq!(c.bytes, 0);
    }

    #[test]
    fn an_emptied_queue_gives_its_room_back() {
        let budget = CacheBudget::new(100_000);
        let mut c = EntryCache::new(100_000, Some(budget.clone()));
        for i in 0..10_000 {
            c.insert(entry(1, i, 10));
        }
        let full = c.entries.capacity();
        assert!(full >= 10_000);
        c.remove_ledgers(&[1]);
        assert!(c.entries.capacity() < full / 4, "capacity {} of {full}", c.entries.capacity());
        assert_eq!(budget.used(), 0);
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
