//! The broker's Python metadata store seen as a `magnetar_meta::MetadataStore`.
//!
//! Called only on slow paths, from blocking threads of the native runtime: each call takes
//! the GIL, calls the store's method, and maps its exceptions by class name
//! (`BadVersionError`, `NotFoundError`, `AlreadyExistsError`) to `MetaError`.

use magnetar_meta::{MetaError, MetadataStore};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pub struct PyMetadataStore {
    store: Py<PyAny>,
}

impl PyMetadataStore {
    pub fn new(store: Py<PyAny>) -> Self {
        Self { store }
    }
}

fn map_err(py: Python<'_>, err: PyErr, path: &str) -> MetaError {
    let name = err
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    match name.as_str() {
        "BadVersionError" => MetaError::BadVersion(path.to_string()),
        "NotFoundError" => MetaError::NotFound(path.to_string()),
        "AlreadyExistsError" => MetaError::AlreadyExists(path.to_string()),
        _ => MetaError::Other(format!("{path}: {err}")),
    }
}

impl MetadataStore for PyMetadataStore {
    fn get(&self, path: &str) -> Result<Option<(Vec<u8>, i64)>, MetaError> {
        Python::attach(|py| {
            let got = self.store.call_method1(py, "get", (path,)).map_err(|e| map_err(py, e, path))?;
            if got.is_none(py) {
                return Ok(None);
            }
            let (data, version): (Vec<u8>, i64) = got.extract(py).map_err(|e| map_err(py, e, path))?;
            Ok(Some((data, version)))
        })
    }

    fn put(&self, path: &str, data: &[u8], expected_version: Option<i64>) -> Result<i64, MetaError> {
        Python::attach(|py| {
            let bytes = PyBytes::new(py, data);
            self.store
                .call_method1(py, "put", (path, bytes, expected_version))
                .and_then(|v| v.extract::<i64>(py))
                .map_err(|e| map_err(py, e, path))
        })
    }

    fn delete(&self, path: &str, expected_version: Option<i64>) -> Result<(), MetaError> {
        Python::attach(|py| {
            self.store
                .call_method1(py, "delete", (path, expected_version))
                .map(|_| ())
                .map_err(|e| map_err(py, e, path))
        })
    }

    fn children(&self, path: &str) -> Result<Vec<String>, MetaError> {
        Python::attach(|py| {
            self.store
                .call_method1(py, "children", (path,))
                .and_then(|v| v.extract::<Vec<String>>(py))
                .map_err(|e| map_err(py, e, path))
        })
    }
}
