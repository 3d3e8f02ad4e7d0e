//! Add throughput of one bookie: `cargo run --release -p magnetar-bookie --example add_throughput
//! [clients] [adds_per_client] [entry_bytes] [window]`. Starts a bookie in a temp dir on port 0,
//! runs the clients (each one connection with up to `window` adds in flight, default 1000), and
//! prints adds/s, MB/s, mean add latency and the number of journal group commits.

use std::time::{Duration, Instant};

use bytes::Bytes;
use magnetar_bookie::{BookieClient, BookieConfig, BookieServer, FrameLimit, JournalConfig};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clients = arg(1, 4);
    let adds = arg(2, 20_000);
    let size = usize::try_from(arg(3, 1024))?;
    let window = usize::try_from(arg(4, 1000))?.max(1);
    let dir = tempfile::tempdir()?;
    let server = BookieServer::start(BookieConfig {
        data_dir: dir.path().to_path_buf(),
        bind: "127.0.0.1:0".parse()?,
        ledger_dirs: Vec::new(),
        journal: JournalConfig::default(),
        max_frame_size: FrameLimit::MAX,
    })
    .await?;
    let addr = server.local_addr().to_string();
    let data = Bytes::from(vec![0x5au8; size]);
    let started = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for c in 0..clients {
        let client = BookieClient::connect(&addr, Duration::from_secs(30)).await?;
        let data = data.clone();
        runs.spawn(async move {
            let mut inflight = tokio::task::JoinSet::new();
            for e in 0..adds {
                let (client, data) = (client.clone(), data.clone());
                inflight.spawn(async move { client.add(c, e, e as i64 - 1, data, false).await });
                if inflight.len() >= window {
                    if let Some(r) = inflight.join_next().await {
                        r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
                    }
                }
            }
            while let Some(r) = inflight.join_next().await {
                r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(r) = runs.join_next().await {
        r??;
    }
    let secs = started.elapsed().as_secs_f64();
    let total = clients * adds;
    let stats = server.journal_stats();
    println!(
        "{total} adds of {size} B in {secs:.2}s: {:.0} adds/s, {:.1} MB/s, ~{:.2} ms per add, {} group commits ({:.1} adds each)",
        total as f64 / secs,
        (total as f64 * size as f64) / secs / 1e6,
        secs * 1000.0 * (clients as f64 * window.min(usize::try_from(adds).unwrap_or(usize::MAX)) as f64) / total as f64,
        stats.batches,
        stats.records as f64 / stats.batches.max(1) as f64
    );
    server.shutdown().await?;
    Ok(())
}
