//! Dispatcher tables per subscription type, redelivery, and key-shared ordering.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};

use magnetar_stream::dispatch::{
    key_hash, ConsumerSpec, Delivery, DispatchEvent, Dispatcher, ExclusiveDispatcher, FailoverDispatcher, Item,
    KeySharedDispatcher, KeySharedMode, SharedDispatcher,
};
use magnetar_stream::{Position, StreamError};
use proptest::prelude::*;

fn item(e: i64, n: u32, hash: u32) -> Item {
    Item::new(Position::new(1, e), n, hash)
}

fn to(out: &[Delivery]) -> Vec<(i64, u64)> {
    out.iter().map(|d| (d.item.position.entry_id, d.consumer)).collect()
}

/// Items for the replay positions, as the broker would read them back.
fn replay_items(d: &dyn Dispatcher, known: &HashMap<Position, Item>) -> Vec<Item> {
    d.replay_positions(usize::MAX).iter().map(|p| known[p]).collect()
}

#[test]
fn exclusive_one_consumer_in_order_within_permits() {
    let mut d = ExclusiveDispatcher::new();
    d.add_consumer(ConsumerSpec::new(1, "a")).unwrap();
    assert!(matches!(d.add_consumer(ConsumerSpec::new(2, "b")), Err(StreamError::ConsumerBusy(name)) if name == "a"));
    d.flow(1, 3).unwrap();
    let items: Vec<Item> = (0..5).map(|e| item(e, 1, 0)).collect();
    let known: HashMap<Position, Item> = items.iter().map(|i| (i.position, *i)).collect();
    assert_eq!(to(&d.dispatch(&items)), vec![(0, 1), (1, 1), (2, 1)]);
    assert_eq!(d.replay_positions(10), vec![Position::new(1, 3), Position::new(1, 4)]);
    assert_eq!(d.total_permits(), 0);
    d.flow(1, 10).unwrap();
    let again = replay_items(&d, &known);
    assert_eq!(to(&d.dispatch(&again)), vec![(3, 1), (4, 1)]);
    // An entry already delivered is not delivered twice.
    assert!(d.dispatch(&items[..1]).is_empty());
    // A batch entry may overdraw the last permits; then nothing more goes.
    d.ack_cumulative(Position::new(1, 4));
    assert_eq!(d.core().consumer(1).unwrap().unacked.len(), 0);
    let mut e = ExclusiveDispatcher::new();
    e.add_consumer(ConsumerSpec::new(1, "a")).unwrap();
    e.flow(1, 1).unwrap();
    assert_eq!(to(&e.dispatch(&[item(0, 5, 0), item(1, 1, 0)])), vec![(0, 1)]);
    assert_eq!(e.core().permits(1), -4);
    // The consumer leaves: its unacknowledged entry waits for the next one.
    e.remove_consumer(1).unwrap();
    e.add_consumer(ConsumerSpec::new(2, "b")).unwrap();
    assert_eq!(e.replay_positions(10), vec![Position::new(1, 0), Position::new(1, 1)]);
}

#[test]
fn failover_active_consumer_table() {
    // (partition index, consumers as (id, name, priority)) → active id
    type Row = (u32, &'static [(u64, &'static str, i32)], u64);
    let table: &[Row] = &[
        (0, &[(1, "c", 0), (2, "a", 0), (3, "b", 0)], 2),
        (1, &[(1, "c", 0), (2, "a", 0), (3, "b", 0)], 3),
        (2, &[(1, "c", 0), (2, "a", 0), (3, "b", 0)], 1),
        (3, &[(1, "c", 0), (2, "a", 0), (3, "b", 0)], 2),
        (0, &[(1, "c", 0), (2, "a", 1), (3, "b", 1)], 1),
        (1, &[(1, "z", -1), (2, "a", 0)], 1),
        (1, &[(5, "same", 0), (4, "same", 0)], 5),
    ];
    for (partition, consumers, want) in table {
        let mut d = FailoverDispatcher::new(*partition);
        for (id, name, prio) in consumers.iter() {
            d.add_consumer(ConsumerSpec::new(*id, name).with_priority(*prio)).unwrap();
        }
        assert_eq!(d.active_consumer(), Some(*want), "partition {partition}, consumers {consumers:?}");
    }
}

