//! Model-based crash recovery: random adds, fences, deletes and checkpoints against a real
//! bookie, crashed at random points with everything the ledger storage had not synced thrown
//! away. After every restart the bookie must hold exactly what it acknowledged.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use bytes::{Buf, Bytes};
use magnetar_bookie::{BookieClient, BookieConfig, BookieServer, ClientError, FrameLimit, JournalConfig};
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(10);
const LEDGERS: u64 = 3;

#[derive(Debug, Clone)]
enum Op {
    Add {
        ledger: u64,
        recovery: bool,
        size: usize,
    },
    Fence(u64),
    Delete(u64),
    Checkpoint,
    Crash {
        tear_index: bool,
        torn_journal: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..LEDGERS, prop::bool::weighted(0.2), 0usize..300)
            .prop_map(|(ledger, recovery, size)| Op::Add { ledger, recovery, size }),
        1 => (0..LEDGERS).prop_map(Op::Fence),
        1 => (0..LEDGERS).prop_map(Op::Delete),
        2 => Just(Op::Checkpoint),
        2 => (any::<bool>(), any::<bool>())
            .prop_map(|(tear_index, torn_journal)| Op::Crash { tear_index, torn_journal }),
    ]
}

#[derive(Default, Debug)]
struct Ledger {
    entries: BTreeMap<u64, (i64, Bytes)>,
    fenced: bool,
    next: u64,
}

impl Ledger {
    fn lac(&self) -> i64 {
        self.entries
            .values()
            .map(|(lac, _)| *lac)
            .max()
            .unwrap_or(-1)
            .max(-1)
    }
}

fn config(dir: &Path) -> BookieConfig {
    BookieConfig {
        data_dir: dir.to_path_buf(),
        bind: "127.0.0.1:0".parse().expect("addr"),
        ledger_dirs: Vec::new(),
        journal: JournalConfig {
            max_group_wait: Duration::ZERO,
            ..JournalConfig::default()
        },
        max_frame_size: FrameLimit::MAX,
    }
}

/// The ledger-log lengths recorded by the last storage flush (`ledgers/CHECKPOINT`).
fn checkpointed_lengths(dir: &Path) -> HashMap<u64, u64> {
    let Ok(raw) = std::fs::read(dir.join("ledgers").join("CHECKPOINT")) else {
        return HashMap::new();
    };
    let mut b = &raw[16..];
    let mut out = HashMap::new();
    while b.remaining() >= 16 {
        let ledger = b.get_u64();
        let len = b.get_u64();
        out.insert(ledger, len);
    }
    out
}

/// Throw away what a power cut could take: ledger-log bytes past the last flush (and logs
/// created since), and, when asked, the tail of every index file.
fn lose_unsynced_storage(dir: &Path, tear_index: bool) {
    let synced = checkpointed_lengths(dir);
    for item in std::fs::read_dir(dir.join("ledgers")).expect("list") {
        let path = item.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if let Some(ledger) = name
            .strip_suffix(".log")
            .and_then(|s| s.parse::<u64>().ok())
        {
            match synced.get(&ledger) {
                Some(&len) => {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .expect("open log");
                    f.set_len(len).expect("truncate log");
                }
                None => std::fs::remove_file(&path).expect("remove log"),
            }
        } else if name.ends_with(".idx") && tear_index {
            let len = std::fs::metadata(&path).expect("meta").len();
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open index");
            f.set_len(len / 2).expect("tear index");
        }
    }
}

async fn verify(client: &BookieClient, model: &HashMap<u64, Ledger>) {
    for ledger in 0..LEDGERS {
        let empty = Ledger::default();
        let m = model.get(&ledger).unwrap_or(&empty);
        for (&entry, (lac, data)) in &m.entries {
            let r = client
                .read(ledger, entry, false)
                .await
                .unwrap_or_else(|e| panic!("read {ledger}:{entry}: {e}"));
            assert_eq!((r.lac, &r.data), (*lac, data), "entry {ledger}:{entry}");
        }
        assert_eq!(
            client.read_lac(ledger, false).await,
            Ok(m.lac()),
            "lac of {ledger}"
        );
        let beyond = client.read(ledger, m.next + 1000, false).await;
        assert!(
            matches!(beyond, Err(ClientError::NoEntry | ClientError::NoLedger)),
            "{beyond:?}"
        );
    }
}

async fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = BookieServer::start(config(dir.path()))
        .await
        .expect("start");
    let mut client = BookieClient::connect(&server.local_addr().to_string(), TIMEOUT)
        .await
        .expect("connect");
    let mut model: HashMap<u64, Ledger> = HashMap::new();
    for op in ops {
        match op {
            Op::Add {
                ledger,
                recovery,
                size,
            } => {
                let m = model.entry(ledger).or_default();
                let entry = m.next;
                let lac = entry as i64 - 1;
                let data = Bytes::from(vec![(entry % 251) as u8; size]);
                let res = client.add(ledger, entry, lac, data.clone(), recovery).await;
                if m.fenced && !recovery {
                    assert_eq!(res, Err(ClientError::Fenced));
                } else {
                    res.expect("add");
                    m.entries.insert(entry, (lac, data));
                    m.next += 1;
                }
            }
            Op::Fence(ledger) => {
                let m = model.entry(ledger).or_default();
                assert_eq!(client.read_lac(ledger, true).await, Ok(m.lac()));
                m.fenced = true;
            }
            Op::Delete(ledger) => {
                client.delete_ledger(ledger).await.expect("delete");
                model.remove(&ledger);
            }
            Op::Checkpoint => server.checkpoint().await.expect("checkpoint"),
            Op::Crash {
                tear_index,
                torn_journal,
            } => {
                drop(client);
                drop(server);
                lose_unsynced_storage(dir.path(), tear_index);
                if torn_journal {
                    // A write that was cut short (and so never acknowledged).
                    let files = magnetar_bookie::journal::list_files(dir.path()).expect("list");
                    let newest = *files.last().expect("a journal file");
                    let path = magnetar_bookie::journal::file_path(dir.path(), newest);
                    let mut raw = std::fs::read(&path).expect("read journal");
                    raw.extend_from_slice(&[0, 0, 1, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
                    std::fs::write(&path, &raw).expect("write journal");
                }
                server = BookieServer::start(config(dir.path()))
                    .await
                    .expect("restart");
                client = BookieClient::connect(&server.local_addr().to_string(), TIMEOUT)
                    .await
                    .expect("connect");
                verify(&client, &model).await;
            }
        }
    }
    verify(&client, &model).await;
    server.shutdown().await.expect("shutdown");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn acknowledged_state_survives_crashes_that_lose_unsynced_storage(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(run(ops));
    }
}

/// Add `count` entries of 64 KiB to ledger 3 through a client of `server`.
async fn add_64k_entries(server: &BookieServer, count: u64) {
    let client = BookieClient::connect(&server.local_addr().to_string(), Duration::from_secs(5))
        .await
        .expect("connect");
    let data = Bytes::from(vec![7u8; 64 * 1024]);
    for entry in 0..count {
        client.add(3, entry, entry as i64 - 1, data.clone(), false).await.expect("add");
    }
}

/// With flushEntrylogBytes set, storage is flushed as soon as that much was added, without
/// waiting for a journal rotation or the checkpoint interval; with it off, nothing is
/// flushed before then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_is_flushed_once_enough_was_added() {
    for (threshold, expect_flush) in [(256 * 1024u64, true), (0, false)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = config(dir.path());
        cfg.journal.flush_entry_log_bytes = threshold;
        let server = BookieServer::start(cfg).await.expect("start");
        add_64k_entries(&server, 16).await;
        let flushed = tokio::time::timeout(Duration::from_secs(10), async {
            while checkpointed_lengths(dir.path()).get(&3).copied().unwrap_or(0) == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if !expect_flush {
                    break;
                }
            }
        })
        .await;
        let lengths = checkpointed_lengths(dir.path());
        if expect_flush {
            assert!(flushed.is_ok(), "no flush after 1 MiB with a 256 KiB threshold");
            assert!(lengths.get(&3).copied().unwrap_or(0) >= threshold);
        } else {
            assert_eq!(lengths.get(&3), None, "flushed although flushEntrylogBytes is 0");
        }
        server.shutdown().await.expect("shutdown");
    }
}

/// Ledger storage that counts the checkpointer's requests to start writing out.
struct CountingStorage {
    inner: magnetar_bookie::MemStorage,
    writebacks: std::sync::atomic::AtomicUsize,
}

