//! [`EntryLogStorage`]: ledger storage in entry-log files, one per ledger.
//!
//! # Theory of operation
//!
//! Each ledger has its own append-only log, `ledgers/<ledger>.log`, whose records use the
//! journal's record format (`u32 len | u32 crc32c | u8 kind | u64 ledger | u64 entry | i64 lac
//! | data`, kinds entry and fence). One file per ledger is what makes deletion really free space:
//! deleting a ledger deletes its file, with no compaction and no garbage left in shared logs.
//! The price is one file per live ledger, which suits a bookie whose ledgers roll over and are
//! deleted as topics trim. Open handles are bounded: past [`DEFAULT_MAX_OPEN_LOGS`] (or the
//! limit given to [`EntryLogStorage::open_with_limit`]) the least recently used logs are closed
//! and reopened on their next use.
//!
//! The index — per ledger, entry id → (offset, length) of its newest record, plus the highest lac
//! seen and the fence flag — lives in memory. It is rebuilt on open: from the ledger's index
//! file `ledgers/<ledger>.idx` (appended at every flush, after the log is synced; see
//! `logindex`) for the part of the log it lists, checking that it tiles the log and that its
//! last record is really there, and by reading and verifying every record after that part. A
//! ledger without a usable index file, or whose log does not read cleanly after it, is read and
//! verified in full. Reading an entry reads its record with one positioned read and verifies
//! the checksum and the ledger and entry ids again, so a damaged file yields an error, never
//! wrong data.
//!
//! Appends are not fsynced (the journal makes adds durable), and not even written at once: an
//! append copies its records into the log's buffer in memory, where reads find them, and the
//! buffer is written out later, off the add path — by [`LedgerStorage::start_writeback`]
//! (the server's checkpoint thread calls it every megabyte added), by a flush, or by the
//! append itself once a log has [`MAX_BUFFERED`] bytes waiting. The write goes from that
//! buffer straight to the disk with direct I/O where the file system allows it, as the
//! journal's does: copying every entry into the page cache was the costliest thing a
//! bookie did per byte. It goes in pieces of [`WRITE_OUT_PIECE`] (more when a log has
//! fallen behind), one after the other: a journal commit issued meanwhile waits behind one
//! piece on the disk, not behind the whole buffer (a megabyte written at once held such a
//! commit for most of a millisecond, once per megabyte added). Direct writes cover whole
//! [`DIRECT_ALIGN`] blocks, so each starts
//! at the block holding the end of the previous one, writes that block's bytes again, and
//! pads the last block with zeros, which the next write overwrites; a file can therefore
//! end in zeros past its last record, and opening it cuts them off without a word (see
//! below). Where direct I/O is refused (tmpfs), the same blocks are written buffered.
//!
//! [`LedgerStorage::flush`] writes out and fsyncs every log written since the previous flush
//! and the directory, and then records each log's synced length in `ledgers/CHECKPOINT`. On
//! open, bytes past a log's recorded length were never covered by a checkpoint, so they are
//! still in the journal: a bad record there (a write torn by a crash) is cut off, with a
//! warning, together with everything after it, and journal replay writes those entries again.
//! Zeros alone after the last record are the padding of a direct write, and are cut off
//! quietly. A bad record inside the checkpointed part is corruption: opening fails and names
//! the file and offset. Deleting a ledger first drops it from
//! `CHECKPOINT`, so a later log under the same id is never judged by the old one's length.
//!
//! # Memory
//!
//! An in-memory index costs about 12 bytes per entry id (an array by entry id, kept in
//! chunks), so a bookie that kept every index would still grow with the data
//! it stores: hundreds of MB for tens of millions of small entries. After
//! each flush (and at open, as each log is read), the indexes of the least recently used
//! logs are dropped until all of them together hold at most [`DEFAULT_MAX_INDEXED_ENTRIES`]
//! entries (or the limit
//! given to [`EntryLogStorage::open_with_limits`]). Only a log whose every record is on disk
//! and listed in its index file, and that nothing read, appended to or fenced for a whole
//! flush interval, loses its index: a ledger still being written or read keeps its own.
//! The next use of a dropped index (a read, an append, a fence) reads it back from
//! the index file, about a millisecond for a rolled-over ledger of 50,000 entries. The
//! same pass gives back the write buffers of every log nothing was appended to since the
//! flush, which would otherwise keep a megabyte or more per ledger ever written.
//!
//! ```
//! use bytes::Bytes;
//! use magnetar_bookie::storage::{EntryLogStorage, LedgerStorage};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = EntryLogStorage::open(dir.path()).unwrap();
//! store.add_entry(3, 0, -1, Bytes::from_static(b"hello")).unwrap();
//! store.flush().unwrap();
//! drop(store);
//! let store = EntryLogStorage::open(dir.path()).unwrap();
//! assert_eq!(store.get_entry(3, 0).unwrap(), Some((-1, Bytes::from_static(b"hello"))));
//! ```

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use parking_lot::{Mutex, RwLock};

use crate::error::BookieError;
use crate::journal::{
    parse_record, sync_dir, AlignedBuf, EncodedEntries, JournalRecord, RecordError, RecordKind,
    RecordScanner, Scanned, DIRECT_ALIGN,
};
use crate::entryindex::EntryIndex;
use crate::logindex::{self, IdxRecord};
use crate::storage::LedgerStorage;

/// The subdirectory of the data dir that holds ledger logs.
pub const LEDGERS_DIR: &str = "ledgers";
/// The file recording each log's length as of the last flush.
const CHECKPOINT_FILE: &str = "CHECKPOINT";
const CHECKPOINT_MAGIC: &[u8; 8] = b"MGBKCKP1";

