//! One uncompressed record batch into one entry, in two passes over the records: the first
//! checks every record and notes where its parts lie, the second writes the entry.

use crate::batch::{parse_header, BatchHeader, BATCH_HEADER_SIZE};
use crate::wire::{base64_len, put_base64, put_bytes_field, put_uvarint, Reader};
use crate::{corrupt, BatchError};
use magnetar_format::entry::MAGIC_CRC32C;

// MessageMetadata field tags (wire type in the low three bits).
const MM_PRODUCER_NAME: u8 = 0x0a; // 1, bytes
const MM_SEQUENCE_ID: u8 = 0x10; // 2, varint
const MM_PUBLISH_TIME: u8 = 0x18; // 3, varint
const MM_PROPERTIES: u8 = 0x22; // 4, bytes
const MM_PARTITION_KEY: u8 = 0x32; // 6, bytes
const MM_NUM_MESSAGES: u8 = 0x58; // 11, varint
const MM_EVENT_TIME: u8 = 0x60; // 12, varint
const MM_KEY_B64: [u8; 2] = [0x88, 0x01]; // 17, varint
const MM_NULL_VALUE: [u8; 2] = [0xc8, 0x01]; // 25, varint

// SingleMessageMetadata field tags.
const SM_PROPERTIES: u8 = 0x0a; // 1, bytes
const SM_PARTITION_KEY: u8 = 0x12; // 2, bytes
const SM_PAYLOAD_SIZE: u8 = 0x18; // 3, varint
const SM_EVENT_TIME: u8 = 0x28; // 5, varint
const SM_KEY_B64: u8 = 0x30; // 6, varint
const SM_NULL_VALUE: u8 = 0x48; // 9, varint

// KeyValue field tags.
const KV_KEY: u8 = 0x0a;
const KV_VALUE: u8 = 0x12;

/// The property that follows a record's headers when they are not all text: one letter per
/// header, `t` text as is, `b` base64 of the bytes, `n` null (`handlers/kafka/_mapping.py`).
pub const HEADER_KINDS: &[u8] = b"__kafka_header_kinds";

/// What only the entry carries, the same for all of its messages.
#[derive(Debug, Clone, Copy)]
pub struct EntryFields<'a> {
    pub producer_name: &'a str,
    pub sequence_id: u64,
    pub publish_time: u64,
}

/// A converted batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    pub header: BatchHeader,
    /// The entry (empty when the batch holds no records).
    pub entry: Vec<u8>,
    /// Records in the batch: messages in the entry.
    pub records: usize,
    /// Whether record `i` has offset delta `i` for every record, so that the batch as
    /// sent reads back at consecutive offsets.
    pub contiguous: bool,
}

/// Where one record's parts lie in the batch.
struct RecordView<'a> {
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    /// The headers as they stand in the record, and how many.
    headers: &'a [u8],
    header_count: usize,
}

/// Headers of one record, read from a section already checked by [`scan`].
fn headers<'a>(view: &RecordView<'a>) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> {
    let mut r = Reader::new(view.headers);
    let end = view.headers.len();
    (0..view.header_count).map_while(move |_| {
        let name = r.blob(end, "header key").ok()??;
        let value = r.blob(end, "header value").ok()?;
        Some((name, value))
    })
}

/// Convert the one uncompressed, non-control batch `batch` holds into an entry.
pub fn entry_from_batch(batch: &[u8], fields: &EntryFields<'_>) -> Result<Converted, BatchError> {
    let header = parse_header(batch)?;
    if header.compression() != 0 {
        return Err(BatchError::NotConverted("compressed batch".into()));
    }
    if header.is_control() {
        return Err(BatchError::NotConverted("control batch".into()));
    }
    let (views, contiguous) = scan(&batch[BATCH_HEADER_SIZE..], &header)?;
    let use_time = !header.log_append_time();
    let entry = match views.len() {
        0 => Vec::new(),
        1 => plain_entry(&views[0], use_time, fields),
        _ => batch_entry(&views, use_time, fields),
    };
    Ok(Converted {
        header,
        entry,
        records: views.len(),
        contiguous,
    })
}

