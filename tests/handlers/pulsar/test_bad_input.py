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
from handlers.pulsar._session import understands_end_of_topic
from tests._standalone import Standalone
from tests.handlers.pulsar._raw import RawClient
from tests.handlers.pulsar._receive import wait_until


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


def _terminate(standalone: Standalone, local: str) -> None:
    import urllib.request

    web = standalone.addresses["web"][0]
    req = urllib.request.Request(f"{web}/admin/v2/persistent/public/default/{local}/terminate", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 204)


def _first_message(raw: RawClient, topic: str, client_version: str) -> ev.CommandMessage:
    """Connect ``raw`` as ``client_version``, subscribe consumer 7 (Exclusive, from the
    earliest message) and return the first MESSAGE it is sent."""
    raw.connect(client_version=client_version, protocol_version=20)
    raw.send(ev.CommandSubscribe.build(topic=topic, subscription="s", subType=pb.CommandSubscribe.Exclusive,
                                       consumer_id=7, request_id=1,
                                       initialPosition=pb.CommandSubscribe.Earliest))
    assert isinstance(raw.next_event(), ev.CommandSuccess)
    raw.send(ev.CommandFlow.build(consumer_id=7, messagePermits=10))
    message = raw.next_event()
    assert isinstance(message, ev.CommandMessage)
    return message


@pytest.mark.parametrize("client_version, told", [
    ("raw-test", True),
    # The C++ client 4.2 takes REACHED_END_OF_TOPIC for an invalid message and drops its
    # connection, so it is not sent one.
    ("Pulsar-CPP-v4.2.0", False),
])
def test_terminated_topic_refuses_sends_and_tells_consumers(standalone: Standalone, unique,
                                                          client_version: str, told: bool):
    local = f"terminate-{unique}"
    topic = f"persistent://public/default/{local}"
    client = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=10)
    raw = RawClient(standalone.pulsar_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"last words")
        message = _first_message(raw, topic, client_version)
        assert message.payload == b"last words"
        _terminate(standalone, local)
        with pytest.raises(pulsar.TopicTerminated):
            producer.send(b"too late")
        raw.send(ev.CommandAck.build(consumer_id=7, ack_type=pb.CommandAck.Individual,
                                     message_id=[message.command.message_id]))
        raw.send(ev.CommandPing.build())
        first = raw.next_event()
        if told:
            assert isinstance(first, ev.CommandReachedEndOfTopic)
            assert isinstance(raw.next_event(), ev.CommandPong)
        else:
            assert isinstance(first, ev.CommandPong)
    finally:
        raw.close()
        client.close()


def test_a_consumer_that_read_and_acked_everything_hears_of_the_end_at_termination(
        standalone: Standalone, unique):
    local = f"terminate-idle-{unique}"
    topic = f"persistent://public/default/{local}"
    client = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=10)
    raw = RawClient(standalone.pulsar_url)
    try:
        client.create_producer(topic, batching_enabled=False).send(b"only")
        message = _first_message(raw, topic, "raw-test")
        raw.send(ev.CommandAck.build(consumer_id=7, ack_type=pb.CommandAck.Individual,
                                     message_id=[message.command.message_id]))
        raw.send(ev.CommandPing.build())
        assert isinstance(raw.next_event(), ev.CommandPong)  # the ack is in; nothing else came
        # Nothing is left to read, acknowledge or ask for: termination alone tells it.
        _terminate(standalone, local)
        raw.send(ev.CommandPing.build())
        assert isinstance(raw.next_event(), ev.CommandReachedEndOfTopic)
        assert isinstance(raw.next_event(), ev.CommandPong)
    finally:
        raw.close()
        client.close()


