//! Bookkeeping every dispatcher shares: consumers and permits, unacknowledged deliveries,
//! the replay set and redelivery counts.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{ConsumerId, ConsumerSpec, Delivery, DispatchEvent, Item};
use crate::error::{Result, StreamError};
use crate::position::Position;

/// One attached consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerState {
    pub spec: ConsumerSpec,
    /// Messages the consumer can still take; may go below zero when a batch overdraws.
    pub permits: i64,
    /// Positions delivered to it and not acknowledged.
    pub unacked: BTreeSet<Position>,
}

/// The shared state of a dispatcher.
#[derive(Debug, Default)]
pub struct DispatchCore {
    consumers: BTreeMap<ConsumerId, ConsumerState>,
    /// Consumer ids in attach order.
    order: Vec<ConsumerId>,
    /// Delivered, unacknowledged: position → (consumer, item).
    pending: BTreeMap<Position, (ConsumerId, Item)>,
    /// Per key hash, the consumer holding its unacknowledged messages and how many.
    outstanding: HashMap<u32, (ConsumerId, u32)>,
    replay: BTreeMap<Position, Item>,
    /// Per key hash, its positions in the replay set.
    replay_by_hash: HashMap<u32, BTreeSet<Position>>,
    redelivery: HashMap<Position, u32>,
    pub(crate) events: Vec<DispatchEvent>,
}

