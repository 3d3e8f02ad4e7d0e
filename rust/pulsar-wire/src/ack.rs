//! A scan of ACK frames in the shape consumers write, without building protobuf objects.
//!
//! A consumer acknowledges what it received in ACK frames that the client groups (every
//! 100 ms by default), each naming many messages. [`scan_ack`] accepts an ACK only in a
//! plain shape: a `BaseCommand` holding just `type = ACK` and `ack`; a `CommandAck` that
//! is an individual acknowledgement (`ack_type = Individual`) with `consumer_id`, the
//! message ids and optionally `request_id`, and nothing else (no properties, no
//! transaction, no validation error); and message ids of `ledgerId`, `entryId` and the
//! optional `partition`, `batch_index`, `ack_set` (packed or not) and `batch_size`, without
//! `first_chunk_message_id`. Anything else - a cumulative ack, an unknown or repeated
//! singular field, a malformed varint, bytes after the command - gives `None`, and the
//! caller decodes the frame the general way, which also says what is wrong with it.
//!
//! PulsarApi.proto: `BaseCommand.ack` is field 10 (`Type.ACK = 10`); `CommandAck` has
//! `consumer_id = 1`, `ack_type = 2`, `message_id = 3`, `validation_error = 4`,
//! `properties = 5`, `txnid_least_bits = 6`, `txnid_most_bits = 7`, `request_id = 8`;
//! `MessageIdData` has `ledgerId = 1`, `entryId = 2`, `partition = 3`, `batch_index = 4`,
//! `ack_set = 5`, `batch_size = 6`, `first_chunk_message_id = 7`.

use crate::read::{plain_body, scan_frames, Reader, Seen};
use crate::{TYPE_ACK, WIRE_LEN, WIRE_VARINT};

/// One acknowledged message id of a plain ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedId {
    pub ledger_id: u64,
    pub entry_id: u64,
    /// The batch-index ack set (its set bits the messages still unacknowledged); empty
    /// when the id acknowledges its whole entry.
    pub ack_set: Vec<i64>,
}

/// What [`scan_ack`] found in a plain individual ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckScan {
    pub consumer_id: u64,
    /// Set when the client wants an ACK_RESPONSE.
    pub request_id: Option<u64>,
    pub ids: Vec<AckedId>,
}

/// `ack_set` values, one varint or a packed run of them, onto `out`.
fn ack_set_values(r: &mut Reader<'_>, buf: &[u8], wire: u64, out: &mut Vec<i64>) -> Option<()> {
    match wire {
        WIRE_VARINT => out.push(i64::from_ne_bytes(r.varint()?.to_ne_bytes())),
        WIRE_LEN => {
            let mut packed = Reader::new(&buf[r.bytes()?]);
            while !packed.done() {
                out.push(i64::from_ne_bytes(packed.varint()?.to_ne_bytes()));
            }
        }
        _ => return None,
    }
    Some(())
}

/// A plain `MessageIdData` (see the module docs).
fn plain_message_id(buf: &[u8]) -> Option<AckedId> {
    let mut r = Reader::new(buf);
    let mut seen = Seen::default();
    let mut id = AckedId { ledger_id: 0, entry_id: 0, ack_set: Vec::new() };
    while !r.done() {
        match r.tag()? {
            (5, wire) => ack_set_values(&mut r, buf, wire, &mut id.ack_set)?,
            (number @ (1 | 2 | 3 | 4 | 6), WIRE_VARINT) => {
                let value = r.varint()?;
                match number {
                    1 => id.ledger_id = value,
                    2 => id.entry_id = value,
                    _ => {}
                }
                seen.add(number);
            }
            _ => return None,
        }
    }
    seen.all(&[1, 2])?;
    Some(id)
}

/// A plain individual `CommandAck` (see the module docs).
fn plain_ack(buf: &[u8]) -> Option<AckScan> {
    let mut r = Reader::new(buf);
    let mut seen = Seen::default();
    let mut ack = AckScan { consumer_id: 0, request_id: None, ids: Vec::new() };
    while !r.done() {
        match r.tag()? {
            (3, WIRE_LEN) => {
                let range = r.bytes()?;
                ack.ids.push(plain_message_id(&buf[range])?);
            }
            (number @ (1 | 2 | 8), WIRE_VARINT) => {
                let value = r.varint()?;
                match number {
                    1 => ack.consumer_id = value,
                    2 if value != 0 => return None, // Cumulative, or not an AckType
                    8 => ack.request_id = Some(value),
                    _ => {}
                }
                seen.add(number);
            }
            _ => return None,
        }
    }
    seen.all(&[1, 2])?;
    Some(ack)
}

/// Scan a command that should be a plain individual ACK; see the module docs.
pub fn scan_ack(command: &[u8]) -> Option<AckScan> {
    plain_ack(&command[plain_body(command, TYPE_ACK)?])
}

