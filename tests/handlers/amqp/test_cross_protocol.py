"""One stream: what an AMQP client publishes to an exchange a Pulsar, Kafka or WebSocket
consumer reads on the exchange's topic, and a Spark batch read sees, and what they
produce there reaches the bound queues; durable queues keep persistent messages, and
unacknowledged deliveries, across a restart."""

from __future__ import annotations

import base64
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pika
import pulsar
import pytest
import websocket
from confluent_kafka import Consumer, Producer

from tests._standalone import Standalone
from tests.handlers.amqp.conftest import AMQP_CONF, amqp_port
from tests.handlers.amqp.test_pika import get
from tests.handlers.kafka._wire import bootstrap
from tests.spark import conftest as spark

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)

WAIT = 10.0
#: tests/spark's SparkSession fixture, skipped (failed, in CI) without a JRE or pyspark
spark_session = spark.session


def _params(s: Standalone) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", amqp_port(s), connection_attempts=1,
                                     credentials=pika.PlainCredentials("guest", "guest"))


def test_amqp_publish_is_read_by_pulsar_and_kafka(amqp_broker: Standalone, unique: str) -> None:
    ex = f"orders-{unique}"
    client = pulsar.Client(amqp_broker.pulsar_url)
    try:
        conn = pika.BlockingConnection(_params(amqp_broker))
        ch = conn.channel()
        ch.exchange_declare(ex, "topic", durable=True)
        reader = client.subscribe(f"persistent://public/default/{ex}", "p",
                                  initial_position=pulsar.InitialPosition.Earliest)
        ch.confirm_delivery()
        ch.basic_publish(ex, "eu.new", b"order-1",
                         pika.BasicProperties(headers={"tenant": "acme"}, timestamp=1_700_000_000,
                                              content_type="text/plain"))
        m = reader.receive(int(WAIT * 1000))
        assert m.data() == b"order-1" and m.partition_key() == "eu.new"
        assert m.properties()["tenant"] == "acme" and m.event_timestamp() == 1_700_000_000_000
        conn.close()
        kc = Consumer({"bootstrap.servers": bootstrap(amqp_broker.addresses), "group.id": f"k-{unique}",
                       "auto.offset.reset": "earliest"})
        kc.subscribe([ex])
        end = time.monotonic() + WAIT
        got = None
        while got is None and time.monotonic() < end:
            msg = kc.poll(0.2)
            if msg is not None and not msg.error():
                got = msg
        kc.close()
        assert got is not None and got.value() == b"order-1" and got.key() == b"eu.new"
        assert ("tenant", b"acme") in (got.headers() or [])
    finally:
        client.close()


def test_pulsar_and_kafka_producers_reach_bound_queues(amqp_broker: Standalone, unique: str) -> None:
    ex = f"events-{unique}"
    conn = pika.BlockingConnection(_params(amqp_broker))
    ch = conn.channel()
    ch.exchange_declare(ex, "direct", durable=True)
    q = ch.queue_declare(f"eu-{unique}", durable=True).method.queue
    ch.queue_bind(q, ex, routing_key="eu")
    client = pulsar.Client(amqp_broker.pulsar_url)
    try:
        producer = client.create_producer(f"persistent://public/default/{ex}")
        producer.send(b"from-pulsar", partition_key="eu", properties={"source": "pulsar"})
        producer.send(b"not-for-eu", partition_key="us")
        kp = Producer({"bootstrap.servers": bootstrap(amqp_broker.addresses)})
        kp.produce(ex, key=b"eu", value=b"from-kafka", headers=[("source", b"kafka")])
        kp.flush(WAIT)
        bodies = []
        for _ in range(2):
            method, props, body = get(ch, q)
            assert method is not None and method.routing_key == "eu" and method.exchange == ex
            bodies.append((body, props.headers["source"]))
        assert sorted(bodies) == [(b"from-kafka", "kafka"), (b"from-pulsar", "pulsar")] or \
            sorted((b, s.decode() if isinstance(s, bytes) else s) for b, s in bodies) == \
            [(b"from-kafka", "kafka"), (b"from-pulsar", "pulsar")]
        assert ch.basic_get(q)[0] is None
    finally:
        client.close()
        conn.close()


