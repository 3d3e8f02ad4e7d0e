"""Kafka clients authenticating with SASL/PLAIN and a Pulsar token as the password (the
Kafka-on-Pulsar convention), and what their roles may do."""

from __future__ import annotations

import struct
import time
import warnings
from collections.abc import Iterator

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient as AdminClient_
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

with warnings.catch_warnings():
    # kafka-python 3.0 reads its schemas with a deprecated importlib.resources call.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

from gateway._admin_cli import AdminClient
from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from tests._auth import SUPER_USER, Tokens
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, bootstrap

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")

WAIT = 20.0


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory, tokens: Tokens) -> Iterator[Standalone]:
    conf = tokens.conf(kafkaListeners="SASL_PLAINTEXT://127.0.0.1:0")
    with Standalone(tmp_path_factory.mktemp("kafka-sasl"), conf=conf) as s:
        yield s


@pytest.fixture(scope="module")
def boot(sasl_broker: Standalone) -> str:
    return bootstrap(sasl_broker.addresses)


@pytest.fixture(scope="module")
def admin(sasl_broker: Standalone, tokens: Tokens) -> AdminClient:
    return AdminClient(sasl_broker.addresses["web"][0], timeout=30, token=tokens.token(SUPER_USER))


def _kafka_python(boot: str, token: str, **kw):
    return dict(bootstrap_servers=boot, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                sasl_plain_username="public/default", sasl_plain_password=f"token:{token}", **kw)


def _confluent(boot: str, token: str, **kw) -> dict:
    return {"bootstrap.servers": boot, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "public/default", "sasl.password": f"token:{token}", **kw}


def _plain(token: str, user: str = "public/default") -> bytes:
    return f"\0{user}\0token:{token}".encode()


def _closed(wire: Wire) -> bool:
    try:
        return wire.sock.recv(1) == b""
    except ConnectionError:
        return True


def test_kafka_python_produces_and_consumes_with_a_token(boot, tokens, unique):
    topic = f"kp-{unique}"
    producer = KafkaProducer(**_kafka_python(boot, tokens.token(SUPER_USER)))
    producer.send(topic, b"hello").get(timeout=WAIT)
    producer.close()
    consumer = KafkaConsumer(topic, **_kafka_python(boot, tokens.token(SUPER_USER)),
                             auto_offset_reset="earliest", consumer_timeout_ms=int(WAIT * 1000))
    assert next(iter(consumer)).value == b"hello"
    consumer.close()


