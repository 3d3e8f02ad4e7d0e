//! Failover subscriptions: many consumers, one active.
//!
//! The active consumer is chosen among the consumers of the best (lowest) priority level,
//! sorted by name then id: for a partition `i` of a partitioned topic it is the one at
//! `i mod count`, so the partitions spread over the consumers; for a non-partitioned topic
//! (index 0) the first. When the active consumer changes, what the old one held
//! unacknowledged is taken back for the new one, and both are told.

use super::exclusive::dispatch_in_order;
use super::{ConsumerId, ConsumerSpec, Delivery, DispatchCore, DispatchEvent, Dispatcher, Item, SubscriptionType};
use crate::error::Result;

/// Dispatcher of a failover subscription.
#[derive(Debug, Default)]
pub struct FailoverDispatcher {
    core: DispatchCore,
    partition_index: u32,
    active: Option<ConsumerId>,
}

impl FailoverDispatcher {
    /// A dispatcher for partition `partition_index` (0 for a non-partitioned topic).
    pub fn new(partition_index: u32) -> Self {
        FailoverDispatcher { partition_index, ..Default::default() }
    }

    /// The active consumer.
    pub fn active_consumer(&self) -> Option<ConsumerId> {
        self.active
    }

    fn pick_active(&self) -> Option<ConsumerId> {
        let best = self.core.consumers().map(|c| c.spec.priority).min()?;
        let mut candidates: Vec<(&str, ConsumerId)> = self
            .core
            .consumers()
            .filter(|c| c.spec.priority == best)
            .map(|c| (c.spec.name.as_str(), c.spec.id))
            .collect();
        candidates.sort_unstable();
        let at = usize::try_from(self.partition_index).unwrap_or(0) % candidates.len();
        Some(candidates[at].1)
    }

    fn update_active(&mut self) {
        let new = self.pick_active();
        if new == self.active {
            return;
        }
        if let Some(old) = self.active {
            self.core.return_all(old, false);
            if self.core.consumer(old).is_some() {
                self.core.events.push(DispatchEvent::ActiveConsumerChanged { consumer: old, active: false });
            }
        }
        if let Some(n) = new {
            self.core.events.push(DispatchEvent::ActiveConsumerChanged { consumer: n, active: true });
        }
        self.active = new;
    }
}

impl Dispatcher for FailoverDispatcher {
    fn subscription_type(&self) -> SubscriptionType {
        SubscriptionType::Failover
    }

    fn core(&self) -> &DispatchCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DispatchCore {
        &mut self.core
    }

    fn add_consumer(&mut self, spec: ConsumerSpec) -> Result<()> {
        let id = spec.id;
        self.core.attach(spec)?;
        self.update_active();
        if self.active != Some(id) {
            self.core.events.push(DispatchEvent::ActiveConsumerChanged { consumer: id, active: false });
        }
        Ok(())
    }

    fn remove_consumer(&mut self, id: ConsumerId) -> Result<()> {
        self.core.detach(id)?;
        if self.active == Some(id) {
            self.active = None;
        }
        self.update_active();
        Ok(())
    }

    fn dispatch(&mut self, items: &[Item]) -> Vec<Delivery> {
        let target = self.active;
        dispatch_in_order(&mut self.core, target, items)
    }
}
