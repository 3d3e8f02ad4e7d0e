"""Cluster and topic administration through confluent-kafka's AdminClient, answered as
Apache Kafka's controller answers it: the errors, their codes and their messages."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    ElectionType,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, bootstrap
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE


def _refusal(future: object) -> tuple[int, str]:
    with pytest.raises(KafkaException) as err:
        future.result(DEADLINE)  # type: ignore[attr-defined]
    error = err.value.args[0]
    return error.code(), error.str()


def _partitions(admin: AdminClient, topic: str) -> int:
    return len(admin.list_topics(topic, timeout=DEADLINE).topics[topic].partitions)


def test_create_topics_checks_a_manual_replica_assignment(boot: str, unique: str) -> None:
    """Replicas on brokers that do not exist, a broker named twice, or partitions with
    different replica counts are INVALID_REPLICA_ASSIGNMENT, and nothing is created; an
    assignment to this broker creates one partition per entry."""
    admin = AdminClient({"bootstrap.servers": boot})
    unknown, twice, uneven, good = (f"{k}-{unique}" for k in ("unknown", "twice", "uneven", "good"))
    cases = {
        unknown: ([[7]], "The manual partition assignment includes broker 7, but no such broker "
                         "is registered."),
        twice: ([[0, 0]], "The manual partition assignment includes the broker 0 more than once."),
        uneven: ([[0], [0, 7]], "The manual partition assignment includes broker 7, but no such "
                                "broker is registered."),
    }
    futures = admin.create_topics([NewTopic(t, len(a), replica_assignment=a) for t, (a, _) in cases.items()])
    for topic, (_, message) in cases.items():
        assert _refusal(futures[topic]) == (KafkaError.INVALID_REPLICA_ASSIGNMENT, message)
    assert not set(cases) & set(admin.list_topics(timeout=DEADLINE).topics)

    admin.create_topics([NewTopic(good, 2, replica_assignment=[[0], [0]])])[good].result(DEADLINE)
    assert _partitions(admin, good) == 2


def test_create_partitions_refusals_are_kafkas(boot: str, unique: str) -> None:
    """No increase is INVALID_PARTITIONS with the controller's messages; assignments that do
    not match the partitions added, or name an unknown broker or one broker twice,
    INVALID_REPLICA_ASSIGNMENT. None of them adds a partition, nor does validate_only."""
    admin = AdminClient({"bootstrap.servers": boot})
    topic = f"grow-{unique}"
    admin.create_topics([NewTopic(topic, 3)])[topic].result(DEADLINE)

    def refused(count: int, assignment: list[list[int]] | None = None) -> tuple[int, str]:
        grow = NewPartitions(topic, count) if assignment is None else NewPartitions(topic, count, assignment)
        return _refusal(admin.create_partitions([grow])[topic])

    assert refused(2) == (KafkaError.INVALID_PARTITIONS,
                          f"The topic {topic} currently has 3 partition(s); 2 would not be an increase.")
    assert refused(3) == (KafkaError.INVALID_PARTITIONS, "Topic already has 3 partition(s).")
    assert refused(5, [[0]]) == (KafkaError.INVALID_REPLICA_ASSIGNMENT, "Attempted to add 2 "
                                 "additional partition(s), but only 1 assignment(s) were specified.")
    assert refused(4, [[9]]) == (KafkaError.INVALID_REPLICA_ASSIGNMENT, "The manual partition "
                                 "assignment includes broker 9, but no such broker is registered.")
    assert refused(4, [[0, 0]]) == (KafkaError.INVALID_REPLICA_ASSIGNMENT, "The manual partition "
                                    "assignment includes the broker 0 more than once.")
    admin.create_partitions([NewPartitions(topic, 6)], validate_only=True)[topic].result(DEADLINE)
    assert _partitions(admin, topic) == 3
    admin.create_partitions([NewPartitions(topic, 5, [[0], [0]])])[topic].result(DEADLINE)
    assert _partitions(admin, topic) == 5


def test_elect_leaders_finds_no_election_needed(boot: str, unique: str) -> None:
    """Every partition's one replica leads it, so neither election type is needed
    (ELECTION_NOT_NEEDED per partition, as Kafka answers a partition led by its preferred
    replica); an unknown partition is UNKNOWN_TOPIC_OR_PARTITION; asked for all
    partitions, no partition needs one."""
    admin = AdminClient({"bootstrap.servers": boot})
    topic = f"elect-{unique}"
    admin.create_topics([NewTopic(topic, 2)])[topic].result(DEADLINE)
    for election in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        results = admin.elect_leaders(election, [TopicPartition(topic, 0), TopicPartition(topic, 1),
                                                 TopicPartition(topic, 5)]).result(DEADLINE)
        codes = {tp.partition: error.code() for tp, error in results.items()}
        assert codes == {0: KafkaError.ELECTION_NOT_NEEDED, 1: KafkaError.ELECTION_NOT_NEEDED,
                         5: KafkaError.UNKNOWN_TOPIC_OR_PART}
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(DEADLINE) == {}


def test_describe_user_scram_credentials_finds_none(boot: str) -> None:
    """No user has a SCRAM credential (the listener does not authenticate with SASL): all
    users is none, and a user named is RESOURCE_NOT_FOUND, as Kafka answers."""
    admin = AdminClient({"bootstrap.servers": boot})
    assert admin.describe_user_scram_credentials().result(DEADLINE) == {}
    code, message = _refusal(admin.describe_user_scram_credentials(["alice"])["alice"])
    # librdkafka's copy of this message runs on past its end (a stray byte follows it)
    assert code == KafkaError.RESOURCE_NOT_FOUND
    assert message.startswith("Attempt to describe a user credential that does not exist: alice")


def test_an_unknown_election_type_is_an_invalid_request(boot: str) -> None:
    """What a client library does not send: an unknown election type is INVALID_REQUEST
    for the whole request."""
    with Wire(boot) as w:
        elect = w.call(43, 2, Data(election_type=2, topic_partitions=[], timeout_ms=1000))
    assert (elect.error_code, elect.replica_election_results) == (ErrorCode.INVALID_REQUEST, [])


def test_a_user_named_twice_is_a_duplicate_resource(boot: str) -> None:
    with Wire(boot) as w:
        scram = w.call(50, 0, Data(users=[Data(name="bob"), Data(name="bob")]))
    assert scram.error_code == 0
    assert [(r.user, r.error_code, r.error_message) for r in scram.results] == [
        ("bob", ErrorCode.DUPLICATE_RESOURCE,
         "Cannot describe SCRAM credentials for the same user twice in a single request: bob")]


def test_create_topics_refuses_a_non_positive_count_in_kafkas_words(boot: str, unique: str) -> None:
    """What librdkafka checks before sending: a replication factor of 0 is
    INVALID_REPLICATION_FACTOR, checked before the partition count (as Kafka's controller
    does); a partition count of 0 is INVALID_PARTITIONS."""

    def create(partitions: int, factor: int) -> tuple[int, str]:
        topic = Data(name=f"count-{unique}", num_partitions=partitions, replication_factor=factor,
                     assignments=[], configs=[])
        with Wire(boot) as w:
            res = w.call(19, 7, Data(topics=[topic], timeout_ms=1000, validate_only=False)).topics[0]
        return res.error_code, res.error_message

    assert create(0, 0) == (ErrorCode.INVALID_REPLICATION_FACTOR,
                            "Replication factor must be larger than 0, or -1 to use the default value.")
    assert create(0, 1) == (ErrorCode.INVALID_PARTITIONS,
                            "Number of partitions was set to an invalid non-positive value.")


def test_a_topic_named_like_a_partition_is_refused_and_the_topic_it_names_stays_free(
        boot: str, unique: str) -> None:
    """Kafka partition N of topic x is stored as x-partition-N, so a Kafka topic of that
    name is refused (INVALID_TOPIC_EXCEPTION, saying why), and x can still be created."""
    base = f"orders-{unique}"

    def create(name: str) -> tuple[int, str]:
        topic = Data(name=name, num_partitions=3, replication_factor=-1, assignments=[], configs=[])
        with Wire(boot) as w:
            res = w.call(19, 7, Data(topics=[topic], timeout_ms=1000, validate_only=False)).topics[0]
        return res.error_code, res.error_message

    code, message = create(f"{base}-partition-0")
    assert code == ErrorCode.INVALID_TOPIC_EXCEPTION and "partition of topic" in message
    assert create(base)[0] == 0


def test_the_brokers_partition_and_topic_limits_hold_for_kafka_clients(tmp_path) -> None:
    """maxNumPartitionsPerPartitionedTopic and maxTopicsPerNamespace bound what Kafka's
    CreateTopics, CreatePartitions and auto-creation make, as they bound Pulsar's clients
    and the admin API: INVALID_PARTITIONS and POLICY_VIOLATION, in Kafka's terms."""
    conf = {**KAFKA_CONF, "maxNumPartitionsPerPartitionedTopic": 4, "maxTopicsPerNamespace": 3}
    with Standalone(tmp_path, conf=conf) as s, Wire(bootstrap(s.addresses)) as w:
        def create(name: str, partitions: int) -> tuple[int, str]:
            topic = Data(name=name, num_partitions=partitions, replication_factor=-1, assignments=[],
                         configs=[])
            res = w.call(19, 7, Data(topics=[topic], timeout_ms=1000, validate_only=False)).topics[0]
            return res.error_code, res.error_message

        def grow(name: str, count: int) -> tuple[int, str]:
            res = w.call(37, 3, Data(topics=[Data(name=name, count=count, assignments=None)],
                                     timeout_ms=1000, validate_only=False)).results[0]
            return res.error_code, res.error_message

        assert create("wide", 5) == (ErrorCode.INVALID_PARTITIONS,
                                     "Number of partitions should be less than or equal to 4")
        assert create("three", 3)[0] == 0
        assert grow("three", 5)[0] == ErrorCode.INVALID_PARTITIONS
        # each partition counts as a topic: four at once pass the three allowed
        assert create("four", 4) == (ErrorCode.POLICY_VIOLATION, "Exceed maximum number of topics in namespace.")


