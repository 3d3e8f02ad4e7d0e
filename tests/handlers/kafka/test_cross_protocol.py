"""One stream, two protocols: Kafka clients and pulsar-client on the same topics; consumer
group offsets that survive a restart and show as subscriptions with their backlog."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pulsar
import pytest
from confluent_kafka import Consumer, Producer

from tests._standalone import Standalone
from tests.handlers.kafka._wire import bootstrap, free_port
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import create_topic, drain_confluent

TIMEOUT_MS = 10_000


def test_kafka_to_pulsar(kafka_broker: Standalone, boot: str, unique: str) -> None:
    topic = f"k2p-{unique}"
    create_topic(boot, topic, 3)
    p = Producer({"bootstrap.servers": boot, "compression.type": "lz4"})
    sent = {}
    for i in range(30):
        key = b"key-%d" % i
        ts = 1_700_000_000_000 + i
        p.produce(topic, key=key, value=b"payload-%d" % i, headers=[("h", b"v%d" % i)], timestamp=ts)
        sent[key.decode()] = (b"payload-%d" % i, {"h": f"v{i}"}, ts)
    assert p.flush(10) == 0
    client = pulsar.Client(kafka_broker.pulsar_url)
    try:
        consumer = client.subscribe(topic, f"sub-{unique}",
                                    initial_position=pulsar.InitialPosition.Earliest)
        got = {}
        for _ in range(30):
            m = consumer.receive(TIMEOUT_MS)
            got[m.partition_key()] = (m.data(), m.properties(), m.event_timestamp())
            consumer.acknowledge(m)
        assert got == sent
    finally:
        client.close()


def test_pulsar_to_kafka(kafka_broker: Standalone, boot: str, unique: str) -> None:
    topic = f"p2k-{unique}"
    client = pulsar.Client(kafka_broker.pulsar_url)
    try:
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=5)
        before = int(time.time() * 1000)
        for i in range(12):
            producer.send_async(b"m%d" % i, None, partition_key=f"k{i}", properties={"n": str(i)},
                                event_timestamp=1_600_000_000_000 + i if i % 2 else None)
        producer.flush()
    finally:
        client.close()
    c = Consumer({"bootstrap.servers": boot, "group.id": f"g-{unique}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = drain_confluent(c, 12)
    c.close()
    assert [m.offset() for m in got] == list(range(12)), "offsets are contiguous across batches"
    assert [m.value() for m in got] == [b"m%d" % i for i in range(12)]
    assert [m.key() for m in got] == [b"k%d" % i for i in range(12)]
    assert [m.headers() for m in got] == [[("n", str(i).encode())] for i in range(12)]
    for i, m in enumerate(got):
        ts = m.timestamp()[1]
        if i % 2:
            assert ts == 1_600_000_000_000 + i
        else:
            assert before <= ts <= int(time.time() * 1000)


def _stats(s: Standalone, partition_topic: str) -> dict[str, Any]:
    web = s.addresses["web"][0]
    url = f"{web}/admin/v2/persistent/public/default/{partition_topic}/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_group_offsets_survive_restart_and_show_as_subscription(
        tmp_path_factory: pytest.TempPathFactory, unique: str) -> None:
    data = tmp_path_factory.mktemp("groups")
    conf = {**KAFKA_CONF, "bookiePort": free_port()}
    topic, group = f"gr-{unique}", f"group-{unique}"
    s = Standalone(data, conf=conf).start()
    try:
        boot = bootstrap(s.addresses)
        create_topic(boot, topic, 1)
        p = Producer({"bootstrap.servers": boot, "linger.ms": 0})
        for i in range(10):
            p.produce(topic, value=b"%d" % i)
            p.flush(10)  # one record per batch: one entry per message
        c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.subscribe([topic])
        got = drain_confluent(c, 4)
        c.commit(message=got[-1], asynchronous=False)
        c.close()
        sub = _stats(s, f"{topic}-partition-0")["subscriptions"][group]
        assert sub["msgBacklog"] == 6
    finally:
        s.kill()
    s = Standalone(data, conf=conf).start()
    try:
        boot = bootstrap(s.addresses)
        c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        rest = drain_confluent(c, 6)
        c.close()
        assert [m.offset() for m in rest] == list(range(4, 10))
        assert group in _stats(s, f"{topic}-partition-0")["subscriptions"]
    finally:
        s.kill()
