//! The journal: group commit, rotation, replay, torn tails and corruption.

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::journal::{
    self, Journal, JournalRecord, RecordKind, RECORD_FIXED_LEN, RECORD_HEADER_LEN,
};
use magnetar_bookie::{BookieError, JournalConfig};
use proptest::prelude::*;

const WAIT: Duration = Duration::from_secs(10);

fn config(max_group_wait_ms: u64, threshold: usize) -> JournalConfig {
    JournalConfig {
        sync_data: true,
        max_group_wait: Duration::from_millis(max_group_wait_ms),
        buffered_writes_threshold: threshold,
        max_size_mb: 2048,
        flush_when_queue_empty: false,
        pre_alloc_size_mb: 1,
        flush_entry_log_bytes: 0,
        flush_interval: std::time::Duration::from_secs(60),
        max_backups: 0,
        direct_io: true,
    }
}

/// Submit `records` and wait (bounded) until all are durable.
fn write_all(j: &Journal, records: &[JournalRecord]) {
    let (tx, rx) = mpsc::channel();
    for r in records {
        let tx = tx.clone();
        j.submit(
            r.clone(),
            Box::new(move |res| tx.send(res.is_ok()).expect("send")),
        );
    }
    for _ in records {
        assert!(rx.recv_timeout(WAIT).expect("completion"));
    }
}

fn records(n: u64) -> Vec<JournalRecord> {
    (0..n)
        .map(|i| {
            JournalRecord::entry(
                1 + i % 3,
                i,
                i as i64 - 1,
                Bytes::from(format!("entry {i}")),
            )
        })
        .collect()
}

fn replay_all(dir: &Path) -> Result<(Vec<JournalRecord>, journal::ReplayOutcome), BookieError> {
    let mut out = Vec::new();
    let outcome = journal::replay(dir, |r| {
        out.push(r.clone());
        Ok(())
    })?;
    Ok((out, outcome))
}

#[test]
fn group_commit_shares_one_write_among_queued_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(300);
    // The group closes when it holds all 300 records (the threshold), long before the wait
    // runs out: one write, one fdatasync, however slowly the records arrive.
    let threshold = recs.iter().map(JournalRecord::encoded_len).sum();
    let j =
        Journal::open(dir.path(), config(60_000, threshold), 1, Box::new(|_| {})).expect("open");
    write_all(&j, &recs);
    let stats = j.stats();
    assert_eq!(stats.records, 300);
    assert_eq!(
        stats.batches, 1,
        "300 records within one group took {} writes",
        stats.batches
    );
    assert_eq!(stats.bytes, threshold as u64);
    j.shutdown().expect("shutdown");
    assert_eq!(replay_all(dir.path()).expect("replay").0, recs);
}

#[test]
fn buffered_writes_threshold_bounds_a_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A threshold of one byte: every record is its own write, however long the group wait.
    let j = Journal::open(dir.path(), config(1000, 1), 1, Box::new(|_| {})).expect("open");
    let recs = records(20);
    write_all(&j, &recs);
    assert_eq!(j.stats().batches, 20);
    j.shutdown().expect("shutdown");
}

#[test]
fn completions_run_in_queue_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Journal::open(dir.path(), config(1, 4096), 1, Box::new(|_| {})).expect("open");
    let (tx, rx) = mpsc::channel();
    for i in 0..500u64 {
        let tx = tx.clone();
        j.submit(
            JournalRecord::entry(1, i, -1, Bytes::new()),
            Box::new(move |r| tx.send((i, r.is_ok())).expect("send")),
        );
    }
    for i in 0..500u64 {
        assert_eq!(rx.recv_timeout(WAIT).expect("completion"), (i, true));
    }
    j.shutdown().expect("shutdown");
}

#[test]
fn submit_after_shutdown_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Journal::open(dir.path(), JournalConfig::default(), 1, Box::new(|_| {})).expect("open");
    j.shutdown().expect("shutdown");
    let (tx, rx) = mpsc::channel();
    j.submit(
        JournalRecord::fence(1),
        Box::new(move |r| tx.send(r.is_err()).expect("send")),
    );
    assert!(rx.recv_timeout(WAIT).expect("completion"));
}

