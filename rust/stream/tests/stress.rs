//! Concurrent producers, consumers, rollovers and trims on one managed ledger.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_ledger::mem::MemBookies;
use magnetar_ledger::{BookKeeper, ClientConfig};
use magnetar_meta::{MemStore, MetadataStore};
use magnetar_stream::{
    BookKeeperStore, InitialPosition, LedgerStore, ManagedLedgerConfig, ManagedLedgerFactory, MemLedgerStore,
};

const PRODUCERS: u32 = 4;
const PER_PRODUCER: u32 = 400;

/// Runs the load and returns the ledgers the managed ledger kept at the end.
async fn run(meta: Arc<dyn MetadataStore>, ledgers: Arc<dyn LedgerStore>) -> Vec<u64> {
    let f = ManagedLedgerFactory::new(meta, ledgers);
    let cfg = ManagedLedgerConfig {
        max_entries_per_ledger: 7,
        min_rollover_time: Duration::ZERO,
        mark_delete_rate_per_sec: 50.0,
        cache_size_bytes: 2_000,
        ..Default::default()
    };
    let ml = f.open("t/stress", cfg).await.unwrap();
    let cursors = [
        ml.open_cursor("in-order", InitialPosition::Earliest).await.unwrap(),
        ml.open_cursor("scattered", InitialPosition::Earliest).await.unwrap(),
    ];
    let total = u64::from(PRODUCERS * PER_PRODUCER);

    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let ml = ml.clone();
        producers.push(tokio::spawn(async move {
            let mut i = 0;
            while i < PER_PRODUCER {
                let n = (i % 3 + 1).min(PER_PRODUCER - i);
                let batch = (i..i + n).map(|k| (Bytes::from(format!("{p}-{k}")), 1)).collect();
                ml.add_entries(batch).await.unwrap();
                i += n;
            }
        }));
    }
    let mut consumers = Vec::new();
    for (which, c) in cursors.iter().enumerate() {
        let c = c.clone();
        consumers.push(tokio::spawn(async move {
            let mut seen = BTreeSet::new();
            let mut held = Vec::new();
            while (seen.len() as u64) < total {
                let got = tokio::time::timeout(Duration::from_secs(20), c.read_entries_or_wait(50)).await.unwrap().unwrap();
                for e in &got {
                    assert!(seen.insert(e.index), "index {} delivered twice", e.index);
                }
                if which == 0 {
                    c.mark_delete(got.last().unwrap().position).await.unwrap();
                } else {
                    // Acknowledge every other batch at once, newest first, to keep ranges open.
                    held.extend(got.iter().rev().map(|e| e.position));
                    if held.len() > 60 {
                        c.delete(&held).await.unwrap();
                        held.clear();
                    }
                }
            }
            c.delete(&held).await.unwrap();
            seen
        }));
    }
    let trimmer = {
        let ml = ml.clone();
        tokio::spawn(async move {
            for _ in 0..200 {
                ml.trim().await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    for p in producers {
        p.await.unwrap();
    }
    for c in consumers {
        let seen = c.await.unwrap();
        assert_eq!(seen, (0..total).collect::<BTreeSet<u64>>());
    }
    trimmer.await.unwrap();
    for c in &cursors {
        assert_eq!(c.number_of_entries_in_backlog(), 0, "cursor {}", c.name());
        assert!(c.individually_deleted_ranges().is_empty());
    }
    ml.trim().await.unwrap();
    let current = ml.stats().current_ledger_id.unwrap();
    let kept: Vec<u64> = ml.ledgers_info().iter().map(|i| i.ledger_id).collect();
    assert!(kept.len() <= 2 && kept.contains(&current), "{kept:?}");
    assert_eq!(ml.stats().next_index, total);
    ml.close().await.unwrap();
    kept
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_reads_acks_and_trims_in_memory() {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemStore::default());
    let store = MemLedgerStore::new();
    let kept = run(meta, Arc::new(store.clone())).await;
    assert_eq!(store.ledger_ids(), kept, "trimmed ledgers are deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_reads_acks_and_trims_on_replicated_ledgers() {
    let meta = Arc::new(MemStore::default());
    let bookies = Arc::new(MemBookies::new());
    for b in ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"] {
        bookies.add_bookie(b);
        meta.put(&format!("/ledgers/available/{b}"), b"", None).unwrap();
    }
    let dyn_meta: Arc<dyn MetadataStore> = meta.clone();
    let bk = BookKeeper::with_transport(dyn_meta.clone(), ClientConfig::default(), bookies);
    let kept = run(dyn_meta, Arc::new(BookKeeperStore::new(bk))).await;
    let mut left: Vec<u64> = meta.children("/ledgers/ledger").unwrap().iter().map(|s| s.parse().unwrap()).collect();
    left.sort_unstable();
    assert_eq!(left, kept, "trimmed ledgers are deleted");
}
