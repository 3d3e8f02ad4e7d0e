//! Managed ledger and cursor behaviour against the in-memory ledger store.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_meta::{MemStore, MetadataStore};
use magnetar_stream::{
    CacheBudget, Clock, InitialPosition, LedgerStore, ManagedLedgerConfig, ManagedLedgerFactory, ManualClock,
    MemLedgerStore, Position, StreamError,
};

struct Env {
    meta: Arc<MemStore>,
    store: MemLedgerStore,
    clock: Arc<ManualClock>,
}

impl Env {
    fn new() -> Self {
        Env { meta: Arc::new(MemStore::default()), store: MemLedgerStore::new(), clock: ManualClock::new(1_000_000) }
    }

    fn factory(&self) -> ManagedLedgerFactory {
        let (meta, store) = self.stores();
        ManagedLedgerFactory::new(meta, store)
    }

    /// A factory whose ledgers share a cache budget of `bytes` (and its sweep).
    fn factory_with_cache(&self, bytes: usize) -> ManagedLedgerFactory {
        let (meta, store) = self.stores();
        ManagedLedgerFactory::with_cache(meta, store, CacheBudget::new(bytes))
    }

    fn stores(&self) -> (Arc<dyn MetadataStore>, Arc<dyn LedgerStore>) {
        (self.meta.clone(), Arc::new(self.store.clone()))
    }

    fn config(&self, max_entries: u64) -> ManagedLedgerConfig {
        ManagedLedgerConfig {
            max_entries_per_ledger: max_entries,
            min_rollover_time: Duration::ZERO,
            mark_delete_rate_per_sec: 0.0,
            clock: self.clock.clone(),
            ..Default::default()
        }
    }
}

fn payloads(range: std::ops::Range<u32>) -> Vec<(Bytes, u32)> {
    range.map(|i| (Bytes::from(format!("m{i}")), 1)).collect()
}

#[tokio::test]
async fn append_and_read_across_rollover() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/append", env.config(3)).await.unwrap();
    env.clock.advance(Duration::from_millis(10));
    let added = ml.add_entries(payloads(0..10)).await.unwrap();
    assert_eq!(added.len(), 10);
    let ledgers: Vec<u64> = added.iter().map(|a| a.position.ledger_id).collect();
    assert_eq!(ledgers.iter().collect::<std::collections::BTreeSet<_>>().len(), 4, "3+3+3+1 entries");
    for w in added.windows(2) {
        assert!(w[0].position < w[1].position);
        assert_eq!(w[1].index, w[0].index + 1);
    }
    assert_eq!(added[0].index, 0);
    let read = ml.read_entries(added[0].position, 100).await.unwrap();
    assert_eq!(read.len(), 10);
    for (i, e) in read.iter().enumerate() {
        assert_eq!(&e.data[..], format!("m{i}").as_bytes());
        assert_eq!(e.position, added[i].position);
        assert_eq!(e.index, i as u64);
    }
    // Reading from the middle with a limit crosses ledger boundaries too.
    let mid = ml.read_entries(added[2].position, 4).await.unwrap();
    assert_eq!(mid.iter().map(|e| e.index).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
    let stats = ml.stats();
    assert_eq!(stats.number_of_entries, 10);
    assert_eq!(stats.current_ledger_created_ms, Some(1_000_010), "the last rollover's time, not the open's");
    assert_eq!(stats.last_confirmed, Some(added[9].position));
    assert_eq!(ml.first_position(), Some(added[0].position));
    assert_eq!(stats.next_index, 10);
    ml.close().await.unwrap();
}

#[tokio::test]
async fn reads_come_from_ledgers_when_cache_is_off() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig { cache_size_bytes: 0, ..env.config(4) };
    let ml = f.open("t/nocache", cfg).await.unwrap();
    let added = ml.add_entries(payloads(0..9)).await.unwrap();
    let read = ml.read_entries(Position::new(0, -1), 100).await.unwrap();
    assert_eq!(read.iter().map(|e| e.position).collect::<Vec<_>>(), added.iter().map(|a| a.position).collect::<Vec<_>>());
}

#[tokio::test]
async fn cached_reads_need_no_wait_and_match_what_a_read_returns() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/cached", env.config(4)).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    assert!(c.read_cached(10).is_none(), "nothing stored yet");
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    let idx = |v: Vec<magnetar_stream::Entry>| v.iter().map(|e| e.index).collect::<Vec<_>>();
    // One ledger's run at a time (4 entries per ledger), acknowledged entries left out.
    c.delete(&[added[1].position]).await.unwrap();
    assert_eq!(idx(c.read_cached(10).unwrap()), vec![0, 2, 3]);
    assert_eq!(idx(c.read_cached(10).unwrap()), vec![4, 5]);
    assert!(c.read_cached(10).is_none(), "at the end");
    c.rewind();
    assert_eq!(idx(c.read_entries(100).await.unwrap()), vec![0, 2, 3, 4, 5]);

    // With the cache off, nothing is cached: the read goes to the ledgers.
    let cfg = ManagedLedgerConfig { cache_size_bytes: 0, ..env.config(4) };
    let cold = f.open("t/uncached", cfg).await.unwrap();
    let c2 = cold.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    cold.add_entries(payloads(0..3)).await.unwrap();
    assert!(c2.read_cached(10).is_none());
    assert_eq!(idx(c2.read_entries(10).await.unwrap()), vec![0, 1, 2]);
}

#[tokio::test]
async fn index_and_publish_time_metadata() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/meta", env.config(100)).await.unwrap();
    let a = ml.add_entries(vec![(Bytes::from("x"), 5)]).await.unwrap();
    env.clock.advance(Duration::from_millis(10));
    let b = ml.add_entries(vec![(Bytes::from("y"), 1), (Bytes::from("z"), 3)]).await.unwrap();
    assert_eq!(a[0].index, 4);
    assert_eq!(b[0].index, 5);
    assert_eq!(b[1].index, 8);
    assert_eq!(a[0].publish_time_ms, 1_000_000);
    assert_eq!(b[0].publish_time_ms, 1_000_010);
    let read = ml.read_entries(a[0].position, 10).await.unwrap();
    assert_eq!(read[0].num_messages, 5);
    assert_eq!(read[2].index, 8);
    assert_eq!(read[2].first_index(), 6);
    assert_eq!(read[1].publish_time_ms, 1_000_010);
    // An entry must hold at least one message.
    assert!(matches!(ml.add_entries(vec![(Bytes::new(), 0)]).await, Err(StreamError::InvalidArgument(_))));
}

