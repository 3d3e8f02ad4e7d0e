//! The Pulsar binary protocol's hot frames, written (and SEND and ACK scanned, see
//! [`scan_send`] and [`scan_ack`])
//! without building protobuf objects.
//!
//! A broker sends one MESSAGE frame per delivered entry and one SEND_RECEIPT per stored
//! entry. Both commands are small, fixed-shape protobuf messages, so they are written
//! here field by field, in field-number order, exactly as a protobuf encoder writes them
//! (proto2, `repeated int64` unpacked): the bytes equal what `BaseCommand.SerializeToString`
//! gives for the same fields, which the Python tests check frame by frame. A message id's
//! `partition` is left out when it is -1 (its default: not a partition).
//!
//! Framing (Pulsar binary protocol, "Framing"; payload commands)::
//!
//! ```text
//! [totalSize u32][commandSize u32][BaseCommand]
//!     [0x0e02 u16][size u32][BrokerEntryMetadata]      optional
//!     [stored entry: 0x0e01 u16][crc32c u32][metadataSize u32][MessageMetadata][payload]
//! ```
//!
//! ```
//! use magnetar_pulsar_wire::{write_message, Delivery};
//! let mut out = Vec::new();
//! let entry = [0x0e, 0x01, 0, 0, 0, 0, 0, 0, 0, 0];
//! let delivery = Delivery { ledger_id: 3, entry_id: 4, redelivery_count: 0, ack_set: &[],
//!                           broker_entry: None, entry: &entry };
//! write_message(&mut out, 1, -1, &delivery).unwrap();
//! assert_eq!(&out[..4], &(out.len() as u32 - 4).to_be_bytes());
//! assert!(out.ends_with(&entry));
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod ack;
pub mod control;
mod read;
mod send;

/// Protobuf bytes for the scanners' tests.
#[cfg(test)]
pub(crate) mod testing {
    pub(crate) fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    pub(crate) fn len_field(field: u64, body: &[u8]) -> Vec<u8> {
        let mut out = varint((field << 3) | crate::WIRE_LEN);
        out.extend(varint(body.len() as u64));
        out.extend_from_slice(body);
        out
    }
}

pub use ack::{scan_ack, scan_acks, AckScan, AckedId};
pub use send::{scan_send, scan_sends, FoundSend, SendFields, SendScan};

/// `BaseCommand.Type` values (PulsarApi.proto); a command's body is the field of the same
/// number.
pub const TYPE_SEND: u64 = 6;
pub const TYPE_SEND_RECEIPT: u64 = 7;
pub const TYPE_MESSAGE: u64 = 9;
pub const TYPE_ACK: u64 = 10;
use bytes::BufMut;
use magnetar_format::entry::MAGIC_BROKER_ENTRY_METADATA;

/// Why a frame could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The frame would not fit the 32-bit size field of the framing.
    FrameTooLarge(usize),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::FrameTooLarge(n) => write!(f, "frame of {n} bytes does not fit its size field"),
        }
    }
}

impl std::error::Error for WireError {}

const WIRE_VARINT: u64 = 0;
const WIRE_LEN: u64 = 2;

fn put_varint(out: &mut impl BufMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

fn put_tag(out: &mut impl BufMut, field: u64, wire: u64) {
    put_varint(out, (field << 3) | wire);
}

/// A varint field; signed protobuf types (int32, int64) are written as their 64-bit two's
/// complement, as protobuf does.
fn put_field(out: &mut impl BufMut, field: u64, v: u64) {
    put_tag(out, field, WIRE_VARINT);
    put_varint(out, v);
}

fn field_len(field: u64, v: u64) -> usize {
    varint_len(field << 3) + varint_len(v)
}

fn len_field_len(field: u64, body: usize) -> usize {
    varint_len(field << 3) + varint_len(body as u64) + body
}

/// Two's complement of an int32/int64 as protobuf puts it on the wire.
fn signed(v: i64) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes())
}

