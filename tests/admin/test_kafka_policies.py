"""Policies set over REST apply to Kafka clients too, and Kafka consumer groups show in
topic stats as subscriptions with their backlog."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

from .conftest import FAST_CHECKS, wait_for

kafka = pytest.importorskip("kafka")


@pytest.fixture(scope="module")
def kserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("kafka-admin")
    s = Standalone(data, conf={**FAST_CHECKS, "messagingProtocols": "pulsar,kafka",
                               "kafkaListeners": "PLAINTEXT://127.0.0.1:0"}).start()
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture(scope="module")
def kadmin(kserver: Standalone) -> AdminClient:
    return AdminClient(kserver.addresses["web"][0], timeout=30)


def _bootstrap(server: Standalone) -> str:
    return server.addresses["kafka"][0].split("://", 1)[1]


def _produce(server: Standalone, topic: str, n: int) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=_bootstrap(server))
    try:
        for i in range(n):
            producer.send(topic, f"v{i}".encode()).get(timeout=10)
    finally:
        producer.close()


def _consume_and_commit(server: Standalone, topic: str, group: str, n: int) -> None:
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=_bootstrap(server), group_id=group,
                                   auto_offset_reset="earliest", enable_auto_commit=False,
                                   consumer_timeout_ms=10_000)
    try:
        got = 0
        for _ in consumer:
            got += 1
            if got == n:
                break
        assert got == n
        consumer.commit()
    finally:
        consumer.close()


def _group_backlog(admin: AdminClient, topic: str, group: str) -> int:
    stats = admin.get(f"/admin/v2/persistent/public/default/{topic}/partitioned-stats")
    return int(stats["subscriptions"][group]["msgBacklog"])


def test_kafka_group_is_a_subscription(kserver: Standalone, kadmin: AdminClient, unique: str) -> None:
    topic = f"k-{unique}"
    _produce(kserver, topic, 5)
    _consume_and_commit(kserver, topic, "g1", 2)
    stats = kadmin.get(f"/admin/v2/persistent/public/default/{topic}/partitioned-stats")
    assert stats["msgInCounter"] == 5
    assert stats["subscriptions"]["g1"]["msgBacklog"] == 3


def test_ttl_set_by_rest_expires_kafka_group_backlog(kserver: Standalone, kadmin: AdminClient, unique: str) -> None:
    topic = f"k-{unique}"
    _produce(kserver, topic, 4)
    _consume_and_commit(kserver, topic, "g", 1)
    assert _group_backlog(kadmin, topic, "g") == 3
    kadmin.post(f"/admin/v2/persistent/public/default/{topic}/messageTTL", messageTTL=1)
    wait_for(lambda: _group_backlog(kadmin, topic, "g") == 0, timeout=15)


def test_auto_topic_creation_disabled_by_rest(kserver: Standalone, kadmin: AdminClient, unique: str) -> None:
    kadmin.post("/admin/v2/namespaces/public/default/autoTopicCreation", {"allowAutoTopicCreation": False})
    try:
        producer = kafka.KafkaProducer(bootstrap_servers=_bootstrap(kserver), max_block_ms=2000)
        try:
            with pytest.raises(kafka.errors.KafkaError):
                producer.send(f"never-{unique}", b"x").get(timeout=5)
        finally:
            producer.close()
        assert f"persistent://public/default/never-{unique}" not in kadmin.get("/admin/v2/persistent/public/default")
    finally:
        kadmin.delete("/admin/v2/namespaces/public/default/autoTopicCreation")