/// Check every record of `body` and note its parts (the protocol guide's "Record").
fn scan<'a>(
    body: &'a [u8],
    header: &BatchHeader,
) -> Result<(Vec<RecordView<'a>>, bool), BatchError> {
    let count = usize::try_from(header.record_count).unwrap_or(0);
    if count > body.len() {
        return Err(corrupt(format!(
            "{count} records cannot fit in {} bytes",
            body.len()
        )));
    }
    let mut r = Reader::new(body);
    let mut views = Vec::with_capacity(count);
    let mut contiguous = true;
    for i in 0..count {
        let length = r.varint()?;
        let rend = usize::try_from(length)
            .ok()
            .and_then(|l| r.pos.checked_add(l))
            .filter(|&e| e <= body.len())
            .ok_or_else(|| corrupt(format!("record length {length} does not fit the batch")))?;
        r.byte()?; // attributes
        let ts_delta = r.varint()?;
        let offset_delta = r.varint()?;
        contiguous &= i64::try_from(i).is_ok_and(|i| i == offset_delta);
        let key = r.blob(rend, "key")?;
        let value = r.blob(rend, "value")?;
        let header_count = r.varint()?;
        let header_count = usize::try_from(header_count)
            .ok()
            .filter(|&n| n <= rend.saturating_sub(r.pos))
            .ok_or_else(|| corrupt(format!("header count {header_count} out of range")))?;
        let headers_at = r.pos;
        for _ in 0..header_count {
            let name = r
                .blob(rend, "header key")?
                .ok_or_else(|| corrupt("null header key"))?;
            if std::str::from_utf8(name).is_err() {
                return Err(corrupt("header key is not UTF-8"));
            }
            r.blob(rend, "header value")?;
        }
        if r.pos != rend {
            return Err(corrupt("record length does not match its fields"));
        }
        views.push(RecordView {
            timestamp: header.base_timestamp.wrapping_add(ts_delta),
            key,
            value,
            headers: &body[headers_at..rend],
            header_count,
        });
    }
    if r.remaining() != 0 {
        return Err(corrupt("unexpected bytes after the last record"));
    }
    Ok((views, contiguous))
}

/// A key as the partition key: UTF-8 text as it is, anything else base64 (and flagged).
fn put_key(out: &mut Vec<u8>, tag: u8, key: &[u8]) -> bool {
    if std::str::from_utf8(key).is_ok() {
        put_bytes_field(out, tag, key);
        false
    } else {
        out.push(tag);
        put_uvarint(out, base64_len(key.len()) as u64);
        put_base64(out, key);
        true
    }
}

/// One header as a `KeyValue` message, under `tag`: a value that is not UTF-8 goes
/// base64-encoded, a null one as the empty string. Returns the header's kind letter
/// (`t`, `b` or `n`, as [`HEADER_KINDS`] spells them).
fn put_property(out: &mut Vec<u8>, tag: u8, name: &[u8], value: Option<&[u8]>) -> u8 {
    let kind = match value {
        None => b'n',
        Some(v) if std::str::from_utf8(v).is_ok() => b't',
        Some(_) => b'b',
    };
    let value = value.unwrap_or_default();
    let text = kind != b'b';
    let value_len = if text {
        value.len()
    } else {
        base64_len(value.len())
    };
    let mut inner_len = 1 + uvarint_len(name.len() as u64) + name.len();
    inner_len += 1 + uvarint_len(value_len as u64) + value_len;
    out.push(tag);
    put_uvarint(out, inner_len as u64);
    put_bytes_field(out, KV_KEY, name);
    out.push(KV_VALUE);
    put_uvarint(out, value_len as u64);
    if text {
        out.extend_from_slice(value);
    } else {
        put_base64(out, value);
    }
    kind
}

/// A record's headers as properties under `tag`, one each, in order (repeated names
/// kept), then [`HEADER_KINDS`] when a header is not text or the last one is itself named
/// so. `kinds` is scratch space.
fn put_headers(out: &mut Vec<u8>, tag: u8, view: &RecordView<'_>, kinds: &mut Vec<u8>) {
    kinds.clear();
    let mut last: &[u8] = &[];
    for (name, v) in headers(view) {
        kinds.push(put_property(out, tag, name, v));
        last = name;
    }
    if last == HEADER_KINDS || kinds.iter().any(|&k| k != b't') {
        put_property(out, tag, HEADER_KINDS, Some(kinds));
    }
}

fn uvarint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn event_time(view: &RecordView<'_>, use_time: bool) -> Option<u64> {
    u64::try_from(view.timestamp)
        .ok()
        .filter(|&t| use_time && t > 0)
}