/// How many ledger logs [`EntryLogStorage::open`] keeps open at most by default.
pub const DEFAULT_MAX_OPEN_LOGS: usize = 256;

/// How many entries the in-memory indexes of [`EntryLogStorage::open`] hold at most by
/// default, past a flush and at open (about 12 bytes each: some 3 MB).
pub const DEFAULT_MAX_INDEXED_ENTRIES: usize = 1 << 18;

/// How many bytes a log may hold in memory before the append that passes it writes them
/// out itself.
pub const MAX_BUFFERED: usize = 16 << 20;
/// A write-out goes to the disk in pieces of at least this many bytes, so that a journal
/// commit issued meanwhile waits behind one piece, not the whole buffer.
const WRITE_OUT_PIECE: usize = 128 << 10;

/// The piece size for writing out `len` bytes: [`WRITE_OUT_PIECE`], or a quarter of a
/// buffer that has grown large, so that a log that falls behind catches up with few writes.
fn write_out_piece(len: usize) -> usize {
    (len / 4).next_multiple_of(DIRECT_ALIGN).max(WRITE_OUT_PIECE)
}

fn block_start(off: u64) -> u64 {
    off - off % DIRECT_ALIGN as u64
}

/// Where an entry's record is read from.
enum Held {
    Memory(Bytes),
    Disk(Arc<LogFiles>),
}

/// A log's open files: one to read and sync through, one for the (direct) writes.
struct LogFiles {
    read: File,
    write: File,
    direct: bool,
}

struct LedgerLog {
    path: PathBuf,
    /// Closed (None) when idle, to bound the number of open files; reopened on use.
    files: Option<Arc<LogFiles>>,
    last_used: u64,
    len: u64,
    /// The bytes `[buf_off, len)`: appended and not yet written out, preceded by the rest of
    /// the block `buf_off` starts, which the next write writes again.
    buf: AlignedBuf,
    buf_off: u64,
    /// The buffer being written out, from the offset it starts at: reads find its records
    /// there until the write is done.
    writing: Option<(u64, Arc<AlignedBuf>)>,
    /// The file holds every byte before this offset.
    on_disk: u64,
    /// A written-out buffer, kept for the next one.
    spare: Option<AlignedBuf>,
    /// Held through a write-out, so the writes of one log go one at a time and in order.
    out_lock: Arc<Mutex<()>>,
    index: EntryIndex,
    lac: i64,
    fenced: bool,
    dirty: bool,
    deleted: bool,
    /// Records appended (or found by a scan) that the index file does not list yet.
    unindexed: Vec<IdxRecord>,
    /// An emptied vector of records, kept for the next [`LedgerLog::take_unindexed`].
    unindexed_spare: Vec<IdxRecord>,
    /// Valid bytes of the index file; the next chunk goes here.
    idx_len: u64,
    /// False once writing the index failed: it is removed and rebuilt by the next open.
    idx_ok: bool,
    /// `index` was dropped to bound memory; the index file lists every record, and the
    /// index is read back from it on the log's next use.
    evicted: bool,
    /// The log was read, appended to or fenced since the last flush's eviction pass. Only a
    /// log left alone for a whole flush interval loses its index: a ledger being written
    /// is quiet for the instant after each flush, and dropping its index then made the
    /// next append read all of it back (seconds for a ledger of millions of entries).
    used: bool,
}

impl LedgerLog {
    /// A log of `len` bytes, all of them on disk; `tail` holds the bytes of its last,
    /// partly filled block.
    fn new(path: PathBuf, len: u64, tail: AlignedBuf) -> LedgerLog {
        LedgerLog {
            path,
            files: None,
            last_used: 0,
            len,
            buf: tail,
            buf_off: block_start(len),
            writing: None,
            on_disk: len,
            spare: None,
            out_lock: Arc::new(Mutex::new(())),
            index: EntryIndex::new(),
            lac: -1,
            fenced: false,
            dirty: false,
            deleted: false,
            unindexed: Vec::new(),
            unindexed_spare: Vec::new(),
            idx_len: 0,
            idx_ok: true,
            evicted: false,
            used: false,
        }
    }

    /// Whether nothing was appended since a flush synced the log and listed it in its index
    /// file.
    fn quiet(&self) -> bool {
        !self.deleted
            && !self.dirty
            && self.writing.is_none()
            && self.len == self.on_disk
            && self.unindexed.is_empty()
    }

    /// Give back the buffers a quiet log does not need: the next append or write-out makes
    /// new ones.
    fn release_buffers(&mut self) {
        self.spare = None;
        if self.buf.capacity() > 2 * DIRECT_ALIGN {
            let mut small = AlignedBuf::default();
            small.extend(self.buf.data());
            self.buf = small;
        }
        self.unindexed = Vec::new();
        self.unindexed_spare = Vec::new();
    }

    /// Whether `index` may be dropped: every record is on disk and listed in the index file,
    /// so that it can be read back from there alone, and nothing used the log since the last
    /// eviction pass.
    fn evictable(&self) -> bool {
        self.quiet() && self.idx_ok && !self.evicted && !self.used && !self.index.is_empty()
    }

    fn evict_index(&mut self) {
        self.index = EntryIndex::new();
        self.evicted = true;
    }

