//! Entries and the broker entry metadata stored in front of each payload.
//!
//! Every ledger entry written by a managed ledger is `header | payload`, where the header
//! is fixed-size, big-endian:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 2 | magic `0x0E4D` |
//! | 2 | 1 | header version (1) |
//! | 3 | 1 | reserved, 0 |
//! | 4 | 4 | number of messages in the entry |
//! | 8 | 8 | broker publish time, ms since the Unix epoch |
//! | 16 | 8 | index: cumulative message index of the entry's last message |
//!
//! The index makes a per-topic monotonic offset (what Kafka calls an offset) available
//! without counting: the first message ever stored has index 0, and an entry of `n`
//! messages that follows an entry with index `i` has index `i + n`.

use bytes::{BufMut, Bytes};

use crate::error::{Result, StreamError};
use crate::position::Position;

/// Size of the broker entry metadata header in bytes.
pub const HEADER_LEN: usize = 24;
/// First two bytes of every entry header.
pub const HEADER_MAGIC: u16 = 0x0E4D;
/// The header layout version this crate writes and reads.
pub const HEADER_VERSION: u8 = 1;

/// Broker entry metadata assigned when an entry is appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// Messages in the entry (a batch counts each of its messages).
    pub num_messages: u32,
    /// Broker publish time in milliseconds since the Unix epoch.
    pub publish_time_ms: u64,
    /// Cumulative index of the entry's last message.
    pub index: u64,
}

impl EntryHeader {
    /// Write this header ([`HEADER_LEN`] bytes) to `buf`; the bytes stored in the ledger
    /// are the header followed by the payload.
    pub fn put(&self, buf: &mut impl BufMut) {
        buf.put_u16(HEADER_MAGIC);
        buf.put_u8(HEADER_VERSION);
        buf.put_u8(0);
        buf.put_u32(self.num_messages);
        buf.put_u64(self.publish_time_ms);
        buf.put_u64(self.index);
    }

    /// Split stored bytes into header and payload (the payload shares `stored`'s buffer).
    pub fn decode(stored: &Bytes) -> Result<(EntryHeader, Bytes)> {
        let head = stored
            .get(..HEADER_LEN)
            .ok_or_else(|| StreamError::Corrupt(format!("entry of {} bytes is shorter than its header", stored.len())))?;
        let magic = u16::from_be_bytes([head[0], head[1]]);
        if magic != HEADER_MAGIC {
            return Err(StreamError::Corrupt(format!("bad entry header magic {magic:#06x}")));
        }
        if head[2] != HEADER_VERSION {
            return Err(StreamError::Corrupt(format!("unknown entry header version {}", head[2])));
        }
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let num_messages = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let header = EntryHeader { num_messages, publish_time_ms: word(8), index: word(16) };
        Ok((header, stored.slice(HEADER_LEN..)))
    }
}

/// One entry as readers see it: its position, its broker metadata and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub position: Position,
    pub publish_time_ms: u64,
    /// Cumulative index of the entry's last message.
    pub index: u64,
    pub num_messages: u32,
    pub data: Bytes,
}

impl Entry {
    /// Index of the entry's first message.
    pub fn first_index(&self) -> u64 {
        (self.index + 1).saturating_sub(u64::from(self.num_messages))
    }

    pub(crate) fn from_stored(position: Position, stored: &Bytes) -> Result<Entry> {
        let (h, data) = EntryHeader::decode(stored)?;
        Ok(Entry { position, publish_time_ms: h.publish_time_ms, index: h.index, num_messages: h.num_messages, data })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bytes stored in the ledger for `payload` under `h`.
    fn stored(h: &EntryHeader, payload: &[u8]) -> Bytes {
        let mut buf = bytes::BytesMut::new();
        h.put(&mut buf);
        buf.put_slice(payload);
        buf.freeze()
    }

    proptest! {
        #[test]
        fn header_round_trip(n in any::<u32>(), t in any::<u64>(), i in any::<u64>(), payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let h = EntryHeader { num_messages: n, publish_time_ms: t, index: i };
            let stored = stored(&h, &payload);
            prop_assert_eq!(stored.len(), HEADER_LEN + payload.len());
            let (back, data) = EntryHeader::decode(&stored).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(&data[..], &payload[..]);
        }

        #[test]
        fn decode_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = EntryHeader::decode(&Bytes::from(raw));
        }
    }

    #[test]
    fn short_and_foreign_entries_are_errors() {
        assert!(matches!(EntryHeader::decode(&Bytes::from_static(b"abc")), Err(StreamError::Corrupt(_))));
        let mut bad = stored(&EntryHeader { num_messages: 1, publish_time_ms: 2, index: 3 }, b"x").to_vec();
        bad[0] = 0;
        assert!(matches!(EntryHeader::decode(&Bytes::from(bad)), Err(StreamError::Corrupt(_))));
    }

    #[test]
    fn first_index_of_batch() {
        let e = Entry { position: Position::new(1, 0), publish_time_ms: 0, index: 9, num_messages: 10, data: Bytes::new() };
        assert_eq!(e.first_index(), 0);
    }
}
