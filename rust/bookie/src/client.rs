//! The bookie client: one multiplexed TCP connection, many requests in flight.
//!
//! # Theory of operation
//!
//! A [`BookieClient`] owns one connection and two tokio tasks. Callers encode their request
//! into a frame, register a completion under a fresh request id in the pending table, and hand
//! the frame to the writer task through a bounded queue (back-pressure when the socket is slow).
//! The writer takes everything queued and sends it with vectored writes, from the frames' own buffers. The reader task decodes
//! responses and completes the pending request with the same id; responses may arrive in any
//! order. A request not answered within the request timeout is removed from the table and fails
//! with [`ClientError::Timeout`]. A request whose frame would exceed the client's limit
//! (nettyMaxFrameSizeBytes, see [`BookieClient::connect_within`]) is refused before it is
//! sent, with [`ClientError::BadRequest`]; responses are accepted up to the hard cap
//! [`proto::MAX_FRAME_SIZE`], since a bookie may hold entries written under a larger limit
//! than this client's. When the connection dies (read error, EOF, write error, or a
//! frame that does not decode) the client is closed for good: every pending request fails with
//! [`ClientError::Closed`] or [`ClientError::Io`], new ones fail at once, and
//! [`BookieClient::is_closed`] turns true. Reconnecting is the caller's decision.
//!
//! Clones share the connection; it is shut down when the last clone is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::proto::{self, FrameLimit, OpCode, Request, Response, ResponseBody, Status};

/// Frames queued towards the writer before callers wait.
const WRITE_QUEUE_FRAMES: usize = 1024;
/// The writer stops gathering queued frames into one vectored write past this many bytes.
const MAX_COALESCED_WRITE: usize = 1024 * 1024;
/// Initial read buffer size.
const READ_BUFFER: usize = 64 * 1024;

/// What a bookie request can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The connection failed with an I/O error (connect, read or write).
    #[error("bookie connection I/O error: {0}")]
    Io(String),
    /// The connection is closed; the request was not (or may not have been) carried out.
    #[error("bookie connection closed")]
    Closed,
    /// No response within the request timeout.
    #[error("bookie request timed out")]
    Timeout,
    /// The ledger is fenced: a normal add is refused.
    #[error("ledger is fenced")]
    Fenced,
    /// The bookie has no such entry.
    #[error("no such entry")]
    NoEntry,
    /// The bookie has nothing for the ledger.
    #[error("no such ledger")]
    NoLedger,
    /// The bookie found the request malformed (or the client could not encode it).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The bookie failed to carry out the request (for example a storage I/O error).
    #[error("bookie error: {0}")]
    Server(String),
}

/// An entry as read from a bookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// The last-add-confirmed the writer sent with this entry.
    pub lac: i64,
    /// The entry's payload.
    pub data: Bytes,
}

type Completion = oneshot::Sender<Result<Response, ClientError>>;

struct Shared {
    pending: Mutex<HashMap<u64, Completion>>,
    closed: AtomicBool,
}

impl Shared {
    /// Close the client and fail everything pending with `err`.
    fn fail_all(&self, err: ClientError) {
        self.closed.store(true, Ordering::SeqCst);
        let drained: Vec<Completion> = self.pending.lock().drain().map(|(_, c)| c).collect();
        for c in drained {
            let _ = c.send(Err(err.clone()));
        }
    }
}

struct Inner {
    addr: String,
    request_timeout: Duration,
    max_frame_size: FrameLimit,
    next_id: AtomicU64,
    shared: Arc<Shared>,
    frames: mpsc::Sender<Bytes>,
    reader: tokio::task::AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// A connection to one bookie. Cheap to clone; clones share the connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), magnetar_bookie::ClientError> {
/// use std::time::Duration;
/// use bytes::Bytes;
/// use magnetar_bookie::BookieClient;
///
/// let bookie = BookieClient::connect("127.0.0.1:3181", Duration::from_secs(5)).await?;
/// bookie.add(7, 0, -1, Bytes::from_static(b"hello"), false).await?;
/// let read = bookie.read(7, 0, false).await?;
/// assert_eq!(read.data, Bytes::from_static(b"hello"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BookieClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BookieClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BookieClient")
            .field("addr", &self.inner.addr)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Removes a pending request when its caller gives up (timeout or a dropped future).
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.pending.lock().remove(&self.id);
    }
}

impl BookieClient {
    /// Connect to the bookie at `addr` (`host:port`), sending frames up to the hard cap
    /// [`FrameLimit::MAX`]. Connecting is bounded by `request_timeout` too.
    pub async fn connect(
        addr: &str,
        request_timeout: Duration,
    ) -> Result<BookieClient, ClientError> {
        BookieClient::connect_within(addr, request_timeout, FrameLimit::MAX).await
    }

