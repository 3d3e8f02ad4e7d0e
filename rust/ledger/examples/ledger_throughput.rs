//! Ledger add throughput: `cargo run --release -p magnetar-ledger --example ledger_throughput
//! [bookies] [ensemble] [write_quorum] [ack_quorum] [entries] [entry_bytes] [batch]`.
//! Starts the bookies in temp dirs on port 0, writes `entries` entries to one ledger in
//! pipelined batches of `batch`, reads them back, and prints entries/s and MB/s both ways.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use magnetar_bookie::{BookieConfig, BookieServer, FrameLimit, JournalConfig};
use magnetar_ledger::{BookKeeper, ClientConfig};
use magnetar_meta::{MemStore, MetadataStore};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bookies = usize::try_from(arg(1, 3))?;
    let (e, qw, qa) = (usize::try_from(arg(2, 3))?, usize::try_from(arg(3, 2))?, usize::try_from(arg(4, 2))?);
    let entries = arg(5, 20_000);
    let size = usize::try_from(arg(6, 1024))?;
    let batch = arg(7, 500).max(1);
    let store = Arc::new(MemStore::default());
    let mut servers = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..bookies {
        let dir = tempfile::tempdir()?;
        let server = BookieServer::start(BookieConfig {
            data_dir: dir.path().to_path_buf(),
            bind: "127.0.0.1:0".parse()?,
            ledger_dirs: Vec::new(),
            journal: JournalConfig::default(),
            max_frame_size: FrameLimit::MAX,
        })
        .await?;
        store.put(&format!("/ledgers/available/{}", server.local_addr()), b"", None)?;
        servers.push(server);
        dirs.push(dir);
    }
    let bk = BookKeeper::new(store, ClientConfig::default());
    let lh = bk.create_ledger(e, qw, qa, BTreeMap::new()).await?;
    let data = Bytes::from(vec![0x5au8; size]);
    let started = Instant::now();
    let mut written = 0;
    while written < entries {
        let n = batch.min(entries - written);
        lh.add_entries((0..n).map(|_| data.clone()).collect()).await?;
        written += n;
    }
    let write_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut read = 0;
    while read < entries {
        let last = (read + batch).min(entries) - 1;
        read += u64::try_from(lh.read_entries(read, last).await?.len())?;
    }
    let read_secs = started.elapsed().as_secs_f64();
    lh.close().await?;
    let mb = (entries as f64) * (size as f64) / 1e6;
    println!(
        "ledger E={e} Qw={qw} Qa={qa} on {bookies} bookies, {entries} entries of {size} bytes, batches of {batch}"
    );
    println!("write: {:.0} entries/s, {:.1} MB/s", entries as f64 / write_secs, mb / write_secs);
    println!("read:  {:.0} entries/s, {:.1} MB/s", entries as f64 / read_secs, mb / read_secs);
    for server in servers {
        server.shutdown().await?;
    }
    Ok(())
}