#[tokio::test]
async fn concurrent_appends_keep_indexes_contiguous() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/concurrent", env.config(7)).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let ml = ml.clone();
        tasks.push(tokio::spawn(async move { ml.add_entries(payloads(t * 10..t * 10 + 10)).await }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap().unwrap());
    }
    all.sort_by_key(|a| a.position);
    for (i, a) in all.iter().enumerate() {
        assert_eq!(a.index, i as u64);
    }
}

#[tokio::test]
async fn find_position_by_index_and_time() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/find", ManagedLedgerConfig { cache_size_bytes: 0, ..env.config(5) }).await.unwrap();
    let mut added = Vec::new();
    for i in 0..23u32 {
        env.clock.advance(Duration::from_millis(100));
        // Entry i holds i % 3 + 1 messages.
        added.extend(ml.add_entries(vec![(Bytes::from(format!("e{i}")), i % 3 + 1)]).await.unwrap());
    }
    let mut first = 0u64;
    for a in &added {
        for idx in first..=a.index {
            assert_eq!(ml.find_position_by_index(idx).await.unwrap(), a.position, "index {idx}");
        }
        first = a.index + 1;
    }
    // Past the end: the position the next entry will take.
    let beyond = ml.find_position_by_index(first + 100).await.unwrap();
    assert!(beyond > added.last().unwrap().position);
    for a in &added {
        assert_eq!(ml.find_position_by_publish_time(a.publish_time_ms).await.unwrap(), a.position);
        assert_eq!(ml.find_position_by_publish_time(a.publish_time_ms - 50).await.unwrap(), a.position);
    }
    assert_eq!(ml.find_position_by_publish_time(0).await.unwrap(), added[0].position);
    assert!(ml.find_position_by_publish_time(u64::MAX).await.unwrap() > added.last().unwrap().position);
}

#[tokio::test]
async fn reopen_recovers_ledgers_index_and_cursor_state() {
    let env = Env::new();
    let added;
    {
        let f = env.factory();
        let ml = f.open("t/reopen", env.config(4)).await.unwrap();
        added = ml.add_entries(payloads(0..10)).await.unwrap();
        let c = ml.open_cursor("sub", InitialPosition::Earliest).await.unwrap();
        c.mark_delete(added[2].position).await.unwrap();
        c.delete(&[added[5].position, added[6].position, added[8].position]).await.unwrap();
        c.set_property("group", Some("g1".into())).await.unwrap();
        // No close: a crash. The last ledger is still open and must be recovered.
    }
    let f = env.factory();
    let ml = f.open("t/reopen", env.config(4)).await.unwrap();
    assert_eq!(ml.last_confirmed(), Some(added[9].position));
    assert_eq!(ml.stats().next_index, 10);
    let c = ml.cursor("sub").expect("cursor restored");
    assert_eq!(c.mark_delete_position(), added[2].position);
    assert_eq!(
        c.individually_deleted_ranges(),
        vec![(added[5].position, added[6].position), (added[8].position, added[8].position)]
    );
    assert_eq!(c.properties().get("group").map(String::as_str), Some("g1"));
    assert_eq!(c.number_of_entries_in_backlog(), 4);
    let got: Vec<u64> = c.read_entries(100).await.unwrap().iter().map(|e| e.index).collect();
    assert_eq!(got, vec![3, 4, 7, 9]);
    let more = ml.add_entries(payloads(0..2)).await.unwrap();
    assert_eq!(more[0].index, 10);
    assert!(more[0].position.ledger_id > added[9].position.ledger_id);
    ml.close().await.unwrap();

    // A clean close and reopen gives the same state again.
    let ml = f.open("t/reopen", env.config(4)).await.unwrap();
    let c = ml.cursor("sub").unwrap();
    assert_eq!(c.mark_delete_position(), added[2].position);
    assert_eq!(c.number_of_entries_in_backlog(), 6);
    assert_eq!(ml.stats().next_index, 12);
}

#[tokio::test]
async fn batch_index_acks_survive_a_reopen_until_their_entry_is_acknowledged() {
    let env = Env::new();
    let added;
    {
        let f = env.factory();
        let ml = f.open("t/batch-acks", env.config(100)).await.unwrap();
        added = ml.add_entries(payloads(0..6)).await.unwrap();
        let c = ml.open_cursor("sub", InitialPosition::Earliest).await.unwrap();
        c.set_batch_acks(&[(added[1].position, vec![0b1010]), (added[3].position, vec![0b0001]), (added[4].position, vec![7])])
            .await
            .unwrap();
        // replaced by a later ack set of the same entry
        c.set_batch_acks(&[(added[1].position, vec![0b1000])]).await.unwrap();
        // wholly acknowledged entries leave: individually, and below the mark-delete position
        c.delete(&[added[4].position]).await.unwrap();
        c.mark_delete(added[2].position).await.unwrap();
        assert_eq!(c.batch_acks(), vec![(added[3].position, vec![0b0001])]);
        // an ack set for an entry already acknowledged is not taken
        c.set_batch_acks(&[(added[0].position, vec![1])]).await.unwrap();
        c.set_batch_acks(&[(added[5].position, vec![-1, 3])]).await.unwrap();
        // no close: a crash
    }
    let f = env.factory();
    let ml = f.open("t/batch-acks", env.config(100)).await.unwrap();
    let c = ml.cursor("sub").expect("cursor restored");
    assert_eq!(c.batch_acks(), vec![(added[3].position, vec![0b0001]), (added[5].position, vec![-1, 3])]);
    c.reset_cursor(added[0].position).await.unwrap();
    assert!(c.batch_acks().is_empty());
}

#[tokio::test]
async fn same_name_gives_same_instance_until_closed() {
    let env = Env::new();
    let f = env.factory();
    let a = f.open("t/same", env.config(10)).await.unwrap();
    let b = f.open("t/same", env.config(10)).await.unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    a.close().await.unwrap();
    assert!(matches!(a.add_entries(payloads(0..1)).await, Err(StreamError::Closed(_))));
    let c = f.open("t/same", env.config(10)).await.unwrap();
    assert!(!Arc::ptr_eq(&a, &c));
}

