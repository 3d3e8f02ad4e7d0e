//! The bookie server: ADD / ADD_BATCH / READ / READ_LAC / DELETE_LEDGER over TCP.
//!
//! # Theory of operation
//!
//! [`BookieServer::start`] opens the ledger storage, replays the journal into it from the last
//! checkpoint mark, flushes it (a checkpoint: the replayed journal files are then deleted),
//! starts a fresh journal file and binds the listener. Each connection is served by one reader task and one writer task joined
//! by a channel of encoded responses; the writer sends whatever is queued with one write. A
//! frame longer than the configured limit (`max_frame_size`, nettyMaxFrameSizeBytes) closes
//! its connection, the reason logged, before anything is allocated for it; other connections
//! go on.
//!
//! Every mutation is applied to storage, then queued on the journal, and answered only when the
//! journal reports it durable. Adds are answered straight from the journal thread's completion
//! (no task per add); an ADD_BATCH is journaled as one group and answered once. A connection holds at most [`MAX_IN_FLIGHT_BYTES`] of unanswered adds and
//! unwritten responses, after which it is not read until some are written (back-pressure).
//!
//! Fencing: normal adds check the fence flag and queue their journal record under a shared
//! lock; a fence sets the flag and queues its record under the exclusive lock. The journal
//! completes in queue order, so when a fence is durable every add that got past the check
//! before it is durable too, and no normal add can pass the check after it. Only then is the
//! fencing READ / READ_LAC answered.
//!
//! Checkpoints run on their own thread whenever the journal rotates and every
//! `flush_interval` while it moves: take the journal position, flush storage, record the
//! position (`journal/LASTMARK`) and delete the journal files before it. A restart replays only
//! what follows the mark. [`BookieServer::shutdown`] stops accepting, lets every
//! connection finish its in-flight adds, syncs and closes the journal, checkpoints, and returns.
//! Dropping a server without shutdown stops it as a crash would (nothing more is written).

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::cookie;
use crate::entrylog::EntryLogStorage;
use crate::error::BookieError;
use crate::journal::{self, EncodedEntries, Journal, JournalRecord, JournalStats, RecordKind};
use crate::multidir::MultiDirStorage;
use crate::proto::{self, FrameLimit, OpCode, Request, Response, ResponseBody, Status};
use crate::storage::LedgerStorage;

/// Bytes of unanswered adds and unwritten responses one connection may have before it stops
/// being read.
pub const MAX_IN_FLIGHT_BYTES: usize = 64 * 1024 * 1024;
/// How often storage is checkpointed (when the journal has moved) by default, besides at
/// every journal rotation: BookKeeper's flushInterval.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(60);

/// Every this many bytes added to ledger storage, the checkpointer writes them out
/// ([`LedgerStorage::start_writeback`]), off the add path: storage then reaches the disk as
/// a steady trickle, and a flush has at most about this much left to write.
pub const WRITEBACK_BYTES: u64 = 1 << 20;

/// Counts bytes and fires once when they reach a limit, until rearmed by the work it asked
/// for. A limit of 0 never fires.
struct ByteTrigger {
    limit: u64,
    count: AtomicU64,
    fired: AtomicBool,
}

impl ByteTrigger {
    fn new(limit: u64) -> ByteTrigger {
        ByteTrigger { limit, count: AtomicU64::new(0), fired: AtomicBool::new(false) }
    }

    /// Count `bytes`; true the first time the count reaches the limit since the last rearm.
    fn add(&self, bytes: usize) -> bool {
        let total = self.count.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.limit > 0 && total >= self.limit && !self.fired.swap(true, Ordering::Relaxed)
    }

    /// The work is being done: start counting again from zero.
    fn rearm(&self) {
        self.count.store(0, Ordering::Relaxed);
        self.fired.store(false, Ordering::Relaxed);
    }
}

/// What the checkpointer thread is asked to do.
pub(crate) enum Ask {
    /// Checkpoint now: the journal rotated or enough was added.
    Checkpoint,
    /// Start writing out what storage holds only in memory.
    Writeback,
    Stop,
}
/// How long shutdown waits for connections to finish their in-flight requests.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// The writer stops coalescing queued responses into one write past this many bytes.
const MAX_COALESCED_WRITE: usize = 1024 * 1024;
const READ_BUFFER: usize = 64 * 1024;

