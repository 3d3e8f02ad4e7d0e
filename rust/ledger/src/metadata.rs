//! Ledger metadata and where it lives in the metadata store.
//!
//! Layout (JSON, so that admin tools in any language can read it):
//!
//! - `/ledgers/available/<host:port>` — one child per bookie that may be used (registered by
//!   the bookie or broker process, not by this client);
//! - `/ledgers/idgen` — a decimal counter, the last ledger id handed out;
//! - `/ledgers/ledger/<id>` — one [`LedgerMetadata`] record per ledger.
//!
//! ```
//! use magnetar_ledger::metadata::{LedgerMetadata, LedgerState};
//! let mut m = LedgerMetadata::new(3, 2, 2, vec!["a:1".into(), "b:1".into(), "c:1".into()], Default::default());
//! m.ensembles.push((10, vec!["a:1".into(), "d:1".into(), "c:1".into()]));
//! assert_eq!(m.ensemble_for(9)[1], "b:1");
//! assert_eq!(m.ensemble_for(10)[1], "d:1");
//! let json = m.to_json();
//! assert_eq!(LedgerMetadata::from_json("/x", &json).unwrap(), m);
//! assert_eq!(m.state, LedgerState::Open);
//! ```

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::LedgerError;

/// The folder whose children name the available bookies.
pub const AVAILABLE_BOOKIES: &str = "/ledgers/available";
/// The ledger id counter.
pub const ID_GENERATOR: &str = "/ledgers/idgen";
/// The folder holding one metadata record per ledger.
pub const LEDGERS: &str = "/ledgers/ledger";

/// The metadata path of ledger `id`.
pub fn ledger_path(id: u64) -> String {
    format!("{LEDGERS}/{id}")
}

/// The life cycle of a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LedgerState {
    /// A writer may be adding entries.
    Open,
    /// A client is fencing and recovering the ledger; the writer is locked out.
    InRecovery,
    /// The last entry id and length are final.
    Closed,
}

/// The record stored at `/ledgers/ledger/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerMetadata {
    /// E: bookies per fragment.
    pub ensemble_size: usize,
    /// Qw: bookies each entry is written to.
    pub write_quorum_size: usize,
    /// Qa: acknowledgements that confirm an entry.
    pub ack_quorum_size: usize,
    /// Open, in recovery or closed.
    pub state: LedgerState,
    /// The last entry of a closed ledger; -1 while open or when empty.
    #[serde(default = "no_entry")]
    pub last_entry_id: i64,
    /// Total payload bytes of a closed ledger.
    #[serde(default)]
    pub length: u64,
    /// Fragments: `[first entry id, ensemble]`, in increasing order of first entry id.
    pub ensembles: Vec<(u64, Vec<String>)>,
    /// Creation time, milliseconds since the Unix epoch.
    #[serde(default)]
    pub ctime: u64,
    /// Free-form properties given at creation.
    #[serde(default)]
    pub custom_metadata: BTreeMap<String, String>,
}

fn no_entry() -> i64 {
    -1
}

fn now_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

impl LedgerMetadata {
    /// A fresh open ledger with one fragment starting at entry 0.
    pub fn new(
        ensemble_size: usize,
        write_quorum_size: usize,
        ack_quorum_size: usize,
        ensemble: Vec<String>,
        custom_metadata: BTreeMap<String, String>,
    ) -> Self {
        LedgerMetadata {
            ensemble_size,
            write_quorum_size,
            ack_quorum_size,
            state: LedgerState::Open,
            last_entry_id: -1,
            length: 0,
            ensembles: vec![(0, ensemble)],
            ctime: now_millis(),
            custom_metadata,
        }
    }

    /// The ensemble that holds entry `entry`: that of the last fragment starting at or
    /// before it. Empty only for a record that failed [`LedgerMetadata::validate`].
    pub fn ensemble_for(&self, entry: u64) -> &[String] {
        self.ensembles
            .iter()
            .rev()
            .find(|(first, _)| *first <= entry)
            .or_else(|| self.ensembles.first())
            .map(|(_, e)| e.as_slice())
            .unwrap_or(&[])
    }

    /// The ensemble of the last fragment (where new entries go).
    pub fn current_ensemble(&self) -> &[String] {
        self.ensembles.last().map(|(_, e)| e.as_slice()).unwrap_or(&[])
    }

    /// Every bookie that holds any fragment, each once, in order of first appearance.
    pub fn all_bookies(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, ensemble) in &self.ensembles {
            for b in ensemble {
                if !out.contains(b) {
                    out.push(b.clone());
                }
            }
        }
        out
    }

    /// Check the invariants every reader relies on.
    pub fn validate(&self) -> Result<(), String> {
        let (e, qw, qa) = (self.ensemble_size, self.write_quorum_size, self.ack_quorum_size);
        check_quorums(e, qw, qa)?;
        match self.ensembles.first() {
            None => return Err("no fragments".into()),
            Some((first, _)) if *first != 0 => return Err(format!("first fragment starts at {first}, not 0")),
            Some(_) => {}
        }
        for pair in self.ensembles.windows(2) {
            if pair[1].0 <= pair[0].0 {
                return Err(format!("fragment starts {} and {} are not increasing", pair[0].0, pair[1].0));
            }
        }
        for (first, ensemble) in &self.ensembles {
            if ensemble.len() != e {
                return Err(format!("fragment at {first} has {} bookies, ensemble size is {e}", ensemble.len()));
            }
        }
        if self.last_entry_id < -1 {
            return Err(format!("lastEntryId {} is below -1", self.last_entry_id));
        }
        Ok(())
    }

    /// The JSON form stored in the metadata store.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain strings, integers and maps with string keys cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parse and validate a record read from `path`.
    pub fn from_json(path: &str, bytes: &[u8]) -> Result<Self, LedgerError> {
        let bad = |reason: String| LedgerError::BadMetadata { path: path.to_string(), reason };
        let m: LedgerMetadata = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        m.validate().map_err(bad)?;
        Ok(m)
    }
}