#[tokio::test]
async fn cursor_acks_merge_into_mark_delete_across_ledgers() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/acks", env.config(3)).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..9)).await.unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 9);
    // Acknowledge 1..=4 individually (crossing a ledger boundary at 3), then 0.
    c.delete(&added[1..5].iter().map(|a| a.position).collect::<Vec<_>>()).await.unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 5);
    assert_eq!(c.individually_deleted_ranges().len(), 2, "one range per ledger");
    c.delete(&[added[0].position]).await.unwrap();
    assert_eq!(c.mark_delete_position(), added[4].position);
    assert!(c.individually_deleted_ranges().is_empty());
    assert_eq!(c.number_of_entries_in_backlog(), 4);
    // A cumulative ack behind the mark-delete position changes nothing.
    c.mark_delete(added[1].position).await.unwrap();
    assert_eq!(c.mark_delete_position(), added[4].position);
    // Beyond the last entry is refused.
    let beyond = Position::new(added[8].position.ledger_id, added[8].position.entry_id + 1);
    assert!(matches!(c.mark_delete(beyond).await, Err(StreamError::InvalidPosition(_))));
    assert!(matches!(c.delete(&[beyond]).await, Err(StreamError::InvalidPosition(_))));
    c.mark_delete(added[8].position).await.unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 0);
}

#[tokio::test]
async fn latest_cursor_sees_only_new_entries() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/latest", env.config(100)).await.unwrap();
    ml.add_entries(payloads(0..3)).await.unwrap();
    let c = ml.open_cursor("late", InitialPosition::Latest).await.unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 0);
    assert!(c.read_entries(10).await.unwrap().is_empty());
    let added = ml.add_entries(payloads(3..5)).await.unwrap();
    let got = c.read_entries(10).await.unwrap();
    assert_eq!(got.iter().map(|e| e.position).collect::<Vec<_>>(), vec![added[0].position, added[1].position]);
    // A latest cursor on an empty managed ledger sees the first entry.
    let ml2 = f.open("t/latest-empty", env.config(100)).await.unwrap();
    let c2 = ml2.open_cursor("late", InitialPosition::Latest).await.unwrap();
    let first = ml2.add_entries(payloads(0..1)).await.unwrap();
    assert_eq!(c2.read_entries(10).await.unwrap()[0].position, first[0].position);
}

#[tokio::test]
async fn read_skips_acked_and_rewind_seek_reset() {
    let env = Env::new();
    let f = env.factory();
    // Infinite retention, so that consumed ledgers stay for the resets below.
    let cfg = ManagedLedgerConfig { retention_time: None, retention_size_mb: -1, ..env.config(4) };
    let ml = f.open("t/seek", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..10)).await.unwrap();
    let idx = |v: Vec<magnetar_stream::Entry>| v.iter().map(|e| e.index).collect::<Vec<_>>();
    assert_eq!(idx(c.read_entries(3).await.unwrap()), vec![0, 1, 2]);
    c.delete(&[added[3].position, added[5].position]).await.unwrap();
    assert_eq!(idx(c.read_entries(3).await.unwrap()), vec![4, 6, 7]);
    c.rewind();
    assert_eq!(c.read_position(), added[0].position);
    assert_eq!(idx(c.read_entries(100).await.unwrap()), vec![0, 1, 2, 4, 6, 7, 8, 9]);
    c.seek(added[7].position);
    assert_eq!(idx(c.read_entries(100).await.unwrap()), vec![7, 8, 9]);
    assert!(c.read_entries(100).await.unwrap().is_empty());
    // Reset: everything before 6 acknowledged, individual acks above cleared.
    c.reset_cursor(added[6].position).await.unwrap();
    assert_eq!(c.mark_delete_position(), added[5].position);
    assert!(c.individually_deleted_ranges().is_empty());
    assert_eq!(c.number_of_entries_in_backlog(), 4);
    assert_eq!(idx(c.read_entries(100).await.unwrap()), vec![6, 7, 8, 9]);
    // Reset backwards to the first entry of a ledger: mark-delete is the end of the previous ledger.
    c.reset_cursor(added[4].position).await.unwrap();
    assert_eq!(c.mark_delete_position(), added[3].position);
    assert_eq!(c.number_of_entries_in_backlog(), 6);
    c.reset_cursor(added[0].position).await.unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 10);
}

#[tokio::test]
async fn read_or_wait_wakes_on_append_and_on_close() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/wait", env.config(100)).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let reader = {
        let c = c.clone();
        tokio::spawn(async move { c.read_entries_or_wait(10).await })
    };
    // The reader must be parked (nothing to read); it only completes after the append.
    ml.add_entries(payloads(0..2)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), reader).await.unwrap().unwrap().unwrap();
    assert!(!got.is_empty());
    let waiting = {
        let c = c.clone();
        c.read_entries(10).await.unwrap();
        tokio::spawn(async move { c.read_entries_or_wait(10).await })
    };
    let mut early = ml.new_entries();
    ml.close().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
    assert!(r.is_err());
    // Receivers taken before or after the close stop waiting with an error.
    assert!(early.changed().await.is_err());
    assert!(ml.new_entries().changed().await.is_err());
}

#[tokio::test]
async fn non_durable_cursor_reads_and_does_not_persist() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/nd", env.config(3)).await.unwrap();
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    let c = ml.new_non_durable_cursor(added[2].position).unwrap();
    assert!(!c.is_durable());
    assert_eq!(c.read_entries(100).await.unwrap().len(), 4);
    assert_eq!(c.number_of_entries_in_backlog(), 4);
    c.mark_delete(added[4].position).await.unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 1);
    assert!(ml.cursors().is_empty());
    assert!(env.meta.children("/managed-ledgers/t/nd").unwrap().is_empty());
    // It does not hold back trimming.
    let trimmed = ml.trim().await.unwrap();
    assert_eq!(trimmed.len(), 2);
}