#[test]
fn rotation_reports_new_files_and_old_ones_can_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (rot_tx, rot_rx) = mpsc::channel();
    let cfg = JournalConfig {
        max_size_mb: 1,
        flush_when_queue_empty: false,
        ..config(0, 64 * 1024)
    };
    let j = Journal::open(
        dir.path(),
        cfg,
        7,
        Box::new(move |seq| rot_tx.send(seq).expect("send")),
    )
    .expect("open");
    let big = Bytes::from(vec![0xabu8; 256 * 1024]);
    let recs: Vec<JournalRecord> = (0..10)
        .map(|i| JournalRecord::entry(3, i, -1, big.clone()))
        .collect();
    write_all(&j, &recs);
    let rotations: Vec<u64> = rot_rx.try_iter().collect();
    assert!(
        rotations.len() >= 2,
        "2.5 MiB in 1 MiB files rotated {rotations:?}"
    );
    assert_eq!(rotations[0], 8);
    assert_eq!(j.current_seq(), *rotations.last().expect("some"));
    let files = journal::list_files(dir.path()).expect("list");
    assert_eq!(files.first(), Some(&7));
    assert_eq!(files.last(), Some(&j.current_seq()));
    j.shutdown().expect("shutdown");
    assert_eq!(replay_all(dir.path()).expect("replay").0, recs);

    let removed = journal::delete_before(dir.path(), rotations[1]).expect("delete");
    assert_eq!(removed, 2);
    let (left, outcome) = replay_all(dir.path()).expect("replay");
    assert_eq!(outcome.files.first(), Some(&rotations[1]));
    assert!(left.len() < recs.len());
    assert_eq!(left[..], recs[recs.len() - left.len()..]);
}

fn journal_with(dir: &Path, recs: &[JournalRecord]) -> std::path::PathBuf {
    let j = Journal::open(dir, config(0, 1), 1, Box::new(|_| {})).expect("open");
    write_all(&j, recs);
    j.shutdown().expect("shutdown");
    journal::file_path(dir, 1)
}

const MIB: u64 = 1024 * 1024;

/// Wait (bounded) until the file at `path` is `len` bytes long: an idle journal writes its
/// zeros ahead on its own thread.
fn wait_for_len(path: &Path, len: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let now = fs::metadata(path).expect("meta").len();
        if now == len {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "file length {now}, expected {len}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_preallocated_file_is_cut_back_to_its_records_on_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(5);
    let j = Journal::open(dir.path(), config(0, 1), 1, Box::new(|_| {})).expect("open");
    write_all(&j, &recs);
    let path = journal::file_path(dir.path(), 1);
    // Idle, the journal writes zeros to the first chunk boundary at least the
    // preallocation size (1 MiB) past its records.
    let written: usize = recs.iter().map(|r| r.encoded_len()).sum();
    wait_for_len(&path, 2 * MIB);
    j.shutdown().expect("shutdown");
    assert_eq!(fs::metadata(&path).expect("meta").len(), written as u64);
    let (got, outcome) = replay_all(dir.path()).expect("replay");
    assert_eq!(got, recs);
    assert_eq!(outcome.torn_tail_bytes, 0);
}

#[test]
fn preallocation_follows_the_records_while_the_journal_is_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Journal::open(dir.path(), config(0, 1), 1, Box::new(|_| {})).expect("open");
    let path = journal::file_path(dir.path(), 1);
    wait_for_len(&path, MIB);
    // 2.1 MiB of records in one burst pass the zeros; idle again, the journal writes zeros
    // up to the chunk boundary at least 1 MiB past them.
    let big = Bytes::from(vec![0x5au8; 700 * 1024]);
    let recs: Vec<JournalRecord> = (0..3).map(|i| JournalRecord::entry(9, i, -1, big.clone())).collect();
    write_all(&j, &recs);
    wait_for_len(&path, 4 * MIB);
    j.halt();
    let (got, outcome) = replay_all(dir.path()).expect("replay");
    assert_eq!(got, recs);
    assert_eq!(outcome.torn_tail_bytes, 0);
}

