//! Dispatchers: which consumer of a subscription gets which entry.
//!
//! Pure logic without I/O. The broker reads entries (new ones from the cursor, and the
//! positions of the *replay set* first), turns each into an [`Item`] (position, message
//! count, key hash) and calls [`Dispatcher::dispatch`]; the answer is a list of
//! [`Delivery`]s. Items that cannot go anywhere now (no permits, a key that must wait)
//! join the replay set and are offered again by [`Dispatcher::replay_positions`].
//!
//! One type per subscription type, each in its own file: [`ExclusiveDispatcher`],
//! [`FailoverDispatcher`], [`SharedDispatcher`], [`KeySharedDispatcher`]. Their common
//! bookkeeping — consumers and their permits, what each holds unacknowledged, the replay
//! set and redelivery counts — is [`DispatchCore`].
//!
//! Permits count messages, as Pulsar's flow permits do: an entry of `n` messages uses `n`
//! permits, and an entry is handed out while the consumer has at least one permit left.
//!
//! ```
//! use magnetar_stream::dispatch::{ConsumerSpec, Dispatcher, Item, SharedDispatcher};
//! use magnetar_stream::Position;
//!
//! let mut d = SharedDispatcher::new();
//! d.add_consumer(ConsumerSpec::new(1, "a")).unwrap();
//! d.add_consumer(ConsumerSpec::new(2, "b")).unwrap();
//! d.flow(1, 10).unwrap();
//! d.flow(2, 10).unwrap();
//! let items: Vec<Item> = (0..4).map(|e| Item::new(Position::new(7, e), 1, 0)).collect();
//! let out = d.dispatch(&items);
//! let to: Vec<u64> = out.iter().map(|d| d.consumer).collect();
//! assert_eq!(to, vec![1, 2, 1, 2]);
//! d.redeliver(1, &[Position::new(7, 0)]);
//! assert_eq!(d.replay_positions(10), vec![Position::new(7, 0)]);
//! assert_eq!(d.redelivery_count(Position::new(7, 0)), 1);
//! ```

mod core;
mod exclusive;
mod failover;
mod key_shared;
mod shared;

pub use self::core::{ConsumerState, DispatchCore};
pub use exclusive::ExclusiveDispatcher;
pub use failover::FailoverDispatcher;
pub use key_shared::{key_hash, murmur3_32, KeySharedDispatcher, KeySharedMode, HASH_RANGE_SIZE};
pub use shared::SharedDispatcher;

use crate::error::Result;
use crate::position::Position;

/// A consumer's id, unique within a subscription.
pub type ConsumerId = u64;

/// The subscription types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscriptionType {
    Exclusive,
    Failover,
    Shared,
    KeyShared,
}

/// A consumer as the dispatcher needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSpec {
    pub id: ConsumerId,
    pub name: String,
    /// Pulsar's priority level: lower numbers are served first.
    pub priority: i32,
    /// Key-shared sticky mode: the inclusive key-hash ranges the consumer takes
    /// (within `0..HASH_RANGE_SIZE`). Empty in every other case.
    pub key_ranges: Vec<(u32, u32)>,
}

impl ConsumerSpec {
    /// A consumer of priority 0 without declared key ranges.
    pub fn new(id: ConsumerId, name: &str) -> Self {
        ConsumerSpec { id, name: name.to_string(), priority: 0, key_ranges: Vec::new() }
    }

    /// The same consumer with another priority level.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The same consumer with sticky key-hash ranges.
    pub fn with_key_ranges(mut self, ranges: Vec<(u32, u32)>) -> Self {
        self.key_ranges = ranges;
        self
    }
}

/// One entry offered for dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Item {
    pub position: Position,
    /// Messages in the entry; this many permits are used by its delivery.
    pub num_messages: u32,
    /// The entry's key hash in `0..HASH_RANGE_SIZE` (see [`key_hash`]); used by key-shared only.
    pub key_hash: u32,
}

