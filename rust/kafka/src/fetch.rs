//! One stored entry into one Kafka record batch, the hot path of a Kafka fetch.
//!
//! The entry may carry broker entry metadata (0x0e02) in front; its checksum is verified;
//! a plain entry is one record, a batch entry one record per slot (compacted-out slots are
//! left out, their offsets stay taken). The record's fields (`handlers/kafka/_mapping.py`):
//! timestamp = event time, else the entry's publish time; key = the partition key (base64
//! decoded when so flagged); headers = properties; value = the payload, or null.
//!
//! Compressed or encrypted entries, and anything this reader does not take as canonical,
//! are [`BatchError::NotConverted`]: the broker reads those itself.

use crate::wire::{decode_base64, Field, Fields};
use crate::{corrupt, BatchError};

const MAGIC_CRC32C: [u8; 2] = [0x0e, 0x01];
const MAGIC_BROKER_ENTRY_METADATA: [u8; 2] = [0x0e, 0x02];

fn not_converted(reason: &str) -> BatchError {
    BatchError::NotConverted(reason.to_string())
}

/// What a record needs of a message's metadata (the fields a `MessageMetadata` and a
/// `SingleMessageMetadata` share, under different numbers).
#[derive(Default)]
struct MessageFields<'a> {
    properties: Vec<(&'a [u8], &'a [u8])>,
    key: Option<&'a [u8]>,
    key_b64: bool,
    event_time: u64,
    null_value: bool,
    compacted_out: bool,
    payload_size: Option<u64>,
}

fn key_value(raw: &[u8]) -> Result<(&[u8], &[u8]), BatchError> {
    let (mut key, mut value) = (None, None);
    let mut fields = Fields::new(raw);
    for f in &mut fields {
        match f {
            Field::Bytes(1, k) => key = Some(k),
            Field::Bytes(2, v) => value = Some(v),
            _ => {}
        }
    }
    match (key, value, fields.malformed) {
        (Some(k), Some(v), false)
            if std::str::from_utf8(k).is_ok() && std::str::from_utf8(v).is_ok() =>
        {
            Ok((k, v))
        }
        _ => Err(not_converted("property")),
    }
}

/// Field numbers of the record-relevant fields in one metadata message.
struct Numbers {
    properties: u32,
    key: u32,
    event_time: u32,
    key_b64: u32,
    null_value: u32,
}

const SINGLE: Numbers = Numbers {
    properties: 1,
    key: 2,
    event_time: 5,
    key_b64: 6,
    null_value: 9,
};
const ENTRY: Numbers = Numbers {
    properties: 4,
    key: 6,
    event_time: 12,
    key_b64: 17,
    null_value: 25,
};

fn message_field<'a>(
    m: &mut MessageFields<'a>,
    n: &Numbers,
    f: &Field<'a>,
) -> Result<(), BatchError> {
    match *f {
        Field::Bytes(x, raw) if x == n.properties => m.properties.push(key_value(raw)?),
        Field::Bytes(x, raw) if x == n.key => {
            std::str::from_utf8(raw).map_err(|_| not_converted("key"))?;
            m.key = Some(raw);
        }
        Field::Varint(x, v) if x == n.event_time => m.event_time = v,
        Field::Varint(x, v) if x == n.key_b64 => m.key_b64 = v != 0,
        Field::Varint(x, v) if x == n.null_value => m.null_value = v != 0,
        _ => {}
    }
    Ok(())
}

