//! How the ledger client talks to bookies.
//!
//! [`BookieTransport`] is the four requests the client needs, addressed by a bookie's
//! `host:port`. The production implementation is [`crate::BookiePool`] (one TCP client per
//! bookie, reconnected on demand); [`crate::mem::MemBookies`] keeps bookies in memory for
//! tests of code that sits on top of ledgers.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use crate::error::LedgerError;

/// A boxed, sendable future, the return type of [`BookieTransport`] methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What one bookie request can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookieError {
    /// The connection failed or broke.
    #[error("i/o: {0}")]
    Io(String),
    /// The client connection is closed.
    #[error("connection closed")]
    Closed,
    /// No answer within the request timeout.
    #[error("request timed out")]
    Timeout,
    /// The ledger is fenced on this bookie.
    #[error("ledger fenced")]
    Fenced,
    /// The bookie does not hold the entry.
    #[error("no such entry")]
    NoEntry,
    /// The bookie does not hold the ledger.
    #[error("no such ledger")]
    NoLedger,
    /// The bookie rejected the request as malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The bookie failed while serving the request.
    #[error("server error: {0}")]
    Server(String),
}

impl BookieError {
    /// Whether the error says the bookie is unusable (as opposed to an answer about data).
    /// Such errors trigger an ensemble change on the write path.
    pub fn is_bookie_failure(&self) -> bool {
        matches!(self, Self::Io(_) | Self::Closed | Self::Timeout | Self::Server(_))
    }

    /// Whether the bookie answered that it does not have what was asked for.
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::NoEntry | Self::NoLedger)
    }
}

impl From<BookieError> for LedgerError {
    fn from(e: BookieError) -> Self {
        match e {
            BookieError::Fenced => LedgerError::Fenced,
            BookieError::Timeout => LedgerError::Timeout,
            other => LedgerError::Bookie(other.to_string()),
        }
    }
}

/// An entry as a bookie returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadEntry {
    /// The last add confirmed the bookie knows of for the ledger.
    pub lac: i64,
    /// The stored bytes (the framed entry, see [`crate::entry`]).
    pub data: Bytes,
}

/// The bookie requests the ledger client makes. Every method addresses one bookie by its
/// `host:port` and is expected to give up after the configured request timeout.
pub trait BookieTransport: Send + Sync + 'static {
    /// Store `data` as entry `entry` of `ledger`, piggybacking the writer's last add
    /// confirmed `lac`. `recovery` adds are accepted even when the ledger is fenced.
    fn add(
        &self,
        addr: &str,
        ledger: u64,
        entry: u64,
        lac: i64,
        data: Bytes,
        recovery: bool,
    ) -> BoxFuture<'_, Result<(), BookieError>>;

    /// Store each `(entry id, data)` of `entries` in `ledger`, as [`add`](Self::add) would
    /// for each, in one request where the transport can. Resolves once all are stored; an
    /// error means none of them may be counted as stored on this bookie. The default sends
    /// the adds one after another.
    fn add_batch(
        &self,
        addr: &str,
        ledger: u64,
        lac: i64,
        entries: Vec<(u64, Bytes)>,
        recovery: bool,
    ) -> BoxFuture<'_, Result<(), BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            for (entry, data) in entries {
                self.add(&addr, ledger, entry, lac, data, recovery).await?;
            }
            Ok(())
        })
    }

    /// Read entry `entry` of `ledger`; with `fence`, fence the ledger on the bookie first.
    fn read(&self, addr: &str, ledger: u64, entry: u64, fence: bool) -> BoxFuture<'_, Result<ReadEntry, BookieError>>;

    /// The last add confirmed the bookie knows of for `ledger` (-1 when it holds nothing);
    /// with `fence`, fence the ledger on the bookie first.
    fn read_lac(&self, addr: &str, ledger: u64, fence: bool) -> BoxFuture<'_, Result<i64, BookieError>>;

    /// Drop everything the bookie holds for `ledger`.
    fn delete_ledger(&self, addr: &str, ledger: u64) -> BoxFuture<'_, Result<(), BookieError>>;
}
