//! The protocol's control commands, read and written field by field: enough for a peer
//! that answers the handshake, lookups and producers without protobuf objects (the
//! `pulsar-receipts` floor of the benchmark is one).
//!
//! A command is a `BaseCommand`: its `type` (field 1) and the body, a message in the field
//! whose number is that type (PulsarApi.proto). [`command_body`] splits one;
//! [`varint_field`] and [`bytes_field`] read a body's fields; [`write_command`] writes a
//! framed simple command from a list of [`Field`]s, in the order given.
//!
//! ```
//! use magnetar_pulsar_wire::control::{command_body, varint_field, write_command, Field};
//! let mut out = Vec::new();
//! write_command(&mut out, 13, &[Field::Varint(1, 7)]).unwrap(); // SUCCESS, request_id 7
//! let (kind, body) = command_body(&out[8..]).unwrap();
//! assert_eq!((kind, varint_field(body, 1)), (13, Some(7)));
//! ```

use std::ops::Range;

use bytes::BufMut;

use crate::read::Reader;
use crate::{field_len, len_field_len, put_field, put_sizes, put_tag, put_varint, WireError, WIRE_LEN, WIRE_VARINT};

/// `BaseCommand.Type` values of the control commands (PulsarApi.proto).
pub const TYPE_CONNECT: u64 = 2;
pub const TYPE_CONNECTED: u64 = 3;
pub const TYPE_PRODUCER: u64 = 5;
pub const TYPE_SUCCESS: u64 = 13;
pub const TYPE_CLOSE_PRODUCER: u64 = 15;
pub const TYPE_PRODUCER_SUCCESS: u64 = 17;
pub const TYPE_PING: u64 = 18;
pub const TYPE_PONG: u64 = 19;
pub const TYPE_PARTITIONED_METADATA: u64 = 21;
pub const TYPE_PARTITIONED_METADATA_RESPONSE: u64 = 22;
pub const TYPE_LOOKUP: u64 = 23;
pub const TYPE_LOOKUP_RESPONSE: u64 = 24;

const WIRE_FIXED64: u64 = 1;
const WIRE_FIXED32: u64 = 5;

/// One field of a body to write: a varint (signed values as their two's complement, as
/// protobuf does) or length-delimited bytes (strings, nested messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    Varint(u64, u64),
    Bytes(u64, &'a [u8]),
}

impl Field<'_> {
    fn len(&self) -> usize {
        match *self {
            Field::Varint(number, v) => field_len(number, v),
            Field::Bytes(number, b) => len_field_len(number, b.len()),
        }
    }

    fn put(&self, out: &mut impl BufMut) {
        match *self {
            Field::Varint(number, v) => put_field(out, number, v),
            Field::Bytes(number, b) => {
                put_tag(out, number, WIRE_LEN);
                put_varint(out, b.len() as u64);
                out.put_slice(b);
            }
        }
    }
}

/// A field's value as read: a varint, or where a length-delimited value lies.
#[derive(Clone)]
enum Value {
    Varint(u64),
    Bytes(Range<usize>),
}

impl Value {
    fn varint(self) -> Option<u64> {
        match self {
            Value::Varint(v) => Some(v),
            Value::Bytes(_) => None,
        }
    }

    fn bytes(self) -> Option<Range<usize>> {
        match self {
            Value::Bytes(range) => Some(range),
            Value::Varint(_) => None,
        }
    }
}

/// Every varint and length-delimited field of a body, in order (fixed-width ones are
/// stepped over). None when the body is malformed anywhere.
fn fields(body: &[u8]) -> Option<Vec<(u64, Value)>> {
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    while !r.done() {
        let (number, wire) = r.tag()?;
        match wire {
            WIRE_VARINT => out.push((number, Value::Varint(r.varint()?))),
            WIRE_LEN => out.push((number, Value::Bytes(r.bytes()?))),
            WIRE_FIXED64 => r.skip(8)?,
            WIRE_FIXED32 => r.skip(4)?,
            _ => return None,
        }
    }
    Some(out)
}

