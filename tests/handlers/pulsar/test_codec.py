"""The sans-IO Pulsar codec: state table, framing, limits, real-client bytes, fuzzing.

Golden frames under tests/fixtures/pulsar/ were captured from the real ``pulsar-client``
talking to the fake broker in tests/fixtures/pulsar/_fake_broker.py.  To capture them
again: ``MAGNETAR_REGEN_FIXTURES=1 pytest tests/handlers/pulsar/test_codec.py -k real_client``.
"""

from __future__ import annotations

import doctest
import importlib.util
import logging
import os
import random
import struct
import sys
import threading
from pathlib import Path
from typing import Any

import crc32c
import pytest

import handlers.pulsar._codec
from core.format import (
    Message,
    encode_broker_entry_metadata,
    encode_entry,
    entry_from_messages,
    messages_from_entry,
)
from core.format import pulsar_api_pb2 as pb
from handlers.pulsar._codec import (
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_HEADER_ALLOWANCE,
    NEED_DATA,
    TRANSITIONS,
    CommandAck,
    CommandCloseConsumer,
    CommandCloseProducer,
    CommandConnect,
    CommandConnected,
    CommandError,
    CommandFlow,
    CommandLookupTopic,
    CommandMessage,
    CommandPartitionedTopicMetadata,
    CommandPing,
    CommandPong,
    CommandProducer,
    CommandSend,
    CommandSendReceipt,
    CommandSubscribe,
    CommandSuccess,
    ConnectionClosed,
    LocalProtocolError,
    PulsarConnection,
    RemoteProtocolError,
    Role,
    State,
    encode_message,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pulsar"
REGEN = os.environ.get("MAGNETAR_REGEN_FIXTURES") == "1"


def _load_fake_broker() -> Any:
    name = "magnetar_tests_fake_pulsar_broker"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / "_fake_broker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- helpers


def _frame(base: pb.BaseCommand, tail: bytes = b"") -> bytes:
    command = base.SerializeToString()
    return struct.pack(">II", 4 + len(command) + len(tail), len(command)) + command + tail


def _connect_frame(**fields: Any) -> bytes:
    fields.setdefault("client_version", "test")
    fields.setdefault("protocol_version", 20)
    return _frame(pb.BaseCommand(type=pb.BaseCommand.CONNECT, connect=pb.CommandConnect(**fields)))


def _server(**kwargs: Any) -> PulsarConnection:
    return PulsarConnection(Role.SERVER, **kwargs)


def _connected_pair(
    broker_entry_metadata: bool = True,
) -> tuple[PulsarConnection, PulsarConnection]:
    client, server = PulsarConnection(Role.CLIENT), _server()
    flags = pb.FeatureFlags(supports_broker_entry_metadata=broker_entry_metadata)
    server.receive_data(
        client.send(
            CommandConnect.build(client_version="c", protocol_version=20, feature_flags=flags)
        )
    )
    assert isinstance(server.next_event(), CommandConnect)
    client.receive_data(
        server.send(CommandConnected.build(server_version="s", protocol_version=20))
    )
    assert isinstance(client.next_event(), CommandConnected)
    return client, server


def _events(conn: PulsarConnection) -> list[Any]:
    out = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return out


def _entry(payload: bytes = b"hello", **meta: Any) -> bytes:
    return entry_from_messages(
        [Message(payload=payload, **meta)], producer_name="p", sequence_id=1, publish_time=2
    )


def _send_frame(entry: bytes, producer_id: int = 1, sequence_id: int = 1) -> bytes:
    base = pb.BaseCommand(type=pb.BaseCommand.SEND)
    base.send.producer_id, base.send.sequence_id = producer_id, sequence_id
    return _frame(base, entry)


def test_docstring_examples_run() -> None:
    assert doctest.testmod(handlers.pulsar._codec).failed == 0


# --------------------------------------------------------------------------- the state table

C, S = Role.CLIENT, Role.SERVER
T = pb.BaseCommand

# (state, who sends, event, legal?)
STATE_TABLE = [
    (State.AWAIT_CONNECT, C, CommandConnect.build(client_version="x"), State.CONNECTING),
    (State.AWAIT_CONNECT, C, CommandPing.build(), None),
    (State.AWAIT_CONNECT, C, CommandProducer.build(topic="t", producer_id=1, request_id=1), None),
    (State.AWAIT_CONNECT, S, CommandConnected.build(server_version="s"), None),
    (State.CONNECTING, S, CommandConnected.build(server_version="s"), State.CONNECTED),
    (State.CONNECTING, S, CommandError.build(request_id=0, error=3, message="no"), State.CLOSED),
    (State.CONNECTING, C, CommandConnect.build(client_version="x"), None),
    (State.CONNECTING, C, CommandFlow.build(consumer_id=1, messagePermits=1), None),
    (State.CONNECTED, C, CommandConnect.build(client_version="x"), None),
    (State.CONNECTED, S, CommandConnected.build(server_version="s"), None),
    (State.CONNECTED, C, CommandFlow.build(consumer_id=1, messagePermits=9), State.CONNECTED),
    (State.CONNECTED, C, CommandPing.build(), State.CONNECTED),
    (State.CONNECTED, S, CommandPing.build(), State.CONNECTED),
    (State.CONNECTED, S, CommandPong.build(), State.CONNECTED),
    (State.CONNECTED, C, CommandSuccess.build(request_id=1), None),
    (State.CONNECTED, S, CommandFlow.build(consumer_id=1, messagePermits=1), None),
    (State.CONNECTED, S, CommandSendReceipt.build(producer_id=1, sequence_id=2), State.CONNECTED),
    (State.CONNECTED, C, CommandSendReceipt.build(producer_id=1, sequence_id=2), None),
    (State.CONNECTED, S, CommandCloseProducer.build(producer_id=1, request_id=0), State.CONNECTED),
    (State.CONNECTED, C, CommandCloseProducer.build(producer_id=1, request_id=5), State.CONNECTED),
    (State.ERROR, S, CommandError.build(request_id=0, error=0, message="bye"), State.ERROR),
    (State.ERROR, S, CommandPing.build(), None),
    (State.CLOSED, C, CommandPing.build(), None),
]


@pytest.mark.parametrize(("state", "sender", "event", "after"), STATE_TABLE)
def test_state_table_on_receive_and_send(
    state: State, sender: Role, event: Any, after: Any
) -> None:
    wire = _frame(pb.BaseCommand(type=event.TYPE, **{event.FIELD: event.command}))
    # Receiving: the connection of the other role sees the bytes.
    receiver = PulsarConnection(S if sender is C else C)
    receiver.state = state
    receiver.receive_data(wire)
    if after is None:
        with pytest.raises(RemoteProtocolError) as info:
            receiver.next_event()
        assert info.value.code == pb.NotAllowedError
        assert receiver.state is State.ERROR
    elif state is State.ERROR:
        pass  # a failed connection only sends
    else:
        got = receiver.next_event()
        assert type(got) is type(event)
        assert got.command == event.command
        assert receiver.state is after
    # Sending: the connection of the sender's role encodes the same bytes.
    sender_conn = PulsarConnection(sender)
    sender_conn.state = state
    if after is None:
        with pytest.raises(LocalProtocolError):
            sender_conn.send(event)
        assert sender_conn.state is state
    else:
        data = sender_conn.send(event)
        if not isinstance(event, CommandConnected):
            assert data == wire
        assert sender_conn.state is after


def test_every_transition_is_between_known_commands() -> None:
    for (state, sender, command_type), after in TRANSITIONS.items():
        assert isinstance(state, State) and isinstance(after, State)
        assert isinstance(sender, Role)
        assert pb.BaseCommand.Type.Name(command_type)


# --------------------------------------------------------------------------- framing


def test_frame_layout_of_a_send() -> None:
    entry = _entry()
    client, _ = _connected_pair()
    data = client.send(
        CommandSend(command=pb.CommandSend(producer_id=3, sequence_id=4), entry=entry)
    )
    total, command_size = struct.unpack_from(">II", data)
    assert total == len(data) - 4
    base = pb.BaseCommand.FromString(data[8 : 8 + command_size])
    assert base.type == pb.BaseCommand.SEND
    assert (base.send.producer_id, base.send.sequence_id) == (3, 4)
    assert data[8 + command_size :] == entry


def test_send_carries_entry_metadata_and_payload() -> None:
    _, server = _connected_pair()
    entry = _entry(b"payload!", key="k", properties={"a": "b"})
    server.receive_data(_send_frame(entry, producer_id=9, sequence_id=77))
    (event,) = _events(server)
    assert isinstance(event, CommandSend)
    assert event.checksum_ok
    assert (event.producer_id, event.sequence_id) == (9, 77)
    assert event.entry == entry
    assert event.metadata.partition_key == "k"
    assert event.payload == b"payload!"


@pytest.mark.parametrize(
    "mangle",
    [
        lambda e: b"\x0e\x03" + e[2:],  # wrong magic
        lambda e: e[:-1] + bytes([e[-1] ^ 1]),  # payload flipped under the checksum
        lambda e: e[:2] + b"\0\0\0\0" + e[6:],  # zeroed checksum
        lambda e: e[:5],  # too short to hold a header
        lambda e: b"",  # no entry at all
    ],
    ids=["magic", "payload-bit", "zero-crc", "short", "empty"],
)
def test_bad_send_checksum_is_an_event_not_an_error(mangle: Any) -> None:
    _, server = _connected_pair()
    bad = mangle(_entry())
    server.receive_data(_send_frame(bad, sequence_id=5) + _send_frame(_entry(), sequence_id=6))
    first, second = _events(server)
    assert isinstance(first, CommandSend) and not first.checksum_ok
    assert first.metadata is None and first.entry == bad
    assert isinstance(second, CommandSend) and second.checksum_ok
    assert server.state is State.CONNECTED


def test_send_with_good_checksum_but_broken_metadata_is_a_remote_error() -> None:
    _, server = _connected_pair()
    body = struct.pack(">I", 1000) + b"\x0a\x01p"  # metadataSize runs past the frame
    entry = b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(body)) + body
    server.receive_data(_send_frame(entry))
    with pytest.raises(RemoteProtocolError):
        server.next_event()


