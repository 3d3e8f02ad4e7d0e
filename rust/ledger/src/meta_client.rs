//! Async access to the (blocking) metadata store: id generation, bookie discovery and
//! compare-and-set updates of ledger metadata.

use std::sync::Arc;

use magnetar_meta::{MetaError, MetadataStore};

use crate::error::{LedgerError, Result};
use crate::metadata::{ledger_path, LedgerMetadata, AVAILABLE_BOOKIES, ID_GENERATOR};

/// Compare-and-set loops give up after this many lost races in a row.
const MAX_CAS_ATTEMPTS: usize = 1000;

/// A ledger record and the store version it was read at.
pub(crate) type Versioned = (LedgerMetadata, i64);

#[derive(Clone)]
pub(crate) struct MetaClient {
    store: Arc<dyn MetadataStore>,
}

impl MetaClient {
    pub(crate) fn new(store: Arc<dyn MetadataStore>) -> Self {
        MetaClient { store }
    }

    async fn run<T, F>(&self, f: F) -> Result<Result<T, MetaError>>
    where
        T: Send + 'static,
        F: FnOnce(&dyn MetadataStore) -> Result<T, MetaError> + Send + 'static,
    {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || f(&*store))
            .await
            .map_err(|e| LedgerError::Runtime(format!("metadata task failed: {e}")))
    }

    /// Hand out a ledger id from the shared decimal counter.
    pub(crate) async fn next_ledger_id(&self) -> Result<u64> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let current = self.run(|s| s.get(ID_GENERATOR)).await??;
            let (next, expected) = match current {
                None => (0u64, -1),
                Some((bytes, version)) => {
                    let text = String::from_utf8_lossy(&bytes);
                    let last: u64 = text.trim().parse().map_err(|_| LedgerError::BadMetadata {
                        path: ID_GENERATOR.into(),
                        reason: format!("counter {text:?} is not a decimal number"),
                    })?;
                    let next = last.checked_add(1).ok_or_else(|| LedgerError::BadMetadata {
                        path: ID_GENERATOR.into(),
                        reason: "counter exhausted".into(),
                    })?;
                    (next, version)
                }
            };
            let body = next.to_string().into_bytes();
            match self.run(move |s| s.put(ID_GENERATOR, &body, Some(expected))).await? {
                Ok(_) => return Ok(next),
                Err(MetaError::BadVersion(_) | MetaError::AlreadyExists(_) | MetaError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(LedgerError::Metadata(MetaError::Other(format!("{ID_GENERATOR}: too much contention"))))
    }

    /// The registered bookies (`host:port` children of the available folder), sorted.
    pub(crate) async fn available_bookies(&self) -> Result<Vec<String>> {
        match self.run(|s| s.children(AVAILABLE_BOOKIES)).await? {
            Ok(names) => Ok(names.into_iter().filter(|n| n.contains(':')).collect()),
            Err(MetaError::NotFound(_)) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Read ledger `id`'s record.
    pub(crate) async fn read_ledger(&self, id: u64) -> Result<Versioned> {
        let path = ledger_path(id);
        let p = path.clone();
        match self.run(move |s| s.get(&p)).await?? {
            None => Err(LedgerError::NoSuchLedger(id)),
            Some((bytes, version)) => Ok((LedgerMetadata::from_json(&path, &bytes)?, version)),
        }
    }

    /// Create ledger `id`'s record; `Ok(None)` when the id is already taken.
    pub(crate) async fn create_ledger(&self, id: u64, meta: &LedgerMetadata) -> Result<Option<i64>> {
        let path = ledger_path(id);
        let body = meta.to_json();
        match self.run(move |s| s.put(&path, &body, Some(-1))).await? {
            Ok(v) => Ok(Some(v)),
            Err(MetaError::AlreadyExists(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Apply `change` to ledger `id`'s record with compare-and-set, starting from `cached`.
    ///
    /// `change` returns `Ok(true)` when it modified the record, `Ok(false)` when the record
    /// already says what it wants (nothing is written), or an error when the change is no
    /// longer valid. On a version conflict the record is re-read and `change` re-applied.
    pub(crate) async fn update_ledger<F>(&self, id: u64, cached: Versioned, mut change: F) -> Result<Versioned>
    where
        F: FnMut(&mut LedgerMetadata) -> Result<bool>,
    {
        let (mut current, mut version) = cached;
        for _ in 0..MAX_CAS_ATTEMPTS {
            let mut next = current.clone();
            if !change(&mut next)? {
                return Ok((current, version));
            }
            let path = ledger_path(id);
            let body = next.to_json();
            match self.run(move |s| s.put(&path, &body, Some(version))).await? {
                Ok(v) => return Ok((next, v)),
                Err(MetaError::BadVersion(_)) => {
                    (current, version) = self.read_ledger(id).await?;
                }
                Err(MetaError::NotFound(_)) => return Err(LedgerError::NoSuchLedger(id)),
                Err(e) => return Err(e.into()),
            }
        }
        Err(LedgerError::Metadata(MetaError::Other(format!("{}: too much contention", ledger_path(id)))))
    }

    /// Remove ledger `id`'s record.
    pub(crate) async fn delete_ledger(&self, id: u64) -> Result<()> {
        let path = ledger_path(id);
        match self.run(move |s| s.delete(&path, None)).await? {
            Ok(()) => Ok(()),
            Err(MetaError::NotFound(_)) => Err(LedgerError::NoSuchLedger(id)),
            Err(e) => Err(e.into()),
        }
    }
}
