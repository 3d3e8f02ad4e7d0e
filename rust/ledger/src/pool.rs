//! [`BookiePool`]: the TCP transport, one [`BookieClient`] per bookie address; with
//! `local_bookies`, bookies of this process are called directly instead.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::client::{BookieClient, ClientError};
use magnetar_bookie::local::{self, LocalBookie};
use magnetar_bookie::FrameLimit;
use parking_lot::Mutex;

use crate::transport::{BookieError, BookieTransport, BoxFuture, ReadEntry};

impl From<ClientError> for BookieError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Io(m) => BookieError::Io(m),
            ClientError::Closed => BookieError::Closed,
            ClientError::Timeout => BookieError::Timeout,
            ClientError::Fenced => BookieError::Fenced,
            ClientError::NoEntry => BookieError::NoEntry,
            ClientError::NoLedger => BookieError::NoLedger,
            ClientError::BadRequest(m) => BookieError::BadRequest(m),
            ClientError::Server(m) => BookieError::Server(m),
        }
    }
}

/// One connection slot per bookie; the async lock makes concurrent first uses share one
/// connect instead of racing several. The number counts connections made, so that a
/// failure reported on an old connection does not drop a newer one.
type Slot = Arc<tokio::sync::Mutex<(u64, Option<BookieClient>)>>;

/// A connection handed out by the pool.
struct Conn {
    client: BookieClient,
    generation: u64,
    /// Made for this request (as opposed to reused from earlier ones).
    fresh: bool,
}

/// Keeps one client connection per bookie and reconnects when it breaks.
///
/// A request that fails with a broken connection that had been idle in the pool is tried
/// once more on a new connection: the bookie may have restarted since. All four requests
/// are idempotent (adds rewrite the same entry), so the retry is safe.
pub struct BookiePool {
    request_timeout: Duration,
    slots: Mutex<HashMap<String, Slot>>,
    /// Call bookies of this process directly ([`magnetar_bookie::local`]).
    pub local_bookies: bool,
    /// The longest frame a connection sends (nettyMaxFrameSizeBytes); a longer request
    /// fails with [`BookieError::BadRequest`] unsent. Default: the hard cap.
    pub max_frame_size: FrameLimit,
}

impl BookiePool {
    /// A pool whose requests (and connects) give up after `request_timeout`.
    pub fn new(request_timeout: Duration) -> Self {
        BookiePool {
            request_timeout,
            slots: Mutex::new(HashMap::new()),
            local_bookies: false,
            max_frame_size: FrameLimit::MAX,
        }
    }

    fn slot(&self, addr: &str) -> Slot {
        Arc::clone(self.slots.lock().entry(addr.to_string()).or_default())
    }

    async fn conn(&self, addr: &str) -> Result<Conn, BookieError> {
        let slot = self.slot(addr);
        let mut guard = slot.lock().await;
        if let Some(c) = guard.1.as_ref() {
            if !c.is_closed() {
                return Ok(Conn { client: c.clone(), generation: guard.0, fresh: false });
            }
        }
        guard.1 = None;
        let connect = BookieClient::connect_within(addr, self.request_timeout, self.max_frame_size);
        let client = match tokio::time::timeout(self.request_timeout, connect).await {
            Ok(r) => r?,
            Err(_) => return Err(BookieError::Timeout),
        };
        guard.0 += 1;
        guard.1 = Some(client.clone());
        Ok(Conn { client, generation: guard.0, fresh: true })
    }

    /// Forget connection `generation` to `addr` after it broke.
    async fn forget(&self, addr: &str, generation: u64) {
        let slot = self.slot(addr);
        let mut guard = slot.lock().await;
        if guard.0 == generation {
            guard.1 = None;
        }
    }

    /// The bookie serving `addr` in this process, when local calls are on and there is one.
    fn local(&self, addr: &str) -> Option<LocalBookie> {
        if self.local_bookies {
            local::find(addr)
        } else {
            None
        }
    }

    /// A local call, bounded by the request timeout as a TCP request is.
    async fn local_call<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, BookieError> {
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(r) => r.map_err(BookieError::from),
            Err(_) => Err(BookieError::Timeout),
        }
    }

    async fn call<T, F, Fut>(&self, addr: &str, f: F) -> Result<T, BookieError>
    where
        F: Fn(BookieClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let mut retried = false;
        loop {
            let conn = self.conn(addr).await?;
            let result = f(conn.client).await.map_err(BookieError::from);
            match result {
                Err(e @ (BookieError::Io(_) | BookieError::Closed)) => {
                    self.forget(addr, conn.generation).await;
                    if conn.fresh || retried {
                        return Err(e);
                    }
                    retried = true;
                }
                other => return other,
            }
        }
    }
}

impl BookieTransport for BookiePool {
    fn add(
        &self,
        addr: &str,
        ledger: u64,
        entry: u64,
        lac: i64,
        data: Bytes,
        recovery: bool,
    ) -> BoxFuture<'_, Result<(), BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            if let Some(b) = self.local(&addr) {
                return self.local_call(b.add(ledger, entry, lac, data, recovery)).await;
            }
            self.call(&addr, |c| {
                let data = data.clone();
                async move { c.add(ledger, entry, lac, data, recovery).await }
            })
            .await
        })
    }

    fn add_batch(
        &self,
        addr: &str,
        ledger: u64,
        lac: i64,
        entries: Vec<(u64, Bytes)>,
        recovery: bool,
    ) -> BoxFuture<'_, Result<(), BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            if let Some(b) = self.local(&addr) {
                return self.local_call(b.add_batch(ledger, lac, entries, recovery)).await;
            }
            self.call(&addr, |c| {
                let entries = entries.clone();
                async move { c.add_batch(ledger, lac, entries, recovery).await }
            })
            .await
        })
    }

    fn read(&self, addr: &str, ledger: u64, entry: u64, fence: bool) -> BoxFuture<'_, Result<ReadEntry, BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            let r = match self.local(&addr) {
                Some(b) => self.local_call(b.read(ledger, entry, fence)).await?,
                None => self.call(&addr, |c| async move { c.read(ledger, entry, fence).await }).await?,
            };
            Ok(ReadEntry { lac: r.lac, data: r.data })
        })
    }

    fn read_lac(&self, addr: &str, ledger: u64, fence: bool) -> BoxFuture<'_, Result<i64, BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            match self.local(&addr) {
                Some(b) => self.local_call(b.read_lac(ledger, fence)).await,
                None => self.call(&addr, |c| async move { c.read_lac(ledger, fence).await }).await,
            }
        })
    }

    fn delete_ledger(&self, addr: &str, ledger: u64) -> BoxFuture<'_, Result<(), BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            match self.local(&addr) {
                Some(b) => self.local_call(b.delete_ledger(ledger)).await,
                None => self.call(&addr, |c| async move { c.delete_ledger(ledger).await }).await,
            }
        })
    }
}