def test_byte_at_a_time_gives_the_same_events() -> None:
    handshake = _connect_frame()
    stream = b"".join(
        [
            _frame(pb.BaseCommand(type=T.PING, ping=pb.CommandPing())),
            _send_frame(_entry(b"x" * 300), sequence_id=1),
            _frame(
                pb.BaseCommand(type=T.FLOW, flow=pb.CommandFlow(consumer_id=2, messagePermits=1000))
            ),
            _send_frame(_entry(b"y"), sequence_id=2),
        ]
    )

    def run(chunk: int) -> list[Any]:
        conn = _server()
        got = []
        for data, after in ((handshake, True), (stream, False)):
            for i in range(0, len(data), chunk):
                conn.receive_data(data[i : i + chunk])
                got += _events(conn)
                assert conn.buffered <= conn.max_frame_size + 4
            if after:
                conn.send(CommandConnected.build(server_version="s"))
        return got

    expected = run(len(handshake) + len(stream))
    assert run(1) == expected
    assert run(5) == expected
    assert [type(e).__name__ for e in expected] == [
        "CommandConnect",
        "CommandPing",
        "CommandSend",
        "CommandFlow",
        "CommandSend",
    ]


def test_end_of_stream() -> None:
    server = _server()
    server.receive_data(_connect_frame())
    server.receive_data(b"")
    assert isinstance(server.next_event(), CommandConnect)
    assert isinstance(server.next_event(), ConnectionClosed)
    assert server.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        server.receive_data(b"more")

    cut = _server()
    cut.receive_data(_connect_frame()[:-3])
    assert cut.next_event() is NEED_DATA
    cut.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        cut.next_event()


