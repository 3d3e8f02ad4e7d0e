//! The bookie wire protocol: a sans-IO codec.
//!
//! # Framing
//!
//! Every message in either direction is one frame:
//!
//! ```text
//! u32 BE body_len | u32 BE crc32c(body) | body
//! ```
//!
//! `body_len` may not exceed the receiver's [`FrameLimit`]: BookKeeper's
//! `nettyMaxFrameSizeBytes`, configurable between [`MIN_FRAME_SIZE`] and the hard cap
//! [`MAX_FRAME_SIZE`] (16 MiB of entry data plus 1 KiB of headers). A larger length, or a
//! checksum that does not match the body, is a [`ProtoError`]; the receiving side closes that
//! connection. The length is checked before any buffer is grown for the body, so a peer can
//! never make us allocate more than the limit. A sender never encodes a request over its own
//! limit ([`Request::encode_within`]); what one entry may hold under a limit, and how many
//! fit one ADD_BATCH, is [`FrameLimit::max_entry`] and [`FrameLimit::fits_batch`].
//!
//! # Requests (client → bookie)
//!
//! A request body begins `u8 op | u64 BE request_id`, followed by:
//!
//! | op | name | fields after the request id |
//! | --- | --- | --- |
//! | 1 | ADD | `ledger u64`, `entry u64`, `lac i64`, `flags u8` (bit 0: recovery add, allowed on a fenced ledger), `data` (rest of the frame) |
//! | 2 | READ | `ledger u64`, `entry u64`, `flags u8` (bit 0: fence the ledger, then read) |
//! | 3 | READ_LAC | `ledger u64`, `flags u8` (bit 0: fence the ledger, then read) |
//! | 4 | DELETE_LEDGER | `ledger u64` |
//! | 5 | ADD_BATCH | `ledger u64`, `lac i64`, `flags u8` (as ADD), `count u32`, then `count` times `entry u64`, `len u32`, `len` bytes of data |
//!
//! ADD_BATCH carries many entries of one ledger in one frame; the bookie journals them as one
//! group and answers once, when all of them are durable (or with the first failure: the
//! writer then treats every entry of the batch as not stored on this bookie). A batch holds
//! at least one entry and at most [`MAX_BATCH_ENTRIES`].
//!
//! All integers are big-endian. Unknown flag bits are rejected.
//!
//! # Responses (bookie → client)
//!
//! `u8 op | u64 BE request_id | u8 status | payload`, where `op` and `request_id` echo the
//! request. Status codes: 0 OK, 1 NO_ENTRY, 2 NO_LEDGER, 3 FENCED, 4 BAD_REQUEST,
//! 5 IO_ERROR. The payload of an OK response is empty for ADD, ADD_BATCH and DELETE_LEDGER,
//! `lac i64 | data` for READ, and `lac i64` for READ_LAC (-1 when the bookie holds nothing
//! for the ledger). Any other status carries a UTF-8 message (possibly empty).
//!
//! # Example
//!
//! ```
//! use bytes::BytesMut;
//! use magnetar_bookie::proto::{decode_frame, Request};
//!
//! let req = Request::ReadLac { request_id: 7, ledger: 3, fence: true };
//! let mut wire = BytesMut::new();
//! req.encode(&mut wire).unwrap();
//! let body = decode_frame(&mut wire).unwrap().expect("a whole frame");
//! assert_eq!(Request::decode(body).unwrap(), req);
//! assert!(wire.is_empty());
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The hard cap on a frame body, whatever the configured limit: 16 MiB of entry data plus
/// 1 KiB for headers.
pub const MAX_FRAME_SIZE: usize = 16 * 1024 * 1024 + 1024;
/// The smallest frame limit that may be configured: room for every request but an add, and
/// for adds of a few KiB.
pub const MIN_FRAME_SIZE: usize = 4 * 1024;
/// The frame header: body length and body checksum.
pub const FRAME_HEADER_LEN: usize = 8;
/// The largest entry payload a single ADD may carry under the hard cap.
pub const MAX_ENTRY_SIZE: usize = MAX_FRAME_SIZE - ADD_HEADER_LEN;

