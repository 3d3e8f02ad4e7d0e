//! The metadata store as the native core sees it.
//!
//! Ledger metadata, managed-ledger and cursor records, and the list of available bookies
//! live in one versioned key-value tree owned by the broker (`core/` in Python: SQLite for
//! standalone, ZooKeeper for a cluster). The native core reaches it only on slow paths
//! (create, ensemble change, close, rollover, cursor persistence) through [`MetadataStore`].
//!
//! Every record carries a version; writers that must not lose a race use compare-and-set.
//!
//! ```
//! use magnetar_meta::{MemStore, MetadataStore, MetaError};
//! let store = MemStore::default();
//! let v0 = store.put("/a", b"one", Some(-1)).unwrap();
//! assert_eq!(store.put("/a", b"two", Some(v0 + 7)), Err(MetaError::BadVersion("/a".into())));
//! let v1 = store.put("/a", b"two", Some(v0)).unwrap();
//! assert_eq!(store.get("/a").unwrap(), Some((b"two".to_vec(), v1)));
//! ```

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// What a metadata operation can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("metadata path not found: {0}")]
    NotFound(String),
    #[error("metadata version mismatch on {0}")]
    BadVersion(String),
    #[error("metadata path already exists: {0}")]
    AlreadyExists(String),
    #[error("metadata store error: {0}")]
    Other(String),
}

/// A versioned key-value tree. Paths are `/`-separated; parents need not exist.
///
/// Versions start at 0 on create and grow by one on each successful put.
/// Implementations are blocking; async callers run them on a blocking thread.
pub trait MetadataStore: Send + Sync + 'static {
    /// The value and version at `path`, or `None` when absent.
    fn get(&self, path: &str) -> Result<Option<(Vec<u8>, i64)>, MetaError>;
    /// Write `data` at `path`. `expected_version`: `None` writes unconditionally,
    /// `Some(-1)` only creates (fails with `AlreadyExists`), `Some(v)` replaces only
    /// version `v` (fails with `BadVersion`, or `NotFound` when absent). Returns the new version.
    fn put(&self, path: &str, data: &[u8], expected_version: Option<i64>) -> Result<i64, MetaError>;
    /// Remove `path`; with `Some(v)` only when its version is `v`.
    fn delete(&self, path: &str, expected_version: Option<i64>) -> Result<(), MetaError>;
    /// The names (last path segment) of the direct children of `path`, sorted.
    fn children(&self, path: &str) -> Result<Vec<String>, MetaError>;
}

/// An in-memory store, for tests and for tools that need no durability.
#[derive(Default)]
pub struct MemStore {
    inner: Mutex<BTreeMap<String, (Vec<u8>, i64)>>,
}

impl MetadataStore for MemStore {
    fn get(&self, path: &str) -> Result<Option<(Vec<u8>, i64)>, MetaError> {
        Ok(self.inner.lock().get(path).cloned())
    }

    fn put(&self, path: &str, data: &[u8], expected_version: Option<i64>) -> Result<i64, MetaError> {
        let mut map = self.inner.lock();
        let current = map.get(path).map(|(_, v)| *v);
        let version = match (expected_version, current) {
            (None, None) | (Some(-1), None) => 0,
            (None, Some(v)) => v + 1,
            (Some(-1), Some(_)) => return Err(MetaError::AlreadyExists(path.into())),
            (Some(_), None) => return Err(MetaError::NotFound(path.into())),
            (Some(e), Some(v)) if e == v => v + 1,
            (Some(_), Some(_)) => return Err(MetaError::BadVersion(path.into())),
        };
        map.insert(path.to_string(), (data.to_vec(), version));
        Ok(version)
    }

    fn delete(&self, path: &str, expected_version: Option<i64>) -> Result<(), MetaError> {
        let mut map = self.inner.lock();
        match (map.get(path).map(|(_, v)| *v), expected_version) {
            (None, _) => Err(MetaError::NotFound(path.into())),
            (Some(v), Some(e)) if v != e => Err(MetaError::BadVersion(path.into())),
            _ => {
                map.remove(path);
                Ok(())
            }
        }
    }

    fn children(&self, path: &str) -> Result<Vec<String>, MetaError> {
        let prefix = format!("{}/", path.trim_end_matches('/'));
        let map = self.inner.lock();
        let names: std::collections::BTreeSet<String> = map
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, _)| k[prefix.len()..].split('/').next().map(str::to_string))
            .collect();
        Ok(names.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_lists_direct_names_once() {
        let s = MemStore::default();
        s.put("/l/a", b"", None).unwrap();
        s.put("/l/a/x", b"", None).unwrap();
        s.put("/l/b", b"", None).unwrap();
        s.put("/l/a-b", b"", None).unwrap();
        s.put("/lx", b"", None).unwrap();
        assert_eq!(s.children("/l").unwrap(), vec!["a".to_string(), "a-b".to_string(), "b".to_string()]);
    }

    #[test]
    fn delete_respects_version() {
        let s = MemStore::default();
        let v = s.put("/k", b"1", None).unwrap();
        assert!(matches!(s.delete("/k", Some(v + 1)), Err(MetaError::BadVersion(_))));
        s.delete("/k", Some(v)).unwrap();
        assert!(matches!(s.delete("/k", None), Err(MetaError::NotFound(_))));
    }
}
