//! One stored Pulsar entry: its framing, its metadata, and the messages of its batch.
//!
//! ```text
//! [0x0e02 u16][size u32][BrokerEntryMetadata]            optional, written by a broker
//! [0x0e01 u16][crc32c u32][metadataSize u32][MessageMetadata][payload]
//!              '---------------- CRC-32C over these ----------------'
//! ```
//!
//! The payload is one message, or a batch when `num_messages_in_batch` is present: a run
//! of `[u32 size][SingleMessageMetadata][payload_size bytes]`, compressed as a whole. All
//! integers are big-endian (Pulsar's "Message format" and "Batch message" docs).

use std::borrow::Cow;

use crate::compression::decompress;
use crate::error::{FormatError, Result};
use crate::proto::{self, MessageMetadata, Property, SingleMessageMetadata};

/// Marks an entry covered by a CRC-32C.
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// Marks the broker entry metadata section in front of an entry.
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;
/// `[magic u16][crc32c u32][metadataSize u32]` in front of an entry's metadata.
pub const ENTRY_HEADER_SIZE: usize = 10;

/// Whether `entry` (from its [`MAGIC_CRC32C`] on) starts with that magic and its CRC-32C
/// matches.
pub fn checksum_ok(entry: &[u8]) -> bool {
    u16_at(entry, 0) == Some(MAGIC_CRC32C)
        && entry.len() >= ENTRY_HEADER_SIZE
        && u32_at(entry, 2) == Some(crc32c::crc32c(&entry[6..]))
}

/// An entry split into its parts; slices borrow the stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The broker entry metadata's index, when the section is present and carries one.
    pub broker_index: Option<u64>,
    pub metadata: MessageMetadata<'a>,
    /// The payload as stored (possibly compressed).
    pub payload: &'a [u8],
}

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

fn len_at(buf: &[u8], at: usize, what: &'static str) -> Result<usize> {
    let n = u32_at(buf, at).ok_or(FormatError::Truncated(what))?;
    usize::try_from(n).map_err(|_| FormatError::Truncated(what))
}

/// Check and split stored bytes into an [`Entry`].
pub fn parse_entry(buf: &[u8]) -> Result<Entry<'_>> {
    let mut rest = buf;
    let mut broker_index = None;
    if u16_at(rest, 0) == Some(MAGIC_BROKER_ENTRY_METADATA) {
        let size = len_at(rest, 2, "broker entry metadata header")?;
        let body = rest.get(6..6 + size).ok_or(FormatError::Truncated("broker entry metadata"))?;
        broker_index = proto::broker_entry_metadata(body)?.1;
        rest = &rest[6 + size..];
    }
    let magic = u16_at(rest, 0).ok_or(FormatError::Truncated("entry header"))?;
    if magic != MAGIC_CRC32C {
        return Err(FormatError::BadMagic(magic));
    }
    let stored = u32_at(rest, 2).ok_or(FormatError::Truncated("entry header"))?;
    let meta_size = len_at(rest, 6, "entry header")?;
    let computed = crc32c::crc32c(&rest[6..]);
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    let meta_end = ENTRY_HEADER_SIZE
        .checked_add(meta_size)
        .filter(|e| *e <= rest.len())
        .ok_or(FormatError::Truncated("message metadata"))?;
    let metadata = MessageMetadata::parse(&rest[ENTRY_HEADER_SIZE..meta_end])?;
    Ok(Entry { broker_index, metadata, payload: &rest[meta_end..] })
}

/// One message of an entry, as a reader sees it; slices borrow the entry and its
/// decompressed payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'s> {
    /// The position in the batch; -1 for an entry that is not a batch.
    pub batch_index: i32,
    pub partition_key: Option<&'s [u8]>,
    /// The partition key is base64 of binary bytes.
    pub key_b64: bool,
    pub properties: Vec<Property<'s>>,
    /// Milliseconds since the epoch; 0 when the producer set none.
    pub event_time: u64,
    pub null_value: bool,
    pub payload: &'s [u8],
}

