//! Reading protobuf and frames without building objects, for the scanners of the hot
//! frames ([`crate::scan_send`], [`crate::scan_ack`]) and the control commands: every
//! reader gives up (None) on anything malformed, and the caller then leaves the frame to
//! a real protobuf decoder.

use std::ops::Range;

use crate::{WIRE_LEN, WIRE_VARINT};

/// A protobuf reader over a byte slice that gives up (None) on anything malformed.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// A varint of at most ten bytes that fits in 64 bits.
    pub(crate) fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            if i == 9 && b > 1 {
                return None;
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// The next field's number and wire type.
    pub(crate) fn tag(&mut self) -> Option<(u64, u64)> {
        let tag = self.varint()?;
        let field = tag >> 3;
        (field != 0).then_some((field, tag & 7))
    }

    /// Step over `n` bytes (a fixed32 or fixed64 value); None when fewer are left.
    pub(crate) fn skip(&mut self, n: usize) -> Option<()> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.buf.len())?;
        self.pos = end;
        Some(())
    }

    /// A length-delimited value: where it lies in the buffer.
    pub(crate) fn bytes(&mut self) -> Option<Range<usize>> {
        let len = usize::try_from(self.varint()?).ok()?;
        let end = self.pos.checked_add(len)?;
        if end > self.buf.len() {
            return None;
        }
        let range = self.pos..end;
        self.pos = end;
        Some(range)
    }
}

/// The field numbers (1 to 63) seen, as bits.
#[derive(Default)]
pub(crate) struct Seen(u64);

impl Seen {
    pub(crate) fn add(&mut self, number: u64) {
        if number < 64 {
            self.0 |= 1 << number;
        }
    }

    /// Whether field `number` was seen.
    pub(crate) fn has(&self, number: u64) -> bool {
        number < 64 && self.0 & (1 << number) != 0
    }

    /// Whether every field in `numbers` was seen.
    pub(crate) fn all(&self, numbers: &[u64]) -> Option<()> {
        numbers.iter().all(|&n| self.0 & (1 << n) != 0).then_some(())
    }
}

/// The complete frame at `pos` in `buf`: where its command lies, and where every byte
/// after the command up to the frame's end lies. None when the frame is incomplete, its
/// sizes do not agree, or it is larger than `max_frame` (counting what follows its
/// total-size field).
pub(crate) fn frame_at(buf: &[u8], pos: usize, max_frame: usize) -> Option<(Range<usize>, Range<usize>)> {
    let word = |at: usize| -> Option<usize> {
        let b = buf.get(at..at.checked_add(4)?)?;
        usize::try_from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])).ok()
    };
    let total = word(pos)?;
    if total > max_frame || total < 4 {
        return None;
    }
    let end = pos.checked_add(4)?.checked_add(total)?;
    if end > buf.len() {
        return None;
    }
    let command_size = word(pos + 4)?;
    if command_size > total - 4 {
        return None;
    }
    let split = pos + 8 + command_size;
    Some((pos + 8..split, split..end))
}

/// The frames at the start of `buf` that `scan` takes, one after another, into `found`;
/// returns how many bytes they take. `scan` gets a complete frame's command and the bytes
/// after it (see [`frame_at`]); the run stops at the first frame that is incomplete,
/// larger than `max_frame`, or that `scan` refuses, for the caller's general decoder.
pub(crate) fn scan_frames<T>(
    buf: &[u8],
    max_frame: usize,
    found: &mut Vec<T>,
    mut scan: impl FnMut(Range<usize>, Range<usize>) -> Option<T>,
) -> usize {
    let mut pos = 0;
    while let Some((command, rest)) = frame_at(buf, pos, max_frame) {
        let end = rest.end;
        let Some(item) = scan(command, rest) else { break };
        found.push(item);
        pos = end;
    }
    pos
}

/// Where the body of a plain `kind` command lies in `command`: a `BaseCommand` holding
/// just `type = kind` and the body in the field of that number, each once. None for
/// anything else.
pub(crate) fn plain_body(command: &[u8], kind: u64) -> Option<Range<usize>> {
    let mut r = Reader::new(command);
    let (mut is_kind, mut body) = (false, None);
    while !r.done() {
        match r.tag()? {
            (1, WIRE_VARINT) if !is_kind => is_kind = r.varint()? == kind,
            (number, WIRE_LEN) if number == kind && body.is_none() => body = Some(r.bytes()?),
            _ => return None,
        }
    }
    body.filter(|_| is_kind)
}