#[test]
fn failover_switch_reports_and_hands_over_unacked() {
    let mut d = FailoverDispatcher::new(0);
    d.add_consumer(ConsumerSpec::new(1, "b")).unwrap();
    assert_eq!(d.take_events(), vec![DispatchEvent::ActiveConsumerChanged { consumer: 1, active: true }]);
    d.flow(1, 10).unwrap();
    let items: Vec<Item> = (0..3).map(|e| item(e, 1, 0)).collect();
    let known: HashMap<Position, Item> = items.iter().map(|i| (i.position, *i)).collect();
    assert_eq!(d.dispatch(&items).len(), 3);
    d.ack(&[Position::new(1, 0)]);
    // "a" sorts first: it takes over, and gets what "b" had not acknowledged.
    d.add_consumer(ConsumerSpec::new(2, "a")).unwrap();
    assert_eq!(
        d.take_events(),
        vec![
            DispatchEvent::ActiveConsumerChanged { consumer: 1, active: false },
            DispatchEvent::ActiveConsumerChanged { consumer: 2, active: true },
        ]
    );
    d.flow(2, 10).unwrap();
    let replay = replay_items(&d, &known);
    assert_eq!(to(&d.dispatch(&replay)), vec![(1, 2), (2, 2)]);
    // A third consumer that does not become active is told so.
    d.add_consumer(ConsumerSpec::new(3, "c")).unwrap();
    assert_eq!(d.take_events(), vec![DispatchEvent::ActiveConsumerChanged { consumer: 3, active: false }]);
    d.remove_consumer(2).unwrap();
    assert_eq!(d.active_consumer(), Some(1));
    assert_eq!(d.take_events(), vec![DispatchEvent::ActiveConsumerChanged { consumer: 1, active: true }]);
}

#[test]
fn shared_round_robin_by_permits_and_priority() {
    // (permits per consumer id, priority per consumer id, n items) → consumers in order
    type Row = (&'static [(u64, u32, i32)], usize, &'static [u64]);
    let table: &[Row] = &[
        (&[(1, 10, 0), (2, 10, 0)], 4, &[1, 2, 1, 2]),
        (&[(1, 1, 0), (2, 3, 0)], 5, &[1, 2, 2, 2]),
        (&[(1, 2, 0), (2, 2, 0), (3, 2, 0)], 6, &[1, 2, 3, 1, 2, 3]),
        (&[(1, 2, 0), (2, 10, 1)], 4, &[1, 1, 2, 2]),
        (&[(1, 0, 0), (2, 0, 0)], 2, &[]),
    ];
    for (consumers, n, want) in table {
        let mut d = SharedDispatcher::new();
        for (id, permits, prio) in consumers.iter() {
            d.add_consumer(ConsumerSpec::new(*id, &format!("c{id}")).with_priority(*prio)).unwrap();
            d.flow(*id, *permits).unwrap();
        }
        let items: Vec<Item> = (0..*n as i64).map(|e| item(e, 1, 0)).collect();
        let got: Vec<u64> = d.dispatch(&items).iter().map(|x| x.consumer).collect();
        assert_eq!(&got[..], *want, "consumers {consumers:?}");
        assert_eq!(d.core().replay_len(), n - want.len());
    }
}