def test_oversize_frame_is_refused_from_its_length_alone() -> None:
    server = _server(max_message_size=1000, frame_allowance=100)
    assert server.max_frame_size == 1100
    server.receive_data(struct.pack(">I", 1101))
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == pb.NotAllowedError
    assert server.buffered == 4  # nothing of the announced frame was waited for


def test_largest_allowed_frame_is_accepted() -> None:
    _, server = _connected_pair()
    limit = DEFAULT_MAX_MESSAGE_SIZE + FRAME_HEADER_ALLOWANCE
    head = _send_frame(b"")
    filler = limit - (len(head) - 4)
    server.receive_data(struct.pack(">I", limit) + head[4:] + b"\0" * filler)
    (event,) = _events(server)
    assert isinstance(event, CommandSend) and not event.checksum_ok


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (struct.pack(">II", 2, 0), "cannot hold"),
        (struct.pack(">II", 5, 9) + b"\0", "exceeds its"),
        (struct.pack(">II", 6, 2) + b"\xff\xff", "malformed"),
        (struct.pack(">II", 6, 2) + b"\x08\x63", "unknown type"),
        (_frame(pb.BaseCommand(type=T.NEW_TXN)), "unsupported command NEW_TXN"),
        (_frame(pb.BaseCommand(type=T.CONNECT)), "lacks required"),
        (_connect_frame() + b"junk", None),
    ],
    ids=["tiny", "command-too-big", "garbage", "unknown-type", "txn", "no-body", "trailing"],
)
def test_malformed_frames_are_remote_errors(raw: bytes, match: str | None) -> None:
    server = _server()
    server.receive_data(raw)
    with pytest.raises(RemoteProtocolError, match=match):
        _events(server)
    with pytest.raises(RemoteProtocolError):
        server.next_event()
    # The connection can still say why it closes.
    assert server.send(CommandError.build(request_id=0, error=0, message="bye"))


def test_command_with_trailing_bytes_is_refused() -> None:
    server = _server()
    command = pb.BaseCommand(type=T.CONNECT, connect=pb.CommandConnect(client_version="x"))
    server.receive_data(_frame(command, b"extra"))
    with pytest.raises(RemoteProtocolError, match="unexpected bytes"):
        server.next_event()


