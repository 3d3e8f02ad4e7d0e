//! The protobuf wire format, read-only, for the few messages of `PulsarApi.proto` an entry
//! carries (`MessageMetadata`, `SingleMessageMetadata`, `KeyValue`, `BrokerEntryMetadata`).
//!
//! Only the fields a reader of stored messages needs are kept; every other field is
//! skipped by its wire type, as protobuf requires. Strings are checked to be UTF-8 once,
//! here, and handed out as byte slices of the input.

use crate::error::{FormatError, Result};

/// Protobuf wire types (encoding guide, "Message Structure").
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// One field value as the wire carries it.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// A cursor over one serialized message.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    message: &'static str,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8], message: &'static str) -> Self {
        Fields { buf, pos: 0, message }
    }

    fn bad(&self, reason: &str) -> FormatError {
        FormatError::Protobuf { message: self.message, reason: reason.to_string() }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.buf.get(self.pos).ok_or_else(|| self.bad("truncated varint"))?;
            self.pos += 1;
            out |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(self.bad("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let n = usize::try_from(n).map_err(|_| self.bad("length does not fit in memory"))?;
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| self.bad("field exceeds the message"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// The next `(field number, value)`, or `None` at the end of the message.
    fn next_field(&mut self) -> Result<Option<(u64, Value<'a>)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let number = tag >> 3;
        if number == 0 {
            return Err(self.bad("field number 0"));
        }
        let value = match u8::try_from(tag & 7).unwrap_or(u8::MAX) {
            VARINT => Value::Varint(self.varint()?),
            FIXED64 => {
                self.take(8)?;
                Value::Fixed
            }
            LEN => {
                let n = self.varint()?;
                Value::Bytes(self.take(n)?)
            }
            FIXED32 => {
                self.take(4)?;
                Value::Fixed
            }
            other => return Err(self.bad(&format!("unsupported wire type {other}"))),
        };
        Ok(Some((number, value)))
    }
}

fn bytes<'a>(v: Value<'a>, f: &Fields<'_>) -> Result<&'a [u8]> {
    match v {
        Value::Bytes(b) => Ok(b),
        _ => Err(f.bad("expected a length-delimited field")),
    }
}

fn text<'a>(v: Value<'a>, f: &Fields<'_>, what: &'static str) -> Result<&'a [u8]> {
    let b = bytes(v, f)?;
    std::str::from_utf8(b).map_err(|_| FormatError::NotUtf8(what))?;
    Ok(b)
}

fn varint(v: Value<'_>, f: &Fields<'_>) -> Result<u64> {
    match v {
        Value::Varint(n) => Ok(n),
        _ => Err(f.bad("expected a varint field")),
    }
}

/// An `int32` field: negative values are sign-extended to ten bytes on the wire.
fn int32(v: Value<'_>, f: &Fields<'_>) -> Result<i32> {
    let wide = i64::from_ne_bytes(varint(v, f)?.to_ne_bytes());
    i32::try_from(wide).map_err(|_| f.bad("int32 out of range"))
}

/// `KeyValue { required string key = 1; required string value = 2; }`.
pub type Property<'a> = (&'a [u8], &'a [u8]);

fn key_value(buf: &[u8]) -> Result<Property<'_>> {
    let mut f = Fields::new(buf, "KeyValue");
    let (mut key, mut value) = (None, None);
    while let Some((n, v)) = f.next_field()? {
        match n {
            1 => key = Some(text(v, &f, "a property key")?),
            2 => value = Some(text(v, &f, "a property value")?),
            _ => {}
        }
    }
    match (key, value) {
        (Some(k), Some(v)) => Ok((k, v)),
        _ => Err(f.bad("key or value missing")),
    }
}

/// The fields of `MessageMetadata` a reader of stored messages needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageMetadata<'a> {
    pub producer_name: &'a [u8],
    pub publish_time: u64,
    pub properties: Vec<Property<'a>>,
    pub partition_key: Option<&'a [u8]>,
    /// The partition key is base64 of binary bytes (`partition_key_b64_encoded`).
    pub key_b64: bool,
    pub compression: u64,
    pub uncompressed_size: u32,
    /// Present exactly when the payload is a batch.
    pub num_messages_in_batch: Option<i32>,
    pub event_time: u64,
    pub encrypted: bool,
    pub null_value: bool,
    pub marker: bool,
    pub chunked: bool,
}

impl<'a> MessageMetadata<'a> {
    /// Parse a serialized `MessageMetadata` (PulsarApi.proto field numbers).
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let mut f = Fields::new(buf, "MessageMetadata");
        let mut m = MessageMetadata::default();
        let mut has_producer = false;
        while let Some((n, v)) = f.next_field()? {
            match n {
                1 => {
                    m.producer_name = text(v, &f, "the producer name")?;
                    has_producer = true;
                }
                3 => m.publish_time = varint(v, &f)?,
                4 => m.properties.push(key_value(bytes(v, &f)?)?),
                5 | 7 | 14 | 26 => {
                    text(v, &f, "a metadata string")?;
                }
                6 => m.partition_key = Some(text(v, &f, "the partition key")?),
                8 => m.compression = varint(v, &f)?,
                9 => {
                    m.uncompressed_size =
                        u32::try_from(varint(v, &f)?).map_err(|_| f.bad("uncompressed_size out of range"))?
                }
                11 => m.num_messages_in_batch = Some(int32(v, &f)?),
                12 => m.event_time = varint(v, &f)?,
                13 => m.encrypted = true,
                17 => m.key_b64 = varint(v, &f)? != 0,
                20 => m.marker = true,
                25 => m.null_value = varint(v, &f)? != 0,
                27 => m.chunked = int32(v, &f)? > 1,
                _ => {}
            }
        }
        if !has_producer {
            return Err(f.bad("producer_name missing"));
        }
        Ok(m)
    }
}