def test_confluent_kafka_produces_and_consumes_with_a_token(boot, tokens, unique):
    topic = f"ck-{unique}"
    producer = confluent_kafka.Producer(_confluent(boot, tokens.token(SUPER_USER)))
    producer.produce(topic, b"hello")
    assert producer.flush(WAIT) == 0
    consumer = confluent_kafka.Consumer(_confluent(boot, tokens.token(SUPER_USER), **{
        "group.id": f"g-{unique}", "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    deadline, got = time.monotonic() + WAIT, None
    while got is None and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got = msg.value()
    consumer.close()
    assert got == b"hello"


def test_confluent_kafka_with_a_bad_token_reports_the_authentication_failure(boot, tokens):
    errors: list[confluent_kafka.KafkaError] = []
    producer = confluent_kafka.Producer(_confluent(boot, tokens.token(SUPER_USER, expires_in=-60),
                                                   error_cb=errors.append))
    deadline = time.monotonic() + WAIT
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no error reported"
    assert errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
    assert "Authentication failed" in errors[0].str()


@pytest.mark.parametrize("version", [0, 1])
def test_handshake_then_authenticate_on_the_wire(boot, tokens, version):
    with Wire(boot) as wire:
        versions = wire.call(18, 0, Data())
        served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert served[17] == (0, 1) and served[36] == (0, 2)
        hs = wire.call(17, version, Data(mechanism="PLAIN"))
        assert (hs.error_code, hs.mechanisms) == (0, ["PLAIN"])
        if version == 1:
            ok = wire.call(36, 1, Data(auth_bytes=_plain(tokens.token(SUPER_USER))))
            assert (ok.error_code, ok.error_message) == (0, None)
        else:  # KIP-43: the token unframed, answered unframed
            token = _plain(tokens.token(SUPER_USER))
            wire.send_raw(struct.pack(">i", len(token)) + token)
            assert wire.read_frame() == b""
        meta = wire.call(3, 9, Data(topics=[], allow_auto_topic_creation=False))
        assert meta.brokers


@pytest.mark.parametrize("password", ["token:garbage", "not-a-token", "token:"])
def test_wrong_password_is_sasl_authentication_failed_and_closes(boot, password):
    with Wire(boot) as wire:
        wire.call(17, 1, Data(mechanism="PLAIN"))
        failed = wire.call(36, 2, Data(auth_bytes=f"\0user\0{password}".encode()))
        assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert failed.error_message.startswith("Authentication failed")
        assert _closed(wire)


def test_expired_token_is_refused(boot, tokens):
    with Wire(boot) as wire:
        wire.call(17, 1, Data(mechanism="PLAIN"))
        failed = wire.call(36, 2, Data(auth_bytes=_plain(tokens.token(SUPER_USER, expires_in=-60))))
        assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "expired" in failed.error_message


def test_other_mechanism_is_unsupported(boot):
    with Wire(boot) as wire:
        hs = wire.call(17, 1, Data(mechanism="SCRAM-SHA-256"))
        assert (hs.error_code, hs.mechanisms) == (ErrorCode.UNSUPPORTED_SASL_MECHANISM, ["PLAIN"])
        assert _closed(wire)


@pytest.mark.parametrize("api_key, version, body", [
    (3, 9, Data(topics=None, allow_auto_topic_creation=False)),
    (0, 9, Data(transactional_id=None, acks=1, timeout_ms=1000, topic_data=[])),
])
def test_requests_before_authenticating_are_never_served(boot, api_key, version, body):
    with Wire(boot) as wire:
        wire.send(api_key, version, body)
        assert _closed(wire)
    with Wire(boot) as wire:  # nor after a handshake alone
        wire.call(17, 1, Data(mechanism="PLAIN"))
        wire.send(api_key, version, body)
        assert _closed(wire)


def test_kafka_python_without_sasl_is_not_served(boot):
    with pytest.raises(KafkaTimeoutError):
        KafkaProducer(bootstrap_servers=boot, max_block_ms=3000, request_timeout_ms=2000)


def test_produce_and_fetch_need_the_roles_permissions(boot, tokens, admin, unique):
    topic, role = f"perm-{unique}", f"kbob-{unique}"
    admin.put(f"/admin/v2/persistent/public/default/{topic}")
    producer = KafkaProducer(**_kafka_python(boot, tokens.token(role)), max_block_ms=5000)
    with pytest.raises(TopicAuthorizationFailedError):
        producer.send(topic, b"refused").get(timeout=WAIT)
    admin.post(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce"])
    producer.send(topic, b"granted").get(timeout=WAIT)
    producer.close()
    with Wire(boot) as wire:
        wire.call(17, 1, Data(mechanism="PLAIN"))
        assert wire.call(36, 1, Data(auth_bytes=_plain(tokens.token(role)))).error_code == 0
        fetch = Data(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                     session_id=0, session_epoch=-1, topics=[Data(topic=topic, partitions=[
                         Data(partition=0, fetch_offset=0, log_start_offset=-1,
                              partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id="")
        refused = wire.call(1, 11, fetch)
        assert refused.responses[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        admin.post(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce", "consume"])
        served = wire.call(1, 11, fetch)
        assert served.responses[0].partitions[0].error_code == 0
        assert served.responses[0].partitions[0].records


def test_sasl_on_a_broker_without_authentication_is_illegal_state(kafka_plain):
    with Wire(kafka_plain) as wire:
        hs = wire.call(17, 1, Data(mechanism="PLAIN"))
        assert hs.error_code == ErrorCode.ILLEGAL_SASL_STATE


@pytest.fixture(scope="module")
def kafka_plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    conf = {"kafkaListeners": "PLAINTEXT://127.0.0.1:0"}
    with Standalone(tmp_path_factory.mktemp("kafka-plain"), conf=conf) as s:
        yield bootstrap(s.addresses)


def test_creating_and_deleting_topics_needs_the_tenants_admin(boot, tokens, admin, unique):
    role = f"kcarol-{unique}"
    admin.post(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce", "consume"])
    plain = AdminClient_(_confluent(boot, tokens.token(role)))
    topic = f"managed-{unique}"
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        plain.create_topics([NewTopic(topic, 1, 1)])[topic].result(WAIT)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    superuser = AdminClient_(_confluent(boot, tokens.token(SUPER_USER)))
    superuser.create_topics([NewTopic(topic, 1, 1)])[topic].result(WAIT)
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        plain.delete_topics([topic])[topic].result(WAIT)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    superuser.delete_topics([topic])[topic].result(WAIT)


def test_a_large_request_before_authenticating_closes_the_connection(boot):
    with Wire(boot) as wire:
        wire.send_raw(struct.pack(">i", 50 * 1024 * 1024) + b"\0" * 1024)
        assert _closed(wire)


def test_altering_topic_configs_needs_the_tenants_admin(boot, tokens, admin, unique):
    role, topic = f"kdan-{unique}", f"configs-{unique}"
    admin.put(f"/admin/v2/persistent/public/default/{topic}")
    admin.post(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce", "consume"])
    plain = AdminClient_(_confluent(boot, tokens.token(role)))
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        plain.incremental_alter_configs([resource])[resource].result(WAIT)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    described = plain.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    assert "retention.ms" in next(iter(described.values())).result(WAIT)
    superuser = AdminClient_(_confluent(boot, tokens.token(SUPER_USER)))
    superuser.incremental_alter_configs([resource])[resource].result(WAIT)


def test_describing_producers_log_dirs_and_deleting_offsets_are_authorized(boot, tokens, admin, unique):
    """DescribeProducers and OffsetDelete need consume on the topic (Kafka: READ), and
    DescribeLogDirs, which lists every topic and its size, a super-user (Kafka: DESCRIBE
    on the cluster)."""
    role, topic = f"kdave-{unique}", f"described-{unique}"
    producer = KafkaProducer(**_kafka_python(boot, tokens.token(SUPER_USER)))
    producer.send(topic, b"m").get(timeout=WAIT)
    producer.close()
    with Wire(boot) as wire:  # a group with a committed offset, for OffsetDelete to find
        wire.call(17, 1, Data(mechanism="PLAIN"))
        assert wire.call(36, 1, Data(auth_bytes=_plain(tokens.token(SUPER_USER)))).error_code == 0
        committed = wire.call(8, 2, Data(group_id=f"g-{unique}", generation_id_or_member_epoch=-1,
                                         member_id="", topics=[Data(name=topic, partitions=[
                                             Data(partition_index=0, committed_offset=1,
                                                  committed_metadata="")])]))
        assert committed.topics[0].partitions[0].error_code == 0

    def ask(token: str) -> tuple[int, int, int]:
        with Wire(boot) as wire:
            wire.call(17, 1, Data(mechanism="PLAIN"))
            assert wire.call(36, 1, Data(auth_bytes=_plain(token))).error_code == 0
            producers = wire.call(61, 0, Data(topics=[Data(name=topic, partition_indexes=[0])]))
            dirs = wire.call(35, 4, Data(topics=None))
            deleted = wire.call(47, 0, Data(group_id=f"g-{unique}", topics=[
                Data(name=topic, partitions=[Data(partition_index=0)])]))
            offsets_error = deleted.error_code or deleted.topics[0].partitions[0].error_code
            return producers.topics[0].partitions[0].error_code, dirs.error_code, offsets_error

    assert ask(tokens.token(role)) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                       ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                       ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    admin.post(f"/admin/v2/namespaces/public/default/permissions/{role}", ["consume"])
    got = ask(tokens.token(role))
    assert got[0] == 0 and got[1] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert got[2] == 0  # the offset is deleted
    assert ask(tokens.token(SUPER_USER))[:2] == (0, 0)


def test_a_transaction_adds_and_commits_only_what_the_role_may(boot, tokens, admin, unique):
    """AddPartitionsToTxn needs produce on every topic (Kafka: WRITE), else it adds none:
    the refused topic answers TOPIC_AUTHORIZATION_FAILED and the others
    OPERATION_NOT_ATTEMPTED; TxnOffsetCommit needs consume on each topic (Kafka: READ)."""
    role, mine, other = f"ktx-{unique}", f"mine-{unique}", f"other-{unique}"
    producer = KafkaProducer(**_kafka_python(boot, tokens.token(SUPER_USER)))
    for topic in (mine, other):
        producer.send(topic, b"m").get(timeout=WAIT)
    producer.close()
    admin.post(f"/admin/v2/persistent/public/default/{mine}/permissions/{role}", ["produce"])
    with Wire(boot) as wire:
        wire.call(17, 1, Data(mechanism="PLAIN"))
        assert wire.call(36, 1, Data(auth_bytes=_plain(tokens.token(role)))).error_code == 0
        init = wire.call(22, 1, Data(transactional_id=f"tx-{unique}", transaction_timeout_ms=60000))
        assert init.error_code == 0
        ids = dict(transactional_id=f"tx-{unique}", producer_id=init.producer_id,
                   producer_epoch=init.producer_epoch)
        added = wire.call(24, 1, Data(**ids, topics=[Data(name=mine, partitions=[0]),
                                                     Data(name=other, partitions=[0])]))
        assert {r.name: r.results[0].error_code for r in added.results} == {
            mine: ErrorCode.OPERATION_NOT_ATTEMPTED, other: ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert wire.call(24, 1, Data(**ids, topics=[Data(name=mine, partitions=[0])])).results[0] \
            .results[0].error_code == 0
        assert wire.call(25, 1, Data(**ids, group_id=f"g-{unique}")).error_code == 0
        committed = wire.call(28, 2, Data(**ids, group_id=f"g-{unique}", topics=[Data(name=mine, partitions=[
            Data(partition_index=0, committed_offset=1, committed_metadata="")])]))
        assert committed.topics[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
