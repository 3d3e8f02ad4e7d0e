//! One test suite written against `LedgerStorage`, run against every implementation, plus the
//! entry-log specific checks: reopen, torn tails, corruption, space freed on delete.

use std::fs::{self, OpenOptions};
use std::path::Path;

use bytes::Bytes;
use std::sync::Arc;

use magnetar_bookie::multidir::MultiDirStorage;
use magnetar_bookie::storage::{EntryLogStorage, LedgerStorage, MemStorage};
use magnetar_bookie::BookieError;
use proptest::prelude::*;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// The behaviour every `LedgerStorage` must have.
fn suite(s: &dyn LedgerStorage) {
    // Nothing there yet.
    assert_eq!(s.get_entry(1, 0).expect("get"), None);
    assert_eq!(s.last_entry(1).expect("last"), None);
    assert_eq!(s.lac(1).expect("lac"), None);
    assert!(!s.has_ledger(1).expect("has"));
    assert!(!s.is_fenced(1).expect("fenced"));

    // Adds: each entry keeps its own lac; the ledger tracks the max.
    s.add_entry(1, 0, -1, b("a")).expect("add");
    s.add_entry(1, 2, 1, b("c")).expect("add");
    s.add_entry(1, 1, 0, b("b")).expect("add");
    assert_eq!(s.get_entry(1, 0).expect("get"), Some((-1, b("a"))));
    assert_eq!(s.get_entry(1, 1).expect("get"), Some((0, b("b"))));
    assert_eq!(s.get_entry(1, 2).expect("get"), Some((1, b("c"))));
    assert_eq!(s.get_entry(1, 3).expect("get"), None);
    assert_eq!(s.last_entry(1).expect("last"), Some(2));
    assert_eq!(s.lac(1).expect("lac"), Some(1));
    assert!(s.has_ledger(1).expect("has"));

    // Re-adding an entry (journal replay, recovery) replaces it; the lac never goes down.
    s.add_entry(1, 2, 0, b("c2")).expect("re-add");
    assert_eq!(s.get_entry(1, 2).expect("get"), Some((0, b("c2"))));
    assert_eq!(s.lac(1).expect("lac"), Some(1));

    // Empty entries are entries.
    s.add_entry(1, 3, 2, Bytes::new()).expect("empty add");
    assert_eq!(s.get_entry(1, 3).expect("get"), Some((2, Bytes::new())));

    // Fencing: creates the ledger when needed, idempotent, per ledger.
    assert!(!s.set_fenced(2).expect("fence"));
    assert!(s.set_fenced(2).expect("fence again"));
    assert!(s.is_fenced(2).expect("fenced"));
    assert!(s.has_ledger(2).expect("has"));
    assert_eq!(s.lac(2).expect("lac"), Some(-1));
    assert_eq!(s.last_entry(2).expect("last"), None);
    assert!(!s.is_fenced(1).expect("other ledger"));
    s.add_entry(2, 0, -1, b("recovered"))
        .expect("storage itself does not refuse adds");

    // Deleting removes everything of that ledger only.
    assert_eq!(s.ledgers().expect("ledgers"), vec![1, 2]);
    assert!(s.delete_ledger(1).expect("delete"));
    assert_eq!(s.ledgers().expect("ledgers"), vec![2]);
    assert!(!s.delete_ledger(1).expect("delete again"));
    assert_eq!(s.get_entry(1, 0).expect("get"), None);
    assert_eq!(s.lac(1).expect("lac"), None);
    assert!(!s.has_ledger(1).expect("has"));
    assert_eq!(s.get_entry(2, 0).expect("get"), Some((-1, b("recovered"))));

    // A deleted ledger id can be written again from scratch.
    s.add_entry(1, 5, 4, b("new")).expect("add");
    assert_eq!(s.last_entry(1).expect("last"), Some(5));
    assert_eq!(s.get_entry(1, 0).expect("get"), None);
    assert!(!s.is_fenced(1).expect("fence state was deleted too"));

    s.flush().expect("flush");
    assert_eq!(s.get_entry(1, 5).expect("get"), Some((4, b("new"))));
}

