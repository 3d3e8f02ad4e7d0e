//! Round-robin striping and the quorum arithmetic built on it.
//!
//! Entry `e` of a fragment whose ensemble has `E` bookies goes to the write set
//! `ensemble[(e + k) % E]` for `k` in `0..Qw`, and is confirmed once `Qa` of them have
//! acknowledged it. The `E` distinct write sets are the windows of `Qw` consecutive slots
//! starting at each slot.
//!
//! ```
//! use magnetar_ledger::quorum::{write_set, min_over_write_sets};
//! assert_eq!(write_set(4, 3, 2).collect::<Vec<_>>(), vec![1, 2]);
//! // With slot 0 down, the worst write set of E=3, Qw=2 keeps one bookie.
//! assert_eq!(min_over_write_sets(3, 2, |slot| slot != 0), 1);
//! ```

/// The ensemble slots entry `entry` is written to.
pub fn write_set(entry: u64, ensemble: usize, write_quorum: usize) -> impl Iterator<Item = usize> {
    let e = u64::try_from(ensemble.max(1)).unwrap_or(u64::MAX);
    // The remainder is below `ensemble`, so it fits a usize.
    let start = usize::try_from(entry % e).unwrap_or(0);
    (0..write_quorum).map(move |k| (start + k) % ensemble.max(1))
}

/// Over all write sets of the ensemble, the smallest number of slots satisfying `pred`.
pub fn min_over_write_sets(ensemble: usize, write_quorum: usize, pred: impl Fn(usize) -> bool) -> usize {
    (0..ensemble).map(|start| (0..write_quorum).filter(|k| pred((start + k) % ensemble)).count()).min().unwrap_or(0)
}

/// Whether the bookies for which `responded` holds leave no write set able to gather an
/// ack quorum without them: every write set has at least `Qw - Qa + 1` of them. This is
/// the condition under which a fence (or a "not found") from these bookies is final.
pub fn covers(ensemble: usize, write_quorum: usize, ack_quorum: usize, responded: impl Fn(usize) -> bool) -> bool {
    let need = write_quorum.saturating_sub(ack_quorum) + 1;
    min_over_write_sets(ensemble, write_quorum, responded) >= need
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_sets_stripe_round_robin() {
        let sets: Vec<Vec<usize>> = (0..4).map(|e| write_set(e, 3, 2).collect()).collect();
        assert_eq!(sets, vec![vec![0, 1], vec![1, 2], vec![2, 0], vec![0, 1]]);
        assert_eq!(write_set(u64::MAX, 5, 5).count(), 5);
    }

    #[test]
    fn coverage_follows_bookkeeper_rule() {
        // E=3, Qw=2, Qa=2: one response per write set is enough.
        assert!(covers(3, 2, 2, |s| s != 0));
        assert!(!covers(3, 2, 2, |s| s == 0));
        // E=3, Qw=3, Qa=2: two responses needed.
        assert!(covers(3, 3, 2, |s| s != 2));
        assert!(!covers(3, 3, 2, |s| s == 2));
        // E=Qw=Qa=1: the one bookie must answer.
        assert!(covers(1, 1, 1, |_| true));
        assert!(!covers(1, 1, 1, |_| false));
    }
}