def test_sends_for_a_producer_the_broker_closed_are_dropped_and_the_connection_lives(
        standalone: Standalone, unique):
    local = f"closed-producer-{unique}"
    raw = RawClient(standalone.pulsar_url)

    def send(producer_id: int, seq: int) -> None:
        md = MessageMetadata(producer_name="raw", sequence_id=seq, publish_time=int(time.time() * 1000))
        raw.send(ev.CommandSend(command=pb.CommandSend(producer_id=producer_id, sequence_id=seq,
                                                       num_messages=1),
                                entry=encode_entry(md, b"payload")))

    try:
        raw.connect()
        raw.send(ev.CommandProducer.build(topic=local, producer_id=1, request_id=1))
        assert isinstance(raw.next_event(), ev.CommandProducerSuccess)
        _terminate(standalone, local)
        assert isinstance(raw.next_event(), ev.CommandCloseProducer)
        # A SEND the client had on the wire when it was told: dropped without an answer,
        # as Pulsar does; a SEND_ERROR would make the official client drop the connection.
        send(1, 0)
        raw.send(ev.CommandPing.build())
        assert isinstance(raw.next_event(), ev.CommandPong)
        # A producer id this broker never had still gets its error.
        send(9, 0)
        reply = raw.next_event()
        assert isinstance(reply, ev.CommandSendError) and reply.command.error == pb.NotAllowedError
        # The client may create the closed id again, and then it is a producer like any other.
        raw.send(ev.CommandProducer.build(topic=f"{local}-next", producer_id=1, request_id=2))
        assert isinstance(raw.next_event(), ev.CommandProducerSuccess)
        send(1, 1)
        receipt = raw.next_event()
        assert isinstance(receipt, ev.CommandSendReceipt) and receipt.command.sequence_id == 1
    finally:
        raw.close()


@pytest.mark.parametrize("client_version, protocol_version, understands", [
    ("Pulsar-Java-v3.0.0", 19, True),
    ("Pulsar-Go-v0.14.0", 20, True),
    ("Pulsar-CPP-v3.4.2", 20, False),
    ("Pulsar-CPP-v4.2.0", 20, False),
    ("Pulsar-CPP-v4.3.0", 21, True),
    ("Pulsar-CPP-v10.0.0", 21, True),
    ("Pulsar-Java-v1.20", 8, False),
])
def test_who_is_told_the_end_of_a_topic(client_version: str, protocol_version: int,
                                        understands: bool):
    assert understands_end_of_topic(client_version, protocol_version) is understands


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


@pytest.mark.parametrize("sub_type, domain, refused", [
    (pb.CommandSubscribe.Shared, "persistent", True),
    (pb.CommandSubscribe.Key_Shared, "persistent", True),
    (pb.CommandSubscribe.Exclusive, "non-persistent", True),
    (pb.CommandSubscribe.Failover, "persistent", False),
])
def test_read_compacted_only_on_exclusive_or_failover_persistent_subscriptions(
        standalone: Standalone, unique, sub_type: int, domain: str, refused: bool):
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        raw.send(ev.CommandSubscribe.build(topic=f"{domain}://public/default/rc-{unique}", subscription="s",
                                           subType=sub_type, consumer_id=1, request_id=1,
                                           read_compacted=True))
        reply = raw.next_event()
        while isinstance(reply, ev.CommandActiveConsumerChange):  # Failover tells who is active
            reply = raw.next_event()
        if refused:
            assert isinstance(reply, ev.CommandError) and reply.command.error == pb.NotAllowedError
        else:
            assert isinstance(reply, ev.CommandSuccess)
    finally:
        raw.close()


@pytest.mark.parametrize("subscription", ["", "  "])
def test_a_blank_subscription_name_is_refused_and_the_connection_lives_on(
        standalone: Standalone, unique, subscription: str):
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        topic = f"persistent://public/default/blank-{unique}"
        raw.send(ev.CommandSubscribe.build(topic=topic, subscription=subscription,
                                           subType=pb.CommandSubscribe.Shared, consumer_id=1, request_id=1))
        reply = raw.next_event()
        assert isinstance(reply, ev.CommandError)
        assert (reply.command.error, reply.command.message) == (pb.NotAllowedError, "Empty subscription name")
        raw.send(ev.CommandSubscribe.build(topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared,
                                           consumer_id=2, request_id=2))
        assert isinstance(raw.next_event(), ev.CommandSuccess)
    finally:
        raw.close()


