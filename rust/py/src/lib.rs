//! `core._native`: the Python face of Magnetar's native core.
//!
//! Only conversions live here: Python objects to native types and back, native errors to
//! Python exceptions, and the completion queue through which asynchronous results reach
//! trio. The GIL is released around every blocking call.

use pyo3::prelude::*;

/// The native core allocates and frees many small buffers per entry from several threads;
/// mimalloc serves those with less locking than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bookie;
mod completions;
mod errors;
mod kafka;
mod ledger_reader;
mod meta;
mod pulsar_codec;
mod runtime;
mod stream;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<completions::CompletionQueue>()?;
    errors::register(m)?;
    m.add_class::<bookie::PyBookieServer>()?;
    m.add_class::<stream::PyFactory>()?;
    m.add_class::<stream::PyManagedLedger>()?;
    m.add_class::<stream::PyCursor>()?;
    m.add_function(wrap_pyfunction!(kafka::kafka_entry_from_batch, m)?)?;
    m.add_function(wrap_pyfunction!(kafka::kafka_batch_from_entry, m)?)?;
    m.add_class::<ledger_reader::PyLedgerRangeReader>()?;
    m.add_function(wrap_pyfunction!(pulsar_codec::encode_pulsar_messages, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_codec::encode_pulsar_send_receipt, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_codec::scan_pulsar_send, m)?)?;
    Ok(())
}
