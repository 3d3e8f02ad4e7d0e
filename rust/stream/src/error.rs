//! The one error type of this crate.

use magnetar_meta::MetaError;

use crate::store::LedgerStoreError;

/// What a managed-ledger, cursor or dispatcher operation can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The ledger layer failed (bookies unavailable, fenced ledger, missing ledger, ...).
    #[error("ledger error: {0}")]
    Ledger(#[from] LedgerStoreError),
    /// The metadata store failed.
    #[error("metadata error: {0}")]
    Metadata(#[from] MetaError),
    /// Another owner changed the managed ledger's metadata: this instance must stop writing.
    #[error("managed ledger {0} is fenced: its metadata was changed by another owner")]
    Fenced(String),
    /// The managed ledger (or the cursor's managed ledger) has been closed or deleted.
    #[error("managed ledger {0} is closed")]
    Closed(String),
    /// Data read back from a ledger or the metadata store does not decode.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// A position that does not exist in this managed ledger, or is out of range for the call.
    #[error("invalid position: {0}")]
    InvalidPosition(String),
    /// An argument the call cannot accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A cursor name that this managed ledger does not have.
    #[error("no cursor named {0}")]
    NoSuchCursor(String),
    /// An exclusive subscription already has a consumer.
    #[error("Exclusive consumer is already connected: {0}")]
    ConsumerBusy(String),
    /// A consumer id that the dispatcher does not know.
    #[error("no consumer with id {0}")]
    UnknownConsumer(u64),
    /// A consumer id that the dispatcher already has.
    #[error("consumer id {0} is already attached")]
    DuplicateConsumer(u64),
    /// Key-shared: the consumer's hash ranges overlap another consumer's, or its mode does
    /// not match the subscription's.
    #[error("key-shared: {0}")]
    KeySharedConflict(String),
}

/// Shorthand used across the crate.
pub type Result<T, E = StreamError> = std::result::Result<T, E>;
