//! `magnetar-bookie`: run one bookie as its own process.
//!
//! ```text
//! magnetar-bookie --data-dir DIR [--bind 127.0.0.1:3181] [--journal-sync-data true|false]
//!                 [--journal-max-group-wait-ms 2] [--journal-buffered-writes-threshold 524288]
//!                 [--journal-max-size-mb 2048] [--journal-pre-alloc-size-mb 16]
//!                 [--flush-entry-log-bytes 67108864] [--max-frame-size 16778240]
//!                 [--log-level info]
//! ```
//!
//! `--max-frame-size` is nettyMaxFrameSizeBytes: a connection sending a longer frame is
//! closed (default: the hard cap, [`magnetar_bookie::proto::MAX_FRAME_SIZE`]).
//!
//! Prints `listening on ADDR` on stdout once it accepts connections (so `--bind 127.0.0.1:0`
//! works for tests), and shuts down cleanly on SIGINT or SIGTERM. Killing it harder loses
//! nothing it acknowledged: the journal is replayed on the next start.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use magnetar_bookie::{BookieConfig, BookieError, BookieServer, FrameLimit, JournalConfig};
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "usage: magnetar-bookie --data-dir DIR [--bind ADDR] [--journal-sync-data BOOL] \
[--journal-max-group-wait-ms MS] [--journal-buffered-writes-threshold BYTES] [--journal-max-size-mb MB] \
[--journal-pre-alloc-size-mb MB] [--flush-entry-log-bytes BYTES] [--max-frame-size BYTES] \
[--log-level LEVEL]";

struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let _ = writeln!(
                std::io::stderr(),
                "{} {}: {}",
                record.level(),
                record.target(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

fn parse_args() -> Result<(BookieConfig, log::LevelFilter), String> {
    let mut data_dir: Option<PathBuf> = None;
    let mut bind = "127.0.0.1:3181".to_string();
    let mut journal = JournalConfig::default();
    let mut max_frame_size = FrameLimit::MAX;
    let mut level = log::LevelFilter::Info;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |what: &str| format!("{flag}: {what}: {value:?}");
        match flag.as_str() {
            "--data-dir" => data_dir = Some(PathBuf::from(&value)),
            "--bind" => bind = value.clone(),
            "--journal-sync-data" => {
                journal.sync_data = value.parse().map_err(|_| bad("expected true or false"))?
            }
            "--journal-max-group-wait-ms" => {
                let ms: f64 = value.parse().map_err(|_| bad("expected milliseconds"))?;
                if !(0.0..=60_000.0).contains(&ms) {
                    return Err(bad("out of range 0..=60000"));
                }
                journal.max_group_wait = Duration::from_secs_f64(ms / 1000.0);
            }
            "--journal-buffered-writes-threshold" => {
                journal.buffered_writes_threshold =
                    value.parse().map_err(|_| bad("expected bytes"))?;
            }
            "--journal-max-size-mb" => {
                journal.max_size_mb = value.parse().map_err(|_| bad("expected megabytes"))?
            }
            "--journal-pre-alloc-size-mb" => {
                journal.pre_alloc_size_mb = value.parse().map_err(|_| bad("expected megabytes"))?
            }
            "--flush-entry-log-bytes" => {
                journal.flush_entry_log_bytes = value.parse().map_err(|_| bad("expected bytes"))?
            }
            "--max-frame-size" => {
                let bytes = value.parse().map_err(|_| bad("expected bytes"))?;
                max_frame_size = FrameLimit::new(bytes).map_err(|e| bad(&e.to_string()))?;
            }
            "--log-level" => {
                level = value
                    .parse()
                    .map_err(|_| bad("expected error, warn, info, debug or trace"))?
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    let data_dir = data_dir.ok_or_else(|| format!("--data-dir is required\n{USAGE}"))?;
    let bind = bind
        .parse()
        .map_err(|_| format!("--bind: not an address: {bind:?}"))?;
    Ok((
        BookieConfig {
            data_dir,
            bind,
            ledger_dirs: Vec::new(),
            journal,
            max_frame_size,
        },
        level,
    ))
}

fn main() -> ExitCode {
    let (config, level) = match parse_args() {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("magnetar-bookie: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        // Watch the signals before announcing the address, so a stop sent right after the
        // announcement is never missed.
        let watch = |kind| {
            signal(kind).map_err(|e| BookieError::Io {
                context: "watching signals".into(),
                source: e,
            })
        };
        let mut term = watch(SignalKind::terminate())?;
        let mut int = watch(SignalKind::interrupt())?;
        let server = BookieServer::start(config).await?;
        println!("listening on {}", server.local_addr());
        let _ = std::io::stdout().flush();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        log::info!("stopping");
        server.shutdown().await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("magnetar-bookie: {e}");
            ExitCode::FAILURE
        }
    }
}
