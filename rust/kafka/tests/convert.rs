//! Record batches into entries: the fields each message carries, and every defect reported
//! as an error rather than a panic.

use magnetar_kafka::{
    batch_from_entry, entry_from_batch, parse_header, BatchError, Converted, EntryFields,
};
use proptest::prelude::*;

struct Rec<'a> {
    ts_delta: i64,
    offset_delta: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
}

fn varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn blob(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => varint(out, -1),
        Some(b) => {
            varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

fn record(r: &Rec<'_>) -> Vec<u8> {
    let mut body = vec![0u8];
    varint(&mut body, r.ts_delta);
    varint(&mut body, r.offset_delta);
    blob(&mut body, r.key);
    blob(&mut body, r.value);
    varint(&mut body, r.headers.len() as i64);
    for (k, v) in &r.headers {
        blob(&mut body, Some(k));
        blob(&mut body, *v);
    }
    let mut out = Vec::new();
    varint(&mut out, body.len() as i64);
    out.extend_from_slice(&body);
    out
}

/// A batch with the given attributes and raw record bytes, its CRC filled in.
fn batch_of(attributes: i16, count: i32, records: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&7i64.to_be_bytes());
    b.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&attributes.to_be_bytes());
    b.extend_from_slice(&(count - 1).to_be_bytes());
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&42i64.to_be_bytes());
    b.extend_from_slice(&3i16.to_be_bytes());
    b.extend_from_slice(&10i32.to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

fn batch(recs: &[Rec<'_>]) -> Vec<u8> {
    let raw: Vec<u8> = recs.iter().flat_map(record).collect();
    batch_of(0, recs.len() as i32, &raw)
}

const FIELDS: EntryFields<'static> = EntryFields {
    producer_name: "kafka-42-3",
    sequence_id: 10,
    publish_time: 5_000,
};

fn convert(b: &[u8]) -> Converted {
    entry_from_batch(b, &FIELDS).expect("converts")
}

/// The entry's metadata and payload, after checking magic, checksum and size.
fn split(entry: &[u8]) -> (&[u8], &[u8]) {
    assert_eq!(&entry[..2], &[0x0e, 0x01]);
    let crc = u32::from_be_bytes(entry[2..6].try_into().expect("4"));
    assert_eq!(crc32c::crc32c(&entry[6..]), crc);
    let n = u32::from_be_bytes(entry[6..10].try_into().expect("4")) as usize;
    (&entry[10..10 + n], &entry[10 + n..])
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn one_record_is_a_plain_entry_with_its_fields_in_the_metadata() {
    let b = batch(&[Rec {
        ts_delta: 5,
        offset_delta: 0,
        key: Some(b"user-1"),
        value: Some(b"hello"),
        headers: vec![(b"trace", Some(b"abc")), (b"bin", Some(&[0xff, 0xfe]))],
    }]);
    let c = convert(&b);
    assert_eq!((c.records, c.contiguous), (1, true));
    assert_eq!(c.header.producer_id, 42);
    assert_eq!(c.header.base_sequence, 10);
    let (meta, payload) = split(&c.entry);
    assert_eq!(payload, b"hello");
    assert!(contains(meta, b"kafka-42-3"));
    assert!(
        contains(meta, &[0x32, 6]) && contains(meta, b"user-1"),
        "partition key"
    );
    assert!(
        contains(meta, b"//4="),
        "a non-UTF-8 header value goes base64"
    );
    assert!(contains(meta, &[0x60, 0xed, 0x07]), "event time 1005");
    assert!(!contains(meta, &[0xc8, 0x01]), "not a null value");
}

#[test]
fn several_records_are_a_batch_entry() {
    let b = batch(&[
        Rec {
            ts_delta: 0,
            offset_delta: 0,
            key: None,
            value: Some(b"a"),
            headers: vec![],
        },
        Rec {
            ts_delta: 1,
            offset_delta: 1,
            key: Some(&[0x80]),
            value: None,
            headers: vec![(b"h", None)],
        },
    ]);
    let c = convert(&b);
    assert_eq!((c.records, c.contiguous), (2, true));
    let (meta, payload) = split(&c.entry);
    assert!(contains(meta, &[0x58, 2]), "num_messages_in_batch 2");
    // First message: size, payload_size 1, event time 1000, then its value.
    let first_len = u32::from_be_bytes(payload[..4].try_into().expect("4")) as usize;
    let first = &payload[4..4 + first_len];
    assert_eq!(first, &[0x18, 1, 0x28, 0xe8, 0x07]);
    assert_eq!(payload[4 + first_len], b'a');
    let rest = &payload[5 + first_len..];
    let second_len = u32::from_be_bytes(rest[..4].try_into().expect("4")) as usize;
    let second = &rest[4..4 + second_len];
    assert!(contains(second, b"gA=="), "a binary key is base64");
    assert!(contains(second, &[0x30, 1]), "flagged as base64");
    assert!(contains(second, &[0x48, 1]), "null value");
    assert_eq!(
        rest.len(),
        4 + second_len,
        "a null value adds no payload bytes"
    );
}

#[test]
fn gaps_in_offset_deltas_are_reported() {
    let b = batch(&[
        Rec {
            ts_delta: 0,
            offset_delta: 0,
            key: None,
            value: Some(b"a"),
            headers: vec![],
        },
        Rec {
            ts_delta: 0,
            offset_delta: 5,
            key: None,
            value: Some(b"b"),
            headers: vec![],
        },
    ]);
    assert!(!convert(&b).contiguous);
}

#[test]
fn log_append_time_batches_carry_no_event_time() {
    let raw = record(&Rec {
        ts_delta: 5,
        offset_delta: 0,
        key: None,
        value: Some(b"x"),
        headers: vec![],
    });
    let c = convert(&batch_of(0x08, 1, &raw));
    let (meta, _) = split(&c.entry);
    assert!(!contains(meta, &[0x60]));
}

#[test]
fn an_empty_batch_has_no_entry() {
    let c = convert(&batch_of(0, 0, &[]));
    assert_eq!((c.records, c.entry.len()), (0, 0));
}

#[test]
fn compressed_and_control_batches_are_left_to_the_caller() {
    let raw = record(&Rec {
        ts_delta: 0,
        offset_delta: 0,
        key: None,
        value: Some(b"x"),
        headers: vec![],
    });
    for attributes in [0x01, 0x04, 0x20] {
        assert!(matches!(
            entry_from_batch(&batch_of(attributes, 1, &raw), &FIELDS),
            Err(BatchError::NotConverted(_))
        ));
    }
    let mut v1 = batch_of(0, 1, &raw);
    v1[16] = 1;
    assert!(matches!(
        entry_from_batch(&v1, &FIELDS),
        Err(BatchError::NotConverted(_))
    ));
}

#[test]
fn defects_are_corrupt_message_errors() {
    let good = record(&Rec {
        ts_delta: 0,
        offset_delta: 0,
        key: Some(b"k"),
        value: Some(b"v"),
        headers: vec![(b"h", Some(b"v"))],
    });
    let mut bad_crc = batch_of(0, 1, &good);
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 1;
    let mut trailing = good.clone();
    trailing.push(0);
    let null_key_record = {
        let mut body = vec![0u8, 0, 0, 1, 1, 2, 1];
        body.extend_from_slice(&[0x01, 0x01]);
        let mut out = vec![];
        varint(&mut out, body.len() as i64);
        out.extend_from_slice(&body);
        out
    };
    let bad_name = record(&Rec {
        ts_delta: 0,
        offset_delta: 0,
        key: None,
        value: None,
        headers: vec![(&[0xff], None)],
    });
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("crc", bad_crc),
        ("truncated", batch_of(0, 1, &good[..good.len() - 1])),
        ("trailing bytes", batch_of(0, 1, &trailing)),
        ("count beyond records", batch_of(0, 2, &good)),
        ("count beyond bytes", batch_of(0, 1 << 19, &good)),
        ("negative count", batch_of(0, -1, &good)),
        ("null header key", batch_of(0, 1, &null_key_record)),
        ("header key not UTF-8", batch_of(0, 1, &bad_name)),
        ("short header", batch_of(0, 1, &[])[..40].to_vec()),
    ];
    for (what, b) in cases {
        match entry_from_batch(&b, &FIELDS) {
            Err(BatchError::Corrupt(_)) => {}
            other => panic!("{what}: expected Corrupt, got {other:?}"),
        }
    }
    assert!(parse_header(&batch_of(0, 1, &good)).is_ok());
}

proptest! {
    /// Whatever the records section holds, conversion answers (converted or an error) and
    /// never panics or reads out of bounds.
    #[test]
    fn arbitrary_records_never_panic(count in -2i32..40, body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = entry_from_batch(&batch_of(0, count, &body), &FIELDS);
    }

    /// Every well-formed batch converts, with one message per record.
    #[test]
    fn well_formed_batches_convert(values in proptest::collection::vec(proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)), 1..20)) {
        let recs: Vec<Rec<'_>> = values.iter().enumerate().map(|(i, v)| Rec {
            ts_delta: i as i64, offset_delta: i as i64, key: v.as_deref(), value: v.as_deref(), headers: vec![],
        }).collect();
        let c = entry_from_batch(&batch(&recs), &FIELDS).expect("converts");
        prop_assert_eq!(c.records, recs.len());
        prop_assert!(c.contiguous);
        let _ = split(&c.entry);
    }
}

