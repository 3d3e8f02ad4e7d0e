//! The bookie's error type (server, journal and storage).

use std::path::{Path, PathBuf};

/// What opening, serving or storing can fail with.
#[derive(Debug, thiserror::Error)]
pub enum BookieError {
    /// An operating-system I/O call failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A file holds a record that fails its checksum or does not parse, and it is not a torn
    /// tail that may safely be dropped.
    #[error("corrupt record in {} at offset {offset}: {reason}", file.display())]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The journal stopped after an I/O failure; nothing more can be made durable.
    #[error("journal failed: {0}")]
    JournalFailed(String),
    /// The bookie is shutting down and takes no new work.
    #[error("bookie is shutting down")]
    ShuttingDown,
    /// Another bookie (in this process or another) holds the data directory.
    #[error("data directory {} is in use by another bookie", .0.display())]
    Locked(PathBuf),
    /// The configuration cannot be used.
    #[error("invalid bookie configuration: {0}")]
    Config(String),
}

impl BookieError {
    /// An I/O error with what we were doing and on which path.
    pub(crate) fn io(what: &str, path: &Path, source: std::io::Error) -> BookieError {
        BookieError::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }

    /// A corruption report for `file` at `offset`.
    pub(crate) fn corrupt(file: &Path, offset: u64, reason: impl Into<String>) -> BookieError {
        BookieError::Corrupt {
            file: file.to_path_buf(),
            offset,
            reason: reason.into(),
        }
    }
}