/// The fields of `SingleMessageMetadata` a reader of stored messages needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SingleMessageMetadata<'a> {
    pub properties: Vec<Property<'a>>,
    pub partition_key: Option<&'a [u8]>,
    /// The partition key is base64 of binary bytes (`partition_key_b64_encoded`).
    pub key_b64: bool,
    pub payload_size: i32,
    pub compacted_out: bool,
    pub event_time: u64,
    pub null_value: bool,
}

impl<'a> SingleMessageMetadata<'a> {
    /// Parse a serialized `SingleMessageMetadata`.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let mut f = Fields::new(buf, "SingleMessageMetadata");
        let mut m = SingleMessageMetadata::default();
        let mut has_size = false;
        while let Some((n, v)) = f.next_field()? {
            match n {
                1 => m.properties.push(key_value(bytes(v, &f)?)?),
                2 => m.partition_key = Some(text(v, &f, "the partition key")?),
                3 => {
                    m.payload_size = int32(v, &f)?;
                    has_size = true;
                }
                4 => m.compacted_out = varint(v, &f)? != 0,
                5 => m.event_time = varint(v, &f)?,
                6 => m.key_b64 = varint(v, &f)? != 0,
                9 => m.null_value = varint(v, &f)? != 0,
                _ => {}
            }
        }
        if !has_size {
            return Err(f.bad("payload_size missing"));
        }
        Ok(m)
    }
}

/// `BrokerEntryMetadata`: `(broker_timestamp, index)`, each when present.
pub fn broker_entry_metadata(buf: &[u8]) -> Result<(Option<u64>, Option<u64>)> {
    let mut f = Fields::new(buf, "BrokerEntryMetadata");
    let (mut ts, mut index) = (None, None);
    while let Some((n, v)) = f.next_field()? {
        match n {
            1 => ts = Some(varint(v, &f)?),
            2 => index = Some(varint(v, &f)?),
            _ => {}
        }
    }
    Ok((ts, index))
}

/// Writing the same messages, for tests of the readers above and of the entry decoder.
#[cfg(test)]
pub(crate) mod write {
    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(u8::try_from(v & 0x7f).unwrap() | 0x80);
            v >>= 7;
        }
        out.push(u8::try_from(v).unwrap());
    }

    pub fn tag(out: &mut Vec<u8>, field: u64, wire: u8) {
        varint(out, (field << 3) | u64::from(wire));
    }

    pub fn uint(out: &mut Vec<u8>, field: u64, v: u64) {
        tag(out, field, super::VARINT);
        varint(out, v);
    }

    pub fn int32(out: &mut Vec<u8>, field: u64, v: i32) {
        uint(out, field, u64::from_ne_bytes(i64::from(v).to_ne_bytes()));
    }

    pub fn bytes(out: &mut Vec<u8>, field: u64, b: &[u8]) {
        tag(out, field, super::LEN);
        varint(out, u64::try_from(b.len()).unwrap());
        out.extend_from_slice(b);
    }

    pub fn property(out: &mut Vec<u8>, field: u64, k: &str, v: &str) {
        let mut kv = Vec::new();
        bytes(&mut kv, 1, k.as_bytes());
        bytes(&mut kv, 2, v.as_bytes());
        bytes(out, field, &kv);
    }
}

#[cfg(test)]
mod tests {
    use super::write;
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn single_metadata_round_trip(key in proptest::option::of("[a-z]{0,8}"), size in 0i32..1000,
                                      event in any::<u64>(), null in any::<bool>(),
                                      props in proptest::collection::vec(("[a-z]{1,4}", "[ -~]{0,6}"), 0..4)) {
            let mut buf = Vec::new();
            for (k, v) in &props {
                write::property(&mut buf, 1, k, v);
            }
            if let Some(k) = &key {
                write::bytes(&mut buf, 2, k.as_bytes());
            }
            write::int32(&mut buf, 3, size);
            write::uint(&mut buf, 5, event);
            write::uint(&mut buf, 9, u64::from(null));
            write::uint(&mut buf, 99, 7); // an unknown field is skipped
            let m = SingleMessageMetadata::parse(&buf).unwrap();
            prop_assert_eq!(m.partition_key, key.as_deref().map(str::as_bytes));
            prop_assert_eq!((m.payload_size, m.event_time, m.null_value), (size, event, null));
            let back: Vec<(String, String)> = m.properties.iter()
                .map(|(k, v)| (String::from_utf8(k.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap())).collect();
            prop_assert_eq!(back, props);
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = MessageMetadata::parse(&raw);
            let _ = SingleMessageMetadata::parse(&raw);
            let _ = broker_entry_metadata(&raw);
        }
    }

    #[test]
    fn negative_int32_and_bad_strings() {
        let mut buf = Vec::new();
        write::bytes(&mut buf, 1, b"p");
        write::int32(&mut buf, 11, -1);
        assert_eq!(MessageMetadata::parse(&buf).unwrap().num_messages_in_batch, Some(-1));
        let mut bad = Vec::new();
        write::bytes(&mut bad, 1, &[0xff, 0xfe]);
        assert_eq!(MessageMetadata::parse(&bad), Err(FormatError::NotUtf8("the producer name")));
        assert!(MessageMetadata::parse(&[0x0a, 0x05, b'a']).is_err());
    }
}