def test_a_shared_subscription_serves_its_highest_priority_consumers_first(
        standalone: Standalone, unique):
    # The Python client has no priority_level; Pulsar's Java client does.
    topic = f"persistent://public/default/priority-{unique}"
    client = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=10)
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        for consumer_id, priority in ((1, 0), (2, 1)):
            raw.send(ev.CommandSubscribe.build(topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared,
                                               consumer_id=consumer_id, request_id=consumer_id,
                                               priority_level=priority))
            assert isinstance(raw.next_event(), ev.CommandSuccess)
        raw.send(ev.CommandFlow.build(consumer_id=1, messagePermits=5))
        raw.send(ev.CommandFlow.build(consumer_id=2, messagePermits=100))
        raw.send(ev.CommandPing.build())
        assert isinstance(raw.next_event(), ev.CommandPong)  # the flows are in
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(8):
            producer.send(f"m{i}".encode())
        got: dict[int, int] = {1: 0, 2: 0}
        for _ in range(8):
            message = raw.next_event()
            assert isinstance(message, ev.CommandMessage)
            got[message.command.consumer_id] += 1
        # priority 0 first, up to its permits; only then the priority-1 consumer
        assert got == {1: 5, 2: 3}
    finally:
        raw.close()
        client.close()


def test_unsubscribe_while_others_are_attached_is_refused_unless_forced(standalone: Standalone):
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        for consumer_id in (1, 2):
            raw.send(ev.CommandSubscribe.build(topic="unsub-force", subscription="s", consumer_id=consumer_id,
                                               request_id=consumer_id, subType=pb.CommandSubscribe.Shared))
            assert isinstance(raw.next_event(), ev.CommandSuccess)
        raw.send(ev.CommandUnsubscribe.build(consumer_id=1, request_id=3))
        refused = raw.next_event()
        assert isinstance(refused, ev.CommandError)
        assert (refused.command.error, refused.command.message) == (
            pb.MetadataError, "Unconnected or shared consumer attempting to unsubscribe")
        raw.send(ev.CommandUnsubscribe.build(consumer_id=1, request_id=4, force=True))
        events = [raw.next_event(), raw.next_event()]
        assert {type(e) for e in events} == {ev.CommandCloseConsumer, ev.CommandSuccess}
        closed = next(e for e in events if isinstance(e, ev.CommandCloseConsumer))
        assert closed.command.consumer_id == 2  # the other consumer was told to go
    finally:
        raw.close()


def _subscribe_raw(raw: RawClient, topic: str, sub_type: int, consumer_id: int = 1) -> None:
    raw.connect()
    raw.send(ev.CommandSubscribe.build(topic=topic, subscription="s", subType=sub_type,
                                       consumer_id=consumer_id, request_id=1,
                                       initialPosition=pb.CommandSubscribe.Earliest))
    assert isinstance(raw.next_event(), ev.CommandSuccess)


@pytest.mark.parametrize("sub_type", [pb.CommandSubscribe.Shared, pb.CommandSubscribe.Key_Shared])
def test_a_cumulative_ack_on_a_shared_subscription_acknowledges_nothing(
        standalone: Standalone, unique, sub_type):
    # One consumer of a Shared subscription must not acknowledge what the others were
    # given, or were still to be given: Pulsar's broker ignores such an ack, and so do we.
    topic = f"persistent://public/default/cum-shared-{unique}"
    client = pulsar.Client(standalone.pulsar_url)
    raw = RawClient(standalone.pulsar_url)
    try:
        honest = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared
                                  if sub_type == pb.CommandSubscribe.Shared else pulsar.ConsumerType.KeyShared,
                                  receiver_queue_size=1)
        _subscribe_raw(raw, topic, sub_type, consumer_id=9)  # grants no permits
        producer = client.create_producer(topic, batching_enabled=False)
        last = [producer.send(f"m{i}".encode()) for i in range(20)][-1]
        raw.send(ev.CommandAck.build(consumer_id=9, ack_type=pb.CommandAck.Cumulative, request_id=2,
                                     message_id=[pb.MessageIdData(ledgerId=last.ledger_id(),
                                                                  entryId=last.entry_id())]))
        assert isinstance(raw.next_event(), ev.CommandAckResponse)
        got = []
        for _ in range(20):
            msg = honest.receive(timeout_millis=10_000)
            got.append(msg.data())
            honest.acknowledge(msg)
        assert got == [f"m{i}".encode() for i in range(20)]
    finally:
        raw.close()
        client.close()