#[tokio::test]
async fn trim_deletes_exactly_consumed_ledgers() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/trim", env.config(3)).await.unwrap();
    let a = ml.open_cursor("a", InitialPosition::Earliest).await.unwrap();
    let b = ml.open_cursor("b", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..10)).await.unwrap();
    let ledger_of = |i: usize| added[i].position.ledger_id;
    assert_eq!(ml.ledgers_info().len(), 4);
    assert!(ml.trim().await.unwrap().is_empty(), "nothing consumed yet");
    a.mark_delete(added[9].position).await.unwrap();
    // b has consumed the first ledger and part of the second.
    b.mark_delete(added[4].position).await.unwrap();
    let trimmed = ml.trim().await.unwrap();
    // A background trim may have run first; either way only ledger 0 goes.
    let ids: Vec<u64> = ml.ledgers_info().iter().map(|i| i.ledger_id).collect();
    assert!(!ids.contains(&ledger_of(0)));
    assert!(ids.contains(&ledger_of(3)));
    assert!(trimmed.is_empty() || trimmed == vec![ledger_of(0)]);
    assert!(!env.store.ledger_ids().contains(&ledger_of(0)));
    assert!(env.store.ledger_ids().contains(&ledger_of(3)));
    // Finishing ledger 1 exactly (its last entry) releases it.
    b.mark_delete(added[5].position).await.unwrap();
    ml.trim().await.unwrap();
    let ids: Vec<u64> = ml.ledgers_info().iter().map(|i| i.ledger_id).collect();
    assert_eq!(ids[0], ledger_of(6));
    // Everything consumed: all but the current ledger are gone; reads still work.
    b.mark_delete(added[9].position).await.unwrap();
    ml.trim().await.unwrap();
    assert_eq!(ml.ledgers_info().len(), 1);
    assert_eq!(ml.ledgers_info()[0].ledger_id, ml.stats().current_ledger_id.unwrap());
    assert_eq!(env.store.ledger_ids(), vec![ml.stats().current_ledger_id.unwrap()]);
    // The record lists what remains.
    let (raw, _) = env.meta.get("/managed-ledgers/t/trim").unwrap().unwrap();
    let rec: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(rec["ledgers"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn trim_below_drops_ledgers_under_the_floor_whatever_retention_once_cursors_pass() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig { retention_time: None, retention_size_mb: -1, ..env.config(2) };
    let ml = f.open("t/trim-below", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    let ledger_of = |i: usize| added[i].position.ledger_id;
    // The cursor has consumed nothing: it holds every ledger.
    assert!(ml.trim_below(3).await.unwrap().is_empty());
    c.mark_delete(added[5].position).await.unwrap();
    // Retention keeps consumed data forever, but messages 0..3 were deleted: the ledger
    // of messages 0 and 1 goes; the one holding message 2 (and 3) stays.
    assert!(ml.trim().await.unwrap().is_empty());
    assert_eq!(ml.trim_below(3).await.unwrap(), vec![ledger_of(0)]);
    let ids: Vec<u64> = ml.ledgers_info().iter().map(|i| i.ledger_id).collect();
    assert_eq!(ids[0], ledger_of(2));
    assert!(!env.store.ledger_ids().contains(&ledger_of(0)));
}

#[tokio::test]
async fn retention_keeps_consumed_ledgers_until_it_expires() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig {
        retention_time: Some(Duration::from_secs(60)),
        retention_size_mb: -1,
        ..env.config(2)
    };
    let ml = f.open("t/retention", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    c.mark_delete(added[5].position).await.unwrap();
    assert!(ml.trim().await.unwrap().is_empty(), "retention time keeps them");
    assert_eq!(ml.ledgers_info().len(), 4);
    env.clock.advance(Duration::from_secs(61));
    let trimmed = ml.trim().await.unwrap();
    assert_eq!(trimmed.len(), 3);
    assert_eq!(ml.ledgers_info().len(), 1);

    // Size retention: 0 MB of consumed data is kept, infinite time.
    let cfg = ManagedLedgerConfig { retention_time: None, retention_size_mb: 0, ..env.config(2) };
    let ml = f.open("t/retention-size", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    c.mark_delete(added[3].position).await.unwrap();
    ml.trim().await.unwrap();
    assert_eq!(ml.ledgers_info().first().unwrap().ledger_id, added[4].position.ledger_id);

    // Infinite retention never trims.
    let cfg = ManagedLedgerConfig { retention_time: None, retention_size_mb: -1, ..env.config(2) };
    let ml = f.open("t/retention-inf", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    c.mark_delete(added[5].position).await.unwrap();
    env.clock.advance(Duration::from_secs(1_000_000));
    assert!(ml.trim().await.unwrap().is_empty());
}

#[tokio::test]
async fn failed_ledger_is_replaced_and_adds_retried() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/fail", env.config(100)).await.unwrap();
    let first = ml.add_entries(payloads(0..3)).await.unwrap();
    let before = ml.stats().current_ledger_id.unwrap();
    env.store.fail_next_adds(1);
    let second = ml.add_entries(payloads(3..6)).await.unwrap();
    assert_ne!(second[0].position.ledger_id, before, "written to a new ledger");
    assert_eq!(second[0].index, 3);
    let all = ml.read_entries(first[0].position, 100).await.unwrap();
    assert_eq!(all.iter().map(|e| e.index).collect::<Vec<_>>(), (0..6).collect::<Vec<u64>>());
    // Two failures in a row: the error is returned, and the index is reused afterwards.
    env.store.fail_next_adds(2);
    let err = ml.add_entries(payloads(6..7)).await.unwrap_err();
    assert!(matches!(err, StreamError::Ledger(_)), "{err}");
    let after = ml.add_entries(payloads(7..8)).await.unwrap();
    assert_eq!(after[0].index, 6);
}

#[tokio::test]
async fn an_entry_too_large_for_the_store_is_refused_alone() {
    let env = Env::new();
    env.store.set_max_entry_size(1000);
    let f = env.factory();
    let ml = f.open("t/too-large", env.config(100)).await.unwrap();
    assert_eq!(ml.max_entry_size(), 1000 - 24);
    ml.add_entries(payloads(0..2)).await.unwrap();
    let ledger = ml.stats().current_ledger_id;
    let big = vec![(Bytes::from(vec![0u8; 977]), 1)];
    let at_most = vec![(Bytes::from(vec![1u8; 976]), 1)];
    // Three adds made together: only the one with an entry too large fails.
    let (a, b, c, d) = tokio::join!(
        ml.add_entries(payloads(2..4)),
        ml.add_entries(big),
        ml.add_entries(at_most),
        ml.add_entries(payloads(4..5)),
    );
    let err = b.unwrap_err();
    let expected = "an entry of 977 bytes is larger than the 976 bytes one entry may hold here";
    assert_eq!(err, StreamError::InvalidArgument(expected.into()));
    let indexes: Vec<u64> = [a.unwrap(), c.unwrap(), d.unwrap()].concat().iter().map(|r| r.index).collect();
    assert_eq!(indexes, vec![2, 3, 4, 5], "no index taken by the refused entry");
    assert_eq!(ml.stats().current_ledger_id, ledger, "the ledger was not given up");
    let all = ml.read_entries(Position::new(0, -1), 100).await.unwrap();
    assert_eq!(all.len(), 6);
    assert_eq!(all[4].data.len(), 976);
}

#[tokio::test]
async fn a_failed_write_fails_the_adds_queued_behind_it() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/fail-queued", env.config(100)).await.unwrap();
    ml.add_entries(payloads(0..2)).await.unwrap();
    env.store.fail_next_adds(2);
    // The rollover request keeps the second add out of the first one's round, so the
    // second is still queued when the first fails for good. Stored, it would land ahead
    // of the first one's resend.
    let (a, _, b) = tokio::join!(
        ml.add_entries(payloads(2..4)),
        ml.check_rollover(),
        ml.add_entries(payloads(4..5)),
    );
    assert!(matches!(a, Err(StreamError::Ledger(_))), "{a:?}");
    assert!(matches!(b, Err(StreamError::Ledger(_))), "queued behind a failed add: {b:?}");
    let after = ml.add_entries(payloads(2..3)).await.unwrap();
    assert_eq!(after[0].index, 2, "the failed adds' indexes are taken again");
}

#[tokio::test]
async fn a_failure_in_flight_retries_the_rounds_behind_it_in_order() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/pipelined-fail", env.config(1_000_000)).await.unwrap();
    let first = ml.add_entries(payloads(0..2)).await.unwrap();
    let before = first[0].position.ledger_id;
    env.store.fail_next_adds(1);
    // Three rounds (each too big to merge with the next) go in flight on the same ledger;
    // the first fails, which fails the others, and all three are written again, in order.
    let (a, b, c) = tokio::join!(
        ml.add_entries(payloads(2..6002)),
        ml.add_entries(payloads(6002..12002)),
        ml.add_entries(payloads(12002..18002)),
    );
    let all: Vec<_> = [a.unwrap(), b.unwrap(), c.unwrap()].concat();
    assert_eq!(all.iter().map(|r| r.index).collect::<Vec<_>>(), (2..18002).collect::<Vec<u64>>());
    assert!(all.iter().all(|r| r.position.ledger_id != before), "written to a new ledger");
    assert!(all.windows(2).all(|w| w[0].position < w[1].position));
    let read = ml.read_entries(all[0].position, 20_000).await.unwrap();
    assert_eq!(read.len(), 18_000);
    assert_eq!(read.last().map(|e| e.index), Some(18_001));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_in_flight_keep_index_and_position_order() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/pipelined", env.config(1_000_000)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let ml = ml.clone();
        tasks.push(tokio::spawn(async move { ml.add_entries(payloads(i * 10..i * 10 + 10)).await }));
    }
    let mut results = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        // One call's entries are contiguous.
        assert!(r.windows(2).all(|w| w[1].index == w[0].index + 1));
        results.extend(r);
    }
    results.sort_by_key(|r| r.index);
    assert_eq!(results.iter().map(|r| r.index).collect::<Vec<_>>(), (0..2000).collect::<Vec<u64>>());
    assert!(results.windows(2).all(|w| w[0].position < w[1].position), "positions follow indexes");
    assert_eq!(ml.stats().entries_added, 2000);
}