/// Many threads adding to distinct and shared ledgers at once.
fn concurrent_suite(s: &dyn LedgerStorage) {
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            scope.spawn(move || {
                for e in 0..200u64 {
                    s.add_entry(
                        100 + t % 2,
                        t * 1000 + e,
                        e as i64,
                        Bytes::from(format!("{t}-{e}")),
                    )
                    .expect("add");
                }
            });
        }
    });
    for t in 0..4u64 {
        for e in 0..200u64 {
            let got = s.get_entry(100 + t % 2, t * 1000 + e).expect("get");
            assert_eq!(got, Some((e as i64, Bytes::from(format!("{t}-{e}")))));
        }
    }
    assert_eq!(s.lac(100).expect("lac"), Some(199));
}

#[test]
fn mem_storage_suite() {
    suite(&MemStorage::new());
    concurrent_suite(&MemStorage::new());
}

#[test]
fn entry_log_storage_suite() {
    let dir = tempfile::tempdir().expect("tempdir");
    suite(&EntryLogStorage::open(dir.path()).expect("open"));
    let dir = tempfile::tempdir().expect("tempdir");
    concurrent_suite(&EntryLogStorage::open(dir.path()).expect("open"));
}

#[test]
fn entry_log_storage_suite_with_few_open_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    suite(&EntryLogStorage::open_with_limit(dir.path(), 1).expect("open"));
    let dir = tempfile::tempdir().expect("tempdir");
    concurrent_suite(&EntryLogStorage::open_with_limit(dir.path(), 2).expect("open"));
}

fn spread_over(dirs: &[&Path]) -> MultiDirStorage {
    MultiDirStorage::new(
        dirs.iter()
            .map(|d| Arc::new(EntryLogStorage::open(d).expect("open")) as Arc<dyn LedgerStorage>)
            .collect(),
    )
}

#[test]
fn multi_dir_storage_suite() {
    let parts = || (0..3).map(|_| Arc::new(MemStorage::new()) as Arc<dyn LedgerStorage>).collect();
    suite(&MultiDirStorage::new(parts()));
    concurrent_suite(&MultiDirStorage::new(parts()));
    let (a, b) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    suite(&spread_over(&[a.path(), b.path()]));
    let (a, b) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    concurrent_suite(&spread_over(&[a.path(), b.path()]));
}

#[test]
fn ledgers_spread_over_directories_stay_found_after_reopen_and_reorder() {
    let (a, c) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let b_path = c.path();
    {
        let s = spread_over(&[a.path(), b_path]);
        for ledger in 0..10u64 {
            s.add_entry(ledger, 0, -1, Bytes::from(format!("ledger {ledger}"))).expect("add");
        }
        s.set_fenced(3).expect("fence");
        s.flush().expect("flush");
    }
    // Each directory holds its share: the even ledgers in the first, the odd in the second.
    for (dir, parity) in [(a.path(), 0), (b_path, 1)] {
        let alone = EntryLogStorage::open(dir).expect("open one");
        for ledger in 0..10u64 {
            assert_eq!(alone.has_ledger(ledger).expect("has"), ledger % 2 == parity, "ledger {ledger}");
        }
    }
    // Listed the other way round, every ledger is still where it was written.
    let s = spread_over(&[b_path, a.path()]);
    for ledger in 0..10u64 {
        assert_eq!(s.get_entry(ledger, 0).expect("get"), Some((-1, Bytes::from(format!("ledger {ledger}")))));
    }
    assert!(s.is_fenced(3).expect("fenced"));
    s.add_entry(4, 1, 0, b("more")).expect("add to a ledger written before");
    s.flush().expect("flush");
    drop(s);
    let alone = EntryLogStorage::open(a.path()).expect("open one");
    assert_eq!(alone.get_entry(4, 1).expect("get"), Some((0, b("more"))));
    assert!(deleted_everywhere(&[a.path(), b_path], 4));
}

