//! Bookies in this process, reached without a socket.
//!
//! A [`BookieServer`](crate::BookieServer) registers itself here under its address
//! (`host:port`, as ledger metadata names it) when it starts, and leaves when it shuts down
//! or is dropped. A ledger client in the same process that is allowed to (the ledger
//! crate's `ClientConfig::local_bookies`) finds it with [`find`] and calls it directly:
//! the same admission checks (shutting down, fenced), the same storage and the same
//! journal group commit as a request over TCP, but no frame encoding and checksumming, no
//! socket round trip, and no reader and writer tasks to wake. A standalone broker with
//! in-process bookies so spends less CPU per entry, and an add is acknowledged as soon as
//! the journal thread has synced it.
//!
//! Answers are the client's ([`ClientError`], [`ReadResult`]), so a caller treats both
//! routes alike. A bookie that stops is gone from the registry at once: later requests find
//! no local bookie and go over TCP, where they fail as they would for any stopped bookie.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::client::{check_status, ClientError, ReadResult};
use crate::proto::{ResponseBody, Status};
use crate::server::Core;

type Registry = Mutex<HashMap<String, Weak<Core>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(crate) fn register(addr: &str, core: &Arc<Core>) {
    registry()
        .lock()
        .insert(addr.to_string(), Arc::downgrade(core));
}

/// Forget `addr`, unless a newer server has registered under it since.
pub(crate) fn unregister(addr: &str, core: &Arc<Core>) {
    let mut map = registry().lock();
    if map
        .get(addr)
        .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(core)))
    {
        map.remove(addr);
    }
}

/// The bookie serving `addr` in this process, if one does.
pub fn find(addr: &str) -> Option<LocalBookie> {
    let core = registry().lock().get(addr)?.upgrade()?;
    Some(LocalBookie { core })
}

/// A bookie of this process. Its methods answer as [`BookieClient`](crate::BookieClient)'s
/// do; they carry no timeout of their own.
#[derive(Clone)]
pub struct LocalBookie {
    core: Arc<Core>,
}

fn completion() -> (
    impl FnOnce(Status, String) + Send + 'static,
    impl std::future::Future<Output = Result<(), ClientError>>,
) {
    let (tx, rx) = oneshot::channel::<(Status, String)>();
    let done = move |status: Status, message: String| {
        let _ = tx.send((status, message));
    };
    let wait = async move {
        let (status, message) = rx.await.map_err(|_| ClientError::Closed)?;
        check_status(status, &ResponseBody::Message(message))
    };
    (done, wait)
}

/// A response's body, or the error its status names (as the TCP client reads it).
fn answer(resp: crate::proto::Response) -> Result<ResponseBody, ClientError> {
    check_status(resp.status, &resp.body)?;
    Ok(resp.body)
}

fn unexpected(body: &ResponseBody) -> ClientError {
    ClientError::Server(format!("unexpected answer {body:?}"))
}

impl LocalBookie {
    /// Store entry `entry` of `ledger` (see the bookie protocol's ADD).
    pub async fn add(
        &self,
        ledger: u64,
        entry: u64,
        lac: i64,
        data: Bytes,
        recovery: bool,
    ) -> Result<(), ClientError> {
        let (done, wait) = completion();
        self.core.add_batch(ledger, lac, vec![(entry, data)], recovery, done);
        wait.await
    }

    /// Store several entries of `ledger` as one journal group (ADD_BATCH).
    pub async fn add_batch(
        &self,
        ledger: u64,
        lac: i64,
        entries: Vec<(u64, Bytes)>,
        recovery: bool,
    ) -> Result<(), ClientError> {
        let (done, wait) = completion();
        self.core.add_batch(ledger, lac, entries, recovery, done);
        wait.await
    }

    /// Read an entry, fencing the ledger first with `fence` (READ).
    pub async fn read(
        &self,
        ledger: u64,
        entry: u64,
        fence: bool,
    ) -> Result<ReadResult, ClientError> {
        match answer(self.core.read(0, ledger, entry, fence).await)? {
            ResponseBody::Read { lac, data } => Ok(ReadResult { lac, data }),
            other => Err(unexpected(&other)),
        }
    }

    /// The highest last-add-confirmed the bookie has seen for `ledger` (READ_LAC).
    pub async fn read_lac(&self, ledger: u64, fence: bool) -> Result<i64, ClientError> {
        match answer(self.core.lac(0, ledger, fence).await)? {
            ResponseBody::Lac(lac) => Ok(lac),
            other => Err(unexpected(&other)),
        }
    }

    /// Drop everything the bookie holds for `ledger` (DELETE_LEDGER).
    pub async fn delete_ledger(&self, ledger: u64) -> Result<(), ClientError> {
        answer(self.core.delete(0, ledger).await).map(drop)
    }
}