/// Check that `1 <= Qa <= Qw <= E`.
pub fn check_quorums(ensemble: usize, write_quorum: usize, ack_quorum: usize) -> Result<(), String> {
    if ensemble == 0 || write_quorum == 0 || ack_quorum == 0 {
        return Err(format!(
            "ensemble ({ensemble}), write quorum ({write_quorum}) and ack quorum ({ack_quorum}) must be positive"
        ));
    }
    if write_quorum > ensemble {
        return Err(format!("write quorum {write_quorum} is larger than ensemble {ensemble}"));
    }
    if ack_quorum > write_quorum {
        return Err(format!("ack quorum {ack_quorum} is larger than write quorum {write_quorum}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn json_uses_the_documented_names() {
        let mut custom = BTreeMap::new();
        custom.insert("component".to_string(), "managed-ledger".to_string());
        let m = LedgerMetadata::new(1, 1, 1, vec!["127.0.0.1:3181".into()], custom);
        let v: serde_json::Value = serde_json::from_slice(&m.to_json()).unwrap();
        assert_eq!(v["ensembleSize"], 1);
        assert_eq!(v["writeQuorumSize"], 1);
        assert_eq!(v["ackQuorumSize"], 1);
        assert_eq!(v["state"], "OPEN");
        assert_eq!(v["lastEntryId"], -1);
        assert_eq!(v["length"], 0);
        assert_eq!(v["ensembles"], serde_json::json!([[0, ["127.0.0.1:3181"]]]));
        assert_eq!(v["customMetadata"]["component"], "managed-ledger");
        assert!(v["ctime"].as_u64().unwrap() > 0);
        let mut closed = m.clone();
        closed.state = LedgerState::InRecovery;
        let v: serde_json::Value = serde_json::from_slice(&closed.to_json()).unwrap();
        assert_eq!(v["state"], "IN_RECOVERY");
    }

    #[test]
    fn invalid_records_are_rejected() {
        let ok = LedgerMetadata::new(2, 2, 1, vec!["a:1".into(), "b:1".into()], BTreeMap::new());
        let mut m = ok.clone();
        m.ensembles[0].1.pop();
        assert!(LedgerMetadata::from_json("/p", &m.to_json()).is_err());
        let mut m = ok.clone();
        m.ack_quorum_size = 3;
        assert!(LedgerMetadata::from_json("/p", &m.to_json()).is_err());
        let mut m = ok.clone();
        m.ensembles.push((0, vec!["a:1".into(), "c:1".into()]));
        assert!(LedgerMetadata::from_json("/p", &m.to_json()).is_err());
        assert!(matches!(LedgerMetadata::from_json("/p", b"{not json"), Err(LedgerError::BadMetadata { .. })));
    }

    #[test]
    fn optional_fields_may_be_left_out_by_other_writers() {
        let json =
            br#"{"ensembleSize":1,"writeQuorumSize":1,"ackQuorumSize":1,"state":"OPEN","ensembles":[[0,["h:1"]]]}"#;
        let m = LedgerMetadata::from_json("/p", json).unwrap();
        assert_eq!((m.last_entry_id, m.length, m.ctime), (-1, 0, 0));
        assert!(m.custom_metadata.is_empty());
    }

    fn arb_metadata() -> impl Strategy<Value = LedgerMetadata> {
        (1usize..5, any::<u8>(), any::<u8>(), proptest::collection::vec(1u64..1000, 0..4), -1i64..10_000, any::<u64>())
            .prop_map(|(e, qw, qa, mut starts, last, length)| {
                let qw = 1 + usize::from(qw) % e;
                let qa = 1 + usize::from(qa) % qw;
                starts.sort_unstable();
                starts.dedup();
                let ensemble = |n: u64| (0..e).map(|i| format!("10.0.0.{i}:{}", 3181 + n)).collect::<Vec<_>>();
                let mut m = LedgerMetadata::new(e, qw, qa, ensemble(0), BTreeMap::new());
                for s in starts {
                    m.ensembles.push((s, ensemble(s)));
                }
                m.state = LedgerState::Closed;
                m.last_entry_id = last;
                m.length = length;
                m.custom_metadata.insert("k".into(), format!("{length}"));
                m
            })
    }

    proptest! {
        #[test]
        fn json_round_trip(m in arb_metadata()) {
            let back = LedgerMetadata::from_json("/p", &m.to_json()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, m);
        }
    }
}
