//! Finding positions by message index or by publish time.
//!
//! Both keys grow with the position, so each search picks a ledger from what is known per
//! ledger (the index of its first message; the publish time of its last entry), then
//! binary-searches the entries of that ledger. Every entry read on the way, and every
//! 64th appended entry, is remembered in a bounded sparse index (`MlState::probes`) that
//! narrows later searches before any read.

use crate::error::{Result, StreamError};
use crate::managed_ledger::{entries_i64, ManagedLedger};
use crate::position::Position;

#[derive(Clone, Copy)]
enum Key {
    Index,
    PublishTime,
}

impl ManagedLedger {
    /// The position of the entry holding message `index`: the first entry whose last
    /// message index is `>= index`. An index older than the oldest retained entry gives the
    /// first position; an index not yet written gives the position the next entry takes.
    pub async fn find_position_by_index(&self, index: u64) -> Result<Position> {
        let (ledger, end) = {
            let st = self.state.lock();
            let end = st.end_position();
            if index >= st.confirmed_next_index {
                return Ok(st.next_valid(st.last_confirmed.unwrap_or(end.just_before())));
            }
            let chosen = st
                .ledgers
                .values()
                .filter(|i| i.entries > 0)
                .take_while(|i| i.first_index <= index)
                .last()
                .or_else(|| st.ledgers.values().find(|i| i.entries > 0))
                .copied();
            (chosen, end)
        };
        let Some(info) = ledger else { return Ok(end) };
        Ok(self.search_ledger(info.ledger_id, info.entries, index, Key::Index).await?.unwrap_or(end))
    }

    /// The position of the first entry published at or after `publish_time_ms`, or the
    /// position the next entry takes when there is none.
    pub async fn find_position_by_publish_time(&self, publish_time_ms: u64) -> Result<Position> {
        let ledgers: Vec<(u64, u64)> = {
            let st = self.state.lock();
            st.ledgers.values().filter(|i| i.entries > 0).map(|i| (i.ledger_id, i.entries)).collect()
        };
        for (id, entries) in ledgers {
            let last = Position::new(id, entries_i64(entries) - 1);
            let (_, last_time) = self.probe(last).await?;
            if last_time >= publish_time_ms {
                if let Some(p) = self.search_ledger(id, entries, publish_time_ms, Key::PublishTime).await? {
                    return Ok(p);
                }
            }
        }
        let st = self.state.lock();
        Ok(st.next_valid(st.last_confirmed.unwrap_or(st.end_position().just_before())))
    }

    /// (index, publish time) of the entry at `p`, from the sparse index or a read.
    async fn probe(&self, p: Position) -> Result<(u64, u64)> {
        if let Some(v) = self.state.lock().probes.get(&p) {
            return Ok(*v);
        }
        let entry = self
            .read_entries(p, 1)
            .await?
            .into_iter()
            .find(|e| e.position == p)
            .ok_or_else(|| StreamError::InvalidPosition(format!("entry {p} is not readable")))?;
        let v = (entry.index, entry.publish_time_ms);
        self.state.lock().remember_probe(p, v.0, v.1);
        Ok(v)
    }

    /// First entry of ledger `id` (holding `entries` entries) whose key is `>= target`.
    async fn search_ledger(&self, id: u64, entries: u64, target: u64, key: Key) -> Result<Option<Position>> {
        let pick = |v: (u64, u64)| match key {
            Key::Index => v.0,
            Key::PublishTime => v.1,
        };
        // Invariant: every entry < lo has key < target; entry hi has key >= target (or
        // hi == entries when none is known to).
        let mut lo = 0i64;
        let mut hi = entries_i64(entries);
        {
            let st = self.state.lock();
            for (p, v) in st.probes.range(Position::new(id, 0)..Position::new(id, hi)) {
                if pick(*v) < target {
                    lo = lo.max(p.entry_id + 1);
                } else {
                    hi = hi.min(p.entry_id);
                    break;
                }
            }
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let v = self.probe(Position::new(id, mid)).await?;
            if pick(v) < target {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok((lo < entries_i64(entries)).then(|| Position::new(id, lo)))
    }
}