def test_non_utf8_string_is_a_remote_error() -> None:
    server = _server()
    # CommandConnect.client_version = b"\xff"
    command = b"\x08\x02\x12\x03\x0a\x01\xff"
    server.receive_data(struct.pack(">II", 4 + len(command), len(command)) + command)
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        server.next_event()


def test_connected_announces_our_limit_and_client_learns_it() -> None:
    client = PulsarConnection(Role.CLIENT)
    server = _server(max_message_size=2048)
    server.receive_data(client.send(CommandConnect.build(client_version="c")))
    server.next_event()
    client.receive_data(server.send(CommandConnected.build(server_version="s")))
    event = client.next_event()
    assert event.max_message_size == 2048
    assert client.peer_max_message_size == 2048
    too_big = CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=1), entry=b"x" * 20_000)
    with pytest.raises(LocalProtocolError):
        client.send(too_big)


# --------------------------------------------------------------------------- MESSAGE


def test_encode_message_splices_the_entry_and_broker_metadata() -> None:
    client, server = _connected_pair(broker_entry_metadata=True)
    entry = _entry(b"stored", key="k")
    prefix = encode_broker_entry_metadata(1_700_000_000_000, 41)
    frame = server.encode_message(5, (7, 8), 2, entry, prefix, ack_set=[3])
    assert frame.endswith(prefix + entry)
    client.receive_data(frame)
    (event,) = _events(client)
    assert isinstance(event, CommandMessage)
    assert event.consumer_id == 5
    assert (event.message_id.ledgerId, event.message_id.entryId) == (7, 8)
    assert event.redelivery_count == 2 and list(event.ack_set) == [3]
    assert event.broker_entry_metadata.index == 41
    assert event.entry == entry and event.checksum_ok
    assert messages_from_entry(event.entry)[0].payload == b"stored"
    # The module-level function is the same bytes without the connection checks.
    assert (
        encode_message(5, pb.MessageIdData(ledgerId=7, entryId=8), 2, entry, prefix, [3]) == frame
    )


def test_broker_entry_metadata_is_dropped_for_clients_without_support() -> None:
    client, server = _connected_pair(broker_entry_metadata=False)
    entry = _entry()
    frame = server.encode_message(1, (1, 1), 0, entry, encode_broker_entry_metadata(1, 2))
    client.receive_data(frame)
    (event,) = _events(client)
    assert event.broker_entry_metadata is None and event.entry == entry
    sent = server.send(
        CommandMessage(
            command=pb.CommandMessage(
                consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=1)
            ),
            entry=entry,
            broker_entry_metadata=pb.BrokerEntryMetadata(index=4),
        )
    )
    assert sent == frame


def test_encode_message_needs_a_connected_server() -> None:
    with pytest.raises(LocalProtocolError):
        _server().encode_message(1, (1, 1), 0, _entry())
    client, _ = _connected_pair()
    with pytest.raises(LocalProtocolError):
        client.encode_message(1, (1, 1), 0, _entry())


def test_events_read_through_to_the_command() -> None:
    event = CommandSubscribe.build(
        topic="t", subscription="s", subType=1, consumer_id=3, request_id=4
    )
    assert event.topic == "t" and event.consumer_id == 3
    assert event.type_name == "SUBSCRIBE"
    with pytest.raises(AttributeError):
        _ = event.no_such_field


# --------------------------------------------------------------------------- real client


