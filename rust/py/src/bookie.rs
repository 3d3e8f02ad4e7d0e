//! `BookieServer`: a bookie running on the native runtime, started and stopped from Python.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use magnetar_bookie::{BookieConfig, BookieServer as Server, FrameLimit, JournalConfig};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::BookieError;
use crate::runtime::runtime;

#[pyclass(module = "core._native", name = "BookieServer")]
pub struct PyBookieServer {
    server: Option<Server>,
    address: String,
}

fn resolve(host: &str, port: u16) -> PyResult<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| BookieError::new_err(format!("cannot resolve {host}:{port}: {e}")))?
        .next()
        .ok_or_else(|| BookieError::new_err(format!("no address for {host}:{port}")))
}

/// The address a bookie bound to `bound` registers under (and ledger ensembles name it by):
/// `advertised_host` with the bound port when given (advertisedAddress), else `bound`.
fn advertised(advertised_host: &str, bound: SocketAddr) -> String {
    match advertised_host {
        "" => bound.to_string(),
        host if host.contains(':') => format!("[{host}]:{}", bound.port()),
        host => format!("{host}:{}", bound.port()),
    }
}

#[pymethods]
impl PyBookieServer {
    #[new]
    #[pyo3(signature = (data_dir, host, port, journal_sync_data=true, journal_max_group_wait_ms=2.0,
                        journal_buffered_writes_threshold=524288, journal_max_size_mb=2048,
                        journal_flush_when_queue_empty=true, journal_pre_alloc_size_mb=16,
                        flush_entry_log_bytes=67108864, flush_interval_ms=60000,
                        journal_max_backups=0, ledger_dirs=Vec::new(),
                        max_frame_size=magnetar_bookie::proto::MAX_FRAME_SIZE, advertised_host=""))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        data_dir: PathBuf,
        host: &str,
        port: u16,
        journal_sync_data: bool,
        journal_max_group_wait_ms: f64,
        journal_buffered_writes_threshold: usize,
        journal_max_size_mb: u64,
        journal_flush_when_queue_empty: bool,
        journal_pre_alloc_size_mb: u64,
        flush_entry_log_bytes: u64,
        flush_interval_ms: u64,
        journal_max_backups: u64,
        ledger_dirs: Vec<PathBuf>,
        max_frame_size: usize,
        advertised_host: &str,
    ) -> PyResult<Self> {
        let bind = resolve(host, port)?;
        let max_frame_size = FrameLimit::new(max_frame_size).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let config = BookieConfig {
            data_dir,
            bind,
            ledger_dirs,
            journal: JournalConfig {
                sync_data: journal_sync_data,
                max_group_wait: Duration::from_secs_f64(journal_max_group_wait_ms.max(0.0) / 1000.0),
                buffered_writes_threshold: journal_buffered_writes_threshold,
                max_size_mb: journal_max_size_mb,
                flush_when_queue_empty: journal_flush_when_queue_empty,
                pre_alloc_size_mb: journal_pre_alloc_size_mb,
                flush_entry_log_bytes,
                flush_interval: Duration::from_millis(flush_interval_ms.max(1)),
                max_backups: journal_max_backups,
                ..JournalConfig::default()
            },
            max_frame_size,
        };
        let server = py
            .detach(|| runtime().block_on(Server::start(config)))
            .map_err(|e| BookieError::new_err(e.to_string()))?;
        let address = advertised(advertised_host, server.local_addr());
        Ok(Self { server: Some(server), address })
    }

    /// `host:port` the bookie is known by (as registered in the metadata store): where it
    /// serves, or its advertised host with the port it serves on.
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// The journal's counters: group commits, records and bytes written, and fdatasync
    /// count, total and longest time in microseconds.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        if let Some(server) = &self.server {
            let s = server.journal_stats();
            d.set_item("journal_batches", s.batches)?;
            d.set_item("journal_records", s.records)?;
            d.set_item("journal_bytes", s.bytes)?;
            d.set_item("journal_syncs", s.syncs)?;
            d.set_item("journal_sync_micros_total", s.sync_micros_total)?;
            d.set_item("journal_sync_micros_max", s.sync_micros_max)?;
        }
        Ok(d)
    }

    /// The ledgers this bookie holds, in ascending order.
    fn ledgers(&self) -> PyResult<Vec<u64>> {
        let server = self.server.as_ref().ok_or_else(|| BookieError::new_err("bookie is shut down"))?;
        server.ledgers().map_err(|e| BookieError::new_err(e.to_string()))
    }

    /// Delete `ledger` here, durably (as a ledger client's delete would); a ledger this
    /// bookie does not hold is no error.
    fn delete_ledger(&self, py: Python<'_>, ledger: u64) -> PyResult<()> {
        let server = self.server.as_ref().ok_or_else(|| BookieError::new_err("bookie is shut down"))?;
        py.detach(|| runtime().block_on(server.delete_ledger(ledger)))
            .map_err(|e| BookieError::new_err(e.to_string()))
    }

    /// Stop serving: in-flight adds finish, the journal and ledger storage are synced, files
    /// closed. Idempotent.
    fn shutdown(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(server) = self.server.take() {
            py.detach(|| runtime().block_on(server.shutdown()))
                .map_err(|e| BookieError::new_err(e.to_string()))?;
        }
        Ok(())
    }
}
