//! Messages laid out column by column, in Apache Arrow's memory layout, so that a binding
//! can hand each buffer to Arrow without touching a message.
//!
//! A variable-length column ([`VarColumn`]) is Arrow's `binary`/`utf8` layout: `n + 1`
//! little-endian `i32` offsets into one data buffer, plus a validity bitmap (bit `i` of
//! byte `i / 8`, least significant bit first; 1 = valid). Fixed-width columns are plain
//! `i64` vectors. The properties map is Arrow's `map<utf8, utf8>`: `n + 1` offsets into
//! the key and value columns of its entries.

use std::ops::Range;

use crate::entry::{parse_entry, Message};
use crate::error::{FormatError, Result};

/// A validity bitmap in Arrow's layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validity {
    bits: Vec<u8>,
    len: usize,
    nulls: usize,
}

impl Validity {
    fn push(&mut self, valid: bool) {
        if self.len.is_multiple_of(8) {
            self.bits.push(0);
        }
        if valid {
            if let Some(last) = self.bits.last_mut() {
                *last |= 1 << (self.len % 8);
            }
        } else {
            self.nulls += 1;
        }
        self.len += 1;
    }

    fn clear(&mut self) {
        self.bits.clear();
        self.len = 0;
        self.nulls = 0;
    }

    /// The bitmap bytes.
    pub fn bits(&self) -> &[u8] {
        &self.bits
    }

    /// How many entries are null.
    pub fn null_count(&self) -> usize {
        self.nulls
    }

    /// Whether entry `i` is valid.
    pub fn is_valid(&self, i: usize) -> bool {
        i < self.len && self.bits[i / 8] & (1 << (i % 8)) != 0
    }
}

/// A binary or string column: offsets, data, validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarColumn {
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
    pub validity: Validity,
}

impl Default for VarColumn {
    fn default() -> Self {
        VarColumn { offsets: vec![0], data: Vec::new(), validity: Validity::default() }
    }
}

impl VarColumn {
    fn end(&mut self) -> Result<()> {
        let end = i32::try_from(self.data.len()).map_err(|_| FormatError::TooLarge(MAX_COLUMN_BYTES))?;
        self.offsets.push(end);
        Ok(())
    }

    fn clear(&mut self) {
        self.offsets.truncate(1);
        self.data.clear();
        self.validity.clear();
    }

    fn push(&mut self, value: Option<&[u8]>) -> Result<()> {
        self.data.extend_from_slice(value.unwrap_or_default());
        self.validity.push(value.is_some());
        self.end()
    }

    /// Entry `i`, or `None` when null or out of range.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        if !self.validity.is_valid(i) {
            return None;
        }
        let lo = usize::try_from(*self.offsets.get(i)?).ok()?;
        let hi = usize::try_from(*self.offsets.get(i + 1)?).ok()?;
        self.data.get(lo..hi)
    }
}

/// The most data one column may hold (Arrow's 32-bit offsets).
pub const MAX_COLUMN_BYTES: usize = i32::MAX as usize;

/// Where an entry sits: its ledger position and the offset of its first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPosition {
    pub ledger_id: i64,
    pub entry_id: i64,
    /// The Kafka-style offset of the entry's first message (batch index 0).
    pub first_offset: i64,
}

/// The columns of a run of messages, one row per message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageColumns {
    /// Kafka-style offset: the entry's first offset plus the batch index.
    pub offset: Vec<i64>,
    /// `ledger:entry:batchIndex`.
    pub message_id: VarColumn,
    /// The partition key; null when absent or empty.
    pub key: VarColumn,
    /// The payload; null for a message flagged `null_value`.
    pub value: VarColumn,
    /// Row `i`'s properties are entries `property_offsets[i]..property_offsets[i + 1]`.
    pub property_offsets: Vec<i32>,
    pub property_keys: VarColumn,
    pub property_values: VarColumn,
    /// Microseconds since the epoch.
    pub publish_time: Vec<i64>,
    /// Microseconds since the epoch; null where the producer set none.
    pub event_time: Vec<i64>,
    pub event_time_validity: Validity,
    pub producer_name: VarColumn,
}