/// Deleting through a spread storage removes the ledger from whichever directory has it.
fn deleted_everywhere(dirs: &[&Path], ledger: u64) -> bool {
    let s = spread_over(dirs);
    assert!(s.delete_ledger(ledger).expect("delete"));
    s.flush().expect("flush");
    drop(s);
    dirs.iter().all(|d| !EntryLogStorage::open(d).expect("open").has_ledger(ledger).expect("has"))
}

#[test]
fn many_ledgers_stay_under_the_open_file_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open_with_limit(dir.path(), 8).expect("open");
    for round in 0..3u64 {
        for ledger in 0..100u64 {
            s.add_entry(
                ledger,
                round,
                round as i64 - 1,
                Bytes::from(format!("{ledger}/{round}")),
            )
            .expect("add");
            assert!(s.open_files() <= 8, "{} open files", s.open_files());
        }
    }
    s.set_fenced(42).expect("fence");
    s.flush().expect("flush");
    for ledger in 0..100u64 {
        for round in 0..3u64 {
            let got = s.get_entry(ledger, round).expect("get");
            assert_eq!(
                got,
                Some((round as i64 - 1, Bytes::from(format!("{ledger}/{round}"))))
            );
        }
    }
    assert!(s.open_files() <= 8);
    drop(s);
    let s = EntryLogStorage::open_with_limit(dir.path(), 8).expect("reopen");
    assert_eq!(s.open_files(), 0);
    assert!(s.is_fenced(42).expect("fenced"));
    assert_eq!(
        s.get_entry(99, 2).expect("get"),
        Some((1, Bytes::from("99/2")))
    );
}

#[test]
fn entry_log_storage_suite_survives_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = EntryLogStorage::open(dir.path()).expect("open");
        suite(&s);
    }
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    assert_eq!(s.get_entry(1, 5).expect("get"), Some((4, b("new"))));
    assert_eq!(s.get_entry(1, 0).expect("get"), None);
    assert_eq!(s.get_entry(2, 0).expect("get"), Some((-1, b("recovered"))));
    assert!(s.is_fenced(2).expect("fence survives"));
    assert!(!s.is_fenced(1).expect("fenced"));
    assert_eq!(s.ledgers().expect("ledgers"), vec![1, 2]);
    assert_eq!(s.lac(1).expect("lac"), Some(4));
    assert_eq!(s.last_entry(1).expect("last"), Some(5));
}

/// Where the last record of the log at `path` ends: a log written with direct I/O goes on
/// with zeros to the end of its last block.
fn records_end(path: &Path) -> u64 {
    let raw = fs::read(path).expect("read log");
    let mut at = 0;
    while let Ok((_, used)) = magnetar_bookie::journal::parse_record(&raw[at..]) {
        at += used;
    }
    at as u64
}

fn log_path(dir: &Path, ledger: u64) -> std::path::PathBuf {
    dir.join("ledgers").join(format!("{ledger}.log"))
}

#[test]
fn deleting_a_ledger_frees_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    s.add_entry(9, 0, -1, Bytes::from(vec![1u8; 100_000]))
        .expect("add");
    s.flush().expect("flush");
    assert!(log_path(dir.path(), 9).exists());
    assert!(s.delete_ledger(9).expect("delete"));
    assert!(!log_path(dir.path(), 9).exists());
    s.flush().expect("flush");
    drop(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    assert!(!s.has_ledger(9).expect("has"));
}

#[test]
fn unsynced_torn_tail_is_cut_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    s.add_entry(4, 0, -1, b("synced")).expect("add");
    s.flush().expect("flush");
    s.add_entry(4, 1, 0, b("not yet synced")).expect("add");
    drop(s);
    let path = log_path(dir.path(), 4);
    let len = records_end(&path);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len - 3)
        .expect("truncate");
    let s = EntryLogStorage::open(dir.path()).expect("reopen cuts the torn tail");
    assert_eq!(s.get_entry(4, 0).expect("get"), Some((-1, b("synced"))));
    assert_eq!(s.get_entry(4, 1).expect("get"), None);
    // The log goes on after the cut.
    s.add_entry(4, 1, 0, b("again")).expect("add");
    drop(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    assert_eq!(s.get_entry(4, 1).expect("get"), Some((0, b("again"))));
}