/// The plain ACK frames at the start of `buf`, one after another, into `found`; returns
/// how many bytes they take. Scanning stops at the first frame that is incomplete, larger
/// than `max_frame` (counting what follows its total-size field), has bytes after its
/// command, or is not a plain ACK: the caller decodes that one the general way.
pub fn scan_acks(buf: &[u8], max_frame: usize, found: &mut Vec<AckScan>) -> usize {
    scan_frames(buf, max_frame, found, |command, rest| if rest.is_empty() { scan_ack(&buf[command]) } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{len_field, varint};

    fn field(number: u64, v: u64) -> Vec<u8> {
        [varint(number << 3), varint(v)].concat()
    }

    fn message_id(ledger: u64, entry: u64, extra: &[u8]) -> Vec<u8> {
        [field(1, ledger), field(2, entry), extra.to_vec()].concat()
    }

    fn command(ack: &[u8]) -> Vec<u8> {
        [field(1, TYPE_ACK), len_field(TYPE_ACK, ack)].concat()
    }

    fn frame(command: &[u8], rest: &[u8]) -> Vec<u8> {
        let total = (4 + command.len() + rest.len()) as u32;
        [total.to_be_bytes().to_vec(), (command.len() as u32).to_be_bytes().to_vec(), command.to_vec(), rest.to_vec()]
            .concat()
    }

    fn individual(consumer: u64, ids: &[Vec<u8>], request: Option<u64>) -> Vec<u8> {
        let mut body = [field(1, consumer), field(2, 0)].concat();
        for id in ids {
            body.extend(len_field(3, id));
        }
        if let Some(r) = request {
            body.extend(field(8, r));
        }
        command(&body)
    }

    #[test]
    fn an_individual_ack_gives_its_ids_and_request() {
        let minus_one = u64::MAX; // int32 -1 as protobuf writes it
        let ids = [message_id(7, 3, &[]), message_id(7, 4, &[field(3, minus_one), field(4, minus_one)].concat())];
        let scan = scan_ack(&individual(42, &ids, Some(9))).unwrap();
        assert_eq!(scan.consumer_id, 42);
        assert_eq!(scan.request_id, Some(9));
        let got: Vec<(u64, u64)> = scan.ids.iter().map(|i| (i.ledger_id, i.entry_id)).collect();
        assert_eq!(got, vec![(7, 3), (7, 4)]);
        assert!(scan.ids.iter().all(|i| i.ack_set.is_empty()));
        assert_eq!(scan_ack(&individual(1, &ids, None)).unwrap().request_id, None);
    }

    #[test]
    fn ack_sets_are_read_packed_and_unpacked() {
        let unpacked = message_id(1, 2, &[field(5, 6), field(5, u64::MAX)].concat());
        let packed_body = [varint(6), varint(u64::MAX)].concat();
        let packed = message_id(1, 3, &len_field(5, &packed_body));
        let scan = scan_ack(&individual(1, &[unpacked, packed], None)).unwrap();
        assert_eq!(scan.ids[0].ack_set, vec![6, -1]);
        assert_eq!(scan.ids[1].ack_set, vec![6, -1]);
    }

    #[test]
    fn anything_but_the_plain_shape_is_left_to_the_general_decoder() {
        let id = message_id(1, 2, &[]);
        let cumulative = command(&[field(1, 1), field(2, 1), len_field(3, &id)].concat());
        let not_an_ack_type = command(&[field(1, 1), field(2, 5), len_field(3, &id)].concat());
        let with_txn = command(&[field(1, 1), field(2, 0), len_field(3, &id), field(6, 1)].concat());
        let with_property = command(&[field(1, 1), field(2, 0), len_field(5, &[])].concat());
        let no_consumer = command(&[field(2, 0), len_field(3, &id)].concat());
        let no_entry = command(&[field(1, 1), field(2, 0), len_field(3, &field(1, 1))].concat());
        let chunked = command(&[field(1, 1), field(2, 0), len_field(3, &message_id(1, 2, &len_field(7, &id)))].concat());
        let flow = [field(1, 11), len_field(11, &[field(1, 1), field(2, 100)].concat())].concat();
        let truncated = {
            let mut c = individual(1, std::slice::from_ref(&id), None);
            c.pop();
            c
        };
        for bad in [cumulative, not_an_ack_type, with_txn, with_property, no_consumer, no_entry, chunked, flow, truncated] {
            assert_eq!(scan_ack(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_run_of_acks_stops_at_the_first_other_frame() {
        let a = frame(&individual(1, &[message_id(5, 0, &[])], None), &[]);
        let b = frame(&individual(2, &[message_id(5, 1, &[])], Some(3)), &[]);
        let with_rest = frame(&individual(3, &[message_id(5, 2, &[])], None), b"x");
        let mut buf = [a.clone(), b.clone(), with_rest].concat();
        let mut found = Vec::new();
        assert_eq!(scan_acks(&buf, 1 << 20, &mut found), a.len() + b.len());
        assert_eq!(found.iter().map(|f| f.consumer_id).collect::<Vec<_>>(), vec![1, 2]);
        // an incomplete frame, and one over the limit, end the run too
        buf.truncate(a.len() + b.len() - 1);
        found.clear();
        assert_eq!(scan_acks(&buf, 1 << 20, &mut found), a.len());
        found.clear();
        assert_eq!(scan_acks(&buf, 8, &mut found), 0);
    }

    #[test]
    fn no_input_makes_it_panic() {
        // every prefix and every single-byte change of a valid frame is scanned safely
        let good = frame(&individual(9, &[message_id(1, 2, &field(5, 3)), message_id(1, 3, &[])], Some(1)), &[]);
        for n in 0..good.len() {
            let mut found = Vec::new();
            scan_acks(&good[..n], 1 << 20, &mut found);
            for b in [0u8, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[n] = b;
                found.clear();
                scan_acks(&bad, 1 << 20, &mut found);
            }
        }
    }
}