/// Start an entry: magic and room for the checksum and the metadata size.
fn begin(capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity + 10);
    out.extend_from_slice(&MAGIC_CRC32C.to_be_bytes());
    out.extend_from_slice(&[0u8; 8]);
    out
}

/// Fill in the metadata size (the metadata ends at `meta_end`) and the checksum.
fn finish(mut out: Vec<u8>, meta_end: usize) -> Vec<u8> {
    let meta_len = u32::try_from(meta_end - 10).unwrap_or(u32::MAX);
    out[6..10].copy_from_slice(&meta_len.to_be_bytes());
    let crc = crc32c::crc32c(&out[6..]);
    out[2..6].copy_from_slice(&crc.to_be_bytes());
    out
}

fn put_common(out: &mut Vec<u8>, fields: &EntryFields<'_>) {
    put_bytes_field(out, MM_PRODUCER_NAME, fields.producer_name.as_bytes());
    out.push(MM_SEQUENCE_ID);
    put_uvarint(out, fields.sequence_id);
    out.push(MM_PUBLISH_TIME);
    put_uvarint(out, fields.publish_time);
}

/// One record: a plain entry whose metadata carries the message's own fields (its headers
/// as in a batch entry: one property each, in order, repeated names kept).
fn plain_entry(view: &RecordView<'_>, use_time: bool, fields: &EntryFields<'_>) -> Vec<u8> {
    let value = view.value.unwrap_or_default();
    let mut out =
        begin(view.headers.len() * 2 + view.key.map_or(0, <[u8]>::len) * 2 + value.len() + 64);
    put_common(&mut out, fields);
    put_headers(&mut out, MM_PROPERTIES, view, &mut Vec::new());
    let b64 = view
        .key
        .is_some_and(|k| put_key(&mut out, MM_PARTITION_KEY, k));
    if let Some(t) = event_time(view, use_time) {
        out.push(MM_EVENT_TIME);
        put_uvarint(&mut out, t);
    }
    if b64 {
        out.extend_from_slice(&MM_KEY_B64);
        out.push(1);
    }
    if view.value.is_none() {
        out.extend_from_slice(&MM_NULL_VALUE);
        out.push(1);
    }
    let meta_end = out.len();
    out.extend_from_slice(value);
    finish(out, meta_end)
}

