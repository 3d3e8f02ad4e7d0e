//! The frame a ledger entry is stored in on the bookies (sans-IO).
//!
//! Bookies store opaque bytes; the ledger client wraps each payload in a small header, as
//! BookKeeper does with its digest header:
//!
//! ```text
//! offset  size  field
//! 0       1     format version (1)
//! 1       8     ledger length up to and including this entry, big-endian u64
//! 9       4     CRC32C over ledger id (BE u64), entry id (BE u64), bytes 0..9 and payload
//! 13      ...   payload
//! ```
//!
//! The running length lets recovery set the closed ledger's `length` from the last entry
//! alone; the checksum, seeded with the ledger and entry ids, catches both corrupt bytes and
//! an entry served for the wrong position.
//!
//! ```
//! use bytes::Bytes;
//! use magnetar_ledger::entry::{decode, encode};
//! let framed = encode(7, 3, 42, &Bytes::from_static(b"hello"));
//! let e = decode(7, 3, &framed).unwrap();
//! assert_eq!((e.length, &e.payload[..]), (42, &b"hello"[..]));
//! assert!(decode(7, 4, &framed).is_err());
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use magnetar_bookie::FrameLimit;

/// The format version written by [`encode`].
pub const FORMAT_VERSION: u8 = 1;
/// Bytes of header before the payload.
pub const HEADER_LEN: usize = 13;
/// The largest payload one entry can carry under the hard cap on bookie frames.
pub const MAX_PAYLOAD: usize = max_payload(FrameLimit::MAX);

/// The largest payload one entry can carry in frames of at most `limit`: what one frame
/// holds of an entry (see [`FrameLimit::max_entry`]), less the header.
pub const fn max_payload(limit: FrameLimit) -> usize {
    limit.max_entry() - HEADER_LEN
}

/// Why a stored entry was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("entry of {0} bytes is shorter than its {HEADER_LEN}-byte header")]
    Truncated(usize),
    #[error("unknown entry format version {0}")]
    UnknownVersion(u8),
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

/// A payload taken out of its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedEntry {
    /// Ledger length (payload bytes) up to and including this entry.
    pub length: u64,
    /// The payload, sharing the frame's buffer.
    pub payload: Bytes,
}

fn checksum(ledger: u64, entry: u64, head: &[u8], payload: &[u8]) -> u32 {
    let mut crc = crc32c::crc32c(&ledger.to_be_bytes());
    crc = crc32c::crc32c_append(crc, &entry.to_be_bytes());
    crc = crc32c::crc32c_append(crc, head);
    crc32c::crc32c_append(crc, payload)
}

/// An entry's payload in two pieces stored back to back: a caller that puts its own header
/// before a payload it already holds hands over both, and the ledger's frame is their one
/// copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload {
    /// The first piece (may be empty).
    pub head: Bytes,
    /// The rest.
    pub body: Bytes,
}

impl Payload {
    /// Bytes of payload, both pieces.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// True when both pieces are empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Payload {
    fn from(body: Bytes) -> Payload {
        Payload { head: Bytes::new(), body }
    }
}

/// Frame `payload` as entry `entry` of `ledger`, whose length after this entry is `length`.
pub fn encode(ledger: u64, entry: u64, length: u64, payload: &Bytes) -> Bytes {
    encode_parts(ledger, entry, length, &[], payload)
}

/// Frame the payload `head` followed by `body`, as [`encode`] frames their concatenation.
pub fn encode_parts(ledger: u64, entry: u64, length: u64, head: &[u8], body: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + head.len() + body.len());
    buf.put_u8(FORMAT_VERSION);
    buf.put_u64(length);
    let crc = crc32c::crc32c_append(checksum(ledger, entry, &buf[..9], head), body);
    buf.put_u32(crc);
    buf.extend_from_slice(head);
    buf.extend_from_slice(body);
    buf.freeze()
}

/// Check and unwrap a frame read back as entry `entry` of `ledger`.
pub fn decode(ledger: u64, entry: u64, framed: &Bytes) -> Result<DecodedEntry, EntryError> {
    if framed.len() < HEADER_LEN {
        return Err(EntryError::Truncated(framed.len()));
    }
    let version = framed[0];
    if version != FORMAT_VERSION {
        return Err(EntryError::UnknownVersion(version));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&framed[1..9]);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(&framed[9..HEADER_LEN]);
    let stored = u32::from_be_bytes(crc_bytes);
    let payload = framed.slice(HEADER_LEN..);
    let computed = checksum(ledger, entry, &framed[..9], &payload);
    if stored != computed {
        return Err(EntryError::Checksum { stored, computed });
    }
    Ok(DecodedEntry { length: u64::from_be_bytes(len_bytes), payload })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(ledger: u64, entry: u64, length: u64, payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let payload = Bytes::from(payload);
            let framed = encode(ledger, entry, length, &payload);
            prop_assert_eq!(framed.len(), HEADER_LEN + payload.len());
            let d = decode(ledger, entry, &framed).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(d.length, length);
            prop_assert_eq!(d.payload, payload);
        }

        #[test]
        fn a_payload_in_two_pieces_frames_as_their_concatenation(
            ledger: u64, entry: u64, length: u64,
            payload in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..512,
        ) {
            let cut = cut.min(payload.len());
            let whole = encode(ledger, entry, length, &Bytes::from(payload.clone()));
            prop_assert_eq!(encode_parts(ledger, entry, length, &payload[..cut], &payload[cut..]), whole);
        }

        #[test]
        fn any_single_bit_flip_is_caught(payload in proptest::collection::vec(any::<u8>(), 0..64), bit in 0usize..(8 * (HEADER_LEN + 64))) {
            let framed = encode(1, 2, 3, &Bytes::from(payload));
            let mut bytes = framed.to_vec();
            let bit = bit % (8 * bytes.len());
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode(1, 2, &Bytes::from(bytes)).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(5, 6, &Bytes::from(bytes));
        }
    }

    #[test]
    fn short_and_foreign_frames_are_rejected() {
        assert_eq!(decode(1, 1, &Bytes::from_static(b"abc")), Err(EntryError::Truncated(3)));
        let mut framed = encode(1, 1, 0, &Bytes::new()).to_vec();
        framed[0] = 9;
        assert_eq!(decode(1, 1, &Bytes::from(framed)), Err(EntryError::UnknownVersion(9)));
        let framed = encode(1, 1, 0, &Bytes::from_static(b"x"));
        assert!(matches!(decode(2, 1, &framed), Err(EntryError::Checksum { .. })));
    }
}