/// A command's type and its body; None when the command is malformed or its body is not
/// in the field its type names. A command without a body (PING, PONG) has an empty one.
pub fn command_body(command: &[u8]) -> Option<(u64, &[u8])> {
    let found = fields(command)?;
    let last = |number: u64| found.iter().rev().find(|(n, _)| *n == number).map(|(_, v)| v.clone());
    let kind = last(1)?.varint()?;
    let body = last(kind).and_then(Value::bytes);
    Some((kind, body.map_or(&[][..], |range| &command[range])))
}

/// The last varint value of field `number` in `body` (protobuf's rule for a repeated
/// scalar read as a single one).
pub fn varint_field(body: &[u8], number: u64) -> Option<u64> {
    last_value(body, number)?.varint()
}

/// The last length-delimited value of field `number` in `body`.
pub fn bytes_field(body: &[u8], number: u64) -> Option<&[u8]> {
    let range = last_value(body, number)?.bytes()?;
    Some(&body[range])
}

/// The last value of field `number` in `body`.
fn last_value(body: &[u8], number: u64) -> Option<Value> {
    fields(body)?.into_iter().rev().find(|(n, _)| *n == number).map(|(_, v)| v)
}

/// Append one simple command frame: `[totalSize][commandSize][BaseCommand]`, the body
/// holding `fields` in the order given. Returns the frame's length.
pub fn write_command(out: &mut impl BufMut, kind: u64, fields: &[Field<'_>]) -> Result<usize, WireError> {
    let body: usize = fields.iter().map(Field::len).sum();
    let command = field_len(1, kind) + len_field_len(kind, body);
    put_sizes(out, 4 + command, command)?;
    put_field(out, 1, kind);
    put_tag(out, kind, WIRE_LEN);
    put_varint(out, body as u64);
    for field in fields {
        field.put(out);
    }
    Ok(8 + command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_written_command_reads_back() {
        let mut out = Vec::new();
        let url = b"pulsar://127.0.0.1:6650";
        let n = write_command(&mut out, TYPE_LOOKUP_RESPONSE, &[
            Field::Bytes(1, url), Field::Varint(3, 1), Field::Varint(4, 300), Field::Varint(5, 1),
        ]).unwrap();
        assert_eq!(n, out.len());
        assert_eq!(u32::from_be_bytes(out[..4].try_into().unwrap()) as usize, out.len() - 4);
        assert_eq!(u32::from_be_bytes(out[4..8].try_into().unwrap()) as usize, out.len() - 8);
        let (kind, body) = command_body(&out[8..]).unwrap();
        assert_eq!(kind, TYPE_LOOKUP_RESPONSE);
        assert_eq!(bytes_field(body, 1), Some(&url[..]));
        assert_eq!(varint_field(body, 4), Some(300));
        assert_eq!(varint_field(body, 2), None);
    }

    #[test]
    fn a_command_without_a_body_has_an_empty_one() {
        let mut out = Vec::new();
        // PING as a client writes it: the type, and an empty CommandPing.
        write_command(&mut out, TYPE_PING, &[]).unwrap();
        assert_eq!(command_body(&out[8..]), Some((TYPE_PING, &[][..])));
        // The type alone (no body field) reads the same.
        assert_eq!(command_body(&[0x08, 18]), Some((TYPE_PING, &[][..])));
    }

    #[test]
    fn fixed_width_fields_are_stepped_over() {
        // field 2 fixed64, field 3 fixed32, then field 1 varint 5
        let mut body = vec![0x11];
        body.extend_from_slice(&[0xff; 8]);
        body.push(0x1d);
        body.extend_from_slice(&[0xff; 4]);
        body.extend_from_slice(&[0x08, 5]);
        assert_eq!(varint_field(&body, 1), Some(5));
        assert_eq!(varint_field(&body[..5], 1), None, "a cut fixed64 is malformed");
    }

    proptest! {
        #[test]
        fn any_bytes_give_a_clean_answer(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Some((_, body)) = command_body(&bytes) {
                let _ = varint_field(body, 1);
                let _ = bytes_field(body, 2);
            }
        }

        #[test]
        fn varints_round_trip(kind in 2u64..70, number in 1u64..20, v in any::<u64>()) {
            let mut out = Vec::new();
            write_command(&mut out, kind, &[Field::Varint(number, v)]).unwrap();
            let (k, body) = command_body(&out[8..]).unwrap();
            prop_assert_eq!(k, kind);
            prop_assert_eq!(varint_field(body, number), Some(v));
        }
    }
}