#[test]
fn after_a_crash_the_preallocated_zeros_end_the_records_quietly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(4);
    let j = Journal::open(dir.path(), config(0, 1), 1, Box::new(|_| {})).expect("open");
    write_all(&j, &recs);
    let path = journal::file_path(dir.path(), 1);
    wait_for_len(&path, 2 * MIB);
    j.halt();
    let len = fs::metadata(&path).expect("meta").len();
    assert_eq!(len, 2 * MIB, "the zeros stay after a crash");
    let (got, outcome) = replay_all(dir.path()).expect("replay");
    assert_eq!(got, recs);
    assert_eq!(outcome.torn_tail_bytes, 0);
}

#[test]
fn a_record_torn_over_preallocated_zeros_is_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(3);
    let j = Journal::open(dir.path(), config(0, 1), 1, Box::new(|_| {})).expect("open");
    write_all(&j, &recs);
    let path = journal::file_path(dir.path(), 1);
    wait_for_len(&path, 2 * MIB);
    j.halt();
    // A fourth record of which only the first half reached the disk before the crash.
    let written: usize = recs.iter().map(|r| r.encoded_len()).sum();
    let mut torn = Vec::new();
    JournalRecord::entry(1, 3, 2, Bytes::from_static(b"never acknowledged")).encode(&mut torn);
    let f = OpenOptions::new().write(true).open(&path).expect("open");
    std::os::unix::fs::FileExt::write_all_at(&f, &torn[..torn.len() / 2], written as u64)
        .expect("write");
    let (got, outcome) = replay_all(dir.path()).expect("the torn record is dropped");
    assert_eq!(got, recs);
    assert!(outcome.torn_tail_bytes > 0);
}

#[test]
fn zeros_in_the_middle_are_corruption_not_padding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(3);
    let path = journal_with(dir.path(), &recs);
    let mut raw = fs::read(&path).expect("read");
    let first_len = recs[0].encoded_len();
    raw[first_len..first_len + recs[1].encoded_len()].fill(0);
    fs::write(&path, &raw).expect("write");
    assert!(matches!(
        replay_all(dir.path()),
        Err(BookieError::Corrupt { .. })
    ));
}

#[test]
fn garbage_after_the_last_record_is_a_torn_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(3);
    let path = journal_with(dir.path(), &recs);
    let mut raw = fs::read(&path).expect("read");
    let good_len = raw.len();
    raw.extend_from_slice(&[0x00, 0x00, 0x00, 0x30, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
    fs::write(&path, &raw).expect("write");
    let (got, outcome) = replay_all(dir.path()).expect("torn tail is dropped");
    assert_eq!(got, recs);
    assert_eq!(outcome.torn_tail_bytes, (raw.len() - good_len) as u64);
}

#[test]
fn corruption_in_the_middle_is_reported_by_file_and_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(3);
    let path = journal_with(dir.path(), &recs);
    let first_len = recs[0].encoded_len();
    let mut raw = fs::read(&path).expect("read");
    raw[first_len + RECORD_HEADER_LEN + RECORD_FIXED_LEN] ^= 0x20;
    fs::write(&path, &raw).expect("write");
    match replay_all(dir.path()) {
        Err(BookieError::Corrupt {
            file,
            offset,
            reason,
        }) => {
            assert_eq!(file, path);
            assert_eq!(offset, first_len as u64);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_damaged_length_cannot_hide_later_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(3);
    let path = journal_with(dir.path(), &recs);
    let mut raw = fs::read(&path).expect("read");
    // Make the first record claim to run past the end of the file.
    raw[0] = 0x00;
    raw[1] = 0x10;
    fs::write(&path, &raw).expect("write");
    assert!(matches!(
        replay_all(dir.path()),
        Err(BookieError::Corrupt { offset: 0, .. })
    ));
}

#[test]
fn a_bad_tail_in_an_older_file_is_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(2);
    let path = journal_with(dir.path(), &recs);
    let len = fs::metadata(&path).expect("meta").len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len - 2)
        .expect("truncate");
    // A newer file exists, so file 1 is not the newest and its tail is not a torn write.
    let j = Journal::open(dir.path(), config(0, 1), 2, Box::new(|_| {})).expect("open");
    write_all(&j, &records(1));
    j.shutdown().expect("shutdown");
    assert!(matches!(
        replay_all(dir.path()),
        Err(BookieError::Corrupt { .. })
    ));
}

