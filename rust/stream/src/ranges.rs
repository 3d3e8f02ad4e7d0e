//! A set of entry positions kept as merged, inclusive ranges per ledger.
//!
//! Cursors use it for the entries acknowledged individually above their mark-delete
//! position. Ranges never span ledgers: `[l:a ..= l:b]`. Adjacent or overlapping ranges
//! are merged on insert, so a consumer that acknowledges everything in order keeps one
//! range per ledger.

use std::collections::BTreeMap;

use crate::position::Position;

/// Sorted, merged ranges of positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PositionRangeSet {
    /// ledger id → (first entry → last entry), ranges disjoint and not adjacent.
    ledgers: BTreeMap<u64, BTreeMap<i64, i64>>,
}

impl PositionRangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when no position is in the set.
    pub fn is_empty(&self) -> bool {
        self.ledgers.is_empty()
    }

    /// Add one position.
    pub fn insert(&mut self, p: Position) {
        self.insert_range(p.ledger_id, p.entry_id, p.entry_id);
    }

    /// Add the entries `first..=last` of `ledger`.
    pub fn insert_range(&mut self, ledger: u64, first: i64, last: i64) {
        if first > last {
            return;
        }
        let ranges = self.ledgers.entry(ledger).or_default();
        let mut lo = first;
        let mut hi = last;
        // A range starting at or before `lo` that reaches `lo - 1` merges.
        if let Some((&s, &e)) = ranges.range(..=lo).next_back() {
            if e >= lo.saturating_sub(1) {
                lo = s;
                hi = hi.max(e);
                ranges.remove(&s);
            }
        }
        // Ranges starting inside `lo..=hi + 1` merge.
        let starts: Vec<i64> = ranges.range(lo..=hi.saturating_add(1)).map(|(s, _)| *s).collect();
        for s in starts {
            if let Some(e) = ranges.remove(&s) {
                hi = hi.max(e);
            }
        }
        ranges.insert(lo, hi);
    }

    /// Whether `p` is in the set.
    pub fn contains(&self, p: Position) -> bool {
        self.range_containing(p).is_some()
    }

    /// The inclusive range `(first, last)` of `p.ledger_id` that holds `p`.
    pub fn range_containing(&self, p: Position) -> Option<(i64, i64)> {
        let ranges = self.ledgers.get(&p.ledger_id)?;
        let (&s, &e) = ranges.range(..=p.entry_id).next_back()?;
        (e >= p.entry_id).then_some((s, e))
    }

    /// Remove every position `<= upto`.
    pub fn remove_up_to(&mut self, upto: Position) {
        let older: Vec<u64> = self.ledgers.range(..upto.ledger_id).map(|(l, _)| *l).collect();
        for l in older {
            self.ledgers.remove(&l);
        }
        if let Some(ranges) = self.ledgers.get_mut(&upto.ledger_id) {
            let cut: Vec<(i64, i64)> = ranges.range(..=upto.entry_id).map(|(s, e)| (*s, *e)).collect();
            for (s, e) in cut {
                ranges.remove(&s);
                if e > upto.entry_id {
                    ranges.insert(upto.entry_id + 1, e);
                }
            }
            if ranges.is_empty() {
                self.ledgers.remove(&upto.ledger_id);
            }
        }
    }

    /// Remove everything.
    pub fn clear(&mut self) {
        self.ledgers.clear();
    }

    /// Positions in the set within ledger `ledger`, entries `first..=last`.
    pub fn count_in(&self, ledger: u64, first: i64, last: i64) -> u64 {
        let Some(ranges) = self.ledgers.get(&ledger) else { return 0 };
        let mut n = 0u64;
        let start = ranges.range(..=first).next_back().map_or(first, |(s, _)| *s);
        for (&s, &e) in ranges.range(start..=last) {
            let lo = s.max(first);
            let hi = e.min(last);
            if hi >= lo {
                n += (hi - lo + 1) as u64;
            }
        }
        n
    }

    /// Total number of positions in the set.
    pub fn len(&self) -> u64 {
        self.ledgers.values().flat_map(|r| r.iter()).map(|(s, e)| (e - s + 1) as u64).sum()
    }

    /// Every range as `(ledger, first, last)`, in order.
    pub fn ranges(&self) -> Vec<(u64, i64, i64)> {
        self.ledgers.iter().flat_map(|(l, r)| r.iter().map(move |(s, e)| (*l, *s, *e))).collect()
    }

    /// Number of disjoint ranges.
    pub fn range_count(&self) -> usize {
        self.ledgers.values().map(BTreeMap::len).sum()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn merges_adjacent_and_overlapping() {
        let mut s = PositionRangeSet::new();
        s.insert(Position::new(1, 3));
        s.insert(Position::new(1, 5));
        assert_eq!(s.ranges(), vec![(1, 3, 3), (1, 5, 5)]);
        s.insert(Position::new(1, 4));
        assert_eq!(s.ranges(), vec![(1, 3, 5)]);
        s.insert_range(1, 0, 2);
        assert_eq!(s.ranges(), vec![(1, 0, 5)]);
        s.insert(Position::new(2, 0));
        assert_eq!(s.ranges(), vec![(1, 0, 5), (2, 0, 0)]);
        s.remove_up_to(Position::new(1, 2));
        assert_eq!(s.ranges(), vec![(1, 3, 5), (2, 0, 0)]);
        assert_eq!(s.count_in(1, 0, 4), 2);
        s.remove_up_to(Position::new(1, 9));
        assert_eq!(s.ranges(), vec![(2, 0, 0)]);
    }

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((0u64..3, 0i64..40, 0u8..10), 0..120)) {
            let mut s = PositionRangeSet::new();
            let mut model = BTreeSet::new();
            for (l, e, op) in ops {
                if op == 0 {
                    let p = Position::new(l, e);
                    s.remove_up_to(p);
                    model.retain(|q: &Position| *q > p);
                } else {
                    s.insert(Position::new(l, e));
                    model.insert(Position::new(l, e));
                }
            }
            prop_assert_eq!(s.len(), model.len() as u64);
            for l in 0..3u64 {
                for e in 0..40i64 {
                    prop_assert_eq!(s.contains(Position::new(l, e)), model.contains(&Position::new(l, e)));
                }
                let want = model.iter().filter(|p| p.ledger_id == l && (5..=20).contains(&p.entry_id)).count() as u64;
                prop_assert_eq!(s.count_in(l, 5, 20), want);
            }
            // Ranges are disjoint and not adjacent.
            let rs = s.ranges();
            for w in rs.windows(2) {
                if w[0].0 == w[1].0 {
                    prop_assert!(w[0].2 + 1 < w[1].1);
                }
            }
        }
    }
}