#[tokio::test]
async fn rounds_in_flight_do_not_overfill_a_ledger() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/pipelined-full", env.config(15_000)).await.unwrap();
    // Three rounds (each too big to merge with the next) queued at once: the third does not
    // fit beside the two in flight, so it goes to the next ledger.
    let (a, b, c) = tokio::join!(
        ml.add_entries(payloads(0..6000)),
        ml.add_entries(payloads(6000..12000)),
        ml.add_entries(payloads(12000..18000)),
    );
    let all: Vec<_> = [a.unwrap(), b.unwrap(), c.unwrap()].concat();
    let mut per_ledger = std::collections::BTreeMap::new();
    for r in &all {
        *per_ledger.entry(r.position.ledger_id).or_insert(0u32) += 1;
    }
    assert!(per_ledger.values().all(|n| *n <= 15_000), "{per_ledger:?}");
    assert_eq!(all.iter().map(|r| r.index).collect::<Vec<_>>(), (0..18_000).collect::<Vec<u64>>());
}

#[tokio::test]
async fn a_fenced_ledger_fences_the_managed_ledger() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/fenced", env.config(100)).await.unwrap();
    let first = ml.add_entries(payloads(0..3)).await.unwrap();
    // Another owner's recovery fences the ledger: that owner has the topic now, so this
    // instance stops writing instead of racing it with a new ledger.
    env.store.fence(first[0].position.ledger_id);
    assert!(matches!(ml.add_entries(payloads(3..4)).await, Err(StreamError::Fenced(_))));
    assert_eq!(ml.status(), magnetar_stream::MlStatus::Fenced);
    assert!(matches!(ml.add_entries(payloads(3..4)).await, Err(StreamError::Fenced(_))));
    assert_eq!(env.store.ledger_ids().len(), 1, "no new ledger was created");
    // What was written stays readable; closing does not touch the record.
    assert_eq!(ml.read_entries(first[0].position, 10).await.unwrap().len(), 3);
    let (_, version_before) = env.meta.get("/managed-ledgers/t/fenced").unwrap().unwrap();
    ml.close().await.unwrap_or(());
    let (_, version_after) = env.meta.get("/managed-ledgers/t/fenced").unwrap().unwrap();
    assert_eq!(version_before, version_after);
}

#[tokio::test]
async fn cursor_persistence_is_rate_limited_but_flushed() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig { mark_delete_rate_per_sec: 0.001, ..env.config(100) };
    let ml = f.open("t/rate", cfg.clone()).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..5)).await.unwrap();
    let path = "/managed-ledgers/t/rate/s";
    let stored_md = || {
        let (raw, _) = env.meta.get(path).unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        v["markDelete"]["entryId"].as_i64().unwrap()
    };
    c.mark_delete(added[0].position).await.unwrap();
    assert_eq!(stored_md(), 0, "first change is written at once");
    c.mark_delete(added[3].position).await.unwrap();
    assert_eq!(stored_md(), 0, "second change within the interval waits");
    c.flush().await.unwrap();
    assert_eq!(stored_md(), 3);
    c.mark_delete(added[4].position).await.unwrap();
    ml.close().await.unwrap();
    assert_eq!(stored_md(), 4, "close persists pending state");
}

#[tokio::test]
async fn delete_removes_ledgers_cursors_and_record() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/del", env.config(2)).await.unwrap();
    ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    ml.add_entries(payloads(0..5)).await.unwrap();
    assert!(!env.store.ledger_ids().is_empty());
    ml.delete().await.unwrap();
    assert!(env.store.ledger_ids().is_empty());
    assert!(env.meta.get("/managed-ledgers/t/del").unwrap().is_none());
    assert!(env.meta.get("/managed-ledgers/t/del/s").unwrap().is_none());
    // Reopening starts from scratch.
    let ml = f.open("t/del", env.config(2)).await.unwrap();
    assert!(ml.cursors().is_empty());
    assert_eq!(ml.stats().number_of_entries, 0);
    assert_eq!(ml.add_entries(payloads(0..1)).await.unwrap()[0].index, 0);
}

