//! Ledger logic against in-memory bookies: quorum writes, striping, ensemble change,
//! degraded writing, fencing and recovery, close, reopen and delete.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use magnetar_ledger::entry;
use magnetar_ledger::mem::MemBookies;
use magnetar_ledger::metadata::ledger_path;
use magnetar_ledger::quorum::write_set;
use magnetar_ledger::{BookKeeper, BookieTransport, ClientConfig, LedgerError, LedgerMetadata, LedgerState};
use magnetar_meta::{MemStore, MetadataStore};

struct Cluster {
    store: Arc<MemStore>,
    bookies: Arc<MemBookies>,
    bk: BookKeeper,
}

fn addr(i: usize) -> String {
    format!("127.0.0.1:{}", 3181 + i)
}

fn cluster(n: usize) -> Cluster {
    let store = Arc::new(MemStore::default());
    let bookies = Arc::new(MemBookies::new());
    for i in 0..n {
        bookies.add_bookie(&addr(i));
        store.put(&format!("/ledgers/available/{}", addr(i)), b"", None).unwrap();
    }
    let bk = BookKeeper::with_transport(store.clone(), ClientConfig::default(), bookies.clone());
    Cluster { store, bookies, bk }
}

fn payload(i: usize) -> Bytes {
    Bytes::from(format!("entry-{i}"))
}