@pytest.mark.parametrize("name, command", [
    ("cumulative ack of no message", ev.CommandAck.build(consumer_id=1, ack_type=pb.CommandAck.Cumulative)),
    ("ack past a long's range", ev.CommandAck.build(
        consumer_id=1, ack_type=pb.CommandAck.Individual,
        message_id=[pb.MessageIdData(ledgerId=1, entryId=2**64 - 2)])),
    ("redelivery past a long's range", ev.CommandRedeliverUnacknowledgedMessages.build(
        consumer_id=1, message_ids=[pb.MessageIdData(ledgerId=2**64 - 2, entryId=2**64 - 2)])),
])
def test_acks_of_message_ids_no_entry_can_have_are_ignored(standalone: Standalone, unique,
                                                           name, command):
    topic = f"persistent://public/default/odd-ack-{unique}"
    client = pulsar.Client(standalone.pulsar_url)
    raw = RawClient(standalone.pulsar_url)
    try:
        client.create_producer(topic, batching_enabled=False).send(b"kept")
        _subscribe_raw(raw, topic, pb.CommandSubscribe.Exclusive)
        raw.send(command)
        # the connection is still served, and the message still unacknowledged
        raw.send(ev.CommandConsumerStats.build(consumer_id=1, request_id=2))
        stats = raw.next_event()
        assert isinstance(stats, ev.CommandConsumerStatsResponse), name
        assert stats.command.msgBacklog == 1, name
    finally:
        raw.close()
        client.close()


def test_a_seek_to_an_entry_before_a_ledgers_first_goes_to_its_start(standalone: Standalone, unique):
    topic = f"persistent://public/default/odd-seek-{unique}"
    client = pulsar.Client(standalone.pulsar_url)
    raw = RawClient(standalone.pulsar_url)
    try:
        first = client.create_producer(topic, batching_enabled=False).send(b"first")
        _subscribe_raw(raw, topic, pb.CommandSubscribe.Exclusive)
        # entry id -2 as a long, the way it arrives in the unsigned field
        raw.send(ev.CommandSeek.build(consumer_id=1, request_id=5, message_id=pb.MessageIdData(
            ledgerId=first.ledger_id(), entryId=2**64 - 2)))
        events = [raw.next_event(), raw.next_event()]
        assert [type(e) for e in events] == [ev.CommandCloseConsumer, ev.CommandSuccess]
    finally:
        raw.close()
        client.close()
    consumer = pulsar.Client(standalone.pulsar_url).subscribe(topic, "s")
    assert consumer.receive(timeout_millis=10_000).data() == b"first"


def test_topics_of_a_namespace_that_no_frame_holds_get_an_error_at_once(
        standalone: Standalone, admin, unique):
    ns = f"public/wide-{unique}"
    admin.put(f"/admin/v2/namespaces/{ns}")
    admin.put(f"/admin/v2/persistent/{ns}/wide/partitions", 200_000)  # names of over 5 MB
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        started = time.monotonic()
        raw.send(ev.CommandGetTopicsOfNamespace.build(namespace=ns, request_id=1))
        answer = raw.next_event()
        assert isinstance(answer, ev.CommandError), answer
        assert answer.command.error == pb.NotAllowedError
        assert "200000" in answer.command.message
        assert time.monotonic() - started < 1.0  # refused from the counts, no names made
    finally:
        raw.close()
    _still_serving(standalone.pulsar_url)


