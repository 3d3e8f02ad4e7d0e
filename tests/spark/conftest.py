"""A Magnetar standalone with Pulsar and Kafka listeners and one ``local[2]`` SparkSession
per test module."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests._standalone import Standalone
from tests.conftest import skip_or_fail

BROKER_CONF = {"messagingProtocols": "pulsar,kafka", "kafkaListeners": "PLAINTEXT://127.0.0.1:0"}
REPO_ROOT = Path(__file__).resolve().parents[2]


def _spark_missing() -> str | None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (install default-jre-headless)"
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'pyspark>=4.0' pyarrow)"
    import pyspark

    if int(pyspark.__version__.split(".")[0]) < 4:
        return f"pyspark {pyspark.__version__} has no Python data source API; 4.0 or later is needed"
    return None


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    s = Standalone(tmp_path_factory.mktemp("spark-broker"), conf=BROKER_CONF).start()
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture(scope="module")
def session() -> Iterator[Any]:
    reason = _spark_missing()
    if reason:
        skip_or_fail(reason)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    paths = [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    from spark import register

    s = (SparkSession.builder.master("local[2]").appName("magnetar-tests")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.driver.memory", "1g")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    try:
        yield s
    finally:
        s.stop()


def admin_url(broker: Standalone) -> str:
    return broker.addresses["web"][0]


def kafka_bootstrap(broker: Standalone) -> str:
    return broker.addresses["kafka"][0].split("://", 1)[1]


def create_partitioned(broker: Standalone, topic: str, partitions: int) -> None:
    req = urllib.request.Request(
        f"{admin_url(broker)}/admin/v2/persistent/public/default/{topic}/partitions",
        data=json.dumps(partitions).encode(), method="PUT",
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 204)


def reader(session: Any, broker: Standalone, topics: str, **options: str) -> Any:
    r = (session.read.format("magnetar").option("serviceUrl", broker.pulsar_url)
         .option("adminUrl", admin_url(broker)).option("topics", topics))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def produce_mixed(broker: Standalone, topic: str) -> dict[bytes, dict[str, Any]]:
    """Pulsar (batched and not) and Kafka messages on a 2-partition topic; what each should read as."""
    from confluent_kafka import Producer

    create_partitioned(broker, topic, 2)
    expected: dict[bytes, dict[str, Any]] = {}
    client = pulsar.Client(broker.pulsar_url)
    try:
        batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=20)
        for i in range(12):
            value = b"pulsar-batched-%d" % i
            batched.send_async(value, None, partition_key=f"pk{i % 4}", properties={"i": str(i)},
                               event_timestamp=1_700_000_000_000 + i)
            expected[value] = {"key": f"pk{i % 4}".encode(), "properties": {"i": str(i)},
                               "eventTime": 1_700_000_000_000 + i, "protocol": "pulsar"}
        batched.flush()
        single = client.create_producer(topic, batching_enabled=False)
        for i in range(5):
            value = b"pulsar-single-%d" % i
            single.send(value, partition_key=f"pk{i}")
            expected[value] = {"key": f"pk{i}".encode(), "properties": {}, "eventTime": None,
                               "protocol": "pulsar"}
    finally:
        client.close()
    p = Producer({"bootstrap.servers": kafka_bootstrap(broker), "linger.ms": 5})
    for i in range(10):
        value = b"kafka-%d" % i
        p.produce(topic, key=b"kk%d" % (i % 3), value=value, partition=i % 2,
                  headers=[("h", b"v%d" % i)], timestamp=1_600_000_000_000 + i)
        expected[value] = {"key": b"kk%d" % (i % 3), "properties": {"h": f"v{i}"},
                           "eventTime": 1_600_000_000_000 + i, "protocol": "kafka"}
    p.produce(topic, key=b"tombstone", value=None, partition=0)
    assert p.flush(10) == 0
    return expected
