"""The native MESSAGE and SEND_RECEIPT encoders (rust/pulsar-wire) against the Python
reference: the frames the real client consumed, and random fields, byte for byte."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest

from core.format import Message, encode_broker_entry_metadata, entry_from_messages
from core.format import pulsar_api_pb2 as pb
from handlers.pulsar._codec import (
    CommandConnect,
    CommandConnected,
    CommandMessage,
    CommandSendReceipt,
    LocalProtocolError,
    PulsarConnection,
    Role,
    State,
    encode_message,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pulsar"
U64 = (1 << 64) - 1


def _server(broker_entry_metadata: bool = True, max_message_size: int | None = None) -> PulsarConnection:
    client, server = PulsarConnection(Role.CLIENT), PulsarConnection(Role.SERVER)
    flags = pb.FeatureFlags(supports_broker_entry_metadata=broker_entry_metadata)
    server.receive_data(client.send(CommandConnect.build(client_version="c", feature_flags=flags)))
    assert isinstance(server.next_event(), CommandConnect)
    connected: dict[str, Any] = {"server_version": "s"}
    if max_message_size is not None:
        connected["max_message_size"] = max_message_size
    server.send(CommandConnected.build(**connected))
    return server


def _message_id(ledger_id: int, entry_id: int, partition: int) -> pb.MessageIdData:
    """The message id as the native encoders write it: no partition when it is -1."""
    mid = pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)
    if partition != -1:
        mid.partition = partition
    return mid


def _reference(consumer_id: int, partition: int, delivery: tuple[Any, ...], bem: bool) -> bytes:
    ledger_id, entry_id, redelivery, ack_set, publish_time, index, entry = delivery
    prefix = encode_broker_entry_metadata(publish_time, index if index >= 0 else None) if bem else None
    mid = _message_id(ledger_id, entry_id, partition)
    return encode_message(consumer_id, mid, redelivery, entry, prefix, ack_set)


@pytest.mark.parametrize("name", ["message_lz4_batch", "message_none_single"])
def test_golden_message_frames_come_out_the_same(name: str) -> None:
    raw = (FIXTURES / f"{name}.bin").read_bytes()
    client = PulsarConnection(Role.CLIENT)
    client.state = State.CONNECTED
    client.receive_data(raw)
    event = client.next_event()
    assert isinstance(event, CommandMessage) and event.broker_entry_metadata is not None
    bem = event.broker_entry_metadata
    mid = event.message_id
    delivery = (mid.ledgerId, mid.entryId, event.redelivery_count, list(event.ack_set) or None,
                bem.broker_timestamp, bem.index, event.entry)
    assert _server().encode_messages(event.consumer_id, mid.partition, [delivery]) == raw


@pytest.mark.parametrize("bem", [True, False])
def test_random_deliveries_match_the_python_encoder(bem: bool) -> None:
    rng = random.Random(0xC0DEC + bem)
    server = _server(broker_entry_metadata=bem)
    entries = [
        entry_from_messages([Message(payload=rng.randbytes(rng.randrange(0, 300)))],
                            producer_name="p", sequence_id=i, publish_time=i)
        for i in range(8)
    ]
    for _ in range(300):
        consumer_id = rng.choice([0, 1, 127, 128, rng.getrandbits(64)])
        partition = rng.choice([-1, 0, 5, 2**31 - 1, -2])
        deliveries = [
            (rng.choice([0, rng.getrandbits(20), U64]), rng.choice([0, rng.getrandbits(40), U64]),
             rng.choice([0, 1, 300, 2**32 - 1]),
             rng.choice([None, [], [rng.getrandbits(63) - 2**62 for _ in range(rng.randrange(1, 4))]]),
             rng.choice([0, rng.getrandbits(41)]), rng.choice([-1, 0, rng.getrandbits(50)]),
             rng.choice(entries))
            for _ in range(rng.randrange(0, 5))
        ]
        want = b"".join(_reference(consumer_id, partition, d, bem) for d in deliveries)
        assert server.encode_messages(consumer_id, partition, deliveries) == want


def test_receipts_match_the_python_encoder() -> None:
    rng = random.Random(7)
    server = _server()
    rows, wants = [], []
    for _ in range(300):
        fields = (rng.getrandbits(64), rng.getrandbits(64), rng.choice([0, rng.getrandbits(30), U64]),
                  rng.choice([0, rng.getrandbits(30), U64]), rng.choice([-1, 0, 3, -2]), rng.getrandbits(64))
        producer_id, sequence_id, ledger_id, entry_id, partition, highest = fields
        want = server.send(CommandSendReceipt.build(
            producer_id=producer_id, sequence_id=sequence_id, highest_sequence_id=highest,
            message_id=_message_id(ledger_id, entry_id, partition)))
        assert server.encode_send_receipts([fields]) == want
        rows.append(fields)
        wants.append(want)
    # many receipts in one call: the same frames back to back, in the rows' order
    assert server.encode_send_receipts(rows) == b"".join(wants)
    assert server.encode_send_receipts([]) == b""


def test_a_frame_over_the_clients_limit_is_refused() -> None:
    server = _server(max_message_size=1024)
    entry = entry_from_messages([Message(payload=b"x" * 20_000)], producer_name="p",
                                sequence_id=1, publish_time=1)
    small = entry_from_messages([Message(payload=b"x")], producer_name="p", sequence_id=1,
                                publish_time=1)
    with pytest.raises(LocalProtocolError, match="exceeds"):
        server.encode_messages(1, -1, [(1, 1, 0, None, 1, 0, small), (1, 2, 0, None, 1, 0, entry)])


def test_only_a_connected_server_encodes_hot_frames() -> None:
    client = PulsarConnection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.encode_messages(1, -1, [])
    with pytest.raises(LocalProtocolError):
        PulsarConnection(Role.SERVER).encode_send_receipts([(1, 1, 1, 1, -1, 1)])


def test_bad_delivery_tuples_are_type_errors_not_crashes() -> None:
    server = _server()
    with pytest.raises((TypeError, LocalProtocolError)):
        server.encode_messages(1, -1, [(1, 2, 3)])  # type: ignore[list-item]
    with pytest.raises((TypeError, LocalProtocolError, OverflowError)):
        server.encode_messages(1, -1, [(-1, 2, 0, None, 0, 0, b"")])
    assert struct.unpack(">I", server.encode_messages(1, -1, [(1, 2, 0, None, 0, 0, b"")])[:4])


# --------------------------------------------------------------------------- SEND scan


def _send_frames() -> list[bytes]:
    frames = [p.read_bytes() for p in sorted(FIXTURES.glob("send_*.bin"))]
    md = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=4, deliver_at_time=9,
                            partition_key="k", replicate_to=["a", "b"], ordering_key=b"\xff")
    md.properties.add(key="x", value="y")
    entry = entry_from_messages([Message(payload=b"abc")], producer_name="p", sequence_id=1,
                                publish_time=2)
    for metadata_entry in (entry, _encode(md, b"payload")):
        base = pb.BaseCommand(type=pb.BaseCommand.SEND)
        base.send.producer_id, base.send.sequence_id, base.send.num_messages = 1, 2, 3
        base.send.highest_sequence_id, base.send.is_chunk = 5, True
        frames.append(_frame(base, metadata_entry))
    return frames


def _encode(md: pb.MessageMetadata, payload: bytes) -> bytes:
    from core.format import encode_entry

    return encode_entry(md, payload)


def _frame(base: pb.BaseCommand, tail: bytes) -> bytes:
    command = base.SerializeToString()
    return struct.pack(">II", 4 + len(command) + len(tail), len(command)) + command + tail


def _both_ways(raw: bytes) -> tuple[Any, Any]:
    """(the plain-SEND decoding or None, the general decoding or the error it raised)."""
    total, command_size = struct.unpack_from(">II", raw)
    command, rest = raw[8 : 8 + command_size], raw[8 + command_size : 4 + total]
    plain = _server()._decode_plain_send(command, rest)
    try:
        general: Any = _server()._decode_general(command, rest)
    except Exception as exc:
        general = exc
    return plain, general


def test_plain_sends_decode_as_the_general_decoder_does() -> None:
    for raw in _send_frames():
        plain, general = _both_ways(raw)
        assert plain is not None, raw
        assert plain == general


def test_mutated_sends_decode_the_same_or_fall_back() -> None:
    from tests.handlers.pulsar.test_codec import _mutate

    rng = random.Random(0x5E4D)
    corpus = _send_frames()
    fast = 0
    for _ in range(3000):
        raw = _mutate(rng, rng.choice(corpus))
        if len(raw) < 8 or struct.unpack_from(">I", raw)[0] + 4 != len(raw):
            raw = struct.pack(">I", max(len(raw) - 4, 0)) + raw[4:]
        if len(raw) < 8 or struct.unpack_from(">I", raw, 4)[0] > len(raw) - 8:
            continue
        plain, general = _both_ways(raw)
        if plain is not None:
            fast += 1
            assert plain == general, raw
    assert fast > 100


def test_sends_lacking_required_fields_are_left_to_the_general_decoder() -> None:
    import crc32c

    def frame(send: pb.CommandSend, metadata: pb.MessageMetadata) -> bytes:
        command = pb.BaseCommand(type=pb.BaseCommand.SEND, send=send).SerializePartialToString()
        meta = metadata.SerializePartialToString()
        body = struct.pack(">I", len(meta)) + meta + b"payload"
        entry = struct.pack(">HI", 0x0E01, crc32c.crc32c(body)) + body
        return struct.pack(">II", 4 + len(command) + len(entry), len(command)) + command + entry

    good_send = pb.CommandSend(producer_id=1, sequence_id=1)
    good_meta = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    half_property = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    half_property.properties.add(key="k")
    for raw in (frame(pb.CommandSend(producer_id=1), good_meta),
                frame(good_send, pb.MessageMetadata(producer_name="p", sequence_id=1)),
                frame(good_send, half_property)):
        plain, general = _both_ways(raw)
        assert plain is None
        assert isinstance(general, Exception) and "required" in str(general)
    assert _both_ways(frame(good_send, good_meta))[0] is not None


# --------------------------------------------------------------------------- ACK scan


def _ack_frame(ack: pb.CommandAck) -> bytes:
    return _frame(pb.BaseCommand(type=pb.BaseCommand.ACK, ack=ack), b"")


def _random_ack(rng: random.Random) -> pb.CommandAck:
    ack = pb.CommandAck(consumer_id=rng.randrange(1 << 20), ack_type=pb.CommandAck.Individual)
    for _ in range(rng.randrange(0, 6)):
        mid = ack.message_id.add(ledgerId=rng.choice([0, 7, 1 << 40, U64]), entryId=rng.choice([0, 5, 1 << 63, U64]))
        if rng.random() < 0.4:
            mid.partition = rng.choice([-1, 0, 3])
        if rng.random() < 0.4:
            mid.batch_index, mid.batch_size = rng.choice([(-1, 0), (2, 10)])
        if rng.random() < 0.4:
            mid.ack_set.extend(rng.choice([[], [0], [-1], [5, -2, 1 << 62]]))
    if rng.random() < 0.5:
        ack.request_id = rng.randrange(1 << 30)
    return ack


def _ack_row_of(event: Any) -> tuple[Any, ...]:
    """What ``next_acks`` should give for an individual ACK the general decoder decoded."""
    cmd = event.command
    top = (1 << 63) - 1
    named = [m for m in cmd.message_id if m.ledgerId <= top and m.entryId <= top]
    sets = [list(m.ack_set) or None for m in named]
    return (cmd.consumer_id, cmd.request_id if cmd.HasField("request_id") else None,
            [(m.ledgerId, m.entryId) for m in named], sets if any(sets) else None)


def test_plain_acks_decode_as_the_general_decoder_does() -> None:
    rng = random.Random(0xAC4)
    for _ in range(300):
        raws = [_ack_frame(_random_ack(rng)) for _ in range(rng.randrange(1, 4))]
        server = _server()
        server.receive_data(b"".join(raws))
        rows = server.next_acks()
        assert server.buffered == 0
        general = _server()
        general.receive_data(b"".join(raws))
        assert rows == [_ack_row_of(general.next_event()) for _ in raws]


def test_mutated_acks_decode_the_same_or_fall_back() -> None:
    from tests.handlers.pulsar.test_codec import _mutate

    rng = random.Random(0xAC5)
    fast = 0
    for _ in range(3000):
        raw = _mutate(rng, _ack_frame(_random_ack(rng)))
        if len(raw) < 8 or struct.unpack_from(">I", raw, 4)[0] > len(raw) - 8:
            continue
        raw = struct.pack(">I", len(raw) - 4) + raw[4:]
        server = _server()
        server.receive_data(raw)
        rows = server.next_acks()
        if not rows:
            continue
        fast += 1
        general = _server()
        general.receive_data(raw)
        event = general.next_event()
        assert type(event).__name__ == "CommandAck", raw
        assert event.command.ack_type == pb.CommandAck.Individual
        assert rows == [_ack_row_of(event)], raw
    assert fast > 100


def test_acks_the_scan_does_not_take_are_left_to_the_general_decoder() -> None:
    mid = pb.MessageIdData(ledgerId=1, entryId=2)
    cumulative = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Cumulative, message_id=[mid])
    with_txn = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, message_id=[mid],
                             txnid_most_bits=1)
    with_property = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, message_id=[mid])
    with_property.properties.add(key="k", value=1)
    plain = _ack_frame(pb.CommandAck(consumer_id=9, ack_type=pb.CommandAck.Individual, message_id=[mid]))
    for other in (cumulative, with_txn, with_property):
        server = _server()
        # the plain ACK before it is taken, and the scan stops at it
        server.receive_data(plain + _ack_frame(other))
        assert [row[0] for row in server.next_acks()] == [9]
        assert server.next_acks() == []
        event = server.next_event()
        assert type(event).__name__ == "CommandAck" and event.command == other
    # an ACK lacking a required field is refused by the general decoder, as before
    server = _server()
    partial = pb.BaseCommand(type=pb.BaseCommand.ACK)
    partial.ack.consumer_id = 1
    command = partial.SerializePartialToString()
    server.receive_data(struct.pack(">II", 4 + len(command), len(command)) + command)
    assert server.next_acks() == []
    with pytest.raises(Exception, match="required"):
        server.next_event()


def test_no_acks_are_taken_before_the_connection_is_up() -> None:
    server = PulsarConnection(Role.SERVER)
    mid = pb.MessageIdData(ledgerId=1, entryId=2)
    server.receive_data(_ack_frame(pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, message_id=[mid])))
    assert server.next_acks() == []
    assert server.buffered > 0