fn idx_path(dir: &Path, ledger: u64) -> std::path::PathBuf {
    dir.join("ledgers").join(format!("{ledger}.idx"))
}

/// Three flushed entries of ledger 5, with byte 40 (inside the first record) flipped.
fn corrupted_first_record(dir: &Path) -> std::path::PathBuf {
    let s = EntryLogStorage::open(dir).expect("open");
    for e in 0..3 {
        s.add_entry(5, e, -1, b("payload-payload")).expect("add");
    }
    s.flush().expect("flush");
    drop(s);
    let path = log_path(dir, 5);
    let mut raw = fs::read(&path).expect("read");
    raw[40] ^= 0x55;
    fs::write(&path, &raw).expect("write");
    path
}

#[test]
fn corruption_in_the_checkpointed_part_fails_a_scanning_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = corrupted_first_record(dir.path());
    // Without its index the log is read and verified in full on open.
    fs::remove_file(idx_path(dir.path(), 5)).expect("remove index");
    match EntryLogStorage::open(dir.path()) {
        Err(BookieError::Corrupt { file, offset, .. }) => {
            assert_eq!(file, path);
            assert_eq!(offset, 0);
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("expected Corrupt, got an open storage"),
    }
}

#[test]
fn corruption_under_the_index_is_caught_on_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    corrupted_first_record(dir.path());
    // With an index the open does not read the log; the damaged entry fails its read.
    let s = EntryLogStorage::open(dir.path()).expect("open through the index");
    assert!(matches!(
        s.get_entry(5, 0),
        Err(BookieError::Corrupt { .. })
    ));
    assert_eq!(
        s.get_entry(5, 1).expect("get"),
        Some((-1, b("payload-payload")))
    );
    assert_eq!(
        s.get_entry(5, 2).expect("get"),
        Some((-1, b("payload-payload")))
    );
}

#[test]
fn a_torn_index_is_trimmed_and_the_log_tail_scanned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    s.add_entry(2, 0, -1, b("zero")).expect("add");
    s.flush().expect("flush");
    s.add_entry(2, 1, 0, b("one")).expect("add");
    s.set_fenced(2).expect("fence");
    s.flush().expect("flush");
    drop(s);
    let idx = idx_path(dir.path(), 2);
    let len = fs::metadata(&idx).expect("meta").len();
    OpenOptions::new()
        .write(true)
        .open(&idx)
        .expect("open")
        .set_len(len - 3)
        .expect("tear");
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    assert_eq!(s.get_entry(2, 0).expect("get"), Some((-1, b("zero"))));
    assert_eq!(s.get_entry(2, 1).expect("get"), Some((0, b("one"))));
    assert!(s.is_fenced(2).expect("fenced"));
    s.add_entry(2, 2, 1, b("two")).expect("add");
    s.flush().expect("flush");
    drop(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    assert_eq!(s.get_entry(2, 2).expect("get"), Some((1, b("two"))));
    assert_eq!(s.lac(2).expect("lac"), Some(1));
    assert!(s.is_fenced(2).expect("fenced"));
}

#[test]
fn an_index_that_does_not_match_its_log_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    for e in 0..5 {
        s.add_entry(3, e, e as i64 - 1, b("entry")).expect("add");
    }
    s.flush().expect("flush");
    drop(s);
    // A well-formed chunk whose single record claims a different layout of the log.
    let mut body = Vec::new();
    body.push(1u8);
    body.extend_from_slice(&0u64.to_be_bytes());
    body.extend_from_slice(&7i64.to_be_bytes());
    body.extend_from_slice(&0u64.to_be_bytes());
    body.extend_from_slice(&10u32.to_be_bytes());
    let mut chunk = Vec::new();
    chunk.extend_from_slice(&1u32.to_be_bytes());
    chunk.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    chunk.extend_from_slice(&body);
    fs::write(idx_path(dir.path(), 3), &chunk).expect("write bogus index");
    let s = EntryLogStorage::open(dir.path()).expect("reopen scans the log");
    for e in 0..5 {
        assert_eq!(
            s.get_entry(3, e).expect("get"),
            Some((e as i64 - 1, b("entry")))
        );
    }
    assert_eq!(s.lac(3).expect("lac"), Some(3));
}