def test_a_consumer_that_does_not_read_is_sent_no_more_until_it_does(standalone: Standalone, admin,
                                                                     unique):
    # Permits are the client's word; a socket it does not read is the broker's cue. Without
    # it every permitted message of the backlog would wait in the broker's memory.
    topic = f"persistent://public/default/no-read-{unique}"
    client = pulsar.Client(standalone.pulsar_url)
    raw = RawClient(standalone.pulsar_url, receive_buffer=4096)
    try:
        client.subscribe(topic, "s").close()  # the subscription starts before the backlog
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(100):
            producer.send_async(b"z" * (256 << 10), None)  # 25 MB in all
        producer.flush()
        _subscribe_raw(raw, topic, pb.CommandSubscribe.Exclusive)
        raw.send(ev.CommandFlow.build(consumer_id=1, messagePermits=0xFFFFFFFF))
        path = f"/admin/v2/persistent/public/default/no-read-{unique}/stats"

        def dispatched() -> int:
            return int(admin.get(path)["subscriptions"]["s"]["msgOutCounter"])

        # until the count holds still for half a second (bounded)
        deadline, last, held_since = time.monotonic() + 20, -1, time.monotonic()
        while time.monotonic() < deadline:
            now = dispatched()
            if now != last:
                last, held_since = now, time.monotonic()
            elif time.monotonic() - held_since > 0.5:
                break
            time.sleep(0.05)
        assert 0 < last <= 60, last  # the socket's buffers and a read or two, not all 100
        received = 0
        while received < 100:  # reading lets the rest come
            if isinstance(raw.next_event(), ev.CommandMessage):
                received += 1
        assert dispatched() == 100
    finally:
        raw.close()
        client.close()


def test_a_producer_on_a_namespace_needing_more_bookies_gets_a_persistence_error(
        standalone: Standalone, admin, unique):
    # the standalone has one bookie; this namespace's ledgers want two
    ns = f"public/two-bookies-{unique}"
    admin.put(f"/admin/v2/namespaces/{ns}")
    admin.post(f"/admin/v2/namespaces/{ns}/persistence", {
        "bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2,
        "managedLedgerMaxMarkDeleteRate": 0})
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        raw.send(ev.CommandProducer.build(topic=f"persistent://{ns}/t", producer_id=1, request_id=1))
        answer = raw.next_event()
        assert isinstance(answer, ev.CommandError)
        assert answer.command.error == pb.PersistenceError  # as Pulsar answers; clients retry it
        assert "Not enough non-faulty bookies available" in answer.command.message
    finally:
        raw.close()
    _still_serving(standalone.pulsar_url)


def test_wait_for_exclusive_producers_are_told_they_wait_and_get_the_topic_in_turn(standalone, unique):
    # Pulsar's broker answers a queued WaitForExclusive producer at once with
    # producer_ready=false (the client then waits without a timeout), and hands the topic
    # to the queued producers first come, first served; one that gives up leaves the queue.
    topic = f"wait-queue-{unique}"
    raws = [RawClient(standalone.pulsar_url) for _ in range(4)]
    holder, first, gives_up, second = raws
    try:
        for raw in raws:
            raw.connect()

        def produce(raw, mode: int):
            raw.send(ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1,
                                              producer_access_mode=mode))
            return raw.next_event()

        assert produce(holder, pb.Exclusive).command.producer_ready
        for raw in (first, gives_up, second):
            answer = produce(raw, pb.WaitForExclusive)
            assert isinstance(answer, ev.CommandProducerSuccess) and not answer.command.producer_ready
        gives_up.send(ev.CommandCloseProducer.build(producer_id=1, request_id=2))
        answers = [gives_up.next_event(), gives_up.next_event()]
        assert {type(a) for a in answers} == {ev.CommandSuccess, ev.CommandError}
        # nothing more while the topic is held
        holder.send(ev.CommandCloseProducer.build(producer_id=1, request_id=2))
        assert isinstance(holder.next_event(), ev.CommandSuccess)
        ready = first.next_event()
        assert isinstance(ready, ev.CommandProducerSuccess) and ready.command.producer_ready
        assert ready.command.request_id == 1
        first.send(ev.CommandCloseProducer.build(producer_id=1, request_id=2))
        assert isinstance(first.next_event(), ev.CommandSuccess)
        ready = second.next_event()
        assert isinstance(ready, ev.CommandProducerSuccess) and ready.command.producer_ready
    finally:
        for raw in raws:
            raw.close()


