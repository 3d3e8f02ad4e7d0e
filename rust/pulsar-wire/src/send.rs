//! A scan of SEND frames in the shape every client writes, without building protobuf
//! objects.
//!
//! [`scan_send`] accepts a SEND only in a plain shape: a `BaseCommand` holding just
//! `type = SEND` and `send`; a `CommandSend` of scalar fields only; and, when the entry's
//! magic and CRC-32C are right, a `MessageMetadata` whose fields are all known, each with
//! its own wire type, whose strings are UTF-8 (those inside `properties` too), and without
//! `encryption_keys` or the chunk fields (a chunk of a large message: the broker notes
//! those on the general path); and every required field present (`producer_id` and `sequence_id`;
//! `producer_name`, `sequence_id` and `publish_time`; a property's key and value), so the
//! caller need not check that again. Anything else - unknown or nested fields, a malformed varint, a
//! metadata size past the frame - gives `None`, and the caller decodes the frame the
//! general way, which also says what is wrong with it. So the scan never has to agree
//! with a protobuf parser on odd input: it only picks out the common case.

use std::ops::Range;

use magnetar_format::entry::{checksum_ok, ENTRY_HEADER_SIZE};

use crate::read::{plain_body, scan_frames, Reader, Seen};
use crate::{TYPE_SEND, WIRE_LEN, WIRE_VARINT};

/// What [`scan_send`] found in a plain SEND.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendScan {
    /// Where the `CommandSend` body lies in the command.
    pub body: Range<usize>,
    /// The body's fields (the defaults where absent: 1 message, highest sequence id 0).
    pub send: SendFields,
    /// Whether the entry's magic and CRC-32C are right.
    pub checksum_ok: bool,
    /// Where the `MessageMetadata` lies in the entry (empty when the checksum is wrong).
    pub metadata: Range<usize>,
    /// Whether the metadata asks for delayed delivery (`deliver_at_time`, field 19).
    pub delayed: bool,
}

/// The fields of a plain `CommandSend` a broker acts on; a repeated field's last value
/// counts, as in protobuf. The transaction, chunk and marker fields are accepted and not
/// reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendFields {
    pub producer_id: u64,
    pub sequence_id: u64,
    pub num_messages: u32,
    pub highest_sequence_id: u64,
}

/// A plain SEND frame found by [`scan_sends`]: the scan of its parts, and where its entry
/// (every byte after the command) lies in the buffer scanned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundSend {
    pub scan: SendScan,
    pub entry: Range<usize>,
}

/// How a plain `MessageMetadata` may hold each field.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Varint,
    Text,
    Bytes,
    KeyValue,
}

/// `MessageMetadata` fields by number (PulsarApi.proto); `encryption_keys` (13), the chunk
/// fields (`uuid` 26, `num_chunks_from_msg` 27, `total_chunk_msg_size` 28, `chunk_id` 29)
/// and any number not listed here make the metadata not plain.
fn metadata_field(number: u64) -> Option<Kind> {
    Some(match number {
        2 | 3 | 8 | 9 | 11 | 12 | 17 | 19 | 20 | 22 | 23 | 24 | 25 | 30 => Kind::Varint,
        1 | 5 | 6 | 7 | 14 => Kind::Text,
        15 | 16 | 18 => Kind::Bytes,
        4 => Kind::KeyValue,
        _ => return None,
    })
}

fn utf8(buf: &[u8]) -> Option<()> {
    std::str::from_utf8(buf).ok().map(|_| ())
}

/// A `KeyValue` of two strings, nothing else.
fn plain_key_value(buf: &[u8]) -> Option<()> {
    let mut r = Reader::new(buf);
    let mut seen = Seen::default();
    while !r.done() {
        match r.tag()? {
            (number @ (1 | 2), WIRE_LEN) => {
                utf8(&buf[r.bytes()?])?;
                seen.add(number);
            }
            _ => return None,
        }
    }
    seen.all(&[1, 2])
}

/// `deliver_at_time` (PulsarApi.proto).
const DELIVER_AT_TIME: u64 = 19;

/// Whether `buf` is a plain `MessageMetadata`; Some(whether it holds `deliver_at_time`).
fn plain_metadata(buf: &[u8]) -> Option<bool> {
    let mut r = Reader::new(buf);
    let mut seen = Seen::default();
    while !r.done() {
        let (number, wire) = r.tag()?;
        seen.add(number);
        match (metadata_field(number)?, wire) {
            (Kind::Varint, WIRE_VARINT) => {
                r.varint()?;
            }
            (Kind::Text, WIRE_LEN) => utf8(&buf[r.bytes()?])?,
            (Kind::Bytes, WIRE_LEN) => {
                r.bytes()?;
            }
            (Kind::KeyValue, WIRE_LEN) => plain_key_value(&buf[r.bytes()?])?,
            _ => return None,
        }
    }
    seen.all(&[1, 2, 3])?;
    Some(seen.has(DELIVER_AT_TIME))
}

