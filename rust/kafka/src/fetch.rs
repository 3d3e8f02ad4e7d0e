//! One stored entry into one Kafka record batch, the hot path of a Kafka fetch.
//!
//! The entry is read by `magnetar_format` (framing, checksum, metadata, decompression,
//! batch slots); a plain entry is one record, a batch entry one record per slot
//! (compacted-out slots are left out, their offsets stay taken). The record's fields
//! (`handlers/kafka/_mapping.py`): timestamp = event time, else the entry's publish time;
//! key = the partition key (base64 decoded when so flagged); headers = properties (as text,
//! or as the [`HEADER_KINDS`] property that follows them says: text, base64 or null);
//! value = the payload, or null.
//!
//! Entries that reader refuses (encrypted, chunks, markers, damaged) and keys or header
//! values flagged base64 that are not canonical base64 are [`BatchError::NotConverted`]:
//! the broker reads those itself.

use magnetar_format::proto::Property;
use magnetar_format::{parse_entry, Message};

use crate::entry::HEADER_KINDS;
use crate::wire::{decode_base64, put_blob, put_varint};
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

/// The headers among a message's properties, and what kind each is: with a well-formed
/// [`HEADER_KINDS`] last (one `t`, `b` or `n` per other property), the properties before
/// it and its letters; otherwise all of them, as text.
fn split_kinds<'p, 'a>(props: &'p [Property<'a>]) -> (&'p [Property<'a>], Option<&'a [u8]>) {
    if let Some((&(name, kinds), rest)) = props.split_last() {
        if name == HEADER_KINDS
            && kinds.len() == rest.len()
            && kinds.iter().all(|k| matches!(k, b't' | b'b' | b'n'))
        {
            return (rest, Some(kinds));
        }
    }
    (props, None)
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
        let (headers, kinds) = split_kinds(&m.properties);
        put_varint(&mut body, headers.len() as i64);
        for (i, &(k, v)) in headers.iter().enumerate() {
            put_blob(&mut body, Some(k));
            match kinds.map_or(b't', |ks| ks[i]) {
                b'n' => put_blob(&mut body, None),
                b'b' => {
                    let raw = decode_base64(v).ok_or_else(|| not_converted("base64 header"))?;
                    put_blob(&mut body, Some(&raw));
                }
                _ => put_blob(&mut body, Some(v)),
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{put_bytes_field, record_headers};
    use magnetar_format::entry::MAGIC_CRC32C;

    #[test]
    fn a_well_formed_marker_splits_off_the_kinds() {
        let p: [Property<'_>; 3] = [(b"a", b"x"), (b"b", b""), (HEADER_KINDS, b"tn")];
        assert_eq!(split_kinds(&p), (&p[..2], Some(&b"tn"[..])));
        assert_eq!(split_kinds(&[]), (&[][..], None));
        // Anything else reads as text, the marker included.
        for bad in [&b"t"[..], b"tnt", b"tx", b"TN"] {
            let p: [Property<'_>; 3] = [(b"a", b"x"), (b"b", b""), (HEADER_KINDS, bad)];
            assert_eq!(split_kinds(&p), (&p[..], None), "{bad:?}");
        }
        let first: [Property<'_>; 2] = [(HEADER_KINDS, b"b"), (b"a", b"AA==")];
        assert_eq!(split_kinds(&first), (&first[..], None));
    }

    /// A plain entry of one message with `props` (as a Pulsar producer may write it).
    fn plain(props: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut meta = Vec::new();
        put_bytes_field(&mut meta, 0x0a, b"p");
        meta.extend_from_slice(&[0x10, 0, 0x18, 1]);
        for (k, v) in props {
            let mut kv = Vec::new();
            put_bytes_field(&mut kv, 0x0a, k);
            put_bytes_field(&mut kv, 0x12, v);
            put_bytes_field(&mut meta, 0x22, &kv);
        }
        let mut body = (meta.len() as u32).to_be_bytes().to_vec();
        body.extend_from_slice(&meta);
        body.extend_from_slice(b"payload");
        let mut out = MAGIC_CRC32C.to_be_bytes().to_vec();
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// The header section of the one record `batch` holds.
    fn header_section(batch: &[u8]) -> &[u8] {
        let tail = b"payload";
        let at = batch
            .windows(tail.len())
            .position(|w| w == tail)
            .expect("the value");
        &batch[at + tail.len()..]
    }

    fn headers_bytes(headers: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, headers.len() as i64);
        out.extend(record_headers(headers));
        out
    }

    #[test]
    fn marked_properties_decode_to_binary_null_and_text_headers() {
        let entry = plain(&[
            (b"bin", b"//4AAQ=="),
            (b"null", b""),
            (b"dup", b"1"),
            (b"dup", b"2"),
            (HEADER_KINDS, b"bntt"),
        ]);
        let batch = batch_from_entry(&entry, 0, 1, 1).expect("converted");
        let want = headers_bytes(&[
            (b"bin", Some(&[0xff, 0xfe, 0, 1])),
            (b"null", None),
            (b"dup", Some(b"1")),
            (b"dup", Some(b"2")),
        ]);
        assert_eq!(header_section(&batch), want);
    }

    #[test]
    fn unmarked_or_malformed_marker_properties_are_text() {
        let props: [(&[u8], &[u8]); 2] = [(b"bin", b"//4AAQ=="), (HEADER_KINDS, b"bn")];
        let batch = batch_from_entry(&plain(&props), 0, 1, 1).expect("converted");
        let want = headers_bytes(&[(b"bin", Some(b"//4AAQ==")), (HEADER_KINDS, Some(b"bn"))]);
        assert_eq!(header_section(&batch), want);
    }

    #[test]
    fn a_binary_header_that_is_not_base64_is_left_to_the_broker() {
        let entry = plain(&[(b"bin", b"not base64"), (HEADER_KINDS, b"b")]);
        assert!(matches!(
            batch_from_entry(&entry, 0, 1, 1),
            Err(BatchError::NotConverted(_))
        ));
    }
}
