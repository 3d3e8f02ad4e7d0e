//! Round trips of every frame, and robustness of the decoder against arbitrary bytes.

use bytes::{BufMut, Bytes, BytesMut};
use magnetar_bookie::proto::{
    decode_frame, decode_frame_within, FrameLimit, OpCode, ProtoError, Request, Response,
    ResponseBody, Status, ADD_BATCH_ENTRY_OVERHEAD, FRAME_HEADER_LEN, MAX_FRAME_SIZE,
    MIN_FRAME_SIZE,
};
use proptest::prelude::*;

fn data() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..512).prop_map(Bytes::from)
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            any::<bool>(),
            data()
        )
            .prop_map(
                |(request_id, ledger, entry, lac, recovery, data)| Request::Add {
                    request_id,
                    ledger,
                    entry,
                    lac,
                    recovery,
                    data
                }
            ),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
            |(request_id, ledger, entry, fence)| Request::Read {
                request_id,
                ledger,
                entry,
                fence
            }
        ),
        (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(request_id, ledger, fence)| {
            Request::ReadLac {
                request_id,
                ledger,
                fence,
            }
        }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(request_id, ledger)| Request::DeleteLedger { request_id, ledger }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            any::<bool>(),
            proptest::collection::vec((any::<u64>(), data()), 1..6)
        )
            .prop_map(|(request_id, ledger, lac, recovery, entries)| Request::AddBatch {
                request_id,
                ledger,
                lac,
                recovery,
                entries
            }),
    ]
}

fn op() -> impl Strategy<Value = OpCode> {
    prop_oneof![
        Just(OpCode::Add),
        Just(OpCode::Read),
        Just(OpCode::ReadLac),
        Just(OpCode::DeleteLedger),
        Just(OpCode::AddBatch)
    ]
}

fn error_status() -> impl Strategy<Value = Status> {
    prop_oneof![
        Just(Status::NoEntry),
        Just(Status::NoLedger),
        Just(Status::Fenced),
        Just(Status::BadRequest),
        Just(Status::IoError)
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (
            any::<u64>(),
            prop_oneof![Just(OpCode::Add), Just(OpCode::DeleteLedger), Just(OpCode::AddBatch)]
        )
            .prop_map(|(id, op)| Response::ok(op, id, ResponseBody::Empty)),
        (any::<u64>(), any::<i64>(), data()).prop_map(|(id, lac, data)| Response::ok(
            OpCode::Read,
            id,
            ResponseBody::Read { lac, data }
        )),
        (any::<u64>(), any::<i64>()).prop_map(|(id, lac)| Response::ok(
            OpCode::ReadLac,
            id,
            ResponseBody::Lac(lac)
        )),
        (any::<u64>(), op(), error_status(), ".{0,40}")
            .prop_map(|(id, op, st, msg)| Response::error(op, id, st, msg)),
    ]
}

/// Feed `wire` to the decoder in `chunk`-sized pieces, collecting bodies until an error.
fn feed(wire: &[u8], chunk: usize) -> (Vec<Bytes>, Option<ProtoError>, usize) {
    let mut buf = BytesMut::new();
    let mut bodies = Vec::new();
    let mut max_cap = 0;
    for piece in wire.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match decode_frame(&mut buf) {
                Ok(Some(b)) => bodies.push(b),
                Ok(None) => break,
                Err(e) => return (bodies, Some(e), max_cap.max(buf.capacity())),
            }
        }
        max_cap = max_cap.max(buf.capacity());
    }
    (bodies, None, max_cap)
}

