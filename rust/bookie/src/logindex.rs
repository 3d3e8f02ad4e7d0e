//! Index files for ledger logs: `ledgers/<ledger>.idx`.
//!
//! An index file lets [`EntryLogStorage`](crate::entrylog::EntryLogStorage) open a ledger log
//! without reading it: it lists every record of the log (kind, entry id, lac, offset, length)
//! in log order. It is written at each flush, as one appended chunk per log, after the log
//! itself has been fsynced, so it only ever describes durable log bytes:
//!
//! ```text
//! chunk  = u32 BE count | u32 BE crc32c(records) | records
//! record = u8 kind | u64 BE entry | i64 BE lac | u64 BE offset | u32 BE length   (29 bytes)
//! ```
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

/// Bytes of one index record.
pub(crate) const IDX_RECORD_LEN: usize = 1 + 8 + 8 + 8 + 4;
const CHUNK_HEADER_LEN: usize = 8;

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

/// Encode `records` as one chunk.
pub(crate) fn encode_chunk(records: &[IdxRecord]) -> Vec<u8> {
    let mut body = Vec::with_capacity(records.len() * IDX_RECORD_LEN);
    for r in records {
        body.put_u8(r.kind as u8);
        body.put_u64(r.entry);
        body.put_i64(r.lac);
        body.put_u64(r.off);
        body.put_u32(r.len);
    }
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + body.len());
    out.put_u32(u32::try_from(records.len()).unwrap_or(u32::MAX));
    out.put_u32(crc32c::crc32c(&body));
    out.extend_from_slice(&body);
    out
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
    let mut next_off = 0u64;
    while raw.len() - pos >= CHUNK_HEADER_LEN {
        let mut h = &raw[pos..pos + CHUNK_HEADER_LEN];
        let count = usize::try_from(h.get_u32()).ok()?;
        let crc = h.get_u32();
        let body_len = count.checked_mul(IDX_RECORD_LEN)?;
        let Some(body) = raw.get(pos + CHUNK_HEADER_LEN..pos + CHUNK_HEADER_LEN + body_len) else {
            break;
        };
        if count == 0 || crc32c::crc32c(body) != crc {
            break;
        }
        let mut b = body;
        let mut chunk = Vec::with_capacity(count);
        for _ in 0..count {
            let kind = match b.get_u8() {
                1 => RecordKind::Entry,
                2 => RecordKind::Fence,
                _ => return None,
            };
            let r = IdxRecord {
                kind,
                entry: b.get_u64(),
                lac: b.get_i64(),
                off: b.get_u64(),
                len: b.get_u32(),
            };
            let end = r.off.checked_add(u64::from(r.len))?;
            let too_long = usize::try_from(r.len).map_or(true, |l| l > MAX_LOG_RECORD);
            if r.off != next_off || end > log_len || r.len == 0 || too_long {
                return None;
            }
            next_off = end;
            chunk.push(r);
        }
        records.extend(chunk);
        pos += CHUNK_HEADER_LEN + body_len;
    }
    Some(Loaded {
        records,
        valid_len: pos as u64,
    })
}