#[test]
fn corruption_after_open_is_an_error_not_wrong_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    s.add_entry(6, 0, -1, b("hello world")).expect("add");
    s.flush().expect("flush");
    let path = log_path(dir.path(), 6);
    let mut raw = fs::read(&path).expect("read");
    let last = records_end(&path) as usize - 1;
    raw[last] ^= 0x01;
    OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &raw, 0))
        .expect("rewrite");
    assert!(matches!(
        s.get_entry(6, 0),
        Err(BookieError::Corrupt { .. })
    ));
}

#[test]
fn truncated_checkpointed_log_fails_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    s.add_entry(7, 0, -1, b("one")).expect("add");
    s.add_entry(7, 1, -1, b("two")).expect("add");
    s.flush().expect("flush");
    drop(s);
    let path = log_path(dir.path(), 7);
    let len = records_end(&path);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len - 1)
        .expect("truncate");
    assert!(matches!(
        EntryLogStorage::open(dir.path()),
        Err(BookieError::Corrupt { .. })
    ));
}

#[derive(Debug, Clone)]
enum Op {
    Add(u64, u64, i64, Vec<u8>),
    Fence(u64),
    Delete(u64),
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..4, 0u64..8, -1i64..8, proptest::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(l, e, lac, d)| Op::Add(l, e, lac, d)),
        1 => (0u64..4).prop_map(Op::Fence),
        1 => (0u64..4).prop_map(Op::Delete),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// The entry-log storage behaves like the in-memory model under any sequence of operations,
    /// including reopening.
    #[test]
    fn entry_log_matches_mem_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = MemStorage::new();
        let mut real = EntryLogStorage::open_with_limit(dir.path(), 2).expect("open");
        for op in ops {
            match op {
                Op::Add(l, e, lac, d) => {
                    model.add_entry(l, e, lac, Bytes::from(d.clone())).expect("model");
                    real.add_entry(l, e, lac, Bytes::from(d)).expect("real");
                }
                Op::Fence(l) => prop_assert_eq!(model.set_fenced(l).expect("m"), real.set_fenced(l).expect("r")),
                Op::Delete(l) => prop_assert_eq!(model.delete_ledger(l).expect("m"), real.delete_ledger(l).expect("r")),
                Op::Flush => real.flush().expect("flush"),
                Op::Reopen => {
                    drop(real);
                    real = EntryLogStorage::open_with_limit(dir.path(), 2).expect("reopen");
                }
            }
            for l in 0..4 {
                prop_assert_eq!(model.has_ledger(l).expect("m"), real.has_ledger(l).expect("r"));
                prop_assert_eq!(model.lac(l).expect("m"), real.lac(l).expect("r"));
                prop_assert_eq!(model.is_fenced(l).expect("m"), real.is_fenced(l).expect("r"));
                prop_assert_eq!(model.last_entry(l).expect("m"), real.last_entry(l).expect("r"));
                for e in 0..8 {
                    prop_assert_eq!(model.get_entry(l, e).expect("m"), real.get_entry(l, e).expect("r"));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Opening a ledger log of arbitrary bytes fails with an error or yields only records that
    /// check out; it never panics.
    #[test]
    fn open_survives_arbitrary_log_bytes(garbage in proptest::collection::vec(any::<u8>(), 0..600)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = EntryLogStorage::open(dir.path()).expect("open");
        s.add_entry(8, 0, -1, b("kept")).expect("add");
        s.flush().expect("flush");
        drop(s);
        let path = log_path(dir.path(), 8);
        let mut raw = fs::read(&path).expect("read");
        raw.extend_from_slice(&garbage);
        fs::write(&path, &raw).expect("write");
        if let Ok(s) = EntryLogStorage::open(dir.path()) {
            prop_assert_eq!(s.get_entry(8, 0).expect("get"), Some((-1, b("kept"))));
        }
    }
}

#[test]
fn deletes_racing_flushes_never_leave_a_stale_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                s.flush().expect("flush");
            }
        });
        for round in 0..150u64 {
            for e in 0..4 {
                s.add_entry(1, e, -1, Bytes::from(vec![round as u8; 200]))
                    .expect("add");
            }
            s.delete_ledger(1).expect("delete");
            s.add_entry(1, 0, -1, Bytes::from(format!("round {round}")))
                .expect("add");
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    drop(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen after racing deletes and flushes");
    assert_eq!(s.get_entry(1, 0).expect("get"), Some((-1, b("round 149"))));
    assert_eq!(s.last_entry(1).expect("last"), Some(0));
}

/// Entry `e` of the write-out tests: sizes from 50 B to about 9 KB, so records end anywhere
/// in a block and some span several.
fn sized(e: u64) -> Bytes {
    Bytes::from(vec![(e % 251) as u8; 50 + (e as usize * 997) % 9000])
}

fn assert_sized(s: &EntryLogStorage, ledger: u64, entries: std::ops::Range<u64>) {
    for e in entries {
        assert_eq!(
            s.get_entry(ledger, e).expect("get"),
            Some((e as i64 - 1, sized(e))),
            "entry {ledger}:{e}"
        );
    }
}

#[test]
fn appends_wait_in_memory_and_are_written_out_in_whole_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    let path = log_path(dir.path(), 8);
    for e in 0..40 {
        s.add_entry(8, e, e as i64 - 1, sized(e)).expect("add");
    }
    assert_eq!(fs::metadata(&path).expect("meta").len(), 0, "an append writes nothing itself");
    assert_sized(&s, 8, 0..40);

    s.start_writeback();
    let len = fs::metadata(&path).expect("meta").len();
    assert_eq!(len % 4096, 0, "a write-out covers whole blocks");
    let end = records_end(&path);
    assert!(end > len - 4096 && end <= len, "the records end in the last block");
    // The next write-out starts inside that block and keeps what it held.
    for e in 40..60 {
        s.add_entry(8, e, e as i64 - 1, sized(e)).expect("add");
    }
    s.start_writeback();
    assert!(records_end(&path) > end);
    assert_sized(&s, 8, 0..60);

    s.flush().expect("flush");
    drop(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    assert_sized(&s, 8, 0..60);
    // A reopened log goes on from inside its last block too.
    s.add_entry(8, 60, 59, sized(60)).expect("add");
    s.flush().expect("flush");
    drop(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    assert_sized(&s, 8, 0..61);
}

#[test]
fn written_out_entries_survive_a_crash_and_buffered_ones_are_left_to_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    for e in 0..10 {
        s.add_entry(9, e, e as i64 - 1, sized(e)).expect("add");
    }
    s.start_writeback();
    s.add_entry(9, 10, 9, sized(10)).expect("add");
    // A crash: no flush, nothing written on the way out.
    std::mem::forget(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen: the padding is no torn record");
    assert_sized(&s, 9, 0..10);
    assert_eq!(s.get_entry(9, 10).expect("get"), None);
    assert_eq!(s.last_entry(9).expect("last"), Some(9));
}

#[test]
fn a_log_past_its_buffer_limit_is_written_out_by_the_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    let big = Bytes::from(vec![7u8; 1 << 20]);
    let limit = magnetar_bookie::entrylog::MAX_BUFFERED as u64;
    let mut e = 0;
    while e << 20 <= limit {
        s.add_entry(10, e, -1, big.clone()).expect("add");
        e += 1;
    }
    let written = fs::metadata(log_path(dir.path(), 10)).expect("meta").len();
    assert!(written >= limit, "{written} bytes written with {e} MiB appended");
    for i in 0..e {
        assert_eq!(s.get_entry(10, i).expect("get"), Some((-1, big.clone())));
    }
}

#[test]
fn reads_racing_write_outs_always_see_the_right_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = std::sync::Arc::new(EntryLogStorage::open(dir.path()).expect("open"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                s.start_writeback();
            }
        })
    };
    for e in 0..2000 {
        s.add_entry(11, e, e as i64 - 1, sized(e)).expect("add");
        assert_sized(&s, 11, e..e + 1);
        assert_sized(&s, 11, e / 2..e / 2 + 1);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().expect("writer");
    s.flush().expect("flush");
    assert_sized(&s, 11, 0..2000);
}

