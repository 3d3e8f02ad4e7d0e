//! Randomised writer histories against in-memory bookies that go down and come back:
//! whatever happens, acknowledged entries keep contiguous ids, stay readable, survive
//! recovery by another client, and a broken writer stays broken.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use magnetar_ledger::mem::MemBookies;
use magnetar_ledger::{BookKeeper, ClientConfig, LedgerError, LedgerState};
use magnetar_meta::{MemStore, MetadataStore};
use proptest::prelude::*;

const BOOKIES: usize = 5;

#[derive(Debug, Clone)]
enum Op {
    Add(u8),
    Down(usize),
    Up(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..12).prop_map(Op::Add),
        1 => (0..BOOKIES).prop_map(Op::Down),
        1 => (0..BOOKIES).prop_map(Op::Up),
    ]
}

fn addr(i: usize) -> String {
    format!("10.0.0.{i}:3181")
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("m{i}"))
}

async fn run(quorums: (usize, usize, usize), ops: Vec<Op>, close: bool) -> Result<(), TestCaseError> {
    let store = Arc::new(MemStore::default());
    let bookies = Arc::new(MemBookies::new());
    for i in 0..BOOKIES {
        bookies.add_bookie(&addr(i));
        store.put(&format!("/ledgers/available/{}", addr(i)), b"", None).unwrap();
    }
    let bk = BookKeeper::with_transport(store.clone(), ClientConfig::default(), bookies.clone());
    let (e, qw, qa) = quorums;
    let lh = bk.create_ledger(e, qw, qa, BTreeMap::new()).await.unwrap();
    let mut acked: Vec<u64> = Vec::new();
    let mut broken: Option<LedgerError> = None;
    let mut next_payload = 0u64;
    for op in ops {
        match op {
            Op::Down(i) => bookies.set_down(&addr(i), true),
            Op::Up(i) => bookies.set_down(&addr(i), false),
            Op::Add(n) => {
                let batch: Vec<Bytes> = (0..u64::from(n)).map(|k| payload(next_payload + k)).collect();
                match lh.add_entries(batch).await {
                    Ok(ids) => {
                        prop_assert!(broken.is_none(), "add succeeded after the writer broke");
                        let expected: Vec<u64> = (next_payload..next_payload + u64::from(n)).collect();
                        prop_assert_eq!(&ids, &expected);
                        acked.extend(ids);
                        next_payload += u64::from(n);
                    }
                    Err(err) => {
                        prop_assert_eq!(&err, &LedgerError::NotEnoughBookies);
                        if let Some(first) = &broken {
                            prop_assert_eq!(first, &err);
                        }
                        broken = Some(err);
                        // Entries of a failed batch may or may not have been confirmed.
                        let lac = lh.last_add_confirmed();
                        prop_assert!(lac >= acked.last().map_or(-1, |l| *l as i64));
                        acked = (0..=lac).map(|i| i as u64).collect();
                        next_payload = u64::try_from(lac + 1).unwrap();
                    }
                }
            }
        }
    }
    let lac = lh.last_add_confirmed();
    prop_assert_eq!(lac, acked.last().map_or(-1, |l| *l as i64));
    let meta = lh.metadata();
    prop_assert!(meta.validate().is_ok());
    for i in 0..BOOKIES {
        bookies.set_down(&addr(i), false);
    }
    let last_entry = if close {
        lh.close().await.map_err(|e| TestCaseError::fail(e.to_string()))?;
        let reader = bk.open_ledger(lh.id(), false).await.unwrap();
        prop_assert_eq!(reader.metadata().state, LedgerState::Closed);
        prop_assert_eq!(reader.metadata().last_entry_id, lac);
        lac
    } else {
        let other = BookKeeper::with_transport(store.clone(), ClientConfig::default(), bookies.clone());
        let reader = other.open_ledger(lh.id(), true).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
        let recovered = reader.metadata().last_entry_id;
        prop_assert!(recovered >= lac, "recovered {} < confirmed {}", recovered, lac);
        prop_assert!(reader.metadata().validate().is_ok());
        // The writer is fenced, unless it broke first: an ensemble change started by its
        // last adds may have found no replacement after they were confirmed.
        let after = lh.add_entry(payload(9999)).await;
        prop_assert!(
            matches!(after, Err(LedgerError::Fenced | LedgerError::NotEnoughBookies)),
            "writer after recovery: {:?}",
            after
        );
        recovered
    };
    if last_entry >= 0 {
        let reader = bk.open_ledger(lh.id(), false).await.unwrap();
        let got = reader.read_entries(0, last_entry as u64).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (id, data) in got {
            if id as i64 <= lac {
                prop_assert_eq!(data, payload(id));
            }
        }
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn striped_writer_then_close(ops in proptest::collection::vec(op(), 1..24)) {
        runtime().block_on(run((3, 2, 2), ops, true))?;
    }

    #[test]
    fn striped_writer_then_recovery(ops in proptest::collection::vec(op(), 1..24)) {
        runtime().block_on(run((3, 2, 2), ops, false))?;
    }

    #[test]
    fn wide_quorum_writer_then_recovery(ops in proptest::collection::vec(op(), 1..24)) {
        runtime().block_on(run((4, 3, 2), ops, false))?;
    }
}
