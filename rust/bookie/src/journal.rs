//! The journal: a write-ahead log with group commit.
//!
//! # Theory of operation
//!
//! Every mutation the bookie acknowledges (an entry add, a fence, a ledger delete) is first
//! made durable here. One dedicated thread owns the current journal file. Callers queue a
//! [`JournalRecord`] (or a batch of them, [`Journal::submit_batch`]) with a completion
//! callback and return at once. The thread takes everything queued — up to
//! `buffered_writes_threshold` bytes — encodes all of it into one buffer, issues ONE write
//! and ONE `fdatasync` (when `sync_data`), and only then runs every completion of the group,
//! in queue order. Many adds therefore share one disk flush; this is what makes small
//! synchronous adds cheap.
//!
//! When the queue runs dry, `flush_when_queue_empty` (on by default) writes the group at
//! once: the write and fdatasync in progress are the batching window, since everything that
//! arrives meanwhile queues up and forms the next group. A lone add on an idle disk so pays
//! one fdatasync, not a fixed wait; a journal that falls behind writes bigger groups, up to
//! the threshold, and so catches up. Without it, the thread waits for more records until
//! the oldest has waited `max_group_wait`.
//!
//! # Preallocation
//!
//! With `pre_alloc_size_mb` (journalPreAllocSizeMB) set, the thread keeps up to that much
//! of zeros written ahead of the write position in the current file, and writes records
//! over those zeros. A group commit's fdatasync then only flushes data into blocks the file
//! system has already allocated and written: it needs no metadata (size, extent) commit, so
//! it does not wait behind other files' pending data the way an append's fdatasync does on
//! a journaling file system.
//!
//! The zeros are written while the journal is idle, never by a group commit: when the
//! queue is empty after a commit, the thread writes one [`PREALLOC_STEP`] of zeros, and
//! goes on step by step while nothing is queued, until the zeros reach
//! `pre_alloc_size_mb` past the records (rounded up to a [`PREALLOC_CHUNK`] boundary).
//! Writing zeros costs as much disk time as writing the records over them; a commit that
//! wrote a chunk of them first (as this journal once did) held its adds behind that chunk,
//! about a millisecond on a disk that writes a GB/s, and at half of peak that was every
//! fourth commit. An add that arrives while the thread writes zeros waits for at most one
//! step, tens of microseconds (whole 1 MiB chunks, as it once wrote, held such an add for
//! most of a millisecond once per megabyte of records). The new size becomes durable with
//! the next commit's fdatasync; syncing it on its own, while idle, was
//! measured to be worse: an add that arrived meanwhile waited for that metadata commit,
//! which on a journaling file system can wait behind other files' data. A commit that
//! finds no zeros ahead (a new file, or a burst that used them up) appends: its
//! fdatasync then carries the size change, which costs less than writing the zeros
//! first would have.
//!
//! A file is cut back to its records when it is rotated or the journal shuts down; after
//! a crash the newest file ends in zeros, which replay reads as the end of the records (an
//! all-zero remainder is padding, never a record).
//!
//! # Direct I/O
//!
//! With `direct_io` (on by default) each file is opened `O_DIRECT` where the file system
//! allows it, and a group commit goes from the thread's own aligned buffer to the disk
//! with no copy into the page cache: the journal is only ever read back at replay, and
//! that copy cost as much CPU as everything else the journal thread does. Direct writes
//! cover whole [`DIRECT_ALIGN`] blocks, so a commit starts at the block holding the end of
//! the previous one and writes that block's records again, unchanged, followed by the new
//! records and zeros up to the next block boundary. A torn write of that block can only
//! mix two copies of the same durable bytes, and the zeros after the records read as the
//! end at replay exactly like preallocated ones. Preallocation writes its zeros the same
//! way. Where `O_DIRECT` is refused (tmpfs, for one), the file is written buffered.
//!
//! Files are `journal/<seq>.log`. When the current file reaches `max_size_mb` the thread
//! syncs it, starts `<seq+1>.log` and reports the new sequence number. The owner checkpoints:
//! it takes [`Journal::position`], flushes the ledger storage, records the position with
//! [`write_mark`] and deletes the files before it with [`delete_before`]. This is sound
//! because every record is applied to storage before it is queued here, so whatever lies
//! before the position is in the flushed storage.
//!
//! # Record format
//!
//! ```text
//! u32 BE len | u32 BE crc32c(body) | body = u8 kind | u64 ledger | u64 entry | i64 lac | data
//! ```
//!
//! `len` is the body length. Kinds: 1 entry, 2 fence, 3 delete-ledger.
//!
//! # Replay
//!
//! [`replay`] reads the files in sequence order from the last checkpoint mark (`LASTMARK`, if
//! any) and hands each good record to the caller.
//! A record that is short or fails its checksum at the very end of the newest file is a write
//! torn by a crash: it was never acknowledged, so it is dropped with a warning. Any other bad
//! record — in an older file, or followed by a record that checks out — is corruption and
//! replay fails with [`BookieError::Corrupt`] naming the file and offset; nothing is skipped.
//! (The search for a following good record tries every byte offset after the bad one, so a
//! damaged length field cannot hide later records.)
//!
//! ```
//! use std::sync::mpsc;
//! use bytes::Bytes;
//! use magnetar_bookie::journal::{self, Journal, JournalRecord};
//! use magnetar_bookie::JournalConfig;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let journal = Journal::open(dir.path(), JournalConfig::default(), 1, Box::new(|_| {})).unwrap();
//! let (tx, rx) = mpsc::channel();
//! journal.submit(JournalRecord::entry(5, 0, -1, Bytes::from_static(b"x")), Box::new(move |r| {
//!     tx.send(r.is_ok()).unwrap();
//! }));
//! assert!(rx.recv().unwrap());
//! journal.shutdown().unwrap();
//!
//! let mut seen = Vec::new();
//! journal::replay(dir.path(), |r| { seen.push((r.ledger, r.entry)); Ok(()) }).unwrap();
//! assert_eq!(seen, vec![(5, 0)]);
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, IoSlice, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use crate::mailbox::{mailbox, Receiver, RecvTimeoutError, SendError, Sender, TryRecvError};
use parking_lot::Mutex;

use crate::error::BookieError;
use crate::proto::MAX_ENTRY_SIZE;
use crate::server::JournalConfig;

