//! Ledger storage: where a bookie keeps entries once the journal has them.
//!
//! [`LedgerStorage`] is the interface, in the spirit of BookKeeper's: the server applies every
//! mutation to storage and then journals it; the journal is what makes an acknowledged
//! mutation durable, and storage is made durable in bulk by [`LedgerStorage::flush`] at a
//! checkpoint, after which older journal files can go. Implementations must therefore accept
//! the same mutation twice (journal replay re-applies records storage may already hold).
//!
//! Two implementations: [`MemStorage`] (volatile, for tests and embedded use) and
//! [`EntryLogStorage`] (files on disk).
//!
//! ```
//! use bytes::Bytes;
//! use magnetar_bookie::storage::{LedgerStorage, MemStorage};
//!
//! let s = MemStorage::new();
//! s.add_entry(1, 0, -1, Bytes::from_static(b"a")).unwrap();
//! s.add_entry(1, 1, 0, Bytes::from_static(b"b")).unwrap();
//! assert_eq!(s.get_entry(1, 1).unwrap(), Some((0, Bytes::from_static(b"b"))));
//! assert_eq!(s.last_entry(1).unwrap(), Some(1));
//! assert_eq!(s.lac(1).unwrap(), Some(0));
//! ```

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use parking_lot::RwLock;

use crate::error::BookieError;
use crate::journal::EncodedEntries;

pub use crate::entrylog::EntryLogStorage;

/// Where a bookie keeps ledger entries, fence flags and last-add-confirmed values.
///
/// All methods are blocking and may be called from many threads at once. A ledger "exists"
/// on this bookie once it has an entry or has been fenced, until it is deleted.
pub trait LedgerStorage: Send + Sync {
    /// Store `data` as entry `entry` of `ledger`, together with the `lac` the writer sent
    /// with it; the ledger's tracked lac becomes the max of its old value and `lac`. Storing
    /// an entry id again replaces the earlier copy. Need not be durable until [`flush`](Self::flush).
    fn add_entry(&self, ledger: u64, entry: u64, lac: i64, data: Bytes) -> Result<(), BookieError>;

    /// Store every record of `entries` (entry records of one ledger, already encoded), as
    /// [`add_entry`](Self::add_entry) would one by one. The default does exactly that; a
    /// storage that keeps the record format writes the encoded bytes as they are.
    fn add_encoded(&self, entries: &EncodedEntries) -> Result<(), BookieError> {
        for (entry, data) in entries.entries() {
            self.add_entry(entries.ledger, entry, entries.lac, data)?;
        }
        Ok(())
    }

    /// The lac stored with the entry and its data, or `None` when the entry (or ledger) is
    /// absent. Implementations verify what they read and return an error rather than wrong data.
    fn get_entry(&self, ledger: u64, entry: u64) -> Result<Option<(i64, Bytes)>, BookieError>;

    /// The highest entry id stored for `ledger`, or `None` when it has no entries.
    fn last_entry(&self, ledger: u64) -> Result<Option<u64>, BookieError>;

    /// The highest lac seen for `ledger` over all its adds (-1 when it exists but none was
    /// higher), or `None` when the ledger does not exist here.
    fn lac(&self, ledger: u64) -> Result<Option<i64>, BookieError>;

    /// Whether the ledger exists here (has an entry or has been fenced).
    fn has_ledger(&self, ledger: u64) -> Result<bool, BookieError>;

    /// Mark `ledger` fenced, creating its record if needed. Returns whether it was already fenced.
    fn set_fenced(&self, ledger: u64) -> Result<bool, BookieError>;

    /// Whether `ledger` has been fenced.
    fn is_fenced(&self, ledger: u64) -> Result<bool, BookieError>;

    /// Remove `ledger`, its entries and fence flag, freeing its space. Returns whether it existed.
    fn delete_ledger(&self, ledger: u64) -> Result<bool, BookieError>;

    /// The ledgers that exist here, in ascending order.
    fn ledgers(&self) -> Result<Vec<u64>, BookieError>;

    /// Make every mutation applied so far durable (write out and fsync). Used by the checkpoint
    /// before journal files are deleted.
    fn flush(&self) -> Result<(), BookieError>;

    /// Write out what was added since the last call (or start the kernel writing it), so
    /// that the next [`flush`](Self::flush) finds little left to write. Called often, in
    /// small steps, so that a checkpoint's fsync never floods the disk all at once and the
    /// journal's fsyncs, which share that disk, never wait behind it. A storage with
    /// nothing to write out does nothing.
    fn start_writeback(&self) {}

    /// Write nothing more, as a crash would: what is only in memory stays there and is
    /// lost with the storage (the journal covers it). The bookie calls this when it stops
    /// without a shutdown; a storage writing nothing on its own does nothing.
    fn halt(&self) {}
}

struct MemLedger {
    entries: BTreeMap<u64, (i64, Bytes)>,
    lac: i64,
    fenced: bool,
}

impl MemLedger {
    fn new() -> MemLedger {
        MemLedger {
            entries: BTreeMap::new(),
            lac: -1,
            fenced: false,
        }
    }
}

/// A volatile [`LedgerStorage`] kept in memory; `flush` does nothing.
#[derive(Default)]
pub struct MemStorage {
    ledgers: RwLock<HashMap<u64, MemLedger>>,
}

impl MemStorage {
    /// An empty store.
    pub fn new() -> MemStorage {
        MemStorage::default()
    }
}

impl LedgerStorage for MemStorage {
    fn add_entry(&self, ledger: u64, entry: u64, lac: i64, data: Bytes) -> Result<(), BookieError> {
        let mut ledgers = self.ledgers.write();
        let l = ledgers.entry(ledger).or_insert_with(MemLedger::new);
        l.lac = l.lac.max(lac);
        l.entries.insert(entry, (lac, data));
        Ok(())
    }

    fn get_entry(&self, ledger: u64, entry: u64) -> Result<Option<(i64, Bytes)>, BookieError> {
        Ok(self
            .ledgers
            .read()
            .get(&ledger)
            .and_then(|l| l.entries.get(&entry).cloned()))
    }

    fn last_entry(&self, ledger: u64) -> Result<Option<u64>, BookieError> {
        Ok(self
            .ledgers
            .read()
            .get(&ledger)
            .and_then(|l| l.entries.keys().next_back().copied()))
    }

    fn lac(&self, ledger: u64) -> Result<Option<i64>, BookieError> {
        Ok(self.ledgers.read().get(&ledger).map(|l| l.lac))
    }

    fn has_ledger(&self, ledger: u64) -> Result<bool, BookieError> {
        Ok(self.ledgers.read().contains_key(&ledger))
    }

    fn set_fenced(&self, ledger: u64) -> Result<bool, BookieError> {
        let mut ledgers = self.ledgers.write();
        let l = ledgers.entry(ledger).or_insert_with(MemLedger::new);
        Ok(std::mem::replace(&mut l.fenced, true))
    }

    fn is_fenced(&self, ledger: u64) -> Result<bool, BookieError> {
        Ok(self.ledgers.read().get(&ledger).is_some_and(|l| l.fenced))
    }

    fn delete_ledger(&self, ledger: u64) -> Result<bool, BookieError> {
        Ok(self.ledgers.write().remove(&ledger).is_some())
    }

    fn ledgers(&self) -> Result<Vec<u64>, BookieError> {
        let mut ids: Vec<u64> = self.ledgers.read().keys().copied().collect();
        ids.sort_unstable();
        Ok(ids)
    }

    fn flush(&self) -> Result<(), BookieError> {
        Ok(())
    }
}