#[test]
fn nack_and_ack_timeout_redeliver_first_with_counts() {
    let mut d = SharedDispatcher::new();
    d.add_consumer(ConsumerSpec::new(1, "a")).unwrap();
    d.flow(1, 100).unwrap();
    let items: Vec<Item> = (0..4).map(|e| item(e, 1, 0)).collect();
    let known: HashMap<Position, Item> = items.iter().map(|i| (i.position, *i)).collect();
    d.dispatch(&items);
    d.redeliver(1, &[Position::new(1, 2), Position::new(1, 0)]);
    // Positions another consumer (or nobody) holds are ignored.
    d.redeliver(9, &[Position::new(1, 1)]);
    assert_eq!(d.replay_positions(10), vec![Position::new(1, 0), Position::new(1, 2)]);
    let again = d.dispatch(&replay_items(&d, &known));
    assert_eq!(again.iter().map(|x| x.redelivery_count).collect::<Vec<_>>(), vec![1, 1]);
    d.redeliver_all(1);
    assert_eq!(d.redelivery_count(Position::new(1, 0)), 2);
    assert_eq!(d.redelivery_count(Position::new(1, 1)), 1);
    assert_eq!(d.replay_positions(10).len(), 4);
    d.dispatch(&replay_items(&d, &known));
    d.ack(&[Position::new(1, 0)]);
    assert_eq!(d.redelivery_count(Position::new(1, 0)), 0);
    assert_eq!(d.core().consumer(1).unwrap().unacked.len(), 3);
}

#[test]
fn key_shared_auto_split_gives_each_key_one_consumer() {
    let mut d = KeySharedDispatcher::new(KeySharedMode::AutoSplit, false);
    for id in 1..=3u64 {
        d.add_consumer(ConsumerSpec::new(id, &format!("consumer-{id}"))).unwrap();
        d.flow(id, 10_000).unwrap();
    }
    let keys: Vec<u32> = (0..300).map(|k| key_hash(Some(format!("key-{k}").as_bytes()))).collect();
    let items: Vec<Item> = (0..3000).map(|e| item(e, 1, keys[e as usize % keys.len()])).collect();
    let out = d.dispatch(&items);
    assert_eq!(out.len(), 3000);
    let mut owner: HashMap<u32, u64> = HashMap::new();
    let mut per_consumer: BTreeMap<u64, usize> = BTreeMap::new();
    for x in &out {
        assert_eq!(*owner.entry(x.item.key_hash).or_insert(x.consumer), x.consumer);
        *per_consumer.entry(x.consumer).or_default() += 1;
    }
    assert_eq!(per_consumer.len(), 3, "every consumer gets keys: {per_consumer:?}");
    assert!(per_consumer.values().all(|n| *n > 300), "{per_consumer:?}");
    // The ownership ranges cover the hash space exactly once.
    let ranges = d.ownership();
    assert_eq!(ranges.first().unwrap().0, 0);
    assert_eq!(ranges.last().unwrap().1, 65_535);
    for w in ranges.windows(2) {
        assert_eq!(w[0].1 + 1, w[1].0);
    }
    // Consistent: removing consumer 3 moves only its hashes.
    let before: HashMap<u32, u64> = keys.iter().map(|h| (*h, d.owner_of(*h).unwrap())).collect();
    d.remove_consumer(3).unwrap();
    for (h, c) in before {
        if c != 3 {
            assert_eq!(d.owner_of(h), Some(c));
        }
    }
    assert_eq!(key_hash(None), key_hash(Some(b"NONE_KEY")));
    assert!(matches!(
        d.add_consumer(ConsumerSpec::new(9, "x").with_key_ranges(vec![(0, 10)])),
        Err(StreamError::KeySharedConflict(_))
    ));
}

