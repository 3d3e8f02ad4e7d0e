//! Ledger storage over several directories (BookKeeper's `ledgerDirectories` with more than
//! one entry), each usually a disk of its own.
//!
//! Every ledger lives wholly in one directory: a new ledger goes to directory `ledger % n`,
//! and a ledger already stored somewhere stays where it is, so a bookie whose directory list
//! was reordered still finds everything (the cookie check at start refuses a list that
//! gained or lost a directory). Where a ledger lives is looked up once and remembered. A
//! flush flushes every directory, in parallel, so each disk syncs at its own pace.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

use crate::error::BookieError;
use crate::journal::EncodedEntries;
use crate::storage::LedgerStorage;

/// Ledger storage spread over several storages, one per directory.
pub struct MultiDirStorage {
    parts: Vec<Arc<dyn LedgerStorage>>,
    /// Where each ledger seen so far lives (index into `parts`).
    placed: RwLock<HashMap<u64, usize>>,
}

impl MultiDirStorage {
    /// Storage over `parts`, at least one.
    pub fn new(parts: Vec<Arc<dyn LedgerStorage>>) -> MultiDirStorage {
        assert!(!parts.is_empty(), "MultiDirStorage needs at least one storage");
        MultiDirStorage { parts, placed: RwLock::new(HashMap::new()) }
    }

    /// The storage holding `ledger`, if one does.
    fn find(&self, ledger: u64) -> Result<Option<usize>, BookieError> {
        if let Some(i) = self.placed.read().get(&ledger) {
            return Ok(Some(*i));
        }
        for (i, part) in self.parts.iter().enumerate() {
            if part.has_ledger(ledger)? {
                self.placed.write().insert(ledger, i);
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// The storage that holds `ledger`, or that a new ledger of that id goes to.
    fn home(&self, ledger: u64) -> Result<&dyn LedgerStorage, BookieError> {
        // A new ledger's place follows from its id: it is remembered once it exists there.
        let i = self.find(ledger)?.unwrap_or((ledger % self.parts.len() as u64) as usize);
        Ok(&*self.parts[i])
    }

    /// Ask the storage holding `ledger`; `absent` when none does.
    fn ask<T>(
        &self,
        ledger: u64,
        absent: T,
        f: impl FnOnce(&dyn LedgerStorage) -> Result<T, BookieError>,
    ) -> Result<T, BookieError> {
        match self.find(ledger)? {
            Some(i) => f(&*self.parts[i]),
            None => Ok(absent),
        }
    }
}

impl LedgerStorage for MultiDirStorage {
    fn add_entry(&self, ledger: u64, entry: u64, lac: i64, data: Bytes) -> Result<(), BookieError> {
        self.home(ledger)?.add_entry(ledger, entry, lac, data)
    }

    fn add_encoded(&self, entries: &EncodedEntries) -> Result<(), BookieError> {
        self.home(entries.ledger)?.add_encoded(entries)
    }

    fn get_entry(&self, ledger: u64, entry: u64) -> Result<Option<(i64, Bytes)>, BookieError> {
        self.ask(ledger, None, |s| s.get_entry(ledger, entry))
    }

    fn last_entry(&self, ledger: u64) -> Result<Option<u64>, BookieError> {
        self.ask(ledger, None, |s| s.last_entry(ledger))
    }

    fn lac(&self, ledger: u64) -> Result<Option<i64>, BookieError> {
        self.ask(ledger, None, |s| s.lac(ledger))
    }

    fn has_ledger(&self, ledger: u64) -> Result<bool, BookieError> {
        Ok(self.find(ledger)?.is_some())
    }

    fn set_fenced(&self, ledger: u64) -> Result<bool, BookieError> {
        self.home(ledger)?.set_fenced(ledger)
    }

    fn is_fenced(&self, ledger: u64) -> Result<bool, BookieError> {
        self.ask(ledger, false, |s| s.is_fenced(ledger))
    }

    fn delete_ledger(&self, ledger: u64) -> Result<bool, BookieError> {
        let existed = self.ask(ledger, false, |s| s.delete_ledger(ledger))?;
        self.placed.write().remove(&ledger);
        Ok(existed)
    }

    fn ledgers(&self) -> Result<Vec<u64>, BookieError> {
        let mut ids = Vec::new();
        for part in &self.parts {
            ids.extend(part.ledgers()?);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    fn flush(&self) -> Result<(), BookieError> {
        std::thread::scope(|scope| {
            let flushes: Vec<_> = self.parts.iter().map(|p| scope.spawn(move || p.flush())).collect();
            // Every directory is flushed (and waited for) even when one fails.
            let mut result = Ok(());
            for flush in flushes {
                let outcome = flush.join().unwrap_or_else(|_| {
                    Err(BookieError::Config("a ledger directory's flush panicked".into()))
                });
                if result.is_ok() {
                    result = outcome;
                }
            }
            result
        })
    }

    fn start_writeback(&self) {
        for part in &self.parts {
            part.start_writeback();
        }
    }

    fn halt(&self) {
        for part in &self.parts {
            part.halt();
        }
    }
}