#[test]
fn a_write_out_of_many_pieces_reads_back_after_a_reopen() {
    // A write-out goes to the disk in pieces; odd-sized records make pieces split records.
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    let entry = |e: u64| Bytes::from(vec![(e % 251) as u8; 3001 + (e as usize * 7) % 997]);
    for e in 0..400 {
        s.add_entry(12, e, e as i64 - 1, entry(e)).expect("add");
    }
    s.start_writeback();
    assert!(fs::metadata(log_path(dir.path(), 12)).expect("meta").len() > 1 << 20);
    s.flush().expect("flush");
    drop(s);
    let s = EntryLogStorage::open(dir.path()).expect("reopen");
    for e in 0..400 {
        assert_eq!(s.get_entry(12, e).expect("get"), Some((e as i64 - 1, entry(e))), "entry {e}");
    }
}

#[test]
fn idle_indexes_are_dropped_after_a_flush_and_read_back_on_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open_with_limits(dir.path(), 256, 150).expect("open");
    for ledger in 20..24 {
        for e in 0..100 {
            s.add_entry(ledger, e, e as i64 - 1, sized(e)).expect("add");
        }
    }
    assert_eq!(s.indexed_entries(), 400, "nothing is dropped before a flush");
    s.flush().expect("flush");
    assert_eq!(s.indexed_entries(), 400, "logs written since the last flush keep their index");
    s.flush().expect("flush");
    let kept = s.indexed_entries();
    assert!(kept <= 150, "{kept} entries indexed in memory after a flush interval unused");
    // Reads, the last entry and the lac of a dropped index are as before.
    for ledger in 20..24 {
        assert_eq!(s.last_entry(ledger).expect("last"), Some(99));
        assert_eq!(s.lac(ledger).expect("lac"), Some(98));
        assert_sized(&s, ledger, 0..100);
    }
    assert_eq!(s.indexed_entries(), 400, "each use read its index back");
    s.flush().expect("flush");
    s.flush().expect("flush");
    assert!(s.indexed_entries() <= 150);
    // Appending to, fencing and deleting logs whose index was dropped.
    for ledger in 20..24 {
        s.add_entry(ledger, 100, 99, sized(100)).expect("add");
    }
    s.flush().expect("flush");
    assert!(!s.set_fenced(21).expect("fence"), "not fenced before");
    assert!(s.delete_ledger(22).expect("delete"));
    s.flush().expect("flush");
    drop(s);
    let s = EntryLogStorage::open_with_limits(dir.path(), 256, 150).expect("reopen");
    assert!(s.indexed_entries() <= 150, "open keeps to the limit too");
    for ledger in [20, 21, 23] {
        assert_sized(&s, ledger, 0..101);
    }
    assert!(s.is_fenced(21).expect("fenced"));
    assert!(!s.has_ledger(22).expect("has"));
}

