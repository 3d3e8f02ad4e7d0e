//! Index files for ledger logs: `ledgers/<ledger>.idx`.
//!
//! An index file lets [`EntryLogStorage`](crate::entrylog::EntryLogStorage) open a ledger log
//! without reading it: it lists every record of the log (kind, entry id, lac, offset, length)
//! in log order. It is written at each flush, as one appended chunk per log, after the log
//! itself has been fsynced, so it only ever describes durable log bytes:
//!
//! ```text
//! chunk   = u32 BE (count | 1<<31) | u32 BE crc32c(body) | u32 BE body length | body
//! body    = run*
//! run     = u8 kind | varint zigzag(lac) | varint entry | varint offset | varint n
//!           | varint length | (varint gap | varint length) * (n - 1)
//! ```
//!
//! A run is a stretch of records of one kind and one lac that lie back to back in the log
//! with rising entry ids: its first record's entry id and offset are written out, and each
//! later record's entry id is the previous one plus 1 plus its gap, its offset the previous
//! record's end. A stored batch of 100-byte entries then takes about 3 bytes per entry in
//! the index instead of 29, so the index written at each flush stays small beside the log.
//! Varints are unsigned LEB128. Files written before this encoding hold chunks whose count
//! has the top bit clear, with fixed 29-byte records (`u8 kind | u64 BE entry | i64 BE lac |
//! u64 BE offset | u32 BE length`); they are still read.
//!
//! The index is derived data and never trusted beyond what it can prove: a chunk that is short
//! or fails its checksum ends it (a torn append: the log's tail is then scanned instead), and
//! records that do not tile the log exactly from offset 0 — or run past its end — make the whole
//! index void, in which case the log is scanned in full. Entries found through the index are
//! still verified by their own checksum on every read.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::{Buf, BufMut};

use crate::journal::{RecordKind, MAX_RECORD_BODY, RECORD_HEADER_LEN};

/// The longest record a ledger log can hold.
const MAX_LOG_RECORD: usize = RECORD_HEADER_LEN + MAX_RECORD_BODY;

/// Bytes of one record in the fixed encoding of older files.
const FIXED_RECORD_LEN: usize = 1 + 8 + 8 + 8 + 4;
/// Set in a chunk's count when its body holds runs (the encoding written now).
const RUNS: u32 = 1 << 31;
const FIXED_HEADER_LEN: usize = 8;
const RUNS_HEADER_LEN: usize = 12;

/// One log record as the index lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdxRecord {
    pub kind: RecordKind,
    pub entry: u64,
    pub lac: i64,
    pub off: u64,
    pub len: u32,
}

impl IdxRecord {
    /// The record's length in bytes (bounded by [`load`] to one maximal record).
    pub fn byte_len(&self) -> usize {
        usize::try_from(self.len).unwrap_or(usize::MAX)
    }
}

/// The index file of `ledger` in `dir`.
pub(crate) fn idx_path(dir: &Path, ledger: u64) -> PathBuf {
    dir.join(format!("{ledger}.idx"))
}

/// Encode `records` as one chunk of runs.
pub(crate) fn encode_chunk(records: &[IdxRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RUNS_HEADER_LEN + records.len() * 3 + 32);
    out.resize(RUNS_HEADER_LEN, 0);
    let mut rest = records;
    while let Some(first) = rest.first() {
        let n = 1 + rest
            .windows(2)
            .take_while(|w| {
                w[1].kind == w[0].kind
                    && w[1].lac == w[0].lac
                    && w[1].entry > w[0].entry
                    && w[1].off == w[0].off + u64::from(w[0].len)
            })
            .count();
        out.put_u8(first.kind as u8);
        put_varint(&mut out, zigzag(first.lac));
        put_varint(&mut out, first.entry);
        put_varint(&mut out, first.off);
        put_varint(&mut out, n as u64);
        put_varint(&mut out, u64::from(first.len));
        for w in rest[..n].windows(2) {
            put_varint(&mut out, w[1].entry - w[0].entry - 1);
            put_varint(&mut out, u64::from(w[1].len));
        }
        rest = &rest[n..];
    }
    let body_len = out.len() - RUNS_HEADER_LEN;
    let crc = crc32c::crc32c(&out[RUNS_HEADER_LEN..]);
    let mut h = &mut out[..RUNS_HEADER_LEN];
    h.put_u32(u32::try_from(records.len()).unwrap_or(u32::MAX >> 1) | RUNS);
    h.put_u32(crc);
    h.put_u32(u32::try_from(body_len).unwrap_or(u32::MAX));
    out
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at the front of `b`, consumed; `None` if it is cut short or longer than
/// 10 bytes.
fn get_varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The kind of an index record: only entries and fences are listed.
fn kind_of(byte: u8) -> Option<RecordKind> {
    RecordKind::from_u8(byte).filter(|k| *k != RecordKind::DeleteLedger)
}

/// Append `chunk` at byte `at` of the index file (created if needed). Not fsynced: the index
/// is only an accelerator, and a torn chunk is detected on load.
pub(crate) fn append_chunk(path: &Path, at: u64, chunk: &[u8]) -> std::io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.write_all_at(chunk, at)
}