/// Journal settings, named after BookKeeper's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    /// journalSyncData: fdatasync each group commit before acknowledging (default true).
    pub sync_data: bool,
    /// journalMaxGroupWaitMSec: the longest a record waits for others to share its write (default 2 ms).
    pub max_group_wait: Duration,
    /// journalBufferedWritesThreshold: a group is written once it holds this many bytes (default 512 KiB).
    pub buffered_writes_threshold: usize,
    /// journalMaxSizeMB: a journal file is rotated once it reaches this size (default 2048).
    pub max_size_mb: u64,
    /// journalFlushWhenQueueEmpty: write the group as soon as the queue runs dry instead of
    /// waiting `max_group_wait` for more (default true: the write in progress is the
    /// batching window, see [`crate::journal`]).
    pub flush_when_queue_empty: bool,
    /// journalPreAllocSizeMB: the journal file is extended with zeros this far ahead of the
    /// write position, while the journal is idle (default 16; 0 turns it off), so a group
    /// commit's fdatasync overwrites blocks that already exist and needs no file-system
    /// metadata commit (see [`crate::journal`]).
    pub pre_alloc_size_mb: u64,
    /// flushEntrylogBytes: once this many bytes have been added to ledger storage since
    /// the last flush, the checkpointer flushes (checkpoints) at once, so that storage is
    /// written back steadily rather than in one flood at a journal rotation (default 64 MiB;
    /// 0: only at rotations and every `flush_interval`).
    pub flush_entry_log_bytes: u64,
    /// flushInterval: storage is checkpointed at least this often while the journal moves
    /// (default 60 s, BookKeeper's), besides at rotations and per `flush_entry_log_bytes`;
    /// this bounds how much journal a restart replays.
    pub flush_interval: Duration,
    /// journalMaxBackups: journal files a checkpoint keeps before its mark, newest first,
    /// although replay no longer needs them (default 0; BookKeeper's is 5).
    pub max_backups: u64,
    /// Write the journal with direct I/O where the file system allows it (default true):
    /// records go from the journal's buffer to the disk without a copy into the page cache
    /// (see [`crate::journal`]). Off, or where direct I/O is refused, writes are buffered.
    pub direct_io: bool,
}

impl Default for JournalConfig {
    fn default() -> JournalConfig {
        JournalConfig {
            sync_data: true,
            max_group_wait: Duration::from_millis(2),
            buffered_writes_threshold: 512 * 1024,
            max_size_mb: 2048,
            flush_when_queue_empty: true,
            pre_alloc_size_mb: 16,
            flush_entry_log_bytes: 64 << 20,
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            max_backups: 0,
            direct_io: true,
        }
    }
}

/// Where a bookie keeps its files, where it listens, and how it journals.
#[derive(Debug, Clone)]
pub struct BookieConfig {
    /// Holds `journal/` (journalDirectory), and `ledgers/` unless `ledger_dirs` says.
    pub data_dir: PathBuf,
    /// ledgerDirectories: each holds a `ledgers/` of its own, and a ledger lives wholly in
    /// one of them (see [`crate::multidir`]). Empty: `data_dir` alone.
    pub ledger_dirs: Vec<PathBuf>,
    /// The listen address; port 0 picks a free port (see [`BookieServer::local_addr`]).
    pub bind: SocketAddr,
    pub journal: JournalConfig,
    /// nettyMaxFrameSizeBytes: a connection that sends a frame longer than this is closed,
    /// with the reason logged, before anything is allocated for it.
    pub max_frame_size: FrameLimit,
}

/// The state shared by connections, the checkpointer, in-process callers
/// ([`crate::local`]) and the server handle.
pub(crate) struct Core {
    storage: Arc<dyn LedgerStorage>,
    journal: Journal,
    /// Shared by adds between their fence check and their journal enqueue; exclusive for fences
    /// and for halting.
    order: RwLock<()>,
    halted: AtomicBool,
    data_dir: PathBuf,
    checkpoint_lock: Mutex<()>,
    /// TCP connections accepted since start.
    connections: AtomicU64,
    /// Asks the checkpointer to flush once flushEntrylogBytes were added since the last
    /// flush, and to start writeback every [`WRITEBACK_BYTES`].
    flush_due: ByteTrigger,
    writeback_due: ByteTrigger,
    checkpointer: crossbeam_channel::Sender<Ask>,
    /// journalMaxBackups.
    max_backups: u64,
}