proptest! {
    #[test]
    fn request_roundtrip(reqs in proptest::collection::vec(request(), 1..8), chunk in 1usize..64) {
        let mut wire = BytesMut::new();
        for r in &reqs {
            r.encode(&mut wire).expect("encode");
        }
        let (bodies, err, _) = feed(&wire, chunk);
        prop_assert_eq!(err, None);
        let decoded: Vec<Request> = bodies.into_iter().map(|b| Request::decode(b).expect("decode")).collect();
        prop_assert_eq!(decoded, reqs);
    }

    #[test]
    fn response_roundtrip(resps in proptest::collection::vec(response(), 1..8), chunk in 1usize..64) {
        let mut wire = BytesMut::new();
        for r in &resps {
            r.encode(&mut wire).expect("encode");
        }
        let (bodies, err, _) = feed(&wire, chunk);
        prop_assert_eq!(err, None);
        let decoded: Vec<Response> = bodies.into_iter().map(|b| Response::decode(b).expect("decode")).collect();
        prop_assert_eq!(decoded, resps);
    }

    /// Arbitrary bytes: the decoder returns frames or an error, never panics, and never grows
    /// its buffer past one maximal frame plus what was fed in.
    #[test]
    fn decoder_survives_arbitrary_bytes(wire in proptest::collection::vec(any::<u8>(), 0..2048), chunk in 1usize..300) {
        let (bodies, _err, max_cap) = feed(&wire, chunk);
        prop_assert!(max_cap <= FRAME_HEADER_LEN + MAX_FRAME_SIZE + wire.len());
        for b in bodies {
            let _ = Request::decode(b.clone());
            let _ = Response::decode(b);
        }
    }

    /// Arbitrary bodies inside well-formed frames reach the body decoders, which must not panic.
    #[test]
    fn body_decoders_survive_arbitrary_bodies(body in proptest::collection::vec(any::<u8>(), 0..128), op in 0u8..6) {
        let mut b = body.clone();
        if !b.is_empty() {
            b[0] = op;
        }
        let b = Bytes::from(b);
        let _ = Request::decode(b.clone());
        let _ = Response::decode(b);
    }

    /// A single flipped bit anywhere in a frame is caught (by the checksum or the length check),
    /// or, in the length field, leaves the decoder waiting; it never yields a wrong request.
    #[test]
    fn flipped_bit_never_yields_a_different_request(req in request(), bit in any::<prop::sample::Index>()) {
        let mut wire = BytesMut::new();
        req.encode(&mut wire).expect("encode");
        let mut bad = wire.to_vec();
        let i = bit.index(bad.len() * 8);
        bad[i / 8] ^= 1 << (i % 8);
        let (bodies, _err, _) = feed(&bad, bad.len());
        for b in bodies {
            prop_assert_ne!(Request::decode(b).ok(), Some(req.clone()));
        }
    }
}

#[test]
fn oversized_length_is_refused_before_allocating() {
    let mut buf = BytesMut::new();
    buf.put_u32(u32::try_from(MAX_FRAME_SIZE + 1).expect("fits"));
    buf.put_u32(0);
    let cap = buf.capacity();
    assert_eq!(
        decode_frame(&mut buf),
        Err(ProtoError::FrameTooLarge {
            len: MAX_FRAME_SIZE as u64 + 1,
            limit: MAX_FRAME_SIZE
        })
    );
    assert_eq!(buf.capacity(), cap);
    let mut buf = BytesMut::new();
    buf.put_u32(u32::MAX);
    buf.put_u32(0);
    assert!(matches!(
        decode_frame(&mut buf),
        Err(ProtoError::FrameTooLarge { .. })
    ));
}

/// A request of exactly `len` body bytes (a DELETE_LEDGER padded with junk: the frame
/// decoder looks at the length and checksum only).
fn frame_of(len: usize) -> BytesMut {
    let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut b = BytesMut::new();
    b.put_u32(u32::try_from(len).expect("fits"));
    b.put_u32(crc32c::crc32c(&body));
    b.put_slice(&body);
    b
}