impl<'a> Entry<'a> {
    /// The payload decompressed, refusing what a plain reader cannot turn into messages:
    /// encrypted payloads (only a consumer with the key opens them), chunks of a larger
    /// message, and markers.
    pub fn payload(&self) -> Result<Cow<'a, [u8]>> {
        let m = &self.metadata;
        if m.encrypted {
            return Err(FormatError::Unsupported("payload is encrypted by its producer".into()));
        }
        if m.chunked {
            return Err(FormatError::Unsupported("entry is a chunk of a larger message".into()));
        }
        if m.marker {
            return Err(FormatError::Unsupported("entry is a marker".into()));
        }
        decompress(m.compression, self.payload, m.uncompressed_size)
    }

    /// The messages of the entry in batch order, given its decompressed `data` (from
    /// [`Entry::payload`]). Batch slots marked `compacted_out` are left out; the others
    /// keep their batch index.
    pub fn messages<'s>(&'s self, data: &'s [u8]) -> Result<Vec<Message<'s>>> {
        let m = &self.metadata;
        let Some(count) = m.num_messages_in_batch else {
            return Ok(vec![Message {
                batch_index: -1,
                partition_key: m.partition_key,
                key_b64: m.key_b64,
                properties: m.properties.clone(),
                event_time: m.event_time,
                null_value: m.null_value,
                payload: data,
            }]);
        };
        if count < 1 {
            return Err(FormatError::Batch(format!("declares {count} messages")));
        }
        let mut out = Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(data.len()));
        let mut pos = 0usize;
        for index in 0..count {
            let meta_size = len_at(data, pos, "batch message header")?;
            pos += 4;
            let meta_end = pos
                .checked_add(meta_size)
                .filter(|e| *e <= data.len())
                .ok_or_else(|| FormatError::Batch(format!("metadata of message {index} exceeds the batch")))?;
            let single = SingleMessageMetadata::parse(&data[pos..meta_end])?;
            let size = usize::try_from(single.payload_size)
                .map_err(|_| FormatError::Batch(format!("message {index} has size {}", single.payload_size)))?;
            let end = meta_end
                .checked_add(size)
                .filter(|e| *e <= data.len())
                .ok_or_else(|| FormatError::Batch(format!("payload of message {index} exceeds the batch")))?;
            if !single.compacted_out {
                out.push(Message {
                    batch_index: index,
                    partition_key: single.partition_key,
                    key_b64: single.key_b64,
                    properties: single.properties,
                    event_time: single.event_time,
                    null_value: single.null_value,
                    payload: &data[meta_end..end],
                });
            }
            pos = end;
        }
        if pos != data.len() {
            return Err(FormatError::Batch(format!("{} stray bytes after the last message", data.len() - pos)));
        }
        Ok(out)
    }
}

/// Building entries the way producers do, for tests here and in [`crate::columns`].
#[cfg(test)]
pub(crate) mod build {
    use super::*;
    use crate::compression::compress;
    use crate::proto::write;
    use proptest::prelude::*;

    /// Any message: a key or none, a few properties (keys may repeat), an event time or
    /// none, a null flag and a payload.
    pub fn msg() -> impl Strategy<Value = Msg> {
        (
            proptest::option::of("[a-z0-9]{0,6}"),
            proptest::collection::vec(("[a-c]{1,2}", "[ -~]{0,5}"), 0..4),
            0u64..3,
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(key, props, event_time, null_value, payload)| Msg {
                key,
                props,
                event_time,
                null_value,
                payload,
            })
    }

