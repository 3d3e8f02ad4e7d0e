//! Key-shared subscriptions: every key goes to one consumer, in order.
//!
//! Keys map to a hash in `0..HASH_RANGE_SIZE` (Murmur3-32 of the key, as Pulsar computes
//! it). In *auto-split* mode the hash space is split by consistent hashing: each consumer
//! puts [`POINTS_PER_CONSUMER`] points on a ring, derived from its name, and a hash belongs
//! to the first point at or after it, so a consumer joining or leaving moves only the
//! hashes next to its own points. In *sticky* mode each consumer declares its hash ranges,
//! which may not overlap.
//!
//! Ordering when ownership moves. A hash's messages may sit unacknowledged at the consumer
//! that owned it before a new consumer joined. Until they are all acknowledged (or taken
//! back), newer messages of that hash are held, so the new owner never overtakes the old
//! one. Unlike Pulsar's "recently joined consumers" rule, the wait is per hash: a consumer
//! that stops acknowledging, or has no permits, holds back only hashes it has messages of
//! outstanding, never the other keys of the new consumer or of anyone else. Within a
//! hash, an older held message always goes before a newer one.

use std::collections::BTreeMap;

use super::{ConsumerId, ConsumerSpec, Delivery, DispatchCore, Dispatcher, Item, SubscriptionType};
use crate::error::{Result, StreamError};

/// Size of the key-hash space.
pub const HASH_RANGE_SIZE: u32 = 65_536;
/// Ring points per consumer in auto-split mode.
pub const POINTS_PER_CONSUMER: u32 = 100;
/// What messages without a key hash as.
pub const NONE_KEY: &[u8] = b"NONE_KEY";

/// Murmur3 x86 32-bit hash.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut chunks = data.chunks_exact(4);
    for c in chunks.by_ref() {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, b) in tail.iter().enumerate() {
            k ^= u32::from(*b) << (8 * i);
        }
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    // The length is mixed in modulo 2^32, as the reference implementation does.
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The key hash of a message key (`None`: a message without key) in `0..HASH_RANGE_SIZE`.
pub fn key_hash(key: Option<&[u8]>) -> u32 {
    murmur3_32(key.unwrap_or(NONE_KEY), 0) % HASH_RANGE_SIZE
}

/// How the hash space is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySharedMode {
    /// Consistent hashing over the consumers.
    AutoSplit,
    /// Ranges declared by the consumers.
    Sticky,
}

/// Dispatcher of a key-shared subscription.
#[derive(Debug)]
pub struct KeySharedDispatcher {
    core: DispatchCore,
    mode: KeySharedMode,
    allow_out_of_order: bool,
    /// Auto-split: ring point → consumer.
    ring: BTreeMap<u32, ConsumerId>,
    /// Sticky: range start → (range end, consumer).
    ranges: BTreeMap<u32, (u32, ConsumerId)>,
}

impl KeySharedDispatcher {
    /// A dispatcher in `mode`; with `allow_out_of_order`, hashes move to a new owner at
    /// once (Pulsar's `allowOutOfOrderDelivery`).
    pub fn new(mode: KeySharedMode, allow_out_of_order: bool) -> Self {
        KeySharedDispatcher {
            core: DispatchCore::new(),
            mode,
            allow_out_of_order,
            ring: BTreeMap::new(),
            ranges: BTreeMap::new(),
        }
    }

    /// The mode.
    pub fn mode(&self) -> KeySharedMode {
        self.mode
    }

    /// The consumer that owns `hash` now.
    pub fn owner_of(&self, hash: u32) -> Option<ConsumerId> {
        let hash = hash % HASH_RANGE_SIZE;
        match self.mode {
            KeySharedMode::AutoSplit => {
                self.ring.range(hash..).next().or_else(|| self.ring.iter().next()).map(|(_, c)| *c)
            }
            KeySharedMode::Sticky => self
                .ranges
                .range(..=hash)
                .next_back()
                .filter(|(_, (end, _))| hash <= *end)
                .map(|(_, (_, c))| *c),
        }
    }

    /// The hash ranges each consumer owns, as inclusive `(start, end, consumer)`, sorted.
    pub fn ownership(&self) -> Vec<(u32, u32, ConsumerId)> {
        match self.mode {
            KeySharedMode::Sticky => self.ranges.iter().map(|(s, (e, c))| (*s, *e, *c)).collect(),
            KeySharedMode::AutoSplit => {
                let mut out = Vec::new();
                let mut start = 0u32;
                for (point, c) in &self.ring {
                    out.push((start, *point, *c));
                    start = point + 1;
                }
                if let (Some((_, first)), true) = (self.ring.iter().next(), start < HASH_RANGE_SIZE) {
                    out.push((start, HASH_RANGE_SIZE - 1, *first));
                }
                out.retain(|(s, e, _)| s <= e);
                out
            }
        }
    }

