//! The native core's log records on the process's stderr.
//!
//! The crates underneath log with the `log` crate (a bookie closing a connection over a
//! frame too long, a ledger writer giving up, a failed checkpoint). Without a logger those
//! records go nowhere; [`log_to_stderr`] installs one that writes them in the line formats
//! of `gateway._logging` (text or JSON, the same fields), at the level the process logs at.
//! A record is written by the thread that logs it, without the GIL: one logged while a
//! lock is held never waits on Python.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

struct StderrLog {
    json: AtomicBool,
}

static LOGGER: StderrLog = StderrLog { json: AtomicBool::new(false) };

/// `gateway._logging`'s timestamp: UTC, milliseconds, `2026-01-01T00:00:00.000Z`.
fn timestamp(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The level names `gateway._logging` writes.
fn level_name(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "error",
        log::Level::Warn => "warning",
        log::Level::Info => "info",
        log::Level::Debug => "debug",
        log::Level::Trace => "trace",
    }
}

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let ts = timestamp(SystemTime::now());
        let level = level_name(record.level());
        let logger = record.target();
        let msg = record.args().to_string();
        let line = if self.json.load(Ordering::Relaxed) {
            serde_json::json!({"ts": ts, "level": level, "logger": logger, "msg": msg}).to_string()
        } else {
            format!("{ts} {:<5} {logger}: {msg}", level.to_uppercase())
        };
        // One write per line, so that lines of several threads do not interleave.
        let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
    }

    fn flush(&self) {}
}

/// Write the native core's log records to stderr at `level` and above (a level name of
/// `gateway._logging`: trace, debug, info, warning, warn, error, critical) as `fmt` lines
/// ("text" or "json"). May be called again to change either.
#[pyfunction]
pub fn log_to_stderr(level: &str, fmt: &str) -> PyResult<()> {
    let filter = match level.to_ascii_lowercase().as_str() {
        "trace" => log::LevelFilter::Trace,
        "debug" => log::LevelFilter::Debug,
        "info" => log::LevelFilter::Info,
        "warning" | "warn" => log::LevelFilter::Warn,
        "error" | "critical" => log::LevelFilter::Error,
        _ => return Err(PyValueError::new_err(format!("unknown log level {level:?}"))),
    };
    let json = match fmt {
        "json" => true,
        "text" => false,
        _ => return Err(PyValueError::new_err(format!("unknown log format {fmt:?}"))),
    };
    LOGGER.json.store(json, Ordering::Relaxed);
    // Fails only when a logger is set already: ours, from an earlier call.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(filter);
    Ok(())
}
