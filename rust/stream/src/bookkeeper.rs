//! [`LedgerStore`] over the replicated ledger client ([`magnetar_ledger::BookKeeper`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use magnetar_ledger::{BookKeeper, LedgerError, LedgerHandle, Replacement};

use crate::store::{BoxFuture, Ledger, LedgerStore, LedgerStoreError, Payload};

/// Ledgers on bookies, through a [`BookKeeper`] client.
#[derive(Clone)]
pub struct BookKeeperStore {
    bk: BookKeeper,
}

impl BookKeeperStore {
    /// A store over `bk`.
    pub fn new(bk: BookKeeper) -> Self {
        BookKeeperStore { bk }
    }

    /// The client underneath.
    pub fn client(&self) -> &BookKeeper {
        &self.bk
    }

    /// Give the lost bookie `lost`'s place in closed ledger `id` to other bookies, copying
    /// what it held there first, `batch` entries at a time (see
    /// [`BookKeeper::replace_bookie`]).
    pub async fn replace_bookie(&self, id: u64, lost: &str, batch: usize) -> Result<Replacement, LedgerStoreError> {
        self.bk.replace_bookie(id, lost, batch).await.map_err(|e| map_err(id, e))
    }
}

fn map_err(id: u64, e: LedgerError) -> LedgerStoreError {
    match e {
        LedgerError::NotEnoughBookies => LedgerStoreError::NotEnoughBookies,
        LedgerError::Fenced => LedgerStoreError::Fenced(id),
        LedgerError::NoSuchLedger(l) => LedgerStoreError::NoSuchLedger(l),
        LedgerError::LedgerClosed | LedgerError::ReadOnly => LedgerStoreError::Closed(id),
        LedgerError::NoSuchEntry { ledger, entry } => LedgerStoreError::NoSuchEntry(ledger, entry),
        LedgerError::ReadBeyondLac { first, .. } => LedgerStoreError::NoSuchEntry(id, first),
        other => LedgerStoreError::Other(other.to_string()),
    }
}

struct BkLedger {
    handle: LedgerHandle,
}

impl Ledger for BkLedger {
    fn id(&self) -> u64 {
        self.handle.id()
    }

    fn add_entries(&self, entries: Vec<Payload>) -> BoxFuture<'_, Result<Vec<u64>, LedgerStoreError>> {
        Box::pin(async move { self.handle.add_entries(entries).await.map_err(|e| map_err(self.handle.id(), e)) })
    }

    fn read_entries(&self, first: u64, last: u64) -> BoxFuture<'_, Result<Vec<(u64, Bytes)>, LedgerStoreError>> {
        Box::pin(async move { self.handle.read_entries(first, last).await.map_err(|e| map_err(self.handle.id(), e)) })
    }

    fn last_add_confirmed(&self) -> i64 {
        self.handle.last_add_confirmed()
    }

    fn length(&self) -> u64 {
        self.handle.length()
    }

    fn close(&self) -> BoxFuture<'_, Result<(), LedgerStoreError>> {
        Box::pin(async move { self.handle.close().await.map_err(|e| map_err(self.handle.id(), e)) })
    }
}

impl LedgerStore for BookKeeperStore {
    fn create_ledger(
        &self,
        ensemble: usize,
        write_quorum: usize,
        ack_quorum: usize,
        custom: BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<Arc<dyn Ledger>, LedgerStoreError>> {
        Box::pin(async move {
            let handle = self.bk.create_ledger(ensemble, write_quorum, ack_quorum, custom).await.map_err(|e| map_err(0, e))?;
            Ok(Arc::new(BkLedger { handle }) as Arc<dyn Ledger>)
        })
    }

    fn open_ledger(&self, id: u64, recover: bool) -> BoxFuture<'_, Result<Arc<dyn Ledger>, LedgerStoreError>> {
        Box::pin(async move {
            let handle = self.bk.open_ledger(id, recover).await.map_err(|e| map_err(id, e))?;
            Ok(Arc::new(BkLedger { handle }) as Arc<dyn Ledger>)
        })
    }

    fn delete_ledger(&self, id: u64) -> BoxFuture<'_, Result<(), LedgerStoreError>> {
        Box::pin(async move { self.bk.delete_ledger(id).await.map_err(|e| map_err(id, e)) })
    }

    fn max_entry_size(&self) -> usize {
        self.bk.max_entry_size()
    }
}
