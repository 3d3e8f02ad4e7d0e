//! The Pulsar protocol's hot frames for handlers/pulsar: many MESSAGE frames in one call
//! and SEND_RECEIPT frames, written by `magnetar-pulsar-wire` around the stored entry bytes
//! (one copy of each entry, straight from the Python bytes object it is stored in into the
//! bytes object returned), and the scans that pick out plain SEND and ACK frames.

use magnetar_pulsar_wire::{
    message_frame_len, scan_acks, scan_send, scan_sends, write_message, write_send_receipt, AckScan, BrokerEntry,
    Delivery, Receipt,
};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

fn wire_err(e: magnetar_pulsar_wire::WireError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// MESSAGE frames for `deliveries`, concatenated. Each delivery is a tuple
/// `(ledger_id, entry_id, redelivery_count, ack_set or None, publish_time, index, entry)`;
/// with `broker_entry_metadata` each frame carries the broker publish time and, when
/// `index >= 0`, the index. A frame longer than `max_frame` (counting what follows its
/// total-size field) raises ValueError and nothing is returned.
#[pyfunction]
pub fn encode_pulsar_messages<'py>(
    py: Python<'py>,
    consumer_id: u64,
    partition: i32,
    deliveries: &Bound<'py, PyList>,
    broker_entry_metadata: bool,
    max_frame: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    // The entries stay borrowed from their bytes objects, held here, until written.
    let mut entries: Vec<Bound<'py, PyBytes>> = Vec::with_capacity(deliveries.len());
    let mut heads = Vec::with_capacity(deliveries.len());
    for item in deliveries.iter() {
        let t = item.cast::<PyTuple>()?;
        if t.len() != 7 {
            return Err(PyValueError::new_err("a delivery is a 7-tuple"));
        }
        let ledger_id: u64 = t.get_item(0)?.extract()?;
        let entry_id: u64 = t.get_item(1)?.extract()?;
        let redelivery_count: u32 = t.get_item(2)?.extract()?;
        let ack_set: Option<Vec<i64>> = t.get_item(3)?.extract()?;
        let publish_time: i64 = t.get_item(4)?.extract()?;
        let index: i64 = t.get_item(5)?.extract()?;
        entries.push(t.get_item(6)?.cast_into::<PyBytes>()?);
        let broker_entry = broker_entry_metadata.then(|| BrokerEntry {
            publish_time: u64::try_from(publish_time).ok(),
            index: u64::try_from(index).ok(),
        });
        heads.push((ledger_id, entry_id, redelivery_count, ack_set.unwrap_or_default(), broker_entry));
    }
    let deliveries: Vec<Delivery<'_>> = heads
        .iter()
        .zip(&entries)
        .map(|((ledger_id, entry_id, redelivery_count, ack_set, broker_entry), entry)| Delivery {
            ledger_id: *ledger_id,
            entry_id: *entry_id,
            redelivery_count: *redelivery_count,
            ack_set,
            broker_entry: *broker_entry,
            entry: entry.as_bytes(),
        })
        .collect();
    // Sized and checked first, so that the frames are written once, into the result.
    let mut total = 0usize;
    for d in &deliveries {
        let n = message_frame_len(consumer_id, partition, d);
        if n - 4 > max_frame {
            return Err(PyValueError::new_err(format!(
                "frame of {} bytes for {}:{} exceeds the peer's limit of {max_frame}",
                n - 4,
                d.ledger_id,
                d.entry_id
            )));
        }
        total += n;
    }
    PyBytes::new_with(py, total, |buf| {
        let mut out: &mut [u8] = buf;
        for d in &deliveries {
            write_message(&mut out, consumer_id, partition, d).map_err(wire_err)?;
        }
        Ok(())
    })
}

/// SEND_RECEIPT frames, concatenated, one per `(producer_id, sequence_id, ledger_id,
/// entry_id, partition, highest_sequence_id)` row: the entry of that producer's sequence
/// id is stored at `ledger_id:entry_id` of `partition` (-1 when not partitioned). The
/// receipts of one stored batch leave as one bytes object.
#[pyfunction]
pub fn encode_pulsar_send_receipts<'py>(
    py: Python<'py>,
    rows: Vec<(u64, u64, u64, u64, i32, u64)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(48 * rows.len());
    for (producer_id, sequence_id, ledger_id, entry_id, partition, highest_sequence_id) in rows {
        let r = Receipt { producer_id, sequence_id, ledger_id, entry_id, partition, highest_sequence_id };
        write_send_receipt(&mut out, &r).map_err(wire_err)?;
    }
    Ok(PyBytes::new(py, &out))
}

/// Where the parts of a plain SEND lie: `(body_start, body_end, checksum_ok,
/// metadata_start, metadata_end)`, the body in `command` and the metadata in `entry` (the
/// bytes after the command); None when the frame is not a plain SEND (decode it the
/// general way).
#[pyfunction]
pub fn scan_pulsar_send(
    command: &Bound<'_, PyBytes>,
    entry: &Bound<'_, PyBytes>,
) -> Option<(usize, usize, bool, usize, usize)> {
    let scan = scan_send(command.as_bytes(), entry.as_bytes())?;
    Some((scan.body.start, scan.body.end, scan.checksum_ok, scan.metadata.start, scan.metadata.end))
}