#[tokio::test]
async fn delete_cursor_releases_trimming() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/delcursor", env.config(2)).await.unwrap();
    let slow = ml.open_cursor("slow/one", InitialPosition::Earliest).await.unwrap();
    let fast = ml.open_cursor("fast", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    fast.mark_delete(added[5].position).await.unwrap();
    assert!(ml.trim().await.unwrap().is_empty());
    assert_eq!(env.meta.children("/managed-ledgers/t/delcursor").unwrap(), vec!["fast".to_string(), "slow%2Fone".to_string()]);
    ml.delete_cursor("slow/one").await.unwrap();
    assert!(slow.mark_delete(added[0].position).await.is_err());
    ml.trim().await.unwrap();
    assert_eq!(ml.ledgers_info().len(), 1);
    assert!(matches!(ml.delete_cursor("nope").await, Err(StreamError::NoSuchCursor(_))));
}

#[tokio::test]
async fn a_second_owner_fences_the_first() {
    let env = Env::new();
    let f1 = env.factory();
    let f2 = env.factory();
    let cfg = env.config(2);
    let ml1 = f1.open("t/owners", cfg.clone()).await.unwrap();
    ml1.add_entries(payloads(0..1)).await.unwrap();
    let ml2 = f2.open("t/owners", cfg).await.unwrap();
    // The first owner's ledger was fenced by recovery; replacing it needs the record,
    // which the second owner changed.
    let r = ml1.add_entries(payloads(1..2)).await;
    assert!(matches!(r, Err(StreamError::Fenced(_))), "{r:?}");
    let ok = ml2.add_entries(payloads(1..2)).await.unwrap();
    assert_eq!(ok[0].index, 1);
}

#[tokio::test]
async fn idle_ledger_is_sealed_by_check_rollover_and_then_retention_applies() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig {
        max_rollover_time: Some(Duration::from_secs(60)),
        retention_time: Some(Duration::from_secs(100)),
        retention_size_mb: -1,
        ..env.config(100)
    };
    let ml = f.open("t/idle", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..3)).await.unwrap();
    c.mark_delete(added[2].position).await.unwrap();
    assert!(!ml.check_rollover().await.unwrap(), "young ledger stays");
    env.clock.advance(Duration::from_secs(61));
    assert!(ml.check_rollover().await.unwrap(), "old ledger is sealed");
    assert_ne!(ml.stats().current_ledger_id, Some(added[0].position.ledger_id));
    assert!(!ml.check_rollover().await.unwrap(), "an empty ledger is never rolled");
    assert!(ml.trim().await.unwrap().is_empty(), "sealed just now: retention keeps it");
    env.clock.advance(Duration::from_secs(101));
    assert_eq!(ml.trim().await.unwrap(), vec![added[0].position.ledger_id]);
    // Appends go on in the new ledger with the next index.
    assert_eq!(ml.add_entries(payloads(3..4)).await.unwrap()[0].index, 3);
}

#[tokio::test]
async fn ledger_without_writes_for_the_inactive_rollover_time_is_sealed() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig {
        inactive_rollover_time: Some(Duration::from_secs(30)),
        retention_time: None,
        retention_size_mb: -1,
        ..env.config(100)
    };
    let ml = f.open("t/inactive", cfg).await.unwrap();
    let first = ml.add_entries(payloads(0..2)).await.unwrap()[0].position.ledger_id;
    env.clock.advance(Duration::from_secs(20));
    ml.add_entries(payloads(2..3)).await.unwrap();
    env.clock.advance(Duration::from_secs(29));
    assert!(!ml.check_rollover().await.unwrap(), "written 29 s ago: the ledger stays, whatever its age");
    assert_eq!(ml.stats().current_ledger_id, Some(first));
    env.clock.advance(Duration::from_secs(1));
    assert!(ml.check_rollover().await.unwrap(), "30 s without an entry: sealed");
    let second = ml.stats().current_ledger_id.unwrap();
    assert_ne!(second, first);
    let sealed = ml.ledgers_info()[0];
    assert_eq!((sealed.ledger_id, sealed.entries), (first, 3));
    assert_eq!(sealed.timestamp, env.clock.now_ms(), "sealed now");
    env.clock.advance(Duration::from_secs(3600));
    assert!(!ml.check_rollover().await.unwrap(), "an empty ledger is never rolled");
    let next = ml.add_entries(payloads(3..4)).await.unwrap()[0];
    assert_eq!((next.position.ledger_id, next.position.entry_id, next.index), (second, 0, 3));
}

#[tokio::test]
async fn inactive_rollover_is_off_by_default() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig { max_rollover_time: None, retention_time: None, ..env.config(100) };
    let ml = f.open("t/inactive-off", cfg).await.unwrap();
    let first = ml.add_entries(payloads(0..1)).await.unwrap()[0].position.ledger_id;
    env.clock.advance(Duration::from_secs(365 * 86_400));
    assert!(!ml.check_rollover().await.unwrap());
    assert_eq!(ml.stats().current_ledger_id, Some(first));
}

/// Retention of 10 s by time only, with no rollover by age: only retention seals a ledger.
fn ten_second_retention(env: &Env) -> ManagedLedgerConfig {
    ManagedLedgerConfig {
        max_rollover_time: None,
        retention_time: Some(Duration::from_secs(10)),
        retention_size_mb: -1,
        ..env.config(1000)
    }
}

#[tokio::test]
async fn ledger_whose_entries_all_outlived_retention_is_sealed_and_then_trimmed() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ten_second_retention(&env);
    let ml = f.open("t/expired", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    // Steady writes, one every 9 s for far longer than retention: one ledger throughout.
    let mut last = None;
    for i in 0..20 {
        let added = ml.add_entries(payloads(i..i + 1)).await.unwrap();
        c.mark_delete(added[0].position).await.unwrap();
        last = Some(added[0]);
        env.clock.advance(Duration::from_secs(9));
        assert!(!ml.check_rollover().await.unwrap(), "written to within retention: not sealed");
        assert!(ml.trim().await.unwrap().is_empty());
    }
    let last = last.unwrap();
    assert_eq!(ml.ledgers_info().len(), 1);
    assert_eq!(ml.stats().current_ledger_entries, 20);
    // No more writes: once the newest entry is older than retention, the ledger is sealed
    // and the trim that follows deletes it.
    env.clock.advance(Duration::from_secs(1));
    assert!(ml.check_rollover().await.unwrap());
    assert_eq!(ml.trim().await.unwrap(), vec![last.position.ledger_id]);
    assert_eq!(ml.first_index(), 20);
    assert_eq!(ml.next_index(), 20);
    assert!(!ml.check_rollover().await.unwrap(), "an empty ledger is never rolled");
    assert_eq!(ml.add_entries(payloads(20..21)).await.unwrap()[0].index, 20);
}

