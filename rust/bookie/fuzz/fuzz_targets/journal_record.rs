//! Arbitrary bytes into the journal / entry-log record decoder: a record or an error, never a
//! panic, and a decoded record always re-encodes to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use magnetar_bookie::journal::parse_record;

fuzz_target!(|data: &[u8]| {
    if let Ok((record, used)) = parse_record(data) {
        let mut again = Vec::new();
        record.encode(&mut again);
        assert_eq!(&again[..], &data[..used]);
    }
});