    /// Append records already encoded in the record format to the buffer.
    fn append_encoded(&mut self, entries: &EncodedEntries) {
        let base = self.len;
        for piece in &entries.pieces {
            self.buf.extend(piece);
        }
        self.len += entries.len() as u64;
        self.dirty = true;
        self.unindexed.reserve(entries.records.len());
        for &(entry, start, len) in &entries.records {
            let off = base + start as u64;
            self.unindexed.push(IdxRecord {
                kind: RecordKind::Entry,
                entry,
                lac: entries.lac,
                off,
                len: u32::try_from(len).unwrap_or(u32::MAX),
            });
            self.index.insert(entry, (off, len));
        }
        self.lac = self.lac.max(entries.lac);
    }

    fn append(&mut self, record: &JournalRecord) -> (u64, usize) {
        let mut buf = Vec::with_capacity(record.encoded_len());
        record.encode(&mut buf);
        let off = self.len;
        self.buf.extend(&buf);
        self.len += buf.len() as u64;
        self.dirty = true;
        self.unindexed.push(IdxRecord {
            kind: record.kind,
            entry: record.entry,
            lac: record.lac,
            off,
            len: u32::try_from(buf.len()).unwrap_or(u32::MAX),
        });
        (off, buf.len())
    }

    /// Where the `len` bytes at `off` are in memory, if they are: in the buffer, or in the
    /// one being written out.
    fn in_memory(&self, off: u64, len: usize) -> Option<Bytes> {
        let from_buf = |base: u64, buf: &AlignedBuf| {
            let at = usize::try_from(off.checked_sub(base)?).ok()?;
            buf.data().get(at..at + len).map(Bytes::copy_from_slice)
        };
        if off + len as u64 <= self.on_disk {
            return None;
        }
        from_buf(self.buf_off, &self.buf)
            .or_else(|| self.writing.as_ref().and_then(|(base, buf)| from_buf(*base, buf)))
    }

    /// Take the first `upto` records not yet in the index file, with the offset their chunk
    /// goes to, for [`write_index_chunk`] to write without the log's lock. `None` when there
    /// is nothing to write (or the log is deleted).
    fn take_unindexed(&mut self, upto: usize) -> Option<(Vec<IdxRecord>, u64)> {
        if self.deleted || !self.idx_ok || upto == 0 {
            return None;
        }
        // The taken records leave in the vector they are in; what came after them moves to
        // the spare one (kept empty), so the lock is held for the few records appended
        // since the sync.
        let mut taken = std::mem::take(&mut self.unindexed_spare);
        taken.extend(self.unindexed.drain(upto..));
        std::mem::swap(&mut taken, &mut self.unindexed);
        Some((taken, self.idx_len))
    }

    /// After [`write_index_chunk`]: the index file now ends at `idx_len` (or, on `None`, the
    /// write failed and the index is given up).
    fn index_written(&mut self, idx: &Path, mut taken: Vec<IdxRecord>, idx_len: Option<u64>) {
        taken.clear();
        self.unindexed_spare = taken;
        if self.deleted {
            // Deleted while the chunk was written: it must not outlive the log.
            if let Err(e) = logindex::remove(idx) {
                log::warn!("index {}: cannot remove: {e}", idx.display());
            }
            return;
        }
        match idx_len {
            Some(len) => self.idx_len = len,
            None => {
                self.idx_ok = false;
                self.unindexed.clear();
                if let Err(e) = logindex::remove(idx) {
                    log::warn!("index {}: cannot remove: {e}", idx.display());
                }
            }
        }
    }
}

/// Write `records` as one chunk at `at` of the index file; the file's length after it, or
/// `None` (logged) when the write failed and the log will be scanned on the next open.
fn write_index_chunk(idx: &Path, records: &[IdxRecord], at: u64) -> Option<u64> {
    let chunk = logindex::encode_chunk(records);
    match logindex::append_chunk(idx, at, &chunk) {
        Ok(()) => Some(at + chunk.len() as u64),
        Err(e) => {
            log::warn!("index {}: {e}; the log will be scanned on the next open", idx.display());
            None
        }
    }
}

/// Ledger storage in per-ledger entry-log files. See the module docs.
pub struct EntryLogStorage {
    dir: PathBuf,
    ledgers: RwLock<HashMap<u64, Arc<Mutex<LedgerLog>>>>,
    /// Files were created or removed since the directory was last synced.
    dir_dirty: AtomicBool,
    /// The lengths last written to CHECKPOINT; held while CHECKPOINT is rewritten, so one
    /// writer at a time. Held only briefly: never across the fsyncs of the logs.
    checkpointed: Mutex<HashMap<u64, u64>>,
    /// One flush at a time, so CHECKPOINT lengths never go backwards.
    flush_lock: Mutex<()>,
    /// Set by [`LedgerStorage::halt`]: nothing more is written out, not even on drop.
    halted: AtomicBool,
    max_open: usize,
    /// See [`EntryLogStorage::open_with_limits`].
    max_indexed: usize,
    open_files: AtomicUsize,
    tick: AtomicU64,
}

impl EntryLogStorage {
    /// Open (creating if needed) the storage under `data_dir/ledgers`, rebuilding the
    /// in-memory index from the index files and verifying every log past them (see the module
    /// docs). Keeps at most [`DEFAULT_MAX_OPEN_LOGS`] logs open.
    pub fn open(data_dir: &Path) -> Result<EntryLogStorage, BookieError> {
        EntryLogStorage::open_with_limits(data_dir, DEFAULT_MAX_OPEN_LOGS, DEFAULT_MAX_INDEXED_ENTRIES)
    }

    /// Like [`open`](Self::open), keeping at most about `max_open_logs` log files open: past
    /// that, the least recently used are closed and reopened when next needed.
    pub fn open_with_limit(
        data_dir: &Path,
        max_open_logs: usize,
    ) -> Result<EntryLogStorage, BookieError> {
        EntryLogStorage::open_with_limits(data_dir, max_open_logs, DEFAULT_MAX_INDEXED_ENTRIES)
    }

