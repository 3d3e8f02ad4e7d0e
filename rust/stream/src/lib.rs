//! Managed ledgers, durable cursors and subscription dispatchers.
//!
//! A topic's messages live in a [`ManagedLedger`]: an ordered stream of entries spread
//! over a sequence of ledgers (rolled over as they fill, trimmed once every durable
//! cursor has consumed them and retention allows). Every entry carries broker entry
//! metadata: its publish time and the cumulative index of its last message, which gives
//! each topic a monotonic message offset. Subscriptions read and acknowledge through
//! [`Cursor`]s, whose acknowledgement state survives restarts.
//!
//! The crate knows no messaging protocol: ledgers come through the [`LedgerStore`] trait
//! ([`MemLedgerStore`] in memory, [`BookKeeperStore`] over the replicated ledger client),
//! records go to a [`magnetar_meta::MetadataStore`]:
//!
//! | path | record |
//! | --- | --- |
//! | `/managed-ledgers/<name>` | [`records::MlRecord`]: the ledgers with entries, size, close time, first index |
//! | `/managed-ledgers/<name>/<escaped cursor>` | [`records::CursorRecord`]: mark-delete, deleted ranges, properties |
//!
//! Where things are: `managed_ledger.rs` (open/recovery, reads, close, delete),
//! `append.rs` (the write queue, rollover, ledger failure), `find.rs` (by index, by
//! publish time), `trim.rs` (retention), `cursor.rs`, `ranges.rs` (acknowledged ranges),
//! `entry.rs` (the broker entry metadata header), [`dispatch`] (who gets which entry).
//!
//! A broker calls [`ManagedLedger::check_rollover`] and [`ManagedLedger::trim`] on a timer
//! (Pulsar's ledger rollover and retention checks); everything else happens on demand.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use magnetar_meta::MemStore;
//! use magnetar_stream::{InitialPosition, ManagedLedgerConfig, ManagedLedgerFactory, MemLedgerStore};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let factory = ManagedLedgerFactory::new(Arc::new(MemStore::default()), Arc::new(MemLedgerStore::new()));
//! let ml = factory.open("public/default/persistent/orders", ManagedLedgerConfig::default()).await.unwrap();
//! let cursor = ml.open_cursor("sub", InitialPosition::Earliest).await.unwrap();
//!
//! let added = ml.add_entries(vec![(Bytes::from("a batch of 3"), 3), (Bytes::from("one"), 1)]).await.unwrap();
//! assert_eq!(added[0].index, 2);
//! assert_eq!(added[1].index, 3);
//!
//! let entries = cursor.read_entries(10).await.unwrap();
//! assert_eq!(entries.len(), 2);
//! assert_eq!(&entries[1].data[..], b"one");
//! cursor.mark_delete(entries[1].position).await.unwrap();
//! assert_eq!(cursor.number_of_entries_in_backlog(), 0);
//! assert_eq!(ml.find_position_by_index(1).await.unwrap(), added[0].position);
//! ml.close().await.unwrap();
//! # });
//! ```

mod append;
mod bookkeeper;
mod cache;
pub mod config;
pub mod cursor;
pub mod dispatch;
pub mod entry;
pub mod error;
mod factory;
mod find;
pub mod managed_ledger;
pub mod position;
pub mod ranges;
pub mod records;
pub mod store;
mod trim;

pub use append::{AddCallback, MAX_ROUND_ENTRIES};
pub use bookkeeper::BookKeeperStore;
pub use cache::CacheBudget;
pub use config::{Clock, ManagedLedgerConfig, ManualClock, SystemClock};
pub use cursor::{Cursor, InitialPosition};
pub use entry::{Entry, EntryHeader};
pub use error::{Result, StreamError};
pub use factory::ManagedLedgerFactory;
pub use managed_ledger::{AddResult, ManagedLedger, MlStats, MlStatus};
pub use position::Position;
pub use ranges::PositionRangeSet;
pub use records::LedgerInfo;
pub use store::{BoxFuture, Ledger, LedgerStore, LedgerStoreError, MemLedgerStore};
