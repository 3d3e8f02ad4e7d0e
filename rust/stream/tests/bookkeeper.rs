//! Managed ledgers over the replicated ledger client: in-memory bookies (three, with a
//! bookie failing mid-stream) and real bookie servers on port 0.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::{BookieConfig, BookieServer, FrameLimit, JournalConfig};
use magnetar_ledger::mem::MemBookies;
use magnetar_ledger::{BookKeeper, ClientConfig};
use magnetar_meta::{MemStore, MetadataStore};
use magnetar_stream::{BookKeeperStore, InitialPosition, ManagedLedgerConfig, ManagedLedgerFactory};

const BOOKIES: [&str; 3] = ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"];

fn config(max_entries: u64, e: usize, qw: usize, qa: usize) -> ManagedLedgerConfig {
    ManagedLedgerConfig {
        ensemble_size: e,
        write_quorum: qw,
        ack_quorum: qa,
        max_entries_per_ledger: max_entries,
        min_rollover_time: Duration::ZERO,
        mark_delete_rate_per_sec: 0.0,
        cache_size_bytes: 0,
        ..Default::default()
    }
}

fn payloads(range: std::ops::Range<u32>) -> Vec<(Bytes, u32)> {
    range.map(|i| (Bytes::from(format!("m{i}")), 1)).collect()
}

fn mem_cluster() -> (Arc<MemStore>, Arc<MemBookies>, ManagedLedgerFactory) {
    let meta = Arc::new(MemStore::default());
    let bookies = Arc::new(MemBookies::new());
    for b in BOOKIES {
        bookies.add_bookie(b);
        meta.put(&format!("/ledgers/available/{b}"), b"", None).unwrap();
    }
    let f = factory(meta.clone(), bookies.clone());
    (meta, bookies, f)
}