    /// Like [`open_with_limit`](Self::open_with_limit), and with the in-memory indexes
    /// cut back to about `max_indexed_entries` entries after each flush (see the module's
    /// Memory section).
    pub fn open_with_limits(
        data_dir: &Path,
        max_open_logs: usize,
        max_indexed_entries: usize,
    ) -> Result<EntryLogStorage, BookieError> {
        let dir = data_dir.join(LEDGERS_DIR);
        fs::create_dir_all(&dir).map_err(|e| BookieError::io("create ledgers dir", &dir, e))?;
        let synced = read_checkpoint(&dir)?;
        let mut ledgers = HashMap::new();
        let mut indexed = 0usize;
        let rd = fs::read_dir(&dir).map_err(|e| BookieError::io("list ledgers dir", &dir, e))?;
        for item in rd {
            let item = item.map_err(|e| BookieError::io("list ledgers dir", &dir, e))?;
            let name = item.file_name();
            let Some(ledger) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let synced_len = synced.get(&ledger).copied().unwrap_or(0);
            let log = match load_log(&dir, ledger, synced_len, true) {
                Err(BookieError::Corrupt { reason, offset, .. }) => {
                    // The index is only an accelerator: before calling the log corrupt, read
                    // it in full without the index.
                    log::warn!("ledger log {ledger}: {reason} at offset {offset} after its index; rescanning without it");
                    load_log(&dir, ledger, synced_len, false)?
                }
                other => other?,
            };
            // Past the limit, a log's index goes as soon as it is read, so that opening
            // never holds more than the limit (and the one log being read) in memory.
            let mut log = log;
            if indexed + log.index.len() > max_indexed_entries && log.evictable() {
                log.evict_index();
            }
            indexed += log.index.len();
            ledgers.insert(ledger, Arc::new(Mutex::new(log)));
        }
        Ok(EntryLogStorage {
            dir,
            ledgers: RwLock::new(ledgers),
            dir_dirty: AtomicBool::new(true),
            checkpointed: Mutex::new(synced),
            flush_lock: Mutex::new(()),
            halted: AtomicBool::new(false),
            max_open: max_open_logs.max(1),
            max_indexed: max_indexed_entries,
            open_files: AtomicUsize::new(0),
            tick: AtomicU64::new(0),
        })
    }

    /// How many entries the in-memory indexes hold now.
    pub fn indexed_entries(&self) -> usize {
        self.sum_over_logs(|g| g.index.len())
    }

    /// Bytes of memory the logs' write buffers hold now.
    pub fn buffer_bytes(&self) -> usize {
        self.sum_over_logs(|g| g.buf.capacity() + g.spare.as_ref().map_or(0, AlignedBuf::capacity))
    }

    fn sum_over_logs(&self, f: impl Fn(&LedgerLog) -> usize) -> usize {
        let logs: Vec<Arc<Mutex<LedgerLog>>> = self.ledgers.read().values().cloned().collect();
        logs.iter().map(|l| f(&l.lock())).sum()
    }

    /// Give back the buffers of quiet logs, and drop the indexes of the least recently used
    /// logs that can be read back from their index files, until the indexes hold at most
    /// `max_indexed` entries (or none is left to drop: a log still being appended to keeps
    /// its index).
    fn evict_indexes(&self) {
        let logs: Vec<Arc<Mutex<LedgerLog>>> = self.ledgers.read().values().cloned().collect();
        let mut total = 0usize;
        let mut idle = Vec::new();
        for log in logs {
            let mut g = log.lock();
            if g.quiet() {
                g.release_buffers();
            }
            total += g.index.len();
            if g.evictable() {
                idle.push((g.last_used, log.clone()));
            }
            // A log used from now on keeps its index past the next flush too.
            g.used = false;
        }
        idle.sort_unstable_by_key(|(used, _)| *used);
        for (_, log) in idle {
            if total <= self.max_indexed {
                break;
            }
            let mut g = log.lock();
            if g.evictable() {
                total -= g.index.len();
                g.evict_index();
            }
        }
    }