/// The partition of a message id, unless it is the default (-1).
fn partition_field(partition: i32) -> Option<u64> {
    (partition != -1).then(|| signed(i64::from(partition)))
}

/// `MessageIdData { ledgerId, entryId, partition }` body length.
fn message_id_len(ledger_id: u64, entry_id: u64, partition: i32) -> usize {
    field_len(1, ledger_id) + field_len(2, entry_id) + partition_field(partition).map_or(0, |p| field_len(3, p))
}

fn put_message_id(out: &mut impl BufMut, field: u64, ledger_id: u64, entry_id: u64, partition: i32) {
    put_tag(out, field, WIRE_LEN);
    put_varint(out, message_id_len(ledger_id, entry_id, partition) as u64);
    put_field(out, 1, ledger_id);
    put_field(out, 2, entry_id);
    if let Some(p) = partition_field(partition) {
        put_field(out, 3, p);
    }
}

/// The frame's two size fields, checked to fit in 32 bits.
fn put_sizes(out: &mut impl BufMut, total: usize, command: usize) -> Result<(), WireError> {
    let total32 = u32::try_from(total).map_err(|_| WireError::FrameTooLarge(total))?;
    let command32 = u32::try_from(command).map_err(|_| WireError::FrameTooLarge(total))?;
    out.put_slice(&total32.to_be_bytes());
    out.put_slice(&command32.to_be_bytes());
    Ok(())
}

/// The broker entry metadata written in front of an entry: `broker_timestamp` and the
/// `index` (offset of the entry's last message), each only when known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerEntry {
    pub publish_time: Option<u64>,
    pub index: Option<u64>,
}

impl BrokerEntry {
    fn body_len(&self) -> usize {
        self.publish_time.map_or(0, |t| field_len(1, t)) + self.index.map_or(0, |i| field_len(2, i))
    }

    fn section_len(&self) -> usize {
        6 + self.body_len()
    }

    /// Write the `0x0e02` section: magic, size, `BrokerEntryMetadata`.
    pub fn write(&self, out: &mut impl BufMut) {
        out.put_slice(&MAGIC_BROKER_ENTRY_METADATA.to_be_bytes());
        let body = self.body_len() as u32;
        out.put_slice(&body.to_be_bytes());
        if let Some(t) = self.publish_time {
            put_field(out, 1, t);
        }
        if let Some(i) = self.index {
            put_field(out, 2, i);
        }
    }
}

/// One entry to deliver to a consumer.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub ledger_id: u64,
    pub entry_id: u64,
    /// Written only when not zero (its default).
    pub redelivery_count: u32,
    /// Batch-index ack set: bits set for messages still to deliver; empty for none.
    pub ack_set: &'a [i64],
    /// Written in front of the entry when given (for clients that asked for it).
    pub broker_entry: Option<BrokerEntry>,
    /// The stored entry, spliced in unchanged.
    pub entry: &'a [u8],
}

/// Size of the `CommandMessage` body of a delivery.
fn command_message_len(consumer_id: u64, partition: i32, d: &Delivery<'_>) -> usize {
    let mut n = field_len(1, consumer_id)
        + len_field_len(2, message_id_len(d.ledger_id, d.entry_id, partition));
    if d.redelivery_count != 0 {
        n += field_len(3, u64::from(d.redelivery_count));
    }
    n += d.ack_set.iter().map(|&a| field_len(4, signed(a))).sum::<usize>();
    n
}

/// The sizes of `d`'s MESSAGE frame: its command body, its command, and its total size
/// (the frame's length less the 4 bytes of the total-size field).
fn message_sizes(consumer_id: u64, partition: i32, d: &Delivery<'_>) -> (usize, usize, usize) {
    let body = command_message_len(consumer_id, partition, d);
    let command = field_len(1, TYPE_MESSAGE) + len_field_len(TYPE_MESSAGE, body);
    let section = d.broker_entry.map_or(0, |b| b.section_len());
    (body, command, 4 + command + section + d.entry.len())
}