/// Bytes before the data in an ADD body: op, request id, ledger, entry, lac, flags.
const ADD_HEADER_LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;
/// Bytes before the first entry in an ADD_BATCH body: op, request id, ledger, lac, flags, count.
pub const ADD_BATCH_HEADER_LEN: usize = 1 + 8 + 8 + 8 + 1 + 4;
/// Bytes in front of each entry's data in an ADD_BATCH body: entry id and data length.
pub const ADD_BATCH_ENTRY_OVERHEAD: usize = 8 + 4;
/// The most entries one ADD_BATCH may carry.
pub const MAX_BATCH_ENTRIES: usize = 65_536;
/// Bytes before the data in a READ OK response body: op, request id, status, lac.
const READ_RESPONSE_HEADER_LEN: usize = 1 + 8 + 1 + 8;
const FLAG_RECOVERY: u8 = 0x01;
const FLAG_FENCE: u8 = 0x01;

/// The most bytes of frame body a connection accepts, and a sender puts in one frame:
/// BookKeeper's `nettyMaxFrameSizeBytes`. Always within [`MIN_FRAME_SIZE`]..=[`MAX_FRAME_SIZE`].
///
/// ```
/// use magnetar_bookie::proto::FrameLimit;
///
/// let limit = FrameLimit::new(64 * 1024).unwrap();
/// assert_eq!(limit.max_entry(), 64 * 1024 - 42);
/// assert!(limit.fits_batch(2, 64 * 1024 - 54));
/// assert!(!limit.fits_batch(2, 64 * 1024 - 53));
/// assert!(FrameLimit::new(100).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrameLimit(usize);

impl FrameLimit {
    /// The hard cap, [`MAX_FRAME_SIZE`].
    pub const MAX: FrameLimit = FrameLimit(MAX_FRAME_SIZE);

    /// A limit of `bytes`, which must lie within [`MIN_FRAME_SIZE`]..=[`MAX_FRAME_SIZE`].
    pub fn new(bytes: usize) -> Result<FrameLimit, ProtoError> {
        if (MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&bytes) {
            Ok(FrameLimit(bytes))
        } else {
            Err(ProtoError::BadFrameLimit(bytes))
        }
    }

    /// The limit in bytes of frame body.
    pub const fn bytes(self) -> usize {
        self.0
    }

    /// The largest entry one frame under this limit carries, whether it goes alone (ADD) or
    /// in an ADD_BATCH: the limit less an ADD_BATCH's header and one entry's overhead (which
    /// exceed an ADD's header).
    pub const fn max_entry(self) -> usize {
        self.0 - ADD_BATCH_HEADER_LEN - ADD_BATCH_ENTRY_OVERHEAD
    }

    /// Whether one ADD_BATCH of `entries` entries holding `data` bytes between them fits a
    /// frame under this limit.
    pub const fn fits_batch(self, entries: usize, data: usize) -> bool {
        entries <= MAX_BATCH_ENTRIES
            && ADD_BATCH_HEADER_LEN + entries * ADD_BATCH_ENTRY_OVERHEAD + data <= self.0
    }
}

/// What a malformed frame or body is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("frame length {len} exceeds the limit of {limit} bytes (nettyMaxFrameSizeBytes)")]
    FrameTooLarge { len: u64, limit: usize },
    #[error("a frame limit of {0} bytes is outside {MIN_FRAME_SIZE}..={MAX_FRAME_SIZE}")]
    BadFrameLimit(usize),
    #[error("frame checksum mismatch: header says {expected:#010x}, body has {actual:#010x}")]
    BadChecksum { expected: u32, actual: u32 },
    #[error("unknown op code {0}")]
    UnknownOp(u8),
    #[error("unknown status code {0}")]
    UnknownStatus(u8),
    #[error("{what}: body is {len} bytes, too short")]
    Truncated { what: &'static str, len: usize },
    #[error("{what}: {extra} unexpected trailing bytes")]
    TrailingBytes { what: &'static str, extra: usize },
    #[error("{what}: unknown flag bits {flags:#04x}")]
    BadFlags { what: &'static str, flags: u8 },
    #[error("entry of {size} bytes exceeds the {max} bytes one frame can carry")]
    EntryTooLarge { size: usize, max: usize },
    #[error("ADD_BATCH of {entries} entries and {bytes} body bytes is empty or exceeds the limits ({MAX_BATCH_ENTRIES} entries, {limit} bytes)")]
    BadBatch { entries: usize, bytes: usize, limit: usize },
}

/// The operation a request asks for; echoed in its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpCode {
    Add = 1,
    Read = 2,
    ReadLac = 3,
    DeleteLedger = 4,
    AddBatch = 5,
}

impl OpCode {
    /// The op for a wire byte.
    pub fn from_u8(v: u8) -> Result<OpCode, ProtoError> {
        match v {
            1 => Ok(OpCode::Add),
            2 => Ok(OpCode::Read),
            3 => Ok(OpCode::ReadLac),
            4 => Ok(OpCode::DeleteLedger),
            5 => Ok(OpCode::AddBatch),
            other => Err(ProtoError::UnknownOp(other)),
        }
    }
}

/// The outcome code of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    NoEntry = 1,
    NoLedger = 2,
    Fenced = 3,
    BadRequest = 4,
    IoError = 5,
}