/// Encode a record batch (message format v2, uncompressed) for the entry `entry` whose
/// last message has broker index `index` and which holds `num_messages` messages; empty
/// when every slot was compacted out.
pub fn batch_from_entry(
    entry: &[u8],
    index: i64,
    num_messages: i64,
    publish_time: i64,
) -> Result<Vec<u8>, BatchError> {
    let mut view = entry;
    if view.starts_with(&MAGIC_BROKER_ENTRY_METADATA) {
        let size = view
            .get(2..6)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| corrupt("truncated broker entry metadata header"))?;
        let section = view
            .get(6..6 + size)
            .ok_or_else(|| corrupt("broker entry metadata exceeds the entry"))?;
        let mut fields = Fields::new(section);
        fields.by_ref().for_each(drop);
        if fields.malformed {
            return Err(not_converted("broker entry metadata"));
        }
        view = &view[6 + size..];
    }
    if view.len() < 10 || view[..2] != MAGIC_CRC32C {
        return Err(corrupt("not an entry (bad magic or too short)"));
    }
    let checksum = u32::from_be_bytes([view[2], view[3], view[4], view[5]]);
    if crc32c::crc32c(&view[6..]) != checksum {
        return Err(corrupt("entry checksum mismatch"));
    }
    let meta_size = u32::from_be_bytes([view[6], view[7], view[8], view[9]]) as usize;
    let meta = view
        .get(10..10 + meta_size)
        .ok_or_else(|| corrupt("metadata exceeds the entry"))?;
    let payload = &view[10 + meta_size..];

    let mut plain = MessageFields::default();
    let mut entry_publish = 0u64;
    let mut batch_count: Option<u64> = None;
    let mut required = 0u8;
    let mut fields = Fields::new(meta);
    for f in &mut fields {
        match f {
            Field::Bytes(1 | 5 | 7 | 14 | 26, text) if std::str::from_utf8(text).is_err() => {
                return Err(not_converted("a metadata string is not UTF-8"))
            }
            Field::Bytes(1, _) => required |= 1,
            Field::Varint(2, _) => required |= 2,
            Field::Varint(3, v) => {
                required |= 4;
                entry_publish = v;
            }
            Field::Varint(8, c) if c != 0 => return Err(not_converted("compressed entry")),
            Field::Varint(11, n) => batch_count = Some(n),
            Field::Bytes(13, _) => return Err(not_converted("encrypted entry")),
            ref other => message_field(&mut plain, &ENTRY, other)?,
        }
    }
    if fields.malformed || required != 7 {
        return Err(not_converted("message metadata"));
    }
    let default_ts = if entry_publish != 0 {
        i64::try_from(entry_publish).unwrap_or(i64::MAX)
    } else {
        publish_time
    };

    let mut messages: Vec<(MessageFields<'_>, &[u8])> = Vec::new();
    match batch_count {
        None => messages.push((plain, payload)),
        Some(count) => {
            if count < 1 || count > payload.len() as u64 {
                return Err(not_converted("batch count"));
            }
            let mut pos = 0usize;
            for _ in 0..count {
                let size = payload
                    .get(pos..pos + 4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or_else(|| not_converted("batch truncated"))?;
                pos += 4;
                let raw = payload
                    .get(pos..pos + size)
                    .ok_or_else(|| not_converted("batch slot"))?;
                pos += size;
                let mut single = MessageFields::default();
                let mut fields = Fields::new(raw);
                for f in &mut fields {
                    match f {
                        Field::Varint(3, v) => single.payload_size = Some(v),
                        Field::Varint(4, v) => single.compacted_out = v != 0,
                        ref other => message_field(&mut single, &SINGLE, other)?,
                    }
                }
                let n = match (fields.malformed, single.payload_size) {
                    (false, Some(n)) if n <= i32::MAX as u64 => n as usize,
                    _ => return Err(not_converted("batch slot metadata")),
                };
                let data = payload
                    .get(pos..pos + n)
                    .ok_or_else(|| not_converted("batch payload"))?;
                pos += n;
                messages.push((single, data));
            }
            if pos != payload.len() {
                return Err(not_converted("bytes after the batch"));
            }
        }
    }
    encode(
        &messages,
        index - num_messages + 1,
        num_messages,
        default_ts,
    )
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    crate::wire::put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_blob(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

fn encode(
    messages: &[(MessageFields<'_>, &[u8])],
    base_offset: i64,
    num_messages: i64,
    default_ts: i64,
) -> Result<Vec<u8>, BatchError> {
    let ts_of = |m: &MessageFields<'_>| {
        if m.event_time != 0 {
            i64::try_from(m.event_time).unwrap_or(i64::MAX)
        } else {
            default_ts
        }
    };
    let live: Vec<(i64, &MessageFields<'_>, &[u8])> = messages
        .iter()
        .enumerate()
        .filter(|(_, (m, _))| !m.compacted_out)
        .map(|(i, (m, d))| (i as i64, m, *d))
        .collect();
    let Some(&(last_delta, _, _)) = live.last() else {
        return Ok(Vec::new());
    };
    let base_ts = live
        .iter()
        .map(|(_, m, _)| ts_of(m))
        .min()
        .unwrap_or(default_ts);
    let max_ts = live
        .iter()
        .map(|(_, m, _)| ts_of(m))
        .max()
        .unwrap_or(default_ts);
    let size: usize = live
        .iter()
        .map(|(_, m, d)| d.len() + m.key.map_or(0, <[u8]>::len) + 32)
        .sum();
    let mut out = Vec::with_capacity(61 + size);
    out.extend_from_slice(&base_offset.to_be_bytes());
    out.extend_from_slice(&[0u8; 4]); // batch length
    out.extend_from_slice(&(-1i32).to_be_bytes());
    out.push(2);
    out.extend_from_slice(&[0u8; 4]); // crc
    out.extend_from_slice(&0i16.to_be_bytes());
    let last_offset_delta = (num_messages - 1).max(last_delta);
    out.extend_from_slice(
        &i32::try_from(last_offset_delta)
            .map_err(|_| not_converted("offset delta"))?
            .to_be_bytes(),
    );
    out.extend_from_slice(&base_ts.to_be_bytes());
    out.extend_from_slice(&max_ts.to_be_bytes());
    out.extend_from_slice(&(-1i64).to_be_bytes());
    out.extend_from_slice(&(-1i16).to_be_bytes());
    out.extend_from_slice(&(-1i32).to_be_bytes());
    out.extend_from_slice(&(live.len() as i32).to_be_bytes());
    let mut body = Vec::with_capacity(64);
    let mut decoded_key;
    for &(delta, m, data) in &live {
        body.clear();
        body.push(0);
        put_varint(&mut body, ts_of(m).wrapping_sub(base_ts));
        put_varint(&mut body, delta);
        let key = match m.key {
            Some(k) if m.key_b64 => match decode_base64(k) {
                Some(raw) => {
                    decoded_key = raw;
                    Some(&decoded_key[..])
                }
                None => return Err(not_converted("base64 key")),
            },
            other => other,
        };
        put_blob(&mut body, key);
        put_blob(&mut body, if m.null_value { None } else { Some(data) });
        put_varint(&mut body, m.properties.len() as i64);
        for (k, v) in &m.properties {
            put_blob(&mut body, Some(k));
            put_blob(&mut body, Some(v));
        }
        put_varint(&mut out, body.len() as i64);
        out.extend_from_slice(&body);
    }
    let batch_length =
        i32::try_from(out.len() - 12).map_err(|_| not_converted("batch too large"))?;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}