/// The length of the MESSAGE frame [`write_message`] writes for `d`.
pub fn message_frame_len(consumer_id: u64, partition: i32, d: &Delivery<'_>) -> usize {
    4 + message_sizes(consumer_id, partition, d).2
}

/// Append one MESSAGE frame for `d`, addressed to `consumer_id`; `partition` goes into
/// the message id (-1 for a non-partitioned topic). Returns the frame's length. `out` may
/// be a buffer of exactly [`message_frame_len`] bytes.
pub fn write_message(out: &mut impl BufMut, consumer_id: u64, partition: i32, d: &Delivery<'_>) -> Result<usize, WireError> {
    let (body, command, total) = message_sizes(consumer_id, partition, d);
    put_sizes(out, total, command)?;
    put_field(out, 1, TYPE_MESSAGE);
    put_tag(out, TYPE_MESSAGE, WIRE_LEN);
    put_varint(out, body as u64);
    put_field(out, 1, consumer_id);
    put_message_id(out, 2, d.ledger_id, d.entry_id, partition);
    if d.redelivery_count != 0 {
        put_field(out, 3, u64::from(d.redelivery_count));
    }
    for &a in d.ack_set {
        put_field(out, 4, signed(a));
    }
    if let Some(b) = d.broker_entry {
        b.write(out);
    }
    out.put_slice(d.entry);
    Ok(4 + total)
}

/// Where a stored entry landed, as a SEND_RECEIPT reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub producer_id: u64,
    pub sequence_id: u64,
    pub ledger_id: u64,
    pub entry_id: u64,
    pub partition: i32,
    pub highest_sequence_id: u64,
}

