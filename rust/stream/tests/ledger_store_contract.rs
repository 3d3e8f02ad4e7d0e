//! The `LedgerStore` contract, written once and run against every implementation.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use magnetar_bookie::FrameLimit;
use magnetar_ledger::mem::MemBookies;
use magnetar_ledger::{BookKeeper, ClientConfig};
use magnetar_meta::{MemStore, MetadataStore};
use magnetar_stream::store::Payload;
use magnetar_stream::{BookKeeperStore, LedgerStore, LedgerStoreError, MemLedgerStore};

async fn contract(store: Arc<dyn LedgerStore>) {
    let w = store.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    assert_eq!(w.last_add_confirmed(), -1);
    // An entry may come in two pieces: it is stored as one, the pieces back to back.
    let two_pieces = Payload { head: Bytes::from("b"), body: Bytes::from("b") };
    let ids = w.add_entries(vec![Bytes::from("a").into(), two_pieces, Bytes::from("ccc").into()]).await.unwrap();
    assert_eq!(ids, vec![0, 1, 2]);
    assert_eq!(w.add_entries(vec![Bytes::from("d").into()]).await.unwrap(), vec![3]);
    assert_eq!(w.last_add_confirmed(), 3);
    let read = w.read_entries(1, 3).await.unwrap();
    assert_eq!(read, vec![(1, Bytes::from("bb")), (2, Bytes::from("ccc")), (3, Bytes::from("d"))]);

    // A reader without recovery sees what is confirmed.
    let r = store.open_ledger(w.id(), false).await.unwrap();
    assert!(r.last_add_confirmed() >= 2);
    assert_eq!(r.read_entries(0, 0).await.unwrap(), vec![(0, Bytes::from("a"))]);

    // Close seals; reopened, length and entries are as written.
    w.close().await.unwrap();
    let r = store.open_ledger(w.id(), true).await.unwrap();
    assert_eq!(r.last_add_confirmed(), 3);
    assert_eq!(r.length(), 7);

    // Recovery of an open ledger fences its writer.
    let w2 = store.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    w2.add_entries(vec![Bytes::from("x").into()]).await.unwrap();
    let rec = store.open_ledger(w2.id(), true).await.unwrap();
    assert_eq!(rec.last_add_confirmed(), 0);
    let err = w2.add_entries(vec![Bytes::from("y").into()]).await.unwrap_err();
    assert!(matches!(err, LedgerStoreError::Fenced(_)), "{err:?}");

    // An entry over max_entry_size is refused; the handle goes on, no id taken.
    let max = store.max_entry_size();
    let w3 = store.create_ledger(1, 1, 1, BTreeMap::new()).await.unwrap();
    assert!(w3.add_entries(vec![Bytes::from(vec![0u8; max + 1]).into()]).await.is_err());
    assert_eq!(w3.add_entries(vec![Bytes::from(vec![1u8; max]).into()]).await.unwrap(), vec![0]);
    assert_eq!(w3.read_entries(0, 0).await.unwrap()[0].1.len(), max);

    // Delete removes the ledger.
    store.delete_ledger(w.id()).await.unwrap();
    assert!(matches!(store.open_ledger(w.id(), false).await, Err(LedgerStoreError::NoSuchLedger(_))));
    assert_ne!(w.id(), w2.id());
}

#[tokio::test]
async fn memory_store_meets_the_contract() {
    let store = MemLedgerStore::new();
    store.set_max_entry_size(1000);
    contract(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookkeeper_store_meets_the_contract() {
    let meta = Arc::new(MemStore::default());
    let bookies = Arc::new(MemBookies::new());
    bookies.add_bookie("127.0.0.1:3181");
    meta.put("/ledgers/available/127.0.0.1:3181", b"", None).unwrap();
    let meta: Arc<dyn MetadataStore> = meta;
    let config = ClientConfig { max_frame_size: FrameLimit::new(8192).unwrap(), ..ClientConfig::default() };
    let bk = BookKeeper::with_transport(meta, config, bookies);
    contract(Arc::new(BookKeeperStore::new(bk))).await;
}
