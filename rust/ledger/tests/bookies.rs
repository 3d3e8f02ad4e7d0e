//! The ledger client against real bookie servers started in-process on port 0.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::{BookieClient, BookieConfig, BookieServer, ClientError, FrameLimit, JournalConfig};
use magnetar_ledger::entry;
use magnetar_ledger::metadata::ledger_path;
use magnetar_ledger::quorum::write_set;
use magnetar_ledger::{BookKeeper, ClientConfig, LedgerError, LedgerMetadata, LedgerState, Replacement};
use magnetar_meta::{MemStore, MetadataStore};

const TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on any one step of a test that could otherwise wait forever.
const STEP: Duration = Duration::from_secs(60);

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {STEP:?}"),
    }
}

struct Cluster {
    store: Arc<MemStore>,
    /// nettyMaxFrameSizeBytes of the bookies and of the clients.
    limit: FrameLimit,
    /// Clients call the bookies directly, in process (`ClientConfig::local_bookies`).
    local: bool,
    servers: Vec<Option<BookieServer>>,
    addrs: Vec<String>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Cluster {
    async fn start(n: usize) -> Cluster {
        Cluster::start_limited(n, FrameLimit::MAX).await
    }

    async fn start_limited(n: usize, limit: FrameLimit) -> Cluster {
        let store = Arc::new(MemStore::default());
        let mut servers = Vec::new();
        let mut addrs = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..n {
            let dir = tempfile::tempdir().unwrap();
            let config = BookieConfig {
                data_dir: dir.path().to_path_buf(),
                bind: "127.0.0.1:0".parse().unwrap(),
                ledger_dirs: Vec::new(),
                journal: JournalConfig::default(),
                max_frame_size: limit,
            };
            let server = BookieServer::start(config).await.unwrap();
            let addr = server.local_addr().to_string();
            store.put(&format!("/ledgers/available/{addr}"), b"", None).unwrap();
            servers.push(Some(server));
            addrs.push(addr);
            dirs.push(dir);
        }
        Cluster { store, limit, local: false, servers, addrs, _dirs: dirs }
    }

    async fn start_local(n: usize) -> Cluster {
        Cluster { local: true, ..Cluster::start(n).await }
    }

    /// TCP connections each running bookie has accepted.
    fn connections(&self) -> Vec<u64> {
        self.servers.iter().flatten().map(BookieServer::connections_accepted).collect()
    }

    fn client(&self) -> BookKeeper {
        let config = ClientConfig {
            request_timeout: TIMEOUT,
            local_bookies: self.local,
            max_frame_size: self.limit,
            ..ClientConfig::default()
        };
        BookKeeper::new(self.store.clone(), config)
    }

    fn metadata(&self, id: u64) -> LedgerMetadata {
        let (bytes, _) = self.store.get(&ledger_path(id)).unwrap().unwrap();
        LedgerMetadata::from_json("/", &bytes).unwrap()
    }

    /// Stop the bookie at `addr`: cleanly, or as a crash (no more writes, connections cut).
    async fn stop(&mut self, addr: &str, crash: bool) {
        let i = self.addrs.iter().position(|a| a == addr).unwrap();
        let server = self.servers[i].take().unwrap();
        if crash {
            drop(server);
        } else {
            bounded("bookie shutdown", server.shutdown()).await.unwrap();
        }
    }

    /// Stop the bookie at `addr` cleanly and start it again on the same address and data.
    async fn restart(&mut self, addr: &str) {
        let i = self.addrs.iter().position(|a| a == addr).unwrap();
        let server = self.servers[i].take().unwrap();
        bounded("bookie shutdown", server.shutdown()).await.unwrap();
        let config = BookieConfig {
            data_dir: self._dirs[i].path().to_path_buf(),
            bind: addr.parse().unwrap(),
            ledger_dirs: Vec::new(),
            journal: JournalConfig::default(),
            max_frame_size: self.limit,
        };
        self.servers[i] = Some(bounded("bookie restart", BookieServer::start(config)).await.unwrap());
    }

    async fn shutdown(mut self) {
        for server in self.servers.iter_mut().filter_map(Option::take) {
            bounded("bookie shutdown", server.shutdown()).await.unwrap();
        }
    }
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("payload-{i}-{}", "x".repeat((i % 7) as usize)))
}

