//! Exclusive subscriptions: one consumer; a second one is refused.

use super::{ConsumerId, ConsumerSpec, Delivery, DispatchCore, Dispatcher, Item, SubscriptionType};
use crate::error::{Result, StreamError};

/// Dispatcher of an exclusive subscription.
#[derive(Debug, Default)]
pub struct ExclusiveDispatcher {
    core: DispatchCore,
}

impl ExclusiveDispatcher {
    /// A dispatcher with no consumer.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Deliver `items` in order to `target` while it has permits; hold the rest (in order).
pub(crate) fn dispatch_in_order(core: &mut DispatchCore, target: Option<ConsumerId>, items: &[Item]) -> Vec<Delivery> {
    let mut out = Vec::new();
    let mut blocked = false;
    for item in items {
        if core.is_pending(item.position) {
            continue;
        }
        match target {
            Some(c) if !blocked && core.permits(c) > 0 => out.push(core.deliver(c, *item)),
            _ => {
                blocked = true;
                core.hold(*item);
            }
        }
    }
    out
}

impl Dispatcher for ExclusiveDispatcher {
    fn subscription_type(&self) -> SubscriptionType {
        SubscriptionType::Exclusive
    }

    fn core(&self) -> &DispatchCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DispatchCore {
        &mut self.core
    }

    fn add_consumer(&mut self, spec: ConsumerSpec) -> Result<()> {
        if let Some(existing) = self.core.consumers().next() {
            return Err(StreamError::ConsumerBusy(existing.spec.name.clone()));
        }
        self.core.attach(spec)
    }

    fn remove_consumer(&mut self, id: ConsumerId) -> Result<()> {
        self.core.detach(id).map(|_| ())
    }

    fn dispatch(&mut self, items: &[Item]) -> Vec<Delivery> {
        let target = self.core.consumers().next().map(|c| c.spec.id);
        dispatch_in_order(&mut self.core, target, items)
    }
}