/// A `CommandSend` of scalar fields (1-8) only, and a `num_messages` that fits its
/// `int32` without being negative.
fn plain_send(buf: &[u8]) -> Option<SendFields> {
    let mut r = Reader::new(buf);
    let mut seen = Seen::default();
    let mut send = SendFields { producer_id: 0, sequence_id: 0, num_messages: 1, highest_sequence_id: 0 };
    while !r.done() {
        match r.tag()? {
            (number @ 1..=8, WIRE_VARINT) => {
                let value = r.varint()?;
                match number {
                    1 => send.producer_id = value,
                    2 => send.sequence_id = value,
                    3 => send.num_messages = u32::try_from(value).ok().filter(|&n| n <= i32::MAX as u32)?,
                    6 => send.highest_sequence_id = value,
                    _ => {}
                }
                seen.add(number);
            }
            _ => return None,
        }
    }
    seen.all(&[1, 2])?;
    Some(send)
}

/// Scan a frame that should be a plain SEND: its `command` and the `entry` after it; see
/// the module docs.
pub fn scan_send(command: &[u8], entry: &[u8]) -> Option<SendScan> {
    let body = plain_body(command, TYPE_SEND)?;
    let send = plain_send(&command[body.clone()])?;
    if !checksum_ok(entry) {
        return Some(SendScan { body, send, checksum_ok: false, metadata: 0..0, delayed: false });
    }
    let size = u32::from_be_bytes([entry[6], entry[7], entry[8], entry[9]]);
    let end = ENTRY_HEADER_SIZE.checked_add(usize::try_from(size).ok()?)?;
    let metadata = entry.get(ENTRY_HEADER_SIZE..end)?;
    let delayed = plain_metadata(metadata)?;
    Some(SendScan { body, send, checksum_ok: true, metadata: ENTRY_HEADER_SIZE..end, delayed })
}

