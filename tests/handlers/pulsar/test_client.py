"""The official pulsar-client against `magnetar standalone`."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pulsar
import pytest

from gateway._admin_cli import AdminError
from tests.handlers.pulsar._receive import nack_redelivery_counts, wait_until
from tests.handlers.pulsar._receive import receive_until_idle as _drain

RECEIVE_MS = 10_000


def test_round_trip_keeps_payload_key_properties_and_times(client, unique):
    topic = f"persistent://public/default/rt-{unique}"
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    msg_id = producer.send(b"hello", properties={"a": "1", "b": "2"}, partition_key="k1",
                           event_timestamp=1234567)
    msg = consumer.receive(timeout_millis=RECEIVE_MS)
    assert msg.data() == b"hello"
    assert msg.properties() == {"a": "1", "b": "2"}
    assert msg.partition_key() == "k1"
    assert msg.event_timestamp() == 1234567
    assert abs(msg.publish_timestamp() - time.time() * 1000) < 60_000
    assert msg.message_id().ledger_id() == msg_id.ledger_id()
    assert msg.message_id().entry_id() == msg_id.entry_id()
    assert msg.topic_name() == topic
    consumer.acknowledge(msg)


@pytest.mark.parametrize("batching", [False, True])
@pytest.mark.parametrize("compression", ["NONE", "LZ4", "ZLib", "ZSTD", "SNAPPY"])
def test_every_compression_batched_and_not(client, unique, batching, compression):
    topic = f"comp-{unique}"
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(
        topic, batching_enabled=batching, batching_max_messages=50,
        batching_max_publish_delay_ms=5,
        compression_type=getattr(pulsar.CompressionType, compression))
    payloads = [f"message-{i}-".encode() * 20 for i in range(200)]
    for p in payloads:
        producer.send_async(p, None)
    producer.flush()
    got = [m.data() for m in _drain(consumer)]
    assert got == payloads


@pytest.mark.parametrize("batching", [False, True])
def test_shared_subscription_splits_messages_once(client, unique, batching):
    topic = f"shared-{unique}"
    c1 = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    c2 = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    c3 = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_messages=10)
    for i in range(300):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    seen: dict[str, int] = {}
    per_consumer = []
    for c in (c1, c2, c3):
        got = _drain(c, idle_ms=2000)
        per_consumer.append(len(got))
        for m in got:
            seen[m.data().decode()] = seen.get(m.data().decode(), 0) + 1
    assert sorted(int(k) for k in seen) == list(range(300))
    assert set(seen.values()) == {1}
    assert sum(1 for n in per_consumer if n > 0) >= 2


def test_exclusive_subscription_refuses_second_consumer(client, unique):
    topic = f"excl-{unique}"
    client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)


def test_failover_moves_to_the_standby_consumer(client, unique):
    topic = f"failover-{unique}"
    a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(str(i).encode())
    # which of the two is active depends on the topic's name (Pulsar's hash ring for a
    # topic that is not partitioned): one gets everything, the other nothing
    got = {name: [m.data() for m in _drain(c)] for name, c in (("a", a), ("b", b))}
    assert sorted(got.values()) == [[], [str(i).encode() for i in range(10)]]
    active, standby = (a, b) if got["a"] else (b, a)
    active.close()
    for i in range(10, 15):
        producer.send(str(i).encode())
    assert [m.data() for m in _drain(standby)] == [str(i).encode() for i in range(10, 15)]


def test_key_shared_keeps_each_key_on_one_consumer_in_order(client, unique):
    topic = f"ks-{unique}"
    consumers = [client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                                  consumer_name=f"c{i}") for i in range(3)]
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{k}" for k in range(12)]
    for i in range(240):
        k = keys[i % len(keys)]
        producer.send_async(f"{k}:{i}".encode(), None, partition_key=k)
    producer.flush()
    owner: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    total = 0
    for ci, c in enumerate(consumers):
        for m in _drain(c):
            k, i = m.data().decode().split(":")
            assert owner.setdefault(k, ci) == ci, f"{k} went to two consumers"
            order.setdefault(k, []).append(int(i))
            total += 1
    assert total == 240
    for seq in order.values():
        assert seq == sorted(seq)
    assert len(set(owner.values())) >= 2


def test_key_shared_order_kept_when_a_consumer_joins(client, unique):
    topic = f"ks-join-{unique}"
    first = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                             consumer_name="first", receiver_queue_size=1000)
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"k{k}" for k in range(20)]
    for i in range(100):
        producer.send_async(f"{keys[i % 20]}:{i}".encode(), None, partition_key=keys[i % 20])
    producer.flush()
    # `first` holds 100 unacknowledged messages when the second consumer joins.
    held = [first.receive(timeout_millis=RECEIVE_MS) for _ in range(100)]
    second = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                              consumer_name="second")
    for i in range(100, 200):
        producer.send_async(f"{keys[i % 20]}:{i}".encode(), None, partition_key=keys[i % 20])
    producer.flush()
    # Keys still held by `first` must not reach `second` before `first` acks them...
    early = _drain(second, idle_ms=1000)
    held_keys = {m.data().decode().split(":")[0] for m in held}
    assert not [m for m in early if m.data().decode().split(":")[0] in held_keys]
    for m in held:
        first.acknowledge(m)
    # ...and once acknowledged, nothing is stuck: every message arrives, per key in order.
    rest = _drain(first) + early + _drain(second)
    got: dict[str, list[int]] = {}
    for m in rest:
        k, i = m.data().decode().split(":")
        got.setdefault(k, []).append(int(i))
    assert sum(len(v) for v in got.values()) == 100
    for k, seq in got.items():
        assert seq == sorted(seq), k


def test_reader_from_earliest_and_from_a_message_id(client, unique):
    topic = f"reader-{unique}"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(10)]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(10)] == [f"m{i}".encode() for i in range(10)]
    assert not reader.has_message_available()
    reader.close()
    reader = client.create_reader(topic, ids[4])
    assert reader.read_next(RECEIVE_MS).data() == b"m5"
    reader.close()
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    producer.send(b"after")
    assert reader.read_next(RECEIVE_MS).data() == b"after"


def test_seek_to_time_and_to_message_id(client, unique):
    topic = f"seek-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(10)]
    assert len(_drain(consumer)) == 10
    consumer.seek(0)
    assert [m.data() for m in _drain(consumer)] == [f"m{i}".encode() for i in range(10)]
    consumer.seek(ids[3])
    got = [m.data() for m in _drain(consumer)]
    assert got[0] in (b"m3", b"m4") and got[-1] == b"m9"


def test_negative_ack_redelivers_with_count_and_dead_letter_policy(client, unique):
    topic = f"dlq-{unique}"
    dlq = f"persistent://public/default/dlq-{unique}-DLQ"
    dead = client.subscribe(dlq, "watch")
    consumer = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dlq))
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"poison")
    assert nack_redelivery_counts(consumer, 3, receive_ms=RECEIVE_MS) == [0, 1, 2]
    assert dead.receive(timeout_millis=RECEIVE_MS).data() == b"poison"


def test_a_dead_letter_policys_initial_subscription_keeps_what_reaches_the_dlq(client, admin, unique):
    """The client creates the dead-letter producer with the policy's initial subscription;
    the broker creates that subscription from the earliest message before the producer
    publishes, so a consumer that subscribes later (at latest) still finds the message."""
    topic = f"dlq-init-{unique}"
    dlq = f"persistent://public/default/dlq-init-{unique}-DLQ"
    consumer = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic=dlq, initial_subscription_name="dlq-watch"))
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"poison")
    for _ in range(2):
        consumer.negative_acknowledge(consumer.receive(timeout_millis=RECEIVE_MS))
    stats = f"/admin/v2/persistent/public/default/dlq-init-{unique}-DLQ/stats"

    def dead_lettered() -> bool:
        try:
            return admin.get(stats)["msgInCounter"] == 1
        except AdminError:  # the client has not created the dead-letter topic yet
            return False

    wait_until(dead_lettered)
    assert list(admin.get(stats)["subscriptions"]) == ["dlq-watch"]
    watcher = client.subscribe(dlq, "dlq-watch")  # at latest: only an existing subscription has it
    assert watcher.receive(timeout_millis=RECEIVE_MS).data() == b"poison"


def test_ack_timeout_redelivers(client, unique):
    topic = f"acktimeout-{unique}"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                unacked_messages_timeout_ms=10_000)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"x")
    first = consumer.receive(timeout_millis=RECEIVE_MS)
    again = consumer.receive(timeout_millis=3 * RECEIVE_MS)
    assert again.data() == b"x" and again.message_id() == first.message_id()
    assert again.redelivery_count() >= 1


@pytest.mark.parametrize("sub_type", ["Shared", "Exclusive", "Failover", "KeyShared"])
def test_delayed_delivery_on_every_subscription_type(client, unique, sub_type):
    topic = f"delay-{sub_type}-{unique}"
    consumer = client.subscribe(topic, "s", consumer_type=getattr(pulsar.ConsumerType, sub_type))
    producer = client.create_producer(topic, batching_enabled=False)
    sent = time.time()
    producer.send(b"later", deliver_after=timedelta(seconds=2), partition_key="k")
    producer.send(b"now", partition_key="j")
    assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"now"
    later = consumer.receive(timeout_millis=RECEIVE_MS)
    assert later.data() == b"later"
    assert time.time() - sent >= 1.9


def test_regex_consumer_finds_topics_of_the_namespace(client, unique):
    names = [f"persistent://public/default/rx-{unique}-{i}" for i in range(3)]
    for n in names:
        client.create_producer(n).close()
    consumer = client.subscribe(re.compile(f"persistent://public/default/rx-{unique}-.*"), "s",
                                initial_position=pulsar.InitialPosition.Earliest)
    for i, n in enumerate(names):
        client.create_producer(n).send(f"from-{i}".encode())
    got = sorted(m.data() for m in _drain(consumer))
    assert got == [b"from-0", b"from-1", b"from-2"]


def test_chunked_large_message(client, unique):
    topic = f"chunk-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
    big = bytes(range(256)) * (7 * 1024 * 1024 // 256)  # 7 MiB, over the 5 MiB maxMessageSize
    producer.send(big)
    assert consumer.receive(timeout_millis=30_000).data() == big


def test_chunked_messages_reach_shared_consumers_whole(client, unique):
    # Every chunk of a message goes to the consumer its first chunk went to, as Pulsar's
    # Shared chunk assignment does: each of the two consumers can put its messages together.
    topic = f"chunk-shared-{unique}"
    consumers = [client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                  consumer_name=f"c{i}", receiver_queue_size=10) for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
    bigs = [bytes([i]) * (6 * 1024 * 1024) for i in range(4)]  # two chunks each
    for big in bigs:
        producer.send_async(big, None)
    producer.flush()
    got = [m.data() for c in consumers for m in _drain(c)]
    assert sorted(got) == bigs


def test_json_schema_and_incompatible_schema_refused(client, unique):
    from pulsar.schema import Integer, JsonSchema, Record, String

    class User(Record):
        name = String()
        age = Integer()

    class Other(Record):
        title = String(required=True)
        pages = Integer(required=True)

    topic = f"schema-{unique}"
    consumer = client.subscribe(topic, "s", schema=JsonSchema(User))
    producer = client.create_producer(topic, schema=JsonSchema(User))
    producer.send(User(name="ada", age=36))
    got = consumer.receive(timeout_millis=RECEIVE_MS).value()
    assert (got.name, got.age) == ("ada", 36)
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=JsonSchema(Other))


def test_a_consumers_schema_is_checked_against_the_topics_not_registered(client, admin, unique):
    from pulsar.schema import Integer, JsonSchema, Record, String

    class V1(Record):
        a = String(required=True)

    class WithDefault(Record):  # reads V1 data: b takes its default
        a = String(required=True)
        b = Integer(default=0, required=True, required_default=True)

    class WithRequired(Record):  # cannot read V1 data: b has no value there
        a = String(required=True)
        b = Integer(required=True)

    topic = f"schema-consumer-{unique}"
    producer = client.create_producer(topic, schema=JsonSchema(V1))
    producer.send(V1(a="m0"))
    client.subscribe(topic, "reads", schema=JsonSchema(WithDefault)).close()
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "cannot", schema=JsonSchema(WithRequired))
    # neither consumer's schema became a version of the topic
    versions = admin.get(f"/admin/v2/schemas/public/default/{topic}/schemas")["getSchemaResponses"]
    assert [v["version"] for v in versions] == [0]


def test_a_consumers_schema_becomes_the_schema_of_an_idle_topic_only(client, admin, unique):
    from pulsar.schema import JsonSchema, Record, String

    class Event(Record):
        kind = String()

    idle = f"schema-idle-{unique}"
    client.subscribe(idle, "s", schema=JsonSchema(Event)).close()
    assert admin.get(f"/admin/v2/schemas/public/default/{idle}/schema")["type"] == "JSON"
    # a topic that holds schemaless data is not idle: there is nothing to check against
    busy = f"schema-busy-{unique}"
    client.create_producer(busy).send(b"raw bytes")
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(busy, "s", schema=JsonSchema(Event))


def _protobuf_order(fields: list[str]):
    """A protobuf message class ``shop.Order`` with string fields ``fields``, in a pool of
    its own (so two versions of the same message can live side by side)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="order.proto", package="shop", syntax="proto3")
    message = proto.message_type.add(name="Order")
    for number, name in enumerate(fields, 1):
        message.field.add(name=name, number=number,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_a_protobuf_native_schema_may_evolve_but_keeps_its_root_message(client, admin, unique):
    from google.protobuf import timestamp_pb2
    from pulsar.schema import ProtobufNativeSchema

    v1, v2 = _protobuf_order(["id"]), _protobuf_order(["id", "note"])
    topic = f"schema-protobuf-{unique}"
    consumer = client.subscribe(topic, "s", schema=ProtobufNativeSchema(v1))
    client.create_producer(topic, schema=ProtobufNativeSchema(v1)).send(v1(id="1"))
    # a new version of the same root message is registered (Pulsar's check under FULL)
    client.create_producer(topic, schema=ProtobufNativeSchema(v2)).send(v2(id="2", note="n"))
    assert [consumer.receive(RECEIVE_MS).value().id for _ in range(2)] == ["1", "2"]
    client.subscribe(topic, "v2", schema=ProtobufNativeSchema(v2)).close()
    versions = admin.get(f"/admin/v2/schemas/public/default/{topic}/schemas")["getSchemaResponses"]
    assert [v["type"] for v in versions] == ["PROTOBUF_NATIVE", "PROTOBUF_NATIVE"]
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=ProtobufNativeSchema(timestamp_pb2.Timestamp))


