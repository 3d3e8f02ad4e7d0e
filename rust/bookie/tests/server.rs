//! The bookie server and client over real TCP on 127.0.0.1 port 0: requests, fencing,
//! durability across crashes, torn journals, bad peers, timeouts.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use magnetar_bookie::proto::{self, OpCode, Request, Response, Status};
use magnetar_bookie::{
    journal, BookieClient, BookieConfig, BookieError, BookieServer, ClientError, FrameLimit,
    JournalConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TIMEOUT: Duration = Duration::from_secs(10);

fn config(dir: &Path) -> BookieConfig {
    BookieConfig {
        data_dir: dir.to_path_buf(),
        bind: "127.0.0.1:0".parse().expect("addr"),
        ledger_dirs: Vec::new(),
        journal: JournalConfig::default(),
        max_frame_size: FrameLimit::MAX,
    }
}

async fn connect(server: &BookieServer) -> BookieClient {
    BookieClient::connect(&server.local_addr().to_string(), TIMEOUT)
        .await
        .expect("connect")
}

async fn start(dir: &Path) -> (BookieServer, BookieClient) {
    let server = BookieServer::start(config(dir)).await.expect("start");
    let client = connect(&server).await;
    (server, client)
}

fn payload(ledger: u64, entry: u64) -> Bytes {
    Bytes::from(format!("ledger {ledger} entry {entry} ").repeat(1 + (entry % 7) as usize))
}

/// Add `n` entries to `ledger` concurrently on one connection; each entry's lac is `entry - 1`.
async fn add_many(client: &BookieClient, ledger: u64, n: u64) {
    let mut tasks = tokio::task::JoinSet::new();
    for e in 0..n {
        let c = client.clone();
        tasks.spawn(async move {
            c.add(ledger, e, e as i64 - 1, payload(ledger, e), false)
                .await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("task").expect("add");
    }
}

async fn assert_entries(client: &BookieClient, ledger: u64, n: u64) {
    for e in 0..n {
        let r = client
            .read(ledger, e, false)
            .await
            .unwrap_or_else(|err| panic!("read {ledger}:{e}: {err}"));
        assert_eq!((r.lac, r.data), (e as i64 - 1, payload(ledger, e)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_read_and_lac() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    assert_eq!(client.read(1, 0, false).await, Err(ClientError::NoLedger));
    assert_eq!(client.read_lac(1, false).await, Ok(-1));
    client
        .add(1, 0, -1, Bytes::from_static(b"zero"), false)
        .await
        .expect("add 0");
    client
        .add(1, 1, 0, Bytes::from_static(b"one"), false)
        .await
        .expect("add 1");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_refuses_normal_adds_but_not_recovery_adds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    client
        .add(1, 0, -1, Bytes::from_static(b"a"), false)
        .await
        .expect("add");
    client
        .add(1, 1, 0, Bytes::from_static(b"b"), false)
        .await
        .expect("add");
    let r = client.read(1, 1, true).await.expect("fencing read");
    assert_eq!(r.data, Bytes::from_static(b"b"));
    assert_eq!(
        client.add(1, 2, 1, Bytes::from_static(b"c"), false).await,
        Err(ClientError::Fenced)
    );
    client
        .add(1, 2, 1, Bytes::from_static(b"c"), true)
        .await
        .expect("recovery add");
    assert_eq!(
        client.read(1, 2, false).await.expect("read").data,
        Bytes::from_static(b"c")
    );
    assert_eq!(client.read_lac(1, false).await, Ok(1));
    // Other ledgers are untouched.
    client
        .add(2, 0, -1, Bytes::from_static(b"x"), false)
        .await
        .expect("other ledger");
    // A fencing READ_LAC of a ledger the bookie never saw answers -1 and fences it.
    assert_eq!(client.read_lac(3, true).await, Ok(-1));
    assert_eq!(
        client.add(3, 0, -1, Bytes::from_static(b"x"), false).await,
        Err(ClientError::Fenced)
    );
    // A fencing read of a missing entry still fences.
    assert_eq!(client.read(4, 0, true).await, Err(ClientError::NoEntry));
    assert_eq!(
        client.add(4, 0, -1, Bytes::from_static(b"x"), false).await,
        Err(ClientError::Fenced)
    );
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_survives_restart_and_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    client
        .add(1, 0, -1, Bytes::from_static(b"a"), false)
        .await
        .expect("add");
    assert_eq!(client.read_lac(1, true).await, Ok(-1));
    server.shutdown().await.expect("shutdown");

    let (server, client) = start(dir.path()).await;
    assert_eq!(
        client.add(1, 1, 0, Bytes::from_static(b"b"), false).await,
        Err(ClientError::Fenced)
    );
    assert_eq!(client.read_lac(2, true).await, Ok(-1));
    drop(client);
    drop(server); // a crash: no shutdown, no checkpoint
                  // Lose whatever the ledger storage had not synced: the journal must bring the fence back.
    std::fs::remove_dir_all(dir.path().join("ledgers")).expect("rm ledgers");

    let (server, client) = start(dir.path()).await;
    assert_eq!(
        client.add(2, 0, -1, Bytes::from_static(b"x"), false).await,
        Err(ClientError::Fenced)
    );
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_ledger_removes_it_for_good() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    add_many(&client, 5, 10).await;
    add_many(&client, 6, 3).await;
    client.delete_ledger(5).await.expect("delete");
    client
        .delete_ledger(5)
        .await
        .expect("deleting again is fine");
    client
        .delete_ledger(77)
        .await
        .expect("deleting an unknown ledger is fine");
    assert_eq!(client.read(5, 0, false).await, Err(ClientError::NoLedger));
    assert_eq!(client.read_lac(5, false).await, Ok(-1));
    assert!(!dir.path().join("ledgers").join("5.log").exists());
    server.shutdown().await.expect("shutdown");

    let (server, client) = start(dir.path()).await;
    assert_eq!(client.read(5, 0, false).await, Err(ClientError::NoLedger));
    assert_entries(&client, 6, 3).await;
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_adds_survive_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    add_many(&client, 1, 300).await;
    add_many(&client, 2, 50).await;
    drop(client);
    drop(server);
    let (server, client) = start(dir.path()).await;
    assert_entries(&client, 1, 300).await;
    assert_entries(&client, 2, 50).await;
    assert_eq!(client.read_lac(1, false).await, Ok(298));
    drop(client);
    drop(server);
    // A second crash right after a recovering start: the replay was checkpointed into the
    // ledger storage before the old journal went, so nothing is lost.
    let (server, client) = start(dir.path()).await;
    assert_entries(&client, 1, 300).await;
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_alone_restores_acknowledged_adds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    add_many(&client, 1, 200).await;
    drop(client);
    drop(server);
    std::fs::remove_dir_all(dir.path().join("ledgers")).expect("rm ledgers");
    let (server, client) = start(dir.path()).await;
    assert_entries(&client, 1, 200).await;
    assert_eq!(client.read_lac(1, false).await, Ok(198));
    server.shutdown().await.expect("shutdown");
}

/// Where the records of a journal file end: a bookie that stopped as a crash would leaves
/// the preallocated zeros after them (these tests' payloads never end in a zero byte).
fn records_end(path: &std::path::Path) -> u64 {
    let raw = std::fs::read(path).expect("read");
    raw.iter().rposition(|&b| b != 0).map_or(0, |i| i as u64 + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_last_journal_record_is_dropped_and_the_rest_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    for e in 0..6u64 {
        client
            .add(1, e, e as i64 - 1, payload(1, e), false)
            .await
            .expect("add");
    }
    drop(client);
    drop(server);
    std::fs::remove_dir_all(dir.path().join("ledgers")).expect("rm ledgers");
    let newest = *journal::list_files(dir.path())
        .expect("list")
        .last()
        .expect("a journal file");
    let path = journal::file_path(dir.path(), newest);
    let len = records_end(&path);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len - 5)
        .expect("truncate");

    let (server, client) = start(dir.path()).await;
    assert_entries(&client, 1, 5).await;
    assert_eq!(client.read(1, 5, false).await, Err(ClientError::NoEntry));
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_journal_middle_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    for e in 0..4u64 {
        client
            .add(1, e, -1, payload(1, e), false)
            .await
            .expect("add");
    }
    drop(client);
    drop(server);
    let newest = *journal::list_files(dir.path())
        .expect("list")
        .last()
        .expect("a journal file");
    let path = journal::file_path(dir.path(), newest);
    let mut raw = std::fs::read(&path).expect("read");
    let mid = usize::try_from(records_end(&path) / 2).expect("small");
    raw[mid] ^= 0xff;
    std::fs::write(&path, &raw).expect("write");
    match BookieServer::start(config(dir.path())).await {
        Err(BookieError::Corrupt { file, .. }) => assert_eq!(file, path),
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("a bookie with a corrupt journal must not start"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_pipelined_adds_share_group_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Waiting for the group (rather than writing whenever the queue runs dry) makes the
    // sharing independent of how fast this disk syncs and this machine sends.
    let mut cfg = config(dir.path());
    cfg.journal.flush_when_queue_empty = false;
    let server = BookieServer::start(cfg).await.expect("start");
    let client = connect(&server).await;
    add_many(&client, 9, 2000).await;
    let stats = server.journal_stats();
    assert_eq!(stats.records, 2000);
    assert!(
        stats.batches < 2000,
        "2000 pipelined adds took {} journal writes",
        stats.batches
    );
    assert_entries(&client, 9, 2000).await;
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_entries_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    let big = Bytes::from(
        (0..4 * 1024 * 1024u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let max = Bytes::from(vec![3u8; proto::MAX_ENTRY_SIZE]);
    client
        .add(1, 0, -1, big.clone(), false)
        .await
        .expect("4 MiB add");
    client
        .add(1, 1, 0, max.clone(), false)
        .await
        .expect("maximal add");
    assert_eq!(client.read(1, 0, false).await.expect("read").data, big);
    assert_eq!(
        client.read(1, 1, false).await.expect("read").data.len(),
        max.len()
    );
    let too_big = Bytes::from(vec![0u8; proto::MAX_ENTRY_SIZE + 1]);
    assert!(matches!(
        client.add(1, 2, 1, too_big, false).await,
        Err(ClientError::BadRequest(_))
    ));
    assert!(!client.is_closed());
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_rotation_checkpoints_and_deletes_old_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.journal.max_size_mb = 1;
    let server = BookieServer::start(cfg.clone()).await.expect("start");
    let client = connect(&server).await;
    let chunk = Bytes::from(vec![7u8; 200 * 1024]);
    for e in 0..30u64 {
        client
            .add(1, e, e as i64 - 1, chunk.clone(), false)
            .await
            .expect("add");
    }
    // About 6 MiB went through 1 MiB journal files; the checkpointer deletes the old ones.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let files = journal::list_files(dir.path()).expect("list");
        if files.len() <= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old journal files were never deleted: {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(client);
    drop(server);
    let server = BookieServer::start(cfg).await.expect("restart");
    let client = connect(&server).await;
    for e in 0..30u64 {
        assert_eq!(client.read(1, e, false).await.expect("read").data, chunk);
    }
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sync_data_adds_still_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.journal.sync_data = false;
    cfg.journal.max_group_wait = Duration::ZERO;
    let server = BookieServer::start(cfg.clone()).await.expect("start");
    let client = connect(&server).await;
    add_many(&client, 1, 100).await;
    server.shutdown().await.expect("shutdown");
    let server = BookieServer::start(cfg).await.expect("restart");
    let client = connect(&server).await;
    assert_entries(&client, 1, 100).await;
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_in_flight_adds_and_keeps_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    let mut tasks = tokio::task::JoinSet::new();
    for e in 0..500u64 {
        let c = client.clone();
        tasks.spawn(async move { (e, c.add(1, e, -1, payload(1, e), false).await) });
    }
    client
        .add(2, 0, -1, Bytes::from_static(b"first"), false)
        .await
        .expect("add");
    server.shutdown().await.expect("shutdown");
    let mut acked = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (e, res) = r.expect("task");
        match res {
            Ok(()) => acked.push(e),
            Err(ClientError::Closed) | Err(ClientError::Io(_)) => {}
            Err(other) => panic!("add {e} failed with {other}"),
        }
    }
    let (server, client) = start(dir.path()).await;
    for e in acked {
        assert_eq!(
            client.read(1, e, false).await.expect("acked entry").data,
            payload(1, e)
        );
    }
    server.shutdown().await.expect("shutdown");
}

fn raw_frame(body: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u32(u32::try_from(body.len()).expect("fits"));
    b.put_u32(crc32c::crc32c(body));
    b.put_slice(body);
    b.to_vec()
}

async fn read_response(stream: &mut TcpStream) -> Option<Response> {
    let mut buf = BytesMut::new();
    loop {
        if let Some(body) = proto::decode_frame(&mut buf).expect("frame") {
            return Some(Response::decode(body).expect("response"));
        }
        let n = tokio::time::timeout(TIMEOUT, stream.read_buf(&mut buf))
            .await
            .expect("bounded")
            .expect("read");
        if n == 0 {
            return None;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    client
        .add(1, 0, -1, Bytes::from_static(b"a"), false)
        .await
        .expect("add");

    // Oversized length.
    let mut s = TcpStream::connect(server.local_addr())
        .await
        .expect("connect");
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])
        .await
        .expect("write");
    assert_eq!(read_response(&mut s).await, None, "connection closed");

    // Checksum mismatch.
    let mut s = TcpStream::connect(server.local_addr())
        .await
        .expect("connect");
    let mut frame = raw_frame(&[3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    frame[4] ^= 1;
    s.write_all(&frame).await.expect("write");
    assert_eq!(read_response(&mut s).await, None, "connection closed");

    // A well-framed request with a bad body is answered BAD_REQUEST; the connection stays.
    let mut s = TcpStream::connect(server.local_addr())
        .await
        .expect("connect");
    s.write_all(&raw_frame(&[2, 0, 0, 0, 0, 0, 0, 0, 42, 1, 2]))
        .await
        .expect("write");
    let resp = read_response(&mut s).await.expect("a response");
    assert_eq!(
        (resp.op, resp.request_id, resp.status),
        (OpCode::Read, 42, Status::BadRequest)
    );
    let mut ok = BytesMut::new();
    Request::ReadLac {
        request_id: 43,
        ledger: 1,
        fence: false,
    }
    .encode(&mut ok)
    .expect("encode");
    s.write_all(&ok).await.expect("write");
    let resp = read_response(&mut s).await.expect("a response");
    assert_eq!((resp.request_id, resp.status), (43, Status::Ok));

    // The well-behaved client never noticed.
    assert_eq!(
        client.read(1, 0, false).await.expect("read").data,
        Bytes::from_static(b"a")
    );
    assert!(!client.is_closed());
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_configured_limit_closes_only_its_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limit = FrameLimit::new(16 * 1024).expect("in range");
    let cfg = BookieConfig { max_frame_size: limit, ..config(dir.path()) };
    let server = BookieServer::start(cfg).await.expect("start");
    // Clients that may send up to the hard cap: what the bookie refuses does reach it.
    let client = connect(&server).await;
    let other = connect(&server).await;
    // An ADD whose body is exactly the limit is taken.
    let at = Bytes::from(vec![1u8; limit.bytes() - 34]);
    client.add(1, 0, -1, at.clone(), false).await.expect("a frame at the limit");

    // One byte more closes that connection.
    let over = Bytes::from(vec![2u8; limit.bytes() - 33]);
    let err = client.add(1, 1, 0, over, false).await.expect_err("a frame over the limit");
    assert!(matches!(err, ClientError::Closed | ClientError::Io(_)), "{err}");
    assert!(client.is_closed());
    let mut raw = TcpStream::connect(server.local_addr()).await.expect("connect");
    let mut header = BytesMut::new();
    header.put_u32(u32::try_from(limit.bytes() + 1).expect("fits"));
    header.put_u32(0);
    raw.write_all(&header).await.expect("write");
    assert_eq!(read_response(&mut raw).await, None, "closed on the header alone");

    // The other connection, and new ones, are served as before.
    assert_eq!(other.read(1, 0, false).await.expect("read").data, at);
    other.add(1, 1, 0, Bytes::from_static(b"next"), false).await.expect("add");
    let fresh = connect(&server).await;
    assert_eq!(fresh.read(1, 1, false).await.expect("read").data, Bytes::from_static(b"next"));
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refuses_to_send_a_frame_over_its_own_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = BookieServer::start(config(dir.path())).await.expect("start");
    let limit = FrameLimit::new(16 * 1024).expect("in range");
    let client = BookieClient::connect_within(&server.local_addr().to_string(), TIMEOUT, limit)
        .await
        .expect("connect");
    let err = client
        .add(1, 0, -1, Bytes::from(vec![0u8; limit.bytes()]), false)
        .await
        .expect_err("over the client's limit");
    assert_eq!(
        err,
        ClientError::BadRequest("entry of 16384 bytes exceeds the 16350 bytes one frame can carry".into())
    );
    assert!(!client.is_closed());
    assert_eq!(client.read(1, 0, false).await, Err(ClientError::NoLedger), "nothing was sent");
    client.add(1, 0, -1, Bytes::from(vec![0u8; limit.max_entry()]), false).await.expect("add");
    // Reads are not bounded by the client's limit: an entry written under a larger one
    // comes back whole.
    let big = connect(&server).await;
    big.add(2, 0, -1, Bytes::from(vec![5u8; 64 * 1024]), false).await.expect("add");
    assert_eq!(client.read(2, 0, false).await.expect("read").data.len(), 64 * 1024);
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_request_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.expect("accept");
        // Hold the connection open and never answer.
        let _ = held_rx.await;
        drop(sock);
    });
    let client = BookieClient::connect(&addr, Duration::from_millis(200))
        .await
        .expect("connect");
    let started = Instant::now();
    assert_eq!(client.read(1, 0, false).await, Err(ClientError::Timeout));
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(
        !client.is_closed(),
        "a timeout alone does not close the connection"
    );
    let _ = held_tx.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_connection_fails_pending_requests_and_closes_the_client() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        // Read the first request, then hang up without answering.
        let mut buf = BytesMut::new();
        while proto::decode_frame(&mut buf).expect("frame").is_none() {
            if sock.read_buf(&mut buf).await.expect("read") == 0 {
                return;
            }
        }
        drop(sock);
    });
    let client = BookieClient::connect(&addr, TIMEOUT)
        .await
        .expect("connect");
    let res = client.add(1, 0, -1, Bytes::from_static(b"a"), false).await;
    assert!(
        matches!(res, Err(ClientError::Closed) | Err(ClientError::Io(_))),
        "{res:?}"
    );
    assert!(client.is_closed());
    assert_eq!(client.read_lac(1, false).await, Err(ClientError::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_nothing_is_an_io_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    assert!(matches!(
        BookieClient::connect(&addr, TIMEOUT).await,
        Err(ClientError::Io(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_reads_slowly_gets_every_response() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    let entry = Bytes::from(vec![9u8; 1024 * 1024]);
    client
        .add(1, 0, -1, entry.clone(), false)
        .await
        .expect("add");
    // 200 reads of 1 MiB (more than the connection budget) sent before any response is read.
    let s = TcpStream::connect(server.local_addr())
        .await
        .expect("connect");
    let (mut rd, mut wr) = s.into_split();
    let sender = tokio::spawn(async move {
        let mut wire = BytesMut::new();
        for id in 0..200u64 {
            Request::Read {
                request_id: id,
                ledger: 1,
                entry: 0,
                fence: false,
            }
            .encode(&mut wire)
            .expect("encode");
        }
        wr.write_all(&wire).await.expect("write");
        wr
    });
    let mut seen = [false; 200];
    let mut buf = BytesMut::new();
    let mut got = 0;
    while got < 200 {
        while let Some(body) = proto::decode_frame(&mut buf).expect("frame") {
            let resp = Response::decode(body).expect("response");
            assert_eq!(resp.status, Status::Ok);
            assert_eq!(
                resp.body,
                proto::ResponseBody::Read {
                    lac: -1,
                    data: entry.clone()
                }
            );
            let id = usize::try_from(resp.request_id).expect("id");
            assert!(!seen[id], "response {id} twice");
            seen[id] = true;
            got += 1;
        }
        if got == 200 {
            break;
        }
        let n = tokio::time::timeout(TIMEOUT, rd.read_buf(&mut buf))
            .await
            .expect("bounded")
            .expect("read");
        assert!(n > 0, "connection closed after {got} responses");
    }
    drop(sender.await.expect("sender"));
    server.shutdown().await.expect("shutdown");
}

/// The records in the ledger's log file, front to back, as (entry id, lac). What follows
/// them (the zeros that pad a direct write) is not counted.
fn log_records(dir: &Path, ledger: u64) -> Vec<(u64, i64)> {
    let raw = std::fs::read(dir.join("ledgers").join(format!("{ledger}.log"))).expect("ledger log");
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok((r, used)) = magnetar_bookie::journal::parse_record(&raw[at..]) {
        out.push((r.entry, r.lac));
        at += used;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replays_only_what_follows_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    for e in 0..100u64 {
        client
            .add(1, e, e as i64 - 1, payload(1, e), false)
            .await
            .expect("add");
    }
    server.checkpoint().await.expect("checkpoint");
    for e in 100..110u64 {
        client
            .add(1, e, e as i64 - 1, payload(1, e), false)
            .await
            .expect("add");
    }
    drop(client);
    drop(server);
    let before = log_records(dir.path(), 1);
    let (server, client) = start(dir.path()).await;
    let after = log_records(dir.path(), 1);
    assert_eq!(
        after[before.len()..].iter().map(|r| r.0).collect::<Vec<_>>(),
        (100..110).collect::<Vec<_>>(),
        "only the 10 adds after the checkpoint are replayed"
    );
    assert_eq!(after[..before.len()], before[..]);
    assert_entries(&client, 1, 110).await;
    server.shutdown().await.expect("shutdown");

    // After a clean shutdown there is nothing to replay.
    let before = log_records(dir.path(), 1);
    let (server, client) = start(dir.path()).await;
    assert_eq!(log_records(dir.path(), 1), before);
    assert_entries(&client, 1, 110).await;
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_data_dir_serves_one_bookie_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    client
        .add(1, 0, -1, payload(1, 0), false)
        .await
        .expect("add");
    match BookieServer::start(config(dir.path())).await {
        Err(BookieError::Locked(d)) => assert_eq!(d, dir.path()),
        Err(other) => panic!("expected Locked, got {other}"),
        Ok(_) => panic!("two bookies on one data dir"),
    }
    // The first bookie is unharmed, and once it is gone (even by a crash) the dir is free.
    assert_entries(&client, 1, 1).await;
    drop(client);
    drop(server);
    let (server, client) = start(dir.path()).await;
    assert_entries(&client, 1, 1).await;
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_from_any_ledger_storage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = std::sync::Arc::new(magnetar_bookie::MemStorage::new());
    let server = BookieServer::start_with_storage(config(dir.path()), storage.clone())
        .await
        .expect("start");
    let client = connect(&server).await;
    add_many(&client, 3, 20).await;
    assert_entries(&client, 3, 20).await;
    use magnetar_bookie::LedgerStorage;
    assert_eq!(storage.last_entry(3).expect("last"), Some(19));
    server.shutdown().await.expect("shutdown");
}

/// A fake bookie that answers the first request with `reply(request_body)` raw bytes.
async fn fake_bookie(reply: fn(&[u8]) -> Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        let mut buf = BytesMut::new();
        let body = loop {
            if let Some(body) = proto::decode_frame(&mut buf).expect("frame") {
                break body;
            }
            if sock.read_buf(&mut buf).await.expect("read") == 0 {
                return;
            }
        };
        sock.write_all(&reply(&body)).await.expect("write");
        // Keep the socket open until the client hangs up.
        let mut sink = [0u8; 64];
        while matches!(sock.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_bookie_closes_the_client() {
    // A response whose op does not match the request.
    let addr = fake_bookie(|body| {
        let (_, id) = proto::peek_header(body).expect("header");
        let mut out = BytesMut::new();
        Response::ok(OpCode::ReadLac, id, proto::ResponseBody::Lac(5))
            .encode(&mut out)
            .expect("encode");
        out.to_vec()
    })
    .await;
    let client = BookieClient::connect(&addr, TIMEOUT)
        .await
        .expect("connect");
    assert!(matches!(
        client.read(1, 0, false).await,
        Err(ClientError::Server(_))
    ));
    assert!(client.is_closed());

    // A frame with a bad checksum.
    let addr = fake_bookie(|_| {
        let mut f = raw_frame(&[1, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        f[5] ^= 0x40;
        f
    })
    .await;
    let client = BookieClient::connect(&addr, TIMEOUT)
        .await
        .expect("connect");
    assert!(matches!(
        client.add(1, 0, -1, Bytes::new(), false).await,
        Err(ClientError::Io(_))
    ));
    assert!(client.is_closed());

    // A well-framed body that does not decode.
    let addr = fake_bookie(|_| raw_frame(&[7, 0, 0, 0, 0, 0, 0, 0, 1, 0])).await;
    let client = BookieClient::connect(&addr, TIMEOUT)
        .await
        .expect("connect");
    assert!(matches!(
        client.read_lac(1, false).await,
        Err(ClientError::Io(_))
    ));
    assert!(client.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_map_to_client_errors() {
    let addr = fake_bookie(|body| {
        let (op, id) = proto::peek_header(body).expect("header");
        let mut out = BytesMut::new();
        Response::error(op, id, Status::IoError, "disk on fire")
            .encode(&mut out)
            .expect("encode");
        out.to_vec()
    })
    .await;
    let client = BookieClient::connect(&addr, TIMEOUT)
        .await
        .expect("connect");
    assert_eq!(
        client.delete_ledger(1).await,
        Err(ClientError::Server("disk on fire".into()))
    );
    assert!(
        !client.is_closed(),
        "an error status is an answer, not a broken connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_batch_stores_every_entry_with_one_group_commit_and_survives_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    let entries: Vec<(u64, Bytes)> = (0..300).map(|e| (e, payload(5, e))).collect();
    let before = server.journal_stats();
    client
        .add_batch(5, 41, entries.clone(), false)
        .await
        .expect("add batch");
    let after = server.journal_stats();
    assert_eq!(after.records - before.records, 300);
    assert_eq!(after.batches - before.batches, 1, "one batch, one group commit");
    for (e, data) in &entries {
        let r = client.read(5, *e, false).await.expect("read");
        assert_eq!((r.lac, &r.data), (41, data));
    }
    assert_eq!(client.read_lac(5, false).await, Ok(41));
    // Crash: the journal alone brings the batch back.
    drop(client);
    drop(server);
    let (server, client) = start(dir.path()).await;
    for (e, data) in &entries {
        assert_eq!(&client.read(5, *e, false).await.expect("read").data, data);
    }
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_batch_on_a_fenced_ledger_is_refused_whole_unless_recovery() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client) = start(dir.path()).await;
    assert_eq!(client.read_lac(9, true).await, Ok(-1));
    let entries: Vec<(u64, Bytes)> = (0..3).map(|e| (e, payload(9, e))).collect();
    assert_eq!(
        client.add_batch(9, -1, entries.clone(), false).await,
        Err(ClientError::Fenced)
    );
    assert_eq!(client.read(9, 0, false).await, Err(ClientError::NoEntry));
    client
        .add_batch(9, -1, entries, true)
        .await
        .expect("recovery batch");
    assert_eq!(client.read(9, 2, false).await.expect("read").data, payload(9, 2));
    server.shutdown().await.expect("shutdown");
}

fn split_config(journal: &Path, ledgers: &[&Path]) -> BookieConfig {
    BookieConfig { ledger_dirs: ledgers.iter().map(|d| d.to_path_buf()).collect(), ..config(journal) }
}

/// Files directly under `dir/sub`, by name.
fn names(dir: &Path, sub: &str) -> Vec<String> {
    match std::fs::read_dir(dir.join(sub)) {
        Ok(rd) => rd.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_and_ledgers_in_directories_of_their_own() {
    let (j, l1, l2) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let cfg = split_config(j.path(), &[l1.path(), l2.path()]);
    let server = BookieServer::start(cfg.clone()).await.expect("start");
    let client = connect(&server).await;
    for ledger in 1..=4 {
        add_many(&client, ledger, 20).await;
    }
    server.checkpoint().await.expect("checkpoint");
    add_many(&client, 5, 20).await; // only in the journal until replayed
    drop(client);
    drop(server); // a crash: no final checkpoint

    // The journal is in its directory alone; the ledgers are spread over the other two.
    assert!(names(j.path(), "journal").iter().any(|n| n.ends_with(".log")));
    assert!(names(j.path(), "ledgers").is_empty());
    for l in [&l1, &l2] {
        assert!(names(l.path(), "journal").is_empty());
        assert!(names(l.path(), "ledgers").iter().any(|n| n.ends_with(".log")), "{:?}", l.path());
    }

    let server = BookieServer::start(cfg.clone()).await.expect("restart");
    let client = connect(&server).await;
    for ledger in 1..=5 {
        assert_entries(&client, ledger, 20).await;
    }
    // Each directory is locked while the bookie runs.
    match BookieServer::start(split_config(l2.path(), &[])).await {
        Err(BookieError::Locked(d)) => assert_eq!(d, l2.path()),
        Err(other) => panic!("expected Locked, got {other}"),
        Ok(_) => panic!("a second bookie on a ledger directory in use"),
    }
    drop(client);
    server.shutdown().await.expect("shutdown");

    // Started without one of its ledger directories, the bookie refuses, saying why.
    let err = BookieServer::start(split_config(j.path(), &[l1.path()])).await.err().expect("refused");
    assert!(err.to_string().contains("cookie mismatch"), "{err}");
    let fresh = tempfile::tempdir().expect("tempdir");
    let err = BookieServer::start(split_config(j.path(), &[l1.path(), fresh.path()]))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("has no cookie"), "{err}");
    // Listing a directory twice is a configuration error.
    let err = BookieServer::start(split_config(j.path(), &[l1.path(), l1.path()])).await.err().expect("refused");
    assert!(err.to_string().contains("twice"), "{err}");
}
