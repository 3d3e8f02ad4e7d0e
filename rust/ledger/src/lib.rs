//! The ledger client: BookKeeper-style replicated logs on a set of bookies.
//!
//! A ledger is an append-only sequence of entries with one writer. Each entry is striped
//! over an *ensemble* of `E` bookies, written to a *write quorum* of `Qw` of them
//! (`ensemble[(entry + k) % E]`, `k < Qw`) and confirmed once an *ack quorum* of `Qa`
//! have stored it. Confirmations advance the *last add confirmed* (LAC) strictly in entry
//! order; every add carries the writer's current LAC to the bookies.
//!
//! - [`BookKeeper`] creates, opens (optionally with fencing and recovery) and deletes
//!   ledgers; it keeps ledger metadata in a [`magnetar_meta::MetadataStore`] (layout in
//!   [`metadata`]) and talks to bookies through a [`BookieTransport`] — TCP via
//!   [`BookiePool`] by default, or in memory via [`mem::MemBookies`].
//! - [`LedgerHandle`] adds (one at a time or pipelined), reads and closes; on a bookie
//!   failure the writer changes its ensemble and goes on without losing an acknowledged
//!   entry.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use magnetar_meta::{MemStore, MetadataStore};
//! use magnetar_ledger::{mem::MemBookies, BookKeeper, ClientConfig, LedgerError};
//!
//! # tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap().block_on(async {
//! let store = Arc::new(MemStore::default());
//! let bookies = Arc::new(MemBookies::new());
//! for addr in ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"] {
//!     bookies.add_bookie(addr);
//!     store.put(&format!("/ledgers/available/{addr}"), b"", None).unwrap();
//! }
//! let bk = BookKeeper::with_transport(store, ClientConfig::default(), bookies);
//!
//! let writer = bk.create_ledger(3, 2, 2, BTreeMap::new()).await?;
//! let ids = writer.add_entries(vec![Bytes::from("a"), Bytes::from("b"), Bytes::from("c")]).await?;
//! assert_eq!(ids, vec![0, 1, 2]);
//! assert_eq!(writer.last_add_confirmed(), 2);
//!
//! // Another client takes over: the writer is fenced, the ledger closed at entry 2.
//! let reader = bk.open_ledger(writer.id(), true).await?;
//! assert_eq!(reader.metadata().last_entry_id, 2);
//! assert_eq!(writer.add_entry(Bytes::from("d")).await, Err(LedgerError::Fenced));
//! let entries = reader.read_entries(0, 2).await?;
//! assert_eq!(entries[1], (1, Bytes::from("b")));
//! # Ok::<(), LedgerError>(())
//! # }).unwrap();
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod client;
pub mod entry;
mod error;
mod handle;
pub mod mem;
mod meta_client;
pub mod metadata;
mod pool;
pub mod quorum;
mod recovery;
mod rereplicate;
mod transport;
mod writer;

pub use client::{BookKeeper, ClientConfig};
pub use error::{LedgerError, Result};
pub use handle::{read_from_replicas, LedgerHandle, ReplicaFailure};
pub use metadata::{LedgerMetadata, LedgerState};
pub use pool::BookiePool;
pub use rereplicate::Replacement;
pub use transport::{BookieError, BookieTransport, BoxFuture, ReadEntry};
