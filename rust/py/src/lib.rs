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

/// `mi_option_purge_delay` in mimalloc's `mi_option_e` (mimalloc.h, v2): how long freed
/// memory waits before it is handed back to the OS; -1 never.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory is kept for reuse, never handed back to the OS. mimalloc returns it with
/// `madvise` from whichever thread frees or allocates next once the purge delay passes;
/// after a burst (an entry cache of a million entries aging out) that call took 11 ms on a
/// runtime thread, with every add behind it waiting. A broker's memory use is bounded by
/// its caches and queues anyway, as a JVM broker keeps its heap.
///
/// The allocator's options have no safe binding: these two functions are the crate's only
/// foreign calls.
#[allow(unsafe_code)]
fn keep_freed_memory() {
    // SAFETY: integers in, nothing out; mimalloc allows setting an option at any time and
    // reads it on each use.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// The allocator's settings that Magnetar changes, as `{name: value}`.
#[pyfunction]
#[allow(unsafe_code)]
fn allocator_options() -> std::collections::BTreeMap<&'static str, std::os::raw::c_long> {
    // SAFETY: an integer in, an integer out; reading an option is allowed at any time.
    let purge_delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
    std::collections::BTreeMap::from([("purge_delay_ms", purge_delay)])
}

mod bookie;
mod checksum;
mod completions;
mod errors;
mod kafka;
mod ledger_reader;
mod logging;
mod meta;
mod pulsar_codec;
mod runtime;
mod stream;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    keep_freed_memory();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // nettyMaxFrameSizeBytes may lie between these (what gateway._config checks).
    m.add("MIN_FRAME_SIZE", magnetar_bookie::proto::MIN_FRAME_SIZE)?;
    m.add("MAX_FRAME_SIZE", magnetar_bookie::proto::MAX_FRAME_SIZE)?;
    m.add_function(wrap_pyfunction!(allocator_options, m)?)?;
    m.add_function(wrap_pyfunction!(logging::log_to_stderr, m)?)?;
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
    m.add_function(wrap_pyfunction!(pulsar_codec::encode_pulsar_send_receipts, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_codec::scan_pulsar_send, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_codec::scan_pulsar_sends, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_codec::scan_pulsar_acks, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::crc32c, m)?)?;
    Ok(())
}