    /// A message as a test writes it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Msg {
        pub key: Option<String>,
        pub props: Vec<(String, String)>,
        pub event_time: u64,
        pub null_value: bool,
        pub payload: Vec<u8>,
    }

    fn frame(meta: &[u8], payload: &[u8], broker_index: Option<u64>) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&u32::try_from(meta.len()).unwrap().to_be_bytes());
        body.extend_from_slice(meta);
        body.extend_from_slice(payload);
        let mut out = Vec::new();
        if let Some(i) = broker_index {
            let mut bem = Vec::new();
            write::uint(&mut bem, 1, 5);
            write::uint(&mut bem, 2, i);
            out.extend_from_slice(&MAGIC_BROKER_ENTRY_METADATA.to_be_bytes());
            out.extend_from_slice(&u32::try_from(bem.len()).unwrap().to_be_bytes());
            out.extend_from_slice(&bem);
        }
        out.extend_from_slice(&MAGIC_CRC32C.to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// An entry of `msgs`: a batch when `batched`, else the one message plainly.
    pub fn entry(
        producer: &str,
        publish: u64,
        msgs: &[Msg],
        batched: bool,
        compression: u64,
        broker_index: Option<u64>,
    ) -> Vec<u8> {
        let mut meta = Vec::new();
        write::bytes(&mut meta, 1, producer.as_bytes());
        write::uint(&mut meta, 2, 0);
        write::uint(&mut meta, 3, publish);
        let raw = if batched {
            let mut raw = Vec::new();
            for m in msgs {
                let mut single = Vec::new();
                for (k, v) in &m.props {
                    write::property(&mut single, 1, k, v);
                }
                if let Some(k) = &m.key {
                    write::bytes(&mut single, 2, k.as_bytes());
                }
                write::int32(&mut single, 3, i32::try_from(m.payload.len()).unwrap());
                if m.event_time != 0 {
                    write::uint(&mut single, 5, m.event_time);
                }
                if m.null_value {
                    write::uint(&mut single, 9, 1);
                }
                raw.extend_from_slice(&u32::try_from(single.len()).unwrap().to_be_bytes());
                raw.extend_from_slice(&single);
                raw.extend_from_slice(&m.payload);
            }
            write::int32(&mut meta, 11, i32::try_from(msgs.len()).unwrap());
            raw
        } else {
            let m = &msgs[0];
            for (k, v) in &m.props {
                write::property(&mut meta, 4, k, v);
            }
            if let Some(k) = &m.key {
                write::bytes(&mut meta, 6, k.as_bytes());
            }
            if m.event_time != 0 {
                write::uint(&mut meta, 12, m.event_time);
            }
            if m.null_value {
                write::uint(&mut meta, 25, 1);
            }
            m.payload.clone()
        };
        if compression != 0 {
            write::uint(&mut meta, 8, compression);
            write::uint(&mut meta, 9, u64::try_from(raw.len()).unwrap());
        }
        frame(&meta, &compress(compression, &raw), broker_index)
    }
}

#[cfg(test)]
mod tests {
    use super::build::{entry, msg, Msg};
    use super::*;
    use proptest::prelude::*;

    fn collect(e: &Entry<'_>) -> Result<Vec<(i32, Msg)>> {
        let data = e.payload()?;
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        Ok(e.messages(&data)?
            .into_iter()
            .map(|m| {
                (
                    m.batch_index,
                    Msg {
                        key: m.partition_key.map(text),
                        props: m.properties.iter().map(|(k, v)| (text(k), text(v))).collect(),
                        event_time: m.event_time,
                        null_value: m.null_value,
                        payload: m.payload.to_vec(),
                    },
                )
            })
            .collect())
    }

    proptest! {
        #[test]
        fn batches_round_trip(msgs in proptest::collection::vec(msg(), 1..6), compression in 0u64..5, index in proptest::option::of(any::<u64>())) {
            let raw = entry("prod", 42, &msgs, true, compression, index);
            let e = parse_entry(&raw).unwrap();
            prop_assert_eq!(e.broker_index, index);
            prop_assert_eq!((e.metadata.producer_name, e.metadata.publish_time), (&b"prod"[..], 42));
            let got = collect(&e).unwrap();
            let want: Vec<(i32, Msg)> = msgs.into_iter().enumerate().map(|(i, m)| (i32::try_from(i).unwrap(), m)).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn plain_entries_round_trip(m in msg(), compression in 0u64..5) {
            let raw = entry("p", 1, std::slice::from_ref(&m), false, compression, None);
            prop_assert_eq!(collect(&parse_entry(&raw).unwrap()).unwrap(), vec![(-1, m)]);
        }

        #[test]
        fn any_bit_flip_is_caught_or_harmless(m in msg(), bit in any::<usize>()) {
            let raw = entry("p", 1, std::slice::from_ref(&m), true, 0, None);
            let mut bad = raw.clone();
            let bit = bit % (8 * bad.len());
            bad[bit / 8] ^= 1 << (bit % 8);
            // Every bit is covered by the magic or the checksum.
            prop_assert!(parse_entry(&bad).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(e) = parse_entry(&raw) {
                if let Ok(data) = e.payload() {
                    let _ = e.messages(&data);
                }
            }
        }
    }

    #[test]
    fn encrypted_entries_are_unsupported() {
        let mut meta = Vec::new();
        crate::proto::write::bytes(&mut meta, 1, b"p");
        crate::proto::write::bytes(&mut meta, 13, b"k");
        let m = MessageMetadata::parse(&meta).unwrap();
        let e = Entry { broker_index: None, metadata: m, payload: b"" };
        assert!(matches!(e.payload(), Err(FormatError::Unsupported(_))));
    }
}