/// The plain SEND frames at the start of `buf`, one after another, into `found`; returns
/// how many bytes they take. Scanning stops at the first frame that is incomplete, larger
/// than `max_frame` (counting what follows its total-size field), malformed, or not a
/// plain SEND (see [`scan_send`]): the caller decodes that one the general way, which also
/// says what is wrong with it.
pub fn scan_sends(buf: &[u8], max_frame: usize, found: &mut Vec<FoundSend>) -> usize {
    scan_frames(buf, max_frame, found, |command, entry| {
        Some(FoundSend { scan: scan_send(&buf[command], &buf[entry.clone()])?, entry })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::len_field;
    use magnetar_format::entry::MAGIC_CRC32C;


    fn entry(metadata: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut body = (metadata.len() as u32).to_be_bytes().to_vec();
        body.extend_from_slice(metadata);
        body.extend_from_slice(payload);
        let mut out = MAGIC_CRC32C.to_be_bytes().to_vec();
        out.extend(crc32c::crc32c(&body).to_be_bytes());
        out.extend(body);
        out
    }

    fn command(send: &[u8]) -> Vec<u8> {
        let mut command = vec![0x08, TYPE_SEND as u8];
        command.extend(len_field(TYPE_SEND, send));
        command
    }

    fn metadata() -> Vec<u8> {
        let mut md = len_field(1, b"producer");
        md.extend([0x10, 0x07, 0x18, 0x01]);
        md.extend(len_field(4, &[len_field(1, b"k"), len_field(2, b"v")].concat()));
        md
    }

    #[test]
    fn a_plain_send_is_found() {
        let e = entry(&metadata(), b"payload");
        let c = command(&[0x08, 0x01, 0x10, 0x02]);
        let scan = scan_send(&c, &e).unwrap();
        assert!(scan.checksum_ok);
        assert_eq!(&c[scan.body.clone()], &[0x08, 0x01, 0x10, 0x02]);
        assert_eq!(&e[scan.metadata], &metadata()[..]);
    }

    #[test]
    fn the_send_fields_and_delayed_delivery_are_reported() {
        let e = entry(&metadata(), b"payload");
        let scan = scan_send(&command(&[0x08, 0x05, 0x10, 0x09]), &e).unwrap();
        let defaults = SendFields { producer_id: 5, sequence_id: 9, num_messages: 1, highest_sequence_id: 0 };
        assert_eq!(scan.send, defaults);
        assert!(!scan.delayed);
        // num_messages 3, highest_sequence_id 11, and a repeated producer id: the last counts.
        let c = command(&[0x08, 0x05, 0x10, 0x09, 0x18, 0x03, 0x30, 0x0b, 0x08, 0x06]);
        let delayed = entry(&[metadata(), vec![0x98, 0x01, 0x2a]].concat(), b"payload");
        let scan = scan_send(&c, &delayed).unwrap();
        assert_eq!(scan.send, SendFields { producer_id: 6, sequence_id: 9, num_messages: 3, highest_sequence_id: 11 });
        assert!(scan.delayed);
        // A negative num_messages (a ten-byte varint) is the general decoder's to judge.
        let negative = [&[0x08, 0x05, 0x10, 0x09, 0x18][..], &[0xff; 9], &[0x01]].concat();
        assert_eq!(scan_send(&command(&negative), &e), None);
    }

    fn frame(command: &[u8], entry: &[u8]) -> Vec<u8> {
        let mut out = ((4 + command.len() + entry.len()) as u32).to_be_bytes().to_vec();
        out.extend((command.len() as u32).to_be_bytes());
        out.extend_from_slice(command);
        out.extend_from_slice(entry);
        out
    }

    #[test]
    fn a_run_of_sends_is_scanned_up_to_the_first_frame_that_is_not_one() {
        let e = entry(&metadata(), b"payload");
        let sends: Vec<Vec<u8>> = (1..=3u8).map(|seq| frame(&command(&[0x08, 0x01, 0x10, seq]), &e)).collect();
        let ping = frame(&[0x08, 0x12, 0x92, 0x01, 0x00], &[]);
        let buf = [sends.concat(), ping.clone(), sends[0].clone()].concat();
        let mut found = Vec::new();
        let used = scan_sends(&buf, 1 << 20, &mut found);
        assert_eq!(used, sends.concat().len());
        assert_eq!(found.iter().map(|f| f.scan.send.sequence_id).collect::<Vec<_>>(), [1, 2, 3]);
        for f in &found {
            assert_eq!(&buf[f.entry.clone()], &e[..]);
        }
        // A frame cut short, or one over the size limit, ends the run before it.
        for (limit, cut) in [(1 << 20, 1), (sends[0].len() - 5, 0)] {
            let mut found = Vec::new();
            let buf = [sends[0].clone(), sends[1][..sends[1].len() - cut].to_vec()].concat();
            let used = scan_sends(&buf, limit, &mut found);
            let expected = if cut > 0 { sends[0].len() } else { 0 };
            assert_eq!((used, found.len()), (expected, expected / sends[0].len()));
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_gives_a_clean_scan() {
        let e = entry(&metadata(), b"payload");
        let good = frame(&command(&[0x08, 0x01, 0x10, 0x02]), &e);
        for n in 0..good.len() {
            for bit in 0..8 {
                let mut g = good.clone();
                g[n] ^= 1 << bit;
                let mut found = Vec::new();
                // A flip may leave a SEND (a wrong checksum is still one), or a shorter
                // frame and bytes after it: the frames found end where the scan stopped.
                let used = scan_sends(&g, 1 << 20, &mut found);
                assert!(used <= g.len());
                assert_eq!(found.last().map_or(0, |f| f.entry.end), used);
                assert!(found.iter().all(|f| f.entry.start <= f.entry.end));
            }
        }
    }

    #[test]
    fn a_bad_checksum_is_reported_not_refused() {
        let mut e = entry(&metadata(), b"payload");
        let last = e.len() - 1;
        e[last] ^= 1;
        assert!(!scan_send(&command(&[0x08, 0x01, 0x10, 0x02]), &e).unwrap().checksum_ok);
    }

    #[test]
    fn anything_unusual_is_left_to_the_general_decoder() {
        let plain = entry(&metadata(), b"p");
        let bad_utf8 = entry(&len_field(1, b"\xff"), b"p");
        let unknown = entry(&[metadata(), len_field(99, b"x")].concat(), b"p");
        let encrypted = entry(&[metadata(), len_field(13, b"")].concat(), b"p");
        let wrong_wire = entry(&[0x0a, 0x01], b"p");
        let no_publish_time = entry(&[len_field(1, b"p"), vec![0x10, 0x07]].concat(), b"p");
        let half_property = entry(&[metadata(), len_field(4, &len_field(1, b"k"))].concat(), b"p");
        let mut past_end = entry(&metadata(), b"");
        past_end[9] += 1;
        for e in [&bad_utf8, &unknown, &encrypted, &wrong_wire, &no_publish_time, &half_property] {
            assert_eq!(scan_send(&command(&[0x08, 0x01, 0x10, 0x01]), e), None);
        }
        // CommandSend without its sequence id.
        assert_eq!(scan_send(&command(&[0x08, 0x01]), &plain), None);
        let scan = scan_send(&command(&[0x08, 0x01, 0x10, 0x01]), &past_end);
        assert!(scan.is_none() || !scan.unwrap().checksum_ok);
        // A message id in the send, or a command that is not a plain SEND.
        assert_eq!(scan_send(&command(&len_field(9, &[0x08, 0x01, 0x10, 0x01])), &plain), None);
        assert_eq!(scan_send(&[0x08, 0x09], &plain), None);
        assert_eq!(scan_send(&[0x08], &plain), None);
        assert_eq!(scan_send(&[0x08, 0x06], &plain), None);
        // An overlong varint.
        assert_eq!(scan_send(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], &plain), None);
    }

    #[test]
    fn every_truncation_and_byte_flip_is_a_clean_answer() {
        let e = entry(&metadata(), b"payload");
        let c = command(&[0x08, 0x01, 0x10, 0x02]);
        for (part, other) in [(&c, &e), (&e, &c)] {
            for n in 0..part.len() {
                let _ = scan_send(&part[..n], other);
                let _ = scan_send(other, &part[..n]);
                for bit in 0..8 {
                    let mut g = part.clone();
                    g[n] ^= 1 << bit;
                    let _ = scan_send(&g, other);
                    let _ = scan_send(other, &g);
                }
            }
        }
    }
}
