//! The factory that opens managed ledgers, one instance per name.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use magnetar_meta::MetadataStore;
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use crate::cache::CacheBudget;
use crate::config::ManagedLedgerConfig;
use crate::error::{Result, StreamError};

/// How often opening a managed ledger is tried when its record changes underneath.
const OPEN_ATTEMPTS: usize = 3;
/// How often a factory with a cache budget sweeps every open ledger's cache of entries
/// past their age (Pulsar's `managedLedgerCacheEvictionIntervalMs`).
pub const CACHE_EVICTION_INTERVAL: Duration = Duration::from_millis(100);
use crate::managed_ledger::ManagedLedger;
use crate::records::{meta_call, ML_ROOT};
use crate::store::LedgerStore;

type Slot = Arc<OnceCell<Arc<ManagedLedger>>>;

struct FactoryInner {
    meta: Arc<dyn MetadataStore>,
    store: Arc<dyn LedgerStore>,
    open: Mutex<HashMap<String, Slot>>,
    /// Shared by the entry caches of every managed ledger opened here, when set.
    cache: Option<Arc<CacheBudget>>,
}

impl Drop for FactoryInner {
    fn drop(&mut self) {
        // A sweep waiting for entries finds the factory gone and ends.
        if let Some(budget) = &self.cache {
            budget.wake();
        }
    }
}

/// Opens managed ledgers over one metadata store and one ledger store. Cheap to clone.
#[derive(Clone)]
pub struct ManagedLedgerFactory {
    inner: Arc<FactoryInner>,
}

impl ManagedLedgerFactory {
    /// A factory over `meta` (records) and `ledgers` (data).
    pub fn new(meta: Arc<dyn MetadataStore>, ledgers: Arc<dyn LedgerStore>) -> Self {
        Self::build(meta, ledgers, None)
    }

    /// A factory whose managed ledgers' entry caches share `budget`
    /// (`managedLedgerCacheSizeMB` and its eviction watermark, see [`CacheBudget`]). Entries past a ledger's
    /// `cache_eviction_time` leave its cache every [`CACHE_EVICTION_INTERVAL`], written to or
    /// not, so an idle ledger does not keep the budget; while nothing is cached, the sweep
    /// waits for the first entry instead. Call within a tokio runtime: the
    /// sweep runs on it, until the factory is dropped.
    pub fn with_cache(meta: Arc<dyn MetadataStore>, ledgers: Arc<dyn LedgerStore>, budget: Arc<CacheBudget>) -> Self {
        let factory = Self::build(meta, ledgers, Some(budget));
        let weak = Arc::downgrade(&factory.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CACHE_EVICTION_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                let budget = inner.cache.clone();
                for ml in (ManagedLedgerFactory { inner }).open_ledgers() {
                    ml.evict_expired_cache();
                }
                // Nothing cached: no timer until something is (an idle broker sleeps).
                if let Some(budget) = budget {
                    budget.wait_filled().await;
                }
            }
        });
        factory
    }

    fn build(meta: Arc<dyn MetadataStore>, store: Arc<dyn LedgerStore>, cache: Option<Arc<CacheBudget>>) -> Self {
        ManagedLedgerFactory { inner: Arc::new(FactoryInner { meta, store, open: Mutex::new(HashMap::new()), cache }) }
    }

    /// The shared cache budget, for a factory made [`with_cache`](Self::with_cache).
    pub fn cache_budget(&self) -> Option<&Arc<CacheBudget>> {
        self.inner.cache.as_ref()
    }

    /// Open (creating if needed) the managed ledger `name`. While it is open, opening the
    /// same name again returns the same instance (and ignores `config`). A config without a
    /// cache budget of its own takes the factory's.
    pub async fn open(&self, name: &str, mut config: ManagedLedgerConfig) -> Result<Arc<ManagedLedger>> {
        if config.cache_budget.is_none() {
            config.cache_budget = self.inner.cache.clone();
        }
        let slot: Slot = self.inner.open.lock().entry(name.to_string()).or_default().clone();
        let ml = slot
            .get_or_try_init(|| async {
                let ml = self.open_fresh(name, config).await?;
                let weak: Weak<FactoryInner> = Arc::downgrade(&self.inner);
                let key = name.to_string();
                let this = Arc::downgrade(&ml);
                ml.set_on_close(Box::new(move || {
                    if let Some(f) = weak.upgrade() {
                        let mut open = f.open.lock();
                        let same = open
                            .get(&key)
                            .and_then(|s| s.get())
                            .is_some_and(|cur| Weak::ptr_eq(&Arc::downgrade(cur), &this));
                        if same {
                            open.remove(&key);
                        }
                    }
                }));
                Ok::<_, StreamError>(ml)
            })
            .await?
            .clone();
        Ok(ml)
    }

    /// Open with a few attempts: a previous owner that is still finishing a record write
    /// makes the first attempt lose the compare-and-set; its ledger is fenced by then, so a
    /// new attempt reads the settled record.
    async fn open_fresh(&self, name: &str, config: ManagedLedgerConfig) -> Result<Arc<ManagedLedger>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match ManagedLedger::open(name, config.clone(), self.inner.meta.clone(), self.inner.store.clone()).await {
                Err(StreamError::Fenced(_)) if attempt < OPEN_ATTEMPTS => continue,
                other => return other,
            }
        }
    }

    /// The managed ledgers open right now.
    pub fn open_ledgers(&self) -> Vec<Arc<ManagedLedger>> {
        self.inner.open.lock().values().filter_map(|s| s.get().cloned()).collect()
    }

    /// Names of the managed ledgers that have a record directly under `/managed-ledgers/<prefix>`.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let base = if prefix.is_empty() { ML_ROOT.to_string() } else { format!("{ML_ROOT}/{}", prefix.trim_matches('/')) };
        let b = base.clone();
        let children = meta_call(&self.inner.meta, move |m| m.children(&b)).await?;
        let mut out = Vec::new();
        for c in children {
            let path = format!("{base}/{c}");
            let p = path.clone();
            let is_ml = meta_call(&self.inner.meta, move |m| m.get(&p))
                .await?
                .is_some_and(|(data, _)| data.starts_with(b"{\"ledgers\""));
            if is_ml {
                out.push(path.trim_start_matches(ML_ROOT).trim_start_matches('/').to_string());
            }
        }
        Ok(out)
    }

    /// Close every open managed ledger.
    pub async fn shutdown(&self) -> Result<()> {
        let mut first_err = None;
        for ml in self.open_ledgers() {
            if let Err(e) = ml.close().await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