#[test]
fn a_configured_limit_accepts_a_frame_at_it_and_refuses_one_past_it() {
    let limit = FrameLimit::new(8 * 1024).expect("in range");
    let mut at = frame_of(8 * 1024);
    let body = decode_frame_within(&mut at, limit).expect("at the limit").expect("whole");
    assert_eq!(body.len(), 8 * 1024);
    assert!(at.is_empty());

    // One byte over: refused from its header alone, before the body is read or room is
    // made for it.
    let mut over = frame_of(8 * 1024 + 1);
    over.truncate(FRAME_HEADER_LEN);
    let cap = over.capacity();
    let err = decode_frame_within(&mut over, limit).expect_err("over the limit");
    assert_eq!(err, ProtoError::FrameTooLarge { len: 8 * 1024 + 1, limit: 8 * 1024 });
    assert_eq!(err.to_string(), "frame length 8193 exceeds the limit of 8192 bytes (nettyMaxFrameSizeBytes)");
    assert_eq!(over.capacity(), cap);
    // The hard cap takes it.
    assert!(decode_frame(&mut frame_of(8 * 1024 + 1)).expect("under the cap").is_some());
}

#[test]
fn frame_limits_outside_the_range_are_refused() {
    assert_eq!(FrameLimit::new(MIN_FRAME_SIZE - 1), Err(ProtoError::BadFrameLimit(MIN_FRAME_SIZE - 1)));
    assert_eq!(FrameLimit::new(MAX_FRAME_SIZE + 1), Err(ProtoError::BadFrameLimit(MAX_FRAME_SIZE + 1)));
    assert_eq!(FrameLimit::new(MIN_FRAME_SIZE).map(FrameLimit::bytes), Ok(MIN_FRAME_SIZE));
    assert_eq!(FrameLimit::new(MAX_FRAME_SIZE), Ok(FrameLimit::MAX));
}

#[test]
fn the_encoder_keeps_requests_within_the_senders_limit() {
    let limit = FrameLimit::new(8 * 1024).expect("in range");
    let add = |len: usize| Request::Add {
        request_id: 1,
        ledger: 1,
        entry: 0,
        lac: -1,
        recovery: false,
        data: Bytes::from(vec![1u8; len]),
    };
    let batch = |lens: &[usize]| Request::AddBatch {
        request_id: 1,
        ledger: 1,
        lac: -1,
        recovery: false,
        entries: lens.iter().enumerate().map(|(i, n)| (i as u64, Bytes::from(vec![2u8; *n]))).collect(),
    };
    // The largest entry the limit promises fits both ways, and lands at most at the limit.
    for req in [add(limit.max_entry()), batch(&[limit.max_entry()])] {
        let mut wire = BytesMut::new();
        req.encode_within(&mut wire, limit).expect("fits");
        assert!(wire.len() - FRAME_HEADER_LEN <= limit.bytes());
        let body = decode_frame_within(&mut wire, limit).expect("frame").expect("whole");
        assert_eq!(Request::decode(body).expect("decode"), req);
    }
    let mut wire = BytesMut::new();
    assert_eq!(
        add(limit.bytes()).encode_within(&mut wire, limit),
        Err(ProtoError::EntryTooLarge { size: 8 * 1024, max: 8 * 1024 - 34 })
    );
    let half = limit.max_entry() / 2;
    assert!(limit.fits_batch(2, 2 * half - ADD_BATCH_ENTRY_OVERHEAD));
    assert!(!limit.fits_batch(2, 2 * half));
    assert!(matches!(
        batch(&[half, half]).encode_within(&mut wire, limit),
        Err(ProtoError::BadBatch { entries: 2, limit: 8192, .. })
    ));
    assert!(wire.is_empty(), "nothing is written for a refused request");
}

#[test]
fn checksum_mismatch_is_an_error() {
    let mut wire = BytesMut::new();
    Request::DeleteLedger {
        request_id: 1,
        ledger: 2,
    }
    .encode(&mut wire)
    .expect("encode");
    let last = wire.len() - 1;
    wire[last] ^= 0xff;
    assert!(matches!(
        decode_frame(&mut wire),
        Err(ProtoError::BadChecksum { .. })
    ));
}