def test_invalid_topic_name_is_refused(client):
    with pytest.raises(pulsar.InvalidTopicName):
        client.create_producer("persistent://public/default/")


def test_key_shared_sticky_ranges_decide_who_gets_a_key(client, unique):
    from core.hashing import key_hash

    topic = f"ks-sticky-{unique}"
    low = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="low",
                           key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                               key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 32767)]))
    high = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="high",
                            key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                                key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(32768, 65535)]))
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"k{i}" for i in range(40)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    got_low = {m.data().decode() for m in _drain(low)}
    got_high = {m.data().decode() for m in _drain(high)}
    assert got_low == {k for k in keys if key_hash(k.encode()) <= 32767}
    assert got_high == {k for k in keys if key_hash(k.encode()) > 32767}


def test_sticky_key_shared_ranges_must_not_be_held_by_another_consumer(client, unique):
    topic = f"ks-sticky-conflict-{unique}"

    def sticky(name: str, ranges: list[tuple[int, int]] | None):
        policy = pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=pulsar.KeySharedMode.Sticky if ranges else pulsar.KeySharedMode.AutoSplit,
            sticky_ranges=ranges)
        return client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                                consumer_name=name, key_shared_policy=policy)

    sticky("a", [(0, 40000)])
    for name, ranges in (("overlap", [(30000, 65535)]), ("same", [(0, 40000)]), ("auto", None)):
        with pytest.raises(pulsar.ConsumerAssignError):
            sticky(name, ranges)
    b = sticky("b", [(40001, 65535)])  # the rest of the hash range is free
    b.close()


def test_avro_schema_round_trip(client, unique):
    from pulsar.schema import AvroSchema, Record, String

    class Event(Record):
        kind = String()

    topic = f"avro-{unique}"
    consumer = client.subscribe(topic, "s", schema=AvroSchema(Event))
    producer = client.create_producer(topic, schema=AvroSchema(Event))
    producer.send(Event(kind="click"))
    assert consumer.receive(timeout_millis=RECEIVE_MS).value().kind == "click"


def test_a_schema_changing_a_nested_type_is_refused(client, unique):
    from pulsar.schema import Array, AvroSchema, Integer, Record, String

    class Tags(Record):
        tags = Array(Integer())

    class TagNames(Record):  # the array's items change type
        tags = Array(String())

    topic = f"schema-nested-{unique}"
    client.create_producer(topic, schema=AvroSchema(Tags)).send(Tags(tags=[1]))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(TagNames))