def test_a_fencing_producer_fences_out_the_ones_waiting_too(standalone, admin, unique):
    # As Pulsar's broker: an ExclusiveWithFencing producer first fails every queued
    # WaitForExclusive producer (ProducerFenced), then fences the one holding the topic;
    # it alone holds the topic after.
    topic = f"fence-waiters-{unique}"
    raws = [RawClient(standalone.pulsar_url) for _ in range(3)]
    holder, waiter, fencer = raws
    try:
        for raw in raws:
            raw.connect()

        def produce(raw, mode: int, name: str):
            raw.send(ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1,
                                              producer_name=name, producer_access_mode=mode))
            return raw.next_event()

        assert produce(holder, pb.Exclusive, "holder").command.producer_ready
        assert not produce(waiter, pb.WaitForExclusive, "waiter").command.producer_ready
        assert produce(fencer, pb.ExclusiveWithFencing, "fencer").command.producer_ready
        told = waiter.next_event()
        assert isinstance(told, ev.CommandError) and told.command.error == pb.ProducerFenced
        assert isinstance(holder.next_event(), ev.CommandCloseProducer)
        stats = admin.get(f"/admin/v2/persistent/public/default/{topic}/stats")
        assert [p["producerName"] for p in stats["publishers"]] == ["fencer"]
    finally:
        for raw in raws:
            raw.close()


def test_a_wait_for_exclusive_producer_whose_client_goes_away_holds_nothing(standalone, admin, unique):
    topic = f"wait-gone-{unique}"
    holder, waiter = RawClient(standalone.pulsar_url), RawClient(standalone.pulsar_url)
    try:
        for raw in (holder, waiter):
            raw.connect()
        holder.send(ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1,
                                             producer_access_mode=pb.Exclusive))
        assert holder.next_event().command.producer_ready
        waiter.send(ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1,
                                             producer_access_mode=pb.WaitForExclusive))
        assert not waiter.next_event().command.producer_ready
        waiter.close()
        holder.send(ev.CommandCloseProducer.build(producer_id=1, request_id=2))
        assert isinstance(holder.next_event(), ev.CommandSuccess)
        # the topic is free once the broker has seen the waiter go: it holds nothing
        stats = f"/admin/v2/persistent/public/default/{topic}/stats"
        wait_until(lambda: not admin.get(stats)["publishers"])
        client = pulsar.Client(standalone.pulsar_url)
        try:
            client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive).close()
        finally:
            client.close()
    finally:
        holder.close()
        waiter.close()


@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_a_partition_past_the_count_is_refused_not_created(client, admin, unique, domain):
    base = f"parts-{unique}"
    admin.put(f"/admin/v2/{domain}/public/default/{base}/partitions", 2)
    stray = f"{domain}://public/default/{base}-partition-5"
    expected = pulsar.NotAllowedError if domain == "persistent" else pulsar.TopicNotFound
    with pytest.raises(expected):
        client.create_producer(stray)
    with pytest.raises(expected):
        client.subscribe(stray, "s")
    assert stray not in admin.get(f"/admin/v2/{domain}/public/default")
    # the partitions inside the count still come and go as before
    producer = client.create_producer(f"{domain}://public/default/{base}-partition-1")
    producer.send(b"in range")
    producer.close()