/// Record header: length and checksum.
pub const RECORD_HEADER_LEN: usize = 8;
/// The fixed part of a record body: kind, ledger, entry, lac.
pub const RECORD_FIXED_LEN: usize = 1 + 8 + 8 + 8;
/// The largest record body replay accepts.
pub const MAX_RECORD_BODY: usize = RECORD_FIXED_LEN + MAX_ENTRY_SIZE;

/// The subdirectory of the data dir that holds journal files.
pub const JOURNAL_DIR: &str = "journal";
/// Preallocation keeps the zeros ahead of the records ending at a multiple of this (see the
/// module's Preallocation section).
pub const PREALLOC_CHUNK: u64 = 1 << 20;
/// The most zeros one idle step writes: the thread looks at its queue between steps, so
/// an add that arrives while it preallocates waits for at most this much.
pub const PREALLOC_STEP: u64 = 64 << 10;
/// Offsets, lengths and buffers of direct journal writes are multiples of this.
pub const DIRECT_ALIGN: usize = 4096;

/// What a journal record records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// An entry add: ledger, entry, lac, data.
    Entry = 1,
    /// The ledger was fenced.
    Fence = 2,
    /// The ledger was deleted.
    DeleteLedger = 3,
}

impl RecordKind {
    pub(crate) fn from_u8(v: u8) -> Option<RecordKind> {
        match v {
            1 => Some(RecordKind::Entry),
            2 => Some(RecordKind::Fence),
            3 => Some(RecordKind::DeleteLedger),
            _ => None,
        }
    }
}

/// One journaled mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRecord {
    pub kind: RecordKind,
    pub ledger: u64,
    pub entry: u64,
    pub lac: i64,
    pub data: Bytes,
}

impl JournalRecord {
    /// An entry add.
    pub fn entry(ledger: u64, entry: u64, lac: i64, data: Bytes) -> JournalRecord {
        JournalRecord {
            kind: RecordKind::Entry,
            ledger,
            entry,
            lac,
            data,
        }
    }

    /// A fence of `ledger`.
    pub fn fence(ledger: u64) -> JournalRecord {
        JournalRecord {
            kind: RecordKind::Fence,
            ledger,
            entry: 0,
            lac: -1,
            data: Bytes::new(),
        }
    }

    /// A delete of `ledger`.
    pub fn delete_ledger(ledger: u64) -> JournalRecord {
        JournalRecord {
            kind: RecordKind::DeleteLedger,
            ledger,
            entry: 0,
            lac: -1,
            data: Bytes::new(),
        }
    }

    /// Bytes this record takes in a journal file.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_LEN + RECORD_FIXED_LEN + self.data.len()
    }

    /// Append the encoded record to `dst`.
    pub fn encode(&self, dst: &mut Vec<u8>) {
        dst.reserve(self.encoded_len());
        self.put_head(dst);
        dst.put_slice(&self.data);
    }

    /// Append what precedes the data in the encoded record: its length, the checksum of
    /// its body, and the fixed fields.
    fn put_head(&self, dst: &mut impl BufMut) {
        let mut fixed = [0u8; RECORD_FIXED_LEN];
        let mut at = &mut fixed[..];
        at.put_u8(self.kind as u8);
        at.put_u64(self.ledger);
        at.put_u64(self.entry);
        at.put_i64(self.lac);
        let body_len = RECORD_FIXED_LEN + self.data.len();
        dst.put_u32(u32::try_from(body_len).unwrap_or(u32::MAX));
        dst.put_u32(crc32c::crc32c_append(crc32c::crc32c(&fixed), &self.data));
        dst.put_slice(&fixed);
    }
}

/// Entry records of one ledger in the record format, encoded once, so that the ledger
/// storage and the journal both write the same bytes without encoding them again. The
/// records are kept as pieces: heads (length, checksum, fixed fields) and small data are
/// copied together into one buffer, and data of [`COPY_DATA_BELOW`] bytes or more stays
/// the piece it was given, so a large entry is copied only where each writer puts it into
/// its own buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedEntries {
    /// The ledger every record belongs to.
    pub ledger: u64,
    /// The lac every record carries.
    pub lac: i64,
    /// The records back to back, in pieces.
    pub pieces: Vec<Bytes>,
    /// Per record: its entry id, where it starts in the records back to back and how long
    /// it is.
    pub records: Vec<(u64, usize, usize)>,
}

/// Data at least this long is kept as its own piece of [`EncodedEntries`] rather than
/// copied: below it, a copy costs less than handling one more piece.
pub const COPY_DATA_BELOW: usize = 4096;

const RECORD_HEAD_LEN: usize = RECORD_HEADER_LEN + RECORD_FIXED_LEN;

impl EncodedEntries {
    /// Encode each `(entry id, data)` of `entries` as an entry record of `ledger` with `lac`.
    pub fn new(ledger: u64, lac: i64, entries: Vec<(u64, Bytes)>) -> EncodedEntries {
        let copied: usize = entries
            .iter()
            .map(|(_, d)| RECORD_HEAD_LEN + if d.len() < COPY_DATA_BELOW { d.len() } else { 0 })
            .sum();
        let mut buf = BytesMut::with_capacity(copied);
        let mut pieces = Vec::new();
        let mut records = Vec::with_capacity(entries.len());
        let mut len = 0;
        for (entry, data) in entries {
            let record = JournalRecord::entry(ledger, entry, lac, data);
            record.put_head(&mut buf);
            if record.data.len() < COPY_DATA_BELOW {
                buf.put_slice(&record.data);
            } else {
                pieces.push(buf.split().freeze());
                pieces.push(record.data.clone());
            }
            let n = record.encoded_len();
            records.push((entry, len, n));
            len += n;
        }
        if !buf.is_empty() {
            pieces.push(buf.freeze());
        }
        EncodedEntries { ledger, lac, pieces, records }
    }

    /// Bytes of all the records.
    pub fn len(&self) -> usize {
        self.records.last().map_or(0, |&(_, start, len)| start + len)
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The data of each record, as `(entry id, data)` (views of the pieces: a record's data
    /// lies within one piece).
    pub fn entries(&self) -> impl Iterator<Item = (u64, Bytes)> + '_ {
        let mut pieces = self.pieces.iter();
        // the piece at hand and where it starts in the records back to back
        let (mut piece, mut piece_start) = (Bytes::new(), 0);
        self.records.iter().map(move |&(entry, start, len)| {
            let (from, to) = (start + RECORD_HEAD_LEN, start + len);
            while from < to && piece_start + piece.len() <= from {
                piece_start += piece.len();
                match pieces.next() {
                    Some(p) => piece = p.clone(),
                    None => return (entry, Bytes::new()),
                }
            }
            (entry, if from < to { piece.slice(from - piece_start..to - piece_start) } else { Bytes::new() })
        })
    }
}

/// Why the bytes at some offset are not a good record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// The bytes end before the record does.
    Short,
    /// The record is complete but wrong: bad length, checksum or kind.
    Invalid(String),
}