impl Status {
    /// The status for a wire byte.
    pub fn from_u8(v: u8) -> Result<Status, ProtoError> {
        match v {
            0 => Ok(Status::Ok),
            1 => Ok(Status::NoEntry),
            2 => Ok(Status::NoLedger),
            3 => Ok(Status::Fenced),
            4 => Ok(Status::BadRequest),
            5 => Ok(Status::IoError),
            other => Err(ProtoError::UnknownStatus(other)),
        }
    }
}

/// A request from a client to a bookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Store `data` as entry `entry` of `ledger`; `lac` is the writer's last-add-confirmed.
    Add {
        request_id: u64,
        ledger: u64,
        entry: u64,
        lac: i64,
        recovery: bool,
        data: Bytes,
    },
    /// Read one entry; with `fence`, fence the ledger durably first.
    Read {
        request_id: u64,
        ledger: u64,
        entry: u64,
        fence: bool,
    },
    /// Read the highest lac the bookie has seen for the ledger; with `fence`, fence first.
    ReadLac {
        request_id: u64,
        ledger: u64,
        fence: bool,
    },
    /// Remove the ledger and free its space.
    DeleteLedger { request_id: u64, ledger: u64 },
    /// Store each `(entry id, data)` of `entries` in `ledger`, as many ADDs would, answered
    /// once all are durable.
    AddBatch {
        request_id: u64,
        ledger: u64,
        lac: i64,
        recovery: bool,
        entries: Vec<(u64, Bytes)>,
    },
}

impl Request {
    /// The request id the client chose.
    pub fn request_id(&self) -> u64 {
        match self {
            Request::Add { request_id, .. }
            | Request::Read { request_id, .. }
            | Request::ReadLac { request_id, .. }
            | Request::DeleteLedger { request_id, .. }
            | Request::AddBatch { request_id, .. } => *request_id,
        }
    }

    /// The op code of this request.
    pub fn op(&self) -> OpCode {
        match self {
            Request::Add { .. } => OpCode::Add,
            Request::Read { .. } => OpCode::Read,
            Request::ReadLac { .. } => OpCode::ReadLac,
            Request::DeleteLedger { .. } => OpCode::DeleteLedger,
            Request::AddBatch { .. } => OpCode::AddBatch,
        }
    }

