//! The Magnetar bookie: the storage node of the replicated log.
//!
//! A bookie stores ledger entries for the ledger client (`rust/ledger`), which stripes each
//! ledger over an ensemble of bookies. This crate holds the parts of one bookie:
//!
//! - [`proto`] — the wire protocol, a sans-IO codec (frames, requests, responses);
//! - [`journal`] — the write-ahead log with group commit that makes adds durable;
//! - [`storage`] — the [`LedgerStorage`] trait, with [`MemStorage`] and [`EntryLogStorage`];
//! - [`server`] — [`BookieServer`], serving ADD / ADD_BATCH / READ / READ_LAC / DELETE_LEDGER over TCP;
//! - [`client`] — [`BookieClient`], one multiplexed connection to a bookie.
//!
//! The `magnetar-bookie` binary runs one bookie as its own process.
//!
//! # Durability
//!
//! An add is acknowledged only once its journal record is written and (with
//! `journalSyncData`) fdatasynced, sharing that write with every add queued alongside it.
//! Ledger storage is flushed at checkpoints, after which the journal before the checkpoint is
//! deleted; a restart replays the journal from the last checkpoint into storage. A data
//! directory holds `LOCK` (one bookie at a time), `COOKIE` (which bookie it belongs to),
//! `journal/<seq>.log` with `journal/LASTMARK`, and `ledgers/<ledger>.log` with
//! `ledgers/CHECKPOINT`; the ledgers may instead be spread over directories of their own,
//! each with its own `LOCK`, `COOKIE` and `ledgers/`.
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use magnetar_bookie::{BookieClient, BookieConfig, BookieServer, ClientError, FrameLimit, JournalConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rt = tokio::runtime::Runtime::new()?;
//! rt.block_on(async {
//!     let dir = tempfile::tempdir()?;
//!     let config = BookieConfig {
//!         data_dir: dir.path().to_path_buf(),
//!         bind: "127.0.0.1:0".parse()?,
//!         ledger_dirs: Vec::new(),
//!         journal: JournalConfig::default(),
//!         max_frame_size: FrameLimit::MAX,
//!     };
//!     let server = BookieServer::start(config).await?;
//!     let addr = server.local_addr().to_string();
//!     let client = BookieClient::connect(&addr, Duration::from_secs(5)).await?;
//!     client.add(1, 0, -1, Bytes::from_static(b"first"), false).await?;
//!     assert_eq!(client.read(1, 0, false).await?.data, Bytes::from_static(b"first"));
//!     assert_eq!(client.read_lac(1, true).await?, -1); // fences the ledger
//!     assert_eq!(client.add(1, 1, 0, Bytes::from_static(b"late"), false).await, Err(ClientError::Fenced));
//!     server.shutdown().await?;
//!     Ok(())
//! })
//! # }
//! ```

pub mod client;
pub mod cookie;
mod entryindex;
pub mod entrylog;
pub mod error;
pub mod journal;
pub mod local;
mod logindex;
mod mailbox;
pub mod multidir;
pub mod proto;
mod reaper;
pub mod server;
pub mod storage;

pub use client::{BookieClient, ClientError, ReadResult};
pub use entrylog::EntryLogStorage;
pub use error::BookieError;
pub use proto::FrameLimit;
pub use server::{BookieConfig, BookieServer, JournalConfig};
pub use storage::{LedgerStorage, MemStorage};