/// Remove an index file; a missing one is fine.
pub(crate) fn remove(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// What [`load`] found.
pub(crate) struct Loaded {
    /// The records of the good chunks, in log order, tiling the log from offset 0.
    pub records: Vec<IdxRecord>,
    /// Bytes of the index file those chunks take; anything after is a torn append.
    pub valid_len: u64,
}

impl Loaded {
    /// The log offset the index covers up to.
    pub fn covered(&self) -> u64 {
        self.records.last().map_or(0, |r| r.off + u64::from(r.len))
    }
}

/// Read the index at `path` for a log of `log_len` bytes. `None` when there is no usable
/// index (absent, unreadable, or inconsistent with the log): scan the log instead.
pub(crate) fn load(path: &Path, log_len: u64) -> Option<Loaded> {
    let raw = fs::read(path).ok()?;
    let mut records = Vec::new();
    let mut pos = 0usize;
    let mut tiling = Tiling { next_off: 0, log_len };
    while raw.len() - pos >= FIXED_HEADER_LEN {
        let mut h = &raw[pos..];
        let count = h.get_u32();
        let crc = h.get_u32();
        let (header_len, body_len) = if count & RUNS != 0 {
            if h.len() < 4 {
                break;
            }
            (RUNS_HEADER_LEN, usize::try_from(h.get_u32()).ok()?)
        } else {
            (FIXED_HEADER_LEN, usize::try_from(count).ok()?.checked_mul(FIXED_RECORD_LEN)?)
        };
        let count = usize::try_from(count & !RUNS).ok()?;
        let Some(body) = raw.get(pos + header_len..pos + header_len + body_len) else {
            break;
        };
        if count == 0 || crc32c::crc32c(body) != crc {
            break;
        }
        let before = records.len();
        if header_len == RUNS_HEADER_LEN {
            decode_runs(body, &mut tiling, &mut records)?;
        } else {
            decode_fixed(body, &mut tiling, &mut records)?;
        }
        if records.len() - before != count {
            return None;
        }
        pos += header_len + body_len;
    }
    Some(Loaded {
        records,
        valid_len: pos as u64,
    })
}

/// Where the records read so far end, checked against the log they must tile.
struct Tiling {
    next_off: u64,
    log_len: u64,
}

impl Tiling {
    /// Accept `r` if it starts where the last one ended and fits in the log.
    fn take(&mut self, r: IdxRecord, into: &mut Vec<IdxRecord>) -> Option<()> {
        let end = r.off.checked_add(u64::from(r.len))?;
        let too_long = usize::try_from(r.len).map_or(true, |l| l > MAX_LOG_RECORD);
        if r.off != self.next_off || end > self.log_len || r.len == 0 || too_long {
            return None;
        }
        self.next_off = end;
        into.push(r);
        Some(())
    }
}

fn decode_fixed(mut b: &[u8], tiling: &mut Tiling, into: &mut Vec<IdxRecord>) -> Option<()> {
    while !b.is_empty() {
        let r = IdxRecord {
            kind: kind_of(b.get_u8())?,
            entry: b.get_u64(),
            lac: b.get_i64(),
            off: b.get_u64(),
            len: b.get_u32(),
        };
        tiling.take(r, into)?;
    }
    Some(())
}

fn decode_runs(mut b: &[u8], tiling: &mut Tiling, into: &mut Vec<IdxRecord>) -> Option<()> {
    let len = |b: &mut &[u8]| get_varint(b).and_then(|v| u32::try_from(v).ok());
    while let Some((&kind, rest)) = b.split_first() {
        b = rest;
        let kind = kind_of(kind)?;
        let lac = unzigzag(get_varint(&mut b)?);
        let mut entry = get_varint(&mut b)?;
        let off = get_varint(&mut b)?;
        let n = get_varint(&mut b)?;
        let mut r = IdxRecord { kind, entry, lac, off, len: len(&mut b)? };
        tiling.take(r, into)?;
        for _ in 1..n {
            entry = entry.checked_add(get_varint(&mut b)?)?.checked_add(1)?;
            r = IdxRecord { kind, entry, lac, off: r.off + u64::from(r.len), len: len(&mut b)? };
            tiling.take(r, into)?;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn records(spec: &[(bool, u64, i64, u32)]) -> Vec<IdxRecord> {
        let mut off = 0;
        spec.iter()
            .map(|&(fence, entry, lac, len)| {
                let r = IdxRecord {
                    kind: if fence { RecordKind::Fence } else { RecordKind::Entry },
                    entry,
                    lac,
                    off,
                    len,
                };
                off += u64::from(len);
                r
            })
            .collect()
    }

    fn load_bytes(raw: &[u8], log_len: u64) -> Option<Loaded> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("1.idx");
        fs::write(&path, raw).expect("write");
        load(&path, log_len)
    }

    proptest! {
        #[test]
        fn chunks_of_runs_read_back_as_written(
            chunks in prop::collection::vec(
                prop::collection::vec((any::<bool>(), 0u64..1 << 40, -1i64..1 << 40, 1u32..70_000), 1..40),
                1..4,
            ),
        ) {
            let all: Vec<(bool, u64, i64, u32)> = chunks.concat();
            let recs = records(&all);
            let mut raw = Vec::new();
            let mut at = 0;
            for c in &chunks {
                raw.extend(encode_chunk(&recs[at..at + c.len()]));
                at += c.len();
            }
            let log_len = recs.last().map_or(0, |r| r.off + u64::from(r.len));
            let loaded = load_bytes(&raw, log_len).expect("loads");
            prop_assert_eq!(loaded.valid_len, raw.len() as u64);
            prop_assert_eq!(loaded.records, recs);
        }
    }

    #[test]
    fn a_batch_of_small_entries_takes_a_few_bytes_each() {
        let spec: Vec<_> = (0..10_000).map(|e| (false, e, 41, 130)).collect();
        let chunk = encode_chunk(&records(&spec));
        assert!(chunk.len() <= 10_000 * 3 + 64, "{} bytes", chunk.len());
        // Striped entries (every third missing, as a bookie of E=3, Qw=2 holds them) too.
        let spec: Vec<_> =
            (0..15_000).filter(|e| e % 3 != 2).map(|e| (false, e, 41, 130)).collect();
        assert!(encode_chunk(&records(&spec)).len() <= 10_000 * 3 + 64);
    }

    #[test]
    fn runs_that_leave_a_gap_in_the_log_void_the_index() {
        let mut recs = records(&[(false, 0, -1, 50), (false, 1, -1, 50)]);
        recs[1].off += 10;
        assert!(load_bytes(&encode_chunk(&recs), 200).is_none());
        // A record past the log's end voids it too.
        let recs = records(&[(false, 0, -1, 50), (false, 1, -1, 50)]);
        assert!(load_bytes(&encode_chunk(&recs), 99).is_none());
        assert!(load_bytes(&encode_chunk(&recs), 100).is_some());
    }

    #[test]
    fn a_torn_chunk_of_runs_ends_the_index_at_the_chunk_before() {
        let recs = records(&[(false, 0, -1, 50), (false, 1, 0, 50), (true, 0, -1, 30)]);
        let mut raw = encode_chunk(&recs[..1]);
        let first = raw.len();
        raw.extend(encode_chunk(&recs[1..]));
        for cut in first..raw.len() {
            let loaded = load_bytes(&raw[..cut], 130).expect("loads");
            assert_eq!(loaded.valid_len, first as u64, "cut at {cut}");
            assert_eq!(loaded.records, recs[..1].to_vec());
        }
    }

    #[test]
    fn varints_round_trip_and_reject_overlong_input() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut s = &b[..];
            assert_eq!(get_varint(&mut s), Some(v));
            assert!(s.is_empty());
        }
        assert_eq!(get_varint(&mut &[0x80u8; 11][..]), None);
        assert_eq!(get_varint(&mut &[0x80u8][..]), None);
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }
}