COMPRESSIONS = ["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]
_CLIENT_COMPRESSION = {
    "NONE": "NONE",
    "LZ4": "LZ4",
    "ZLIB": "ZLib",
    "ZSTD": "ZSTD",
    "SNAPPY": "SNAPPY",
}
BATCH_SIZE = 3


def _payload(compression: str, batched: bool, index: int) -> bytes:
    return f"golden-{compression}-{'batch' if batched else 'single'}-{index} ".encode() * 8


def _produce(pulsar: Any, client: Any, topic: str, compression: str, batched: bool) -> None:
    producer = client.create_producer(
        topic,
        producer_name=f"golden-{compression.lower()}-{'batch' if batched else 'single'}",
        compression_type=getattr(pulsar.CompressionType, _CLIENT_COMPRESSION[compression]),
        batching_enabled=batched,
        batching_max_messages=BATCH_SIZE,
        batching_max_publish_delay_ms=60_000,
        send_timeout_millis=10_000,
    )
    results: list[Any] = []
    done = threading.Event()

    def callback(result: Any, _msg_id: Any) -> None:
        results.append(result)
        if len(results) == BATCH_SIZE:
            done.set()

    count = BATCH_SIZE if batched else 1
    for i in range(count):
        kwargs: dict[str, Any] = {
            "properties": {"index": str(i), "codec": compression},
            "partition_key": f"key-{i}",
            "event_timestamp": 1_700_000_000_000 + i,
        }
        if batched:
            producer.send_async(_payload(compression, batched, i), callback, **kwargs)
        else:
            producer.send(_payload(compression, batched, i), **kwargs)
    if batched:
        producer.flush()
        assert done.wait(10), results
        assert all(str(r) == "Result.Ok" or int(r) == 0 for r in results), results
    producer.close()


@pytest.fixture
def fake_broker() -> Any:
    module = _load_fake_broker()
    with module.FakeBroker() as broker:
        yield broker
    assert not broker.errors, broker.errors


@pytest.fixture
def pulsar_client(fake_broker: Any) -> Any:
    pulsar = pytest.importorskip("pulsar")
    client = pulsar.Client(
        fake_broker.url,
        operation_timeout_seconds=10,
        connection_timeout_ms=5000,
        logger=logging.getLogger("pulsar-client"),
    )
    yield pulsar, client
    client.close()


def _frame_type(raw: bytes) -> int:
    (command_size,) = struct.unpack_from(">I", raw, 4)
    return pb.BaseCommand.FromString(raw[8 : 8 + command_size]).type


def _save(name: str, raw: bytes) -> None:
    (FIXTURES / f"{name}.bin").write_bytes(raw)


def test_real_client_produce_every_compression_batched_and_not(
    fake_broker: Any, pulsar_client: Any
) -> None:
    pulsar, client = pulsar_client
    for compression in COMPRESSIONS:
        for batched in (False, True):
            topic = f"persistent://public/default/golden-{compression.lower()}-{batched}"
            before = len(fake_broker.frames_of(CommandSend))
            _produce(pulsar, client, topic, compression, batched)
            sends = fake_broker.frames_of(CommandSend)[before:]
            assert len(sends) == 1
            event = sends[0].event
            assert event.checksum_ok
            assert pb.CompressionType.Name(event.metadata.compression) == compression
            messages = messages_from_entry(event.entry)
            count = BATCH_SIZE if batched else 1
            assert [m.payload for m in messages] == [
                _payload(compression, batched, i) for i in range(count)
            ]
            assert [m.key for m in messages] == [f"key-{i}" for i in range(count)]
            assert [m.event_time for m in messages] == [1_700_000_000_000 + i for i in range(count)]
            assert [dict(m.properties) for m in messages] == [
                {"index": str(i), "codec": compression} for i in range(count)
            ]
            assert event.metadata.HasField("num_messages_in_batch") is batched
            if REGEN:
                kind = "batch" if batched else "single"
                _save(f"send_{compression.lower()}_{kind}", sends[0].raw)
    connect = fake_broker.frames_of(CommandConnect)[0].event
    assert connect.feature_flags.supports_broker_entry_metadata
    if REGEN:
        for cls, name in [
            (CommandConnect, "connect"),
            (CommandPartitionedTopicMetadata, "partitioned_metadata"),
            (CommandLookupTopic, "lookup"),
            (CommandProducer, "producer"),
            (CommandCloseProducer, "close_producer"),
        ]:
            _save(name, fake_broker.frames_of(cls)[0].raw)


def test_real_client_consumes_what_encode_message_sends(
    fake_broker: Any, pulsar_client: Any
) -> None:
    pulsar, client = pulsar_client
    topic = "persistent://public/default/consume"
    _produce(pulsar, client, topic, "LZ4", batched=True)
    _produce(pulsar, client, topic, "NONE", batched=False)
    consumer = client.subscribe(
        topic,
        "golden-sub",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=10,
    )
    got = []
    for _ in range(BATCH_SIZE + 1):
        msg = consumer.receive(timeout_millis=10_000)
        got.append((msg.data(), msg.partition_key(), msg.event_timestamp()))
        consumer.acknowledge(msg)
    consumer.close()
    expected = [
        (_payload("LZ4", True, i), f"key-{i}", 1_700_000_000_000 + i) for i in range(BATCH_SIZE)
    ] + [(_payload("NONE", False, 0), "key-0", 1_700_000_000_000)]
    assert got == expected
    acks = [r.event for r in fake_broker.frames_of(CommandAck)]
    acked = {(m.ledgerId, m.entryId) for a in acks for m in a.message_id}
    assert acked == {(7, 0), (7, 1)}
    (subscribe,) = fake_broker.frames_of(CommandSubscribe)
    assert subscribe.event.subscription == "golden-sub"
    assert subscribe.event.initialPosition == pb.CommandSubscribe.Earliest
    flow = fake_broker.frames_of(CommandFlow)[0].event
    assert flow.messagePermits == 10
    assert fake_broker.frames_of(CommandCloseConsumer)
    messages = [f for f in fake_broker.sent if _frame_type(f) == T.MESSAGE]
    assert len(messages) == 2  # one per entry: the LZ4 batch, then the plain message
    if REGEN:
        _save("message_lz4_batch", messages[0])
        _save("message_none_single", messages[1])
        _save("subscribe", subscribe.raw)
        _save("flow", fake_broker.frames_of(CommandFlow)[0].raw)
        _save("ack", fake_broker.frames_of(CommandAck)[0].raw)
        _save("close_consumer", fake_broker.frames_of(CommandCloseConsumer)[0].raw)


# --------------------------------------------------------------------------- golden frames

GOLDEN_COMMANDS = {
    "connect": CommandConnect,
    "partitioned_metadata": CommandPartitionedTopicMetadata,
    "lookup": CommandLookupTopic,
    "producer": CommandProducer,
    "close_producer": CommandCloseProducer,
    "subscribe": CommandSubscribe,
    "flow": CommandFlow,
    "ack": CommandAck,
    "close_consumer": CommandCloseConsumer,
}


def _golden(name: str) -> bytes:
    path = FIXTURES / f"{name}.bin"
    if not path.exists():
        pytest.fail(f"missing fixture {path}; capture with MAGNETAR_REGEN_FIXTURES=1")
    return path.read_bytes()


def _decoded_after_connect(raw: bytes) -> Any:
    server = _server()
    server.receive_data(_golden("connect"))
    server.next_event()
    server.send(CommandConnected.build(server_version="s"))
    server.receive_data(raw)
    (event,) = _events(server)
    return event


def test_golden_connect() -> None:
    server = _server()
    server.receive_data(_golden("connect"))
    (event,) = _events(server)
    assert isinstance(event, CommandConnect)
    assert event.client_version.startswith("Pulsar-CPP")
    assert event.protocol_version >= 19
    assert server.peer_supports_broker_entry_metadata
    assert server.state is State.CONNECTING


@pytest.mark.parametrize("name", [n for n in GOLDEN_COMMANDS if n != "connect"])
def test_golden_commands(name: str) -> None:
    event = _decoded_after_connect(_golden(name))
    assert type(event) is GOLDEN_COMMANDS[name]
    raw = _golden(name)
    # Re-encoding the parsed command gives back the client's exact bytes.
    assert _frame(pb.BaseCommand(type=event.TYPE, **{event.FIELD: event.command})) == raw


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("kind", ["single", "batch"])
def test_golden_send(compression: str, kind: str) -> None:
    raw = _golden(f"send_{compression.lower()}_{kind}")
    event = _decoded_after_connect(raw)
    assert isinstance(event, CommandSend) and event.checksum_ok
    assert raw.endswith(event.entry)
    batched = kind == "batch"
    messages = messages_from_entry(event.entry)
    assert [m.payload for m in messages] == [
        _payload(compression, batched, i) for i in range(BATCH_SIZE if batched else 1)
    ]
    assert event.num_messages == len(messages)
    # A byte flipped in the stored entry turns into checksum_ok=False, not an error.
    flipped = bytearray(raw)
    flipped[-1] ^= 0x40
    assert not _decoded_after_connect(bytes(flipped)).checksum_ok


@pytest.mark.parametrize("name", ["message_lz4_batch", "message_none_single"])
def test_golden_message_frames_the_real_client_consumed(name: str) -> None:
    raw = _golden(name)
    client = PulsarConnection(Role.CLIENT)
    client.state = State.CONNECTED
    client.receive_data(raw)
    (event,) = _events(client)
    assert isinstance(event, CommandMessage) and event.checksum_ok
    assert event.broker_entry_metadata is not None
    messages = messages_from_entry(event.entry)
    batched = name.endswith("batch")
    assert len(messages) == (BATCH_SIZE if batched else 1)
    # encode_message reproduces the frame byte for byte.
    prefix = encode_broker_entry_metadata(
        event.broker_entry_metadata.broker_timestamp, event.broker_entry_metadata.index
    )
    again = encode_message(
        event.consumer_id, event.message_id, event.redelivery_count, event.entry, prefix
    )
    assert again == raw


# --------------------------------------------------------------------------- fuzzing


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(4)
        if kind == 0 and data:
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        elif kind == 1:
            data = data[: rng.randrange(len(data) + 1)]
        elif kind == 2:
            pos = rng.randrange(len(data) + 1)
            data[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 9)))
        else:
            pos = rng.randrange(max(len(data) - 4, 1))
            data[pos : pos + 4] = struct.pack(
                ">I", rng.choice([0, 1, 0xFFFFFFFF, rng.getrandbits(32)])
            )
    return bytes(data)