/// Record `mark` as where replay starts, once storage holds everything before it, and
/// delete the journal files before it but the newest `backups` (journalMaxBackups).
fn record_mark(data_dir: &Path, mark: (u64, u64), backups: u64) -> Result<(), BookieError> {
    journal::write_mark(data_dir, mark)?;
    journal::delete_before(data_dir, mark.0.saturating_sub(backups))?;
    Ok(())
}

impl Core {
    /// Take the journal position, flush storage (which then holds every record before that
    /// position), record the position as the replay start, and delete the files before it.
    /// Returns the position checkpointed.
    fn checkpoint(&self) -> Result<(u64, u64), BookieError> {
        let _one = self.checkpoint_lock.lock();
        self.flush_due.rearm();
        let mark = self.journal.position();
        self.storage.flush()?;
        record_mark(&self.data_dir, mark, self.max_backups)?;
        Ok(mark)
    }

    /// Count `bytes` added to storage, and ask the checkpointer for what that makes due.
    fn note_added(&self, bytes: usize) {
        if self.flush_due.add(bytes) {
            let _ = self.checkpointer.send(Ask::Checkpoint);
        }
        if self.writeback_due.add(bytes) {
            let _ = self.checkpointer.send(Ask::Writeback);
        }
    }

    /// Whether an add to `ledger` may proceed: not while shutting down, and not on a fenced
    /// ledger unless it is a recovery add. Called with the `order` lock held, so a fence
    /// cannot slip between this check and the add.
    fn admit(&self, ledger: u64, recovery: bool) -> Result<(), (Status, String)> {
        if self.halted.load(Ordering::SeqCst) {
            return Err((Status::IoError, BookieError::ShuttingDown.to_string()));
        }
        if recovery {
            return Ok(());
        }
        match self.storage.is_fenced(ledger) {
            Ok(false) => Ok(()),
            Ok(true) => Err((Status::Fenced, format!("ledger {ledger} is fenced"))),
            Err(e) => Err((Status::IoError, e.to_string())),
        }
    }

    /// Apply a batch of adds to one ledger and queue them on the journal as one group;
    /// `done` gets the status of the whole batch. The records are encoded once, for the
    /// entry log and the journal alike; a single ADD is a batch of one.
    pub(crate) fn add_batch(
        &self,
        ledger: u64,
        lac: i64,
        entries: Vec<(u64, Bytes)>,
        recovery: bool,
        done: impl FnOnce(Status, String) + Send + 'static,
    ) {
        let guard = self.order.read();
        if let Err((status, reason)) = self.admit(ledger, recovery) {
            drop(guard);
            return done(status, reason);
        }
        let bytes = entries.iter().map(|(_, d)| d.len()).sum();
        let encoded = EncodedEntries::new(ledger, lac, entries);
        if let Err(e) = self.storage.add_encoded(&encoded) {
            drop(guard);
            return done(Status::IoError, e.to_string());
        }
        self.note_added(bytes);
        self.journal.submit_encoded(
            &encoded,
            Box::new(move |r| match r {
                Ok(()) => done(Status::Ok, String::new()),
                Err(e) => done(Status::IoError, e.to_string()),
            }),
        );
        drop(guard);
    }

    /// Fence `ledger` and wait until the fence is durable.
    async fn fence(&self, ledger: u64) -> Result<(), BookieError> {
        let (tx, rx) = oneshot::channel();
        {
            let _exclusive = self.order.write();
            if self.halted.load(Ordering::SeqCst) {
                return Err(BookieError::ShuttingDown);
            }
            self.storage.set_fenced(ledger)?;
            self.journal.submit(
                JournalRecord::fence(ledger),
                Box::new(move |r| drop(tx.send(r))),
            );
        }
        rx.await.map_err(|_| BookieError::ShuttingDown)?
    }

    /// Delete `ledger` and wait until the delete is durable.
    async fn delete_ledger(&self, ledger: u64) -> Result<(), BookieError> {
        let (tx, rx) = oneshot::channel();
        {
            let _exclusive = self.order.write();
            if self.halted.load(Ordering::SeqCst) {
                return Err(BookieError::ShuttingDown);
            }
            self.storage.delete_ledger(ledger)?;
            self.journal.submit(
                JournalRecord::delete_ledger(ledger),
                Box::new(move |r| drop(tx.send(r))),
            );
        }
        rx.await.map_err(|_| BookieError::ShuttingDown)?
    }