#[test]
fn key_shared_new_consumer_waits_for_acks_of_moved_keys_only() {
    let mut d = KeySharedDispatcher::new(KeySharedMode::AutoSplit, false);
    d.add_consumer(ConsumerSpec::new(1, "first")).unwrap();
    d.flow(1, 1000).unwrap();
    let keys: Vec<u32> = (0..50).map(|k| key_hash(Some(format!("k{k}").as_bytes()))).collect();
    let mut known = HashMap::new();
    let mut next = 0i64;
    let mut batch = |keys: &[u32], known: &mut HashMap<Position, Item>| -> Vec<Item> {
        let v: Vec<Item> = keys
            .iter()
            .map(|h| {
                next += 1;
                item(next, 1, *h)
            })
            .collect();
        known.extend(v.iter().map(|i| (i.position, *i)));
        v
    };
    let old = batch(&keys, &mut known);
    assert_eq!(d.dispatch(&old).len(), 50);
    // A second consumer joins and takes over some keys.
    d.add_consumer(ConsumerSpec::new(2, "second")).unwrap();
    d.flow(2, 1000).unwrap();
    let moved: HashSet<u32> = keys.iter().copied().filter(|h| d.owner_of(*h) == Some(2)).collect();
    assert!(!moved.is_empty() && moved.len() < 50, "{} keys moved", moved.len());
    let new = batch(&keys, &mut known);
    let out = d.dispatch(&new);
    for x in &out {
        assert_eq!(x.consumer, 1, "only keys still owned by the first consumer flow");
        assert!(!moved.contains(&x.item.key_hash));
    }
    assert_eq!(d.core().replay_len(), moved.len());
    // A key nobody has seen goes to its new owner at once.
    let fresh = (0..1000)
        .map(|k| key_hash(Some(format!("fresh{k}").as_bytes())))
        .find(|h| d.owner_of(*h) == Some(2) && !keys.contains(h))
        .unwrap();
    let f = batch(&[fresh], &mut known);
    assert_eq!(to(&d.dispatch(&f)), vec![(f[0].position.entry_id, 2)]);
    // The first consumer acknowledges the old message of one moved key: that key flows.
    let one = *moved.iter().next().unwrap();
    let old_pos = old.iter().find(|i| i.key_hash == one).unwrap().position;
    d.ack(&[old_pos]);
    let out = d.dispatch(&replay_items(&d, &known));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].consumer, 2);
    assert_eq!(out[0].item.key_hash, one);
    // Once everything old is acknowledged, all moved keys flow to the new owner.
    d.ack(&old.iter().map(|i| i.position).collect::<Vec<_>>());
    let out = d.dispatch(&replay_items(&d, &known));
    assert_eq!(out.len(), moved.len() - 1);
    assert!(out.iter().all(|x| x.consumer == 2));
    assert_eq!(d.core().replay_len(), 0);
}

#[test]
fn key_shared_consumer_without_permits_blocks_only_its_keys() {
    let mut d = KeySharedDispatcher::new(KeySharedMode::AutoSplit, false);
    d.add_consumer(ConsumerSpec::new(1, "stuck")).unwrap();
    d.add_consumer(ConsumerSpec::new(2, "busy")).unwrap();
    d.flow(2, 1_000_000).unwrap();
    let keys: Vec<u32> = (0..100).map(|k| key_hash(Some(format!("key{k}").as_bytes()))).collect();
    let mut known = HashMap::new();
    let mut delivered_to_2 = 0;
    let mut e = 0i64;
    for _round in 0..10 {
        let items: Vec<Item> = keys
            .iter()
            .map(|h| {
                e += 1;
                item(e, 1, *h)
            })
            .collect();
        known.extend(items.iter().map(|i| (i.position, *i)));
        let out = d.dispatch(&items);
        assert!(out.iter().all(|x| x.consumer == 2));
        let want = keys.iter().filter(|h| d.owner_of(**h) == Some(2)).count();
        assert_eq!(out.len(), want, "every message of the busy consumer's keys flows");
        delivered_to_2 += out.len();
    }
    assert!(delivered_to_2 > 0);
    // The stuck consumer gets permits: its held messages go out, per key in order.
    d.flow(1, 1_000_000).unwrap();
    let out = d.dispatch(&replay_items(&d, &known));
    assert!(out.iter().all(|x| x.consumer == 1));
    let mut last: HashMap<u32, Position> = HashMap::new();
    for x in &out {
        if let Some(prev) = last.insert(x.item.key_hash, x.item.position) {
            assert!(prev < x.item.position);
        }
    }
    assert_eq!(d.core().replay_len(), 0);
}

