//! [`BookKeeper`]: the entry point — creates, opens, recovers and deletes ledgers, and
//! places ensembles on the registered bookies.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use magnetar_bookie::FrameLimit;
use magnetar_meta::MetadataStore;
use parking_lot::Mutex;

use crate::error::{LedgerError, Result};
use crate::handle::LedgerHandle;
use crate::meta_client::MetaClient;
use crate::metadata::{check_quorums, LedgerMetadata, LedgerState};
use crate::transport::BookieTransport;

/// Ids are drawn again when a freshly generated one turns out to be taken, up to this often.
const MAX_ID_ATTEMPTS: usize = 100;

/// The runtime the calling task runs on; the ledger client needs tokio.
pub(crate) fn current_runtime() -> Result<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current()
        .map_err(|e| LedgerError::Runtime(format!("ledger calls must run inside a tokio runtime: {e}")))
}

/// Settings of a [`BookKeeper`] client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// How long one bookie request may take before the bookie counts as failed.
    pub request_timeout: Duration,
    /// How long a bookie that failed a request is passed over when placing ensembles
    /// (it is still used when nothing else is left).
    pub quarantine: Duration,
    /// How many entries one `read_entries` call fetches concurrently.
    pub read_parallelism: usize,
    /// Call bookies that run in this process directly instead of over TCP (see
    /// `magnetar_bookie::local`). Off by default, so that a client talks TCP to every bookie
    /// unless its owner asks otherwise.
    pub local_bookies: bool,
    /// nettyMaxFrameSizeBytes: no request to a bookie is sent in a frame longer than this.
    /// A batch of adds goes as several frames where one would be longer; an entry that
    /// does not fit one frame is refused ([`LedgerError::EntryTooLarge`]). Default: the hard
    /// cap, [`FrameLimit::MAX`].
    pub max_frame_size: FrameLimit,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            request_timeout: Duration::from_secs(10),
            quarantine: Duration::from_secs(60),
            read_parallelism: 32,
            local_bookies: false,
            max_frame_size: FrameLimit::MAX,
        }
    }
}

pub(crate) struct BkInner {
    pub(crate) meta: MetaClient,
    pub(crate) transport: Arc<dyn BookieTransport>,
    pub(crate) config: ClientConfig,
    next_pick: AtomicUsize,
    quarantined: Mutex<HashMap<String, Instant>>,
}

impl BkInner {
    /// See [`BookKeeper::max_entry_size`].
    pub(crate) fn max_entry_size(&self) -> usize {
        crate::entry::max_payload(self.config.max_frame_size)
    }

    /// Whether a payload of `size` bytes fits one entry.
    pub(crate) fn check_entry_size(&self, size: usize) -> Result<()> {
        let max = self.max_entry_size();
        if size > max {
            return Err(LedgerError::EntryTooLarge { size, max, frame: self.config.max_frame_size.bytes() });
        }
        Ok(())
    }

    /// Remember that `addr` failed a request.
    pub(crate) fn mark_failed(&self, addr: &str) {
        self.quarantined.lock().insert(addr.to_string(), Instant::now());
    }

    pub(crate) fn is_quarantined(&self, addr: &str) -> bool {
        let mut q = self.quarantined.lock();
        match q.get(addr) {
            Some(at) if at.elapsed() < self.config.quarantine => true,
            Some(_) => {
                q.remove(addr);
                false
            }
            None => false,
        }
    }

    /// Up to `n` registered bookies not in `exclude`, healthy ones first, rotating the
    /// starting point on every call so that ledgers spread over all bookies.
    pub(crate) async fn pick_up_to(&self, n: usize, exclude: &[String]) -> Result<Vec<String>> {
        let mut candidates: Vec<String> =
            self.meta.available_bookies().await?.into_iter().filter(|b| !exclude.contains(b)).collect();
        if !candidates.is_empty() {
            let shift = self.next_pick.fetch_add(1, Ordering::Relaxed) % candidates.len();
            candidates.rotate_left(shift);
        }
        let (mut healthy, quarantined): (Vec<String>, Vec<String>) =
            candidates.into_iter().partition(|b| !self.is_quarantined(b));
        healthy.extend(quarantined);
        healthy.truncate(n);
        Ok(healthy)
    }
}

/// A ledger client. Cheap to clone: clones share the bookie connections and settings.
///
/// Metadata-store calls (blocking by contract) run on tokio's blocking pool; bookie
/// requests run on the runtime the calls are made from.
#[derive(Clone)]
pub struct BookKeeper {
    pub(crate) inner: Arc<BkInner>,
}

