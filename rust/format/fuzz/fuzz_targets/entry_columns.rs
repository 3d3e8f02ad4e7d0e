//! Arbitrary bytes as a stored entry into the column decoder: errors, never panics, and a
//! failed entry leaves the columns as they were. The checksum is recomputed over the input
//! first, so that the fuzzer reaches the metadata, batch and decompression code behind it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use magnetar_format::{EntryPosition, MessageColumns};

fuzz_target!(|data: &[u8]| {
    let mut raw = vec![0x0e, 0x01, 0, 0, 0, 0];
    raw.extend_from_slice(data);
    let crc = crc32c::crc32c(&raw[6..]);
    raw[2..6].copy_from_slice(&crc.to_be_bytes());
    let mut columns = MessageColumns::new();
    let at = EntryPosition { ledger_id: 1, entry_id: 2, first_offset: 0 };
    if columns.push_entry(at, &raw, 0..i64::MAX).is_err() {
        assert_eq!(columns, MessageColumns::new());
    }
    let _ = columns.push_entry(at, data, 0..i64::MAX);
});
