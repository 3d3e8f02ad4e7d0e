//! Positions in a managed ledger.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The address of one entry: the ledger that holds it and the entry id inside that ledger.
///
/// Positions order by ledger id, then entry id. An `entry_id` of `-1` names the point just
/// before the first entry of `ledger_id`; cursors use it as a mark-delete position that
/// acknowledges nothing in that ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Position {
    #[serde(rename = "ledgerId")]
    pub ledger_id: u64,
    #[serde(rename = "entryId")]
    pub entry_id: i64,
}

impl Position {
    /// A position from its parts.
    pub const fn new(ledger_id: u64, entry_id: i64) -> Self {
        Position { ledger_id, entry_id }
    }

    /// The point just before `self` in the same ledger (`entry_id - 1`; may be `-1`).
    pub const fn just_before(self) -> Self {
        Position { ledger_id: self.ledger_id, entry_id: self.entry_id - 1 }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ledger_id, self.entry_id)
    }
}
