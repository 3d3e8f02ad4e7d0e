//! [`BookiePool`]: the TCP transport, one [`BookieClient`] per bookie address.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::client::{BookieClient, ClientError};
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
/// connect instead of racing several.
type Slot = Arc<tokio::sync::Mutex<Option<BookieClient>>>;

/// Keeps one client connection per bookie and reconnects when it breaks.
pub struct BookiePool {
    request_timeout: Duration,
    slots: Mutex<HashMap<String, Slot>>,
}

impl BookiePool {
    /// A pool whose requests (and connects) give up after `request_timeout`.
    pub fn new(request_timeout: Duration) -> Self {
        BookiePool { request_timeout, slots: Mutex::new(HashMap::new()) }
    }

    async fn client(&self, addr: &str) -> Result<BookieClient, BookieError> {
        let slot = Arc::clone(self.slots.lock().entry(addr.to_string()).or_default());
        let mut guard = slot.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        *guard = None;
        let connect = BookieClient::connect(addr, self.request_timeout);
        let client = match tokio::time::timeout(self.request_timeout, connect).await {
            Ok(r) => r?,
            Err(_) => return Err(BookieError::Timeout),
        };
        *guard = Some(client.clone());
        Ok(client)
    }

    /// Forget the connection to `addr` after it failed, so the next request reconnects.
    async fn drop_client(&self, addr: &str, err: &BookieError) {
        if !matches!(err, BookieError::Io(_) | BookieError::Closed) {
            return;
        }
        let slot = self.slots.lock().get(addr).cloned();
        if let Some(slot) = slot {
            *slot.lock().await = None;
        }
    }

    async fn call<T, F, Fut>(&self, addr: &str, f: F) -> Result<T, BookieError>
    where
        F: FnOnce(BookieClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let client = self.client(addr).await?;
        let result = f(client).await.map_err(BookieError::from);
        if let Err(e) = &result {
            self.drop_client(addr, e).await;
        }
        result
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
        Box::pin(
            async move { self.call(&addr, |c| async move { c.add(ledger, entry, lac, data, recovery).await }).await },
        )
    }

    fn read(&self, addr: &str, ledger: u64, entry: u64, fence: bool) -> BoxFuture<'_, Result<ReadEntry, BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            let r = self.call(&addr, |c| async move { c.read(ledger, entry, fence).await }).await?;
            Ok(ReadEntry { lac: r.lac, data: r.data })
        })
    }

    fn read_lac(&self, addr: &str, ledger: u64, fence: bool) -> BoxFuture<'_, Result<i64, BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move { self.call(&addr, |c| async move { c.read_lac(ledger, fence).await }).await })
    }

    fn delete_ledger(&self, addr: &str, ledger: u64) -> BoxFuture<'_, Result<(), BookieError>> {
        let addr = addr.to_string();
        Box::pin(async move { self.call(&addr, |c| async move { c.delete_ledger(ledger).await }).await })
    }
}