impl magnetar_bookie::LedgerStorage for CountingStorage {
    fn add_entry(&self, ledger: u64, entry: u64, lac: i64, data: Bytes) -> Result<(), magnetar_bookie::BookieError> {
        self.inner.add_entry(ledger, entry, lac, data)
    }
    fn get_entry(&self, ledger: u64, entry: u64) -> Result<Option<(i64, Bytes)>, magnetar_bookie::BookieError> {
        self.inner.get_entry(ledger, entry)
    }
    fn last_entry(&self, ledger: u64) -> Result<Option<u64>, magnetar_bookie::BookieError> {
        self.inner.last_entry(ledger)
    }
    fn lac(&self, ledger: u64) -> Result<Option<i64>, magnetar_bookie::BookieError> {
        self.inner.lac(ledger)
    }
    fn has_ledger(&self, ledger: u64) -> Result<bool, magnetar_bookie::BookieError> {
        self.inner.has_ledger(ledger)
    }
    fn set_fenced(&self, ledger: u64) -> Result<bool, magnetar_bookie::BookieError> {
        self.inner.set_fenced(ledger)
    }
    fn is_fenced(&self, ledger: u64) -> Result<bool, magnetar_bookie::BookieError> {
        self.inner.is_fenced(ledger)
    }
    fn delete_ledger(&self, ledger: u64) -> Result<bool, magnetar_bookie::BookieError> {
        self.inner.delete_ledger(ledger)
    }
    fn ledgers(&self) -> Result<Vec<u64>, magnetar_bookie::BookieError> {
        self.inner.ledgers()
    }
    fn flush(&self) -> Result<(), magnetar_bookie::BookieError> {
        self.inner.flush()
    }
    fn start_writeback(&self) {
        self.writebacks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Storage is written out a little at a time as adds arrive, not only at a flush: with
/// flushes off, 4 MiB of adds ask for writeback about once per WRITEBACK_BYTES.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_writeback_starts_as_adds_arrive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.journal.flush_entry_log_bytes = 0;
    let storage = std::sync::Arc::new(CountingStorage {
        inner: magnetar_bookie::MemStorage::new(),
        writebacks: std::sync::atomic::AtomicUsize::new(0),
    });
    let server = BookieServer::start_with_storage(cfg, storage.clone()).await.expect("start");
    add_64k_entries(&server, 64).await;
    let expected = (64 * 64 * 1024 / magnetar_bookie::server::WRITEBACK_BYTES) as usize - 1;
    let asked = tokio::time::timeout(Duration::from_secs(10), async {
        while storage.writebacks.load(std::sync::atomic::Ordering::SeqCst) < expected {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(asked.is_ok(), "writeback asked {} times, expected {expected}",
        storage.writebacks.load(std::sync::atomic::Ordering::SeqCst));
    server.shutdown().await.expect("shutdown");
}

/// flushInterval: with only the clock to go by (flushEntrylogBytes off), storage is
/// checkpointed once the interval has passed, although the checkpointer is asked to write
/// out every megabyte meanwhile (those asks must not put the checkpoint off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_is_checkpointed_every_flush_interval_while_adds_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.journal.flush_entry_log_bytes = 0;
    cfg.journal.flush_interval = Duration::from_millis(300);
    let server = BookieServer::start(cfg).await.expect("start");
    let client = BookieClient::connect(&server.local_addr().to_string(), Duration::from_secs(5))
        .await
        .expect("connect");
    let data = Bytes::from(vec![7u8; 64 * 1024]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut entry = 0u64;
    while checkpointed_lengths(dir.path()).get(&3).copied().unwrap_or(0) == 0 {
        assert!(std::time::Instant::now() < deadline, "no checkpoint within 10 s of adds");
        for _ in 0..16 {
            client.add(3, entry, entry as i64 - 1, data.clone(), false).await.expect("add");
            entry += 1;
        }
    }
    server.shutdown().await.expect("shutdown");
}

/// The journal files under `dir`, by sequence number.
fn journal_files(dir: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = std::fs::read_dir(dir.join("journal"))
        .expect("journal dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

/// journalMaxBackups: a checkpoint keeps that many journal files before its mark, the
/// newest ones; 0 keeps none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_keeps_journal_max_backups_files() {
    for backups in [0u64, 2] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = config(dir.path());
        cfg.journal.max_size_mb = 1;
        cfg.journal.max_backups = backups;
        let server = BookieServer::start(cfg).await.expect("start");
        add_64k_entries(&server, 6 * 16).await;
        // Shutting down checkpoints last, after the rotations' own checkpoints.
        server.shutdown().await.expect("shutdown");
        let (mark, _) = magnetar_bookie::journal::read_mark(dir.path()).expect("mark").expect("a mark");
        assert!(mark >= 4, "6 MiB in 1 MiB files: rotated only to {mark}");
        let files = journal_files(dir.path());
        let expected: Vec<u64> = (mark - backups..=*files.last().expect("a file")).collect();
        assert_eq!(files, expected, "{backups} backups kept before mark {mark}");
    }
}