/// Decode the record at the start of `buf`: the record and how many bytes it took. Lengths are
/// bound-checked before anything is allocated, and the checksum is verified.
pub fn parse_record(buf: &[u8]) -> Result<(JournalRecord, usize), RecordError> {
    if buf.len() < RECORD_HEADER_LEN {
        return Err(RecordError::Short);
    }
    let mut h = &buf[..RECORD_HEADER_LEN];
    let len32 = h.get_u32();
    let crc = h.get_u32();
    let len = match usize::try_from(len32) {
        Ok(l) if (RECORD_FIXED_LEN..=MAX_RECORD_BODY).contains(&l) => l,
        _ => {
            return Err(RecordError::Invalid(format!(
                "record length {len32} out of range"
            )))
        }
    };
    let Some(body) = buf.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
        return Err(RecordError::Short);
    };
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(RecordError::Invalid(format!(
            "checksum mismatch (stored {crc:#010x}, computed {actual:#010x})"
        )));
    }
    let mut b = body;
    let kind_byte = b.get_u8();
    let Some(kind) = RecordKind::from_u8(kind_byte) else {
        return Err(RecordError::Invalid(format!(
            "unknown record kind {kind_byte}"
        )));
    };
    let ledger = b.get_u64();
    let entry = b.get_u64();
    let lac = b.get_i64();
    let data = Bytes::copy_from_slice(b);
    Ok((
        JournalRecord {
            kind,
            ledger,
            entry,
            lac,
            data,
        },
        RECORD_HEADER_LEN + len,
    ))
}

/// Whether any byte offset after `from` in `buf` starts a record that checks out.
pub(crate) fn good_record_after(buf: &[u8], from: usize) -> Option<usize> {
    let last = buf
        .len()
        .checked_sub(RECORD_HEADER_LEN + RECORD_FIXED_LEN)?;
    (from + 1..=last).find(|&off| parse_record(&buf[off..]).is_ok())
}

/// What [`replay`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayOutcome {
    /// Sequence numbers of the journal files present, ascending.
    pub files: Vec<u64>,
    /// The checkpoint mark replay started from, if any.
    pub mark: Option<(u64, u64)>,
    /// Records handed to the caller.
    pub records: u64,
    /// Bytes of a torn record dropped from the end of the newest file.
    pub torn_tail_bytes: u64,
}

impl ReplayOutcome {
    /// The sequence number a new journal file should take: above every file and the mark.
    pub fn next_seq(&self) -> u64 {
        let last_file = self.files.last().copied().unwrap_or(0);
        let mark = self.mark.map_or(0, |(seq, _)| seq);
        last_file.max(mark) + 1
    }
}

/// The path of journal file `seq` under `data_dir`.
pub fn file_path(data_dir: &Path, seq: u64) -> PathBuf {
    data_dir.join(JOURNAL_DIR).join(format!("{seq}.log"))
}