/// Several records: a batch entry, `[u32 size][SingleMessageMetadata][value]` each.
fn batch_entry(views: &[RecordView<'_>], use_time: bool, fields: &EntryFields<'_>) -> Vec<u8> {
    let estimate: usize = views
        .iter()
        .map(|v| {
            24 + 2 * (v.key.map_or(0, <[u8]>::len) + v.headers.len())
                + v.value.map_or(0, <[u8]>::len)
        })
        .sum();
    let mut out = begin(estimate + 64);
    put_common(&mut out, fields);
    out.push(MM_NUM_MESSAGES);
    put_uvarint(&mut out, views.len() as u64);
    let meta_end = out.len();
    let mut kinds = Vec::new();
    for view in views {
        let size_at = out.len();
        out.extend_from_slice(&[0u8; 4]);
        put_headers(&mut out, SM_PROPERTIES, view, &mut kinds);
        let b64 = view
            .key
            .is_some_and(|k| put_key(&mut out, SM_PARTITION_KEY, k));
        out.push(SM_PAYLOAD_SIZE);
        put_uvarint(&mut out, view.value.map_or(0, <[u8]>::len) as u64);
        if let Some(t) = event_time(view, use_time) {
            out.push(SM_EVENT_TIME);
            put_uvarint(&mut out, t);
        }
        if b64 {
            out.extend_from_slice(&[SM_KEY_B64, 1]);
        }
        if view.value.is_none() {
            out.extend_from_slice(&[SM_NULL_VALUE, 1]);
        }
        let size = u32::try_from(out.len() - size_at - 4).unwrap_or(u32::MAX);
        out[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
        if let Some(v) = view.value {
            out.extend_from_slice(v);
        }
    }
    finish(out, meta_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch_from_entry;
    use crate::wire::record_headers;
    use magnetar_format::parse_entry;

    type Header<'a> = (&'a [u8], Option<&'a [u8]>);
    type OwnedHeaders = Vec<(Vec<u8>, Option<Vec<u8>>)>;

    fn view<'a>(raw: &'a [u8], count: usize) -> RecordView<'a> {
        RecordView {
            timestamp: 1_000,
            key: None,
            value: Some(b"v"),
            headers: raw,
            header_count: count,
        }
    }

    const FIELDS: EntryFields<'static> = EntryFields {
        producer_name: "p",
        sequence_id: 0,
        publish_time: 5,
    };

    /// The properties of every message of `entry`, as text.
    fn properties(entry: &[u8]) -> Vec<Vec<(String, String)>> {
        let parsed = parse_entry(entry).expect("an entry");
        let data = parsed.payload().expect("a payload");
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).expect("UTF-8");
        parsed
            .messages(&data)
            .expect("messages")
            .iter()
            .map(|m| {
                m.properties
                    .iter()
                    .map(|(k, v)| (text(k), text(v)))
                    .collect()
            })
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The headers of every record of the batch a fetch makes of `entry`.
    fn fetched_headers(entry: &[u8], n: usize) -> Vec<OwnedHeaders> {
        let batch = batch_from_entry(entry, 9, n as i64, 1).expect("converted");
        let mut r = crate::wire::Reader::new(&batch[BATCH_HEADER_SIZE..]);
        let end = batch.len() - BATCH_HEADER_SIZE;
        (0..n)
            .map(|_| {
                r.varint().expect("length");
                r.byte().expect("attributes");
                r.varint().expect("timestamp");
                r.varint().expect("offset");
                r.blob(end, "key").expect("key");
                r.blob(end, "value").expect("value");
                let count = r.varint().expect("count");
                (0..count)
                    .map(|_| {
                        let k = r.blob(end, "k").expect("k").expect("a name");
                        let v = r.blob(end, "v").expect("v");
                        (k.to_vec(), v.map(<[u8]>::to_vec))
                    })
                    .collect()
            })
            .collect()
    }

    const MIXED: [Header<'static>; 5] = [
        (b"bin", Some(&[0xff, 0xfe, 0x00, 0x01])),
        (b"null", None),
        (b"dup", Some(b"1")),
        (b"empty", Some(b"")),
        (b"dup", Some(b"2")),
    ];

    fn owned(h: &[Header<'_>]) -> OwnedHeaders {
        h.iter()
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect()
    }

    #[test]
    fn headers_that_are_not_text_are_marked_and_duplicates_kept() {
        let raw = record_headers(&MIXED);
        let want = pairs(&[
            ("bin", "//4AAQ=="),
            ("null", ""),
            ("dup", "1"),
            ("empty", ""),
            ("dup", "2"),
            ("__kafka_header_kinds", "bnttt"),
        ]);
        let plain = plain_entry(&view(&raw, MIXED.len()), true, &FIELDS);
        assert_eq!(properties(&plain), vec![want.clone()]);
        let text = record_headers(&[(b"a", Some(b"x"))]);
        let views = [view(&raw, MIXED.len()), view(&text, 1)];
        let batch = batch_entry(&views, true, &FIELDS);
        assert_eq!(properties(&batch), vec![want, pairs(&[("a", "x")])]);
    }

    #[test]
    fn text_headers_carry_no_marker_unless_the_last_is_named_like_it() {
        let text: [Header<'_>; 3] = [(b"a", Some(b"1")), (b"a", Some(b"2")), (b"e", Some(b""))];
        let raw = record_headers(&text);
        let plain = plain_entry(&view(&raw, 3), true, &FIELDS);
        assert_eq!(
            properties(&plain),
            vec![pairs(&[("a", "1"), ("a", "2"), ("e", "")])]
        );
        let named: [Header<'_>; 1] = [(HEADER_KINDS, Some(b""))];
        let raw = record_headers(&named);
        let plain = plain_entry(&view(&raw, 1), true, &FIELDS);
        assert_eq!(
            properties(&plain),
            vec![pairs(&[
                ("__kafka_header_kinds", ""),
                ("__kafka_header_kinds", "t")
            ])]
        );
        assert_eq!(fetched_headers(&plain, 1), vec![owned(&named)]);
    }

    #[test]
    fn headers_read_back_exactly_from_plain_and_batch_entries() {
        let raw = record_headers(&MIXED);
        let plain = plain_entry(&view(&raw, MIXED.len()), true, &FIELDS);
        assert_eq!(fetched_headers(&plain, 1), vec![owned(&MIXED)]);
        let none = record_headers(&[]);
        let views = [view(&none, 0), view(&raw, MIXED.len())];
        let batch = batch_entry(&views, true, &FIELDS);
        assert_eq!(fetched_headers(&batch, 2), vec![vec![], owned(&MIXED)]);
    }
}