fn expected(range: std::ops::Range<u64>) -> Vec<(u64, Bytes)> {
    range.map(|i| (i, payload(i))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_one_bookie() {
    let cluster = Cluster::start(1).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    assert_eq!(lh.add_entry(payload(0)).await.unwrap(), 0);
    let ids = lh.add_entries((1..100).map(payload).collect()).await.unwrap();
    assert_eq!(ids, (1..100).collect::<Vec<_>>());
    assert_eq!(lh.last_add_confirmed(), 99);
    assert_eq!(lh.read_entries(0, 99).await.unwrap(), expected(0..100));
    lh.close().await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_three_bookies_stripes_entries() {
    let cluster = Cluster::start(3).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let ids = lh.add_entries((0..60).map(payload).collect()).await.unwrap();
    assert_eq!(ids.last(), Some(&59));
    assert_eq!(lh.read_entries(0, 59).await.unwrap(), expected(0..60));
    // Each bookie holds exactly the entries whose write set includes its slot.
    let ensemble = lh.metadata().current_ensemble().to_vec();
    for (slot, addr) in ensemble.iter().enumerate() {
        let client = BookieClient::connect(addr, TIMEOUT).await.unwrap();
        for e in 0..60u64 {
            let in_write_set = write_set(e, 3, 2).any(|s| s == slot);
            match client.read(lh.id(), e, false).await {
                Ok(r) => {
                    assert!(in_write_set, "bookie {slot} holds entry {e}");
                    let decoded = entry::decode(lh.id(), e, &r.data).unwrap();
                    assert_eq!(decoded.payload, payload(e));
                }
                Err(ClientError::NoEntry) => assert!(!in_write_set, "bookie {slot} lacks entry {e}"),
                Err(other) => panic!("unexpected read error {other}"),
            }
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_and_concurrent_batches_are_split_pipelined_and_confirmed_in_order() {
    let cluster = Cluster::start(3).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    // 3 MiB in one call: several ADD_BATCH requests per bookie.
    let big: Vec<Bytes> = (0..24u8).map(|i| Bytes::from(vec![i; 128 * 1024])).collect();
    let ids = bounded("big batch", lh.add_entries(big.clone())).await.unwrap();
    assert_eq!(ids, (0..24).collect::<Vec<u64>>());
    // Concurrent calls: each gets consecutive ids, and together they cover the range.
    let calls = (0..8u64).map(|c| {
        let lh = lh.clone();
        tokio::spawn(async move { lh.add_entries((c * 50..c * 50 + 50).map(payload).collect()).await })
    });
    let mut got = Vec::new();
    for call in calls {
        let ids = call.await.unwrap().unwrap();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1));
        got.extend(ids);
    }
    got.sort_unstable();
    assert_eq!(got, (24..424).collect::<Vec<u64>>());
    assert_eq!(lh.last_add_confirmed(), 423);
    let read = lh.read_entries(0, 23).await.unwrap();
    assert_eq!(read.into_iter().map(|(_, d)| d).collect::<Vec<_>>(), big);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_split_into_frames_within_the_limit() {
    let limit = FrameLimit::new(64 * 1024).unwrap();
    let cluster = Cluster::start_limited(3, limit).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(3, 3, 3, BTreeMap::new()).await.unwrap();
    // 240 KiB in one call, far under MAX_BATCH_BYTES: as one ADD_BATCH per bookie, every
    // bookie would close its connection on it.
    let batch: Vec<Bytes> = (0..40u8).map(|i| Bytes::from(vec![i; 6 * 1024])).collect();
    let ids = bounded("batch", lh.add_entries(batch.clone())).await.unwrap();
    assert_eq!(ids, (0..40).collect::<Vec<u64>>());
    // Entries as large as a frame allows, several to a call.
    let max = vec![Bytes::from(vec![7u8; bk.max_entry_size()]); 3];
    assert_eq!(bounded("maximal entries", lh.add_entries(max.clone())).await.unwrap(), vec![40, 41, 42]);
    let read: Vec<Bytes> = lh.read_entries(0, 42).await.unwrap().into_iter().map(|(_, d)| d).collect();
    assert_eq!(read, [batch, max].concat());
    // One connection to each bookie, none of them closed over a frame too long.
    assert_eq!(cluster.connections(), vec![1, 1, 1]);
    cluster.shutdown().await;
}

async fn entry_over_the_limit_is_refused(local: bool) {
    let limit = FrameLimit::new(64 * 1024).unwrap();
    let cluster = Cluster { local, ..Cluster::start_limited(1, limit).await };
    let bk = cluster.client();
    assert_eq!(bk.max_entry_size(), 64 * 1024 - 42 - entry::HEADER_LEN);
    let lh = bk.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    assert_eq!(lh.add_entry(payload(0)).await.unwrap(), 0);
    let max = bk.max_entry_size();
    let huge = Bytes::from(vec![1u8; max + 1]);
    let err = lh.add_entry(huge.clone()).await.unwrap_err();
    assert_eq!(err, LedgerError::EntryTooLarge { size: max + 1, max, frame: limit.bytes() });
    assert_eq!(
        err.to_string(),
        "entry of 65482 bytes does not fit one bookie frame: at most 65481 bytes of payload fit a \
         frame of 65536 bytes (nettyMaxFrameSizeBytes)"
    );
    // A batch holding one is refused whole; pipelined adds the same.
    assert!(matches!(lh.add_entries(vec![payload(1), huge.clone()]).await, Err(LedgerError::EntryTooLarge { .. })));
    assert!(matches!(lh.add_entry_pipelined(huge).await, Err(LedgerError::EntryTooLarge { .. })));
    // The ledger goes on, nothing acknowledged lost, no id skipped.
    assert_eq!(lh.add_entries((1..5).map(payload).collect()).await.unwrap(), vec![1, 2, 3, 4]);
    let largest = Bytes::from(vec![2u8; max]);
    assert_eq!(lh.add_entry(largest.clone()).await.unwrap(), 5);
    assert_eq!(lh.read_entries(0, 4).await.unwrap(), expected(0..5));
    assert_eq!(lh.read_entries(5, 5).await.unwrap(), vec![(5, largest)]);
    lh.close().await.unwrap();
    let reader = bk.open_ledger(lh.id(), false).await.unwrap();
    assert_eq!(reader.metadata().last_entry_id, 5);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_over_the_frame_limit_is_refused_and_the_ledger_goes_on() {
    entry_over_the_limit_is_refused(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_over_the_frame_limit_is_refused_by_local_calls_too() {
    entry_over_the_limit_is_refused(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rereplication_copies_in_frames_within_the_limit() {
    let limit = FrameLimit::new(64 * 1024).unwrap();
    let cluster = Cluster::start_limited(3, limit).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(2, 2, 2, BTreeMap::new()).await.unwrap();
    let data: Vec<Bytes> = (0..12u8).map(|i| Bytes::from(vec![i; 20 * 1024])).collect();
    lh.add_entries(data.clone()).await.unwrap();
    lh.close().await.unwrap();
    let lost = lh.metadata().current_ensemble()[0].clone();
    // Ten entries read at a time: 200 KiB, copied in frames of at most 64 KiB.
    let done = bounded("re-replication", bk.replace_bookie(lh.id(), &lost, 10)).await.unwrap();
    let Replacement::Replaced { bookies, entries } = done else { panic!("not replaced: {done:?}") };
    assert_eq!(entries, 12);
    let copy = BookieClient::connect(&bookies[0], TIMEOUT).await.unwrap();
    for (e, want) in data.iter().enumerate() {
        let got = copy.read(lh.id(), e as u64, false).await.unwrap();
        assert_eq!(&entry::decode(lh.id(), e as u64, &got.data).unwrap().payload, want);
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_enough_bookies() {
    let cluster = Cluster::start(2).await;
    let err = cluster.client().create_ledger(3, 2, 2, BTreeMap::new()).await.err().unwrap();
    assert_eq!(err.to_string(), "Not enough non-faulty bookies available");
    assert_eq!(err, LedgerError::NotEnoughBookies);
    cluster.shutdown().await;
}

/// Adds 200 entries in pipelined batches while a bookie of the ensemble stops after the
/// first 50 are confirmed; every add must succeed through an ensemble change.
async fn bookie_lost_mid_stream(crash: bool, local: bool) {
    let mut cluster = if local { Cluster::start_local(4).await } else { Cluster::start(4).await };
    let bk = cluster.client();
    let lh = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::channel::<u64>(1024);
    let writer = {
        let lh = lh.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for batch in 0..20u64 {
                let ids = lh.add_entries((batch * 10..batch * 10 + 10).map(payload).collect()).await?;
                for id in &ids {
                    let _ = acked_tx.send(*id).await;
                }
                acked.extend(ids);
            }
            Ok::<_, LedgerError>(acked)
        })
    };
    bounded("first 50 adds", async {
        while let Some(id) = acked_rx.recv().await {
            if id >= 49 {
                break;
            }
        }
    })
    .await;
    let victim = lh.metadata().current_ensemble()[0].clone();
    cluster.stop(&victim, crash).await;
    let acked = bounded("remaining adds", writer).await.unwrap().unwrap();
    assert_eq!(acked, (0..200).collect::<Vec<_>>());
    let meta = cluster.metadata(lh.id());
    assert_eq!(meta.ensembles.len(), 2, "{meta:?}");
    assert!(meta.ensembles[1].0 >= 50);
    assert!(!meta.ensembles[1].1.contains(&victim));
    // Writing goes on, and everything acknowledged reads back (falling back past the
    // stopped bookie for the first fragment).
    assert_eq!(lh.add_entry(payload(200)).await.unwrap(), 200);
    assert_eq!(lh.read_entries(0, 200).await.unwrap(), expected(0..201));
    bounded("close", lh.close()).await.unwrap();
    let reader = cluster.client().open_ledger(lh.id(), false).await.unwrap();
    assert_eq!(reader.read_entries(0, 200).await.unwrap(), expected(0..201));
    if local {
        assert_eq!(cluster.connections(), vec![0, 0, 0], "local calls opened no socket");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookie_shut_down_mid_stream_changes_ensemble() {
    bookie_lost_mid_stream(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookie_crash_mid_stream_changes_ensemble() {
    bookie_lost_mid_stream(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_bookie_crash_mid_stream_changes_ensemble() {
    bookie_lost_mid_stream(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_bookie_shut_down_mid_stream_changes_ensemble() {
    bookie_lost_mid_stream(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_clients_connect_and_local_clients_do_not() {
    let mut cluster = Cluster::start(1).await;
    let lh = cluster.client().create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..10).map(payload).collect()).await.unwrap();
    bounded("close", lh.close()).await.unwrap();
    assert_eq!(cluster.connections(), vec![1]);
    cluster.local = true;
    let local = cluster.client();
    let reader = local.open_ledger(lh.id(), false).await.unwrap();
    assert_eq!(reader.read_entries(0, 9).await.unwrap(), expected(0..10));
    let lh2 = local.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    lh2.add_entries((0..10).map(payload).collect()).await.unwrap();
    bounded("delete", local.delete_ledger(lh2.id())).await.unwrap();
    assert_eq!(cluster.connections(), vec![1], "the local client opened no connection");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_bookie_without_spare_fails_the_writer() {
    let mut cluster = Cluster::start(3).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..10).map(payload).collect()).await.unwrap();
    let victim = lh.metadata().current_ensemble()[1].clone();
    cluster.stop(&victim, true).await;
    let err = bounded("adds", lh.add_entries((10..20).map(payload).collect())).await.err().unwrap();
    assert_eq!(err, LedgerError::NotEnoughBookies);
    assert_eq!(lh.add_entry(payload(20)).await, Err(LedgerError::NotEnoughBookies));
    // What was confirmed stays readable and the ledger closes at it.
    let lac = lh.last_add_confirmed();
    assert!(lac >= 9);
    let last = u64::try_from(lac).unwrap();
    assert_eq!(lh.read_entries(0, last).await.unwrap(), expected(0..last + 1));
    bounded("close", lh.close()).await.unwrap();
    assert_eq!(cluster.metadata(lh.id()).last_entry_id, lac);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fences_old_writer_and_recovers_unconfirmed_entries() {
    recovery_fences_old_writer(Cluster::start(3).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_recovery_fences_old_writer_and_recovers_unconfirmed_entries() {
    recovery_fences_old_writer(Cluster::start_local(3).await).await;
}

async fn recovery_fences_old_writer(cluster: Cluster) {
    let bk = cluster.client();
    let writer = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let id = writer.id();
    let acked = writer.add_entries((0..20).map(payload).collect()).await.unwrap();
    // Entries 20 and 21 reached their whole write sets, 22 one bookie, before the writer
    // saw any of them confirmed.
    let ensemble = writer.metadata().current_ensemble().to_vec();
    let mut length = writer.length();
    for e in 20u64..23 {
        let data = payload(e);
        length += data.len() as u64;
        let framed = entry::encode(id, e, length, &data);
        let copies = if e == 22 { 1 } else { 2 };
        for slot in write_set(e, 3, 2).take(copies) {
            let client = BookieClient::connect(&ensemble[slot], TIMEOUT).await.unwrap();
            client.add(id, e, 19, framed.clone(), false).await.unwrap();
        }
    }
    let recovering = cluster.client();
    let reader = recovering.open_ledger(id, true).await.unwrap();
    let meta = cluster.metadata(id);
    assert_eq!(meta.state, LedgerState::Closed);
    assert_eq!(meta.last_entry_id, 22);
    assert!(meta.last_entry_id >= *acked.last().unwrap() as i64);
    assert_eq!(meta.length, length);
    assert_eq!(writer.add_entry(payload(99)).await, Err(LedgerError::Fenced));
    assert_eq!(writer.add_entry(payload(100)).await, Err(LedgerError::Fenced));
    assert_eq!(reader.read_entries(0, 22).await.unwrap(), expected(0..23));
    // Entry 22 was re-replicated to its whole write set.
    for slot in write_set(22, 3, 2) {
        let client = BookieClient::connect(&ensemble[slot], TIMEOUT).await.unwrap();
        assert!(client.read(id, 22, false).await.is_ok());
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_reopen() {
    let cluster = Cluster::start(3).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(3, 3, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..25).map(payload).collect()).await.unwrap();
    let length: u64 = (0..25).map(|i| payload(i).len() as u64).sum();
    lh.close().await.unwrap();
    assert_eq!(lh.add_entry(payload(25)).await, Err(LedgerError::LedgerClosed));
    let meta = cluster.metadata(lh.id());
    assert_eq!((meta.state, meta.last_entry_id, meta.length), (LedgerState::Closed, 24, length));
    let other = cluster.client();
    for recover in [false, true] {
        let reader = other.open_ledger(lh.id(), recover).await.unwrap();
        assert_eq!(reader.last_add_confirmed(), 24);
        assert_eq!(reader.read_entries(0, 24).await.unwrap(), expected(0..25));
        assert!(matches!(reader.read_entries(0, 25).await, Err(LedgerError::ReadBeyondLac { .. })));
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_ledger_everywhere() {
    let cluster = Cluster::start(3).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..10).map(payload).collect()).await.unwrap();
    lh.close().await.unwrap();
    let ensemble = lh.metadata().current_ensemble().to_vec();
    bk.delete_ledger(lh.id()).await.unwrap();
    for addr in &ensemble {
        let client = BookieClient::connect(addr, TIMEOUT).await.unwrap();
        for e in 0..10 {
            assert!(matches!(client.read(lh.id(), e, false).await, Err(ClientError::NoEntry | ClientError::NoLedger)));
        }
    }
    assert!(cluster.store.get(&ledger_path(lh.id())).unwrap().is_none());
    assert_eq!(bk.open_ledger(lh.id(), true).await.err(), Some(LedgerError::NoSuchLedger(lh.id())));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reconnects_after_bookie_restart() {
    let mut cluster = Cluster::start(1).await;
    let bk = cluster.client();
    let lh = bk.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    lh.add_entries((0..10).map(payload).collect()).await.unwrap();
    let addr = cluster.addrs[0].clone();
    // The bookie comes back on the address it was given at first start (port 0).
    cluster.restart(&addr).await;
    let ids = bounded("adds after restart", lh.add_entries((10..20).map(payload).collect())).await.unwrap();
    assert_eq!(ids, (10..20).collect::<Vec<_>>());
    assert_eq!(lh.read_entries(0, 19).await.unwrap(), expected(0..20));
    assert_eq!(cluster.metadata(lh.id()).ensembles.len(), 1, "no ensemble change was needed");
    cluster.shutdown().await;
}

/// A peer that accepts connections and reads requests but never answers.
async fn black_hole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            conns.spawn(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut stream, &mut sink).await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresponsive_bookie_times_out_and_is_replaced() {
    let cluster = Cluster::start(3).await;
    let spare = cluster.addrs[2].clone();
    cluster.store.delete(&format!("/ledgers/available/{spare}"), None).unwrap();
    let (hole, hole_task) = black_hole().await;
    cluster.store.put(&format!("/ledgers/available/{hole}"), b"", None).unwrap();
    let config = ClientConfig { request_timeout: Duration::from_secs(2), ..ClientConfig::default() };
    let bk = BookKeeper::new(cluster.store.clone(), config);
    let lh = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let placed = lh.metadata().current_ensemble().to_vec();
    assert!(placed.contains(&hole));
    // The spare registers after the ledger was placed.
    cluster.store.put(&format!("/ledgers/available/{spare}"), b"", None).unwrap();
    let ids = bounded("adds", lh.add_entries((0..30).map(payload).collect())).await.unwrap();
    assert_eq!(ids, (0..30).collect::<Vec<_>>());
    let meta = cluster.metadata(lh.id());
    // The new fragment starts at the first entry whose write set held the silent bookie.
    let slot = placed.iter().position(|b| *b == hole).unwrap();
    let first_stuck = (0..30u64).find(|e| write_set(*e, 3, 2).any(|s| s == slot)).unwrap();
    assert_eq!(meta.ensembles.last().unwrap().0, first_stuck, "{meta:?}");
    assert!(!meta.current_ensemble().contains(&hole));
    assert!(meta.current_ensemble().contains(&spare));
    assert_eq!(lh.read_entries(0, 29).await.unwrap(), expected(0..30));
    hole_task.abort();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_while_the_writer_is_adding() {
    let cluster = Cluster::start(3).await;
    let bk = cluster.client();
    let writer = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let id = writer.id();
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::channel::<u64>(4096);
    let adding = {
        let writer = writer.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for batch in 0..500u64 {
                match writer.add_entries((batch * 4..batch * 4 + 4).map(payload).collect()).await {
                    Ok(ids) => {
                        for id in &ids {
                            let _ = acked_tx.send(*id).await;
                        }
                        acked.extend(ids);
                    }
                    Err(e) => return (acked, Some(e)),
                }
            }
            (acked, None)
        })
    };
    bounded("first 100 adds", async {
        while let Some(id) = acked_rx.recv().await {
            if id >= 99 {
                break;
            }
        }
    })
    .await;
    let reader = bounded("recovery", cluster.client().open_ledger(id, true)).await.unwrap();
    let (acked, err) = bounded("writer", adding).await.unwrap();
    assert_eq!(err, Some(LedgerError::Fenced), "the writer must be fenced before it runs out of entries");
    let last = reader.metadata().last_entry_id;
    let max_acked = *acked.last().unwrap();
    assert!(last >= max_acked as i64, "recovered {last} < acknowledged {max_acked}");
    let got = reader.read_entries(0, u64::try_from(last).unwrap()).await.unwrap();
    assert_eq!(got.len() as i64, last + 1);
    for (e, data) in got {
        assert_eq!(data, payload(e), "entry {e}");
    }
    assert_eq!(writer.add_entry(payload(0)).await, Err(LedgerError::Fenced));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_recoveries_agree() {
    let cluster = Cluster::start(3).await;
    let writer = cluster.client().create_ledger(3, 3, 2, BTreeMap::new()).await.unwrap();
    writer.add_entries((0..40).map(payload).collect()).await.unwrap();
    let (a, b) = (cluster.client(), cluster.client());
    let (ra, rb) = bounded("recoveries", async {
        tokio::join!(a.open_ledger(writer.id(), true), b.open_ledger(writer.id(), true))
    })
    .await;
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let stored = cluster.metadata(writer.id());
    assert_eq!(stored.state, LedgerState::Closed);
    assert!(stored.last_entry_id >= 39);
    assert_eq!(ra.last_add_confirmed(), stored.last_entry_id);
    assert_eq!(rb.last_add_confirmed(), stored.last_entry_id);
    assert_eq!(ra.read_entries(0, 39).await.unwrap(), expected(0..40));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_of_a_long_unconfirmed_tail() {
    let cluster = Cluster::start(3).await;
    let bk = cluster.client();
    let writer = bk.create_ledger(3, 2, 2, BTreeMap::new()).await.unwrap();
    let id = writer.id();
    // A writer that died with 300 entries stored but no LAC ever reported to a bookie.
    let ensemble = writer.metadata().current_ensemble().to_vec();
    let mut clients = Vec::new();
    for addr in &ensemble {
        clients.push(BookieClient::connect(addr, TIMEOUT).await.unwrap());
    }
    let mut length = 0;
    let mut adds = tokio::task::JoinSet::new();
    for e in 0u64..300 {
        let data = payload(e);
        length += data.len() as u64;
        let framed = entry::encode(id, e, length, &data);
        for slot in write_set(e, 3, 2) {
            let (client, framed) = (clients[slot].clone(), framed.clone());
            adds.spawn(async move { client.add(id, e, -1, framed, false).await });
        }
    }
    while let Some(r) = adds.join_next().await {
        r.unwrap().unwrap();
    }
    let reader = bounded("recovery", cluster.client().open_ledger(id, true)).await.unwrap();
    let meta = reader.metadata();
    assert_eq!((meta.last_entry_id, meta.length), (299, length));
    assert_eq!(reader.read_entries(0, 299).await.unwrap(), expected(0..300));
    cluster.shutdown().await;
}