impl Item {
    /// An item from its parts.
    pub const fn new(position: Position, num_messages: u32, key_hash: u32) -> Self {
        Item { position, num_messages, key_hash }
    }
}

/// One decision: `item` goes to `consumer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub consumer: ConsumerId,
    pub item: Item,
    /// How often the item was redelivered (nack, ack timeout) before.
    pub redelivery_count: u32,
}

/// Something the broker tells consumers about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchEvent {
    /// Failover: `consumer` became the active consumer (`active`) or stopped being it.
    ActiveConsumerChanged { consumer: ConsumerId, active: bool },
}

/// A subscription's dispatcher. The bookkeeping methods have default implementations over
/// [`DispatchCore`]; each type decides membership and who gets what.
pub trait Dispatcher: Send {
    /// The subscription type this dispatcher implements.
    fn subscription_type(&self) -> SubscriptionType;
    /// The shared bookkeeping.
    fn core(&self) -> &DispatchCore;
    /// The shared bookkeeping, mutable.
    fn core_mut(&mut self) -> &mut DispatchCore;

    /// Attach a consumer (with no permits yet).
    fn add_consumer(&mut self, spec: ConsumerSpec) -> Result<()>;

    /// Detach a consumer; what it held unacknowledged goes to the replay set.
    fn remove_consumer(&mut self, id: ConsumerId) -> Result<()>;

    /// Decide where each item goes; items that cannot go now join the replay set.
    fn dispatch(&mut self, items: &[Item]) -> Vec<Delivery>;

    /// Give `consumer` more permits (messages it can take).
    fn flow(&mut self, consumer: ConsumerId, permits: u32) -> Result<()> {
        self.core_mut().flow(consumer, permits)
    }

    /// Individual acknowledgements (from any consumer).
    fn ack(&mut self, positions: &[Position]) {
        self.core_mut().ack(positions);
    }

    /// A cumulative acknowledgement: everything at or before `upto` is done.
    fn ack_cumulative(&mut self, upto: Position) {
        self.core_mut().ack_cumulative(upto);
    }

    /// Negative acknowledgement or ack timeout: the positions `consumer` holds go back to
    /// the replay set and their redelivery count grows. Unknown positions are ignored.
    fn redeliver(&mut self, consumer: ConsumerId, positions: &[Position]) {
        self.core_mut().redeliver(consumer, positions);
    }

    /// Everything `consumer` holds unacknowledged goes back (redeliverUnacknowledgedMessages).
    fn redeliver_all(&mut self, consumer: ConsumerId) {
        self.core_mut().redeliver_all(consumer);
    }

    /// The oldest positions of the replay set, to be read and dispatched before new entries.
    fn replay_positions(&self, max: usize) -> Vec<Position> {
        self.core().replay_positions(max)
    }

    /// How often `position` has been redelivered.
    fn redelivery_count(&self, position: Position) -> u32 {
        self.core().redelivery_count(position)
    }

    /// Events since the last call (failover active-consumer changes).
    fn take_events(&mut self) -> Vec<DispatchEvent> {
        std::mem::take(&mut self.core_mut().events)
    }

    /// Permits of all consumers together (what is worth reading).
    fn total_permits(&self) -> u64 {
        self.core().total_permits()
    }
}

/// A dispatcher for `kind` (key-shared in auto-split mode, ordered).
pub fn new_dispatcher(kind: SubscriptionType, partition_index: u32) -> Box<dyn Dispatcher> {
    match kind {
        SubscriptionType::Exclusive => Box::new(ExclusiveDispatcher::new()),
        SubscriptionType::Failover => Box::new(FailoverDispatcher::new(partition_index)),
        SubscriptionType::Shared => Box::new(SharedDispatcher::new()),
        SubscriptionType::KeyShared => Box::new(KeySharedDispatcher::new(KeySharedMode::AutoSplit, false)),
    }
}
