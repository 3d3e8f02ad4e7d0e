//! The bookie server and client over real TCP on 127.0.0.1 port 0.

use std::time::Duration;

use bytes::Bytes;
use magnetar_bookie::{BookieClient, BookieConfig, BookieServer, ClientError, JournalConfig};

const TIMEOUT: Duration = Duration::from_secs(10);

fn config(dir: &std::path::Path) -> BookieConfig {
    BookieConfig {
        data_dir: dir.to_path_buf(),
        bind: "127.0.0.1:0".parse().expect("addr"),
        journal: JournalConfig::default(),
    }
}

async fn start(dir: &std::path::Path) -> (BookieServer, BookieClient) {
    let server = BookieServer::start(config(dir)).await.expect("start");
    let client = BookieClient::connect(&server.local_addr().to_string(), TIMEOUT).await.expect("connect");
    (server, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_read_and_lac() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    assert_eq!(client.read(1, 0, false).await, Err(ClientError::NoLedger));
    assert_eq!(client.read_lac(1, false).await, Ok(-1));
    client.add(1, 0, -1, Bytes::from_static(b"zero"), false).await.expect("add 0");
    client.add(1, 1, 0, Bytes::from_static(b"one"), false).await.expect("add 1");
    let r = client.read(1, 1, false).await.expect("read 1");
    assert_eq!((r.lac, r.data), (0, Bytes::from_static(b"one")));
    let r = client.read(1, 0, false).await.expect("read 0");
    assert_eq!((r.lac, r.data), (-1, Bytes::from_static(b"zero")));
    assert_eq!(client.read(1, 2, false).await, Err(ClientError::NoEntry));
    assert_eq!(client.read_lac(1, false).await, Ok(0));
    assert!(!client.is_closed());
    assert_eq!(client.addr(), server.local_addr().to_string());
    server.shutdown().await.expect("shutdown");
}
