//! CRC-32C for the Python side: the checksum Pulsar frames (magic 0x0e01) and Kafka
//! record batches carry, computed by the same crate the native core checks them with.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::pulsar_codec::contiguous_bytes;

/// The CRC-32C (Castagnoli) of a contiguous bytes-like object (bytes, bytearray,
/// memoryview), read in place.
#[pyfunction]
pub fn crc32c(data: &Bound<'_, PyAny>) -> PyResult<u32> {
    let view = PyBuffer::<u8>::get(data)?;
    Ok(::crc32c::crc32c(contiguous_bytes(&view)?))
}