#[test]
fn replay_kinds_and_fields_survive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = vec![
        JournalRecord::entry(u64::MAX, u64::MAX, i64::MIN, Bytes::from_static(b"")),
        JournalRecord::fence(5),
        JournalRecord::delete_ledger(6),
    ];
    journal_with(dir.path(), &recs);
    let (got, _) = replay_all(dir.path()).expect("replay");
    assert_eq!(got, recs);
    assert_eq!(got[1].kind, RecordKind::Fence);
    assert_eq!(got[2].kind, RecordKind::DeleteLedger);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Cutting the newest file anywhere inside its last record keeps every earlier record and
    /// drops only the cut one.
    #[test]
    fn truncating_the_last_record_anywhere_drops_only_it(n in 1u64..6, cut in any::<prop::sample::Index>()) {
        let dir = tempfile::tempdir().expect("tempdir");
        let recs = records(n);
        let path = journal_with(dir.path(), &recs);
        let len = fs::metadata(&path).expect("meta").len();
        let last = recs[recs.len() - 1].encoded_len() as u64;
        let keep = len - last + cut.index(usize::try_from(last).expect("small")) as u64;
        OpenOptions::new().write(true).open(&path).expect("open").set_len(keep).expect("truncate");
        let kept = fs::read(&path).expect("read")[usize::try_from(len - last).expect("small")..].to_vec();
        let (got, outcome) = replay_all(dir.path()).expect("replay");
        prop_assert_eq!(&got[..], &recs[..recs.len() - 1]);
        // A cut that leaves only zeros (the high bytes of the length) reads as padding.
        let torn = if kept.iter().all(|&b| b == 0) { 0 } else { kept.len() as u64 };
        prop_assert_eq!(outcome.torn_tail_bytes, torn);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Replay of a journal file holding arbitrary bytes (alone, or after good records) returns
    /// records or an error, never panics, and never hands over a record that was not written.
    #[test]
    fn replay_survives_arbitrary_bytes(
        garbage in proptest::collection::vec(any::<u8>(), 0..600),
        good in 0u64..4,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let recs = records(good);
        let path = journal_with(dir.path(), &recs);
        let mut raw = fs::read(&path).expect("read");
        raw.extend_from_slice(&garbage);
        fs::write(&path, &raw).expect("write");
        if let Ok((got, _)) = replay_all(dir.path()) {
            prop_assert!(got.len() >= recs.len());
            prop_assert_eq!(&got[..recs.len()], &recs[..]);
        }
    }
}

#[test]
fn replay_starts_at_the_checkpoint_mark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = records(5);
    journal_with(dir.path(), &recs);
    let skip: u64 = recs[..2].iter().map(|r| r.encoded_len() as u64).sum();
    journal::write_mark(dir.path(), (1, skip)).expect("mark");
    assert_eq!(
        journal::read_mark(dir.path()).expect("read mark"),
        Some((1, skip))
    );
    let (got, outcome) = replay_all(dir.path()).expect("replay");
    assert_eq!(got, recs[2..]);
    assert_eq!(outcome.mark, Some((1, skip)));
    assert_eq!(outcome.next_seq(), 2);

    // A mark in a later file skips the earlier files entirely, and new files go above it.
    journal::write_mark(dir.path(), (4, 0)).expect("mark");
    let (got, outcome) = replay_all(dir.path()).expect("replay");
    assert!(got.is_empty());
    assert_eq!(outcome.next_seq(), 5);

    // A mark past the end of its file means the file lost checkpointed bytes.
    let len = fs::metadata(journal::file_path(dir.path(), 1))
        .expect("meta")
        .len();
    journal::write_mark(dir.path(), (1, len + 1)).expect("mark");
    assert!(matches!(
        replay_all(dir.path()),
        Err(BookieError::Corrupt { .. })
    ));

    // A damaged mark is reported, not ignored.
    fs::write(
        dir.path().join("journal").join(journal::MARK_FILE),
        b"garbage",
    )
    .expect("write");
    assert!(matches!(
        journal::read_mark(dir.path()),
        Err(BookieError::Corrupt { .. })
    ));
}

