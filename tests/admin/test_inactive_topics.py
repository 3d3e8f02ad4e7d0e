"""Inactive topic deletion (Pulsar's topic garbage collection): the broker's
``brokerDeleteInactiveTopics*`` keys and the ``inactiveTopicPolicies`` of a namespace or
topic, with real pulsar-client traffic.

A topic that must be kept is created before the one expected to go, so the periodic check
looks at it first in each pass: once the later one is gone, the kept one has been weighed
at least as long and found active."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

from .conftest import FAST_CHECKS, status_of, wait_for

CHECKS = {**FAST_CHECKS, "brokerDeleteInactiveTopicsFrequencySeconds": 0.2}
NO_SUBSCRIPTIONS = {"inactiveTopicDeleteMode": "delete_when_no_subscriptions",
                    "maxInactiveDurationSeconds": 1, "deleteWhileInactive": True}
CAUGHT_UP = {**NO_SUBSCRIPTIONS, "inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """The broker's own deletion off (Magnetar's default), checking every 0.2 s."""
    s = Standalone(tmp_path_factory.mktemp("inactive"), conf=CHECKS).start()
    try:
        yield s
    finally:
        s.kill()


def _listed(admin: AdminClient, topic: str) -> bool:
    domain, rest = topic.split("://")
    ns = rest.rsplit("/", 1)[0]
    return topic in admin.get(f"/admin/v2/{domain}/{ns}")


def _gone(admin: AdminClient, topic: str, timeout: float = 15.0) -> None:
    wait_for(lambda: not _listed(admin, topic), timeout=timeout)


def _publish(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic)
    producer.send(b"m")
    producer.close()


def test_a_namespace_policy_deletes_its_topics_once_unused(admin: AdminClient, ns: str,
                                                           client: pulsar.Client) -> None:
    admin.post(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies", NO_SUBSCRIPTIONS)
    with_producer, subscribed, idle = (f"persistent://{ns}/{n}" for n in ("producer", "subscribed", "idle"))
    producer = client.create_producer(with_producer)
    producer.send(b"m")
    admin.put(f"/admin/v2/persistent/{ns}/subscribed/subscription/s")
    _publish(client, subscribed)
    _publish(client, idle)
    admin.post(f"/admin/v2/persistent/{ns}/idle/maxProducers", 3)  # a topic policy, deleted with it

    _gone(admin, idle)
    assert _listed(admin, with_producer) and _listed(admin, subscribed)
    assert status_of(admin.get, f"/admin/v2/persistent/{ns}/idle/maxProducers") == (404, "Topic not found")
    admin.put(f"/admin/v2/persistent/{ns}/idle")  # a topic of that name created again has none
    assert admin.get(f"/admin/v2/persistent/{ns}/idle/maxProducers") is None

    producer.close()
    _gone(admin, with_producer)  # inactive from when its producer left
    admin.delete(f"/admin/v2/persistent/{ns}/subscribed/subscription/s")
    _gone(admin, subscribed)


def test_caught_up_mode_keeps_a_topic_until_its_backlog_is_consumed(admin: AdminClient, ns: str,
                                                                    client: pulsar.Client) -> None:
    behind, caught_up = f"persistent://{ns}/behind", f"persistent://{ns}/caught-up"
    for name in ("behind", "caught-up"):
        admin.put(f"/admin/v2/persistent/{ns}/{name}")
        admin.post(f"/admin/v2/persistent/{ns}/{name}/inactiveTopicPolicies", CAUGHT_UP)
        admin.put(f"/admin/v2/persistent/{ns}/{name}/subscription/s")
    _publish(client, behind)
    _publish(client, caught_up)
    consumer = client.subscribe(caught_up, "s")
    consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    consumer.close()

    _gone(admin, caught_up)  # its subscription had nothing left to consume
    assert _listed(admin, behind)
    admin.post(f"/admin/v2/persistent/{ns}/behind/subscription/s/skip_all")
    _gone(admin, behind)


def test_a_policy_that_keeps_inactive_topics_is_honoured(admin: AdminClient, ns: str,
                                                         client: pulsar.Client) -> None:
    kept, idle = f"persistent://{ns}/kept", f"persistent://{ns}/idle"
    admin.post(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies", NO_SUBSCRIPTIONS)
    admin.put(f"/admin/v2/persistent/{ns}/kept")
    admin.post(f"/admin/v2/persistent/{ns}/kept/inactiveTopicPolicies",
               {**NO_SUBSCRIPTIONS, "deleteWhileInactive": False})
    _publish(client, kept)
    _publish(client, idle)
    _gone(admin, idle)
    assert _listed(admin, kept)


def test_deletion_turned_on_at_runtime_applies_at_once(admin: AdminClient, ns: str, client: pulsar.Client,
                                                      dynamic: Callable[[str, str], None]) -> None:
    topic = f"persistent://{ns}/idle"
    _publish(client, topic)
    dynamic("brokerDeleteInactiveTopicsMaxInactiveDurationSeconds", "1")
    dynamic("brokerDeleteInactiveTopicsEnabled", "true")
    _gone(admin, topic)


def test_an_unused_non_persistent_topic_is_deleted(admin: AdminClient, ns: str,
                                                   client: pulsar.Client) -> None:
    admin.post(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies", NO_SUBSCRIPTIONS)
    topic = f"non-persistent://{ns}/np"
    producer = client.create_producer(topic)
    assert _listed(admin, topic)
    producer.close()
    _gone(admin, topic)


def test_inactive_topic_policies_over_rest(admin: AdminClient, ns: str) -> None:
    path = f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    assert admin.get(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies") is None
    # applied: the broker's keys, the inactive duration defaulting to the check frequency
    assert admin.get(f"{path}/inactiveTopicPolicies", applied="true") == {
        "inactiveTopicDeleteMode": "delete_when_no_subscriptions", "maxInactiveDurationSeconds": 1,
        "deleteWhileInactive": False}
    admin.post(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies", CAUGHT_UP)
    assert admin.get(f"{path}/inactiveTopicPolicies", applied="true") == CAUGHT_UP
    assert admin.get(f"{path}/inactiveTopicPolicies") is None
    admin.delete(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies")
    assert admin.get(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies") is None
    status, reason = status_of(admin.post, f"{path}/inactiveTopicPolicies",
                               {**CAUGHT_UP, "inactiveTopicDeleteMode": "sometimes"})
    assert status == 400 and "inactiveTopicDeleteMode" in reason


def _cli(server: Standalone, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "admin", "--admin-url",
                           server.addresses["web"][0], *args], capture_output=True, text=True, timeout=60)


def test_inactive_topic_policies_from_the_cli(server: Standalone, ns: str) -> None:
    done = _cli(server, "namespaces", "set-inactive-topic-policies", ns, "-e", "-t", "2m",
                "-m", "delete_when_subscriptions_caught_up")
    assert done.returncode == 0, done.stderr
    got: Any = json.loads(_cli(server, "namespaces", "get-inactive-topic-policies", ns).stdout)
    assert got == {"inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up",
                   "maxInactiveDurationSeconds": 120, "deleteWhileInactive": True}
    both = _cli(server, "namespaces", "set-inactive-topic-policies", ns, "-e", "-d", "-t", "1m",
                "-m", "delete_when_no_subscriptions")
    assert both.returncode != 0 and "enable-delete-while-inactive" in both.stderr
    topic = f"persistent://{ns}/t"
    assert _cli(server, "topics", "create", topic).returncode == 0
    assert _cli(server, "topics", "set-inactive-topic-policies", topic, "-d", "-t", "30s",
                "-m", "delete_when_no_subscriptions").returncode == 0
    applied = json.loads(_cli(server, "topics", "get-inactive-topic-policies", topic, "--applied").stdout)
    assert applied["deleteWhileInactive"] is False and applied["maxInactiveDurationSeconds"] == 30
    assert _cli(server, "topics", "remove-inactive-topic-policies", topic).returncode == 0
    assert _cli(server, "topics", "get-inactive-topic-policies", topic).stdout.strip() == "null"


def test_the_brokers_setting_deletes_topics_where_no_policy_says(tmp_path: Path) -> None:
    conf = {**CHECKS, "brokerDeleteInactiveTopicsEnabled": True,
            "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": 1}
    with Standalone(tmp_path, conf=conf) as s:
        admin = AdminClient(s.addresses["web"][0], timeout=30)
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=10)
        try:
            admin.put("/admin/v2/namespaces/public/keep")
            admin.post("/admin/v2/namespaces/public/keep/inactiveTopicPolicies",
                       {**NO_SUBSCRIPTIONS, "deleteWhileInactive": False})
            kept, idle = "persistent://public/keep/t", "persistent://public/default/idle"
            _publish(client, kept)
            _publish(client, idle)
            _gone(admin, idle)
            assert _listed(admin, kept)
        finally:
            client.close()


def _partitioned(admin: AdminClient, ns: str) -> list[str]:
    return admin.get(f"/admin/v2/persistent/{ns}/partitioned")


def test_a_partitioned_topic_goes_with_its_last_inactive_partition_when_configured(
        admin: AdminClient, ns: str, client: pulsar.Client, dynamic: Callable[[str, str], None]) -> None:
    dynamic("brokerDeleteInactivePartitionedTopicMetadataEnabled", "true")
    admin.post(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies", NO_SUBSCRIPTIONS)
    topic, idle = f"persistent://{ns}/p", f"persistent://{ns}/idle"
    admin.put(f"/admin/v2/persistent/{ns}/p/partitions", 2)
    _publish(client, topic)
    producer = client.create_producer(f"{topic}-partition-1")  # one partition stays in use
    _publish(client, idle)
    _gone(admin, idle)
    assert _partitioned(admin, ns) == [topic]

    producer.close()
    wait_for(lambda: not _partitioned(admin, ns), timeout=15.0)
    assert not _listed(admin, f"{topic}-partition-0") and not _listed(admin, f"{topic}-partition-1")


def test_a_partitioned_topic_outlives_its_inactive_partitions_by_default(
        admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    admin.post(f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies", NO_SUBSCRIPTIONS)
    topic, idle = f"persistent://{ns}/p", f"persistent://{ns}/idle"
    admin.put(f"/admin/v2/persistent/{ns}/p/partitions", 2)
    _publish(client, topic)
    _publish(client, idle)
    _gone(admin, idle)  # the partitions, inactive since before, went no later
    assert _partitioned(admin, ns) == [topic]