    /// Append this request as one whole frame (header included) to `dst`, within the hard
    /// cap [`MAX_FRAME_SIZE`].
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), ProtoError> {
        self.encode_within(dst, FrameLimit::MAX)
    }

    /// Append this request as one whole frame (header included) to `dst`, refusing one
    /// whose body would exceed `limit` (nothing is appended then).
    pub fn encode_within(&self, dst: &mut BytesMut, limit: FrameLimit) -> Result<(), ProtoError> {
        let max = limit.bytes();
        match self {
            Request::Add { data, .. } if ADD_HEADER_LEN + data.len() > max => {
                return Err(ProtoError::EntryTooLarge { size: data.len(), max: max - ADD_HEADER_LEN });
            }
            Request::AddBatch { entries, .. }
                if entries.is_empty()
                    || entries.len() > MAX_BATCH_ENTRIES
                    || self.body_len() > max =>
            {
                return Err(ProtoError::BadBatch { entries: entries.len(), bytes: self.body_len(), limit: max });
            }
            _ => {}
        }
        let start = begin_frame(dst, self.body_len());
        let body = dst;
        body.put_u8(self.op() as u8);
        body.put_u64(self.request_id());
        match self {
            Request::Add {
                ledger,
                entry,
                lac,
                recovery,
                data,
                ..
            } => {
                body.put_u64(*ledger);
                body.put_u64(*entry);
                body.put_i64(*lac);
                body.put_u8(if *recovery { FLAG_RECOVERY } else { 0 });
                body.put_slice(data);
            }
            Request::Read {
                ledger,
                entry,
                fence,
                ..
            } => {
                body.put_u64(*ledger);
                body.put_u64(*entry);
                body.put_u8(if *fence { FLAG_FENCE } else { 0 });
            }
            Request::ReadLac { ledger, fence, .. } => {
                body.put_u64(*ledger);
                body.put_u8(if *fence { FLAG_FENCE } else { 0 });
            }
            Request::DeleteLedger { ledger, .. } => body.put_u64(*ledger),
            Request::AddBatch {
                ledger,
                lac,
                recovery,
                entries,
                ..
            } => {
                body.put_u64(*ledger);
                body.put_i64(*lac);
                body.put_u8(if *recovery { FLAG_RECOVERY } else { 0 });
                // Bounded by MAX_BATCH_ENTRIES above.
                body.put_u32(u32::try_from(entries.len()).unwrap_or(u32::MAX));
                for (entry, data) in entries {
                    body.put_u64(*entry);
                    // Bounded by MAX_FRAME_SIZE above.
                    body.put_u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
                    body.put_slice(data);
                }
            }
        }
        finish_frame(body, start);
        Ok(())
    }

    fn body_len(&self) -> usize {
        match self {
            Request::Add { data, .. } => ADD_HEADER_LEN + data.len(),
            Request::Read { .. } => 1 + 8 + 8 + 8 + 1,
            Request::ReadLac { .. } => 1 + 8 + 8 + 1,
            Request::DeleteLedger { .. } => 1 + 8 + 8,
            Request::AddBatch { entries, .. } => {
                ADD_BATCH_HEADER_LEN
                    + entries.iter().map(|(_, d)| ADD_BATCH_ENTRY_OVERHEAD + d.len()).sum::<usize>()
            }
        }
    }

    /// Decode a request from a frame body (as returned by [`decode_frame`]).
    pub fn decode(mut body: Bytes) -> Result<Request, ProtoError> {
        let (op, request_id) = peek_header(&body)?;
        let total = body.len();
        body.advance(9);
        let req = match op {
            OpCode::Add => {
                need(&body, 8 + 8 + 8 + 1, "ADD request", total)?;
                let ledger = body.get_u64();
                let entry = body.get_u64();
                let lac = body.get_i64();
                let flags = body.get_u8();
                check_flags(flags, FLAG_RECOVERY, "ADD request")?;
                Request::Add {
                    request_id,
                    ledger,
                    entry,
                    lac,
                    recovery: flags & FLAG_RECOVERY != 0,
                    data: body,
                }
            }
            OpCode::Read => {
                exact(&body, 8 + 8 + 1, "READ request", total)?;
                let ledger = body.get_u64();
                let entry = body.get_u64();
                let flags = body.get_u8();
                check_flags(flags, FLAG_FENCE, "READ request")?;
                Request::Read {
                    request_id,
                    ledger,
                    entry,
                    fence: flags & FLAG_FENCE != 0,
                }
            }
            OpCode::ReadLac => {
                exact(&body, 8 + 1, "READ_LAC request", total)?;
                let ledger = body.get_u64();
                let flags = body.get_u8();
                check_flags(flags, FLAG_FENCE, "READ_LAC request")?;
                Request::ReadLac {
                    request_id,
                    ledger,
                    fence: flags & FLAG_FENCE != 0,
                }
            }
            OpCode::DeleteLedger => {
                exact(&body, 8, "DELETE_LEDGER request", total)?;
                Request::DeleteLedger {
                    request_id,
                    ledger: body.get_u64(),
                }
            }
            OpCode::AddBatch => {
                need(&body, 8 + 8 + 1 + 4, "ADD_BATCH request", total)?;
                let ledger = body.get_u64();
                let lac = body.get_i64();
                let flags = body.get_u8();
                check_flags(flags, FLAG_RECOVERY, "ADD_BATCH request")?;
                let count = usize::try_from(body.get_u32()).unwrap_or(usize::MAX);
                // Every entry takes at least its overhead: bound the count before allocating.
                if count == 0 || count > MAX_BATCH_ENTRIES || count > body.len() / ADD_BATCH_ENTRY_OVERHEAD {
                    return Err(ProtoError::BadBatch { entries: count, bytes: total, limit: MAX_FRAME_SIZE });
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    need(&body, ADD_BATCH_ENTRY_OVERHEAD, "ADD_BATCH entry", total)?;
                    let entry = body.get_u64();
                    let len = usize::try_from(body.get_u32()).unwrap_or(usize::MAX);
                    need(&body, len, "ADD_BATCH entry data", total)?;
                    entries.push((entry, body.split_to(len)));
                }
                exact(&body, 0, "ADD_BATCH request", total)?;
                Request::AddBatch {
                    request_id,
                    ledger,
                    lac,
                    recovery: flags & FLAG_RECOVERY != 0,
                    entries,
                }
            }
        };
        Ok(req)
    }
}

