//! Kafka record batches into Magnetar entries and back: the hot paths of a Kafka produce
//! ([`entry_from_batch`]) and fetch ([`batch_from_entry`]).
//!
//! # Theory of operation
//!
//! A Kafka producer sends record batches (message format v2, the protocol guide's "Record
//! Batch"); Magnetar stores each batch as one entry in the Pulsar entry format, so that
//! every protocol reads the same stream. [`entry_from_batch`] does that conversion in one
//! pass over the batch, writing straight into the entry's buffer: nothing is allocated
//! per record.
//!
//! The mapping (the broker's `handlers/kafka/_mapping.py` documents it; the bytes written
//! here are identical to what that module writes):
//!
//! * one record is a plain entry whose `MessageMetadata` carries the key, the headers as
//!   properties, the event time and the null-value flag; more records are a Pulsar batch:
//!   `[u32 size][SingleMessageMetadata][value]` per record;
//! * key ↔ partition key: UTF-8 text as is, other bytes base64 with
//!   `partition_key_b64_encoded`;
//! * headers ↔ properties: a value that is not UTF-8 is carried base64-encoded, a null value
//!   as the empty string; a header name must be UTF-8;
//! * CreateTime ↔ event time (when positive); LogAppendTime batches carry none.
//!
//! Only uncompressed, non-control batches are converted here ([`Converted`]); the broker
//! handles compressed and control batches itself. Every length read from the batch is
//! bound-checked against the bytes present before it is used, and a defect is a
//! [`BatchError`], never a panic.
//!
//! ```
//! use magnetar_kafka::{entry_from_batch, EntryFields};
//!
//! // A batch of one record (key "k", value "v") built by hand, CRC filled in below.
//! let record = [0x10, 0x00, 0x00, 0x00, 0x02, b'k', 0x02, b'v', 0x00];
//! let mut batch = Vec::new();
//! batch.extend_from_slice(&0i64.to_be_bytes()); // base offset
//! batch.extend_from_slice(&((49 + record.len()) as i32).to_be_bytes()); // batch length
//! batch.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
//! batch.push(2); // magic
//! batch.extend_from_slice(&[0; 4]); // crc
//! batch.extend_from_slice(&0i16.to_be_bytes()); // attributes
//! batch.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
//! batch.extend_from_slice(&1000i64.to_be_bytes()); // base timestamp
//! batch.extend_from_slice(&1000i64.to_be_bytes()); // max timestamp
//! batch.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
//! batch.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
//! batch.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
//! batch.extend_from_slice(&1i32.to_be_bytes()); // record count
//! batch.extend_from_slice(&record);
//! let crc = crc32c::crc32c(&batch[21..]);
//! batch[17..21].copy_from_slice(&crc.to_be_bytes());
//!
//! let fields = EntryFields { producer_name: "kafka", sequence_id: 0, publish_time: 2000 };
//! let converted = entry_from_batch(&batch, &fields).unwrap();
//! assert_eq!(converted.records, 1);
//! assert!(converted.contiguous);
//! assert_eq!(&converted.entry[..2], &[0x0e, 0x01]);
//! ```

mod batch;
mod entry;
mod fetch;
mod wire;

pub use batch::{parse_header, BatchHeader, BATCH_HEADER_SIZE};
pub use entry::{entry_from_batch, Converted, EntryFields};
pub use fetch::batch_from_entry;

/// Why a batch cannot be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The batch is malformed (Kafka's CORRUPT_MESSAGE).
    #[error("{0}")]
    Corrupt(String),
    /// The batch is well formed but not one this converter takes (compressed, control, or
    /// another message format): the caller converts it another way.
    #[error("{0}")]
    NotConverted(String),
}

pub(crate) fn corrupt(message: impl Into<String>) -> BatchError {
    BatchError::Corrupt(message.into())
}