#[test]
fn malformed_bodies_are_typed_errors() {
    let frame = |body: &[u8]| {
        let mut b = BytesMut::new();
        b.put_u32(u32::try_from(body.len()).expect("fits"));
        b.put_u32(crc32c::crc32c(body));
        b.put_slice(body);
        decode_frame(&mut b).expect("frame").expect("whole")
    };
    assert_eq!(
        Request::decode(frame(&[9, 0, 0, 0, 0, 0, 0, 0, 1])),
        Err(ProtoError::UnknownOp(9))
    );
    assert!(matches!(
        Request::decode(frame(&[1, 0, 0])),
        Err(ProtoError::Truncated { .. })
    ));
    let mut read = vec![2u8];
    read.extend_from_slice(&[0; 8 + 8 + 8]);
    read.push(0x80);
    assert!(matches!(
        Request::decode(frame(&read)),
        Err(ProtoError::BadFlags { .. })
    ));
    let mut del = vec![4u8];
    del.extend_from_slice(&[0; 8 + 8 + 1]);
    assert!(matches!(
        Request::decode(frame(&del)),
        Err(ProtoError::TrailingBytes { .. })
    ));
}

#[test]
fn entry_over_the_limit_is_refused_by_the_encoder() {
    let big = Bytes::from(vec![0u8; magnetar_bookie::proto::MAX_ENTRY_SIZE + 1]);
    let req = Request::Add {
        request_id: 1,
        ledger: 1,
        entry: 0,
        lac: -1,
        recovery: false,
        data: big,
    };
    assert!(matches!(
        req.encode(&mut BytesMut::new()),
        Err(ProtoError::EntryTooLarge { .. })
    ));
    let max = Bytes::from(vec![7u8; magnetar_bookie::proto::MAX_ENTRY_SIZE]);
    let req = Request::Add {
        request_id: 1,
        ledger: 1,
        entry: 0,
        lac: -1,
        recovery: false,
        data: max,
    };
    let mut wire = BytesMut::new();
    req.encode(&mut wire).expect("a maximal entry fits");
    let body = decode_frame(&mut wire).expect("frame").expect("whole");
    assert_eq!(Request::decode(body).expect("decode"), req);
}

#[test]
fn add_batch_counts_are_checked_before_allocating() {
    let frame = |body: &[u8]| {
        let mut b = BytesMut::new();
        b.put_u32(u32::try_from(body.len()).expect("fits"));
        b.put_u32(crc32c::crc32c(body));
        b.put_slice(body);
        decode_frame(&mut b).expect("frame").expect("whole")
    };
    // count says a million entries, but the body has room for none.
    let mut body = vec![5u8];
    body.extend_from_slice(&[0; 8 + 8 + 8 + 1]);
    body.extend_from_slice(&1_000_000u32.to_be_bytes());
    assert!(matches!(
        Request::decode(frame(&body)),
        Err(ProtoError::BadBatch { .. })
    ));
    // An empty batch is refused both ways.
    let mut empty = vec![5u8];
    empty.extend_from_slice(&[0; 8 + 8 + 8 + 1 + 4]);
    assert!(matches!(
        Request::decode(frame(&empty)),
        Err(ProtoError::BadBatch { .. })
    ));
    let req = Request::AddBatch { request_id: 1, ledger: 1, lac: -1, recovery: false, entries: Vec::new() };
    assert!(matches!(req.encode(&mut BytesMut::new()), Err(ProtoError::BadBatch { .. })));
    // An entry length running past the body is a truncation, not a panic.
    let mut short = vec![5u8];
    short.extend_from_slice(&[0; 8 + 8 + 8 + 1]);
    short.extend_from_slice(&1u32.to_be_bytes());
    short.extend_from_slice(&3u64.to_be_bytes());
    short.extend_from_slice(&100u32.to_be_bytes());
    short.extend_from_slice(b"abc");
    assert!(matches!(
        Request::decode(frame(&short)),
        Err(ProtoError::Truncated { .. })
    ));
}
