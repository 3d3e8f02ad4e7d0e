//! The JSON records a managed ledger keeps in the metadata store.
//!
//! - `/managed-ledgers/<name>`: [`MlRecord`] — the ledgers in order with their entry count,
//!   size, close time and the index of their first message, plus per-topic counters.
//! - `/managed-ledgers/<name>/<escaped cursor name>`: [`CursorRecord`] — the cursor's
//!   mark-delete position, its individually deleted ranges and its properties.
//!
//! Field names are camelCase so the broker's Python admin tools read them as they are.

use std::collections::BTreeMap;
use std::sync::Arc;

use magnetar_meta::{MetaError, MetadataStore};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StreamError};
use crate::position::Position;

/// Root of all managed-ledger records.
pub const ML_ROOT: &str = "/managed-ledgers";

/// One ledger of a managed ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerInfo {
    pub ledger_id: u64,
    /// Entries in the ledger (for the ledger being written: confirmed so far).
    pub entries: u64,
    /// Bytes stored in the ledger, headers included.
    pub size: u64,
    /// When the ledger was closed, ms since the epoch (0 while it is being written); for a
    /// ledger closed because its entries had all outlived retention, when its last entry
    /// was added.
    pub timestamp: u64,
    /// Index of the first message stored in the ledger.
    pub first_index: u64,
}

/// The managed ledger's own record.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MlRecord {
    pub ledgers: Vec<LedgerInfo>,
    /// Index the next message will get, as of when the record was written.
    #[serde(default)]
    pub next_index: u64,
    /// Creation time of the managed ledger, ms since the epoch.
    #[serde(default)]
    pub created_ms: u64,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// A durable cursor's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CursorRecord {
    pub mark_delete: Position,
    /// Inclusive ranges `[ledgerId, firstEntryId, lastEntryId]` above the mark-delete position.
    #[serde(default)]
    pub individually_deleted: Vec<(u64, i64, i64)>,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Entries of which some messages are acknowledged (batch-index acknowledgements):
    /// `[ledgerId, entryId, ackSet]`, the ack set's set bits being the messages still
    /// unacknowledged, above the mark-delete position.
    #[serde(default)]
    pub batch_acks: Vec<(u64, i64, Vec<i64>)>,
    /// Last time the record was written, ms since the epoch.
    #[serde(default)]
    pub last_active: u64,
}

/// Path of a managed ledger's record.
pub fn ml_path(name: &str) -> String {
    format!("{ML_ROOT}/{name}")
}

/// Path of a cursor's record.
pub fn cursor_path(ml_name: &str, cursor: &str) -> String {
    format!("{ML_ROOT}/{ml_name}/{}", escape_cursor_name(cursor))
}

/// Percent-encode a cursor name into one path segment: bytes outside
/// `A-Z a-z 0-9 - _ . ~` become `%XX`, and so does a leading `.`.
pub fn escape_cursor_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, b) in name.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') || (b == b'.' && i > 0);
        if plain {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Inverse of [`escape_cursor_name`]; `None` when the segment is not a valid escape.
pub fn unescape_cursor_name(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| StreamError::Corrupt(format!("cannot encode record: {e}")))
}

pub(crate) fn from_json<T: for<'de> Deserialize<'de>>(path: &str, data: &[u8]) -> Result<T> {
    serde_json::from_slice(data).map_err(|e| StreamError::Corrupt(format!("bad record at {path}: {e}")))
}

/// Run a blocking metadata call off the async threads.
pub(crate) async fn meta_call<T, F>(meta: &Arc<dyn MetadataStore>, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&dyn MetadataStore) -> Result<T, MetaError> + Send + 'static,
{
    let meta = meta.clone();
    let rt = tokio::runtime::Handle::try_current()
        .map_err(|_| StreamError::Metadata(MetaError::Other("no tokio runtime to run metadata calls on".into())))?;
    match rt.spawn_blocking(move || f(meta.as_ref())).await {
        Ok(r) => r.map_err(StreamError::from),
        Err(e) => Err(StreamError::Metadata(MetaError::Other(format!("metadata call did not complete: {e}")))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_separators_and_dots() {
        assert_eq!(escape_cursor_name("sub-1"), "sub-1");
        assert_eq!(escape_cursor_name("a/b c"), "a%2Fb%20c");
        assert_eq!(escape_cursor_name(".."), "%2E.");
        assert_eq!(unescape_cursor_name("a%2Fb%20c").as_deref(), Some("a/b c"));
        assert_eq!(unescape_cursor_name("bad%2"), None);
    }

    proptest! {
        #[test]
        fn cursor_name_round_trip(name in ".*") {
            let seg = escape_cursor_name(&name);
            prop_assert!(!seg.contains('/'));
            prop_assert!(seg != "." && seg != "..");
            prop_assert_eq!(unescape_cursor_name(&seg), Some(name));
        }

        #[test]
        fn cursor_record_round_trip(l in any::<u64>(), e in -1i64..1000, ranges in proptest::collection::vec((any::<u64>(), 0i64..100, 0i64..100), 0..5),
                                    batch_acks in proptest::collection::vec((any::<u64>(), 0i64..100, proptest::collection::vec(any::<i64>(), 0..3)), 0..4)) {
            let rec = CursorRecord {
                mark_delete: Position::new(l, e),
                individually_deleted: ranges,
                properties: BTreeMap::from([("k".to_string(), "v".to_string())]),
                batch_acks,
                last_active: 7,
            };
            let json = to_json(&rec).unwrap();
            let back: CursorRecord = from_json("/x", &json).unwrap();
            prop_assert_eq!(back, rec);
        }
    }
}