#[test]
fn a_lone_record_is_written_at_once_when_flushing_on_an_empty_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A group wait of a minute: only flushing when the queue runs dry answers in time.
    let cfg = JournalConfig {
        flush_when_queue_empty: true,
        ..config(60_000, 1 << 20)
    };
    let j = Journal::open(dir.path(), cfg, 1, Box::new(|_| {})).expect("open");
    let started = std::time::Instant::now();
    write_all(&j, &records(1));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a lone record waited for the group wait"
    );
    assert_eq!(j.stats().batches, 1);
    j.shutdown().expect("shutdown");
}

#[test]
fn batches_and_encoded_entries_are_one_completion_each_and_replay_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Journal::open(dir.path(), JournalConfig::default(), 1, Box::new(|_| {}))
        .expect("open");
    let first = records(10);
    let entries: Vec<(u64, Bytes)> = (0..5).map(|e| (e, Bytes::from(format!("enc {e}")))).collect();
    let encoded = journal::EncodedEntries::new(4, 7, entries.clone());
    assert_eq!(encoded.entries().collect::<Vec<_>>(), entries);
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    j.submit_batch(first.clone(), Box::new(move |r| tx.send(r.is_ok()).expect("send")));
    j.submit_encoded(&encoded, Box::new(move |r| tx2.send(r.is_ok()).expect("send")));
    assert!(rx.recv_timeout(WAIT).expect("batch completion"));
    assert!(rx.recv_timeout(WAIT).expect("encoded completion"));
    assert_eq!(j.stats().records, 15);
    j.shutdown().expect("shutdown");
    let mut expected = first;
    expected.extend(entries.into_iter().map(|(e, d)| JournalRecord::entry(4, e, 7, d)));
    assert_eq!(replay_all(dir.path()).expect("replay").0, expected);
}

/// The `O_DIRECT` bit of the open file description `path` is open with in this process.
fn opened_direct(path: &Path) -> Option<bool> {
    let want = fs::canonicalize(path).ok()?;
    for fd in fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if fs::read_link(fd.path()).ok().as_deref() == Some(want.as_path()) {
            let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.file_name().to_string_lossy())).ok()?;
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?.trim().to_string();
            let flags = i64::from_str_radix(&flags, 8).ok()?;
            return Some(flags & i64::from(libc::O_DIRECT) != 0);
        }
    }
    None
}

fn direct_io_allowed(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join("probe");
    let ok = OpenOptions::new().create(true).write(true).custom_flags(libc::O_DIRECT).open(&probe).is_ok();
    let _ = fs::remove_file(probe);
    ok
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    /// Commits of any size, one after another, with direct I/O or buffered, preallocating
    /// or not: after a crash replay returns every record in order, and after a clean
    /// shutdown the file holds exactly the records. A direct commit writes the partly
    /// filled block of the previous one again, so sizes around the block size matter.
    #[test]
    fn commits_of_any_size_replay_in_order(
        sizes in proptest::collection::vec(0usize..9000, 1..24),
        direct in any::<bool>(),
        pre_alloc_mb in 0u64..2,
        crash in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = JournalConfig { direct_io: direct, pre_alloc_size_mb: pre_alloc_mb, ..config(0, 1) };
        let j = Journal::open(dir.path(), cfg, 1, Box::new(|_| {})).expect("open");
        let path = journal::file_path(dir.path(), 1);
        if direct && direct_io_allowed(dir.path()) {
            prop_assert_eq!(opened_direct(&path), Some(true));
        } else if !direct {
            prop_assert_eq!(opened_direct(&path), Some(false));
        }
        let recs: Vec<JournalRecord> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| JournalRecord::entry(4, i as u64, i as i64 - 1, Bytes::from(vec![(i % 251) as u8 + 1; *n])))
            .collect();
        for r in &recs {
            write_all(&j, std::slice::from_ref(r));
        }
        if crash {
            j.halt();
        } else {
            j.shutdown().expect("shutdown");
            let written: usize = recs.iter().map(|r| r.encoded_len()).sum();
            prop_assert_eq!(fs::metadata(&path).expect("meta").len(), written as u64);
        }
        let (got, outcome) = replay_all(dir.path()).expect("replay");
        prop_assert_eq!(got, recs);
        prop_assert_eq!(outcome.torn_tail_bytes, 0);
    }
}