/// What a response carries after its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseBody {
    /// OK to ADD, ADD_BATCH or DELETE_LEDGER.
    Empty,
    /// OK to READ: the lac stored with the entry, and its data.
    Read { lac: i64, data: Bytes },
    /// OK to READ_LAC: the highest lac seen (-1 when none).
    Lac(i64),
    /// Any status other than OK: a human-readable reason.
    Message(String),
}

/// A response from a bookie to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub op: OpCode,
    pub request_id: u64,
    pub status: Status,
    pub body: ResponseBody,
}

impl Response {
    /// An OK response with the given body.
    pub fn ok(op: OpCode, request_id: u64, body: ResponseBody) -> Response {
        Response {
            op,
            request_id,
            status: Status::Ok,
            body,
        }
    }

    /// A failed response with a reason.
    pub fn error(
        op: OpCode,
        request_id: u64,
        status: Status,
        message: impl Into<String>,
    ) -> Response {
        Response {
            op,
            request_id,
            status,
            body: ResponseBody::Message(message.into()),
        }
    }

    /// Append this response as one whole frame (header included) to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), ProtoError> {
        let payload_len = match &self.body {
            ResponseBody::Empty => 0,
            ResponseBody::Read { data, .. } => 8 + data.len(),
            ResponseBody::Lac(_) => 8,
            ResponseBody::Message(m) => m.len(),
        };
        if let ResponseBody::Read { data, .. } = &self.body {
            if READ_RESPONSE_HEADER_LEN + data.len() > MAX_FRAME_SIZE {
                return Err(ProtoError::EntryTooLarge {
                    size: data.len(),
                    max: MAX_FRAME_SIZE - READ_RESPONSE_HEADER_LEN,
                });
            }
        }
        // A reason is advisory: cut an oversized one at a char boundary.
        let message_len = match &self.body {
            ResponseBody::Message(m) => {
                let mut end = m.len().min(MAX_FRAME_SIZE - 10);
                while !m.is_char_boundary(end) {
                    end -= 1;
                }
                end
            }
            _ => 0,
        };
        let start = begin_frame(dst, 10 + payload_len.min(MAX_FRAME_SIZE - 10));
        let body = dst;
        body.put_u8(self.op as u8);
        body.put_u64(self.request_id);
        body.put_u8(self.status as u8);
        match &self.body {
            ResponseBody::Empty => {}
            ResponseBody::Read { lac, data } => {
                body.put_i64(*lac);
                body.put_slice(data);
            }
            ResponseBody::Lac(lac) => body.put_i64(*lac),
            ResponseBody::Message(m) => body.put_slice(&m.as_bytes()[..message_len]),
        }
        finish_frame(body, start);
        Ok(())
    }

    /// Decode a response from a frame body (as returned by [`decode_frame`]).
    pub fn decode(mut body: Bytes) -> Result<Response, ProtoError> {
        let (op, request_id) = peek_header(&body)?;
        let total = body.len();
        body.advance(9);
        need(&body, 1, "response", total)?;
        let status = Status::from_u8(body.get_u8())?;
        let rbody = match (status, op) {
            (Status::Ok, OpCode::Add) => {
                exact(&body, 0, "ADD response", total)?;
                ResponseBody::Empty
            }
            (Status::Ok, OpCode::AddBatch) => {
                exact(&body, 0, "ADD_BATCH response", total)?;
                ResponseBody::Empty
            }
            (Status::Ok, OpCode::DeleteLedger) => {
                exact(&body, 0, "DELETE_LEDGER response", total)?;
                ResponseBody::Empty
            }
            (Status::Ok, OpCode::Read) => {
                need(&body, 8, "READ response", total)?;
                let lac = body.get_i64();
                ResponseBody::Read { lac, data: body }
            }
            (Status::Ok, OpCode::ReadLac) => {
                exact(&body, 8, "READ_LAC response", total)?;
                ResponseBody::Lac(body.get_i64())
            }
            _ => ResponseBody::Message(String::from_utf8_lossy(&body).into_owned()),
        };
        Ok(Response {
            op,
            request_id,
            status,
            body: rbody,
        })
    }
}