    /// Note a use of the log, and read its index back from its index file if it was
    /// evicted (see the module's Memory section). Should the file not list the whole log
    /// after all, the log is read as an open reads it.
    fn reload_index(&self, ledger: u64, g: &mut LedgerLog) -> Result<(), BookieError> {
        g.used = true;
        if !g.evicted {
            return Ok(());
        }
        let idx = logindex::idx_path(&self.dir, ledger);
        match logindex::load(&idx, g.len).filter(|l| l.covered() == g.len) {
            Some(listed) => {
                g.index = listed
                    .records
                    .iter()
                    .filter(|r| r.kind == RecordKind::Entry)
                    .map(|r| (r.entry, (r.off, r.byte_len())))
                    .collect();
            }
            None => {
                log::warn!("index {}: does not list the whole log; reading the log", idx.display());
                let loaded = load_log(&self.dir, ledger, g.len, true)?;
                if loaded.len != g.len {
                    return Err(BookieError::corrupt(
                        &g.path,
                        loaded.len,
                        format!("log reads back {} bytes long instead of {}", loaded.len, g.len),
                    ));
                }
                g.index = loaded.index;
                g.unindexed = loaded.unindexed;
                g.idx_len = loaded.idx_len;
            }
        }
        g.evicted = false;
        g.last_used = self.tick.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// How many log files are held open now.
    pub fn open_files(&self) -> usize {
        self.open_files.load(Ordering::SeqCst)
    }

    /// The log's files, reopening them if they were closed while idle.
    fn files(&self, log: &mut LedgerLog) -> Result<Arc<LogFiles>, BookieError> {
        log.last_used = self.tick.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &log.files {
            return Ok(f.clone());
        }
        let files = Arc::new(open_files(&log.path)?);
        log.files = Some(files.clone());
        if self.open_files.fetch_add(1, Ordering::SeqCst) + 1 > self.max_open {
            self.close_idle();
        }
        Ok(files)
    }

    /// After an append: write the ledger's log out when its buffer is `full`.
    fn write_out_if(&self, ledger: u64, full: bool) -> Result<(), BookieError> {
        match self.get(ledger) {
            Some(log) if full => self.write_out(&log).map(drop),
            _ => Ok(()),
        }
    }

    /// Write out what `log` holds in memory (see the module docs); the length of the log on
    /// disk after it. Appends and reads go on meanwhile: only the write's setup and its end
    /// hold the log's lock.
    fn write_out(&self, log: &Mutex<LedgerLog>) -> Result<u64, BookieError> {
        let out_lock = log.lock().out_lock.clone();
        let _one = out_lock.lock();
        let (files, off, buf) = {
            let mut g = log.lock();
            if g.deleted || g.len == g.on_disk {
                return Ok(g.on_disk);
            }
            let files = self.files(&mut g)?;
            // The next buffer starts with the last block's bytes, which its write repeats.
            let mut next = g.spare.take().unwrap_or_default();
            next.truncate(0);
            next.extend(g.buf.last_block());
            let mut cur = std::mem::replace(&mut g.buf, next);
            let next_off = block_start(g.len);
            let off = std::mem::replace(&mut g.buf_off, next_off);
            cur.pad();
            let cur = Arc::new(cur);
            g.writing = Some((off, cur.clone()));
            (files, off, cur)
        };
        let piece = write_out_piece(buf.len());
        let res = buf
            .blocks()
            .chunks(piece)
            .zip((off..).step_by(piece))
            .try_for_each(|(piece, at)| files.write.write_all_at(piece, at));
        let end = off + buf.len() as u64;
        let mut g = log.lock();
        g.writing = None;
        match res {
            Ok(()) => {
                g.on_disk = end;
                g.dirty = true;
                if !files.direct {
                    start_writeback_range(&files.write, off, end);
                }
                g.spare = Arc::try_unwrap(buf).ok();
                Ok(end)
            }
            Err(e) => {
                // Nothing is lost: the bytes go back in front of what was appended since,
                // for the next write-out to try again.
                let mut back = AlignedBuf::default();
                back.extend(buf.data());
                let since = usize::try_from(end - g.buf_off).unwrap_or(0);
                back.extend(&g.buf.data()[since..]);
                g.buf = back;
                g.buf_off = off;
                Err(BookieError::io("write ledger log", &g.path, e))
            }
        }
    }

    /// Close the least recently used logs until a quarter of the limit is free again. Logs in
    /// use right now (locked) are skipped, so this never waits on another log's lock.
    fn close_idle(&self) {
        let logs: Vec<Arc<Mutex<LedgerLog>>> = self.ledgers.read().values().cloned().collect();
        let mut open: Vec<(u64, Arc<Mutex<LedgerLog>>)> = logs
            .into_iter()
            .filter_map(|l| {
                let used = l
                    .try_lock()
                    .filter(|g| g.files.is_some())
                    .map(|g| g.last_used)?;
                Some((used, l))
            })
            .collect();
        open.sort_unstable_by_key(|(used, _)| *used);
        let target = self.max_open - self.max_open / 4;
        let excess = self.open_files().saturating_sub(target);
        for (_, l) in open.into_iter().take(excess) {
            if let Some(mut g) = l.try_lock() {
                if g.files.take().is_some() {
                    self.open_files.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }

    fn log_path(&self, ledger: u64) -> PathBuf {
        self.dir.join(format!("{ledger}.log"))
    }

    fn get(&self, ledger: u64) -> Option<Arc<Mutex<LedgerLog>>> {
        self.ledgers.read().get(&ledger).cloned()
    }

    /// Run `f` on the ledger's log, creating the log if needed.
    fn with_log<T>(
        &self,
        ledger: u64,
        mut f: impl FnMut(&mut LedgerLog) -> Result<T, BookieError>,
    ) -> Result<T, BookieError> {
        loop {
            let log = match self.get(ledger) {
                Some(l) => l,
                None => {
                    let mut map = self.ledgers.write();
                    match map.get(&ledger) {
                        Some(l) => l.clone(),
                        None => {
                            let path = self.log_path(ledger);
                            OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(true)
                                .open(&path)
                                .map_err(|e| BookieError::io("create ledger log", &path, e))?;
                            let idx = logindex::idx_path(&self.dir, ledger);
                            logindex::remove(&idx)
                                .map_err(|e| BookieError::io("remove stale index", &idx, e))?;
                            self.dir_dirty.store(true, Ordering::SeqCst);
                            let mut fresh = LedgerLog::new(path, 0, AlignedBuf::default());
                            fresh.dirty = true;
                            let log = Arc::new(Mutex::new(fresh));
                            map.insert(ledger, log.clone());
                            log
                        }
                    }
                }
            };
            let mut guard = log.lock();
            if guard.deleted {
                continue;
            }
            self.reload_index(ledger, &mut guard)?;
            return f(&mut guard);
        }
    }
}

impl LedgerStorage for EntryLogStorage {
    fn add_entry(&self, ledger: u64, entry: u64, lac: i64, data: Bytes) -> Result<(), BookieError> {
        let record = JournalRecord::entry(ledger, entry, lac, data);
        let full = self.with_log(ledger, |log| {
            let at = log.append(&record);
            log.index.insert(entry, at);
            log.lac = log.lac.max(lac);
            Ok(log.buf.len() >= MAX_BUFFERED)
        })?;
        self.write_out_if(ledger, full)
    }

    fn add_encoded(&self, entries: &EncodedEntries) -> Result<(), BookieError> {
        let full = self.with_log(entries.ledger, |log| {
            log.append_encoded(entries);
            Ok(log.buf.len() >= MAX_BUFFERED)
        })?;
        self.write_out_if(entries.ledger, full)
    }

    fn get_entry(&self, ledger: u64, entry: u64) -> Result<Option<(i64, Bytes)>, BookieError> {
        let Some(log) = self.get(ledger) else {
            return Ok(None);
        };
        let (at, path, off, len) = {
            let mut g = log.lock();
            self.reload_index(ledger, &mut g)?;
            let Some((off, len)) = g.index.get(entry) else {
                return Ok(None);
            };
            let at = match g.in_memory(off, len) {
                Some(held) => Held::Memory(held),
                None => Held::Disk(self.files(&mut g)?),
            };
            (at, g.path.clone(), off, len)
        };
        let buf = match at {
            Held::Memory(held) => held,
            Held::Disk(files) => {
                let mut buf = vec![0u8; len];
                files
                    .read
                    .read_exact_at(&mut buf, off)
                    .map_err(|e| BookieError::io("read ledger log", &path, e))?;
                Bytes::from(buf)
            }
        };
        match parse_record(&buf) {
            Ok((r, used))
                if used == len
                    && r.kind == RecordKind::Entry
                    && r.ledger == ledger
                    && r.entry == entry =>
            {
                Ok(Some((r.lac, r.data)))
            }
            Ok((r, _)) => Err(BookieError::corrupt(
                &path,
                off,
                format!(
                    "index points at {:?} {}:{} instead of entry {ledger}:{entry}",
                    r.kind, r.ledger, r.entry
                ),
            )),
            Err(RecordError::Short) => Err(BookieError::corrupt(&path, off, "record cut short")),
            Err(RecordError::Invalid(why)) => Err(BookieError::corrupt(&path, off, why)),
        }
    }

    fn last_entry(&self, ledger: u64) -> Result<Option<u64>, BookieError> {
        let Some(log) = self.get(ledger) else {
            return Ok(None);
        };
        let mut g = log.lock();
        self.reload_index(ledger, &mut g)?;
        Ok(g.index.last())
    }

    fn lac(&self, ledger: u64) -> Result<Option<i64>, BookieError> {
        Ok(self.get(ledger).map(|l| l.lock().lac))
    }

    fn has_ledger(&self, ledger: u64) -> Result<bool, BookieError> {
        Ok(self.get(ledger).is_some())
    }

    fn set_fenced(&self, ledger: u64) -> Result<bool, BookieError> {
        self.with_log(ledger, |log| {
            if log.fenced {
                return Ok(true);
            }
            log.append(&JournalRecord::fence(ledger));
            log.fenced = true;
            Ok(false)
        })
    }

    fn is_fenced(&self, ledger: u64) -> Result<bool, BookieError> {
        Ok(self.get(ledger).is_some_and(|l| l.lock().fenced))
    }

    fn ledgers(&self) -> Result<Vec<u64>, BookieError> {
        let mut ids: Vec<u64> = self.ledgers.read().keys().copied().collect();
        ids.sort_unstable();
        Ok(ids)
    }

    fn delete_ledger(&self, ledger: u64) -> Result<bool, BookieError> {
        let Some(log) = self.ledgers.write().remove(&ledger) else {
            return Ok(false);
        };
        // Forget the checkpointed length first: a later log of the same id starts from zero.
        // (Lock order, as in flush: CHECKPOINT before any ledger.)
        {
            let mut ck = self.checkpointed.lock();
            if ck.remove(&ledger).is_some() {
                write_checkpoint(&self.dir, &ck)?;
            }
        }
        let mut g = log.lock();
        g.deleted = true;
        g.buf = AlignedBuf::default();
        g.spare = None;
        if g.files.take().is_some() {
            self.open_files.fetch_sub(1, Ordering::SeqCst);
        }
        match crate::reaper::remove(&g.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BookieError::io("delete ledger log", &g.path, e)),
        }
        let idx = logindex::idx_path(&self.dir, ledger);
        logindex::remove(&idx).map_err(|e| BookieError::io("delete ledger index", &idx, e))?;
        self.dir_dirty.store(true, Ordering::SeqCst);
        Ok(true)
    }

    fn flush(&self) -> Result<(), BookieError> {
        let _one = self.flush_lock.lock();
        let logs: Vec<(u64, Arc<Mutex<LedgerLog>>)> = self
            .ledgers
            .read()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mut synced_logs = Vec::with_capacity(logs.len());
        for (ledger, log) in logs {
            let len = self.write_out(&log)?;
            let (files, path, dirty, upto) = {
                let mut g = log.lock();
                if g.deleted {
                    continue;
                }
                // The index chunk lists only records the sync below covers.
                let upto = g.unindexed.partition_point(|r| r.off + u64::from(r.len) <= len);
                (
                    g.files.clone(),
                    g.path.clone(),
                    std::mem::replace(&mut g.dirty, false),
                    upto,
                )
            };
            if dirty {
                // A log closed while idle is synced through a fresh handle: fsync covers the
                // file, not the descriptor.
                let synced = match files {
                    Some(f) => f.read.sync_data(),
                    None => File::open(&path).and_then(|f| f.sync_data()),
                };
                if let Err(e) = synced {
                    let mut g = log.lock();
                    if g.deleted {
                        continue;
                    }
                    g.dirty = true;
                    return Err(BookieError::io("sync ledger log", &path, e));
                }
            }
            // The chunk is encoded and written without the log's lock, which appends need.
            // Flushes are one at a time, so no other chunk of this log is written meanwhile.
            let taken = log.lock().take_unindexed(upto);
            if let Some((records, at)) = taken {
                let idx = logindex::idx_path(&self.dir, ledger);
                let written = write_index_chunk(&idx, &records, at);
                log.lock().index_written(&idx, records, written);
            }
            synced_logs.push((ledger, len, log));
        }
        if self.dir_dirty.swap(false, Ordering::SeqCst) {
            if let Err(e) = sync_dir(&self.dir) {
                self.dir_dirty.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
        // Record only logs that are still the same logs: one deleted (and perhaps created
        // again) meanwhile must not be judged by this length. Deletes take this lock too.
        let mut ck = self.checkpointed.lock();
        let lengths: HashMap<u64, u64> = {
            let current = self.ledgers.read();
            synced_logs
                .into_iter()
                .filter(|(ledger, _, log)| current.get(ledger).is_some_and(|c| Arc::ptr_eq(c, log)))
                .map(|(ledger, len, _)| (ledger, len))
                .collect()
        };
        write_checkpoint(&self.dir, &lengths)?;
        *ck = lengths;
        drop(ck);
        self.evict_indexes();
        Ok(())
    }

    fn halt(&self) {
        self.halted.store(true, Ordering::SeqCst);
    }

    fn start_writeback(&self) {
        if self.halted.load(Ordering::SeqCst) {
            return;
        }
        let logs: Vec<Arc<Mutex<LedgerLog>>> = self.ledgers.read().values().cloned().collect();
        for log in logs {
            if let Err(e) = self.write_out(&log) {
                // The bytes stay in memory; the next write-out or the flush tries again.
                log::warn!("{e}");
            }
        }
    }
}

impl Drop for EntryLogStorage {
    /// What is still only in memory is written out (not synced), as an append used to write
    /// it at once; the journal covers it either way. A halted storage writes nothing: it
    /// may be dropped well after its bookie stopped, when another has its directory.
    fn drop(&mut self) {
        self.start_writeback();
    }
}

/// Open a log's files: for writes with direct I/O where the file system allows it.
fn open_files(path: &Path) -> Result<LogFiles, BookieError> {
    use std::os::unix::fs::OpenOptionsExt;
    let read = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| BookieError::io("open ledger log", path, e))?;
    let direct = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path);
    let (write, direct) = match direct {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (
            read.try_clone()
                .map_err(|e| BookieError::io("open ledger log", path, e))?,
            false,
        ),
        Err(e) => return Err(BookieError::io("open ledger log", path, e)),
    };
    Ok(LogFiles { read, write, direct })
}

/// Ask the kernel to start writing `[from, to)` of `file` out, without waiting for it.
/// Only a hint: when it cannot be given, the next flush writes those bytes all the same.
///
/// The one foreign call of this crate: no safe binding of `sync_file_range(2)` exists.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn start_writeback_range(file: &File, from: u64, to: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(from), i64::try_from(to - from)) else {
        return;
    };
    // SAFETY: plain integers in, an integer out; the descriptor stays open while `file` is
    // borrowed, and the call touches no memory of ours.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE) };
    if rc != 0 {
        log::debug!("sync_file_range: {}", std::io::Error::last_os_error());
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback_range(_file: &File, _from: u64, _to: u64) {}

/// Whether the last record the index lists is really there: the cheap check that the index
/// describes this log and ends on a record boundary.
fn last_record_matches(file: &File, ledger: u64, loaded: &logindex::Loaded) -> bool {
    let Some(last) = loaded.records.last() else {
        return true;
    };
    let mut buf = vec![0u8; last.byte_len()];
    if file.read_exact_at(&mut buf, last.off).is_err() {
        return false;
    }
    matches!(parse_record(&buf), Ok((r, used))
        if used == buf.len() && r.ledger == ledger && r.kind == last.kind && r.entry == last.entry && r.lac == last.lac)
}

/// Read and verify one ledger log, cutting off a torn tail past the checkpointed length.
fn load_log(
    dir: &Path,
    ledger: u64,
    synced_len: u64,
    use_index: bool,
) -> Result<LedgerLog, BookieError> {
    let path = dir.join(format!("{ledger}.log"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| BookieError::io("open ledger log", &path, e))?;
    let scan_handle = file
        .try_clone()
        .map_err(|e| BookieError::io("open ledger log", &path, e))?;
    let mut scanner = RecordScanner::open(scan_handle, &path)?;
    let file_len = file
        .metadata()
        .map_err(|e| BookieError::io("stat", &path, e))?
        .len();
    if file_len < synced_len {
        return Err(BookieError::corrupt(
            &path,
            file_len,
            format!("log is shorter than its checkpointed length {synced_len}"),
        ));
    }
    let mut index = EntryIndex::new();
    let mut lac = -1;
    let mut fenced = false;
    let idx = logindex::idx_path(dir, ledger);
    let mut idx_len = 0;
    let mut unindexed = Vec::new();
    let loaded = if use_index {
        logindex::load(&idx, file_len).filter(|l| last_record_matches(&file, ledger, l))
    } else {
        None
    };
    match loaded {
        Some(loaded) => {
            // The index lists the log up to `covered`; only the rest is read and verified.
            for r in &loaded.records {
                match r.kind {
                    RecordKind::Entry => {
                        index.insert(r.entry, (r.off, r.byte_len()));
                        lac = lac.max(r.lac);
                    }
                    RecordKind::Fence => fenced = true,
                    RecordKind::DeleteLedger => {}
                }
            }
            idx_len = loaded.valid_len;
            OpenOptions::new()
                .write(true)
                .open(&idx)
                .and_then(|f| f.set_len(idx_len))
                .map_err(|e| BookieError::io("trim ledger index", &idx, e))?;
            scanner.skip_to(loaded.covered())?;
        }
        None => {
            logindex::remove(&idx).map_err(|e| BookieError::io("remove ledger index", &idx, e))?
        }
    }
    let len = loop {
        match scanner.next_record()? {
            Scanned::Record {
                record: r,
                off,
                used,
            } => {
                if r.ledger != ledger {
                    return Err(BookieError::corrupt(
                        &path,
                        off,
                        format!("record of ledger {} in this log", r.ledger),
                    ));
                }
                unindexed.push(IdxRecord {
                    kind: r.kind,
                    entry: r.entry,
                    lac: r.lac,
                    off,
                    len: u32::try_from(used).unwrap_or(u32::MAX),
                });
                match r.kind {
                    RecordKind::Entry => {
                        index.insert(r.entry, (off, used));
                        lac = lac.max(r.lac);
                    }
                    RecordKind::Fence => fenced = true,
                    RecordKind::DeleteLedger => {
                        return Err(BookieError::corrupt(
                            &path,
                            off,
                            "delete record in a ledger log",
                        ));
                    }
                }
            }
            Scanned::End => break file_len,
            Scanned::Bad { off, error } => {
                let reason = match error {
                    RecordError::Short => "record cut short".to_string(),
                    RecordError::Invalid(why) => why,
                };
                if off < synced_len {
                    return Err(BookieError::corrupt(&path, off, reason));
                }
                let padding = file_len - off < DIRECT_ALIGN as u64
                    && scanner.rest_from(off)?.iter().all(|&b| b == 0);
                if !padding {
                    log::warn!(
                        "ledger log {}: cutting {} unsynced bytes at offset {off} ({reason}); journal replay restores them",
                        path.display(),
                        file_len - off
                    );
                }
                file.set_len(off)
                    .map_err(|e| BookieError::io("truncate ledger log", &path, e))?;
                file.sync_all()
                    .map_err(|e| BookieError::io("sync ledger log", &path, e))?;
                break off;
            }
        }
    };
    // The bytes of the last, partly filled block, which the next write writes again.
    let tail_off = block_start(len);
    let mut last_block = vec![0u8; usize::try_from(len - tail_off).unwrap_or(0)];
    file.read_exact_at(&mut last_block, tail_off)
        .map_err(|e| BookieError::io("read ledger log", &path, e))?;
    let mut tail = AlignedBuf::default();
    tail.extend(&last_block);
    let mut log = LedgerLog::new(path, len, tail);
    log.index = index;
    log.lac = lac;
    log.fenced = fenced;
    // Bytes past the checkpointed length may still be only in the page cache: the next
    // flush syncs them.
    log.dirty = len > synced_len;
    log.unindexed = unindexed;
    log.idx_len = idx_len;
    Ok(log)
}

fn read_checkpoint(dir: &Path) -> Result<HashMap<u64, u64>, BookieError> {
    let path = dir.join(CHECKPOINT_FILE);
    let raw = match fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(BookieError::io("read", &path, e)),
    };
    let bad = |why: &str| BookieError::corrupt(&path, 0, why.to_string());
    if raw.len() < 16 || &raw[..8] != CHECKPOINT_MAGIC {
        return Err(bad("bad checkpoint header"));
    }
    let mut b = &raw[8..];
    let crc = b.get_u32();
    let count = b.get_u32();
    if crc32c::crc32c(b) != crc {
        return Err(bad("checkpoint checksum mismatch"));
    }
    let count = usize::try_from(count).map_err(|_| bad("checkpoint count out of range"))?;
    if b.len()
        != count
            .checked_mul(16)
            .ok_or_else(|| bad("checkpoint count out of range"))?
    {
        return Err(bad("checkpoint length does not match its count"));
    }
    let mut out = HashMap::with_capacity(count);
    for _ in 0..count {
        let ledger = b.get_u64();
        let len = b.get_u64();
        out.insert(ledger, len);
    }
    Ok(out)
}

/// Write `CHECKPOINT` atomically: temp file, fsync, rename, fsync the directory.
fn write_checkpoint(dir: &Path, lengths: &HashMap<u64, u64>) -> Result<(), BookieError> {
    let mut body = Vec::with_capacity(lengths.len() * 16);
    for (&ledger, &len) in lengths {
        body.put_u64(ledger);
        body.put_u64(len);
    }
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.put_u32(crc32c::crc32c(&body));
    out.put_u32(
        u32::try_from(lengths.len())
            .map_err(|_| BookieError::Config("too many ledgers for a checkpoint".into()))?,
    );
    out.extend_from_slice(&body);
    let tmp = dir.join(format!("{CHECKPOINT_FILE}.tmp"));
    let path = dir.join(CHECKPOINT_FILE);
    File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(&out)?;
            f.sync_all()
        })
        .map_err(|e| BookieError::io("write", &tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| BookieError::io("rename checkpoint to", &path, e))?;
    sync_dir(dir)
}