#[tokio::test]
async fn ledger_past_retention_waits_for_its_cursors_and_zero_retention_seals_nothing() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ten_second_retention(&env);
    let ml = f.open("t/expired-unread", cfg).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..3)).await.unwrap();
    env.clock.advance(Duration::from_secs(10));
    assert!(ml.check_rollover().await.unwrap());
    assert!(ml.trim().await.unwrap().is_empty(), "the cursor has not passed it");
    c.mark_delete(added[2].position).await.unwrap();
    assert_eq!(ml.trim().await.unwrap(), vec![added[0].position.ledger_id]);

    // Retention 0 (Pulsar's default) drops consumed ledgers at once; it seals none.
    let cfg = ManagedLedgerConfig { max_rollover_time: None, retention_time: Some(Duration::ZERO), ..env.config(1000) };
    let ml = f.open("t/zero-retention", cfg).await.unwrap();
    let first = ml.add_entries(payloads(0..1)).await.unwrap()[0].position.ledger_id;
    env.clock.advance(Duration::from_secs(86_400));
    assert!(!ml.check_rollover().await.unwrap());
    assert_eq!(ml.stats().current_ledger_id, Some(first));
}

#[tokio::test]
async fn trim_keeps_the_last_ledger_while_no_ledger_is_writable() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/nowriter", env.config(100)).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..3)).await.unwrap();
    c.mark_delete(added[2].position).await.unwrap();
    // The ledger fails and no replacement can be created.
    env.store.fail_next_adds(1);
    env.store.fail_next_creates(1);
    assert!(ml.add_entries(payloads(3..4)).await.is_err());
    assert_eq!(ml.stats().current_ledger_id, None);
    ml.trim().await.unwrap();
    assert_eq!(ml.ledgers_info().len(), 1, "the last ledger stays");
    let next = ml.add_entries(payloads(3..4)).await.unwrap();
    assert_eq!(next[0].index, 3);
    assert!(next[0].position > added[2].position);
    assert_eq!(c.number_of_entries_in_backlog(), 1);
    assert_eq!(c.read_entries(10).await.unwrap()[0].index, 3);
}

#[tokio::test]
async fn individual_ack_of_a_position_that_does_not_exist_is_refused() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/bad-ack", env.config(3)).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(payloads(0..6)).await.unwrap();
    let gap = Position::new(added[0].position.ledger_id, 7);
    assert!(matches!(c.delete(&[gap]).await, Err(StreamError::InvalidPosition(_))));
    assert!(matches!(c.delete(&[Position::new(12_345, 0)]).await, Err(StreamError::InvalidPosition(_))));
    assert_eq!(c.number_of_entries_in_backlog(), 6);
    c.delete(&[added[4].position]).await.unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 5);
}

#[tokio::test]
async fn concurrent_open_cursor_gives_one_cursor() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/open-race", env.config(10)).await.unwrap();
    let (a, b) = tokio::join!(
        ml.open_cursor("same", InitialPosition::Earliest),
        ml.open_cursor("same", InitialPosition::Latest)
    );
    assert!(Arc::ptr_eq(&a.unwrap(), &b.unwrap()));
    assert_eq!(ml.cursors().len(), 1);
}

#[tokio::test]
async fn only_the_oldest_ranges_are_persisted_beyond_the_limit() {
    let env = Env::new();
    let cfg = ManagedLedgerConfig { max_unacked_ranges_to_persist: 2, ..env.config(100) };
    let added;
    {
        let f = env.factory();
        let ml = f.open("t/ranges", cfg.clone()).await.unwrap();
        let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
        added = ml.add_entries(payloads(0..8)).await.unwrap();
        c.delete(&[added[1].position, added[3].position, added[5].position]).await.unwrap();
        assert_eq!(c.individually_deleted_ranges().len(), 3);
        ml.close().await.unwrap();
    }
    let f = env.factory();
    let ml = f.open("t/ranges", cfg).await.unwrap();
    let c = ml.cursor("s").unwrap();
    assert_eq!(
        c.individually_deleted_ranges(),
        vec![(added[1].position, added[1].position), (added[3].position, added[3].position)]
    );
    // The acknowledgement that did not fit is delivered again, never lost.
    assert_eq!(c.number_of_entries_in_backlog(), 6);
}

#[tokio::test]
async fn tailing_reads_come_from_the_cache_until_entries_age_out() {
    let env = Env::new();
    let f = env.factory();
    let cfg = ManagedLedgerConfig { cache_eviction_time: Duration::from_secs(1), ..env.config(100) };
    let ml = f.open("t/cache", cfg).await.unwrap();
    let old = ml.add_entries(payloads(0..3)).await.unwrap();
    env.store.fail_next_reads(1_000);
    assert_eq!(ml.read_entries(old[0].position, 10).await.unwrap().len(), 3, "served from memory");
    env.clock.advance(Duration::from_secs(2));
    let new = ml.add_entries(payloads(3..4)).await.unwrap();
    assert_eq!(ml.read_entries(new[0].position, 10).await.unwrap().len(), 1);
    assert!(ml.read_entries(old[0].position, 10).await.is_err(), "aged out: read from the ledger");
    env.store.fail_next_reads(0);
    assert_eq!(ml.read_entries(old[0].position, 10).await.unwrap().len(), 4);
}

/// Waits (bounded) for the factory's sweep to empty the shared cache.
async fn until_cache_empty(f: &ManagedLedgerFactory) {
    let budget = f.cache_budget().unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while budget.used() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the sweep left {} bytes cached", budget.used()));
}