def test_fuzz_random_and_mutated_frames_raise_only_remote_protocol_error() -> None:
    rng = random.Random(0x5EED)
    corpus = [
        _connect_frame(),
        _send_frame(_entry(b"abc" * 10, key="k", properties={"a": "b"})),
        _frame(pb.BaseCommand(type=T.FLOW, flow=pb.CommandFlow(consumer_id=1, messagePermits=5))),
        encode_message(1, (2, 3), 1, _entry(), encode_broker_entry_metadata(4, 5), [1]),
    ]
    corpus += [p.read_bytes() for p in sorted(FIXTURES.glob("*.bin"))]
    for cls in handlers.pulsar._codec.COMMAND_EVENTS.values():
        command = _fill(cls.PB(), rng)
        corpus.append(_frame(pb.BaseCommand(type=cls.TYPE, **{cls.FIELD: command})))
    max_message_size = 64 * 1024
    for i in range(6000):
        role = rng.choice([Role.SERVER, Role.CLIENT])
        conn = PulsarConnection(role, max_message_size=max_message_size)
        conn.state = rng.choice([State.AWAIT_CONNECT, State.CONNECTED])
        if i % 10 == 0:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(64)))
        else:
            data = b"".join(_mutate(rng, rng.choice(corpus)) for _ in range(rng.randrange(1, 3)))
        step = rng.choice([1, 7, len(data) or 1])
        try:
            for pos in range(0, len(data), step):
                conn.receive_data(data[pos : pos + step])
                for _ in range(len(data) + 2):  # every event consumes >= 8 bytes
                    event = conn.next_event()
                    if event is NEED_DATA:
                        break
                assert conn.buffered <= conn.max_frame_size + 4 + step
            conn.receive_data(b"")
            for _ in range(len(data) + 2):
                if isinstance(conn.next_event(), ConnectionClosed):
                    break
        except RemoteProtocolError:
            pass