    /// READ: the entry, after fencing the ledger durably when `fence` (recovery reads).
    pub(crate) async fn read(
        &self,
        request_id: u64,
        ledger: u64,
        entry: u64,
        fence: bool,
    ) -> Response {
        if fence {
            if let Err(e) = self.fence(ledger).await {
                return Response::error(OpCode::Read, request_id, Status::IoError, e.to_string());
            }
        }
        self.read_entry(request_id, ledger, entry)
    }

    /// READ_LAC, after fencing the ledger durably when `fence`.
    pub(crate) async fn lac(&self, request_id: u64, ledger: u64, fence: bool) -> Response {
        if fence {
            if let Err(e) = self.fence(ledger).await {
                return Response::error(
                    OpCode::ReadLac,
                    request_id,
                    Status::IoError,
                    e.to_string(),
                );
            }
        }
        self.read_lac(request_id, ledger)
    }

    /// DELETE_LEDGER, answered once the delete is durable.
    pub(crate) async fn delete(&self, request_id: u64, ledger: u64) -> Response {
        match self.delete_ledger(ledger).await {
            Ok(()) => Response::ok(OpCode::DeleteLedger, request_id, ResponseBody::Empty),
            Err(e) => Response::error(
                OpCode::DeleteLedger,
                request_id,
                Status::IoError,
                e.to_string(),
            ),
        }
    }

    fn read_entry(&self, request_id: u64, ledger: u64, entry: u64) -> Response {
        let found = self.storage.get_entry(ledger, entry).and_then(|e| match e {
            Some(x) => Ok(Ok(x)),
            None => self.storage.has_ledger(ledger).map(Err),
        });
        match found {
            Ok(Ok((lac, data))) => {
                Response::ok(OpCode::Read, request_id, ResponseBody::Read { lac, data })
            }
            Ok(Err(true)) => Response::error(
                OpCode::Read,
                request_id,
                Status::NoEntry,
                format!("no entry {ledger}:{entry}"),
            ),
            Ok(Err(false)) => Response::error(
                OpCode::Read,
                request_id,
                Status::NoLedger,
                format!("no ledger {ledger}"),
            ),
            Err(e) => {
                log::error!("reading {ledger}:{entry}: {e}");
                Response::error(OpCode::Read, request_id, Status::IoError, e.to_string())
            }
        }
    }

    fn read_lac(&self, request_id: u64, ledger: u64) -> Response {
        match self.storage.lac(ledger) {
            Ok(lac) => Response::ok(
                OpCode::ReadLac,
                request_id,
                ResponseBody::Lac(lac.unwrap_or(-1)),
            ),
            Err(e) => Response::error(OpCode::ReadLac, request_id, Status::IoError, e.to_string()),
        }
    }

    /// Stop all mutation at once, as a crash would.
    fn halt(&self) {
        let _exclusive = self.order.write();
        self.halted.store(true, Ordering::SeqCst);
        self.storage.halt();
    }
}

/// The lock file that keeps two bookies off one data directory.
pub const LOCK_FILE: &str = "LOCK";