def test_create_topics_names_every_config_without_a_value(boot: str, unique: str) -> None:
    topic = Data(name=f"nulls-{unique}", num_partitions=1, replication_factor=-1, assignments=[],
                 configs=[Data(name="retention.ms", value=None), Data(name="max.message.bytes", value="10"),
                          Data(name="retention.bytes", value=None)])
    with Wire(boot) as w:
        res = w.call(19, 7, Data(topics=[topic], timeout_ms=1000, validate_only=False)).topics[0]
    assert (res.error_code, res.error_message) == (
        ErrorCode.INVALID_CONFIG, "Null value not supported for topic configs: retention.ms,retention.bytes")


def test_group_offsets_and_deletion_while_the_group_has_members(boot: str, unique: str) -> None:
    """As Kafka's group coordinator answers an admin client: a group with members is
    NON_EMPTY_GROUP to delete and UNKNOWN_MEMBER_ID to alter offsets in (only members
    commit), while its committed offsets stay listable; once it is empty, both go through."""
    topic, group = f"grp-{unique}", f"grp-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(DEADLINE)
    consumer = Consumer({"bootstrap.servers": boot, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE
        while not consumer.assignment():
            assert time.monotonic() < deadline, "no assignment"
            consumer.poll(0.1)
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        assert _refusal(admin.delete_consumer_groups([group])[group])[0] == KafkaError.NON_EMPTY_GROUP
        move = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 0)])]
        altered = admin.alter_consumer_group_offsets(move)[group].result(DEADLINE)
        assert [tp.error.code() for tp in altered.topic_partitions] == [KafkaError.UNKNOWN_MEMBER_ID]
        listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
        assert [(tp.partition, tp.offset) for tp in listed.result(DEADLINE).topic_partitions] == [(0, 0)]
    finally:
        consumer.close()
    altered = admin.alter_consumer_group_offsets(move)[group].result(DEADLINE)
    assert [tp.error for tp in altered.topic_partitions] == [None]
    admin.delete_consumer_groups([group])[group].result(DEADLINE)


def test_growing_a_partitioned_topic_keeps_its_properties(kafka_broker, boot: str, unique: str) -> None:
    """CreatePartitions raises the count in the partitioned topic's metadata, which also
    holds the properties pulsar-admin set on it: they stay."""
    from gateway._admin_cli import AdminClient as PulsarAdmin

    web = PulsarAdmin(kafka_broker.addresses["web"][0], timeout=30)
    path = f"/admin/v2/persistent/public/default/props-{unique}"
    web.put(f"{path}/partitions", {"partitions": 2, "properties": {"owner": "billing"}})
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_partitions([NewPartitions(f"props-{unique}", 4)])[f"props-{unique}"].result(DEADLINE)
    assert _partitions(admin, f"props-{unique}") == 4
    assert web.get(f"{path}/properties") == {"owner": "billing"}