    fn add_points(&mut self, spec: &ConsumerSpec) {
        for i in 0..POINTS_PER_CONSUMER {
            let mut point = murmur3_32(format!("{}{}", spec.name, i).as_bytes(), 0) % HASH_RANGE_SIZE;
            // A taken point moves to the next free one, so every consumer keeps its share.
            let mut tries = 0;
            while self.ring.contains_key(&point) && tries < HASH_RANGE_SIZE {
                point = (point + 1) % HASH_RANGE_SIZE;
                tries += 1;
            }
            if tries < HASH_RANGE_SIZE {
                self.ring.insert(point, spec.id);
            }
        }
    }

    fn add_ranges(&mut self, spec: &ConsumerSpec) -> Result<()> {
        if spec.key_ranges.is_empty() {
            return Err(StreamError::KeySharedConflict("a sticky consumer must declare its hash ranges".into()));
        }
        let mut mine: Vec<(u32, u32)> = spec.key_ranges.clone();
        mine.sort_unstable();
        for (i, (s, e)) in mine.iter().enumerate() {
            if s > e || *e >= HASH_RANGE_SIZE {
                return Err(StreamError::KeySharedConflict(format!("bad hash range [{s}, {e}]")));
            }
            if i > 0 && mine[i - 1].1 >= *s {
                return Err(StreamError::KeySharedConflict(format!("hash range [{s}, {e}] overlaps itself")));
            }
            let clash = self.ranges.range(..=*e).next_back().filter(|(_, (end, _))| *end >= *s);
            if let Some((os, (oe, oc))) = clash {
                return Err(StreamError::KeySharedConflict(format!(
                    "hash range [{s}, {e}] overlaps [{os}, {oe}] of consumer {oc}"
                )));
            }
        }
        for (s, e) in mine {
            self.ranges.insert(s, (e, spec.id));
        }
        Ok(())
    }
}

impl Dispatcher for KeySharedDispatcher {
    fn subscription_type(&self) -> SubscriptionType {
        SubscriptionType::KeyShared
    }

    fn core(&self) -> &DispatchCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DispatchCore {
        &mut self.core
    }

    fn add_consumer(&mut self, spec: ConsumerSpec) -> Result<()> {
        if self.core.consumer(spec.id).is_some() {
            return Err(StreamError::DuplicateConsumer(spec.id));
        }
        match self.mode {
            KeySharedMode::AutoSplit => {
                if !spec.key_ranges.is_empty() {
                    return Err(StreamError::KeySharedConflict(
                        "the subscription is in auto-split mode; the consumer declares sticky ranges".into(),
                    ));
                }
                self.add_points(&spec);
            }
            KeySharedMode::Sticky => self.add_ranges(&spec)?,
        }
        self.core.attach(spec)
    }

    fn remove_consumer(&mut self, id: ConsumerId) -> Result<()> {
        self.core.detach(id)?;
        self.ring.retain(|_, c| *c != id);
        self.ranges.retain(|_, (_, c)| *c != id);
        Ok(())
    }

    fn dispatch(&mut self, items: &[Item]) -> Vec<Delivery> {
        let mut out = Vec::new();
        for item in items {
            if self.core.is_pending(item.position) {
                continue;
            }
            let hash = item.key_hash % HASH_RANGE_SIZE;
            if !self.allow_out_of_order && self.core.first_replay_of_hash(hash).is_some_and(|p| p < item.position) {
                // An older message of this key waits: this one waits behind it.
                self.core.hold(*item);
                continue;
            }
            let Some(target) = self.owner_of(hash) else {
                self.core.hold(*item);
                continue;
            };
            let draining = !self.allow_out_of_order
                && self.core.outstanding(hash).is_some_and(|(holder, n)| holder != target && n > 0);
            if draining || self.core.permits(target) <= 0 {
                self.core.hold(*item);
                continue;
            }
            out.push(self.core.deliver(target, *item));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_reference_vectors() {
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514E_28B7);
        assert_eq!(murmur3_32(b"", 0xffff_ffff), 0x81F1_6F39);
        assert_eq!(murmur3_32(b"hello", 0), 0x248B_FA47);
        assert_eq!(murmur3_32(b"The quick brown fox jumps over the lazy dog", 0), 0x2E4F_F723);
        assert_eq!(murmur3_32(&[0x21, 0x43, 0x65, 0x87], 0), 0xF55B_516B);
        assert_eq!(murmur3_32(&[0x21, 0x43, 0x65], 0), 0x7E4A_8634);
        assert_eq!(murmur3_32(&[0x21, 0x43], 0), 0xA0F7_B07A);
        assert_eq!(murmur3_32(&[0x21], 0), 0x7266_1CF4);
    }
}
