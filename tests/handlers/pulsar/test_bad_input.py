"""Bad input on one Pulsar connection gets Pulsar's error and closes (at most) that
connection; the broker keeps serving everyone else."""

from __future__ import annotations

import struct
import time

import pulsar
import pytest

from core.format import MessageMetadata, encode_entry
from core.format import pulsar_api_pb2 as pb
from handlers.pulsar import _events as ev
from tests._standalone import Standalone
from tests.handlers.pulsar._raw import RawClient


def _still_serving(url: str) -> None:
    client = pulsar.Client(url, operation_timeout_seconds=10)
    try:
        producer = client.create_producer("still-serving", batching_enabled=False)
        consumer = client.subscribe("still-serving", f"s-{time.monotonic_ns()}",
                                    initial_position=pulsar.InitialPosition.Latest)
        producer.send(b"alive")
        assert consumer.receive(timeout_millis=10_000).data() == b"alive"
    finally:
        client.close()


def test_bad_checksum_on_send_gets_checksum_error_and_the_connection_lives_on(standalone: Standalone):
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        raw.send(ev.CommandProducer.build(topic="bad-checksum", producer_id=1, request_id=1))
        assert isinstance(raw.next_event(), ev.CommandProducerSuccess)
        md = MessageMetadata(producer_name="raw", sequence_id=0, publish_time=int(time.time() * 1000))
        entry = bytearray(encode_entry(md, b"payload"))
        entry[-1] ^= 0xFF
        raw.send(ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1),
                                entry=bytes(entry)))
        reply = raw.next_event()
        assert isinstance(reply, ev.CommandSendError)
        assert reply.command.error == pb.ChecksumError
        good = encode_entry(MessageMetadata(producer_name="raw", sequence_id=1,
                                            publish_time=int(time.time() * 1000)), b"payload")
        raw.send(ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=1, num_messages=1),
                                entry=good))
        receipt = raw.next_event()
        assert isinstance(receipt, ev.CommandSendReceipt) and receipt.command.sequence_id == 1
    finally:
        raw.close()


@pytest.mark.parametrize("junk", [
    b"\x00\x00\x00\x08\x00\x00\x00\x04garbage!",               # command bytes that are no protobuf
    struct.pack(">II", 0x7FFFFFF0, 0x10) + b"x" * 16,            # absurd total size
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                         # another protocol
])
def test_garbage_closes_only_that_connection(standalone: Standalone, junk: bytes):
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.send_raw(junk)
        raw.read_raw_until_closed()
    finally:
        raw.close()
    _still_serving(standalone.pulsar_url)


def test_command_before_connect_is_refused(standalone: Standalone):
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.send_raw(_frame(pb.BaseCommand(
            type=pb.BaseCommand.PRODUCER,
            producer=pb.CommandProducer(topic="x", producer_id=1, request_id=1))))
        data = raw.read_raw_until_closed()
        reply = pb.BaseCommand()
        reply.ParseFromString(data[8:struct.unpack(">I", data[:4])[0] + 4])
        assert reply.type == pb.BaseCommand.ERROR
    finally:
        raw.close()
    _still_serving(standalone.pulsar_url)


def _frame(cmd: pb.BaseCommand) -> bytes:
    body = cmd.SerializeToString()
    return struct.pack(">II", len(body) + 4, len(body)) + body


def test_unknown_namespace_gives_topic_not_found(standalone: Standalone):
    client = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=5)
    try:
        with pytest.raises((pulsar.TopicNotFound, pulsar.Timeout, pulsar.LookupError)):
            client.create_producer("persistent://public/no-such-ns/t")
    finally:
        client.close()
    _still_serving(standalone.pulsar_url)


def test_terminated_topic_refuses_sends_and_tells_consumers(standalone: Standalone, unique):
    import urllib.request

    local = f"terminate-{unique}"
    topic = f"persistent://public/default/{local}"
    client = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=10)
    raw = RawClient(standalone.pulsar_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"last words")
        raw.connect()
        raw.send(ev.CommandSubscribe.build(topic=topic, subscription="s", subType=pb.CommandSubscribe.Exclusive,
                                           consumer_id=7, request_id=1,
                                           initialPosition=pb.CommandSubscribe.Earliest))
        assert isinstance(raw.next_event(), ev.CommandSuccess)
        raw.send(ev.CommandFlow.build(consumer_id=7, messagePermits=10))
        message = raw.next_event()
        assert isinstance(message, ev.CommandMessage) and message.payload == b"last words"
        web = standalone.addresses["web"][0]
        req = urllib.request.Request(f"{web}/admin/v2/persistent/public/default/{local}/terminate", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status in (200, 204)
        with pytest.raises(pulsar.TopicTerminated):
            producer.send(b"too late")
        raw.send(ev.CommandAck.build(consumer_id=7, ack_type=pb.CommandAck.Individual,
                                     message_id=[message.command.message_id]))
        assert isinstance(raw.next_event(), ev.CommandReachedEndOfTopic)
    finally:
        raw.close()
        client.close()


def test_consumer_stats_and_last_message_id(standalone: Standalone, unique):
    topic = f"persistent://public/default/stats-{unique}"
    client = pulsar.Client(standalone.pulsar_url)
    raw = RawClient(standalone.pulsar_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        last = [producer.send(f"m{i}".encode()) for i in range(3)][-1]
        raw.connect()
        raw.send(ev.CommandSubscribe.build(topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared,
                                           consumer_id=3, request_id=1, consumer_name="statsy",
                                           initialPosition=pb.CommandSubscribe.Earliest))
        assert isinstance(raw.next_event(), ev.CommandSuccess)
        raw.send(ev.CommandConsumerStats.build(consumer_id=3, request_id=2))
        stats = raw.next_event()
        assert isinstance(stats, ev.CommandConsumerStatsResponse)
        assert (stats.command.consumerName, stats.command.msgBacklog, stats.command.type) == ("statsy", 3, "Shared")
        raw.send(ev.CommandGetLastMessageId.build(consumer_id=3, request_id=3))
        reply = raw.next_event()
        assert isinstance(reply, ev.CommandGetLastMessageIdResponse)
        assert (reply.command.last_message_id.ledgerId, reply.command.last_message_id.entryId) == \
            (last.ledger_id(), last.entry_id())
    finally:
        raw.close()
        client.close()