fn factory(meta: Arc<MemStore>, bookies: Arc<MemBookies>) -> ManagedLedgerFactory {
    let client_config = ClientConfig { request_timeout: Duration::from_secs(2), ..Default::default() };
    let meta: Arc<dyn MetadataStore> = meta;
    let bk = BookKeeper::with_transport(meta.clone(), client_config, bookies);
    ManagedLedgerFactory::new(meta, Arc::new(BookKeeperStore::new(bk)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_append_read_recover_and_trim() {
    let (meta, bookies, f) = mem_cluster();
    let added;
    {
        let ml = f.open("t/bk", config(4, 3, 2, 2)).await.unwrap();
        let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
        added = ml.add_entries(payloads(0..10)).await.unwrap();
        assert_eq!(ml.ledgers_info().len(), 3);
        let read = c.read_entries(100).await.unwrap();
        assert_eq!(read.iter().map(|e| e.index).collect::<Vec<_>>(), (0..10).collect::<Vec<u64>>());
        c.mark_delete(added[5].position).await.unwrap();
        // Settle the trim the acknowledgement started, so the record is quiet.
        ml.trim().await.unwrap();
        // No close: the next owner recovers the open ledger.
    }
    let f2 = factory(meta.clone(), bookies.clone());
    let ml = f2.open("t/bk", config(4, 3, 2, 2)).await.unwrap();
    assert_eq!(ml.last_confirmed(), Some(added[9].position));
    let c = ml.cursor("s").unwrap();
    assert_eq!(c.mark_delete_position(), added[5].position);
    assert_eq!(c.number_of_entries_in_backlog(), 4);
    let more = ml.add_entries(payloads(10..12)).await.unwrap();
    assert_eq!(more[0].index, 10);
    assert_eq!(ml.find_position_by_index(7).await.unwrap(), added[7].position);
    // The first ledger was consumed, so trimming deleted it from the bookies too.
    let first_ledger = added[0].position.ledger_id;
    ml.trim().await.unwrap();
    assert!(ml.ledgers_info().iter().all(|i| i.ledger_id != first_ledger));
    assert!(BOOKIES.iter().all(|b| !bookies.has_ledger(b, first_ledger)));
    assert!(meta.get(&format!("/ledgers/ledger/{first_ledger}")).unwrap().is_none());
    ml.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookie_failing_mid_stream_loses_nothing() {
    let (meta, bookies, f) = mem_cluster();
    bookies.add_bookie("127.0.0.1:3184");
    meta.put("/ledgers/available/127.0.0.1:3184", b"", None).unwrap();
    let ml = f.open("t/bk-fail", config(1000, 3, 3, 2)).await.unwrap();
    let mut all = ml.add_entries(payloads(0..20)).await.unwrap();
    bookies.set_down(BOOKIES[0], true);
    all.extend(ml.add_entries(payloads(20..40)).await.unwrap());
    let read = ml.read_entries(all[0].position, 100).await.unwrap();
    assert_eq!(read.len(), 40);
    for (i, e) in read.iter().enumerate() {
        assert_eq!(&e.data[..], format!("m{i}").as_bytes());
        assert_eq!(e.index, i as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_enough_bookies_is_reported() {
    let meta = Arc::new(MemStore::default());
    let bookies = Arc::new(MemBookies::new());
    let f = factory(meta, bookies);
    let err = f.open("t/none", config(10, 1, 1, 1)).await.unwrap_err();
    assert!(err.to_string().contains("Not enough non-faulty bookies available"), "{err}");
}

async fn start_bookie(dir: &std::path::Path) -> BookieServer {
    let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = BookieConfig {
        data_dir: dir.to_path_buf(),
        ledger_dirs: Vec::new(),
        bind,
        journal: JournalConfig::default(),
        max_frame_size: FrameLimit::MAX,
    };
    BookieServer::start(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_bookies_round_trip_and_reopen() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut servers = Vec::new();
    let meta = Arc::new(MemStore::default());
    for d in &dirs {
        let s = start_bookie(d.path()).await;
        meta.put(&format!("/ledgers/available/{}", s.local_addr()), b"", None).unwrap();
        servers.push(s);
    }
    let dyn_meta: Arc<dyn MetadataStore> = meta.clone();
    let client_config = ClientConfig { request_timeout: Duration::from_secs(5), ..Default::default() };
    let f = ManagedLedgerFactory::new(
        dyn_meta.clone(),
        Arc::new(BookKeeperStore::new(BookKeeper::new(dyn_meta.clone(), client_config.clone()))),
    );
    let ml = f.open("t/real", config(50, 3, 2, 2)).await.unwrap();
    let c = ml.open_cursor("s", InitialPosition::Earliest).await.unwrap();
    let mut added = Vec::new();
    for round in 0..4u32 {
        added.extend(ml.add_entries(payloads(round * 30..round * 30 + 30)).await.unwrap());
    }
    assert!(ml.ledgers_info().len() >= 3);
    let got = c.read_entries(1000).await.unwrap();
    assert_eq!(got.len(), 120);
    c.mark_delete(added[59].position).await.unwrap();
    ml.close().await.unwrap();

    let f2 = ManagedLedgerFactory::new(
        dyn_meta.clone(),
        Arc::new(BookKeeperStore::new(BookKeeper::new(dyn_meta.clone(), client_config))),
    );
    let ml = f2.open("t/real", config(50, 3, 2, 2)).await.unwrap();
    let c = ml.cursor("s").unwrap();
    assert_eq!(c.number_of_entries_in_backlog(), 60);
    let rest = c.read_entries(1000).await.unwrap();
    assert_eq!(rest.first().map(|e| e.index), Some(60));
    assert_eq!(rest.last().map(|e| e.index), Some(119));
    ml.close().await.unwrap();
    for s in servers {
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_bookie_shut_down_mid_stream_loses_nothing() {
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let meta = Arc::new(MemStore::default());
    let mut servers = std::collections::HashMap::new();
    for d in &dirs {
        let s = start_bookie(d.path()).await;
        let addr = s.local_addr().to_string();
        meta.put(&format!("/ledgers/available/{addr}"), b"", None).unwrap();
        servers.insert(addr, s);
    }
    let dyn_meta: Arc<dyn MetadataStore> = meta.clone();
    let client_config = ClientConfig { request_timeout: Duration::from_secs(5), ..Default::default() };
    let bk = BookKeeper::new(dyn_meta.clone(), client_config);
    let f = ManagedLedgerFactory::new(dyn_meta, Arc::new(BookKeeperStore::new(bk)));
    let ml = f.open("t/real-fault", config(10_000, 3, 2, 2)).await.unwrap();
    let mut added = ml.add_entries(payloads(0..50)).await.unwrap();
    // Stop one bookie of the current ensemble.
    let lid = ml.stats().current_ledger_id.unwrap();
    let (raw, _) = meta.get(&format!("/ledgers/ledger/{lid}")).unwrap().unwrap();
    let md: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let victim = md["ensembles"][0][1][0].as_str().unwrap().to_string();
    servers.remove(&victim).unwrap().shutdown().await.unwrap();
    added.extend(ml.add_entries(payloads(50..100)).await.unwrap());
    assert_eq!(ml.last_confirmed(), Some(added[99].position));
    assert_eq!(added[99].position.ledger_id, lid, "the ledger changed its ensemble and went on");
    let (raw, _) = meta.get(&format!("/ledgers/ledger/{lid}")).unwrap().unwrap();
    let md: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let ensembles = md["ensembles"].as_array().unwrap();
    assert_eq!(ensembles.len(), 2, "{md}");
    assert!(!ensembles[1][1].as_array().unwrap().iter().any(|b| b.as_str() == Some(victim.as_str())));
    let read = ml.read_entries(added[0].position, 1000).await.unwrap();
    assert_eq!(read.len(), 100);
    for (i, e) in read.iter().enumerate() {
        assert_eq!(&e.data[..], format!("m{i}").as_bytes());
    }
    ml.close().await.unwrap();
    for (_, s) in servers {
        s.shutdown().await.unwrap();
    }
}