impl DispatchCore {
    /// Empty bookkeeping.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn attach(&mut self, spec: ConsumerSpec) -> Result<()> {
        if self.consumers.contains_key(&spec.id) {
            return Err(StreamError::DuplicateConsumer(spec.id));
        }
        self.order.push(spec.id);
        self.consumers.insert(spec.id, ConsumerState { spec, permits: 0, unacked: BTreeSet::new() });
        Ok(())
    }

    /// Remove a consumer; its unacknowledged positions join the replay set.
    pub(crate) fn detach(&mut self, id: ConsumerId) -> Result<ConsumerState> {
        self.return_all(id, false);
        self.order.retain(|c| *c != id);
        self.consumers.remove(&id).ok_or(StreamError::UnknownConsumer(id))
    }

    /// An attached consumer.
    pub fn consumer(&self, id: ConsumerId) -> Option<&ConsumerState> {
        self.consumers.get(&id)
    }

    /// Attached consumers by id.
    pub fn consumers(&self) -> impl Iterator<Item = &ConsumerState> {
        self.consumers.values()
    }

    /// Consumer ids in attach order.
    pub fn attach_order(&self) -> &[ConsumerId] {
        &self.order
    }

    /// Number of attached consumers.
    pub fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// The consumer's permits (0 for unknown consumers).
    pub fn permits(&self, id: ConsumerId) -> i64 {
        self.consumers.get(&id).map_or(0, |c| c.permits)
    }

    pub(crate) fn flow(&mut self, id: ConsumerId, permits: u32) -> Result<()> {
        let c = self.consumers.get_mut(&id).ok_or(StreamError::UnknownConsumer(id))?;
        c.permits = c.permits.saturating_add(i64::from(permits));
        Ok(())
    }

    /// Permits of all consumers together (negative balances count as zero).
    pub fn total_permits(&self) -> u64 {
        self.consumers.values().map(|c| u64::try_from(c.permits).unwrap_or(0)).sum()
    }

    /// Whether `p` is delivered and not yet acknowledged.
    pub fn is_pending(&self, p: Position) -> bool {
        self.pending.contains_key(&p)
    }

    /// Who holds `p` unacknowledged.
    pub fn holder(&self, p: Position) -> Option<ConsumerId> {
        self.pending.get(&p).map(|(c, _)| *c)
    }

    /// The consumer holding unacknowledged messages of `key_hash`, and how many.
    pub fn outstanding(&self, key_hash: u32) -> Option<(ConsumerId, u32)> {
        self.outstanding.get(&key_hash).copied()
    }

    /// The oldest replay-set position with `key_hash`.
    pub fn first_replay_of_hash(&self, key_hash: u32) -> Option<Position> {
        self.replay_by_hash.get(&key_hash).and_then(|s| s.first().copied())
    }

    /// Number of positions waiting in the replay set.
    pub fn replay_len(&self) -> usize {
        self.replay.len()
    }

    pub(crate) fn replay_positions(&self, max: usize) -> Vec<Position> {
        self.replay.keys().take(max).copied().collect()
    }

    pub(crate) fn redelivery_count(&self, p: Position) -> u32 {
        self.redelivery.get(&p).copied().unwrap_or(0)
    }

    /// Hand `item` to `consumer`.
    pub(crate) fn deliver(&mut self, consumer: ConsumerId, item: Item) -> Delivery {
        self.remove_replay(item.position);
        if let Some(c) = self.consumers.get_mut(&consumer) {
            c.permits -= i64::from(item.num_messages);
            c.unacked.insert(item.position);
        }
        self.pending.insert(item.position, (consumer, item));
        let slot = self.outstanding.entry(item.key_hash).or_insert((consumer, 0));
        if slot.1 == 0 {
            slot.0 = consumer;
        }
        slot.1 += 1;
        Delivery { consumer, item, redelivery_count: self.redelivery_count(item.position) }
    }

    /// Keep `item` for later.
    pub(crate) fn hold(&mut self, item: Item) {
        if self.replay.insert(item.position, item).is_none() {
            self.replay_by_hash.entry(item.key_hash).or_default().insert(item.position);
        }
    }

    fn remove_replay(&mut self, p: Position) {
        if let Some(item) = self.replay.remove(&p) {
            if let Some(set) = self.replay_by_hash.get_mut(&item.key_hash) {
                set.remove(&p);
                if set.is_empty() {
                    self.replay_by_hash.remove(&item.key_hash);
                }
            }
        }
    }

    /// Forget a delivery (acknowledged or taken back); returns it.
    fn settle(&mut self, p: Position) -> Option<(ConsumerId, Item)> {
        let (consumer, item) = self.pending.remove(&p)?;
        if let Some(c) = self.consumers.get_mut(&consumer) {
            c.unacked.remove(&p);
        }
        if let Some(slot) = self.outstanding.get_mut(&item.key_hash) {
            slot.1 = slot.1.saturating_sub(1);
            if slot.1 == 0 {
                self.outstanding.remove(&item.key_hash);
            }
        }
        Some((consumer, item))
    }

    pub(crate) fn ack(&mut self, positions: &[Position]) {
        for p in positions {
            self.settle(*p);
            self.remove_replay(*p);
            self.redelivery.remove(p);
        }
    }

    pub(crate) fn ack_cumulative(&mut self, upto: Position) {
        let done: Vec<Position> = self
            .pending
            .range(..=upto)
            .map(|(p, _)| *p)
            .chain(self.replay.range(..=upto).map(|(p, _)| *p))
            .collect();
        self.ack(&done);
    }

    pub(crate) fn redeliver(&mut self, consumer: ConsumerId, positions: &[Position]) {
        for p in positions {
            if self.holder(*p) == Some(consumer) {
                if let Some((_, item)) = self.settle(*p) {
                    *self.redelivery.entry(*p).or_insert(0) += 1;
                    self.hold(item);
                }
            }
        }
    }

    pub(crate) fn redeliver_all(&mut self, consumer: ConsumerId) {
        self.return_all(consumer, true);
    }

    /// Take back everything `consumer` holds; with `count`, as a redelivery.
    pub(crate) fn return_all(&mut self, consumer: ConsumerId, count: bool) {
        let held: Vec<Position> = self.consumers.get(&consumer).map(|c| c.unacked.iter().copied().collect()).unwrap_or_default();
        for p in held {
            if let Some((_, item)) = self.settle(p) {
                if count {
                    *self.redelivery.entry(p).or_insert(0) += 1;
                }
                self.hold(item);
            }
        }
    }
}