/// Append one SEND_RECEIPT frame. Returns the frame's length.
pub fn write_send_receipt(out: &mut impl BufMut, r: &Receipt) -> Result<usize, WireError> {
    let body = field_len(1, r.producer_id)
        + field_len(2, r.sequence_id)
        + len_field_len(3, message_id_len(r.ledger_id, r.entry_id, r.partition))
        + field_len(4, r.highest_sequence_id);
    let command = field_len(1, TYPE_SEND_RECEIPT) + len_field_len(TYPE_SEND_RECEIPT, body);
    put_sizes(out, 4 + command, command)?;
    put_field(out, 1, TYPE_SEND_RECEIPT);
    put_tag(out, TYPE_SEND_RECEIPT, WIRE_LEN);
    put_varint(out, body as u64);
    put_field(out, 1, r.producer_id);
    put_field(out, 2, r.sequence_id);
    put_message_id(out, 3, r.ledger_id, r.entry_id, r.partition);
    put_field(out, 4, r.highest_sequence_id);
    Ok(8 + command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A minimal protobuf reader for the tests: (field, wire type, value or bytes).
    fn read_varint(buf: &[u8], pos: &mut usize) -> u64 {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = buf[*pos];
            *pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    fn fields(buf: &[u8]) -> Vec<(u64, Result<u64, Vec<u8>>)> {
        let mut pos = 0;
        let mut out = Vec::new();
        while pos < buf.len() {
            let tag = read_varint(buf, &mut pos);
            if tag & 7 == WIRE_LEN {
                let n = read_varint(buf, &mut pos) as usize;
                out.push((tag >> 3, Err(buf[pos..pos + n].to_vec())));
                pos += n;
            } else {
                out.push((tag >> 3, Ok(read_varint(buf, &mut pos))));
            }
        }
        out
    }

    fn message_id_fields(ledger_id: u64, entry_id: u64, partition: i32) -> Vec<(u64, Result<u64, Vec<u8>>)> {
        let mut want = vec![(1, Ok(ledger_id)), (2, Ok(entry_id))];
        if partition != -1 {
            want.push((3, Ok(signed(i64::from(partition)))));
        }
        want
    }

    #[test]
    fn varint_lengths_match_what_is_written() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
        }
    }

    proptest! {
        #[test]
        fn message_frames_hold_what_was_given(
            consumer_id in any::<u64>(), partition in prop_oneof![Just(-1), any::<i32>()], ledger_id in any::<u64>(),
            entry_id in any::<u64>(), redelivery_count in any::<u32>(),
            ack_set in proptest::collection::vec(any::<i64>(), 0..4),
            publish_time in proptest::option::of(any::<u64>()), index in proptest::option::of(any::<u64>()),
            with_section in any::<bool>(), entry in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let broker_entry = with_section.then_some(BrokerEntry { publish_time, index });
            let d = Delivery { ledger_id, entry_id, redelivery_count, ack_set: &ack_set, broker_entry, entry: &entry };
            let mut out = vec![0xaa];
            let n = write_message(&mut out, consumer_id, partition, &d).unwrap();
            let frame = &out[1..];
            prop_assert_eq!(n, frame.len());
            let total = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
            let command = u32::from_be_bytes(frame[4..8].try_into().unwrap()) as usize;
            prop_assert_eq!(total + 4, frame.len());
            let base = fields(&frame[8..8 + command]);
            prop_assert_eq!(&base[0], &(1, Ok(TYPE_MESSAGE)));
            let Err(body) = &base[1].1 else { panic!("message body") };
            let body = fields(body);
            prop_assert_eq!(&body[0], &(1, Ok(consumer_id)));
            let Err(mid) = &body[1].1 else { panic!("message id") };
            prop_assert_eq!(fields(mid), message_id_fields(ledger_id, entry_id, partition));
            let mut rest = body[2..].to_vec();
            if redelivery_count != 0 {
                prop_assert_eq!(rest.remove(0), (3, Ok(u64::from(redelivery_count))));
            }
            prop_assert_eq!(rest, ack_set.iter().map(|&a| (4, Ok(signed(a)))).collect::<Vec<_>>());
            let mut tail = &frame[8 + command..];
            if let Some(b) = broker_entry {
                prop_assert_eq!(&tail[..2], &[0x0e, 0x02]);
                let size = u32::from_be_bytes(tail[2..6].try_into().unwrap()) as usize;
                let mut want = Vec::new();
                if let Some(t) = b.publish_time { want.push((1, Ok(t))); }
                if let Some(i) = b.index { want.push((2, Ok(i))); }
                prop_assert_eq!(fields(&tail[6..6 + size]), want);
                tail = &tail[6 + size..];
            }
            prop_assert_eq!(tail, &entry[..]);
        }

        #[test]
        fn receipts_hold_what_was_given(
            producer_id in any::<u64>(), sequence_id in any::<u64>(), ledger_id in any::<u64>(),
            entry_id in any::<u64>(), partition in prop_oneof![Just(-1), any::<i32>()], highest_sequence_id in any::<u64>(),
        ) {
            let r = Receipt { producer_id, sequence_id, ledger_id, entry_id, partition, highest_sequence_id };
            let mut out = Vec::new();
            let n = write_send_receipt(&mut out, &r).unwrap();
            prop_assert_eq!(n, out.len());
            let command = u32::from_be_bytes(out[4..8].try_into().unwrap()) as usize;
            prop_assert_eq!(command + 8, out.len());
            let base = fields(&out[8..]);
            prop_assert_eq!(&base[0], &(1, Ok(TYPE_SEND_RECEIPT)));
            let Err(body) = &base[1].1 else { panic!("receipt body") };
            let body = fields(body);
            prop_assert_eq!(&body[0], &(1, Ok(producer_id)));
            prop_assert_eq!(&body[1], &(2, Ok(sequence_id)));
            let Err(mid) = &body[2].1 else { panic!("message id") };
            prop_assert_eq!(fields(mid), message_id_fields(ledger_id, entry_id, partition));
            prop_assert_eq!(&body[3], &(4, Ok(highest_sequence_id)));
        }
    }
}
