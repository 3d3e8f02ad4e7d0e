//! Kafka record batches into entries (`magnetar_kafka`), for the Kafka handler's produce.

use magnetar_kafka::{batch_from_entry, entry_from_batch, BatchError, EntryFields};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The entry that stores the one record batch `batch` holds, as
/// `(entry, records, contiguous)`, or None for a batch this converter leaves to the caller
/// (compressed, control, another message format). A malformed batch raises ValueError with
/// the reason. `contiguous` says whether the records' offset deltas run 0, 1, 2, ...
#[pyfunction]
#[pyo3(signature = (batch, producer_name, sequence_id, publish_time))]
pub fn kafka_entry_from_batch<'py>(
    py: Python<'py>,
    batch: &[u8],
    producer_name: &str,
    sequence_id: u64,
    publish_time: u64,
) -> PyResult<Option<(Bound<'py, PyBytes>, usize, bool)>> {
    let fields = EntryFields {
        producer_name,
        sequence_id,
        publish_time,
    };
    match entry_from_batch(batch, &fields) {
        Ok(c) => Ok(Some((PyBytes::new(py, &c.entry), c.records, c.contiguous))),
        Err(BatchError::NotConverted(_)) => Ok(None),
        Err(BatchError::Corrupt(reason)) => Err(PyValueError::new_err(reason)),
    }
}

/// The record batch a Kafka fetch returns for a stored entry (whose last message has
/// broker index `index` and which holds `num_messages`), or None for an entry this reader
/// leaves to the caller (compressed, encrypted, or not in the canonical form it takes; a
/// damaged entry too, so that the caller reports it in its own terms).
#[pyfunction]
#[pyo3(signature = (entry, index, num_messages, publish_time))]
pub fn kafka_batch_from_entry<'py>(
    py: Python<'py>,
    entry: &[u8],
    index: i64,
    num_messages: i64,
    publish_time: i64,
) -> Option<Bound<'py, PyBytes>> {
    batch_from_entry(entry, index, num_messages, publish_time)
        .ok()
        .map(|b| PyBytes::new(py, &b))
}
