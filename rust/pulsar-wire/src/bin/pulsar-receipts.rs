//! `pulsar-receipts`: a Pulsar-protocol endpoint that stores nothing and answers every SEND
//! at once. It is the floor of the publish-latency benchmark: what the official client
//! measures on this machine, at a given rate, when the broker costs (almost) nothing.
//!
//! ```text
//! pulsar-receipts [--addr 127.0.0.1:0]
//! ```
//!
//! Prints `listening on ADDR` once it accepts connections. It answers CONNECT, PING,
//! PARTITIONED_METADATA (not partitioned), LOOKUP (this endpoint), PRODUCER, SEND (a
//! SEND_RECEIPT with the next entry id of the connection) and CLOSE_PRODUCER; any other
//! command, or a malformed frame, closes that connection. Each connection has its own
//! thread, and everything one read brings is answered with one write.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;

use magnetar_pulsar_wire::control::{
    bytes_field, command_body, varint_field, write_command, Field, TYPE_CLOSE_PRODUCER, TYPE_CONNECT,
    TYPE_CONNECTED, TYPE_LOOKUP, TYPE_LOOKUP_RESPONSE, TYPE_PARTITIONED_METADATA,
    TYPE_PARTITIONED_METADATA_RESPONSE, TYPE_PING, TYPE_PONG, TYPE_PRODUCER, TYPE_PRODUCER_SUCCESS,
    TYPE_SUCCESS,
};
use magnetar_pulsar_wire::{scan_send, write_send_receipt, Receipt};

const MAX_MESSAGE_SIZE: u64 = 5 * 1024 * 1024;
const MAX_FRAME: usize = MAX_MESSAGE_SIZE as usize + 64 * 1024;
const PROTOCOL_VERSION: u64 = 21;
/// CommandLookupTopicResponse.LookupType.Connect
const LOOKUP_CONNECT: u64 = 1;

struct Connection {
    service_url: String,
    next_entry: u64,
}

impl Connection {
    /// Answer one frame into `out`; None ends the connection.
    fn answer(&mut self, command: &[u8], entry: &[u8], out: &mut Vec<u8>) -> Option<()> {
        if let Some(scan) = scan_send(command, entry) {
            let s = scan.send;
            let receipt = Receipt {
                producer_id: s.producer_id, sequence_id: s.sequence_id, ledger_id: 0,
                entry_id: self.next_entry, partition: -1, highest_sequence_id: s.highest_sequence_id,
            };
            self.next_entry += 1;
            write_send_receipt(out, &receipt).ok()?;
            return Some(());
        }
        let (kind, body) = command_body(command)?;
        let request_id = || varint_field(body, 2);
        let written = match kind {
            TYPE_CONNECT => {
                let version = varint_field(body, 4).unwrap_or(0).min(PROTOCOL_VERSION);
                write_command(out, TYPE_CONNECTED, &[
                    Field::Bytes(1, b"pulsar-receipts"), Field::Varint(2, version),
                    Field::Varint(3, MAX_MESSAGE_SIZE),
                ])
            }
            TYPE_PING => write_command(out, TYPE_PONG, &[]),
            TYPE_PARTITIONED_METADATA => write_command(out, TYPE_PARTITIONED_METADATA_RESPONSE, &[
                Field::Varint(1, 0), Field::Varint(2, request_id()?), Field::Varint(3, 0),
            ]),
            TYPE_LOOKUP => write_command(out, TYPE_LOOKUP_RESPONSE, &[
                Field::Bytes(1, self.service_url.as_bytes()), Field::Varint(3, LOOKUP_CONNECT),
                Field::Varint(4, request_id()?), Field::Varint(5, 1),
            ]),
            TYPE_PRODUCER => {
                let producer_id = varint_field(body, 2)?;
                let name = bytes_field(body, 4).map_or_else(|| format!("receipts-{producer_id}"), |n| {
                    String::from_utf8_lossy(n).into_owned()
                });
                write_command(out, TYPE_PRODUCER_SUCCESS, &[
                    Field::Varint(1, varint_field(body, 3)?), Field::Bytes(2, name.as_bytes()),
                    Field::Varint(3, u64::MAX), // last_sequence_id -1: nothing stored
                ])
            }
            TYPE_CLOSE_PRODUCER => write_command(out, TYPE_SUCCESS, &[Field::Varint(1, request_id()?)]),
            // anything else, a SEND that is not plain (a chunk, a transaction) among them
            _ => return None,
        };
        written.ok().map(|_| ())
    }

    fn serve(&mut self, mut stream: TcpStream) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        let mut buf = Vec::with_capacity(1 << 20);
        let mut chunk = vec![0u8; 1 << 20];
        let mut out = Vec::with_capacity(64 * 1024);
        loop {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
            let mut pos = 0;
            while let Some(word) = buf.get(pos..pos + 4) {
                let total = u32::from_be_bytes([word[0], word[1], word[2], word[3]]) as usize;
                if !(4..=MAX_FRAME).contains(&total) {
                    return Ok(());
                }
                let Some(frame) = buf.get(pos + 4..pos + 4 + total) else { break };
                let size = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
                let Some(command) = frame.get(4..4 + size) else { return Ok(()) };
                if self.answer(command, &frame[4 + size..], &mut out).is_none() {
                    stream.write_all(&out)?;
                    return Ok(());
                }
                pos += 4 + total;
            }
            buf.drain(..pos);
            if !out.is_empty() {
                stream.write_all(&out)?;
                out.clear();
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = match args.as_slice() {
        [] => "127.0.0.1:0".to_string(),
        [flag, addr] if flag == "--addr" => addr.clone(),
        _ => {
            eprintln!("usage: pulsar-receipts [--addr HOST:PORT]");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pulsar-receipts: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(local) = listener.local_addr() else { return ExitCode::FAILURE };
    println!("listening on {local}");
    let _ = std::io::stdout().flush();
    let service_url = format!("pulsar://{local}");
    for stream in listener.incoming().flatten() {
        let mut conn = Connection { service_url: service_url.clone(), next_entry: 0 };
        std::thread::spawn(move || conn.serve(stream));
    }
    ExitCode::SUCCESS
}