# --------------------------------------------------------------------------- property: every command

_INT_RANGES = {
    "TYPE_INT32": (-(2**31), 2**31 - 1),
    "TYPE_INT64": (-(2**63), 2**63 - 1),
    "TYPE_UINT32": (0, 2**32 - 1),
    "TYPE_UINT64": (0, 2**64 - 1),
}


def _random_value(fd: Any, rng: random.Random, depth: int) -> Any:
    if fd.type == fd.TYPE_STRING:
        return "".join(rng.choice("abcé/:-_ключ0123") for _ in range(rng.randrange(12)))
    if fd.type == fd.TYPE_BYTES:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(12)))
    if fd.type == fd.TYPE_BOOL:
        return rng.random() < 0.5
    if fd.type == fd.TYPE_DOUBLE:
        return rng.choice([0.0, -1.5, 1e300, rng.random()])
    if fd.type == fd.TYPE_ENUM:
        return rng.choice(fd.enum_type.values).number
    for name, (low, high) in _INT_RANGES.items():
        if fd.type == getattr(fd, name):
            return rng.choice([low, high, 0, 1, rng.randint(low, high)])
    raise AssertionError(f"unhandled field type {fd.type} of {fd.full_name}")


def _fill(message: Any, rng: random.Random, depth: int = 0) -> Any:
    for fd in message.DESCRIPTOR.fields:
        if not fd.is_required and (depth > 2 or rng.random() < 0.4):
            continue
        if fd.is_repeated:
            for _ in range(rng.randrange(3)):
                if fd.message_type is not None:
                    _fill(getattr(message, fd.name).add(), rng, depth + 1)
                else:
                    getattr(message, fd.name).append(_random_value(fd, rng, depth))
        elif fd.message_type is not None:
            _fill(getattr(message, fd.name), rng, depth + 1)
            getattr(message, fd.name).SetInParent()
        else:
            setattr(message, fd.name, _random_value(fd, rng, depth))
    return message


@pytest.mark.parametrize(
    "cls",
    sorted(handlers.pulsar._codec.COMMAND_EVENTS.values(), key=lambda c: c.TYPE),
    ids=lambda c: c.__name__,
)
def test_every_command_round_trips_from_the_role_that_sends_it(cls: Any) -> None:
    rng = random.Random(cls.TYPE)
    roles = [
        role
        for role, commands in (
            (Role.CLIENT, handlers.pulsar._codec.CLIENT_COMMANDS),
            (Role.SERVER, handlers.pulsar._codec.SERVER_COMMANDS),
        )
        if cls.TYPE in commands
    ]
    assert roles, f"{cls.__name__} is sent by nobody"
    state = {
        CommandConnect: State.AWAIT_CONNECT,
        CommandConnected: State.CONNECTING,
        handlers.pulsar._codec.CommandAuthChallenge: State.CONNECTING,
        handlers.pulsar._codec.CommandAuthResponse: State.CONNECTING,
    }.get(cls, State.CONNECTED)
    for i in range(25):
        sender_role = roles[i % len(roles)]
        sender = PulsarConnection(sender_role)
        receiver = PulsarConnection(Role.SERVER if sender_role is Role.CLIENT else Role.CLIENT)
        sender.state = receiver.state = state
        sender.client_features.supports_broker_entry_metadata = True
        fields: dict[str, Any] = {"command": _fill(cls.PB(), rng)}
        if cls in (CommandSend, CommandMessage):
            fields["entry"] = _entry(bytes(rng.getrandbits(8) for _ in range(rng.randrange(50))))
        if cls is CommandMessage and rng.random() < 0.5:
            fields["broker_entry_metadata"] = pb.BrokerEntryMetadata(index=i, broker_timestamp=7)
        event = cls(**fields)
        data = sender.send(event)
        receiver.receive_data(data)
        (got,) = _events(receiver)
        assert type(got) is cls
        assert got.command == event.command
        if cls in (CommandSend, CommandMessage):
            assert got.entry == event.entry and got.checksum_ok
        if cls is CommandMessage:
            assert got.broker_entry_metadata == fields.get("broker_entry_metadata")