type OwnedRec = (Vec<u8>, Option<Vec<u8>>, Vec<(Vec<u8>, Vec<u8>)>);

proptest! {
    /// A batch of text records read back from its entry is the same batch again (at the
    /// offsets the entry's index gives), so converting it once more gives the same entry.
    #[test]
    fn batch_to_entry_to_batch_round_trips(
        recs in proptest::collection::vec(("[a-z]{0,6}", proptest::option::of("[ -~]{0,30}"), proptest::collection::vec(("[a-z]{1,4}", "[a-z]{0,4}"), 0..3)), 1..12)
    ) {
        let owned: Vec<OwnedRec> = recs.iter().map(|(k, v, h)| (
            k.clone().into_bytes(), v.clone().map(String::into_bytes),
            h.iter().map(|(a, b)| (a.clone().into_bytes(), b.clone().into_bytes())).collect(),
        )).collect();
        let views: Vec<Rec<'_>> = owned.iter().enumerate().map(|(i, (k, v, h))| Rec {
            ts_delta: i as i64, offset_delta: i as i64, key: Some(k), value: v.as_deref(),
            headers: h.iter().map(|(a, b)| (a.as_slice(), Some(b.as_slice()))).collect(),
        }).collect();
        let first = convert(&batch(&views));
        let n = views.len() as i64;
        let back = batch_from_entry(&first.entry, 7 + n - 1, n, 5_000).expect("reads back");
        let header = parse_header(&back).expect("a valid batch");
        prop_assert_eq!(header.base_offset, 7);
        prop_assert_eq!(header.record_count as i64, n);
        let mut again = back.clone();
        // The producer's header fields are not stored: give the copy the original's.
        again[43..57].copy_from_slice(&batch(&views)[43..57]);
        let crc = crc32c::crc32c(&again[21..]);
        again[17..21].copy_from_slice(&crc.to_be_bytes());
        prop_assert_eq!(convert(&again).entry, first.entry);
    }
}