/// Take the exclusive lock on `data_dir/LOCK` (creating the directory if needed). The lock is
/// the OS's file lock, so a killed process never leaves it behind.
fn lock_data_dir(data_dir: &Path) -> Result<File, BookieError> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| BookieError::io("create data dir", data_dir, e))?;
    let path = data_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| BookieError::io("open", &path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(BookieError::Locked(data_dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(BookieError::io("lock", &path, e)),
    }
}

/// `dir` with symbolic links and `..` resolved (it exists: it was locked).
fn canonical(dir: &Path) -> Result<PathBuf, BookieError> {
    dir.canonicalize().map_err(|e| BookieError::io("resolve directory", dir, e))
}

/// Apply a replayed journal record to storage.
fn apply_record(storage: &dyn LedgerStorage, r: &JournalRecord) -> Result<(), BookieError> {
    match r.kind {
        RecordKind::Entry => storage.add_entry(r.ledger, r.entry, r.lac, r.data.clone()),
        RecordKind::Fence => storage.set_fenced(r.ledger).map(drop),
        RecordKind::DeleteLedger => storage.delete_ledger(r.ledger).map(drop),
    }
}

/// A running bookie.
pub struct BookieServer {
    local_addr: SocketAddr,
    core: Arc<Core>,
    stop: watch::Sender<bool>,
    serve: Option<tokio::task::JoinHandle<()>>,
    checkpointer: Option<(
        crossbeam_channel::Sender<Ask>,
        std::thread::JoinHandle<()>,
    )>,
    /// The exclusive locks on `LOCK` in each directory; fields drop in order, so these go
    /// last.
    _locks: Vec<File>,
}

impl BookieServer {
    /// Opens storage (replaying the journal), binds (port 0 allowed), starts serving on the
    /// current tokio runtime. Returns once listening. Every directory is locked, and must
    /// carry the cookie of the same bookie (see [`crate::cookie`]).
    pub async fn start(config: BookieConfig) -> Result<BookieServer, BookieError> {
        let mut locks = vec![lock_data_dir(&config.data_dir)?];
        let mut dirs = vec![canonical(&config.data_dir)?];
        let ledger_dirs = if config.ledger_dirs.is_empty() {
            vec![config.data_dir.clone()]
        } else {
            config.ledger_dirs.clone()
        };
        let mut listed = Vec::with_capacity(ledger_dirs.len());
        for dir in &ledger_dirs {
            std::fs::create_dir_all(dir).map_err(|e| BookieError::io("create ledger dir", dir, e))?;
            let resolved = canonical(dir)?;
            if listed.contains(&resolved) {
                return Err(BookieError::Config(format!("ledgerDirectories lists {} twice", dir.display())));
            }
            listed.push(resolved.clone());
            if resolved != dirs[0] {
                // (The journal's own directory is locked already.)
                locks.push(lock_data_dir(dir)?);
                dirs.push(resolved);
            }
        }
        cookie::check_or_create(&dirs)?;
        let storage = tokio::task::spawn_blocking(move || -> Result<Arc<dyn LedgerStorage>, BookieError> {
            if let [only] = &ledger_dirs[..] {
                return Ok(Arc::new(EntryLogStorage::open(only)?));
            }
            let parts = ledger_dirs
                .iter()
                .map(|d| EntryLogStorage::open(d).map(|s| Arc::new(s) as Arc<dyn LedgerStorage>))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(MultiDirStorage::new(parts)))
        })
        .await
        .map_err(|e| BookieError::Config(format!("opening storage: {e}")))??;
        BookieServer::start_locked(config, storage, locks).await
    }

    /// Like [`start`](Self::start), with a ledger storage of the caller's choosing. The journal
    /// still lives under `config.data_dir`; it is replayed into `storage`, which is flushed
    /// before the replayed files are deleted. A volatile storage such as
    /// [`MemStorage`](crate::storage::MemStorage) therefore keeps nothing across a restart:
    /// use it for bookies whose data may go with the process.
    pub async fn start_with_storage(
        config: BookieConfig,
        storage: Arc<dyn LedgerStorage>,
    ) -> Result<BookieServer, BookieError> {
        let lock = lock_data_dir(&config.data_dir)?;
        BookieServer::start_locked(config, storage, vec![lock]).await
    }

    async fn start_locked(
        config: BookieConfig,
        storage: Arc<dyn LedgerStorage>,
        locks: Vec<File>,
    ) -> Result<BookieServer, BookieError> {
        let data_dir = config.data_dir.clone();
        let jconfig = config.journal.clone();
        let (ckpt_tx, ckpt_rx) = crossbeam_channel::unbounded::<Ask>();
        let rotate_tx = ckpt_tx.clone();
        let opened = {
            let storage = storage.clone();
            tokio::task::spawn_blocking(move || -> Result<Journal, BookieError> {
                let outcome = journal::replay(&data_dir, |r| apply_record(&*storage, r))?;
                if outcome.records > 0 {
                    log::info!(
                        "replayed {} journal records from {} files",
                        outcome.records,
                        outcome.files.len()
                    );
                }
                storage.flush()?;
                let next = outcome.next_seq();
                record_mark(&data_dir, (next, 0), jconfig.max_backups)?;
                Journal::open(
                    &data_dir,
                    jconfig,
                    next,
                    Box::new(move |_seq| {
                        let _ = rotate_tx.send(Ask::Checkpoint);
                    }),
                )
            })
            .await
            .map_err(|e| BookieError::Config(format!("replaying journal: {e}")))??
        };
        let core = Arc::new(Core {
            storage,
            journal: opened,
            order: RwLock::new(()),
            halted: AtomicBool::new(false),
            data_dir: config.data_dir.clone(),
            checkpoint_lock: Mutex::new(()),
            connections: AtomicU64::new(0),
            flush_due: ByteTrigger::new(config.journal.flush_entry_log_bytes),
            writeback_due: ByteTrigger::new(WRITEBACK_BYTES),
            checkpointer: ckpt_tx.clone(),
            max_backups: config.journal.max_backups,
        });
        let listener = TcpListener::bind(config.bind)
            .await
            .map_err(|e| BookieError::Io {
                context: format!("cannot listen on {} (bookiePort)", config.bind),
                source: e,
            })?;
        let local_addr = listener.local_addr().map_err(|e| BookieError::Io {
            context: "local_addr".into(),
            source: e,
        })?;
        let ckpt_core = core.clone();
        let flush_interval = config.journal.flush_interval;
        let ckpt_thread = std::thread::Builder::new()
            .name("bookie-checkpoint".into())
            .spawn(move || {
                let mut last = ckpt_core.journal.position();
                // A deadline, not a timeout restarted by every ask: writeback asks come every
                // megabyte, and would otherwise put the periodic checkpoint off for ever.
                let mut due = Instant::now() + flush_interval;
                loop {
                    match ckpt_rx.recv_deadline(due) {
                        // A rotation, or enough added since the last flush.
                        Ok(Ask::Checkpoint) => {}
                        Ok(Ask::Writeback) => {
                            ckpt_core.writeback_due.rearm();
                            ckpt_core.storage.start_writeback();
                            continue;
                        }
                        Err(crossbeam_channel::RecvTimeoutError::Timeout)
                            if ckpt_core.journal.position() != last => {}
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                            due = Instant::now() + flush_interval;
                            continue;
                        }
                        Ok(Ask::Stop) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                    }
                    if ckpt_core.halted.load(Ordering::SeqCst) {
                        break;
                    }
                    match ckpt_core.checkpoint() {
                        Ok(mark) => last = mark,
                        Err(e) => log::error!("checkpoint failed: {e}"),
                    }
                    due = Instant::now() + flush_interval;
                }
            })
            .map_err(|e| BookieError::Io {
                context: "spawn checkpoint thread".into(),
                source: e,
            })?;
        let (stop, stop_rx) = watch::channel(false);
        crate::local::register(&local_addr.to_string(), &core);
        let serve = tokio::spawn(accept_loop(listener, core.clone(), stop_rx, config.max_frame_size));
        log::info!(
            "bookie listening on {local_addr} (frames up to {} bytes)",
            config.max_frame_size.bytes()
        );
        Ok(BookieServer {
            _locks: locks,
            local_addr,
            core,
            stop,
            serve: Some(serve),
            checkpointer: Some((ckpt_tx, ckpt_thread)),
        })
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// TCP connections accepted since start (callers in this process that reach the
    /// bookie through [`crate::local`] make none).
    pub fn connections_accepted(&self) -> u64 {
        self.core.connections.load(Ordering::Relaxed)
    }

    /// What the journal has written since start.
    pub fn journal_stats(&self) -> JournalStats {
        self.core.journal.stats()
    }

    /// The ledgers this bookie holds, in ascending order.
    pub fn ledgers(&self) -> Result<Vec<u64>, BookieError> {
        self.core.storage.ledgers()
    }

    /// Delete `ledger` here (as a DELETE request would), durably. Deleting a ledger this
    /// bookie does not hold is not an error.
    pub async fn delete_ledger(&self, ledger: u64) -> Result<(), BookieError> {
        self.core.delete_ledger(ledger).await
    }

    /// Checkpoint now: flush storage, record the journal position a restart replays from, and
    /// delete the journal files before it. (This also runs by itself on every journal rotation
    /// and every `flush_interval`.)
    pub async fn checkpoint(&self) -> Result<(), BookieError> {
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || core.checkpoint().map(drop))
            .await
            .map_err(|e| BookieError::Config(format!("checkpoint task: {e}")))?
    }

    /// Stops accepting, finishes in-flight adds, syncs the journal and storage, closes files.
    pub async fn shutdown(mut self) -> Result<(), BookieError> {
        crate::local::unregister(&self.local_addr.to_string(), &self.core);
        let _ = self.stop.send(true);
        if let Some(serve) = self.serve.take() {
            let _ = serve.await;
        }
        if let Some((tx, thread)) = self.checkpointer.take() {
            let _ = tx.send(Ask::Stop);
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || -> Result<(), BookieError> {
            let synced = core.journal.shutdown();
            core.halt();
            synced?;
            let mark = core.journal.position();
            core.storage.flush()?;
            record_mark(&core.data_dir, mark, core.max_backups)?;
            Ok(())
        })
        .await
        .map_err(|e| BookieError::Config(format!("shutdown task: {e}")))?
    }
}