#[tokio::test]
async fn the_cache_sweep_rests_while_nothing_is_cached_and_resumes_on_the_next_entry() {
    let env = Env::new();
    let f = env.factory_with_cache(1 << 20);
    let cfg = ManagedLedgerConfig { cache_eviction_time: Duration::from_secs(1), ..env.config(100) };
    let ml = f.open("t/sweep", cfg).await.unwrap();
    for round in 0..2 {
        ml.add_entries(payloads(0..3)).await.unwrap();
        assert!(f.cache_budget().unwrap().used() > 0, "round {round}: cached");
        env.clock.advance(Duration::from_secs(2));
        // The first round empties the cache from the timer; the second one also needs the
        // sweep, which rested meanwhile, to have been woken by the new entries.
        until_cache_empty(&f).await;
    }
}

#[tokio::test]
async fn log_start_and_end_indexes_and_properties() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/offsets", env.config(2)).await.unwrap();
    assert_eq!((ml.first_index(), ml.next_index()), (0, 0));
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let added = ml.add_entries(vec![(Bytes::from("a"), 3), (Bytes::from("b"), 2), (Bytes::from("c"), 4)]).await.unwrap();
    assert_eq!((ml.first_index(), ml.next_index()), (0, 9));
    c.mark_delete(added[1].position).await.unwrap();
    ml.trim().await.unwrap();
    assert_eq!((ml.first_index(), ml.next_index()), (5, 9), "the first ledger (5 messages) is gone");
    ml.set_property("owner", Some("broker-1".into())).await.unwrap();
    ml.close().await.unwrap();
    let ml = f.open("t/offsets", env.config(2)).await.unwrap();
    assert_eq!(ml.properties().get("owner").map(String::as_str), Some("broker-1"));
    assert_eq!((ml.first_index(), ml.next_index()), (5, 9));
}

#[tokio::test]
async fn repeated_index_lookups_are_answered_from_the_sparse_index() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/sparse", ManagedLedgerConfig { cache_size_bytes: 0, ..env.config(1000) }).await.unwrap();
    let added = ml.add_entries(payloads(0..500)).await.unwrap();
    let want: Vec<u64> = vec![3, 77, 130, 257, 499];
    for i in &want {
        assert_eq!(ml.find_position_by_index(*i).await.unwrap(), added[*i as usize].position);
    }
    // Every probe of those searches is remembered: the same lookups need no read.
    env.store.fail_next_reads(1_000_000);
    for i in &want {
        assert_eq!(ml.find_position_by_index(*i).await.unwrap(), added[*i as usize].position);
    }
    env.store.fail_next_reads(0);
    // Every 64th entry was remembered when it was appended: a new lookup searches at most
    // 64 entries, so it needs at most 7 reads (instead of about 9 over 500 entries).
    let before = env.store.read_calls();
    assert_eq!(ml.find_position_by_index(300).await.unwrap(), added[300].position);
    let reads = env.store.read_calls() - before;
    assert!((1..=7).contains(&reads), "{reads} reads");
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Whatever the batch shapes and ledger sizes: indexes are contiguous, reads
        /// return every entry in order, and every index is found in its entry.
        #[test]
        fn appends_reads_and_finds_agree(
            max_entries in 1u64..6,
            batches in proptest::collection::vec(proptest::collection::vec(1u32..5, 1..6), 1..8),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let env = Env::new();
                let f = env.factory();
                let ml = f.open("t/prop", ManagedLedgerConfig { cache_size_bytes: 0, ..env.config(max_entries) }).await.unwrap();
                let mut added = Vec::new();
                for b in &batches {
                    let entries = b.iter().map(|n| (Bytes::from(vec![0u8; *n as usize]), *n)).collect();
                    added.extend(ml.add_entries(entries).await.unwrap());
                }
                let all = ml.read_entries(Position::new(0, -1), usize::MAX).await.unwrap();
                assert_eq!(all.len(), added.len());
                let mut next_index = 0u64;
                for (e, a) in all.iter().zip(&added) {
                    assert_eq!(e.position, a.position);
                    assert_eq!(e.first_index(), next_index);
                    assert_eq!(e.index, a.index);
                    assert!(e.position.entry_id < max_entries as i64);
                    next_index = e.index + 1;
                }
                for e in &all {
                    for idx in e.first_index()..=e.index {
                        assert_eq!(ml.find_position_by_index(idx).await.unwrap(), e.position);
                    }
                }
            });
        }
    }
}

type Added = magnetar_stream::Result<Vec<magnetar_stream::AddResult>>;

/// Start an add with a callback; the receiver gets what the callback was given.
fn start_add(ml: &magnetar_stream::ManagedLedger, entries: Vec<(Bytes, u32)>) -> tokio::sync::oneshot::Receiver<Added> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    ml.start_add_entries(entries, Box::new(move |r| tx.send(r).unwrap()));
    rx
}

#[tokio::test]
async fn callback_adds_are_answered_in_call_order_beside_awaited_ones() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/callback", env.config(4)).await.unwrap();
    let first = start_add(&ml, payloads(0..3));
    let awaited = {
        let ml = ml.clone();
        tokio::spawn(async move { ml.add_entries(payloads(3..6)).await })
    };
    let second = start_add(&ml, payloads(6..10));
    let first = tokio::time::timeout(Duration::from_secs(10), first).await.unwrap().unwrap().unwrap();
    assert_eq!(first.iter().map(|a| a.index).collect::<Vec<_>>(), [0, 1, 2]);
    let second = tokio::time::timeout(Duration::from_secs(10), second).await.unwrap().unwrap().unwrap();
    assert_eq!(second.len(), 4);
    let awaited = awaited.await.unwrap().unwrap();
    assert_eq!(awaited.len(), 3);
    // Every entry has one index, across rollovers (4 entries per ledger).
    let mut all: Vec<_> = first.iter().chain(&awaited).chain(&second).map(|a| (a.position, a.index)).collect();
    all.sort();
    assert_eq!(all.iter().map(|(_, i)| *i).collect::<Vec<_>>(), (0..10).collect::<Vec<u64>>());
    let read = ml.read_entries(first[0].position, 100).await.unwrap();
    assert_eq!(read.len(), 10);
}

#[tokio::test]
async fn a_refused_callback_add_is_told_why_at_once() {
    let env = Env::new();
    let f = env.factory();
    let ml = f.open("t/callback-refused", env.config(10)).await.unwrap();
    let bad = start_add(&ml, vec![(Bytes::from_static(b"x"), 0)]);
    assert!(matches!(bad.await.unwrap(), Err(StreamError::InvalidArgument(_))));
    let empty = start_add(&ml, Vec::new());
    assert!(empty.await.unwrap().unwrap().is_empty());
    ml.close().await.unwrap();
    let closed = start_add(&ml, payloads(0..1));
    assert!(matches!(closed.await.unwrap(), Err(StreamError::Closed(_))));
}