#[test]
fn with_a_zero_limit_every_flushed_index_is_dropped_and_an_append_reads_its_own_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open_with_limits(dir.path(), 256, 0).expect("open");
    for e in 0..50 {
        s.add_entry(30, e, e as i64 - 1, sized(e)).expect("add");
        s.add_entry(31, e, e as i64 - 1, sized(e)).expect("add");
    }
    s.flush().expect("flush");
    s.flush().expect("flush");
    assert_eq!(s.indexed_entries(), 0);
    // The append reads ledger 31's index back, and adds to it; ledger 30 stays dropped.
    s.add_entry(31, 50, 49, sized(50)).expect("add");
    assert_eq!(s.indexed_entries(), 51);
    s.flush().expect("flush");
    assert_eq!(s.indexed_entries(), 51, "appended to since the last flush");
    s.flush().expect("flush");
    assert_eq!(s.indexed_entries(), 0);
    assert_sized(&s, 30, 0..50);
    assert_sized(&s, 31, 0..51);
}

#[test]
fn a_ledger_written_between_flushes_keeps_its_index() {
    // A ledger being written is quiet for the instant after each flush; its index must not
    // be dropped then, or the next append reads all of it back.
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open_with_limits(dir.path(), 256, 10).expect("open");
    let mut next = 0u64;
    for _ in 0..5 {
        for _ in 0..20 {
            s.add_entry(60, next, next as i64 - 1, sized(next)).expect("add");
            next += 1;
        }
        s.flush().expect("flush");
        assert_eq!(s.indexed_entries(), next as usize, "after {next} entries");
    }
    // Read between flushes, it keeps its index too; left alone for a flush interval, not.
    assert_sized(&s, 60, 0..next);
    s.flush().expect("flush");
    assert_eq!(s.indexed_entries(), next as usize);
    s.flush().expect("flush");
    assert_eq!(s.indexed_entries(), 0);
    assert_sized(&s, 60, 0..next);
}