impl Drop for BookieServer {
    fn drop(&mut self) {
        // Without shutdown: stop as a crash would. No more storage writes or journal records.
        crate::local::unregister(&self.local_addr.to_string(), &self.core);
        if let Some(serve) = self.serve.take() {
            let _ = self.stop.send(true);
            serve.abort();
            self.core.halt();
            self.core.journal.halt();
        }
        if let Some((tx, thread)) = self.checkpointer.take() {
            let _ = tx.send(Ask::Stop);
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    core: Arc<Core>,
    mut stop: watch::Receiver<bool>,
    max_frame_size: FrameLimit,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    core.connections.fetch_add(1, Ordering::Relaxed);
                    conns.spawn(serve_connection(stream, peer, core.clone(), stop.clone(), max_frame_size));
                }
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        log::warn!(
            "{} connections did not finish within {SHUTDOWN_GRACE:?}; closing them",
            conns.len()
        );
        conns.shutdown().await;
    }
}

/// Encoded responses on their way to the writer, each with the share of the connection's
/// budget it holds until it has been written.
type ResponseTx = mpsc::UnboundedSender<(Bytes, OwnedSemaphorePermit)>;

/// The per-connection budget of unanswered and unwritten bytes: a request takes its share
/// before it is carried out (an add: its payload; a read: its response) and gives it back
/// once its response is on the socket. A peer that sends faster than the bookie answers, or
/// that stops reading its responses, stops being read.
#[derive(Clone)]
struct Budget(Arc<Semaphore>);