# --------------------------------------------------------------------------- runs of plain SENDs


def _send_row(event: Any) -> tuple[Any, ...]:
    """What :meth:`PulsarConnection.next_sends` says of a SEND, from its general event."""
    md = event.metadata
    return (event.producer_id, event.sequence_id, event.num_messages, event.highest_sequence_id,
            event.entry, event.checksum_ok, md is not None and md.HasField("deliver_at_time"))


def _custom_send(entry: bytes, **fields: Any) -> bytes:
    base = pb.BaseCommand(type=pb.BaseCommand.SEND)
    base.send.CopyFrom(pb.CommandSend(**fields))
    return _frame(base, entry)


def test_next_sends_says_of_each_send_what_its_event_says() -> None:
    golden = [_golden(f"send_{c.lower()}_{k}") for c in COMPRESSIONS for k in ("single", "batch")]
    bad = bytearray(golden[0])
    bad[-1] ^= 0x40
    stream = golden + [
        bytes(bad),  # a wrong checksum is reported, not refused
        _send_frame(_entry(deliver_at_time=1_700_000_000_000), sequence_id=8),
        _custom_send(_entry(), producer_id=4, sequence_id=9, num_messages=5, highest_sequence_id=13),
        _custom_send(_entry(), producer_id=4, sequence_id=14, highest_sequence_id=2),
    ]
    fast, general = _connected_pair()[1], _connected_pair()[1]
    for conn in (fast, general):
        conn.receive_data(b"".join(stream))
    rows = fast.next_sends()
    assert fast.next_event() is NEED_DATA
    assert rows == [_send_row(e) for e in _events(general)]
    assert [r[6] for r in rows].count(True) == 1 and [r[5] for r in rows].count(False) == 1
    assert rows[-2][2:4] == (5, 13) and rows[-1][2:4] == (1, 2)


def test_next_sends_stops_where_the_general_decoder_must_take_over() -> None:
    sends = [_send_frame(_entry(), sequence_id=i) for i in range(5)]
    flow = _frame(pb.BaseCommand(type=T.FLOW, flow=pb.CommandFlow(consumer_id=2, messagePermits=9)))
    md = pb.MessageMetadata(producer_name="p", sequence_id=10, publish_time=2)
    md.encryption_keys.add(key="k", value=b"v")
    encrypted = _send_frame(encode_entry(md, b"sealed"), sequence_id=10)
    _, server = _connected_pair()
    server.receive_data(sends[0] + sends[1] + flow + sends[2] + encrypted + sends[3] + sends[4][:-3])
    assert [r[1] for r in server.next_sends()] == [0, 1]
    assert server.next_sends() == []
    assert isinstance(server.next_event(), CommandFlow)
    assert [r[1] for r in server.next_sends()] == [2]
    # A SEND the scan does not take (encryption keys here) is an event, in its place.
    event = server.next_event()
    assert isinstance(event, CommandSend) and event.sequence_id == 10 and event.metadata.encryption_keys
    assert [r[1] for r in server.next_sends()] == [3]
    assert server.next_sends() == [] and server.next_event() is NEED_DATA
    server.receive_data(sends[4][-3:])
    assert [r[1] for r in server.next_sends()] == [4]


def test_next_sends_leaves_frames_it_may_not_take_to_next_event() -> None:
    before_connect = _server()
    before_connect.receive_data(_send_frame(_entry()))
    assert before_connect.next_sends() == []
    with pytest.raises(RemoteProtocolError, match="may not send SEND"):
        before_connect.next_event()
    oversized = _server(max_message_size=64, frame_allowance=64)
    oversized.receive_data(_connect_frame())
    oversized.next_event()
    oversized.send(CommandConnected.build(server_version="s"))
    oversized.receive_data(_send_frame(_entry(b"x" * 20_000)))
    assert oversized.next_sends() == []
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        oversized.next_event()
