//! Pulsar's stored entry format, read into columns.
//!
//! Every Magnetar topic stores Pulsar entries, whichever protocol wrote them: an optional
//! broker entry metadata section, the 0x0e01 magic and CRC-32C, a `MessageMetadata`, and a
//! payload that is one message or a (possibly compressed) batch. This crate checks and
//! decodes such entries without copying message bytes until they land in
//! [`MessageColumns`], which lays rows out the way Apache Arrow does, so that a reader can
//! hand whole columns to Arrow instead of building one object per message.
//!
//! It knows nothing of ledgers, bookies or Python: [`entry`] splits one entry,
//! [`compression`] undoes LZ4/ZLIB/ZSTD/SNAPPY, [`columns`] appends decoded messages to
//! column buffers, and [`proto`] reads the few protobuf messages involved.
//!
//! ```
//! use magnetar_format::{EntryPosition, MessageColumns};
//!
//! // A plain (non-batch) entry: producer "p", publish time 5 ms, payload "hi".
//! let meta = [0x0a, 1, b'p', 0x10, 0, 0x18, 5];
//! let mut body = (meta.len() as u32).to_be_bytes().to_vec();
//! body.extend_from_slice(&meta);
//! body.extend_from_slice(b"hi");
//! let mut raw = vec![0x0e, 0x01];
//! raw.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
//! raw.extend_from_slice(&body);
//!
//! let mut columns = MessageColumns::new();
//! let at = EntryPosition { ledger_id: 7, entry_id: 3, first_offset: 41 };
//! assert_eq!(columns.push_entry(at, &raw, 0..100).unwrap(), 1);
//! assert_eq!(columns.offset, vec![41]);
//! assert_eq!(columns.message_id.get(0), Some(&b"7:3:-1"[..]));
//! assert_eq!(columns.value.get(0), Some(&b"hi"[..]));
//! assert_eq!(columns.publish_time, vec![5000]);
//! assert_eq!(columns.key.get(0), None);
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod columns;
pub mod compression;
pub mod entry;
mod error;
pub mod proto;

pub use columns::{EntryPosition, MessageColumns, Validity, VarColumn};
pub use entry::{parse_entry, Entry, Message};
pub use error::{FormatError, Result};