impl Budget {
    fn new() -> Budget {
        Budget(Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES)))
    }

    /// Wait for `bytes` of budget (at least 1, at most the whole budget); `None` once closed.
    async fn take(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let weight = u32::try_from(bytes.clamp(1, MAX_IN_FLIGHT_BYTES)).unwrap_or(u32::MAX);
        self.0.clone().acquire_many_owned(weight).await.ok()
    }
}

fn encode_response(resp: &Response) -> Bytes {
    let mut buf = BytesMut::new();
    match resp.encode(&mut buf) {
        Ok(()) => buf.freeze(),
        Err(e) => {
            log::error!("cannot encode response {}: {e}", resp.request_id);
            let mut buf = BytesMut::new();
            let fallback =
                Response::error(resp.op, resp.request_id, Status::IoError, e.to_string());
            match fallback.encode(&mut buf) {
                Ok(()) => buf.freeze(),
                Err(_) => Bytes::new(),
            }
        }
    }
}

fn send_response(tx: &ResponseTx, resp: &Response, permit: OwnedSemaphorePermit) {
    let _ = tx.send((encode_response(resp), permit));
}

/// Send a response computed now, taking its share of the budget first.
async fn answer(tx: &ResponseTx, budget: &Budget, resp: &Response) -> bool {
    let frame = encode_response(resp);
    match budget.take(frame.len()).await {
        Some(permit) => tx.send((frame, permit)).is_ok(),
        None => false,
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    core: Arc<Core>,
    mut stop: watch::Receiver<bool>,
    max_frame_size: FrameLimit,
) {
    if let Err(e) = stream.set_nodelay(true) {
        log::debug!("{peer}: set_nodelay: {e}");
    }
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_loop(wr, rx, peer));
    let budget = Budget::new();
    let mut buf = BytesMut::with_capacity(READ_BUFFER);
    'conn: loop {
        loop {
            let body = match proto::decode_frame_within(&mut buf, max_frame_size) {
                Ok(Some(body)) => body,
                Ok(None) => break,
                Err(e) => {
                    log::warn!("{peer}: closing connection: {e}");
                    break 'conn;
                }
            };
            let handled = tokio::select! {
                _ = stop.changed() => false,
                ok = handle_frame(body, &core, &tx, &budget, peer) => ok,
            };
            if !handled {
                break 'conn;
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(READ_BUFFER);
        }
        tokio::select! {
            _ = stop.changed() => break,
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    log::debug!("{peer}: read: {e}");
                    break;
                }
            },
        }
    }
    // In-flight completions hold clones of `tx`; the writer ends once they have all answered.
    drop(tx);
    let _ = writer.await;
}

