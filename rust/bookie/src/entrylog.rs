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
//! Appends are not fsynced (the journal makes adds durable); [`LedgerStorage::flush`] fsyncs
//! every log written since the previous flush and the directory, and then records each log's
//! synced length in `ledgers/CHECKPOINT`. On open, bytes past a log's recorded length were
//! never covered by a checkpoint, so they are still in the journal: a bad record there (a write
//! torn by a crash) is cut off, with a warning, together with everything after it, and journal
//! replay writes those entries again. A bad record inside the checkpointed part is corruption:
//! opening fails and names the file and offset. Deleting a ledger first drops it from
//! `CHECKPOINT`, so a later log under the same id is never judged by the old one's length.
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

use std::collections::{BTreeMap, HashMap};
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
    parse_record, sync_dir, EncodedEntries, JournalRecord, RecordError, RecordKind, RecordScanner, Scanned,
};
use crate::logindex::{self, IdxRecord};
use crate::storage::LedgerStorage;

/// The subdirectory of the data dir that holds ledger logs.
pub const LEDGERS_DIR: &str = "ledgers";
/// The file recording each log's length as of the last flush.
const CHECKPOINT_FILE: &str = "CHECKPOINT";
const CHECKPOINT_MAGIC: &[u8; 8] = b"MGBKCKP1";

/// How many ledger logs [`EntryLogStorage::open`] keeps open at most by default.
pub const DEFAULT_MAX_OPEN_LOGS: usize = 256;

struct LedgerLog {
    path: PathBuf,
    /// Closed (None) when idle, to bound the number of open files; reopened on use.
    file: Option<Arc<File>>,
    last_used: u64,
    len: u64,
    /// Where the last [`LedgerStorage::start_writeback`] left off: bytes before it are
    /// being, or have been, written out.
    written_back: u64,
    index: BTreeMap<u64, (u64, usize)>,
    lac: i64,
    fenced: bool,
    dirty: bool,
    deleted: bool,
    /// Records appended (or found by a scan) that the index file does not list yet.
    unindexed: Vec<IdxRecord>,
    /// Valid bytes of the index file; the next chunk goes here.
    idx_len: u64,
    /// False once writing the index failed: it is removed and rebuilt by the next open.
    idx_ok: bool,
}

impl LedgerLog {
    /// Append records already encoded in the record format, with one write.
    fn append_encoded(&mut self, file: &File, entries: &EncodedEntries) -> Result<(), BookieError> {
        let base = self.len;
        file.write_all_at(&entries.encoded, base)
            .map_err(|e| BookieError::io("append to", &self.path, e))?;
        self.len += entries.encoded.len() as u64;
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
        Ok(())
    }

    fn append(&mut self, file: &File, record: &JournalRecord) -> Result<(u64, usize), BookieError> {
        let mut buf = Vec::with_capacity(record.encoded_len());
        record.encode(&mut buf);
        let off = self.len;
        file.write_all_at(&buf, off)
            .map_err(|e| BookieError::io("append to", &self.path, e))?;
        self.len += buf.len() as u64;
        self.dirty = true;
        self.unindexed.push(IdxRecord {
            kind: record.kind,
            entry: record.entry,
            lac: record.lac,
            off,
            len: u32::try_from(buf.len()).unwrap_or(u32::MAX),
        });
        Ok((off, buf.len()))
    }

    /// Write the records not yet in the index file as one chunk. Called after the log has
    /// been fsynced, with the log locked (so a delete cannot interleave).
    fn write_index(&mut self, idx: &Path, upto: usize) {
        if !self.idx_ok || upto == 0 {
            return;
        }
        let chunk = logindex::encode_chunk(&self.unindexed[..upto]);
        match logindex::append_chunk(idx, self.idx_len, &chunk) {
            Ok(()) => {
                self.idx_len += chunk.len() as u64;
                self.unindexed.drain(..upto);
            }
            Err(e) => {
                log::warn!(
                    "index {}: {e}; the log will be scanned on the next open",
                    idx.display()
                );
                self.idx_ok = false;
                self.unindexed.clear();
                if let Err(e) = logindex::remove(idx) {
                    log::warn!("index {}: cannot remove: {e}", idx.display());
                }
            }
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
    max_open: usize,
    open_files: AtomicUsize,
    tick: AtomicU64,
}

impl EntryLogStorage {
    /// Open (creating if needed) the storage under `data_dir/ledgers`, rebuilding the
    /// in-memory index from the index files and verifying every log past them (see the module
    /// docs). Keeps at most [`DEFAULT_MAX_OPEN_LOGS`] logs open.
    pub fn open(data_dir: &Path) -> Result<EntryLogStorage, BookieError> {
        EntryLogStorage::open_with_limit(data_dir, DEFAULT_MAX_OPEN_LOGS)
    }

    /// Like [`open`](Self::open), keeping at most about `max_open_logs` log files open: past
    /// that, the least recently used are closed and reopened when next needed.
    pub fn open_with_limit(
        data_dir: &Path,
        max_open_logs: usize,
    ) -> Result<EntryLogStorage, BookieError> {
        let dir = data_dir.join(LEDGERS_DIR);
        fs::create_dir_all(&dir).map_err(|e| BookieError::io("create ledgers dir", &dir, e))?;
        let synced = read_checkpoint(&dir)?;
        let mut ledgers = HashMap::new();
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
            ledgers.insert(ledger, Arc::new(Mutex::new(log)));
        }
        Ok(EntryLogStorage {
            dir,
            ledgers: RwLock::new(ledgers),
            dir_dirty: AtomicBool::new(true),
            checkpointed: Mutex::new(synced),
            flush_lock: Mutex::new(()),
            max_open: max_open_logs.max(1),
            open_files: AtomicUsize::new(0),
            tick: AtomicU64::new(0),
        })
    }

    /// How many log files are held open now.
    pub fn open_files(&self) -> usize {
        self.open_files.load(Ordering::SeqCst)
    }

    /// The log's file handle, reopening it if it was closed while idle.
    fn handle(&self, log: &mut LedgerLog) -> Result<Arc<File>, BookieError> {
        log.last_used = self.tick.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &log.file {
            return Ok(f.clone());
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log.path)
            .map_err(|e| BookieError::io("open ledger log", &log.path, e))?;
        let file = Arc::new(file);
        log.file = Some(file.clone());
        if self.open_files.fetch_add(1, Ordering::SeqCst) + 1 > self.max_open {
            self.close_idle();
        }
        Ok(file)
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
                    .filter(|g| g.file.is_some())
                    .map(|g| g.last_used)?;
                Some((used, l))
            })
            .collect();
        open.sort_unstable_by_key(|(used, _)| *used);
        let target = self.max_open - self.max_open / 4;
        let excess = self.open_files().saturating_sub(target);
        for (_, l) in open.into_iter().take(excess) {
            if let Some(mut g) = l.try_lock() {
                if g.file.take().is_some() {
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
                            let log = Arc::new(Mutex::new(LedgerLog {
                                path,
                                file: None,
                                last_used: 0,
                                len: 0,
                                written_back: 0,
                                index: BTreeMap::new(),
                                lac: -1,
                                fenced: false,
                                dirty: true,
                                deleted: false,
                                unindexed: Vec::new(),
                                idx_len: 0,
                                idx_ok: true,
                            }));
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
            return f(&mut guard);
        }
    }
}

impl LedgerStorage for EntryLogStorage {
    fn add_entry(&self, ledger: u64, entry: u64, lac: i64, data: Bytes) -> Result<(), BookieError> {
        let record = JournalRecord::entry(ledger, entry, lac, data);
        self.with_log(ledger, |log| {
            let file = self.handle(log)?;
            let at = log.append(&file, &record)?;
            log.index.insert(entry, at);
            log.lac = log.lac.max(lac);
            Ok(())
        })
    }

