//! The record batch header (protocol guide, "Record Batch") and its checks.
//!
//! ```text
//! baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8 (= 2),
//! crc uint32 (CRC-32C of everything after it), attributes int16, lastOffsetDelta int32,
//! baseTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch int16,
//! baseSequence int32, recordCount int32, then the records
//! ```

use crate::{corrupt, BatchError};

/// Bytes from baseOffset through the record count.
pub const BATCH_HEADER_SIZE: usize = 61;
/// Where the checksummed part starts (the attributes).
const CRC_FROM: usize = 21;
/// The most records one batch may declare.
pub const MAX_RECORDS_PER_BATCH: i32 = 1 << 20;

pub(crate) const COMPRESSION_MASK: i16 = 0x07;
pub(crate) const TIMESTAMP_TYPE_BIT: i16 = 0x08;
pub(crate) const CONTROL_BIT: i16 = 0x20;

/// The fixed fields of a record batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    pub fn compression(&self) -> i16 {
        self.attributes & COMPRESSION_MASK
    }

    pub fn log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }
}

fn be<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

/// Read and check the header of the one batch that `batch` holds exactly: magic 2, a
/// length that covers the whole slice, a matching CRC-32C and a record count in range.
pub fn parse_header(batch: &[u8]) -> Result<BatchHeader, BatchError> {
    if batch.len() < BATCH_HEADER_SIZE {
        return Err(corrupt("truncated record batch header"));
    }
    let magic = batch[16];
    if magic != 2 {
        return Err(BatchError::NotConverted(format!(
            "message format v{magic} is not served (v2 only)"
        )));
    }
    let batch_length = i32::from_be_bytes(be(batch, 8));
    if usize::try_from(batch_length)
        .ok()
        .and_then(|l| l.checked_add(12))
        != Some(batch.len())
    {
        return Err(corrupt(format!(
            "record batch length {batch_length} does not fit the data"
        )));
    }
    let crc = u32::from_be_bytes(be(batch, 17));
    if crc32c::crc32c(&batch[CRC_FROM..]) != crc {
        return Err(corrupt("record batch CRC-32C mismatch"));
    }
    let header = BatchHeader {
        base_offset: i64::from_be_bytes(be(batch, 0)),
        partition_leader_epoch: i32::from_be_bytes(be(batch, 12)),
        attributes: i16::from_be_bytes(be(batch, 21)),
        last_offset_delta: i32::from_be_bytes(be(batch, 23)),
        base_timestamp: i64::from_be_bytes(be(batch, 27)),
        max_timestamp: i64::from_be_bytes(be(batch, 35)),
        producer_id: i64::from_be_bytes(be(batch, 43)),
        producer_epoch: i16::from_be_bytes(be(batch, 51)),
        base_sequence: i32::from_be_bytes(be(batch, 53)),
        record_count: i32::from_be_bytes(be(batch, 57)),
    };
    if !(0..=MAX_RECORDS_PER_BATCH).contains(&header.record_count) {
        return Err(corrupt(format!(
            "record count {} out of range",
            header.record_count
        )));
    }
    Ok(header)
}