impl BookKeeper {
    /// A client that reaches bookies over TCP, one connection per bookie, reconnected on
    /// demand (and, with `config.local_bookies`, the bookies of this process directly).
    pub fn new(meta: Arc<dyn MetadataStore>, config: ClientConfig) -> BookKeeper {
        let mut pool = crate::pool::BookiePool::new(config.request_timeout);
        pool.local_bookies = config.local_bookies;
        pool.max_frame_size = config.max_frame_size;
        let transport = Arc::new(pool);
        Self::with_transport(meta, config, transport)
    }

    /// A client that reaches bookies through `transport` (for example in-memory bookies).
    pub fn with_transport(
        meta: Arc<dyn MetadataStore>,
        config: ClientConfig,
        transport: Arc<dyn BookieTransport>,
    ) -> BookKeeper {
        BookKeeper {
            inner: Arc::new(BkInner {
                meta: MetaClient::new(meta),
                transport,
                config,
                next_pick: AtomicUsize::new(0),
                quarantined: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The settings this client was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The largest payload one entry may have: what fits one frame under
    /// `max_frame_size`. A larger add fails with [`LedgerError::EntryTooLarge`].
    pub fn max_entry_size(&self) -> usize {
        self.inner.max_entry_size()
    }

    /// Create a ledger striped over `ensemble` bookies, each entry written to
    /// `write_quorum` of them and confirmed by `ack_quorum`, and open it for writing.
    ///
    /// Fails with [`LedgerError::NotEnoughBookies`] when fewer than `ensemble` bookies are
    /// registered under `/ledgers/available`.
    pub async fn create_ledger(
        &self,
        ensemble: usize,
        write_quorum: usize,
        ack_quorum: usize,
        custom: BTreeMap<String, String>,
    ) -> Result<LedgerHandle> {
        let runtime = current_runtime()?;
        check_quorums(ensemble, write_quorum, ack_quorum).map_err(LedgerError::InvalidArgument)?;
        let bookies = self.inner.pick_up_to(ensemble, &[]).await?;
        if bookies.len() < ensemble {
            return Err(LedgerError::NotEnoughBookies);
        }
        let meta = LedgerMetadata::new(ensemble, write_quorum, ack_quorum, bookies, custom);
        for _ in 0..MAX_ID_ATTEMPTS {
            let id = self.inner.meta.next_ledger_id().await?;
            if let Some(version) = self.inner.meta.create_ledger(id, &meta).await? {
                log::debug!("created ledger {id} on {:?}", meta.current_ensemble());
                return Ok(LedgerHandle::writer(Arc::clone(&self.inner), runtime, id, meta, version));
            }
        }
        Err(LedgerError::Metadata(magnetar_meta::MetaError::Other(
            "no free ledger id found: the id counter lags behind existing ledgers".into(),
        )))
    }

    /// Open ledger `id` for reading.
    ///
    /// With `recover` and a ledger that is not closed, first fence it on its bookies (the
    /// writer, if alive, can confirm nothing more), find and re-replicate its last entries,
    /// and close it. Without `recover`, a closed ledger reads up to its last entry and an
    /// open one up to the last add confirmed its bookies report.
    pub async fn open_ledger(&self, id: u64, recover: bool) -> Result<LedgerHandle> {
        let runtime = current_runtime()?;
        let (meta, version) = self.inner.meta.read_ledger(id).await?;
        if meta.state == LedgerState::Closed {
            return Ok(LedgerHandle::reader(Arc::clone(&self.inner), runtime.clone(), id, meta, version, None));
        }
        if recover {
            crate::recovery::recover(&self.inner, runtime, id, (meta, version)).await
        } else {
            let handle = LedgerHandle::reader(Arc::clone(&self.inner), runtime.clone(), id, meta, version, Some(-1));
            handle.read_last_add_confirmed().await?;
            Ok(handle)
        }
    }

    /// Delete ledger `id`: drop it on every bookie of every fragment, then remove its
    /// metadata. A bookie that cannot be reached keeps its copy (logged) until it is
    /// cleaned up by other means; the ledger is gone for every client either way.
    pub async fn delete_ledger(&self, id: u64) -> Result<()> {
        current_runtime()?;
        let (meta, _) = self.inner.meta.read_ledger(id).await?;
        let mut tasks = tokio::task::JoinSet::new();
        for addr in meta.all_bookies() {
            let inner = Arc::clone(&self.inner);
            tasks.spawn(async move {
                let r = inner.transport.delete_ledger(&addr, id).await;
                (addr, r)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(e))) if e.is_missing() => {}
                Ok((addr, Err(e))) => log::warn!("ledger {id}: delete on bookie {addr} failed: {e}"),
                Err(e) => log::warn!("ledger {id}: delete task failed: {e}"),
            }
        }
        self.inner.meta.delete_ledger(id).await
    }
}