/// One plain SEND found by [`scan_pulsar_sends`]: `(producer_id, sequence_id,
/// num_messages, highest_sequence_id, entry, checksum_ok, delayed)`.
type FoundSendRow<'py> = (u64, u64, u32, u64, Bound<'py, PyBytes>, bool, bool);

/// The plain SEND frames from `buf[start:]` on, one after another, and the position after
/// the last of them: a row `(producer_id, sequence_id, num_messages, highest_sequence_id,
/// entry, checksum_ok, delayed)` each, the entry being every byte after the command and
/// `delayed` whether its metadata holds `deliver_at_time` (the metadata of a plain SEND
/// holds no encryption keys). The run stops at the first frame that is incomplete, larger
/// than `max_frame`, or not a plain SEND, for the general decoder.
#[pyfunction]
pub fn scan_pulsar_sends<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    start: usize,
    max_frame: usize,
) -> PyResult<(Vec<FoundSendRow<'py>>, usize)> {
    scan_from(buf, start, |rest| {
        let mut found = Vec::new();
        let used = scan_sends(rest, max_frame, &mut found);
        let rows = found
            .into_iter()
            .map(|f| {
                let s = f.scan.send;
                let entry = PyBytes::new(py, &rest[f.entry]);
                (s.producer_id, s.sequence_id, s.num_messages, s.highest_sequence_id, entry, f.scan.checksum_ok, f.scan.delayed)
            })
            .collect();
        (rows, used)
    })
}

/// One plain ACK found by [`scan_pulsar_acks`]: `(consumer_id, request_id or None, ids,
/// ack_sets or None)`.
type FoundAckRow = (u64, Option<u64>, Vec<(u64, i64)>, Option<Vec<Option<Vec<i64>>>>);

/// The plain individual ACK frames from `buf[start:]` on, one after another, and the
/// position after the last of them: a row `(consumer_id, request_id or None, ids, ack_sets)`
/// each, `ids` the acknowledged `(ledger_id, entry_id)` pairs and `ack_sets` None when no
/// id carries an ack set, else one list or None per id. Ids past a signed 64-bit range
/// name no entry and are left out, with their ack sets. The run stops at the first frame
/// that is incomplete, larger than `max_frame`, or not a plain individual ACK, for the
/// general decoder.
#[pyfunction]
pub fn scan_pulsar_acks(buf: &Bound<'_, PyAny>, start: usize, max_frame: usize) -> PyResult<(Vec<FoundAckRow>, usize)> {
    scan_from(buf, start, |rest| {
        let mut found = Vec::new();
        let used = scan_acks(rest, max_frame, &mut found);
        (found.into_iter().map(ack_row).collect(), used)
    })
}

/// A scanned ACK as [`scan_pulsar_acks`] gives it.
fn ack_row(ack: AckScan) -> FoundAckRow {
    let named = ack.ids.into_iter().filter_map(|id| {
        i64::try_from(id.ledger_id).ok()?;
        let entry = i64::try_from(id.entry_id).ok()?;
        Some((id.ledger_id, entry, id.ack_set))
    });
    let mut ids = Vec::new();
    let mut sets = Vec::new();
    for (ledger, entry, set) in named {
        ids.push((ledger, entry));
        sets.push((!set.is_empty()).then_some(set));
    }
    let ack_sets = sets.iter().any(Option::is_some).then_some(sets);
    (ack.consumer_id, ack.request_id, ids, ack_sets)
}

/// Run a frame scan over `buf[start:]` (a contiguous buffer, read in place): `scan` gives
/// what it found and the bytes it took; returns that and the position after them.
fn scan_from<R>(buf: &Bound<'_, PyAny>, start: usize, scan: impl FnOnce(&[u8]) -> (R, usize)) -> PyResult<(R, usize)> {
    let view = PyBuffer::<u8>::get(buf)?;
    let rest = contiguous_bytes(&view)?.get(start..).ok_or_else(|| PyValueError::new_err("start is past the buffer"))?;
    let (found, used) = scan(rest);
    Ok((found, start + used))
}

/// The bytes of a buffer export read in place; a ValueError when they are not contiguous.
pub(crate) fn contiguous_bytes(view: &PyBuffer<u8>) -> PyResult<&[u8]> {
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err("the buffer is not contiguous"));
    }
    Ok(exported_bytes(view))
}

/// The bytes of a contiguous buffer export, read in place.
#[allow(unsafe_code)]
fn exported_bytes(view: &PyBuffer<u8>) -> &[u8] {
    // SAFETY: `view` holds the export, which keeps its object from being resized or freed
    // until it drops (a bytearray refuses to resize while exported), and the export is
    // contiguous, `len_bytes` long from `buf_ptr`. The slice lives no longer than `view`.
    unsafe { std::slice::from_raw_parts(view.buf_ptr() as *const u8, view.len_bytes()) }
}