#[test]
fn a_flush_gives_back_the_buffers_of_logs_nothing_was_appended_to_since() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    let big = Bytes::from(vec![3u8; 100_000]);
    for ledger in 40..50 {
        for e in 0..20 {
            s.add_entry(ledger, e, e as i64 - 1, big.clone()).expect("add");
        }
    }
    assert!(s.buffer_bytes() >= 10 * 2_000_000, "{} bytes buffered", s.buffer_bytes());
    s.flush().expect("flush");
    assert!(s.buffer_bytes() <= 10 * 2 * 4096, "{} bytes still held", s.buffer_bytes());
    // The logs go on as before: appends, write-outs and reads.
    s.add_entry(45, 20, 19, big.clone()).expect("add");
    s.flush().expect("flush");
    for e in 0..21 {
        assert_eq!(s.get_entry(45, e).expect("get"), Some((e as i64 - 1, big.clone())));
    }
}

#[test]
fn open_keeps_the_indexes_it_reads_within_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EntryLogStorage::open(dir.path()).expect("open");
    for ledger in 50..60 {
        for e in 0..30 {
            s.add_entry(ledger, e, e as i64 - 1, sized(e)).expect("add");
        }
    }
    s.flush().expect("flush");
    drop(s);
    let s = EntryLogStorage::open_with_limits(dir.path(), 256, 100).expect("reopen");
    let kept = s.indexed_entries();
    assert!(kept <= 100 && kept > 0, "{kept} entries indexed after open");
    for ledger in 50..60 {
        assert_sized(&s, ledger, 0..30);
    }
}

/// What a log file holds after a flush, and after further adds that stay in memory, a halt
/// or not, and the drop.
fn log_after_drop(halt: bool) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("ledgers").join("7.log");
    let storage = EntryLogStorage::open(dir.path()).expect("open");
    storage.add_entry(7, 0, -1, b("flushed")).expect("add");
    storage.flush().expect("flush");
    let flushed = fs::read(&log).expect("log");
    storage.add_entry(7, 1, 0, b("only in memory")).expect("add");
    if halt {
        storage.halt();
        storage.start_writeback();
    }
    drop(storage);
    (flushed, fs::read(&log).expect("log"))
}

#[test]
fn a_halted_entry_log_writes_nothing_more_not_even_when_dropped() {
    // A bookie that stops as a crash would halts its storage; the storage may be dropped
    // later, when a restarted bookie already writes the same files.
    let (flushed, after) = log_after_drop(true);
    assert_eq!(after, flushed);
    // Without the halt the drop writes the entry out (so the check above can fail).
    let (flushed, after) = log_after_drop(false);
    assert_ne!(after, flushed);
    assert!(after.windows(14).any(|w| w == b"only in memory"));
}