/// The sequence numbers of the journal files under `data_dir`, ascending.
pub fn list_files(data_dir: &Path) -> Result<Vec<u64>, BookieError> {
    let dir = data_dir.join(JOURNAL_DIR);
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(BookieError::io("list journal dir", &dir, e)),
    };
    let mut seqs = Vec::new();
    for item in rd {
        let item = item.map_err(|e| BookieError::io("list journal dir", &dir, e))?;
        let name = item.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(seq) = name
            .strip_suffix(".log")
            .and_then(|s| s.parse::<u64>().ok())
        {
            seqs.push(seq);
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// Reads the records of one file front to back without holding the file in memory: only one
/// record (at most [`MAX_RECORD_BODY`] plus its header) is buffered at a time.
pub(crate) struct RecordScanner {
    reader: BufReader<File>,
    path: PathBuf,
    file_len: u64,
    off: u64,
    record: Vec<u8>,
}

/// One step of a [`RecordScanner`].
pub(crate) enum Scanned {
    /// A good record at `off`, taking `used` bytes.
    Record {
        record: JournalRecord,
        off: u64,
        used: usize,
    },
    /// A bad record at `off`; scanning stops here.
    Bad { off: u64, error: RecordError },
    /// The end of the file.
    End,
}

impl RecordScanner {
    pub(crate) fn open(file: File, path: &Path) -> Result<RecordScanner, BookieError> {
        let file_len = file
            .metadata()
            .map_err(|e| BookieError::io("stat", path, e))?
            .len();
        Ok(RecordScanner {
            reader: BufReader::with_capacity(1024 * 1024, file),
            path: path.to_path_buf(),
            file_len,
            off: 0,
            record: Vec::new(),
        })
    }

    /// Continue from byte `off`, which must be a record boundary inside the file.
    pub(crate) fn skip_to(&mut self, off: u64) -> Result<(), BookieError> {
        if off > self.file_len {
            return Err(BookieError::corrupt(
                &self.path,
                self.file_len,
                format!("file ends before the checkpoint mark at offset {off}"),
            ));
        }
        self.reader
            .seek(SeekFrom::Start(off))
            .map_err(|e| BookieError::io("seek", &self.path, e))?;
        self.off = off;
        Ok(())
    }

    pub(crate) fn next_record(&mut self) -> Result<Scanned, BookieError> {
        let off = self.off;
        let remaining = self.file_len - off;
        if remaining == 0 {
            return Ok(Scanned::End);
        }
        let bad = |error| Ok(Scanned::Bad { off, error });
        if remaining < RECORD_HEADER_LEN as u64 {
            return bad(RecordError::Short);
        }
        self.record.clear();
        self.record.resize(RECORD_HEADER_LEN, 0);
        self.reader
            .read_exact(&mut self.record)
            .map_err(|e| BookieError::io("read", &self.path, e))?;
        let mut h = &self.record[..4];
        let len32 = h.get_u32();
        let len = match usize::try_from(len32) {
            Ok(l) if (RECORD_FIXED_LEN..=MAX_RECORD_BODY).contains(&l) => l,
            _ => {
                return bad(RecordError::Invalid(format!(
                    "record length {len32} out of range"
                )))
            }
        };
        if remaining < (RECORD_HEADER_LEN + len) as u64 {
            return bad(RecordError::Short);
        }
        self.record.resize(RECORD_HEADER_LEN + len, 0);
        self.reader
            .read_exact(&mut self.record[RECORD_HEADER_LEN..])
            .map_err(|e| BookieError::io("read", &self.path, e))?;
        match parse_record(&self.record) {
            Ok((record, used)) => {
                self.off += used as u64;
                Ok(Scanned::Record { record, off, used })
            }
            Err(error) => bad(error),
        }
    }

    /// The bytes from `off` to the end of the file.
    pub(crate) fn rest_from(&mut self, off: u64) -> Result<Vec<u8>, BookieError> {
        let file = self.reader.get_mut();
        let mut rest = Vec::new();
        file.seek(SeekFrom::Start(off))
            .and_then(|_| file.read_to_end(&mut rest))
            .map_err(|e| BookieError::io("read", &self.path, e))?;
        Ok(rest)
    }
}

fn describe(error: &RecordError) -> String {
    match error {
        RecordError::Short => "record cut short".to_string(),
        RecordError::Invalid(r) => r.clone(),
    }
}

/// Read every journal file under `data_dir` in order and pass each good record to `apply`.
/// See the module docs for how torn tails and corruption are told apart.
pub fn replay(
    data_dir: &Path,
    mut apply: impl FnMut(&JournalRecord) -> Result<(), BookieError>,
) -> Result<ReplayOutcome, BookieError> {
    let mark = read_mark(data_dir)?;
    let mut outcome = ReplayOutcome {
        files: list_files(data_dir)?,
        mark,
        ..ReplayOutcome::default()
    };
    let (mark_seq, mark_off) = mark.unwrap_or((0, 0));
    let count = outcome.files.len();
    for (i, &seq) in outcome.files.iter().enumerate() {
        if seq < mark_seq {
            // Checkpointed already; the file just has not been deleted yet.
            continue;
        }
        let newest = i + 1 == count;
        let path = file_path(data_dir, seq);
        let file = File::open(&path).map_err(|e| BookieError::io("open journal", &path, e))?;
        let mut scanner = RecordScanner::open(file, &path)?;
        if seq == mark_seq && mark_off > 0 {
            scanner.skip_to(mark_off)?;
        }
        loop {
            match scanner.next_record()? {
                Scanned::Record { record, .. } => {
                    apply(&record)?;
                    outcome.records += 1;
                }
                Scanned::End => break,
                Scanned::Bad { off, error } => {
                    let reason = describe(&error);
                    let rest = scanner.rest_from(off)?;
                    if rest.iter().all(|&b| b == 0) {
                        // Preallocated space never written: the records end here.
                        break;
                    }
                    if !newest {
                        return Err(BookieError::corrupt(&path, off, reason));
                    }
                    if let Some(good) = good_record_after(&rest, 0) {
                        return Err(BookieError::corrupt(
                            &path,
                            off,
                            format!(
                                "{reason}; a valid record follows at offset {}",
                                off + good as u64
                            ),
                        ));
                    }
                    log::warn!(
                        "journal {}: dropping a torn record of {} bytes at offset {off} ({reason})",
                        path.display(),
                        rest.len()
                    );
                    outcome.torn_tail_bytes = rest.len() as u64;
                    break;
                }
            }
        }
    }
    Ok(outcome)
}

/// The file holding the last checkpoint's journal position.
pub const MARK_FILE: &str = "LASTMARK";
const MARK_MAGIC: &[u8; 8] = b"MGBKMRK1";

/// The journal position of the last checkpoint, if one was recorded: replay starts there.
pub fn read_mark(data_dir: &Path) -> Result<Option<(u64, u64)>, BookieError> {
    let path = data_dir.join(JOURNAL_DIR).join(MARK_FILE);
    let raw = match fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BookieError::io("read", &path, e)),
    };
    if raw.len() != 28 || &raw[..8] != MARK_MAGIC {
        return Err(BookieError::corrupt(&path, 0, "not a journal mark"));
    }
    let mut b = &raw[8..];
    let seq = b.get_u64();
    let off = b.get_u64();
    let crc = b.get_u32();
    if crc32c::crc32c(&raw[..24]) != crc {
        return Err(BookieError::corrupt(
            &path,
            0,
            "journal mark checksum mismatch",
        ));
    }
    Ok(Some((seq, off)))
}

/// Record `(seq, offset)` as the last checkpoint: storage holds every record before it.
/// Written atomically (temp file, fsync, rename, fsync the directory).
pub fn write_mark(data_dir: &Path, (seq, off): (u64, u64)) -> Result<(), BookieError> {
    let dir = data_dir.join(JOURNAL_DIR);
    fs::create_dir_all(&dir).map_err(|e| BookieError::io("create journal dir", &dir, e))?;
    let mut raw = Vec::with_capacity(28);
    raw.extend_from_slice(MARK_MAGIC);
    raw.put_u64(seq);
    raw.put_u64(off);
    let crc = crc32c::crc32c(&raw);
    raw.put_u32(crc);
    let tmp = dir.join(format!("{MARK_FILE}.tmp"));
    File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(&raw)?;
            f.sync_all()
        })
        .map_err(|e| BookieError::io("write", &tmp, e))?;
    let path = dir.join(MARK_FILE);
    fs::rename(&tmp, &path).map_err(|e| BookieError::io("rename mark to", &path, e))?;
    sync_dir(&dir)
}

/// Delete every journal file under `data_dir` whose sequence number is below `seq`.
/// Call only once ledger storage has been flushed past them.
pub fn delete_before(data_dir: &Path, seq: u64) -> Result<usize, BookieError> {
    let mut deleted = 0;
    for s in list_files(data_dir)?.into_iter().filter(|&s| s < seq) {
        let path = file_path(data_dir, s);
        crate::reaper::remove(&path).map_err(|e| BookieError::io("delete journal", &path, e))?;
        deleted += 1;
    }
    if deleted > 0 {
        sync_dir(&data_dir.join(JOURNAL_DIR))?;
    }
    Ok(deleted)
}

/// Fsync a directory so that file creations and deletions in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), BookieError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| BookieError::io("sync dir", dir, e))
}