#[test]
fn key_shared_sticky_ranges() {
    let mut d = KeySharedDispatcher::new(KeySharedMode::Sticky, false);
    d.add_consumer(ConsumerSpec::new(1, "a").with_key_ranges(vec![(0, 32_767)])).unwrap();
    let clash = d.add_consumer(ConsumerSpec::new(2, "b").with_key_ranges(vec![(30_000, 40_000)]));
    assert!(matches!(clash, Err(StreamError::KeySharedConflict(_))));
    assert!(d.add_consumer(ConsumerSpec::new(2, "b")).is_err(), "sticky consumers declare ranges");
    assert!(d.add_consumer(ConsumerSpec::new(2, "b").with_key_ranges(vec![(65_000, 70_000)])).is_err());
    d.add_consumer(ConsumerSpec::new(2, "b").with_key_ranges(vec![(40_000, 49_999), (60_000, 65_535)])).unwrap();
    d.flow(1, 10).unwrap();
    d.flow(2, 10).unwrap();
    let table = [(0u32, Some(1u64)), (32_767, Some(1)), (32_768, None), (45_000, Some(2)), (55_000, None), (65_535, Some(2))];
    for (hash, want) in table {
        assert_eq!(d.owner_of(hash), want, "hash {hash}");
    }
    let out = d.dispatch(&[item(0, 1, 10), item(1, 1, 50_000), item(2, 1, 45_000)]);
    assert_eq!(to(&out), vec![(0, 1), (2, 2)]);
    assert_eq!(d.replay_positions(10), vec![Position::new(1, 1)]);
    d.remove_consumer(1).unwrap();
    assert_eq!(d.owner_of(0), None);
}

#[derive(Debug, Clone)]
enum Op {
    Join(u8),
    Leave(u8),
    Flow(u8, u8),
    Publish(Vec<u8>),
    AckSome(u8),
    Replay,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..5).prop_map(Op::Join),
        (0u8..5).prop_map(Op::Leave),
        ((0u8..5), (0u8..20)).prop_map(|(c, n)| Op::Flow(c, n)),
        proptest::collection::vec(0u8..12, 1..10).prop_map(Op::Publish),
        (0u8..8).prop_map(Op::AckSome),
        Just(Op::Replay),
    ]
}

proptest! {
    /// Whatever joins, leaves, permits and acks happen: a key is never held by two
    /// consumers at once, and a key's messages are first delivered in position order.
    #[test]
    fn key_shared_keeps_per_key_order(ops in proptest::collection::vec(op(), 1..80)) {
        let mut d = KeySharedDispatcher::new(KeySharedMode::AutoSplit, false);
        let mut known: HashMap<Position, Item> = HashMap::new();
        let mut unacked: BTreeMap<Position, (u64, u32)> = BTreeMap::new();
        let mut delivered_once: HashSet<Position> = HashSet::new();
        let mut last_first_delivery: HashMap<u32, Position> = HashMap::new();
        let mut e = 0i64;
        for op in ops {
            let out = match op {
                Op::Join(c) => { let _ = d.add_consumer(ConsumerSpec::new(u64::from(c), &format!("c{c}"))); vec![] }
                Op::Leave(c) => {
                    if d.remove_consumer(u64::from(c)).is_ok() {
                        unacked.retain(|_, (holder, _)| *holder != u64::from(c));
                    }
                    vec![]
                }
                Op::Flow(c, n) => { let _ = d.flow(u64::from(c), u32::from(n)); vec![] }
                Op::Publish(keys) => {
                    let items: Vec<Item> = keys.iter().map(|k| { e += 1; item(e, 1, key_hash(Some(&[*k]))) }).collect();
                    known.extend(items.iter().map(|i| (i.position, *i)));
                    let mut all = replay_items(&d, &known);
                    all.extend(items);
                    d.dispatch(&all)
                }
                Op::AckSome(n) => {
                    let acked: Vec<Position> = unacked.keys().take(usize::from(n)).copied().collect();
                    for p in &acked { unacked.remove(p); }
                    d.ack(&acked);
                    vec![]
                }
                Op::Replay => { let r = replay_items(&d, &known); d.dispatch(&r) }
            };
            for x in out {
                let h = x.item.key_hash;
                for (holder, hh) in unacked.values() {
                    prop_assert!(!(*hh == h && *holder != x.consumer), "key {h} held by {holder} while given to {}", x.consumer);
                }
                unacked.insert(x.item.position, (x.consumer, h));
                if delivered_once.insert(x.item.position) {
                    if let Some(prev) = last_first_delivery.insert(h, x.item.position) {
                        prop_assert!(prev < x.item.position, "key {h}: {prev} after {}", x.item.position);
                    }
                }
            }
        }
    }
}