def test_a_large_message_is_one_message_to_amqp_and_pulsar_both_ways(
        amqp_broker: Standalone, unique: str) -> None:
    """A body over maxMessageSize is stored as Pulsar stores a chunked message: a Pulsar
    consumer gets it whole, and a Pulsar producer's chunked (and compressed) message
    reaches an AMQP queue whole."""
    ex = f"big-{unique}"
    conn = pika.BlockingConnection(_params(amqp_broker))
    ch = conn.channel()
    ch.exchange_declare(ex, "fanout", durable=True)
    q = ch.queue_declare(f"big-{unique}", durable=True).method.queue
    ch.queue_bind(q, ex)
    client = pulsar.Client(amqp_broker.pulsar_url)
    try:
        reader = client.subscribe(f"persistent://public/default/{ex}", "p",
                                  initial_position=pulsar.InitialPosition.Earliest)
        body = os.urandom(12 << 20)
        ch.confirm_delivery()
        ch.basic_publish(ex, "k", body, pika.BasicProperties(headers={"n": "1"}))
        m = reader.receive(int(WAIT * 1000))
        assert m.data() == body and m.partition_key() == "k" and m.properties()["n"] == "1"
        reader.acknowledge(m)
        assert get(ch, q)[2] == body

        producer = client.create_producer(f"persistent://public/default/{ex}", chunking_enabled=True,
                                          batching_enabled=False,
                                          compression_type=pulsar.CompressionType.LZ4)
        big = os.urandom(7 << 20)  # does not compress: more than one chunk of 5 MiB
        producer.send(big, properties={"n": "2"})
        method, props, got = get(ch, q)
        assert got == big and props.headers["n"] == "2"
        assert ch.basic_get(q)[0] is None  # one message, not one per chunk
    finally:
        client.close()
        conn.close()


def test_durable_queue_keeps_persistent_and_unacked_messages_across_a_restart(
        tmp_path: Path, unique: str) -> None:
    s = Standalone(tmp_path / "data", conf=AMQP_CONF).start()
    try:
        conn = pika.BlockingConnection(_params(s))
        ch = conn.channel()
        ch.exchange_declare("keep", "fanout", durable=True)
        ch.queue_declare("kept", durable=True)
        ch.queue_bind("kept", "keep")
        ch.queue_declare("transient")
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("keep", "", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        method, _, body = get(ch, "kept", auto_ack=False)
        assert body == b"0"
        ch.basic_ack(method.delivery_tag)
        _, _, body = get(ch, "kept", auto_ack=False)  # unacknowledged when the broker stops
        assert body == b"1"
        assert s.stop() == 0  # a clean stop: the acknowledgement of "0" is kept
    finally:
        s.kill()
    s = Standalone(tmp_path / "data", conf=AMQP_CONF).start()
    try:
        conn = pika.BlockingConnection(_params(s))
        ch = conn.channel()
        assert ch.queue_declare("kept", durable=True, passive=True).method.queue == "kept"
        bodies = []
        for _ in range(4):
            method, _, body = get(ch, "kept")
            assert method is not None
            bodies.append(body)
        assert bodies == [b"1", b"2", b"3", b"4"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("transient", passive=True)
        assert info.value.reply_code == 404
        ch = conn.channel()
        ch.exchange_declare("keep", "fanout", durable=True, passive=True)
        conn.close()
    finally:
        s.kill()


def test_amqp_publish_is_read_by_a_websocket_consumer(amqp_broker: Standalone, unique: str) -> None:
    ex = f"ws-{unique}"
    conn = pika.BlockingConnection(_params(amqp_broker))
    try:
        ch = conn.channel()
        ch.exchange_declare(ex, "direct", durable=True)
        ws_url = amqp_broker.addresses["web"][0].replace("http://", "ws://")
        ws = websocket.create_connection(f"{ws_url}/ws/v2/consumer/persistent/public/default/{ex}/ws-sub",
                                         timeout=WAIT)
        try:
            ch.confirm_delivery()
            for i in range(3):
                ch.basic_publish(ex, f"rk{i}", b"m%d" % i, pika.BasicProperties(headers={"n": str(i)}))
            got = []
            for _ in range(3):
                m = json.loads(ws.recv())
                ws.send(json.dumps({"messageId": m["messageId"]}))
                got.append((base64.b64decode(m["payload"]), m.get("key"), m["properties"].get("n")))
            assert got == [(b"m0", "rk0", "0"), (b"m1", "rk1", "1"), (b"m2", "rk2", "2")]
        finally:
            ws.close()
    finally:
        conn.close()


def test_a_spark_batch_read_of_an_exchange_topic_sees_the_amqp_messages(
        spark_session: Any, amqp_broker: Standalone, unique: str) -> None:
    ex = f"spark-{unique}"
    conn = pika.BlockingConnection(_params(amqp_broker))
    try:
        ch = conn.channel()
        ch.exchange_declare(ex, "topic", durable=True)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish(ex, f"eu.k{i}", b"order-%d" % i, pika.BasicProperties(timestamp=1_700_000_000 + i))
    finally:
        conn.close()
    rows = spark.reader(spark_session, amqp_broker, ex).collect()
    assert sorted((bytes(r.value), bytes(r.key)) for r in rows) == [
        (b"order-%d" % i, f"eu.k{i}".encode()) for i in range(5)]
    assert all(r.topic == ex for r in rows)
    assert sorted(r.eventTime.timestamp() for r in rows) == [1_700_000_000 + i for i in range(5)]
