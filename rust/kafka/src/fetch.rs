//! One stored entry into one Kafka record batch, the hot path of a Kafka fetch.
//!
//! The entry is read by `magnetar_format` (framing, checksum, metadata, decompression,
//! batch slots); a plain entry is one record, a batch entry one record per slot
//! (compacted-out slots are left out, their offsets stay taken). The record's fields
//! (`handlers/kafka/_mapping.py`): timestamp = event time, else the entry's publish time;
//! key = the partition key (base64 decoded when so flagged); headers = properties; value =
//! the payload, or null.
//!
//! Entries that reader refuses (encrypted, chunks, markers, damaged) and keys flagged
//! base64 that are not canonical base64 are [`BatchError::NotConverted`]: the broker reads
//! those itself.

use magnetar_format::{parse_entry, Message};

use crate::wire::decode_base64;
use crate::BatchError;

fn not_converted(reason: impl std::fmt::Display) -> BatchError {
    BatchError::NotConverted(reason.to_string())
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
    let parsed = parse_entry(entry).map_err(not_converted)?;
    let data = parsed.payload().map_err(not_converted)?;
    let messages = parsed.messages(&data).map_err(not_converted)?;
    let entry_publish = parsed.metadata.publish_time;
    let default_ts = if entry_publish != 0 {
        i64::try_from(entry_publish).unwrap_or(i64::MAX)
    } else {
        publish_time
    };
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
    messages: &[Message<'_>],
    base_offset: i64,
    num_messages: i64,
    default_ts: i64,
) -> Result<Vec<u8>, BatchError> {
    let ts_of = |m: &Message<'_>| {
        if m.event_time != 0 {
            i64::try_from(m.event_time).unwrap_or(i64::MAX)
        } else {
            default_ts
        }
    };
    // A record's offset delta is its slot in the batch (0 for a plain entry); slots that
    // were compacted out are not among the messages, and their offsets stay taken.
    let live: Vec<(i64, &Message<'_>, &[u8])> = messages
        .iter()
        .map(|m| (i64::from(m.batch_index.max(0)), m, m.payload))
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
        .map(|(_, m, d)| d.len() + m.partition_key.map_or(0, <[u8]>::len) + 32)
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
        let key = match m.partition_key {
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
