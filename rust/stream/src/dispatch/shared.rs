//! Shared subscriptions: entries go round-robin to the consumers that have permits,
//! consumers of the best (lowest) priority level first. No ordering guarantee.

use super::{ConsumerId, ConsumerSpec, Delivery, DispatchCore, Dispatcher, Item, SubscriptionType};
use crate::error::Result;

/// Dispatcher of a shared subscription.
#[derive(Debug, Default)]
pub struct SharedDispatcher {
    core: DispatchCore,
    /// Index into the attach order where the next round-robin turn starts.
    next: usize,
}

impl SharedDispatcher {
    /// A dispatcher with no consumers.
    pub fn new() -> Self {
        Self::default()
    }

    fn pick(&mut self) -> Option<ConsumerId> {
        let order = self.core.attach_order();
        let n = order.len();
        let best = order
            .iter()
            .filter(|id| self.core.permits(**id) > 0)
            .filter_map(|id| self.core.consumer(*id).map(|c| c.spec.priority))
            .min()?;
        for step in 0..n {
            let at = (self.next + step) % n;
            let id = order[at];
            let ok = self.core.permits(id) > 0 && self.core.consumer(id).is_some_and(|c| c.spec.priority == best);
            if ok {
                self.next = (at + 1) % n;
                return Some(id);
            }
        }
        None
    }
}

impl Dispatcher for SharedDispatcher {
    fn subscription_type(&self) -> SubscriptionType {
        SubscriptionType::Shared
    }

    fn core(&self) -> &DispatchCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DispatchCore {
        &mut self.core
    }

    fn add_consumer(&mut self, spec: ConsumerSpec) -> Result<()> {
        self.core.attach(spec)
    }

    fn remove_consumer(&mut self, id: ConsumerId) -> Result<()> {
        self.core.detach(id)?;
        let n = self.core.attach_order().len();
        if n == 0 || self.next >= n {
            self.next = 0;
        }
        Ok(())
    }

    fn dispatch(&mut self, items: &[Item]) -> Vec<Delivery> {
        let mut out = Vec::new();
        for item in items {
            if self.core.is_pending(item.position) {
                continue;
            }
            match self.pick() {
                Some(c) => out.push(self.core.deliver(c, *item)),
                None => self.core.hold(*item),
            }
        }
        out
    }
}