/// Append `v` in decimal (what `write!` would, without the formatting machinery that
/// dominates a per-row cost).
fn push_decimal(out: &mut Vec<u8>, v: i32) {
    if v < 0 {
        out.push(b'-');
    }
    let mut digits = [0u8; 10];
    let mut n = v.unsigned_abs();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

fn micros(ms: u64) -> i64 {
    i64::try_from(ms).ok().and_then(|v| v.checked_mul(1000)).unwrap_or(i64::MAX)
}

impl MessageColumns {
    /// Empty columns.
    pub fn new() -> Self {
        MessageColumns { property_offsets: vec![0], ..Default::default() }
    }

    /// Drop every row but keep the buffers' capacity, so that filling the columns again
    /// allocates nothing.
    pub fn clear(&mut self) {
        self.offset.clear();
        for c in [
            &mut self.message_id,
            &mut self.key,
            &mut self.value,
            &mut self.property_keys,
            &mut self.property_values,
            &mut self.producer_name,
        ] {
            c.clear();
        }
        self.property_offsets.truncate(1);
        self.publish_time.clear();
        self.event_time.clear();
        self.event_time_validity.clear();
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.offset.len()
    }

    /// Bytes held in the largest variable-length column.
    pub fn data_bytes(&self) -> usize {
        [&self.message_id, &self.key, &self.value, &self.property_keys, &self.property_values, &self.producer_name]
            .iter()
            .map(|c| c.data.len())
            .max()
            .unwrap_or(0)
    }

    /// Decode the stored Pulsar entry `raw` found at `at` and append a row for each of its
    /// messages whose offset falls in `range`. Returns the number of rows appended. On an
    /// error nothing is appended.
    pub fn push_entry(&mut self, at: EntryPosition, raw: &[u8], range: Range<i64>) -> Result<usize> {
        let entry = parse_entry(raw)?;
        let data = entry.payload()?;
        let mut messages = entry.messages(&data)?;
        let producer = entry.metadata.producer_name;
        // Every appended byte comes from `raw`, `data`, or the per-row id and producer name.
        let per_row = producer.len() + 64;
        let worst = raw.len() + data.len() + messages.len() * per_row;
        if self.data_bytes().saturating_add(worst) > MAX_COLUMN_BYTES {
            return Err(FormatError::TooLarge(MAX_COLUMN_BYTES));
        }
        let publish = micros(entry.metadata.publish_time);
        // Every message id of the entry starts with "ledger:entry:".
        let prefix = format!("{}:{}:", at.ledger_id, at.entry_id);
        let mut added = 0;
        for m in &mut messages {
            let offset = at.first_offset.saturating_add(i64::from(m.batch_index.max(0)));
            if !range.contains(&offset) {
                continue;
            }
            self.push_message(prefix.as_bytes(), offset, m, publish, producer)?;
            added += 1;
        }
        Ok(added)
    }

    fn push_message(
        &mut self,
        id_prefix: &[u8],
        offset: i64,
        m: &mut Message<'_>,
        publish: i64,
        producer: &[u8],
    ) -> Result<()> {
        self.offset.push(offset);
        let id = &mut self.message_id;
        id.data.extend_from_slice(id_prefix);
        push_decimal(&mut id.data, m.batch_index);
        id.validity.push(true);
        id.end()?;
        self.key.push(m.partition_key.filter(|k| !k.is_empty()))?;
        self.value.push(if m.null_value { None } else { Some(m.payload) })?;
        // A reader sees the properties as a map: one value per key (the last one written:
        // the sort is stable), ordered by key.
        m.properties.sort_by(|a, b| a.0.cmp(b.0));
        let props = &m.properties;
        let mut i = 0;
        while i < props.len() {
            let mut last = i;
            while last + 1 < props.len() && props[last + 1].0 == props[i].0 {
                last += 1;
            }
            self.property_keys.push(Some(props[last].0))?;
            self.property_values.push(Some(props[last].1))?;
            i = last + 1;
        }
        let n =
            i32::try_from(self.property_keys.offsets.len() - 1).map_err(|_| FormatError::TooLarge(MAX_COLUMN_BYTES))?;
        self.property_offsets.push(n);
        self.publish_time.push(publish);
        self.event_time.push(if m.event_time != 0 { micros(m.event_time) } else { 0 });
        self.event_time_validity.push(m.event_time != 0);
        self.producer_name.push(Some(producer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::build::{entry, msg, Msg};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn rows_match_the_messages(entries in proptest::collection::vec((proptest::collection::vec(msg(), 1..5), any::<bool>(), 0u64..5), 1..5),
                                   lo in 0i64..8, span in 0i64..30) {
            let mut cols = MessageColumns::new();
            let mut want = Vec::new();
            let mut first_offset = 0i64;
            for (e, (msgs, batched, compression)) in entries.iter().enumerate() {
                let msgs = if *batched { msgs.clone() } else { msgs[..1].to_vec() };
                let raw = entry("kafka-1", 7, &msgs, *batched, *compression, None);
                let at = EntryPosition { ledger_id: 3, entry_id: i64::try_from(e).unwrap(), first_offset };
                let added = cols.push_entry(at, &raw, lo..lo + span).unwrap();
                let mut n = 0;
                for (i, m) in msgs.iter().enumerate() {
                    let offset = first_offset + i64::try_from(i).unwrap();
                    if (lo..lo + span).contains(&offset) {
                        let batch_index = if *batched { i64::try_from(i).unwrap() } else { -1 };
                        want.push((offset, format!("3:{e}:{batch_index}"), m.clone()));
                        n += 1;
                    }
                }
                prop_assert_eq!(added, n);
                first_offset += i64::try_from(msgs.len()).unwrap();
            }
            prop_assert_eq!(cols.rows(), want.len());
            for (row, (offset, id, m)) in want.iter().enumerate() {
                prop_assert_eq!(cols.offset[row], *offset);
                prop_assert_eq!(cols.message_id.get(row), Some(id.as_bytes()));
                prop_assert_eq!(cols.key.get(row), m.key.as_deref().filter(|k| !k.is_empty()).map(str::as_bytes));
                prop_assert_eq!(cols.value.get(row), if m.null_value { None } else { Some(&m.payload[..]) });
                prop_assert_eq!(cols.publish_time[row], 7000);
                prop_assert_eq!(cols.event_time_validity.is_valid(row), m.event_time != 0);
                if m.event_time != 0 {
                    prop_assert_eq!(cols.event_time[row], i64::try_from(m.event_time).unwrap() * 1000);
                }
                prop_assert_eq!(cols.producer_name.get(row), Some(&b"kafka-1"[..]));
                let mut props = std::collections::BTreeMap::new();
                for (k, v) in &m.props {
                    props.insert(k.as_bytes(), v.as_bytes());
                }
                let lo = usize::try_from(cols.property_offsets[row]).unwrap();
                let hi = usize::try_from(cols.property_offsets[row + 1]).unwrap();
                let got: Vec<(&[u8], &[u8])> = (lo..hi).map(|i| (cols.property_keys.get(i).unwrap(), cols.property_values.get(i).unwrap())).collect();
                prop_assert_eq!(got, props.into_iter().collect::<Vec<_>>());
            }
        }
    }

    proptest! {
        #[test]
        fn decimals_are_what_display_writes(v in any::<i32>()) {
            let mut out = Vec::new();
            push_decimal(&mut out, v);
            prop_assert_eq!(out, v.to_string().into_bytes());
        }
    }

    #[test]
    fn cleared_columns_fill_like_new_ones() {
        let msgs = [Msg {
            key: Some("k".into()),
            props: vec![("a".into(), "b".into())],
            event_time: 2,
            null_value: false,
            payload: b"v".to_vec(),
        }];
        let raw = entry("p", 1, &msgs, true, 0, None);
        let at = EntryPosition { ledger_id: 1, entry_id: 0, first_offset: 0 };
        let mut fresh = MessageColumns::new();
        fresh.push_entry(at, &raw, 0..10).unwrap();
        let mut reused = MessageColumns::new();
        reused.push_entry(at, &entry("q", 9, &msgs, false, 0, None), 0..10).unwrap();
        reused.clear();
        reused.push_entry(at, &raw, 0..10).unwrap();
        assert_eq!(reused, fresh);
    }

    #[test]
    fn a_bad_entry_appends_nothing() {
        let mut cols = MessageColumns::new();
        let at = EntryPosition { ledger_id: 1, entry_id: 0, first_offset: 0 };
        assert!(cols.push_entry(at, b"\x0e\x01garbage", 0..10).is_err());
        assert_eq!((cols.rows(), cols.message_id.offsets.len(), cols.property_offsets.len()), (0, 1, 1));
    }
}
