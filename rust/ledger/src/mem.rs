//! [`MemBookies`]: bookies kept in memory, for tests of code built on ledgers.
//!
//! They honour fencing, recovery adds, the piggybacked last add confirmed and deletion
//! like real bookies, and any of them can be taken down and brought back.
//!
//! ```
//! use bytes::Bytes;
//! use magnetar_ledger::mem::MemBookies;
//! use magnetar_ledger::{BookieError, BookieTransport};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let bookies = MemBookies::new();
//! bookies.add_bookie("b1:3181");
//! bookies.add("b1:3181", 1, 0, -1, Bytes::from_static(b"x"), false).await.unwrap();
//! assert_eq!(bookies.read_lac("b1:3181", 1, true).await, Ok(-1));
//! assert_eq!(bookies.add("b1:3181", 1, 1, 0, Bytes::new(), false).await, Err(BookieError::Fenced));
//! bookies.set_down("b1:3181", true);
//! assert!(bookies.read("b1:3181", 1, 0, false).await.is_err());
//! # });
//! ```

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::transport::{BookieError, BookieTransport, BoxFuture, ReadEntry};

#[derive(Default)]
struct MemLedger {
    fenced: bool,
    lac: i64,
    entries: BTreeMap<u64, Bytes>,
}

#[derive(Default)]
struct MemBookie {
    down: bool,
    ledgers: HashMap<u64, MemLedger>,
}

/// A set of in-memory bookies addressed by name.
#[derive(Default)]
pub struct MemBookies {
    bookies: Mutex<HashMap<String, MemBookie>>,
}

impl MemBookies {
    /// No bookies yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Start a bookie at `addr` (no effect when it exists).
    pub fn add_bookie(&self, addr: &str) {
        self.bookies.lock().entry(addr.to_string()).or_default();
    }

    /// Make `addr` refuse every request (`down`) or serve again, keeping its data.
    pub fn set_down(&self, addr: &str, down: bool) {
        if let Some(b) = self.bookies.lock().get_mut(addr) {
            b.down = down;
        }
    }

    /// The entry ids `addr` holds for `ledger`, in order.
    pub fn entries(&self, addr: &str, ledger: u64) -> Vec<u64> {
        self.bookies
            .lock()
            .get(addr)
            .and_then(|b| b.ledgers.get(&ledger))
            .map(|l| l.entries.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether `addr` holds anything for `ledger`.
    pub fn has_ledger(&self, addr: &str, ledger: u64) -> bool {
        self.bookies.lock().get(addr).is_some_and(|b| b.ledgers.contains_key(&ledger))
    }

    fn with<T>(&self, addr: &str, f: impl FnOnce(&mut MemBookie) -> Result<T, BookieError>) -> Result<T, BookieError> {
        let mut bookies = self.bookies.lock();
        match bookies.get_mut(addr) {
            Some(b) if !b.down => f(b),
            _ => Err(BookieError::Io(format!("connection to {addr} refused"))),
        }
    }
}

impl BookieTransport for MemBookies {
    fn add(
        &self,
        addr: &str,
        ledger: u64,
        entry: u64,
        lac: i64,
        data: Bytes,
        recovery: bool,
    ) -> BoxFuture<'_, Result<(), BookieError>> {
        let r = self.with(addr, |b| {
            let l = b.ledgers.entry(ledger).or_insert_with(|| MemLedger { lac: -1, ..MemLedger::default() });
            if l.fenced && !recovery {
                return Err(BookieError::Fenced);
            }
            l.entries.insert(entry, data);
            l.lac = l.lac.max(lac);
            Ok(())
        });
        Box::pin(async move { r })
    }

    fn read(&self, addr: &str, ledger: u64, entry: u64, fence: bool) -> BoxFuture<'_, Result<ReadEntry, BookieError>> {
        let r = self.with(addr, |b| {
            if fence {
                b.ledgers.entry(ledger).or_insert_with(|| MemLedger { lac: -1, ..MemLedger::default() }).fenced = true;
            }
            let l = b.ledgers.get(&ledger).ok_or(BookieError::NoLedger)?;
            let data = l.entries.get(&entry).cloned().ok_or(BookieError::NoEntry)?;
            Ok(ReadEntry { lac: l.lac, data })
        });
        Box::pin(async move { r })
    }

    fn read_lac(&self, addr: &str, ledger: u64, fence: bool) -> BoxFuture<'_, Result<i64, BookieError>> {
        let r = self.with(addr, |b| {
            if fence {
                b.ledgers.entry(ledger).or_insert_with(|| MemLedger { lac: -1, ..MemLedger::default() }).fenced = true;
            }
            Ok(b.ledgers.get(&ledger).map_or(-1, |l| l.lac))
        });
        Box::pin(async move { r })
    }

    fn delete_ledger(&self, addr: &str, ledger: u64) -> BoxFuture<'_, Result<(), BookieError>> {
        let r = self.with(addr, |b| b.ledgers.remove(&ledger).map(|_| ()).ok_or(BookieError::NoLedger));
        Box::pin(async move { r })
    }
}
