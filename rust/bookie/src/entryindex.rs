//! The in-memory index of one ledger log: where each entry's record is, by entry id.
//!
//! A ledger's entries come to a bookie in ascending order, all of them or a regular part of
//! them (with E > Qw a bookie holds Qw of every E entries). So the index is an array by
//! entry id, counted from the first entry indexed: 12 bytes a slot, where a `BTreeMap`
//! took about 60 bytes an entry, and a slot written in place of a tree insert. The array
//! is kept in chunks of [`CHUNK`] slots, so growing it never copies what it holds (a
//! single vector of a few million slots would, at each doubling, on the add path).
//! Entries that do not fit the array, below its first entry or far past its end (a
//! recovery add, say), go to a small map beside it.

use std::collections::BTreeMap;

/// Slots per chunk.
const CHUNK: usize = 4096;
/// How many chunks of unused slots an entry may skip past the array's end before it goes
/// to the map instead.
const MAX_GAP_CHUNKS: u64 = 16;
/// The length of a slot no entry was written to.
const ABSENT: u32 = u32::MAX;

#[derive(Debug, Default)]
struct Chunk {
    offs: Vec<u64>,
    lens: Vec<u32>,
}

impl Chunk {
    /// Set slot `i`, growing the chunk to hold it; whether the slot was empty.
    fn set(&mut self, i: usize, off: u64, len: u32) -> bool {
        if i >= self.lens.len() {
            // A chunk is filled in order, mostly: it starts small and doubles, never past
            // CHUNK slots.
            let want = (i + 1).max(self.lens.capacity() * 2).clamp(64, CHUNK);
            if want > self.lens.capacity() {
                self.offs.reserve_exact(want - self.offs.len());
                self.lens.reserve_exact(want - self.lens.len());
            }
            self.offs.resize(i + 1, 0);
            self.lens.resize(i + 1, ABSENT);
        }
        let was_empty = self.lens[i] == ABSENT;
        self.offs[i] = off;
        self.lens[i] = len;
        was_empty
    }

    fn get(&self, i: usize) -> Option<(u64, usize)> {
        match self.lens.get(i) {
            Some(&len) if len != ABSENT => Some((self.offs[i], len as usize)),
            _ => None,
        }
    }
}

/// Entry id → (offset, length) of its record in the log.
#[derive(Debug, Default)]
pub(crate) struct EntryIndex {
    /// Entry id of the first slot of the first chunk.
    base: u64,
    chunks: Vec<Chunk>,
    /// Entries held in the chunks.
    in_chunks: usize,
    /// Entries outside the chunks.
    others: BTreeMap<u64, (u64, u32)>,
}

impl EntryIndex {
    pub(crate) fn new() -> EntryIndex {
        EntryIndex::default()
    }

    /// Index `entry` at `off`, `len` bytes long, in place of what it was indexed at before.
    pub(crate) fn insert(&mut self, entry: u64, (off, len): (u64, usize)) {
        let len = u32::try_from(len).unwrap_or(ABSENT - 1).min(ABSENT - 1);
        if self.chunks.is_empty() {
            self.base = entry;
        }
        let chunk = entry
            .checked_sub(self.base)
            .map(|slot| (slot / CHUNK as u64, (slot % CHUNK as u64) as usize))
            .filter(|&(chunk, _)| chunk < self.chunks.len() as u64 + MAX_GAP_CHUNKS);
        let Some((chunk, i)) = chunk else {
            self.others.insert(entry, (off, len));
            return;
        };
        // (Below the gap limit, so it fits a usize.)
        let chunk = chunk as usize;
        if chunk >= self.chunks.len() {
            self.chunks.resize_with(chunk + 1, Chunk::default);
        }
        if self.chunks[chunk].set(i, off, len) {
            self.in_chunks += 1;
            // It may have been put beside the chunks before they reached it.
            if !self.others.is_empty() {
                self.others.remove(&entry);
            }
        }
    }

    pub(crate) fn get(&self, entry: u64) -> Option<(u64, usize)> {
        let in_chunks = entry.checked_sub(self.base).and_then(|slot| {
            let chunk = usize::try_from(slot / CHUNK as u64).ok()?;
            self.chunks.get(chunk)?.get((slot % CHUNK as u64) as usize)
        });
        in_chunks.or_else(|| self.others.get(&entry).map(|&(off, len)| (off, len as usize)))
    }

    /// How many entries are indexed.
    pub(crate) fn len(&self) -> usize {
        self.in_chunks + self.others.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The highest entry id indexed.
    pub(crate) fn last(&self) -> Option<u64> {
        // The last chunk is the one the highest entry made, and a chunk's slots end with the
        // highest one written (a slot past them is only made by writing it).
        let in_chunks = self.chunks.last().map(|c| {
            self.base + ((self.chunks.len() - 1) * CHUNK) as u64 + (c.lens.len() - 1) as u64
        });
        let other = self.others.keys().next_back().copied();
        in_chunks.max(other)
    }
}

impl FromIterator<(u64, (u64, usize))> for EntryIndex {
    fn from_iter<I: IntoIterator<Item = (u64, (u64, usize))>>(iter: I) -> EntryIndex {
        let mut index = EntryIndex::new();
        for (entry, at) in iter {
            index.insert(entry, at);
        }
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn answers_as_a_map_does(
            ops in proptest::collection::vec(
                (proptest::prop_oneof![0u64..20, 0u64..20_000, 0u64..200_000, proptest::prelude::Just(u64::MAX)],
                 0u64..1 << 40, 0usize..1 << 24),
                0..300,
            ),
            probes in proptest::collection::vec(0u64..200_000, 0..50),
        ) {
            let mut index = EntryIndex::new();
            let mut model = BTreeMap::new();
            for &(entry, off, len) in &ops {
                index.insert(entry, (off, len));
                model.insert(entry, (off, len));
                proptest::prop_assert_eq!(index.len(), model.len());
                proptest::prop_assert_eq!(index.last(), model.keys().next_back().copied());
            }
            for &(entry, _, _) in &ops {
                proptest::prop_assert_eq!(index.get(entry), model.get(&entry).copied());
            }
            for p in probes {
                proptest::prop_assert_eq!(index.get(p), model.get(&p).copied());
            }
            proptest::prop_assert!(index.chunks.iter().all(|c| c.lens.capacity() <= CHUNK));
            let rebuilt: EntryIndex = model.iter().map(|(&e, &at)| (e, at)).collect();
            proptest::prop_assert_eq!(rebuilt.len(), model.len());
        }
    }

    #[test]
    fn a_striped_ledger_costs_about_twelve_bytes_a_slot() {
        // Two of every three entries, as a bookie of E=3, Qw=2 holds them.
        let mut index = EntryIndex::new();
        for e in (0..300_000u64).filter(|e| e % 3 != 1) {
            index.insert(e, (e * 100, 90));
        }
        assert_eq!(index.len(), 200_000);
        assert!(index.others.is_empty());
        let slots: usize = index.chunks.iter().map(|c| c.lens.capacity()).sum();
        assert!(index.chunks.iter().all(|c| c.lens.capacity() <= CHUNK));
        assert!(slots <= 300_000 + CHUNK, "{slots} slots for 300,000 entry ids");
        assert_eq!(index.get(2), Some((200, 90)));
        assert_eq!(index.get(1), None);
        assert_eq!(index.last(), Some(299_999));
    }
}