/// The op and request id at the start of a body, when it has them. The server uses this to
/// answer BAD_REQUEST to a well-framed request whose fields do not parse.
pub fn peek_header(body: &[u8]) -> Result<(OpCode, u64), ProtoError> {
    if body.len() < 9 {
        return Err(ProtoError::Truncated {
            what: "message header",
            len: body.len(),
        });
    }
    let op = OpCode::from_u8(body[0])?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&body[1..9]);
    Ok((op, u64::from_be_bytes(id)))
}

/// Take one whole frame off the front of `buf`, returning its checked body: as
/// [`decode_frame_within`] with the hard cap, [`FrameLimit::MAX`].
pub fn decode_frame(buf: &mut BytesMut) -> Result<Option<Bytes>, ProtoError> {
    decode_frame_within(buf, FrameLimit::MAX)
}

/// Take one whole frame off the front of `buf`, returning its checked body.
///
/// Returns `Ok(None)` when `buf` does not yet hold a whole frame; in that case `buf` has been
/// grown (never beyond [`FRAME_HEADER_LEN`] + `limit`) so that the rest of the frame fits. A
/// length over `limit` (checked before anything is allocated for it) or a checksum mismatch
/// is an error, after which the stream cannot be resynchronised and the connection must be
/// closed.
pub fn decode_frame_within(buf: &mut BytesMut, limit: FrameLimit) -> Result<Option<Bytes>, ProtoError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Ok(None);
    }
    let mut header = &buf[..FRAME_HEADER_LEN];
    let len32 = header.get_u32();
    let expected = header.get_u32();
    let len = match usize::try_from(len32) {
        Ok(len) if len <= limit.bytes() => len,
        _ => return Err(ProtoError::FrameTooLarge { len: u64::from(len32), limit: limit.bytes() }),
    };
    let total = FRAME_HEADER_LEN + len;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(total);
    frame.advance(FRAME_HEADER_LEN);
    let body = frame.freeze();
    let actual = crc32c::crc32c(&body);
    if actual != expected {
        return Err(ProtoError::BadChecksum { expected, actual });
    }
    Ok(Some(body))
}

/// Reserve room for a frame and write a placeholder header; returns where the frame starts.
/// The body is then written straight into `dst`, and [`finish_frame`] fills the header in.
fn begin_frame(dst: &mut BytesMut, body_len_hint: usize) -> usize {
    let start = dst.len();
    dst.reserve(FRAME_HEADER_LEN + body_len_hint);
    dst.put_u64(0);
    start
}

/// Fill in the length and checksum of the frame that starts at `start` and runs to the end of
/// `dst`. Callers have bounded the body by [`MAX_FRAME_SIZE`], so the length fits a u32.
fn finish_frame(dst: &mut BytesMut, start: usize) {
    let body = &dst[start + FRAME_HEADER_LEN..];
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let crc = crc32c::crc32c(body);
    dst[start..start + 4].copy_from_slice(&len.to_be_bytes());
    dst[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
}

fn need(rest: &Bytes, n: usize, what: &'static str, total: usize) -> Result<(), ProtoError> {
    if rest.len() < n {
        return Err(ProtoError::Truncated { what, len: total });
    }
    Ok(())
}

fn exact(rest: &Bytes, n: usize, what: &'static str, total: usize) -> Result<(), ProtoError> {
    need(rest, n, what, total)?;
    if rest.len() > n {
        return Err(ProtoError::TrailingBytes {
            what,
            extra: rest.len() - n,
        });
    }
    Ok(())
}

fn check_flags(flags: u8, known: u8, what: &'static str) -> Result<(), ProtoError> {
    if flags & !known != 0 {
        return Err(ProtoError::BadFlags { what, flags });
    }
    Ok(())
}
