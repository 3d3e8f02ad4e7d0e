//! A bounded cache of recently added entries, so that tailing readers are served from
//! memory rather than from the bookies. Oldest entries are evicted first: when the cache
//! is over its size, and once they are older than the eviction time.

use std::collections::BTreeMap;

use crate::entry::Entry;
use crate::position::Position;

#[derive(Debug, Default)]
pub(crate) struct EntryCache {
    entries: BTreeMap<Position, Entry>,
    bytes: usize,
    capacity: usize,
}

impl EntryCache {
    pub(crate) fn new(capacity: usize) -> Self {
        EntryCache { entries: BTreeMap::new(), bytes: 0, capacity }
    }

    /// Drop entries published before `cutoff_ms` (entries are kept in publish order).
    pub(crate) fn evict_published_before(&mut self, cutoff_ms: u64) {
        while let Some(first) = self.entries.first_key_value() {
            if first.1.publish_time_ms >= cutoff_ms {
                break;
            }
            if let Some((_, e)) = self.entries.pop_first() {
                self.bytes -= e.data.len();
            }
        }
    }

    pub(crate) fn insert(&mut self, entry: Entry) {
        if self.capacity == 0 || entry.data.len() > self.capacity {
            return;
        }
        self.bytes += entry.data.len();
        if let Some(old) = self.entries.insert(entry.position, entry) {
            self.bytes -= old.data.len();
        }
        while self.bytes > self.capacity {
            match self.entries.pop_first() {
                Some((_, e)) => self.bytes -= e.data.len(),
                None => break,
            }
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
                    self.bytes -= e.data.len();
                }
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}