fn stored_metadata(store: &MemStore, id: u64) -> LedgerMetadata {
    let (bytes, _) = store.get(&ledger_path(id)).unwrap().unwrap();
    LedgerMetadata::from_json("/", &bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_one_bookie() {
    let c = cluster(1);
    let lh = c.bk.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    for i in 0..10 {
        assert_eq!(lh.add_entry(payload(i)).await.unwrap(), i as u64);
    }
    assert_eq!(lh.last_add_confirmed(), 9);
    let got = lh.read_entries(0, 9).await.unwrap();
    assert_eq!(got, (0..10).map(|i| (i as u64, payload(i))).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_adds_stripe_over_write_sets() {
    let c = cluster(3);
    let lh = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let ids = lh.add_entries((0..30).map(payload).collect()).await.unwrap();
    assert_eq!(ids, (0..30).collect::<Vec<u64>>());
    let ensemble = lh.metadata().current_ensemble().to_vec();
    for (slot, bookie) in ensemble.iter().enumerate() {
        let expected: Vec<u64> = (0..30u64).filter(|e| write_set(*e, 3, 2).any(|s| s == slot)).collect();
        assert_eq!(c.bookies.entries(bookie, lh.id()), expected, "bookie {bookie} in slot {slot}");
    }
    let got = lh.read_entries(5, 29).await.unwrap();
    assert_eq!(got.len(), 25);
    assert_eq!(got[0], (5, payload(5)));
    assert!(matches!(lh.read_entries(0, 30).await, Err(LedgerError::ReadBeyondLac { lac: 29, .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_bookies_is_not_enough_bookies() {
    let c = cluster(2);
    let err = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.err().unwrap();
    assert_eq!(err, LedgerError::NotEnoughBookies);
    assert_eq!(err.to_string(), "Not enough non-faulty bookies available");
    assert!(matches!(c.bk.create_ledger(2, 3, 1, BTreeMap::new()).await, Err(LedgerError::InvalidArgument(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_is_written_as_documented() {
    let c = cluster(3);
    let mut custom = BTreeMap::new();
    custom.insert("owner".to_string(), "topic-a".to_string());
    let a = c.bk.create_ledger(2, 2, 1, custom).await.unwrap();
    let b = c.bk.create_ledger(2, 2, 1, BTreeMap::new()).await.unwrap();
    assert_eq!((a.id(), b.id()), (0, 1));
    assert_eq!(c.store.get("/ledgers/idgen").unwrap().unwrap().0, b"1");
    let (bytes, _) = c.store.get(&ledger_path(a.id())).unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["state"], "OPEN");
    assert_eq!(v["ensembleSize"], 2);
    assert_eq!(v["customMetadata"]["owner"], "topic-a");
    assert_eq!(v["ensembles"][0][0], 0);
    assert_ne!(a.metadata().current_ensemble(), b.metadata().current_ensemble(), "ensembles rotate over bookies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_bookie_is_replaced_and_writing_goes_on() {
    let c = cluster(4);
    let lh = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..10).map(payload).collect()).await.unwrap();
    let victim = lh.metadata().current_ensemble()[1].clone();
    c.bookies.set_down(&victim, true);
    let ids = lh.add_entries((10..20).map(payload).collect()).await.unwrap();
    assert_eq!(ids, (10..20).collect::<Vec<u64>>());
    let meta = stored_metadata(&c.store, lh.id());
    assert_eq!(meta.ensembles.len(), 2);
    assert_eq!(meta.ensembles[1].0, 10);
    assert!(!meta.ensembles[1].1.contains(&victim));
    assert_eq!(lh.metadata(), meta);
    let got = lh.read_entries(0, 19).await.unwrap();
    assert_eq!(got, (0..20).map(|i| (i as u64, payload(i))).collect::<Vec<_>>());
    // The replacement holds exactly the new fragment's entries of its slot.
    let replacement = &meta.ensembles[1].1[1];
    let expected: Vec<u64> = (10..20u64).filter(|e| write_set(*e, 3, 2).any(|s| s == 1)).collect();
    assert_eq!(c.bookies.entries(replacement, lh.id()), expected);
    lh.close().await.unwrap();
    let meta = stored_metadata(&c.store, lh.id());
    assert_eq!((meta.state, meta.last_entry_id), (LedgerState::Closed, 19));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replacement_fails_pending_and_later_adds() {
    let c = cluster(3);
    let lh = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..4).map(payload).collect()).await.unwrap();
    c.bookies.set_down(&addr(0), true);
    let err = lh.add_entries((4..10).map(payload).collect()).await.err().unwrap();
    assert_eq!(err, LedgerError::NotEnoughBookies);
    assert_eq!(lh.add_entry(payload(11)).await, Err(LedgerError::NotEnoughBookies));
    assert!(lh.last_add_confirmed() >= 3);
    // Closing records what was confirmed.
    lh.close().await.unwrap();
    let meta = stored_metadata(&c.store, lh.id());
    assert_eq!(meta.last_entry_id, lh.last_add_confirmed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replacement_writing_goes_on_when_ack_quorum_holds() {
    let c = cluster(3);
    let lh = c.bk.create_ledger(3, 3, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..4).map(payload).collect()).await.unwrap();
    c.bookies.set_down(&addr(2), true);
    let ids = lh.add_entries((4..12).map(payload).collect()).await.unwrap();
    assert_eq!(ids.last(), Some(&11));
    assert_eq!(stored_metadata(&c.store, lh.id()).ensembles.len(), 1);
    assert_eq!(lh.read_entries(0, 11).await.unwrap().len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_change_survives_a_concurrent_metadata_edit() {
    let c = cluster(4);
    let lh = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..5).map(payload).collect()).await.unwrap();
    // An admin tool edits the record behind the writer's back.
    let path = ledger_path(lh.id());
    let (bytes, v) = c.store.get(&path).unwrap().unwrap();
    let mut meta = LedgerMetadata::from_json(&path, &bytes).unwrap();
    meta.custom_metadata.insert("note".into(), "edited".into());
    c.store.put(&path, &meta.to_json(), Some(v)).unwrap();
    c.bookies.set_down(&lh.metadata().current_ensemble()[0], true);
    lh.add_entries((5..10).map(payload).collect()).await.unwrap();
    let stored = stored_metadata(&c.store, lh.id());
    assert_eq!(stored.ensembles.len(), 2);
    assert_eq!(stored.custom_metadata.get("note").map(String::as_str), Some("edited"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fences_the_writer_and_keeps_unconfirmed_tail() {
    let c = cluster(3);
    let writer = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let id = writer.id();
    let acked = writer.add_entries((0..10).map(payload).collect()).await.unwrap();
    // Entries 10 and 11 reached their write sets but the writer never saw them confirmed.
    let ensemble = writer.metadata().current_ensemble().to_vec();
    let mut length = writer.length();
    for e in 10u64..12 {
        let data = payload(e as usize);
        length += data.len() as u64;
        let framed = entry::encode(id, e, length, &data);
        for slot in write_set(e, 3, 2) {
            c.bookies.add(&ensemble[slot], id, e, 9, framed.clone(), false).await.unwrap();
        }
    }
    let other = BookKeeper::with_transport(c.store.clone(), ClientConfig::default(), c.bookies.clone());
    let reader = other.open_ledger(id, true).await.unwrap();
    let meta = reader.metadata();
    assert_eq!(meta.state, LedgerState::Closed);
    assert_eq!(meta.last_entry_id, 11);
    assert!(meta.last_entry_id >= *acked.last().unwrap() as i64);
    assert_eq!(meta.length, length);
    assert_eq!(reader.last_add_confirmed(), 11);
    assert_eq!(writer.add_entry(payload(99)).await, Err(LedgerError::Fenced));
    assert_eq!(writer.add_entry(payload(100)).await, Err(LedgerError::Fenced));
    let got = reader.read_entries(0, 11).await.unwrap();
    assert_eq!(got, (0..12).map(|i| (i as u64, payload(i))).collect::<Vec<_>>());
    assert!(matches!(reader.add_entry(payload(1)).await, Err(LedgerError::ReadOnly)));
    // Recovering again finds it closed and changes nothing.
    let again = other.open_ledger(id, true).await.unwrap();
    assert_eq!(again.metadata(), stored_metadata(&c.store, id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_tolerates_a_dead_bookie_and_a_partial_tail() {
    let c = cluster(4);
    let writer = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let id = writer.id();
    let ensemble = writer.metadata().current_ensemble().to_vec();
    // A writer that crashed before any bookie learned a LAC: entries 0..=5 on their whole
    // write sets, entry 6 on one bookie of its write set only.
    let mut length = 0;
    for e in 0u64..7 {
        let data = payload(e as usize);
        length += data.len() as u64;
        let framed = entry::encode(id, e, length, &data);
        let copies = if e == 6 { 1 } else { 2 };
        for slot in write_set(e, 3, 2).take(copies) {
            c.bookies.add(&ensemble[slot], id, e, -1, framed.clone(), false).await.unwrap();
        }
    }
    // The bookie of slot 2 (not in entry 6's write set) is down: recovery fences the
    // other two, and re-adds entries of slot 2 to a replacement.
    c.bookies.set_down(&ensemble[2], true);
    let reader = c.bk.open_ledger(id, true).await.unwrap();
    let meta = reader.metadata();
    assert_eq!(meta.last_entry_id, 6);
    assert_eq!(meta.ensembles.len(), 2);
    assert!(!meta.current_ensemble().contains(&ensemble[2]));
    let got = reader.read_entries(0, 6).await.unwrap();
    assert_eq!(got, (0..7).map(|i| (i as u64, payload(i))).collect::<Vec<_>>());
    for slot in write_set(6, 3, 2) {
        assert!(c.bookies.entries(&meta.current_ensemble()[slot], id).contains(&6));
    }
    assert_eq!(writer.add_entry(payload(7)).await, Err(LedgerError::Fenced));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_of_an_empty_ledger_closes_it_empty() {
    let c = cluster(2);
    let writer = c.bk.create_ledger(2, 2, 2, BTreeMap::new()).await.unwrap();
    let reader = c.bk.open_ledger(writer.id(), true).await.unwrap();
    let meta = reader.metadata();
    assert_eq!((meta.state, meta.last_entry_id, meta.length), (LedgerState::Closed, -1, 0));
    assert_eq!(writer.add_entry(payload(0)).await, Err(LedgerError::Fenced));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fails_when_too_few_bookies_answer() {
    let c = cluster(1);
    let writer = c.bk.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    writer.add_entry(payload(0)).await.unwrap();
    c.bookies.set_down(&addr(0), true);
    let err = c.bk.open_ledger(writer.id(), true).await.err().unwrap();
    assert!(matches!(err, LedgerError::Recovery { .. }), "{err}");
    assert_eq!(stored_metadata(&c.store, writer.id()).state, LedgerState::InRecovery);
    // Once the bookie is back, recovery completes.
    c.bookies.set_down(&addr(0), false);
    let reader = c.bk.open_ledger(writer.id(), true).await.unwrap();
    assert_eq!(reader.metadata().last_entry_id, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_then_reopen_reads_everything() {
    let c = cluster(3);
    let lh = c.bk.create_ledger(3, 3, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..7).map(payload).collect()).await.unwrap();
    let length = lh.length();
    assert_eq!(length, (0..7).map(|i| payload(i).len() as u64).sum::<u64>());
    lh.close().await.unwrap();
    lh.close().await.unwrap();
    assert_eq!(lh.add_entry(payload(7)).await, Err(LedgerError::LedgerClosed));
    let meta = stored_metadata(&c.store, lh.id());
    assert_eq!((meta.state, meta.last_entry_id, meta.length), (LedgerState::Closed, 6, length));
    let reader = c.bk.open_ledger(lh.id(), false).await.unwrap();
    assert!(reader.is_closed());
    assert_eq!(reader.read_entries(0, 6).await.unwrap().len(), 7);
    assert_eq!(reader.length(), length);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_without_recovery_reads_up_to_bookie_lac() {
    let c = cluster(2);
    let writer = c.bk.create_ledger(2, 2, 2, BTreeMap::new()).await.unwrap();
    for i in 0..5 {
        writer.add_entry(payload(i)).await.unwrap();
    }
    let reader = c.bk.open_ledger(writer.id(), false).await.unwrap();
    // Bookies learn the LAC from the next add, so they report one behind the writer.
    assert_eq!(reader.last_add_confirmed(), 3);
    assert_eq!(reader.read_entries(0, 3).await.unwrap().len(), 4);
    writer.add_entry(payload(5)).await.unwrap();
    assert_eq!(reader.read_last_add_confirmed().await.unwrap(), 4);
    // The writer is not fenced by a plain open.
    writer.add_entry(payload(6)).await.unwrap();
    writer.close().await.unwrap();
    assert_eq!(reader.read_last_add_confirmed().await.unwrap(), 6);
    assert!(reader.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_copy_falls_back_to_another_bookie() {
    let c = cluster(2);
    let lh = c.bk.create_ledger(2, 2, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..3).map(payload).collect()).await.unwrap();
    let first = lh.metadata().current_ensemble()[write_set(1, 2, 2).next().unwrap()].clone();
    c.bookies.add(&first, lh.id(), 1, 0, Bytes::from_static(b"garbage that is long enough"), true).await.unwrap();
    assert_eq!(lh.read_entries(1, 1).await.unwrap(), vec![(1, payload(1))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_bookie_data_and_metadata() {
    let c = cluster(4);
    let lh = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..6).map(payload).collect()).await.unwrap();
    c.bookies.set_down(&lh.metadata().current_ensemble()[0], true);
    lh.add_entries((6..9).map(payload).collect()).await.unwrap();
    let meta = lh.metadata();
    lh.close().await.unwrap();
    c.bookies.set_down(&meta.ensembles[0].1[0], false);
    c.bk.delete_ledger(lh.id()).await.unwrap();
    for b in meta.all_bookies() {
        assert!(!c.bookies.has_ledger(&b, lh.id()), "{b} still has the ledger");
    }
    assert!(c.store.get(&ledger_path(lh.id())).unwrap().is_none());
    assert_eq!(c.bk.open_ledger(lh.id(), false).await.err(), Some(LedgerError::NoSuchLedger(lh.id())));
    assert_eq!(c.bk.delete_ledger(lh.id()).await, Err(LedgerError::NoSuchLedger(lh.id())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_entry_is_refused_without_breaking_the_writer() {
    let c = cluster(1);
    let lh = c.bk.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    let huge = Bytes::from(vec![0u8; entry::MAX_PAYLOAD + 1]);
    assert!(matches!(lh.add_entry(huge).await, Err(LedgerError::EntryTooLarge { .. })));
    let batch = vec![payload(0), Bytes::from(vec![0u8; entry::MAX_PAYLOAD + 1])];
    assert!(matches!(lh.add_entries(batch).await, Err(LedgerError::EntryTooLarge { .. })));
    assert_eq!(lh.add_entry(payload(0)).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_adds_from_a_plain_thread_keep_call_order() {
    let c = cluster(3);
    let lh = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let runtime = tokio::runtime::Handle::current();
    let writer = lh.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        // No runtime context on this thread: ids are assigned at call time, completions
        // awaited later.
        let futures: Vec<_> = (0..50).map(|i| writer.add_entry_pipelined(payload(i))).collect();
        let ids: Vec<u64> = futures.into_iter().map(|f| runtime.block_on(f).unwrap()).collect();
        let _ = tx.send(ids);
    });
    let ids = rx.await.unwrap();
    assert_eq!(ids, (0..50).collect::<Vec<u64>>());
    assert_eq!(lh.read_entries(0, 49).await.unwrap(), (0..50).map(|i| (i as u64, payload(i))).collect::<Vec<_>>());
}

/// Ledger `id`'s entries as the bookies of its (current) metadata return them.
async fn read_all(bk: &BookKeeper, id: u64, n: usize) -> Vec<(u64, Bytes)> {
    let reader = bk.open_ledger(id, false).await.unwrap();
    reader.read_entries(0, n as u64 - 1).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bookie_is_replaced_in_closed_ledgers_with_copies_of_what_it_held() {
    // Two bookies to write on; two more join later.
    let c = cluster(2);
    let writer = c.bk.create_ledger(2, 2, 2, BTreeMap::new()).await.unwrap();
    writer.add_entries((0..20).map(payload).collect()).await.unwrap();
    let open = c.bk.create_ledger(2, 2, 2, BTreeMap::new()).await.unwrap();
    open.add_entry(payload(0)).await.unwrap();
    writer.close().await.unwrap();
    for i in 2..4 {
        c.bookies.add_bookie(&addr(i));
        c.store.put(&format!("/ledgers/available/{}", addr(i)), b"", None).unwrap();
    }
    // Bookie 0 is lost for good.
    c.bookies.set_down(&addr(0), true);
    c.store.delete(&format!("/ledgers/available/{}", addr(0)), None).unwrap();

    assert_eq!(c.bk.replace_bookie(open.id(), &addr(0), 7).await.unwrap(), magnetar_ledger::Replacement::NotClosed);
    let done = c.bk.replace_bookie(writer.id(), &addr(0), 7).await.unwrap();
    let magnetar_ledger::Replacement::Replaced { bookies, entries } = done else { panic!("{done:?}") };
    assert_eq!(entries, 20, "E=Qw=2: the lost bookie held every entry");
    assert_eq!(bookies.len(), 1);
    let new = &bookies[0];
    assert!(*new == addr(2) || *new == addr(3));
    let meta = stored_metadata(&c.store, writer.id());
    assert_eq!(meta.ensembles, vec![(0, vec![new.clone(), addr(1)])]);
    assert_eq!(meta.state, LedgerState::Closed);
    assert_eq!(c.bookies.entries(new, writer.id()), (0..20).collect::<Vec<_>>());

    // With the other original copy gone too, the ledger reads from the new one.
    c.bookies.set_down(&addr(1), true);
    assert_eq!(read_all(&c.bk, writer.id(), 20).await, (0..20).map(|i| (i as u64, payload(i))).collect::<Vec<_>>());
    // A second pass has nothing to do.
    assert_eq!(
        c.bk.replace_bookie(writer.id(), &addr(0), 7).await.unwrap(),
        magnetar_ledger::Replacement::NotInLedger
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_replication_copies_only_the_lost_slot_of_each_fragment() {
    let c = cluster(3);
    let writer = c.bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    writer.add_entries((0..9).map(payload).collect()).await.unwrap();
    // Bookie 2 fails mid-ledger: entries from 9 on go to a new fragment on bookie 3.
    c.bookies.add_bookie(&addr(3));
    c.store.put(&format!("/ledgers/available/{}", addr(3)), b"", None).unwrap();
    c.bookies.set_down(&addr(2), true);
    c.store.delete(&format!("/ledgers/available/{}", addr(2)), None).unwrap();
    writer.add_entries((9..15).map(payload).collect()).await.unwrap();
    writer.close().await.unwrap();
    let before = stored_metadata(&c.store, writer.id());
    assert_eq!(before.ensembles.len(), 2);
    c.bookies.add_bookie(&addr(4));
    c.store.put(&format!("/ledgers/available/{}", addr(4)), b"", None).unwrap();

    let done = c.bk.replace_bookie(writer.id(), &addr(2), 2).await.unwrap();
    // Only the first fragment had bookie 2, in slot 2: entries 1, 2, 4, 5, 7, 8. Any bookie
    // outside that fragment's ensemble may take them, bookie 3 of the next one too.
    let magnetar_ledger::Replacement::Replaced { bookies, entries } = done else { panic!("{done:?}") };
    assert_eq!(entries, 6);
    let new = bookies[0].clone();
    assert!(new == addr(3) || new == addr(4), "{new}");
    let held = c.bookies.entries(&new, writer.id());
    assert!([1, 2, 4, 5, 7, 8].iter().all(|e| held.contains(e)), "{held:?}");
    assert!(!held.contains(&0) && !held.contains(&3), "{held:?}");
    let after = stored_metadata(&c.store, writer.id());
    assert_eq!(after.ensembles[0].1, vec![addr(0), addr(1), new]);
    assert_eq!(after.ensembles[1], before.ensembles[1]);
    assert_eq!(read_all(&c.bk, writer.id(), 15).await, (0..15).map(|i| (i as u64, payload(i))).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_replication_needs_a_bookie_outside_the_ensemble() {
    let c = cluster(2);
    let writer = c.bk.create_ledger(2, 2, 2, BTreeMap::new()).await.unwrap();
    writer.add_entry(payload(0)).await.unwrap();
    writer.close().await.unwrap();
    c.bookies.set_down(&addr(0), true);
    c.store.delete(&format!("/ledgers/available/{}", addr(0)), None).unwrap();
    assert_eq!(c.bk.replace_bookie(writer.id(), &addr(0), 10).await, Err(LedgerError::NotEnoughBookies));
    assert_eq!(stored_metadata(&c.store, writer.id()).ensembles[0].1, vec![addr(0), addr(1)]);
}
