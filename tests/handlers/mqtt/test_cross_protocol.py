"""One stream: what an MQTT client publishes a Kafka consumer reads and a Spark batch read
sees, and what a Kafka producer writes reaches MQTT subscribers (payload, with its key and
headers as MQTT 5 user properties). Pulsar and AMQP round trips are in test_paho.py and
tests/handlers/amqp/test_methods.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests._standalone import Standalone
from tests.handlers.kafka._wire import bootstrap
from tests.spark import conftest as spark

from ._clients import V5, WAIT, subscribe, unique

#: tests/spark's SparkSession fixture, skipped (failed, in CI) without a JRE or pyspark
spark_session = spark.session


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """This module's broker serves Kafka beside MQTT (the package's serves Pulsar and MQTT)."""
    data: Path = tmp_path_factory.mktemp("mqtt-cross")
    s = Standalone(data, conf={"messagingProtocols": "pulsar,kafka,mqtt",
                               "mqttListeners": "mqtt://127.0.0.1:0"}).start()
    try:
        yield s
    finally:
        s.kill()


def test_mqtt_and_kafka_read_each_others_messages(connect: Any, standalone: Standalone) -> None:
    topic = unique("kbridge")  # one level: a name Kafka allows too
    pub, _ = connect(version=V5)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("site", "north")
    pub.publish(topic, b"from mqtt", qos=1, properties=props).wait_for_publish(WAIT)
    kc = Consumer({"bootstrap.servers": bootstrap(standalone.addresses), "group.id": f"g-{topic}",
                   "auto.offset.reset": "earliest"})
    try:
        kc.subscribe([topic])
        got = None
        end = time.monotonic() + WAIT
        while got is None and time.monotonic() < end:
            msg = kc.poll(0.2)
            if msg is not None and not msg.error():
                got = msg
    finally:
        kc.close()
    assert got is not None and got.value() == b"from mqtt"
    assert ("site", b"north") in (got.headers() or [])

    sub, box = connect(version=V5)
    subscribe(sub, topic, 1)
    kp = Producer({"bootstrap.servers": bootstrap(standalone.addresses)})
    kp.produce(topic, key=b"k-1", value=b"from kafka", headers=[("source", b"kafka")])
    assert kp.flush(WAIT) == 0
    m = box.wait(1)[0]
    assert m.payload == b"from kafka"
    users = dict(m.properties.UserProperty)
    assert users.get("source") == "kafka"
    assert "k-1" in users.values()  # the record's key, as a user property


def test_a_spark_batch_read_sees_what_mqtt_clients_published(
        spark_session: Any, connect: Any, standalone: Standalone) -> None:
    topic = unique("spark")
    pub, _ = connect(version=V5)
    for i in range(5):
        pub.publish(topic, b"reading-%d" % i, qos=1).wait_for_publish(WAIT)
    rows = spark.reader(spark_session, standalone, topic).collect()
    assert sorted(bytes(r.value) for r in rows) == [b"reading-%d" % i for i in range(5)]
    assert all(r.topic == topic for r in rows)