/// Handle one request frame. Returns false when the connection must be closed.
async fn handle_frame(
    body: Bytes,
    core: &Arc<Core>,
    tx: &ResponseTx,
    budget: &Budget,
    peer: SocketAddr,
) -> bool {
    let request = match Request::decode(body.clone()) {
        Ok(r) => r,
        Err(e) => {
            return match proto::peek_header(&body) {
                Ok((op, request_id)) => {
                    log::warn!("{peer}: bad {op:?} request {request_id}: {e}");
                    answer(
                        tx,
                        budget,
                        &Response::error(op, request_id, Status::BadRequest, e.to_string()),
                    )
                    .await
                }
                Err(_) => {
                    log::warn!("{peer}: closing connection: {e}");
                    false
                }
            };
        }
    };
    match request {
        Request::Add {
            request_id,
            ledger,
            entry,
            lac,
            recovery,
            data,
        } => {
            let Some(permit) = budget.take(data.len()).await else {
                return false;
            };
            let tx = tx.clone();
            // A single add is a batch of one: its record is encoded once, for the entry
            // log and the journal alike.
            core.add_batch(
                ledger,
                lac,
                vec![(entry, data)],
                recovery,
                move |status, message| {
                    let resp = if status == Status::Ok {
                        Response::ok(OpCode::Add, request_id, ResponseBody::Empty)
                    } else {
                        Response::error(OpCode::Add, request_id, status, message)
                    };
                    send_response(&tx, &resp, permit);
                },
            );
            true
        }
        Request::AddBatch {
            request_id,
            ledger,
            lac,
            recovery,
            entries,
        } => {
            let bytes = entries.iter().map(|(_, d)| d.len()).sum();
            let Some(permit) = budget.take(bytes).await else {
                return false;
            };
            let tx = tx.clone();
            core.add_batch(ledger, lac, entries, recovery, move |status, message| {
                let resp = if status == Status::Ok {
                    Response::ok(OpCode::AddBatch, request_id, ResponseBody::Empty)
                } else {
                    Response::error(OpCode::AddBatch, request_id, status, message)
                };
                send_response(&tx, &resp, permit);
            });
            true
        }
        Request::Read {
            request_id,
            ledger,
            entry,
            fence: false,
        } => answer(tx, budget, &core.read_entry(request_id, ledger, entry)).await,
        Request::ReadLac {
            request_id,
            ledger,
            fence: false,
        } => answer(tx, budget, &core.read_lac(request_id, ledger)).await,
        Request::Read {
            request_id,
            ledger,
            entry,
            fence: true,
        } => {
            let core = core.clone();
            answer_later(tx, budget, async move {
                core.read(request_id, ledger, entry, true).await
            })
        }
        Request::ReadLac {
            request_id,
            ledger,
            fence: true,
        } => {
            let core = core.clone();
            answer_later(tx, budget, async move {
                core.lac(request_id, ledger, true).await
            })
        }
        Request::DeleteLedger { request_id, ledger } => {
            let core = core.clone();
            answer_later(
                tx,
                budget,
                async move { core.delete(request_id, ledger).await },
            )
        }
    }
}

/// Answer with what `response` resolves to, from a task of its own, so that the connection
/// goes on reading meanwhile. Returns true (the connection stays open).
fn answer_later(
    tx: &ResponseTx,
    budget: &Budget,
    response: impl std::future::Future<Output = Response> + Send + 'static,
) -> bool {
    let (tx, budget) = (tx.clone(), budget.clone());
    tokio::spawn(async move {
        answer(&tx, &budget, &response.await).await;
    });
    true
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<(Bytes, OwnedSemaphorePermit)>,
    peer: SocketAddr,
) {
    let mut batch = BytesMut::new();
    let mut permits = Vec::new();
    while let Some((first, permit)) = rx.recv().await {
        permits.push(permit);
        let res = if first.len() >= MAX_COALESCED_WRITE {
            wr.write_all(&first).await
        } else {
            batch.clear();
            batch.extend_from_slice(&first);
            while batch.len() < MAX_COALESCED_WRITE {
                match rx.try_recv() {
                    Ok((more, permit)) => {
                        batch.extend_from_slice(&more);
                        permits.push(permit);
                    }
                    Err(_) => break,
                }
            }
            wr.write_all(&batch).await
        };
        // Written: give the budget back.
        permits.clear();
        if let Err(e) = res {
            log::debug!("{peer}: write: {e}");
            return;
        }
    }
    let _ = wr.shutdown().await;
}