/// Called once the journal's records are durable (or with the reason they cannot be).
pub type Completion = Box<dyn FnOnce(Result<(), BookieError>) + Send + 'static>;

/// Called on the journal thread after rotating, with the new file's sequence number: every
/// file below it is complete and may be deleted once storage is checkpointed.
pub type RotateHook = Box<dyn FnMut(u64) + Send + 'static>;

enum Msg {
    Append {
        record: JournalRecord,
        done: Completion,
        queued: Instant,
    },
    AppendBatch {
        records: Vec<JournalRecord>,
        done: Completion,
        queued: Instant,
    },
    AppendEncoded {
        pieces: Vec<Bytes>,
        records: u64,
        done: Completion,
        queued: Instant,
    },
    Shutdown {
        ack: crossbeam_channel::Sender<Result<(), String>>,
    },
    Halt,
}

/// Counters of what the journal thread has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Group commits: each is one write (and one fdatasync when `sync_data`).
    pub batches: u64,
    /// Records written.
    pub records: u64,
    /// Bytes written.
    pub bytes: u64,
    /// fdatasync calls made, their total and their longest duration in microseconds.
    pub syncs: u64,
    pub sync_micros_total: u64,
    pub sync_micros_max: u64,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    syncs: AtomicU64,
    sync_micros_total: AtomicU64,
    sync_micros_max: AtomicU64,
}

/// The running journal: a handle to its thread.
pub struct Journal {
    tx: Sender<Msg>,
    thread: Mutex<Option<JoinHandle<()>>>,
    position: Arc<Mutex<(u64, u64)>>,
    counters: Arc<Counters>,
}

impl Journal {
    /// Start a journal writing `journal/<first_seq>.log` under `data_dir` (created if needed).
    /// `on_rotate` runs on the journal thread after each rotation.
    pub fn open(
        data_dir: &Path,
        config: JournalConfig,
        first_seq: u64,
        on_rotate: RotateHook,
    ) -> Result<Journal, BookieError> {
        let dir = data_dir.join(JOURNAL_DIR);
        let writer = Writer::new(data_dir, config, first_seq, on_rotate)?;
        let (position, counters) = (writer.position.clone(), writer.counters.clone());
        let (tx, rx) = mailbox();
        let thread = std::thread::Builder::new()
            .name("bookie-journal".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| BookieError::io("spawn journal thread for", &dir, e))?;
        Ok(Journal {
            tx,
            thread: Mutex::new(Some(thread)),
            position,
            counters,
        })
    }

    /// Queue `record`; `done` runs on the journal thread once it is durable (or failed).
    pub fn submit(&self, record: JournalRecord, done: Completion) {
        let msg = Msg::Append {
            record,
            done,
            queued: Instant::now(),
        };
        if let Err(SendError(Msg::Append { done, .. })) = self.tx.send(msg) {
            done(Err(BookieError::ShuttingDown));
        }
    }

    /// Queue `records` as part of one group commit; `done` runs once, on the journal thread,
    /// when all of them are durable (or with the failure). The records are written in order
    /// and contiguously.
    pub fn submit_batch(&self, records: Vec<JournalRecord>, done: Completion) {
        let msg = Msg::AppendBatch {
            records,
            done,
            queued: Instant::now(),
        };
        if let Err(SendError(Msg::AppendBatch { done, .. })) = self.tx.send(msg) {
            done(Err(BookieError::ShuttingDown));
        }
    }

    /// Queue records already encoded (see [`EncodedEntries`]) as part of one group commit;
    /// `done` runs once, on the journal thread, when they are durable (or with the failure).
    pub fn submit_encoded(&self, entries: &EncodedEntries, done: Completion) {
        let msg = Msg::AppendEncoded {
            pieces: entries.pieces.clone(),
            records: entries.records.len() as u64,
            done,
            queued: Instant::now(),
        };
        if let Err(SendError(Msg::AppendEncoded { done, .. })) = self.tx.send(msg) {
            done(Err(BookieError::ShuttingDown));
        }
    }

    /// What the journal thread has written so far.
    pub fn stats(&self) -> JournalStats {
        JournalStats {
            batches: self.counters.batches.load(Ordering::Relaxed),
            records: self.counters.records.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            syncs: self.counters.syncs.load(Ordering::Relaxed),
            sync_micros_total: self.counters.sync_micros_total.load(Ordering::Relaxed),
            sync_micros_max: self.counters.sync_micros_max.load(Ordering::Relaxed),
        }
    }

    /// The sequence number of the file being written now.
    pub fn current_seq(&self) -> u64 {
        self.position.lock().0
    }

    /// Where the journal has written up to: (file sequence number, byte offset). Every record
    /// before this point was queued, and so applied to storage, before this call returns.
    pub fn position(&self) -> (u64, u64) {
        *self.position.lock()
    }

    /// Write and sync everything queued, close the file and stop the thread.
    pub fn shutdown(&self) -> Result<(), BookieError> {
        let (ack_tx, ack_rx) = crossbeam_channel::bounded(1);
        let result = if self.tx.send(Msg::Shutdown { ack: ack_tx }).is_ok() {
            match ack_rx.recv() {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(BookieError::JournalFailed(e)),
                Err(_) => Err(BookieError::JournalFailed("journal thread exited".into())),
            }
        } else {
            Ok(())
        };
        self.join();
        result
    }

    /// Stop at once, as a crash would: records still queued are failed, not written.
    pub fn halt(&self) {
        let _ = self.tx.send(Msg::Halt);
        self.join();
    }

