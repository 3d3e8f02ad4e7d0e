//! The one error type of the ledger client.

use magnetar_meta::MetaError;

/// What a ledger operation can fail with.
///
/// Errors are cheap to clone: a handle that breaks hands the same error to every add that
/// was waiting on it and to every later add.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Fewer healthy bookies are registered than the ensemble (or a replacement) needs.
    #[error("Not enough non-faulty bookies available")]
    NotEnoughBookies,
    /// Another client opened the ledger for recovery; this writer may add nothing more.
    #[error("ledger is fenced: another client has opened it for recovery")]
    Fenced,
    /// No metadata exists for the ledger.
    #[error("no such ledger: {0}")]
    NoSuchLedger(u64),
    /// The ledger (or this handle) is closed for writing.
    #[error("ledger is closed")]
    LedgerClosed,
    /// The handle was opened for reading; it cannot add entries.
    #[error("ledger handle is read-only")]
    ReadOnly,
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] MetaError),
    /// A stored ledger metadata record could not be understood.
    #[error("bad ledger metadata at {path}: {reason}")]
    BadMetadata { path: String, reason: String },
    /// A bookie answered with an error, or could not be reached.
    #[error("bookie error: {0}")]
    Bookie(String),
    /// A bookie request did not complete within the request timeout.
    #[error("bookie request timed out")]
    Timeout,
    /// No bookie of the entry's write set holds it.
    #[error("entry {entry} of ledger {ledger} not found on any bookie")]
    NoSuchEntry { ledger: u64, entry: u64 },
    /// A read asked for entries past the last add confirmed.
    #[error("entries {first}..={last} go past the last add confirmed ({lac})")]
    ReadBeyondLac { first: u64, last: u64, lac: i64 },
    /// A stored entry failed its checksum or framing check.
    #[error("corrupt entry {entry} of ledger {ledger}: {reason}")]
    CorruptEntry { ledger: u64, entry: u64, reason: String },
    /// Recovery could not establish the ledger's last entry.
    #[error("recovery of ledger {ledger} failed: {reason}")]
    Recovery { ledger: u64, reason: String },
    /// An entry too large for one bookie frame under the client's limit
    /// (nettyMaxFrameSizeBytes); the add is refused, and the ledger goes on.
    #[error("entry of {size} bytes does not fit one bookie frame: at most {max} bytes of payload fit a frame of {frame} bytes (nettyMaxFrameSizeBytes)")]
    EntryTooLarge { size: usize, max: usize, frame: usize },
    /// The arguments of a call make no sense (quorum sizes, entry ranges).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The async runtime could not run a task to completion.
    #[error("runtime: {0}")]
    Runtime(String),
}

/// Result alias of this crate.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;
