//! Arbitrary bytes into the frame decoder and both body decoders: errors, never panics, and the
//! buffer never grows past one maximal frame plus the input.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use magnetar_bookie::proto::{decode_frame, Request, Response, FRAME_HEADER_LEN, MAX_FRAME_SIZE};

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(1, |b| usize::from(*b).max(1));
    let mut buf = BytesMut::new();
    for chunk in data.chunks(split) {
        buf.extend_from_slice(chunk);
        loop {
            match decode_frame(&mut buf) {
                Ok(Some(body)) => {
                    let _ = Request::decode(body.clone());
                    let _ = Response::decode(body);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(buf.capacity() <= FRAME_HEADER_LEN + MAX_FRAME_SIZE + data.len());
    }
});