    fn join(&self) {
        if let Some(t) = self.thread.lock().take() {
            if t.join().is_err() {
                log::error!("journal thread panicked");
            }
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Create journal file `seq`; the flag says whether it was opened for direct I/O (asked
/// for with `direct`, and granted by the file system).
fn create_file(data_dir: &Path, seq: u64, direct: bool) -> Result<(File, bool), BookieError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = file_path(data_dir, seq);
    // Not in append mode: writes go at the file position, which may lie before the
    // preallocated end. The file is new, so that position is its start.
    let open = |flags: i32| {
        OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(flags)
            .open(&path)
    };
    let opened = if direct {
        match open(libc::O_DIRECT) {
            Ok(f) => Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0).map(|f| (f, false)),
            Err(e) => Err(e),
        }
    } else {
        open(0).map(|f| (f, false))
    };
    let opened = opened.map_err(|e| BookieError::io("create journal", &path, e))?;
    sync_dir(&data_dir.join(JOURNAL_DIR))?;
    Ok(opened)
}

/// Bytes that start at a [`DIRECT_ALIGN`] boundary in memory, with room to pad them to a
/// whole number of blocks: what a direct write needs. A file written directly goes on from
/// the start of the block holding its end, so the writer keeps that block's bytes
/// ([`last_block`](Self::last_block)) in front of the next write's.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes.
    pub(crate) fn zeros(len: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::default();
        buf.reserve(len);
        buf.len = len;
        buf
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of memory held.
    pub(crate) fn capacity(&self) -> usize {
        self.raw.len()
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// Keep the first `len` bytes (all of them, when there are fewer).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Make room for `extra` more bytes and the padding after them, moving the data to a
    /// larger buffer when needed. New room holds zeros.
    pub(crate) fn reserve(&mut self, extra: usize) {
        let padded = (self.len + extra).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        if self.start + padded <= self.raw.len() {
            return;
        }
        let cap = padded.max(2 * self.len);
        let mut raw = vec![0u8; cap + DIRECT_ALIGN];
        let start = (DIRECT_ALIGN - raw.as_ptr() as usize % DIRECT_ALIGN) % DIRECT_ALIGN;
        raw[start..start + self.len].copy_from_slice(self.data());
        self.raw = raw;
        self.start = start;
    }

    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        let at = self.start + self.len;
        self.raw[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Zero the bytes from the end of the data to the next block boundary.
    pub(crate) fn pad(&mut self) {
        self.reserve(0);
        let end = self.start + self.len;
        let blocks = self.blocks().len();
        self.raw[end..self.start + blocks].fill(0);
    }

    /// The data and the bytes after it up to the next block boundary (zeros after
    /// [`pad`](Self::pad)): what a direct write takes.
    pub(crate) fn blocks(&self) -> &[u8] {
        let blocks = self.len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        &self.raw[self.start..self.start + blocks]
    }

    /// The bytes after the data's last block boundary.
    pub(crate) fn last_block(&self) -> &[u8] {
        &self.data()[self.len - self.len % DIRECT_ALIGN..]
    }

    /// Keep only [`last_block`](Self::last_block), at the front.
    pub(crate) fn keep_last_block(&mut self) {
        let from = self.start + self.len - self.len % DIRECT_ALIGN;
        self.raw.copy_within(from..self.start + self.len, self.start);
        self.len %= DIRECT_ALIGN;
    }
}

struct Writer {
    counters: Arc<Counters>,
    data_dir: PathBuf,
    config: JournalConfig,
    file: File,
    /// Set while the current file is written with direct I/O: the bytes of its last, partly
    /// written block, which the next commit writes again.
    direct: Option<AlignedBuf>,
    /// Preallocation's chunk of zeros, made once (never written to after).
    zeros: AlignedBuf,
    seq: u64,
    file_len: u64,
    /// The file's length on disk: `file_len` plus the zeros preallocated after it.
    allocated: u64,
    /// Set when writing zeros failed: no more preallocation in the current file.
    prealloc_stopped: bool,
    failed: Option<String>,
    position: Arc<Mutex<(u64, u64)>>,
    on_rotate: RotateHook,
}

/// The bytes of one group commit, in order: records encoded here, and batches that arrive
/// encoded, which are written from their own buffers (one vectored write, no copy).
#[derive(Default)]
struct Group {
    parts: Vec<Bytes>,
    /// Records encoded here since the last encoded batch.
    tail: Vec<u8>,
    len: usize,
}

impl Group {
    fn record(&mut self, record: &JournalRecord) {
        let before = self.tail.len();
        record.encode(&mut self.tail);
        self.len += self.tail.len() - before;
    }

    fn encoded(&mut self, encoded: Bytes) {
        if !self.tail.is_empty() {
            self.parts.push(Bytes::from(std::mem::take(&mut self.tail)));
        }
        self.len += encoded.len();
        self.parts.push(encoded);
    }

    fn finish(&mut self) -> Vec<Bytes> {
        if !self.tail.is_empty() {
            self.parts.push(Bytes::from(std::mem::take(&mut self.tail)));
        }
        std::mem::take(&mut self.parts)
    }
}

/// Write every part, in order, with as few vectored writes as the system allows.
fn write_all_parts(file: &mut File, parts: &[Bytes]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

enum Stop {
    Shutdown(crossbeam_channel::Sender<Result<(), String>>),
    Halt,
}

impl Writer {
    /// A writer of `journal/<first_seq>.log` under `data_dir` (the directory created if
    /// needed), the file just created.
    fn new(
        data_dir: &Path,
        config: JournalConfig,
        first_seq: u64,
        on_rotate: RotateHook,
    ) -> Result<Writer, BookieError> {
        let dir = data_dir.join(JOURNAL_DIR);
        fs::create_dir_all(&dir).map_err(|e| BookieError::io("create journal dir", &dir, e))?;
        let (file, direct) = create_file(data_dir, first_seq, config.direct_io)?;
        Ok(Writer {
            counters: Arc::new(Counters::default()),
            data_dir: data_dir.to_path_buf(),
            config,
            file,
            direct: direct.then(AlignedBuf::default),
            zeros: AlignedBuf::default(),
            seq: first_seq,
            file_len: 0,
            allocated: 0,
            prealloc_stopped: false,
            failed: None,
            position: Arc::new(Mutex::new((first_seq, 0))),
            on_rotate,
        })
    }

    fn run(mut self, rx: Receiver<Msg>) {
        self.serve(&rx);
        // Anything queued behind a stop is failed rather than silently dropped.
        while let Ok(msg) = rx.try_recv() {
            match msg {
                Msg::Append { done, .. }
                | Msg::AppendBatch { done, .. }
                | Msg::AppendEncoded { done, .. } => {
                    done(Err(BookieError::ShuttingDown))
                }
                Msg::Shutdown { ack } => {
                    let _ = ack.send(Ok(()));
                }
                Msg::Halt => {}
            }
        }
    }

    fn serve(&mut self, rx: &Receiver<Msg>) {
        let mut buf = Group::default();
        let mut dones: Vec<Completion> = Vec::new();
        let mut records = 0u64;
        loop {
            let mut stop = None;
            while rx.is_empty() && self.preallocate_idle() {}
            let deadline = match rx.recv() {
                Ok(Msg::Shutdown { ack }) => {
                    self.finish(ack);
                    return;
                }
                Ok(Msg::Halt) | Err(_) => return,
                Ok(msg) => match Self::take(msg, &mut buf, &mut dones, &mut records) {
                    Ok(queued) => queued + self.config.max_group_wait,
                    Err(s) => {
                        stop = Some(s);
                        Instant::now()
                    }
                },
            };
            while stop.is_none() && buf.len < self.config.buffered_writes_threshold {
                let msg = match rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Disconnected) => break,
                    Err(TryRecvError::Empty) if self.config.flush_when_queue_empty => break,
                    Err(TryRecvError::Empty) => match rx.recv_deadline(deadline) {
                        Ok(m) => m,
                        Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                            break
                        }
                    },
                };
                if let Err(s) = Self::take(msg, &mut buf, &mut dones, &mut records) {
                    stop = Some(s);
                }
            }
            if matches!(stop, Some(Stop::Halt)) {
                for d in dones.drain(..) {
                    d(Err(BookieError::ShuttingDown));
                }
                return;
            }
            let parts = buf.finish();
            let result = if parts.is_empty() && dones.is_empty() {
                Ok(())
            } else {
                self.write_batch(&parts)
            };
            if result.is_ok() && !dones.is_empty() {
                self.counters.batches.fetch_add(1, Ordering::Relaxed);
                self.counters.records.fetch_add(records, Ordering::Relaxed);
                self.counters
                    .bytes
                    .fetch_add(buf.len as u64, Ordering::Relaxed);
            }
            records = 0;
            buf = Group::default();
            drop(parts);
            for d in dones.drain(..) {
                d(result.clone().map_err(BookieError::JournalFailed));
            }
            if result.is_ok() {
                self.maybe_rotate();
            }
            if let Some(Stop::Shutdown(ack)) = stop {
                self.finish(ack);
                return;
            }
        }
    }

    /// Add an append message to the group being built: returns when it was queued, or the
    /// stop it asks for.
    fn take(
        msg: Msg,
        buf: &mut Group,
        dones: &mut Vec<Completion>,
        records: &mut u64,
    ) -> Result<Instant, Stop> {
        match msg {
            Msg::Append {
                record,
                done,
                queued,
            } => {
                buf.record(&record);
                dones.push(done);
                *records += 1;
                Ok(queued)
            }
            Msg::AppendBatch {
                records: batch,
                done,
                queued,
            } => {
                for r in &batch {
                    buf.record(r);
                }
                dones.push(done);
                *records += batch.len() as u64;
                Ok(queued)
            }
            Msg::AppendEncoded {
                pieces,
                records: count,
                done,
                queued,
            } => {
                for piece in pieces {
                    buf.encoded(piece);
                }
                dones.push(done);
                *records += count;
                Ok(queued)
            }
            Msg::Shutdown { ack } => Err(Stop::Shutdown(ack)),
            Msg::Halt => Err(Stop::Halt),
        }
    }

    /// One write and (when configured) one fdatasync for the whole batch.
    fn write_batch(&mut self, parts: &[Bytes]) -> Result<(), String> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        let path = file_path(&self.data_dir, self.seq);
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut res = self.write_parts(parts, len);
        if res.is_ok() && self.config.sync_data {
            let started = std::time::Instant::now();
            res = self.file.sync_data();
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
            self.counters.sync_micros_total.fetch_add(micros, Ordering::Relaxed);
            self.counters.sync_micros_max.fetch_max(micros, Ordering::Relaxed);
        }
        match res {
            Ok(()) => {
                self.file_len += len;
                self.allocated = self.allocated.max(self.file_len);
                *self.position.lock() = (self.seq, self.file_len);
                Ok(())
            }
            Err(e) => {
                let msg = format!("writing journal {}: {e}", path.display());
                log::error!("{msg}; the journal stops accepting writes");
                self.failed = Some(msg.clone());
                Err(msg)
            }
        }
    }

    /// Write `parts` (`len` bytes) after the records already in the file. A direct file
    /// takes one write: from the start of the block holding the current end, through the
    /// zeros that pad the last block (see the module's Direct I/O section).
    fn write_parts(&mut self, parts: &[Bytes], len: u64) -> std::io::Result<()> {
        let Some(d) = self.direct.as_mut() else {
            return write_all_parts(&mut self.file, parts);
        };
        let kept = d.len();
        let start = self.file_len - kept as u64;
        d.reserve(usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?);
        for p in parts {
            d.extend(p);
        }
        d.pad();
        let padded = d.blocks().len();
        if let Err(e) = self.file.write_all_at(d.blocks(), start) {
            d.truncate(kept);
            return Err(e);
        }
        d.keep_last_block();
        // The padding is on disk now, as preallocated zeros would be.
        self.allocated = self.allocated.max(start + padded as u64);
        Ok(())
    }

    /// With preallocation on and the zeros short of `pre_alloc_size_mb` past the records,
    /// write the zeros up to the next [`PREALLOC_STEP`] boundary (see the module's
    /// Preallocation section). Returns whether it wrote any. The zeros are
    /// written, not just reserved, so that later writes over them change no file-system
    /// metadata. A failure is logged and ends preallocation for this file: records are then
    /// appended, which needs no zeros.
    fn preallocate_idle(&mut self) -> bool {
        let lead = self.config.pre_alloc_size_mb.saturating_mul(1024 * 1024);
        if lead == 0 || self.failed.is_some() || self.prealloc_stopped {
            return false;
        }
        let target = self.file_len.saturating_add(lead).div_ceil(PREALLOC_CHUNK).saturating_mul(PREALLOC_CHUNK);
        if self.allocated >= target {
            return false;
        }
        // Zeros from an aligned buffer, so that a direct file takes them too: they start
        // where a commit's padded blocks end, and end at a step boundary (chunks are whole
        // steps, so the target is one too).
        if self.zeros.len() < PREALLOC_STEP as usize {
            self.zeros = AlignedBuf::zeros(PREALLOC_STEP as usize);
        }
        let at = self.allocated;
        let next = (at / PREALLOC_STEP + 1).saturating_mul(PREALLOC_STEP);
        let n = usize::try_from(next - at).unwrap_or(0).min(self.zeros.len());
        match self.file.write_all_at(&self.zeros.data()[..n], at) {
            Ok(()) => {
                self.allocated = at + n as u64;
                true
            }
            Err(e) => {
                log::warn!(
                    "preallocating journal {}: {e}; records are appended to it instead",
                    file_path(&self.data_dir, self.seq).display()
                );
                self.prealloc_stopped = true;
                false
            }
        }
    }

    /// Cut the preallocated zeros off the current file, leaving just its records.
    fn trim_preallocated(&mut self) -> std::io::Result<()> {
        if self.allocated > self.file_len {
            self.file.set_len(self.file_len)?;
            self.allocated = self.file_len;
        }
        Ok(())
    }

    fn maybe_rotate(&mut self) {
        let limit = self.config.max_size_mb.max(1).saturating_mul(1024 * 1024);
        if self.file_len < limit {
            return;
        }
        let next = self.seq + 1;
        let rotated = self
            .trim_preallocated()
            .and_then(|()| self.file.sync_all())
            .map_err(|e| BookieError::io("sync journal", &file_path(&self.data_dir, self.seq), e))
            .and_then(|()| create_file(&self.data_dir, next, self.config.direct_io));
        match rotated {
            Ok((file, direct)) => {
                self.file = file;
                self.direct = direct.then(|| {
                    let mut d = self.direct.take().unwrap_or_default();
                    d.truncate(0);
                    d
                });
                self.seq = next;
                self.file_len = 0;
                self.allocated = 0;
                self.prealloc_stopped = false;
                *self.position.lock() = (next, 0);
                (self.on_rotate)(next);
            }
            Err(e) => log::error!("journal rotation failed, continuing in the current file: {e}"),
        }
    }

    fn finish(&mut self, ack: crossbeam_channel::Sender<Result<(), String>>) {
        let res = match &self.failed {
            Some(f) => Err(f.clone()),
            None => self.trim_preallocated().and_then(|()| self.file.sync_all()).map_err(|e| {
                format!(
                    "syncing journal {}: {e}",
                    file_path(&self.data_dir, self.seq).display()
                )
            }),
        };
        let _ = ack.send(res);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(dir: &Path, pre_alloc_size_mb: u64) -> Writer {
        let config = JournalConfig { pre_alloc_size_mb, ..JournalConfig::default() };
        Writer::new(dir, config, 1, Box::new(|_| {})).expect("writer")
    }

    fn len_on_disk(w: &Writer) -> u64 {
        fs::metadata(file_path(&w.data_dir, w.seq)).expect("meta").len()
    }

    proptest::proptest! {
        #[test]
        fn encoded_entries_are_the_records_encoded_one_by_one(
            lens in proptest::collection::vec(
                proptest::prop_oneof![0usize..64, COPY_DATA_BELOW - 2..COPY_DATA_BELOW + 2, 9000usize..9100],
                0..12,
            ),
        ) {
            let entries: Vec<(u64, Bytes)> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| (i as u64 + 3, Bytes::from(vec![i as u8; n])))
                .collect();
            let encoded = EncodedEntries::new(9, 2, entries.clone());
            let mut one_by_one = Vec::new();
            let mut records = Vec::new();
            for (entry, data) in &entries {
                let start = one_by_one.len();
                JournalRecord::entry(9, *entry, 2, data.clone()).encode(&mut one_by_one);
                records.push((*entry, start, one_by_one.len() - start));
            }
            proptest::prop_assert_eq!(encoded.pieces.concat(), one_by_one.clone());
            proptest::prop_assert_eq!(encoded.len(), one_by_one.len());
            proptest::prop_assert_eq!(&encoded.records, &records);
            proptest::prop_assert_eq!(encoded.entries().collect::<Vec<_>>(), entries.clone());
            // Large data is not copied: its piece is the very buffer it came in.
            for (_, data) in entries.iter().filter(|(_, d)| d.len() >= COPY_DATA_BELOW) {
                proptest::prop_assert!(encoded.pieces.iter().any(|p| p.as_ptr() == data.as_ptr()));
            }
        }
    }

    #[test]
    fn a_commit_writes_no_zeros_and_each_idle_step_writes_one_step() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = writer(dir.path(), 3);
        let mut group = Group::default();
        group.record(&JournalRecord::entry(1, 0, -1, Bytes::from(vec![7u8; 5000])));
        let len = group.len as u64;
        w.write_batch(&group.finish()).expect("commit");
        // The commit wrote its records (a direct file pads them to whole blocks), no zeros.
        let committed = len_on_disk(&w);
        assert!(committed >= len && committed < len + DIRECT_ALIGN as u64, "length {committed}");
        // Idle steps: the first up to a step boundary, then one step each, until the zeros
        // reach the chunk boundary at or after 3 MiB past the records.
        let mut lengths = Vec::new();
        while w.preallocate_idle() {
            lengths.push(len_on_disk(&w));
        }
        let expected: Vec<u64> = (1..=4 * PREALLOC_CHUNK / PREALLOC_STEP).map(|i| i * PREALLOC_STEP).collect();
        assert_eq!(lengths, expected);
        // The next commit lands on the zeros and leaves the length alone.
        let mut group = Group::default();
        group.record(&JournalRecord::entry(1, 1, 0, Bytes::from(vec![8u8; 300_000])));
        w.write_batch(&group.finish()).expect("commit");
        assert_eq!(len_on_disk(&w), 4 * PREALLOC_CHUNK);
        assert!(!w.preallocate_idle(), "still 3 MiB of zeros ahead: nothing to do");
    }

    #[test]
    fn no_zeros_without_preallocation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = writer(dir.path(), 0);
        let mut group = Group::default();
        group.record(&JournalRecord::fence(4));
        w.write_batch(&group.finish()).expect("commit");
        assert!(!w.preallocate_idle());
        assert!(len_on_disk(&w) <= DIRECT_ALIGN as u64);
    }

    #[test]
    fn record_roundtrip_and_resync() {
        let mut buf = Vec::new();
        JournalRecord::entry(1, 2, 3, Bytes::from_static(b"abc")).encode(&mut buf);
        JournalRecord::fence(9).encode(&mut buf);
        let (r, used) = parse_record(&buf).expect("first record");
        assert_eq!(r, JournalRecord::entry(1, 2, 3, Bytes::from_static(b"abc")));
        assert_eq!(good_record_after(&buf, 0), Some(used));
        assert_eq!(parse_record(&buf[..used - 1]), Err(RecordError::Short));
    }
}
