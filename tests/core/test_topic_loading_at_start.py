"""A restarted standalone loads every persistent topic by itself, as a Pulsar broker does
for the bundles it owns (``loadNamespaceTopics``): no client or admin call touches the
topics here after the restart."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pulsar
import trio
from prometheus_client.parser import text_string_to_metric_families

from core.broker import BrokerService
from core.naming import TopicName
from gateway._admin_cli import AdminClient
from gateway._config import load_config
from tests._standalone import Standalone
from tests.core._storage_env import SlowOpens, storage_env

#: How long a restarted broker may take to load a handful of topics in the background.
LOAD_DEADLINE = 15.0


def backlogs(server: Standalone) -> dict[tuple[str, str], float]:
    """``pulsar_subscription_back_log`` by (topic, subscription)."""
    with urllib.request.urlopen(server.addresses["web"][0] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.labels["topic"], s.labels["subscription"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "pulsar_subscription_back_log"}


def wait_for_metrics(server: Standalone, done: Callable[[dict[tuple[str, str], float]], bool]) -> None:
    deadline = time.monotonic() + LOAD_DEADLINE
    while not done(seen := backlogs(server)):
        assert time.monotonic() < deadline, f"not in /metrics within {LOAD_DEADLINE}s: {seen}"
        time.sleep(0.1)


def fill(server: Standalone, topics: dict[str, int]) -> None:
    """Subscribe `sub` to each topic (no consumer left) and leave a backlog of n messages."""
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10)
    try:
        for topic, n in topics.items():
            client.subscribe(topic, "sub").close()
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(n):
                producer.send(b"m%d" % i)
            producer.close()
    finally:
        client.close()


def test_backlog_is_in_metrics_after_restart_without_touching_the_topic(tmp_path: Path) -> None:
    topics = {"persistent://public/default/orders": 7,
              "persistent://other/ns/audit": 3,
              "persistent://public/default/parts-partition-1": 2}
    with Standalone(tmp_path) as server:
        admin = AdminClient(server.addresses["web"][0], timeout=30)
        admin.put("/admin/v2/tenants/other", {"adminRoles": [], "allowedClusters": ["standalone"]})
        admin.put("/admin/v2/namespaces/other/ns")
        admin.put("/admin/v2/persistent/public/default/parts/partitions", 2)
        fill(server, topics)
        wait_for_metrics(server, lambda seen: all(seen.get((t, "sub")) == n for t, n in topics.items()))

    with Standalone(tmp_path) as server:
        wait_for_metrics(server, lambda seen: all(seen.get((t, "sub")) == n for t, n in topics.items()))


def test_message_ttl_expires_after_restart_without_touching_the_topic(tmp_path: Path) -> None:
    """The periodic policy checks reach a topic no client has opened since the restart."""
    topic = "persistent://public/default/ttl"
    with Standalone(tmp_path) as server:  # the default check period: nothing expires here
        admin = AdminClient(server.addresses["web"][0], timeout=30)
        fill(server, {topic: 4})
        admin.post("/admin/v2/namespaces/public/default/messageTTL", 1)
        wait_for_metrics(server, lambda seen: seen.get((topic, "sub")) == 4)

    time.sleep(1.5)  # past the TTL
    with Standalone(tmp_path, conf={"messageExpiryCheckIntervalInSeconds": 1}) as server:
        wait_for_metrics(server, lambda seen: seen.get((topic, "sub")) == 0)


async def test_loading_respects_the_limit_and_survives_a_topic_that_fails(tmp_path: Path) -> None:
    """At most maxConcurrentTopicLoadRequest topics open at once; one that cannot open is
    logged and the others still load."""
    names = [TopicName.parse(f"persistent://public/default/t-{i}") for i in range(6)]
    async with storage_env(tmp_path) as env:
        cfg = load_config(None, {"maxConcurrentTopicLoadRequest": "2"}, environ={})
        first = BrokerService(cfg, env.metadata)
        async with trio.open_nursery() as nursery:
            await nursery.start(first.run)
            for name in names:
                await first.create_topic(name)
            nursery.cancel_scope.cancel()

        broker = BrokerService(cfg, env.metadata)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            assert broker.storage is not None and not broker.topics
            opens = SlowOpens(broker, failing={names[3].storage_name})
            await broker.load_namespace_topics()
            assert opens.most == 2
            assert sorted(broker.topics) == sorted(str(n) for n in names if n != names[3])
            nursery.cancel_scope.cancel()
