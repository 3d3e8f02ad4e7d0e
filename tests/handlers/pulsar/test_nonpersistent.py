"""Non-persistent topics (``non-persistent://``) with the official pulsar-client against
`magnetar standalone`: nothing stored, delivered only to the consumers connected when a
message is published, within their permits."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pulsar
import pytest

from core.format import MessageMetadata, encode_entry
from core.format import pulsar_api_pb2 as pb
from core.naming import TopicName
from core.nonpersistent import NON_PERSISTENT_POSITION, NonPersistentTopic, NotAllowedError
from core.stats import BrokerStats
from core.storage import Position
from core.subscription import Consumer, SubType
from core.topic import PublishResult
from gateway._admin_cli import AdminClient, AdminError
from handlers.pulsar import _events as ev
from tests._standalone import Standalone
from tests.handlers.pulsar._raw import RawClient
from tests.handlers.pulsar._receive import receive_until_idle as _drain
from tests.handlers.pulsar._receive import wait_until

RECEIVE_MS = 10_000
IDLE_MS = 1500
NS = "public/default"

SUB_TYPES = [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Shared,
             pulsar.ConsumerType.Failover, pulsar.ConsumerType.KeyShared]


def _receive(consumer, n: int) -> list:
    """Exactly `n` messages (each awaited up to RECEIVE_MS), acknowledged."""
    got = []
    for _ in range(n):
        msg = consumer.receive(timeout_millis=RECEIVE_MS)
        consumer.acknowledge(msg)
        got.append(msg)
    return got



def _consumers_of(admin: AdminClient, name: str, sub: str) -> int:
    try:
        stats = admin.get(f"/admin/v2/non-persistent/{NS}/{name}/stats")
    except AdminError:
        return 0
    return len(stats["subscriptions"].get(sub, {}).get("consumers", []))


def _np(name: str) -> str:
    return f"non-persistent://{NS}/{name}"


@pytest.mark.parametrize("sub_type", SUB_TYPES, ids=lambda t: str(t).rsplit(".", 1)[-1])
@pytest.mark.parametrize("batching", [False, True])
def test_connected_consumer_receives_every_subscription_type(client, unique, sub_type, batching):
    topic = _np(f"types-{unique}")
    consumer = client.subscribe(topic, "sub", consumer_type=sub_type)
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_messages=10,
                                      batching_max_publish_delay_ms=5)
    payloads = [f"m-{i}".encode() for i in range(50)]
    for i, p in enumerate(payloads):
        producer.send_async(p, None, partition_key=f"k{i % 5}")
    producer.flush()
    got = _receive(consumer, len(payloads))
    assert [m.data() for m in got] == payloads
    assert all(m.topic_name() == topic for m in got)


def test_reader_from_earliest_or_latest_gets_what_is_published_while_it_reads(client, unique):
    topic = _np(f"reader-{unique}")
    client.create_producer(topic).send(b"before")
    for start in (pulsar.MessageId.earliest, pulsar.MessageId.latest):
        reader = client.create_reader(topic, start)
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"a")
        producer.send(b"b")
        # Had "before" been kept, it would be read first.
        assert [reader.read_next(RECEIVE_MS).data() for _ in range(2)] == [b"a", b"b"]
        reader.close()
        producer.close()


def test_receipt_and_delivery_carry_pulsars_non_persistent_message_id(client, unique):
    topic = _np(f"ids-{unique}")
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    sent = producer.send(b"x")
    msg = consumer.receive(timeout_millis=RECEIVE_MS)
    assert msg.data() == b"x"
    assert (sent.ledger_id(), sent.entry_id()) == (0, 0)
    assert (msg.message_id().ledger_id(), msg.message_id().entry_id()) == (0, 0)


def test_shared_consumers_split_messages_once(client, unique):
    topic = _np(f"shared-{unique}")
    consumers = [client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared) for _ in range(3)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(90):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    # Round robin over consumers that all have permits: thirty each.
    per = [[m.data() for m in _receive(c, 30)] for c in consumers]
    assert sorted(int(d) for got in per for d in got) == list(range(90))


def test_key_shared_keeps_each_key_on_one_consumer_in_order(client, unique):
    topic = _np(f"keys-{unique}")
    consumers = [client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared) for _ in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{i}" for i in range(20)]
    for round_ in range(5):
        for k in keys:
            producer.send_async(f"{k}:{round_}".encode(), None, partition_key=k)
    producer.flush()
    owner: dict[str, int] = {}
    per_key: dict[str, list[int]] = {}
    deadline = time.monotonic() + RECEIVE_MS / 1000
    received = 0
    while received < len(keys) * 5:
        assert time.monotonic() < deadline, f"only {received} messages arrived"
        for n, c in enumerate(consumers):
            try:
                m = c.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            received += 1
            k, r = m.data().decode().split(":")
            assert owner.setdefault(k, n) == n, f"{k} went to two consumers"
            per_key.setdefault(k, []).append(int(r))
    assert per_key == {k: list(range(5)) for k in keys}
    assert len(set(owner.values())) == 2


def test_every_subscription_gets_its_copy(client, unique):
    topic = _np(f"fanout-{unique}")
    a = client.subscribe(topic, "a")
    b = client.subscribe(topic, "b", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    producer.send(b"one")
    assert a.receive(timeout_millis=RECEIVE_MS).data() == b"one"
    assert b.receive(timeout_millis=RECEIVE_MS).data() == b"one"


def test_chunks_sent_to_a_non_persistent_topic_are_answered(standalone, client, unique):
    """The official client chunks only on persistent topics; a client that sends chunks
    to a non-persistent one gets each answered, and its consumer each chunk."""
    topic = f"non-persistent://{NS}/np-chunk-{unique}"
    consumer = client.subscribe(topic, "s")
    raw = RawClient(standalone.pulsar_url)
    try:
        raw.connect()
        raw.send(ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1))
        assert isinstance(raw.next_event(), ev.CommandProducerSuccess)
        for chunk_id in range(2):
            md = MessageMetadata(producer_name="raw", sequence_id=0, publish_time=int(time.time() * 1000),
                                 uuid="raw-0", num_chunks_from_msg=2, total_chunk_msg_size=4,
                                 chunk_id=chunk_id)
            raw.send(ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1),
                                    entry=encode_entry(md, b"ab" if chunk_id == 0 else b"cd")))
            receipt = raw.next_event()
            assert isinstance(receipt, ev.CommandSendReceipt), receipt
    finally:
        raw.close()
    assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"abcd"


def test_message_produced_without_consumer_is_not_delivered_later(client, unique):
    topic = _np(f"late-{unique}")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"nobody-listening")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"heard")
    # Had the first message been kept, it would come first.
    assert [m.data() for m in _receive(consumer, 1)] == [b"heard"]
    # The subscription outlives its consumer, but keeps nothing: what was published meanwhile is gone.
    consumer.close()
    producer.send(b"while-away")
    again = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"back")
    assert [m.data() for m in _receive(again, 1)] == [b"back"]


def test_consumer_out_of_permits_loses_what_it_cannot_take(client, unique):
    topic = _np(f"permits-{unique}")
    consumer = client.subscribe(topic, "sub", receiver_queue_size=10)
    producer = client.create_producer(topic, batching_enabled=False)
    payloads = [f"p-{i}".encode() for i in range(40)]
    for p in payloads:
        producer.send(p)  # each receipt is immediate; the consumer is not reading
    assert [m.data() for m in _receive(consumer, 10)] == payloads[:10]
    # Receiving gave permits back; the next message is the first published after that.
    producer.send(b"after")
    assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"after"


def test_acks_and_negative_acks_are_accepted_and_ignored(client, unique):
    topic = _np(f"acks-{unique}")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                negative_ack_redelivery_delay_ms=100)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"a")
    producer.send(b"b")
    first = consumer.receive(timeout_millis=RECEIVE_MS)
    second = consumer.receive(timeout_millis=RECEIVE_MS)
    consumer.acknowledge(first)
    consumer.negative_acknowledge(second)
    consumer.redeliver_unacknowledged_messages()
    assert _drain(consumer) == []
    producer.send(b"c")
    assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"c"


def test_seek_and_last_message_id_answer_not_allowed(client, unique):
    topic = _np(f"seek-{unique}")
    consumer = client.subscribe(topic, "sub")
    with pytest.raises(pulsar.NotAllowedError):
        consumer.seek(pulsar.MessageId.earliest)
    with pytest.raises(pulsar.NotAllowedError):
        consumer.get_last_message_id()
    producer = client.create_producer(topic)
    producer.send(b"still-works")
    assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"still-works"


def test_persistent_and_non_persistent_of_one_name_are_distinct(client, unique):
    name = f"twin-{unique}"
    np_consumer = client.subscribe(_np(name), "sub")
    p_consumer = client.subscribe(f"persistent://{NS}/{name}", "sub")
    client.create_producer(_np(name)).send(b"to-non-persistent")
    client.create_producer(f"persistent://{NS}/{name}").send(b"to-persistent")
    assert [m.data() for m in _receive(np_consumer, 1)] == [b"to-non-persistent"]
    assert [m.data() for m in _receive(p_consumer, 1)] == [b"to-persistent"]
    assert _drain(np_consumer) == [] and _drain(p_consumer) == []


def test_regex_consumer_over_non_persistent_topics(client, unique):
    names = [_np(f"rx-{unique}-{i}") for i in range(3)]
    producers = [client.create_producer(n, batching_enabled=False) for n in names]
    persistent = client.create_producer(f"persistent://{NS}/rx-{unique}-p")
    consumer = client.subscribe(re.compile(_np(f"rx-{unique}-.*")), "s",
                                regex_subscription_mode=pulsar.RegexSubscriptionMode.NonPersistentOnly)
    for i, p in enumerate(producers):
        p.send(f"from-{i}".encode())
    persistent.send(b"not-matched")
    got = sorted(m.data() for m in _receive(consumer, 3))
    assert got == [b"from-0", b"from-1", b"from-2"]
    assert _drain(consumer) == []


def test_regex_consumer_over_all_topics_sees_both_domains(client, unique):
    names = [_np(f"rxa-{unique}-n"), f"persistent://{NS}/rxa-{unique}-p"]
    producers = [client.create_producer(n, batching_enabled=False) for n in names]
    consumer = client.subscribe(re.compile(f"{NS}/rxa-{unique}-.*"), "s",
                                regex_subscription_mode=pulsar.RegexSubscriptionMode.AllTopics)
    for p, n in zip(producers, names, strict=True):
        p.send(n.encode())
    got = sorted(m.data() for m in _receive(consumer, 2))
    assert got == sorted(n.encode() for n in names)


def test_partitioned_non_persistent_topic(client, admin, unique):
    topic = _np(f"parts-{unique}")
    admin.put(f"/admin/v2/non-persistent/{NS}/parts-{unique}/partitions", 3)
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(30):
        producer.send(str(i).encode())
    got = _receive(consumer, 30)
    assert sorted(int(m.data()) for m in got) == list(range(30))
    assert {m.topic_name() for m in got} == {f"{topic}-partition-{i}" for i in range(3)}


def test_partitioned_stats_sum_the_partitions_drop_rates(client, admin, unique):
    name = f"drops-{unique}"
    admin.put(f"/admin/v2/non-persistent/{NS}/{name}/partitions", 2)
    path = f"/admin/v2/non-persistent/{NS}/{name}/partitioned-stats"
    consumer = client.subscribe(_np(name), "sub", receiver_queue_size=1)
    producer = client.create_producer(_np(name), batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    wait_until(lambda: all(_consumers_of(admin, f"{name}-partition-{i}", "sub") == 1 for i in range(2)))
    admin.get(path)  # the first reading starts each rate's window
    for i in range(40):
        producer.send(str(i).encode())  # the consumer takes none: nearly all are dropped
    stats = admin.get(path)
    parts = list(stats["partitions"].values())
    assert stats["msgDropRate"] > 0
    assert stats["msgDropRate"] == pytest.approx(sum(p["msgDropRate"] for p in parts))
    assert stats["subscriptions"]["sub"]["msgDropRate"] == \
        pytest.approx(sum(p["subscriptions"]["sub"]["msgDropRate"] for p in parts))
    assert stats["publishers"] and all(p["msgDropRate"] == 0.0 for p in stats["publishers"])
    assert all(p["publishers"][0]["msgDropRate"] == 0.0 for p in parts)
    consumer.close()


def test_internal_stats_count_the_entries_published(client, admin, unique):
    name = f"internal-{unique}"
    consumer = client.subscribe(_np(name), "sub")
    producer = client.create_producer(_np(name), batching_enabled=False)
    for _ in range(3):
        producer.send(b"m")
    assert len(_receive(consumer, 3)) == 3
    internal = admin.get(f"/admin/v2/non-persistent/{NS}/{name}/internalStats")
    # Pulsar counts a non-persistent topic's published entries though it keeps none
    assert (internal["entriesAddedCounter"], internal["numberOfEntries"], internal["totalSize"]) == (3, 0, 0)
    assert list(internal["cursors"]) == ["sub"]


def test_admin_lists_and_reports_loaded_topic_and_subscription_lifetime(client, admin, unique):
    topic = _np(f"admin-{unique}")
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(5):
        producer.send(b"m")
    assert len(_receive(consumer, 5)) == 5
    assert topic in admin.get(f"/admin/v2/non-persistent/{NS}")
    assert topic not in admin.get(f"/admin/v2/persistent/{NS}")
    stats = admin.get(f"/admin/v2/non-persistent/{NS}/admin-{unique}/stats")
    assert stats["msgInCounter"] == 5
    assert stats["storageSize"] == 0
    assert stats["subscriptions"]["sub"]["msgOutCounter"] == 5
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 0
    consumer.close()
    # As in Pulsar, a consumer's subscription stays after its last consumer leaves (and drops
    # what it cannot deliver), until it is unsubscribed; a reader's goes with the reader.
    producer.send(b"unheard")
    sub = admin.get(f"/admin/v2/non-persistent/{NS}/admin-{unique}/stats")["subscriptions"]["sub"]
    assert (sub["consumers"], sub["isDurable"]) == ([], True)
    assert admin.get(f"/admin/v2/non-persistent/{NS}/admin-{unique}/subscriptions") == ["sub"]
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    readers = [s for s in admin.get(f"/admin/v2/non-persistent/{NS}/admin-{unique}/subscriptions") if s != "sub"]
    assert len(readers) == 1
    reader.close()
    wait_until(lambda: admin.get(f"/admin/v2/non-persistent/{NS}/admin-{unique}/subscriptions") == ["sub"])
    admin.delete(f"/admin/v2/non-persistent/{NS}/admin-{unique}/subscription/sub")
    assert admin.get(f"/admin/v2/non-persistent/{NS}/admin-{unique}/stats")["subscriptions"] == {}


def test_admin_create_unload_and_delete(client, admin, unique):
    name = f"life-{unique}"
    admin.put(f"/admin/v2/non-persistent/{NS}/{name}")
    assert _np(name) in admin.get(f"/admin/v2/non-persistent/{NS}")
    with pytest.raises(AdminError):
        admin.put(f"/admin/v2/non-persistent/{NS}/{name}")
    consumer = client.subscribe(_np(name), "sub")
    producer = client.create_producer(_np(name), batching_enabled=False)
    admin.put(f"/admin/v2/non-persistent/{NS}/{name}/unload")
    # The clients reconnect to a fresh topic; publish once the consumer is back.
    wait_until(lambda: _consumers_of(admin, name, "sub") == 1)
    producer.send(b"after-unload")
    assert [m.data() for m in _receive(consumer, 1)] == [b"after-unload"]
    consumer.close()
    producer.close()
    admin.delete(f"/admin/v2/non-persistent/{NS}/{name}")
    assert _np(name) not in admin.get(f"/admin/v2/non-persistent/{NS}")
    with pytest.raises(AdminError):
        admin.get(f"/admin/v2/non-persistent/{NS}/{name}/stats")


def test_auto_creation_policy_applies_and_explicit_create_wins(standalone, client, admin, unique):
    ns = f"public/np-{unique}"
    admin.put(f"/admin/v2/namespaces/{ns}")
    admin.post(f"/admin/v2/namespaces/{ns}/autoTopicCreation", {"allowAutoTopicCreation": False})
    quick = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=3)
    try:
        with pytest.raises(pulsar.PulsarException):
            quick.create_producer(f"non-persistent://{ns}/absent")
    finally:
        quick.close()
    assert admin.get(f"/admin/v2/non-persistent/{ns}") == []
    admin.put(f"/admin/v2/non-persistent/{ns}/made")
    consumer = client.subscribe(f"non-persistent://{ns}/made", "sub")
    client.create_producer(f"non-persistent://{ns}/made").send(b"ok")
    assert [m.data() for m in _receive(consumer, 1)] == [b"ok"]
    admin.post(f"/admin/v2/namespaces/{ns}/autoTopicCreation",
               {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 2})
    client.create_producer(f"non-persistent://{ns}/auto").close()
    assert admin.get(f"/admin/v2/non-persistent/{ns}/auto/partitions")["partitions"] == 2


def test_operations_needing_storage_are_refused_by_admin(client, admin, unique):
    name = f"refused-{unique}"
    client.create_producer(_np(name))
    with pytest.raises(AdminError) as refused:
        admin.post(f"/admin/v2/non-persistent/{NS}/{name}/terminate")
    assert refused.value.status == 405
    with pytest.raises(AdminError) as refused:
        admin.put(f"/admin/v2/non-persistent/{NS}/{name}/subscription/s")
    assert refused.value.status == 405


def test_restart_keeps_nothing(tmp_path: Path, unique):
    topic = _np(f"restart-{unique}")
    with Standalone(tmp_path / "data") as server:
        c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=15)
        try:
            consumer = c.subscribe(topic, "sub")
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(5):
                producer.send(f"before-{i}".encode())
            assert len(_receive(consumer, 5)) == 5
        finally:
            c.close()
    with Standalone(tmp_path / "data") as server:
        admin = AdminClient(server.addresses["web"][0], timeout=30)
        assert admin.get(f"/admin/v2/non-persistent/{NS}") == []
        c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=15)
        try:
            consumer = c.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
            c.create_producer(topic).send(b"after")
            assert [m.data() for m in _receive(consumer, 1)] == [b"after"]
        finally:
            c.close()


# -- the topic and subscription in process (no client): drops and what is refused --------------


class _Sink:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.active: dict[str, bool] = {}

    def send_messages(self, consumer, deliveries) -> None:
        self.got.extend((consumer.name, d.entry.data) for d in deliveries)

    def active_consumer_changed(self, consumer, active) -> None:
        self.active[consumer.name] = active

    def writable(self) -> bool:
        return True

    def reached_end_of_topic(self, consumer) -> None:
        raise AssertionError("a non-persistent topic has no end")


def _topic() -> NonPersistentTopic:
    broker = SimpleNamespace(bridge=None, stats=BrokerStats(), config={})
    return NonPersistentTopic(broker, TopicName.parse("non-persistent://public/default/unit"), {})


def _publish(topic: NonPersistentTopic, data: bytes, num: int = 1) -> PublishResult:
    results: list[PublishResult] = []
    topic.publish(data, num, "p", 0, results.append)
    assert len(results) == 1, "the receipt comes back at once"
    return results[0]


async def test_shared_subscription_drops_beyond_permits_and_keeps_nothing():
    topic = _topic()
    sink = _Sink()
    c1, c2 = Consumer(1, "c1", sink), Consumer(2, "c2", sink)
    sub = await topic.subscribe("s", c1, SubType.Shared)
    await topic.subscribe("s", c2, SubType.Shared)
    c1.flow(1)
    c2.flow(2)
    results = [_publish(topic, f"m{i}".encode()) for i in range(5)]
    assert all(r.error is None and r.position == NON_PERSISTENT_POSITION for r in results)
    assert sorted(sink.got) == [("c1", b"m0"), ("c2", b"m1"), ("c2", b"m2")]
    assert sub.msg_dropped == 2 and topic.msg_dropped == 2
    assert (c1.unacked, c2.unacked, sub.backlog(), len(sub.replay)) == ({}, {}, 0, 0)
    sub.ack_individual(c1, [(NON_PERSISTENT_POSITION, None)])
    sub.ack_cumulative(c1, NON_PERSISTENT_POSITION)
    sub.redeliver(c2, None)
    c1.flow(10)
    assert len(sink.got) == 3, "nothing is kept to redeliver"
    topic.consumer_closed(c1)
    topic.consumer_closed(c2)
    assert topic.subscriptions == {"s": sub} and sub.consumers == []
    _publish(topic, b"to-nobody")
    assert sub.msg_dropped == 3 and len(sink.got) == 3


async def test_batch_counts_its_messages_against_permits_and_drops():
    topic = _topic()
    sink = _Sink()
    c = Consumer(1, "c", sink)
    sub = await topic.subscribe("s", c, SubType.Exclusive)
    c.flow(10)
    _publish(topic, b"batch-of-ten", 10)
    _publish(topic, b"batch-of-three", 3)
    assert sink.got == [("c", b"batch-of-ten")]
    assert sub.msg_dropped == 3 and c.permits == 0


async def test_failover_drops_rather_than_pass_to_the_standby():
    topic = _topic()
    sink = _Sink()
    a, b = Consumer(1, "a", sink), Consumer(2, "b", sink)
    sub = await topic.subscribe("s", a, SubType.Failover)
    await topic.subscribe("s", b, SubType.Failover)
    # which one is active depends on the topic name (Pulsar's hash ring); one of them is
    assert sorted(sink.active.values()) == [False, True]
    active, standby = (a, b) if sink.active["a"] else (b, a)
    standby.flow(5)
    _publish(topic, b"x")
    assert sink.got == [] and sub.msg_dropped == 1
    active.flow(5)
    _publish(topic, b"y")
    assert sink.got == [(active.name, b"y")]


async def test_publish_without_subscriptions_reaches_nobody_and_counts_no_drop():
    topic = _topic()
    assert _publish(topic, b"x").error is None
    assert topic.msg_in == 1 and topic.msg_dropped == 0 and topic.subscriptions == {}


async def test_operations_that_need_storage_raise_not_allowed():
    topic = _topic()
    sub = await topic.subscribe("s", Consumer(1, "c", _Sink()), SubType.Exclusive)
    with pytest.raises(NotAllowedError):
        await sub.reset_to(Position(0, 0))
    with pytest.raises(NotAllowedError):
        await topic.terminate()
    with pytest.raises(NotAllowedError):
        await topic.create_subscription("other", None)
    with pytest.raises(NotAllowedError):
        await topic.durable_subscription("other")
    with pytest.raises(NotAllowedError):
        topic.start_compaction()
    assert topic.ml.stats()["total_size"] == 0 and topic.ml.last_confirmed() is None


async def test_closed_topic_refuses_publish_and_subscribe():
    topic = _topic()
    await topic.close()
    assert _publish(topic, b"x").error is not None
    with pytest.raises(Exception, match="closing"):
        await topic.subscribe("s", Consumer(1, "c", _Sink()), SubType.Shared)
