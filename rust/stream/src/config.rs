//! Managed-ledger configuration (Pulsar's `managedLedger*` broker settings) and clocks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cache::CacheBudget;

/// Wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; for deterministic tests of time-based rules.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Arc<Self> {
        Arc::new(ManualClock { now: AtomicU64::new(start_ms) })
    }
    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(u64::try_from(by.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
    }
    /// Set the clock.
    pub fn set(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Settings of one managed ledger.
#[derive(Clone)]
pub struct ManagedLedgerConfig {
    /// `managedLedgerDefaultEnsembleSize`.
    pub ensemble_size: usize,
    /// `managedLedgerDefaultWriteQuorum`.
    pub write_quorum: usize,
    /// `managedLedgerDefaultAckQuorum`.
    pub ack_quorum: usize,
    /// `managedLedgerMaxEntriesPerLedger`: roll over once a ledger holds this many entries.
    pub max_entries_per_ledger: u64,
    /// `managedLedgerMinLedgerRolloverTimeMinutes`: a ledger younger than this is not
    /// rolled over for size or entry count.
    pub min_rollover_time: Duration,
    /// `managedLedgerMaxLedgerRolloverTimeMinutes`: a non-empty ledger older than this is
    /// rolled over on the next write. `None` disables the rule.
    pub max_rollover_time: Option<Duration>,
    /// `managedLedgerInactiveLedgerRolloverTimeSeconds`: a non-empty ledger that has
    /// received no entry for this long is rolled over by the periodic rollover check
    /// ([`crate::ManagedLedger::check_rollover`]). `None` disables the rule.
    pub inactive_rollover_time: Option<Duration>,
    /// `managedLedgerMaxSizePerLedgerMbytes`: roll over once a ledger holds this much data.
    pub max_ledger_size_mb: u64,
    /// Retention time of consumed data: `None` keeps it forever, `Some(0)` not at all.
    /// A positive one also rolls over, at the periodic rollover check, a ledger whose
    /// entries have all outlived it (as Kafka rolls an active segment past `retention.ms`),
    /// so that the ledger can be deleted.
    pub retention_time: Option<Duration>,
    /// Retention size of consumed data in MB: `-1` is unlimited.
    pub retention_size_mb: i64,
    /// `managedLedgerDefaultMarkDeleteRateLimit`: cursor state is written to the metadata
    /// store at most this many times per second (0 = on every change).
    pub mark_delete_rate_per_sec: f64,
    /// `managedLedgerMaxUnackedRangesToPersist`: at most this many individually deleted
    /// ranges are written with a cursor's state (the oldest ones); acknowledgements beyond
    /// them are kept in memory only and, after a crash, delivered again.
    pub max_unacked_ranges_to_persist: usize,
    /// Bytes of recently added entries this managed ledger keeps in memory so tailing
    /// readers avoid the bookies. 0 disables the cache.
    pub cache_size_bytes: usize,
    /// `managedLedgerCacheSizeMB`: the bytes every managed ledger sharing it may cache
    /// together (see [`CacheBudget`]); `None`, only `cache_size_bytes` bounds this one.
    pub cache_budget: Option<Arc<CacheBudget>>,
    /// `managedLedgerCacheEvictionTimeThresholdMillis`: cached entries older than this
    /// (by publish time) are dropped on the next append, trim or rollover check.
    pub cache_eviction_time: Duration,
    /// Custom metadata stored with every ledger this managed ledger creates.
    pub ledger_metadata: std::collections::BTreeMap<String, String>,
    /// Where time comes from (publish times, rollover and retention ages).
    pub clock: Arc<dyn Clock>,
}

impl Default for ManagedLedgerConfig {
    fn default() -> Self {
        ManagedLedgerConfig {
            ensemble_size: 1,
            write_quorum: 1,
            ack_quorum: 1,
            max_entries_per_ledger: 50_000,
            min_rollover_time: Duration::from_secs(10 * 60),
            max_rollover_time: Some(Duration::from_secs(240 * 60)),
            inactive_rollover_time: None,
            max_ledger_size_mb: 2048,
            retention_time: Some(Duration::ZERO),
            retention_size_mb: 0,
            mark_delete_rate_per_sec: 1.0,
            max_unacked_ranges_to_persist: 10_000,
            cache_size_bytes: 4 << 20,
            cache_budget: None,
            cache_eviction_time: Duration::from_secs(1),
            ledger_metadata: Default::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for ManagedLedgerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedLedgerConfig")
            .field("ensemble_size", &self.ensemble_size)
            .field("write_quorum", &self.write_quorum)
            .field("ack_quorum", &self.ack_quorum)
            .field("max_entries_per_ledger", &self.max_entries_per_ledger)
            .field("min_rollover_time", &self.min_rollover_time)
            .field("max_rollover_time", &self.max_rollover_time)
            .field("inactive_rollover_time", &self.inactive_rollover_time)
            .field("max_ledger_size_mb", &self.max_ledger_size_mb)
            .field("retention_time", &self.retention_time)
            .field("retention_size_mb", &self.retention_size_mb)
            .field("mark_delete_rate_per_sec", &self.mark_delete_rate_per_sec)
            .field("max_unacked_ranges_to_persist", &self.max_unacked_ranges_to_persist)
            .field("cache_size_bytes", &self.cache_size_bytes)
            .field("cache_budget", &self.cache_budget.as_ref().map(|b| b.limit()))
            .field("cache_eviction_time", &self.cache_eviction_time)
            .finish_non_exhaustive()
    }
}
