//! Arbitrary bytes into the frame decoder, under a frame limit the input picks, and both
//! body decoders: errors, never panics. A frame longer than the limit is refused from its
//! header, a body returned is within the limit, and the buffer never grows past one frame
//! under the limit plus the input.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use magnetar_bookie::proto::{
    decode_frame_within, FrameLimit, ProtoError, Request, Response, FRAME_HEADER_LEN, MIN_FRAME_SIZE,
};

/// The limit a byte of input picks: 0 the hard cap, else that many times the smallest limit.
fn limit_of(b: u8) -> FrameLimit {
    match b {
        0 => FrameLimit::MAX,
        n => FrameLimit::new(MIN_FRAME_SIZE * usize::from(n)).unwrap_or(FrameLimit::MAX),
    }
}

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(1, |b| usize::from(*b).max(1));
    let limit = limit_of(data.get(1).copied().unwrap_or(0));
    let mut buf = BytesMut::new();
    for chunk in data.chunks(split) {
        buf.extend_from_slice(chunk);
        loop {
            match decode_frame_within(&mut buf, limit) {
                Ok(Some(body)) => {
                    assert!(body.len() <= limit.bytes());
                    let _ = Request::decode(body.clone());
                    let _ = Response::decode(body);
                }
                Ok(None) => break,
                Err(ProtoError::FrameTooLarge { len, limit: refused_at }) => {
                    assert_eq!(refused_at, limit.bytes());
                    assert!(len > limit.bytes() as u64);
                    return;
                }
                Err(_) => return,
            }
        }
        assert!(buf.capacity() <= FRAME_HEADER_LEN + limit.bytes() + data.len());
    }
});
