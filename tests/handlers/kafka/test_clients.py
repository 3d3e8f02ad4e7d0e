"""kafka-python and confluent-kafka (librdkafka) against a real standalone broker."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

with warnings.catch_warnings():
    # kafka-python 3.0 reads its schemas with a deprecated importlib.resources call.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.errors as kerr
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KResourceType
    from kafka.structs import OffsetAndMetadata

from handlers.kafka._errors import ErrorCode

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")

DEADLINE = 30.0
COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]


def wait_for(cond: Callable[[], bool], timeout: float = DEADLINE) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def create_topic(boot: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": boot})
    for f in admin.create_topics([NewTopic(topic, partitions)]).values():
        f.result(10)


def drain_confluent(c: Consumer, n: int, timeout: float = DEADLINE) -> list[Any]:
    got: list[Any] = []
    end = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(str(m.error()))
        got.append(m)
    return got


# -- produce and consume -------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_confluent_produce_consume(boot: str, unique: str, acks: int, compression: str) -> None:
    topic = f"cf-{compression}-{acks}-{unique}"
    p = Producer({"bootstrap.servers": boot, "acks": acks, "compression.type": compression,
                  "linger.ms": 2})
    reports: list[Any] = []
    for i in range(50):
        p.produce(topic, key=b"k%d" % (i % 3), value=b"value-%d" % i, headers=[("i", str(i).encode())],
                  on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert p.flush(DEADLINE) == 0
    assert all(err is None for err, _ in reports) and len(reports) == 50
    if acks != 0:
        assert sorted(o for _, o in reports) == list(range(50))
    c = Consumer({"bootstrap.servers": boot, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = drain_confluent(c, 50)
    c.close()
    assert [m.value() for m in got] == [b"value-%d" % i for i in range(50)]
    assert [m.offset() for m in got] == list(range(50))
    assert got[7].key() == b"k1" and got[7].headers() == [("i", b"7")]


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_kafka_python_produce_consume(boot: str, unique: str, acks: Any, compression: str) -> None:
    topic = f"kp-{compression}-{acks}-{unique}"
    p = KafkaProducer(bootstrap_servers=boot, acks=acks,
                      compression_type=None if compression == "none" else compression)
    futures = [p.send(topic, key=b"k", value=b"v%d" % i, headers=[("h", b"%d" % i)]) for i in range(30)]
    p.flush(DEADLINE)
    metas = [f.get(DEADLINE) for f in futures]
    p.close()
    if acks != 0:
        assert [m.offset for m in metas] == list(range(30))
    c = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    tp = KTopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got = []
    end = time.monotonic() + DEADLINE
    while len(got) < 30 and time.monotonic() < end:
        for records in c.poll(500).values():
            got.extend(records)
    c.close()
    assert [r.value for r in got] == [b"v%d" % i for i in range(30)]
    assert got[3].headers == [("h", b"3")]


def test_key_maps_to_a_stable_partition(boot: str, unique: str) -> None:
    topic = f"keys-{unique}"
    create_topic(boot, topic, 4)
    p = Producer({"bootstrap.servers": boot})
    seen: dict[bytes, set[int]] = {}
    for i in range(60):
        key = b"key-%d" % (i % 6)
        p.produce(topic, key=key, value=b"x",
                  on_delivery=lambda err, m: seen.setdefault(m.key(), set()).add(m.partition()))
    p.flush(DEADLINE)
    assert all(len(parts) == 1 for parts in seen.values())
    assert len({next(iter(ps)) for ps in seen.values()}) > 1
    kp = KafkaProducer(bootstrap_servers=boot)
    parts = {kp.send(topic, key=b"same", value=b"%d" % i).get(DEADLINE).partition for i in range(10)}
    kp.close()
    assert len(parts) == 1


def test_headers_timestamps_offsets_for_times_and_seek(boot: str, unique: str) -> None:
    topic = f"ts-{unique}"
    base = int(time.time() * 1000) - 60_000
    p = KafkaProducer(bootstrap_servers=boot)
    for i in range(20):
        p.send(topic, value=b"%d" % i, timestamp_ms=base + i * 1000, headers=[("n", b"%d" % i)])
    p.flush(DEADLINE)
    p.close()
    c = KafkaConsumer(bootstrap_servers=boot, consumer_timeout_ms=3000)
    tp = KTopicPartition(topic, 0)
    c.assign([tp])
    found = c.offsets_for_times({tp: base + 10_500})
    assert found[tp].offset == 11 and found[tp].timestamp == base + 11_000
    assert c.beginning_offsets([tp])[tp] == 0 and c.end_offsets([tp])[tp] == 20
    c.seek(tp, 15)
    got = []
    end = time.monotonic() + DEADLINE
    while len(got) < 5 and time.monotonic() < end:
        for records in c.poll(500).values():
            got.extend(records)
    c.close()
    assert [(r.offset, r.timestamp, r.headers) for r in got] == [
        (i, base + i * 1000, [("n", b"%d" % i)]) for i in range(15, 20)]
    cc = Consumer({"bootstrap.servers": boot, "group.id": f"ts-{unique}"})
    [tp2] = cc.offsets_for_times([TopicPartition(topic, 0, base + 4_000)], 10)
    assert tp2.offset == 4
    cc.assign([TopicPartition(topic, 0, 18)])
    got2 = drain_confluent(cc, 2)
    cc.close()
    assert [m.offset() for m in got2] == [18, 19]
    assert got2[0].timestamp()[1] == base + 18_000


def test_confluent_idempotent_producer(boot: str, unique: str) -> None:
    topic = f"idem-{unique}"
    p = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "linger.ms": 5})
    for i in range(500):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(DEADLINE) == 0
    c = Consumer({"bootstrap.servers": boot, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = drain_confluent(c, 500)
    assert drain_confluent(c, 1, timeout=1.0) == []
    c.close()
    assert [m.value() for m in got] == [b"%d" % i for i in range(500)]


# -- consumer groups -------------------------------------------------------------------------


def _group_run(boot: str, topic: str, group: str, strategy: str) -> None:
    n = 400
    p = Producer({"bootstrap.servers": boot})
    for i in range(n):
        p.produce(topic, key=b"%d" % i, value=b"%d" % i)
    p.flush(DEADLINE)
    consumed: list[tuple[str, int, int]] = []
    uncommitted: set[tuple[int, int]] = set()
    assignments: dict[str, set[int]] = {}
    lock = threading.Lock()
    stop = {"a": threading.Event(), "b": threading.Event()}

    def run(name: str) -> None:
        c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "partition.assignment.strategy": strategy,
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 200})

        def on_assign(cons: Consumer, parts: list[TopicPartition]) -> None:
            with lock:
                assignments[name] = set(assignments.get(name, set())) | {tp.partition for tp in parts}
            if strategy == "cooperative-sticky":
                cons.incremental_assign(parts)

        def on_revoke(cons: Consumer, parts: list[TopicPartition]) -> None:
            with lock:
                assignments[name] = set(assignments.get(name, set())) - {tp.partition for tp in parts}
            if strategy == "cooperative-sticky":
                cons.incremental_unassign(parts)

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        while not stop[name].is_set():
            m = c.poll(0.1)
            if m is None or m.error():
                continue
            with lock:
                consumed.append((name, m.partition(), m.offset()))
            try:
                c.commit(message=m, asynchronous=False)
            except KafkaException:
                # A commit racing a rebalance (ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS)
                # fails as in Kafka; that record may then be delivered again.
                with lock:
                    uncommitted.add((m.partition(), m.offset()))
            time.sleep(0.005)
        c.close()

    ta = threading.Thread(target=run, args=("a",))
    ta.start()
    wait_for(lambda: len(consumed) >= 40)
    tb = threading.Thread(target=run, args=("b",))
    tb.start()
    # The two consumers split the four partitions.
    wait_for(lambda: len(assignments.get("a", ())) == 2 and len(assignments.get("b", ())) == 2)
    wait_for(lambda: any(name == "b" for name, _, _ in consumed))
    stop["a"].set()
    ta.join(DEADLINE)
    # b takes over everything a had, from a's commits.
    wait_for(lambda: assignments.get("b") == {0, 1, 2, 3})
    wait_for(lambda: len(consumed) >= n)
    time.sleep(0.5)
    stop["b"].set()
    tb.join(DEADLINE)
    keys = [(p_, o) for _, p_, o in consumed]
    assert len(set(keys)) == n, "nothing lost"
    twice = {k for k in keys if keys.count(k) > 1}
    # Nothing consumed twice after a commit: a record is seen again only if its own
    # commit failed or a later record of its partition was not committed before the move.
    for part, offset in twice:
        assert any(p_ == part and o >= offset for p_, o in uncommitted), (part, offset)


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_group_of_two_splits_and_rebalances(boot: str, unique: str, strategy: str) -> None:
    topic = f"grp-{strategy}-{unique}"
    create_topic(boot, topic, 4)
    _group_run(boot, topic, f"group-{strategy}-{unique}", strategy)


def test_consumer_group_protocol_fails_at_once(boot: str, unique: str) -> None:
    """A consumer with group.protocol=consumer (KIP-848, not served) gets a fatal error
    from its first ConsumerGroupHeartbeat, not a silent wait for a coordinator."""
    c = Consumer({"bootstrap.servers": boot, "group.id": f"kip848-{unique}",
                  "group.protocol": "consumer"})
    try:
        c.subscribe([f"kip848-{unique}"])
        end = time.monotonic() + 10
        error = None
        while error is None and time.monotonic() < end:
            m = c.poll(0.5)
            error = m.error() if m is not None else None
        assert error is not None, "no error within 10 s"
        assert error.code() == KafkaError._FATAL and "API version not supported" in error.str()
    finally:
        c.close()


def test_kafka_python_group_and_commit(boot: str, unique: str) -> None:
    topic = f"kpg-{unique}"
    create_topic(boot, topic, 2)
    p = KafkaProducer(bootstrap_servers=boot)
    for i in range(40):
        p.send(topic, key=b"%d" % i, value=b"%d" % i)
    p.flush(DEADLINE)
    p.close()
    c = KafkaConsumer(topic, bootstrap_servers=boot, group_id=f"kg-{unique}",
                      auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=4000)
    got = [m for m in c]
    c.commit()
    c.close()
    assert sorted(int(m.value) for m in got) == list(range(40))
    c2 = KafkaConsumer(topic, bootstrap_servers=boot, group_id=f"kg-{unique}",
                       auto_offset_reset="earliest", consumer_timeout_ms=2000)
    assert list(c2) == []
    committed = {tp: c2.committed(KTopicPartition(topic, tp)) for tp in (0, 1)}
    c2.close()
    assert sum(committed.values()) == 40


# -- admin ------------------------------------------------------------------------------------


def test_confluent_admin(boot: str, unique: str) -> None:
    admin = AdminClient({"bootstrap.servers": boot})
    t1, t2 = f"adm1-{unique}", f"adm2-{unique}"
    for f in admin.create_topics([NewTopic(t1, 3), NewTopic(t2, 1)]).values():
        f.result(10)
    dup = admin.create_topics([NewTopic(t1, 3)])[t1]
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS|already exists"):
        dup.result(10)
    md = admin.list_topics(timeout=10)
    assert len(md.topics[t1].partitions) == 3 and len(md.topics[t2].partitions) == 1
    admin.create_partitions([NewPartitions(t1, 5)])[t1].result(10)
    assert len(admin.list_topics(timeout=10).topics[t1].partitions) == 5
    res = ConfigResource(ConfigResource.Type.TOPIC, t1)
    configs = admin.describe_configs([res])[res].result(10)
    assert configs["cleanup.policy"].value == "delete"
    broker = ConfigResource(ConfigResource.Type.BROKER, "0")
    assert "num.partitions" in admin.describe_configs([broker])[broker].result(10)
    cluster = admin.describe_cluster().result(10)
    assert len(cluster.nodes) == 1
    for f in admin.delete_topics([t2]).values():
        f.result(10)
    assert t2 not in admin.list_topics(timeout=10).topics


def test_authorized_operations_are_every_operation_without_an_authorizer(
        boot: str, unique: str) -> None:
    """Asked for (KIP-430), a resource's authorized operations are, as from a Kafka broker
    with no authorizer, all the operations of its resource type."""
    admin = AdminClient({"bootstrap.servers": boot})
    topic, group = f"authops-{unique}", f"authops-g-{unique}"
    admin.create_topics([NewTopic(topic, 1)])[topic].result(10)
    op = AclOperation
    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations) == {
        op.CREATE, op.CLUSTER_ACTION, op.DESCRIBE_CONFIGS, op.ALTER_CONFIGS, op.IDEMPOTENT_WRITE,
        op.ALTER, op.DESCRIBE}
    assert admin.describe_cluster().result(10).authorized_operations is None
    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)
    assert set(described[topic].result(10).authorized_operations) == {
        op.READ, op.WRITE, op.CREATE, op.DESCRIBE, op.DELETE, op.ALTER, op.DESCRIBE_CONFIGS,
        op.ALTER_CONFIGS}
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        wait_for(lambda: c.poll(0.5) is None and bool(c.assignment()))
        g = admin.describe_consumer_groups([group], include_authorized_operations=True)[group]
        assert set(g.result(10).authorized_operations) == {op.READ, op.DESCRIBE, op.DELETE}
    finally:
        c.close()


def test_acls_are_refused_as_security_disabled(boot: str) -> None:
    """ACL requests get Kafka's answers for a broker with no authorizer: SECURITY_DISABLED
    (librdkafka drops DescribeAcls' error code, so it lists nothing)."""
    admin = AdminClient({"bootstrap.servers": boot})
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:u", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    for future in (*admin.create_acls([binding]).values(), *admin.delete_acls([every]).values()):
        with pytest.raises(KafkaException) as raised:
            future.result(10)
        assert raised.value.args[0].code() == KafkaError.SECURITY_DISABLED
    assert admin.describe_acls(every).result(10) == []
    kadmin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        with pytest.raises(kerr.SecurityDisabledError, match="No Authorizer"):
            kadmin.describe_acls(ACLFilter(
                principal=None, host="*", operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(KResourceType.TOPIC, None,
                                                       ACLResourcePatternType.ANY)))
    finally:
        kadmin.close()


def test_kafka_python_admin_and_groups(boot: str, unique: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=boot)
    topic = f"kadm-{unique}"
    created = admin.create_topics({topic: {"num_partitions": 2}})
    assert created["topics"][0]["error_code"] == 0
    assert topic in admin.list_topics()
    p = KafkaProducer(bootstrap_servers=boot)
    for i in range(10):
        p.send(topic, value=b"%d" % i, partition=0)
    p.flush(DEADLINE)
    p.close()
    group = f"kadm-g-{unique}"
    c = KafkaConsumer(topic, bootstrap_servers=boot, group_id=group, auto_offset_reset="earliest",
                      consumer_timeout_ms=3000, enable_auto_commit=False)
    assert len(list(c)) == 10
    c.commit()
    described = admin.describe_groups([group])[group]
    assert described["group_state"] == "Stable" and len(described["members"]) == 1
    assert described["members"][0]["member_assignment"]["assigned_partitions"][0]["partitions"] == [0, 1]
    c.close()
    assert [g["group_state"] for g in admin.list_groups() if g["group_id"] == group] == ["Empty"]
    # ListGroups v5 (KIP-848): every group is a classic one, its types filter case-insensitive.
    assert group in [g["group_id"] for g in admin.list_groups(types_filter=["Classic"])]
    assert [g["group_type"] for g in admin.list_groups(types_filter=["classic"])
            if g["group_id"] == group] == ["classic"]
    assert admin.list_groups(types_filter=["consumer"]) == []
    offsets = admin.list_group_offsets({group: None})[group]
    assert offsets[KTopicPartition(topic, 0)].offset == 10
    deleted = admin.delete_records({KTopicPartition(topic, 0): 4})
    assert deleted[KTopicPartition(topic, 0)]["low_watermark"] == 4
    lc = KafkaConsumer(bootstrap_servers=boot)
    assert lc.beginning_offsets([KTopicPartition(topic, 0)])[KTopicPartition(topic, 0)] == 4
    lc.close()
    assert admin.delete_groups([group]) == {group: "OK"}
    assert group not in [g["group_id"] for g in admin.list_groups()]
    admin.delete_topics([topic])
    assert topic not in admin.list_topics()
    admin.close()


def test_kafka_python_list_partition_reassignments(boot: str, unique: str) -> None:
    """No reassignment is under way, as Kafka answers a cluster with none: for every
    topic, and for partitions named, existing or not."""
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        topic = f"reassign-{unique}"
        admin.create_topics({topic: {"num_partitions": 2}})
        assert admin.list_partition_reassignments() == {}
        named = [KTopicPartition(topic, 0), KTopicPartition(f"none-{unique}", 0)]
        assert admin.list_partition_reassignments(named) == {}
    finally:
        admin.close()


def test_kafka_python_describe_features(boot: str) -> None:
    """ApiVersions v3+ carries the features (KIP-584) as a Kafka 3.9 broker in KRaft mode
    reports them: metadata.version supported from 3.0-IV1 (1) to 3.9-IV0 (21), and
    finalized at 3.9-IV0; nothing else, so no client turns on a protocol not served."""
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        assert admin.describe_features() == {"metadata.version": {
            "supported": (1, 21), "finalized": (21, 21), "finalized_epoch": 0}}
    finally:
        admin.close()


def test_kafka_python_describe_topic_partitions_pages_with_a_cursor(boot: str, unique: str) -> None:
    """DescribeTopicPartitions (KIP-966, kafka-topics.sh --describe in Kafka 3.8+): topics
    in name order, at most the partition limit per answer, the cursor saying where the
    next answer starts; a topic that does not exist is listed with its error."""
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        a, b, missing = f"dtp-{unique}-a", f"dtp-{unique}-b", f"dtp-{unique}-missing"
        admin.create_topics({a: {"num_partitions": 3}, b: {"num_partitions": 2}})

        def page(cursor: dict[str, Any] | None, limit: int = 2,
                 topics: tuple[str, ...] = (missing, b, a)) -> tuple[list[Any], Any]:
            got = admin.describe_topic_partitions(list(topics), response_partition_limit=limit,
                                                  cursor=cursor)
            return ([(t["name"], t["error_code"], [p["partition_index"] for p in t["partitions"]])
                     for t in got["topics"]], got["next_cursor"])

        assert page(None) == ([(a, 0, [0, 1])], {"topic_name": a, "partition_index": 2})
        assert page({"topic_name": a, "partition_index": 2}) == (
            [(a, 0, [2]), (b, 0, [0])], {"topic_name": b, "partition_index": 1})
        assert page({"topic_name": b, "partition_index": 1}) == (
            [(b, 0, [1]), (missing, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])], None)
        # A limit reached at the end of a topic: the next one starts the next answer.
        assert page(None, 3, (a, b)) == ([(a, 0, [0, 1, 2])], {"topic_name": b, "partition_index": 0})
        # The cursor's topic must be among those named.
        assert page({"topic_name": b, "partition_index": 0}, topics=(a,)) == (
            [(a, ErrorCode.INVALID_REQUEST, [])], None)

        [desc] = admin.describe_topic_partitions([a])["topics"]
        [meta] = admin.describe_topics([a])
        assert str(desc["topic_id"]) == meta["topic_id"] and not desc["is_internal"]
        node = meta["partitions"][0]["leader_id"]
        assert desc["partitions"][0] | {"partition_index": 0} == {
            "error_code": 0, "partition_index": 0, "leader_id": node, "leader_epoch": 0,
            "replica_nodes": [node], "isr_nodes": [node], "eligible_leader_replicas": None,
            "last_known_elr": None, "offline_replicas": []}
        # No topic named: every topic (that exists), in name order.
        listed = [t["name"] for t in admin.describe_topic_partitions([])["topics"]]
        assert listed == sorted(listed) and {a, b} <= set(listed) and missing not in listed
    finally:
        admin.close()