    fn add_encoded(&self, entries: &EncodedEntries) -> Result<(), BookieError> {
        self.with_log(entries.ledger, |log| {
            let file = self.handle(log)?;
            log.append_encoded(&file, entries)
        })
    }

    fn get_entry(&self, ledger: u64, entry: u64) -> Result<Option<(i64, Bytes)>, BookieError> {
        let Some(log) = self.get(ledger) else {
            return Ok(None);
        };
        let (file, path, off, len) = {
            let mut g = log.lock();
            match g.index.get(&entry) {
                Some(&(off, len)) => (self.handle(&mut g)?, g.path.clone(), off, len),
                None => return Ok(None),
            }
        };
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, off)
            .map_err(|e| BookieError::io("read ledger log", &path, e))?;
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
        Ok(self
            .get(ledger)
            .and_then(|l| l.lock().index.keys().next_back().copied()))
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
            let file = self.handle(log)?;
            log.append(&file, &JournalRecord::fence(ledger))?;
            log.fenced = true;
            Ok(false)
        })
    }

    fn is_fenced(&self, ledger: u64) -> Result<bool, BookieError> {
        Ok(self.get(ledger).is_some_and(|l| l.lock().fenced))
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
        if g.file.take().is_some() {
            self.open_files.fetch_sub(1, Ordering::SeqCst);
        }
        match fs::remove_file(&g.path) {
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
            let (file, path, len, dirty, upto) = {
                let mut g = log.lock();
                if g.deleted {
                    continue;
                }
                (
                    g.file.clone(),
                    g.path.clone(),
                    g.len,
                    std::mem::replace(&mut g.dirty, false),
                    g.unindexed.len(),
                )
            };
            if dirty {
                // A log closed while idle is synced through a fresh handle: fsync covers the
                // file, not the descriptor.
                let synced = match file {
                    Some(f) => f.sync_data(),
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
            if upto > 0 {
                let mut g = log.lock();
                if !g.deleted {
                    g.write_index(&logindex::idx_path(&self.dir, ledger), upto);
                }
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
        Ok(())
    }

    fn start_writeback(&self) {
        let logs: Vec<Arc<Mutex<LedgerLog>>> = self.ledgers.read().values().cloned().collect();
        for log in logs {
            // The log is unlocked while the kernel is asked, so appends go on meanwhile. A log
            // closed while idle is left to the flush.
            let (file, from, to) = {
                let mut g = log.lock();
                match g.file.clone() {
                    Some(f) if !g.deleted && g.len > g.written_back => {
                        let (from, to) = (g.written_back, g.len);
                        g.written_back = to;
                        (f, from, to)
                    }
                    _ => continue,
                }
            };
            start_writeback_range(&file, from, to);
        }
    }
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
    let mut index = BTreeMap::new();
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
                log::warn!(
                    "ledger log {}: cutting {} unsynced bytes at offset {off} ({reason}); journal replay restores them",
                    path.display(),
                    file_len - off
                );
                file.set_len(off)
                    .map_err(|e| BookieError::io("truncate ledger log", &path, e))?;
                file.sync_all()
                    .map_err(|e| BookieError::io("sync ledger log", &path, e))?;
                break off;
            }
        }
    };
    Ok(LedgerLog {
        path,
        file: None,
        last_used: 0,
        len,
        written_back: len,
        index,
        lac,
        fenced,
        // Bytes past the checkpointed length may still be only in the page cache: the next
        // flush syncs them.
        dirty: len > synced_len,
        deleted: false,
        unindexed,
        idx_len,
        idx_ok: true,
    })
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
