//! Fault test with a real process: a bookie killed with SIGKILL keeps every add it acknowledged.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::{BookieClient, BookieConfig, BookieServer, ClientError, FrameLimit, JournalConfig};

const TIMEOUT: Duration = Duration::from_secs(10);

struct Bookie(Child);

impl Drop for Bookie {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the bookie binary on port 0 and return it with the address it printed.
fn spawn_bookie(dir: &Path) -> (Bookie, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_magnetar-bookie"))
        .args([
            "--data-dir",
            dir.to_str().expect("utf-8 path"),
            "--bind",
            "127.0.0.1:0",
            "--log-level",
            "warn",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn bookie");
    let stdout = child.stdout.take().expect("stdout");
    let bookie = Bookie(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (bookie, addr.to_string())
}

fn payload(e: u64) -> Bytes {
    Bytes::from(format!("entry {e} ").repeat(1 + (e % 13) as usize))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_add() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut bookie, addr) = spawn_bookie(dir.path());
    let client = BookieClient::connect(&addr, TIMEOUT)
        .await
        .expect("connect");

    // Acknowledged, then fenced, before the kill.
    for e in 0..50u64 {
        client
            .add(1, e, e as i64 - 1, payload(e), false)
            .await
            .expect("add");
    }
    assert_eq!(client.read_lac(2, true).await, Ok(-1));

    // Keep adds in flight while the process dies; remember which were acknowledged.
    let mut tasks = tokio::task::JoinSet::new();
    for e in 50..2000u64 {
        let c = client.clone();
        tasks.spawn(async move { (e, c.add(1, e, e as i64 - 1, payload(e), false).await) });
    }
    // Kill once some of the second wave has been acknowledged.
    let mut acked = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (e, res) = r.expect("task");
        if res.is_ok() {
            acked.push(e);
        }
        if acked.len() == 100 {
            bookie.0.kill().expect("SIGKILL");
            bookie.0.wait().expect("reap");
        }
    }
    assert!(acked.len() >= 100);
    assert!(client.is_closed());

    let server = BookieServer::start(BookieConfig {
        data_dir: dir.path().to_path_buf(),
        bind: "127.0.0.1:0".parse().expect("addr"),
        ledger_dirs: Vec::new(),
        journal: JournalConfig::default(),
        max_frame_size: FrameLimit::MAX,
    })
    .await
    .expect("restart after SIGKILL");
    let client = BookieClient::connect(&server.local_addr().to_string(), TIMEOUT)
        .await
        .expect("connect");
    for e in (0..50u64).chain(acked) {
        let r = client
            .read(1, e, false)
            .await
            .unwrap_or_else(|err| panic!("acknowledged entry {e}: {err}"));
        assert_eq!((r.lac, r.data), (e as i64 - 1, payload(e)));
    }
    assert_eq!(
        client.add(2, 0, -1, Bytes::from_static(b"x"), false).await,
        Err(ClientError::Fenced)
    );
    server.shutdown().await.expect("shutdown");
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut bookie, _addr) = spawn_bookie(dir.path());
    let pid = bookie.0.id().to_string();
    let status = Command::new("sh")
        .args(["-c", &format!("kill -TERM {pid}")])
        .status()
        .expect("run the shell's kill");
    assert!(status.success());
    let exit = bookie.0.wait().expect("wait");
    assert!(exit.success(), "exit status {exit:?}");
}