def test_kafka_python_describe_log_dirs(boot: str, unique: str) -> None:
    """One log directory holds every partition, each with the bytes it stores; partitions
    asked about that do not exist are left out, as Kafka does."""
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        topic = f"logdirs-{unique}"
        admin.create_topics({topic: {"num_partitions": 2}})
        p = KafkaProducer(bootstrap_servers=boot)
        for _ in range(10):
            p.send(topic, value=b"x" * 100, partition=0)
        p.flush(DEADLINE)
        p.close()

        def sizes(asked: Any) -> dict[int, int]:
            [broker] = admin.describe_log_dirs(asked)
            [log_dir] = broker["log_dirs"]
            assert log_dir["error_code"] == 0 and log_dir["log_dir"]
            return {part["partition_index"]: part["partition_size"]
                    for t in log_dir["topics"] if t["name"] == topic for part in t["partitions"]}

        everything = sizes(None)
        assert set(everything) == {0, 1} and everything[0] >= 1000 and everything[1] == 0
        assert sizes({topic: [1], f"none-{unique}": [0]}) == {1: 0}
    finally:
        admin.close()


def test_deleting_a_topic_deletes_the_groups_offsets_for_it(boot: str, unique: str) -> None:
    """As Kafka removes the offsets of deleted partitions: a topic created again under the
    same name is read from where ``auto.offset.reset`` says, not from the old offsets."""
    topic, group = f"recreated-{unique}", f"recreated-g-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    create_topic(boot, topic, 1)
    c = Consumer({"bootstrap.servers": boot, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    for f in admin.delete_topics([topic]).values():
        f.result(DEADLINE)
    create_topic(boot, topic, 1)
    assert c.committed([TopicPartition(topic, 0)], DEADLINE)[0].offset < 0
    c.close()
    p = Producer({"bootstrap.servers": boot})
    for i in range(5):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(DEADLINE) == 0
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = drain_confluent(c, 5)
    c.close()
    assert [m.offset() for m in got] == [0, 1, 2, 3, 4]


def test_kafka_python_delete_group_offsets(boot: str, unique: str) -> None:
    """OffsetDelete (KIP-496): an active consumer group keeps the offsets of the topics it
    subscribes to (GROUP_SUBSCRIBED_TO_TOPIC) and loses those of other topics; an empty
    group loses any; an unknown group is GROUP_ID_NOT_FOUND."""
    admin = KafkaAdminClient(bootstrap_servers=boot)
    read, other = f"odel-{unique}", f"odel-other-{unique}"
    admin.create_topics({read: {"num_partitions": 1}, other: {"num_partitions": 1}})
    group = f"odel-g-{unique}"
    # metadata_max_age_ms: a first metadata answer that missed the new topic is refreshed
    # soon, rather than after kafka-python's default five minutes
    c = KafkaConsumer(read, bootstrap_servers=boot, group_id=group, enable_auto_commit=False,
                      metadata_max_age_ms=500)
    wait_for(lambda: bool(c.poll(timeout_ms=100) or c.assignment()))
    tp, otp = KTopicPartition(read, 0), KTopicPartition(other, 0)
    c.commit({tp: OffsetAndMetadata(5, "", -1), otp: OffsetAndMetadata(3, "", -1)})
    assert admin.delete_group_offsets(group, [tp, otp]) == {
        tp: kerr.GroupSubscribedToTopicError, otp: kerr.NoError}
    offsets = admin.list_group_offsets({group: None})[group]
    assert offsets[tp].offset == 5 and otp not in offsets
    c.close()
    assert admin.delete_group_offsets(group, [tp]) == {tp: kerr.NoError}
    assert admin.list_group_offsets({group: None})[group] == {}
    with pytest.raises(kerr.GroupIdNotFoundError):
        admin.delete_group_offsets(f"no-such-group-{unique}", [tp])
    admin.close()


# -- transactions -------------------------------------------------------------------------------


def test_transactions_commit_and_abort(boot: str, unique: str) -> None:
    topic = f"txn-{unique}"
    create_topic(boot, topic, 2)
    p = Producer({"bootstrap.servers": boot, "transactional.id": f"tx-{unique}"})
    p.init_transactions(10)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, key=b"%d" % i, value=b"aborted-%d" % i)
    p.flush(10)
    p.abort_transaction(10)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, key=b"%d" % i, value=b"committed-%d" % i)
    p.commit_transaction(10)
    c = Consumer({"bootstrap.servers": boot, "group.id": f"rc-{unique}", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed"})
    c.subscribe([topic])
    got = drain_confluent(c, 10)
    assert drain_confluent(c, 1, timeout=1.0) == []
    c.close()
    assert sorted(m.value() for m in got) == sorted(b"committed-%d" % i for i in range(10))
    per_partition: dict[int, list[int]] = {}
    for m in got:
        per_partition.setdefault(m.partition(), []).append(int(m.value().split(b"-")[1]))
    assert all(v == sorted(v) for v in per_partition.values())


def test_transactional_offset_commit(boot: str, unique: str) -> None:
    src, dst = f"src-{unique}", f"dst-{unique}"
    group = f"eos-{unique}"
    p0 = Producer({"bootstrap.servers": boot})
    for i in range(5):
        p0.produce(src, value=b"%d" % i)
    p0.flush(10)
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([src])
    got = drain_confluent(c, 5)
    p = Producer({"bootstrap.servers": boot, "transactional.id": f"eos-{unique}"})
    p.init_transactions(10)
    p.begin_transaction()
    for m in got:
        p.produce(dst, value=m.value())
    p.send_offsets_to_transaction([TopicPartition(src, 0, 5)], c.consumer_group_metadata(), 10)
    p.commit_transaction(10)
    assert c.committed([TopicPartition(src, 0)], 10)[0].offset == 5
    c.close()


def test_kafka_python_lists_and_describes_transactions(boot: str, unique: str) -> None:
    """ListTransactions and DescribeTransactions (KIP-664): each transactional id's state
    by Kafka's name, with its producer id, epoch and the partitions of an open transaction."""
    topic, open_id, done_id = f"txadm-{unique}", f"txadm-open-{unique}", f"txadm-done-{unique}"
    create_topic(boot, topic, 1)
    ongoing = Producer({"bootstrap.servers": boot, "transactional.id": open_id})
    ongoing.init_transactions(DEADLINE)
    ongoing.begin_transaction()
    ongoing.produce(topic, b"open")
    ongoing.flush(DEADLINE)
    done = Producer({"bootstrap.servers": boot, "transactional.id": done_id})
    done.init_transactions(DEADLINE)
    done.begin_transaction()
    done.produce(topic, b"done")
    done.commit_transaction(DEADLINE)
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        listed = {t.transactional_id: t.state.value
                  for ts in admin.list_transactions().values() for t in ts}
        assert listed[open_id] == "Ongoing" and listed[done_id] == "CompleteCommit"
        only = [t.transactional_id for ts in admin.list_transactions(
            state_filters=["CompleteCommit"]).values() for t in ts]
        assert done_id in only and open_id not in only
        described = admin.describe_transactions([open_id, done_id])
        assert described[open_id].state.value == "Ongoing"
        assert described[open_id].topic_partitions == {KTopicPartition(topic, 0)}
        assert described[open_id].transaction_start_time_ms > 0
        assert (described[done_id].state.value, described[done_id].topic_partitions) == (
            "CompleteCommit", set())
        with pytest.raises(kerr.TransactionalIdNotFoundError):
            admin.describe_transactions([f"never-{unique}"])
    finally:
        admin.close()
        ongoing.abort_transaction(DEADLINE)


def test_kafka_python_describes_producers(boot: str, unique: str) -> None:
    """DescribeProducers (KIP-664): each producer with state on a partition, with its
    epoch, last sequence and the largest timestamp of its last batch; a transactional
    one's coordinator epoch once a transaction of it ended there. A partition that does
    not exist is UNKNOWN_TOPIC_OR_PARTITION."""
    topic, tid = f"dprod-{unique}", f"dprod-tx-{unique}"
    create_topic(boot, topic, 2)
    idem = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "linger.ms": 0})
    base = int(time.time() * 1000) - 60_000
    for i in range(3):
        idem.produce(topic, b"v%d" % i, partition=0, timestamp=base + 10 * i)
        assert idem.flush(DEADLINE) == 0
    tx = Producer({"bootstrap.servers": boot, "transactional.id": tid})
    tx.init_transactions(DEADLINE)
    tx.begin_transaction()
    tx.produce(topic, b"t0", partition=0, timestamp=base + 100)
    tx.produce(topic, b"t1", partition=0, timestamp=base + 200)
    tx.commit_transaction(DEADLINE)
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        tx_pid = admin.describe_transactions([tid])[tid].producer_id
        leader = admin.describe_topics([topic])[0]["partitions"][0]["leader_id"]
        states = admin.describe_producers([KTopicPartition(topic, 0), KTopicPartition(topic, 1)])
        assert states[KTopicPartition(topic, 1)].active_producers == []
        by_pid = {p.producer_id: p for p in states[KTopicPartition(topic, 0)].active_producers}
        assert set(by_pid) >= {tx_pid} and len(by_pid) == 2
        [idem_pid] = set(by_pid) - {tx_pid}
        got = by_pid[idem_pid]
        assert (got.producer_epoch, got.last_sequence, got.last_timestamp,
                got.coordinator_epoch, got.current_transaction_start_offset) == (
            0, 2, base + 20, -1, -1)
        got = by_pid[tx_pid]
        assert (got.last_sequence, got.last_timestamp, got.coordinator_epoch,
                got.current_transaction_start_offset) == (1, base + 200, 0, -1)
        with pytest.raises(kerr.UnknownTopicOrPartitionError):
            admin.describe_producers([KTopicPartition(topic, 5)], broker_id=leader)
        with pytest.raises(kerr.UnknownTopicOrPartitionError):
            admin.describe_producers([KTopicPartition(f"none-{unique}", 0)], broker_id=leader)
    finally:
        admin.close()


def test_read_committed_consumer_waits_for_offsets_of_an_open_transaction(
        boot: str, unique: str) -> None:
    """KIP-447: while a transaction holds an offset for a partition, a read_committed
    consumer of the group gets no stable offset (UNSTABLE_OFFSET_COMMIT, retried), so it
    does not start from the offset before the transaction; it starts from the
    transaction's once it commits."""
    src, group = f"unstable-{unique}", f"unstable-g-{unique}"
    create_topic(boot, src, 1)
    p0 = Producer({"bootstrap.servers": boot})
    for i in range(10):
        p0.produce(src, value=b"%d" % i)
    assert p0.flush(DEADLINE) == 0
    meta = Consumer({"bootstrap.servers": boot, "group.id": group})
    p = Producer({"bootstrap.servers": boot, "transactional.id": f"unstable-{unique}"})
    p.init_transactions(DEADLINE)
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(src, 0, 5)], meta.consumer_group_metadata(),
                                  DEADLINE)
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([TopicPartition(src, 0)])
    assert drain_confluent(c, 1, timeout=2.0) == []
    p.commit_transaction(DEADLINE)
    got = drain_confluent(c, 1)
    c.close()
    meta.close()
    assert [m.offset() for m in got] == [5]