    /// Connect to the bookie at `addr` (`host:port`); a request whose frame would exceed
    /// `max_frame_size` is refused without being sent. Connecting is bounded by
    /// `request_timeout` too.
    pub async fn connect_within(
        addr: &str,
        request_timeout: Duration,
        max_frame_size: FrameLimit,
    ) -> Result<BookieClient, ClientError> {
        let stream = match tokio::time::timeout(request_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(ClientError::Io(format!("connect {addr}: {e}"))),
            Err(_) => return Err(ClientError::Timeout),
        };
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::Io(format!("set_nodelay {addr}: {e}")))?;
        let (rd, wr) = stream.into_split();
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        });
        let (frames, queue) = mpsc::channel(WRITE_QUEUE_FRAMES);
        tokio::spawn(write_loop(wr, queue, shared.clone()));
        let reader = tokio::spawn(read_loop(rd, shared.clone())).abort_handle();
        Ok(BookieClient {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                request_timeout,
                max_frame_size,
                next_id: AtomicU64::new(1),
                shared,
                frames,
                reader,
            }),
        })
    }

    /// Store `data` as entry `entry` of `ledger` with the writer's `lac`. Resolves when the
    /// bookie has the entry durable (journal fsynced when journalSyncData). With `recovery`,
    /// the add is accepted even on a fenced ledger.
    pub async fn add(
        &self,
        ledger: u64,
        entry: u64,
        lac: i64,
        data: Bytes,
        recovery: bool,
    ) -> Result<(), ClientError> {
        let resp = self
            .call(|request_id| Request::Add {
                request_id,
                ledger,
                entry,
                lac,
                recovery,
                data,
            })
            .await?;
        match resp.body {
            ResponseBody::Empty => Ok(()),
            other => Err(unexpected(OpCode::Add, &other)),
        }
    }

    /// Store each `(entry id, data)` of `entries` in `ledger` with the writer's `lac`, in one
    /// ADD_BATCH frame. Resolves when the bookie has all of them durable; an error means none
    /// of them may be counted as stored. The batch must fit one frame under this client's
    /// limit (see [`FrameLimit::fits_batch`]).
    pub async fn add_batch(
        &self,
        ledger: u64,
        lac: i64,
        entries: Vec<(u64, Bytes)>,
        recovery: bool,
    ) -> Result<(), ClientError> {
        let resp = self
            .call(|request_id| Request::AddBatch {
                request_id,
                ledger,
                lac,
                recovery,
                entries,
            })
            .await?;
        match resp.body {
            ResponseBody::Empty => Ok(()),
            other => Err(unexpected(OpCode::AddBatch, &other)),
        }
    }

    /// Read entry `entry` of `ledger`. With `fence`, the bookie first fences the ledger durably.
    pub async fn read(
        &self,
        ledger: u64,
        entry: u64,
        fence: bool,
    ) -> Result<ReadResult, ClientError> {
        let resp = self
            .call(|request_id| Request::Read {
                request_id,
                ledger,
                entry,
                fence,
            })
            .await?;
        match resp.body {
            ResponseBody::Read { lac, data } => Ok(ReadResult { lac, data }),
            other => Err(unexpected(OpCode::Read, &other)),
        }
    }

    /// The highest lac the bookie has seen for `ledger` (-1 when it has nothing for it). With
    /// `fence`, the bookie first fences the ledger durably.
    pub async fn read_lac(&self, ledger: u64, fence: bool) -> Result<i64, ClientError> {
        let resp = self
            .call(|request_id| Request::ReadLac {
                request_id,
                ledger,
                fence,
            })
            .await?;
        match resp.body {
            ResponseBody::Lac(lac) => Ok(lac),
            other => Err(unexpected(OpCode::ReadLac, &other)),
        }
    }

    /// Delete `ledger` from the bookie. Deleting a ledger the bookie does not have succeeds.
    pub async fn delete_ledger(&self, ledger: u64) -> Result<(), ClientError> {
        let resp = self
            .call(|request_id| Request::DeleteLedger { request_id, ledger })
            .await?;
        match resp.body {
            ResponseBody::Empty => Ok(()),
            other => Err(unexpected(OpCode::DeleteLedger, &other)),
        }
    }

    /// Whether the connection is gone; a closed client never reopens.
    pub fn is_closed(&self) -> bool {
        self.inner.shared.closed.load(Ordering::SeqCst)
    }

    /// The address this client was connected to, as given to [`connect`](Self::connect).
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Send one request and wait for its response, mapping non-OK statuses to errors.
    async fn call(&self, make: impl FnOnce(u64) -> Request) -> Result<Response, ClientError> {
        let inner = &*self.inner;
        if self.is_closed() {
            return Err(ClientError::Closed);
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let request = make(id);
        let op = request.op();
        let mut frame = BytesMut::new();
        request
            .encode_within(&mut frame, inner.max_frame_size)
            .map_err(|e| ClientError::BadRequest(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        inner.shared.pending.lock().insert(id, tx);
        let _guard = PendingGuard {
            shared: &inner.shared,
            id,
        };
        if self.is_closed() {
            return Err(ClientError::Closed);
        }
        let exchange = async {
            inner
                .frames
                .send(frame.freeze())
                .await
                .map_err(|_| ClientError::Closed)?;
            rx.await.map_err(|_| ClientError::Closed)?
        };
        let resp = match tokio::time::timeout(inner.request_timeout, exchange).await {
            Ok(r) => r?,
            Err(_) => return Err(ClientError::Timeout),
        };
        if resp.op != op {
            let err =
                ClientError::Server(format!("response op {:?} to a {:?} request", resp.op, op));
            inner.shared.fail_all(err.clone());
            inner.reader.abort();
            return Err(err);
        }
        check_status(resp.status, &resp.body)?;
        Ok(resp)
    }
}

/// What a response's status means to the caller: `Ok(())` for OK, else the error it names.
pub(crate) fn check_status(status: Status, body: &ResponseBody) -> Result<(), ClientError> {
    let message = || match body {
        ResponseBody::Message(m) => m.clone(),
        _ => String::new(),
    };
    match status {
        Status::Ok => Ok(()),
        Status::NoEntry => Err(ClientError::NoEntry),
        Status::NoLedger => Err(ClientError::NoLedger),
        Status::Fenced => Err(ClientError::Fenced),
        Status::BadRequest => Err(ClientError::BadRequest(message())),
        Status::IoError => Err(ClientError::Server(message())),
    }
}

fn unexpected(op: OpCode, body: &ResponseBody) -> ClientError {
    ClientError::Server(format!("unexpected {op:?} response body: {body:?}"))
}

async fn write_loop(mut wr: OwnedWriteHalf, mut queue: mpsc::Receiver<Bytes>, shared: Arc<Shared>) {
    let mut frames: Vec<Bytes> = Vec::new();
    while let Some(first) = queue.recv().await {
        let mut queued = first.len();
        frames.push(first);
        while queued < MAX_COALESCED_WRITE {
            match queue.try_recv() {
                Ok(more) => {
                    queued += more.len();
                    frames.push(more);
                }
                Err(_) => break,
            }
        }
        // The frames go out from their own buffers, with vectored writes: no copy here.
        let result = write_frames(&mut wr, &frames).await;
        frames.clear();
        if let Err(e) = result {
            shared.fail_all(ClientError::Io(format!("write: {e}")));
            return;
        }
    }
    // Every clone is gone: half-close so the bookie sees the end of our requests.
    let _ = wr.shutdown().await;
}

/// Write every frame, in order.
async fn write_frames(wr: &mut OwnedWriteHalf, frames: &[Bytes]) -> std::io::Result<()> {
    let mut slices: Vec<std::io::IoSlice<'_>> = frames.iter().map(|f| std::io::IoSlice::new(f)).collect();
    let mut rest: &mut [std::io::IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = wr.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

async fn read_loop(mut rd: OwnedReadHalf, shared: Arc<Shared>) {
    let mut buf = BytesMut::with_capacity(READ_BUFFER);
    loop {
        loop {
            // Up to the hard cap: a READ answer carries whatever entry the bookie holds.
            let body = match proto::decode_frame(&mut buf) {
                Ok(Some(body)) => body,
                Ok(None) => break,
                Err(e) => {
                    log::warn!("bookie sent a bad frame, closing: {e}");
                    shared.fail_all(ClientError::Io(format!("bad frame from bookie: {e}")));
                    return;
                }
            };
            let resp = match Response::decode(body) {
                Ok(r) => r,
                Err(e) => {
                    log::warn!("bookie sent a bad response, closing: {e}");
                    shared.fail_all(ClientError::Io(format!("bad response from bookie: {e}")));
                    return;
                }
            };
            let waiter = shared.pending.lock().remove(&resp.request_id);
            if let Some(w) = waiter {
                let _ = w.send(Ok(resp));
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(READ_BUFFER);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => {
                shared.fail_all(ClientError::Closed);
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.fail_all(ClientError::Io(format!("read: {e}")));
                return;
            }
        }
    }
}
