//! The small wire encodings both sides use: Kafka's zig-zag varints (read), protobuf's
//! unsigned varints and length-delimited fields (written), and base64 (RFC 4648, standard
//! alphabet, padded) for bytes that must travel as text. Stored entries are read by
//! `magnetar_format`.

use crate::{corrupt, BatchError};

/// A cursor over a byte slice whose every read is bound-checked.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A zig-zag varint of at most 10 bytes (Kafka's varint and varlong).
    pub(crate) fn varint(&mut self) -> Result<i64, BatchError> {
        let mut value: u64 = 0;
        let mut shift = 0u32;
        loop {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(corrupt("record ends inside a varint"));
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                // Zig-zag: the low bit is the sign.
                let magnitude = i64::try_from(value >> 1).unwrap_or(i64::MAX);
                return Ok(if value & 1 == 0 {
                    magnitude
                } else {
                    -magnitude - 1
                });
            }
            shift += 7;
            if shift > 63 {
                return Err(corrupt("varint longer than 10 bytes"));
            }
        }
    }

    pub(crate) fn byte(&mut self) -> Result<u8, BatchError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| corrupt("record runs past the end of the batch"))?;
        self.pos += 1;
        Ok(b)
    }

    /// `n` bytes, which must lie before `end`.
    pub(crate) fn take(
        &mut self,
        n: usize,
        end: usize,
        what: &str,
    ) -> Result<&'a [u8], BatchError> {
        let stop = self
            .pos
            .checked_add(n)
            .filter(|&s| s <= end && s <= self.buf.len())
            .ok_or_else(|| corrupt(format!("{what} runs past the end of its record")))?;
        let out = &self.buf[self.pos..stop];
        self.pos = stop;
        Ok(out)
    }

    /// A varint length followed by that many bytes; length -1 is null.
    pub(crate) fn blob(&mut self, end: usize, what: &str) -> Result<Option<&'a [u8]>, BatchError> {
        let n = self.varint()?;
        if n == -1 {
            return Ok(None);
        }
        let n = usize::try_from(n).map_err(|_| corrupt(format!("negative length {n}")))?;
        self.take(n, end, what).map(Some)
    }
}

/// Append `v` as a protobuf varint.
pub(crate) fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Append `v` as a Kafka record varint (zigzag).
pub(crate) fn put_varint(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Append a Kafka record's byte field: its varint length, -1 for null, then the bytes.
pub(crate) fn put_blob(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

/// Headers as a record holds them, each name and value a [`put_blob`] (no count before).
#[cfg(test)]
pub(crate) fn record_headers(headers: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(name, value) in headers {
        put_blob(&mut out, Some(name));
        put_blob(&mut out, value);
    }
    out
}

/// Append a length-delimited protobuf field: tag, length, bytes.
pub(crate) fn put_bytes_field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_uvarint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The length of `n` bytes once base64-encoded with padding.
pub(crate) fn base64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Append `data` base64-encoded (standard alphabet, `=` padding).
pub(crate) fn put_base64(out: &mut Vec<u8>, data: &[u8]) {
    let sym = |i: u32| ALPHABET[(i & 0x3f) as usize];
    let mut chunks = data.chunks_exact(3);
    for c in &mut chunks {
        let n = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
        out.extend_from_slice(&[sym(n >> 18), sym(n >> 12), sym(n >> 6), sym(n)]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend_from_slice(&[sym(n >> 18), sym(n >> 12), b'=', b'=']);
        }
        [a, b] => {
            let n = (u32::from(a) << 16) | (u32::from(b) << 8);
            out.extend_from_slice(&[sym(n >> 18), sym(n >> 12), sym(n >> 6), b'=']);
        }
        _ => {}
    }
}

/// Decode canonical base64 (standard alphabet, padded to a multiple of four); None for
/// anything else.
pub(crate) fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let pad = text.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let body = &text[..text.len() - pad];
    for chunk in body.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let decoded = if chunk.len() == 4 { 3 } else { chunk.len() - 1 };
        out.extend_from_slice(&bytes[..decoded]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zigzag(v: i64) -> Vec<u8> {
        let mut out = Vec::new();
        put_uvarint(&mut out, ((v << 1) ^ (v >> 63)) as u64);
        out
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = Vec::new();
            put_base64(&mut out, plain.as_bytes());
            assert_eq!(out, coded.as_bytes());
            assert_eq!(base64_len(plain.len()), coded.len());
        }
    }

    #[test]
    fn base64_decodes_canonical_text_only() {
        for plain in ["", "f", "fo", "foo", "foob", "fooba", "foobar"] {
            let mut coded = Vec::new();
            put_base64(&mut coded, plain.as_bytes());
            assert_eq!(decode_base64(&coded).as_deref(), Some(plain.as_bytes()));
        }
        for bad in ["Zg=", "Z===", "Zm9v!A==", "Zg==Zg=="] {
            assert_eq!(decode_base64(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn a_varint_past_ten_bytes_is_corrupt() {
        let bytes = [0xffu8; 11];
        assert!(matches!(
            Reader::new(&bytes).varint(),
            Err(BatchError::Corrupt(_))
        ));
        assert!(matches!(
            Reader::new(&[0x80]).varint(),
            Err(BatchError::Corrupt(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn zigzag_varints_round_trip(v in proptest::num::i64::ANY) {
            let bytes = zigzag(v);
            let mut r = Reader::new(&bytes);
            proptest::prop_assert_eq!(r.varint().expect("varint"), v);
            proptest::prop_assert_eq!(r.remaining(), 0);
        }
    }
}
