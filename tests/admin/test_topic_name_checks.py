"""Which topic a topic-level policy or a non-partitioned topic's creation may name, as in
Pulsar: topic policies only on a topic that exists (404 "Topic not found" otherwise,
Pulsar >= 2.8.1) and never on a single partition (412); ``X-partition-N`` created with the
non-partitioned create only where it names a partition ``X`` has (Pulsar's
validateNonPartitionTopicName)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway._admin_cli import AdminClient
from gateway.admin._policies import POLICY_SPECS, TOPIC_POLICY_SPECS
from tests._standalone import Standalone

from .conftest import status_of

NOT_FOUND = (404, "Topic not found")
ON_A_PARTITION = (412, "Not allowed to set/get topic policy for a partition")

#: Every topic-level policy endpoint: (path suffix, method to set it, a body to set).
POLICY_ENDPOINTS = [(spec.suffix, spec.set_methods[0]) for spec in POLICY_SPECS + TOPIC_POLICY_SPECS]


def _calls(path: str) -> list[tuple[str, str, object]]:
    """(method, path, body) of each get, set and remove of a topic-level policy of the topic
    at `path`: the ones defined by a spec, the backlog quota and the replication clusters."""
    out: list[tuple[str, str, object]] = []
    for suffix, set_method in POLICY_ENDPOINTS:
        out += [("GET", f"{path}/{suffix}", None), ("GET", f"{path}/{suffix}?applied=true", None),
                (set_method, f"{path}/{suffix}", 1), ("DELETE", f"{path}/{suffix}", None)]
    out += [("GET", f"{path}/backlogQuotaMap", None),
            ("POST", f"{path}/backlogQuota", {"limitSize": 1, "policy": "producer_exception"}),
            ("DELETE", f"{path}/backlogQuota", None),
            ("GET", f"{path}/replication", None),
            ("POST", f"{path}/replication", ["standalone"])]
    return out


def _status(admin: AdminClient, method: str, path: str, body: object) -> tuple[int, str]:
    return status_of(admin.request, method, path, body)


@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_topic_policies_of_a_missing_topic_are_not_found(admin: AdminClient, ns: str, domain: str) -> None:
    path = f"/admin/v2/{domain}/{ns}/typo-topic"
    for method, p, body in _calls(path):
        assert _status(admin, method, p, body) == NOT_FOUND, (method, p)
    # nothing was stored for a topic of that name to pick up when it is created
    admin.put(path)
    assert admin.get(f"{path}/messageTTL") is None
    assert admin.get(f"{path}/backlogQuotaMap") == {}
    admin.post(f"{path}/messageTTL", 10)
    assert admin.get(f"{path}/messageTTL") == 10


def test_topic_policies_once_the_topic_is_deleted_are_not_found(admin: AdminClient, ns: str) -> None:
    path = f"/admin/v2/persistent/{ns}/gone"
    admin.put(path)
    admin.post(f"{path}/maxProducers", 3)
    admin.delete(path)
    assert status_of(admin.get, f"{path}/maxProducers") == NOT_FOUND
    assert status_of(admin.post, f"{path}/maxProducers", 3) == NOT_FOUND


def test_topic_policies_of_a_partitioned_topic_on_its_name_not_a_partition(admin: AdminClient, ns: str) -> None:
    path = f"/admin/v2/persistent/{ns}/pt"
    admin.put(f"{path}/partitions", 2)
    admin.post(f"{path}/messageTTL", 60)
    assert admin.get(f"{path}/messageTTL") == 60
    admin.post(f"{path}/backlogQuota", {"limitSize": 1, "limitTime": -1, "policy": "producer_exception"})
    assert admin.get(f"{path}/backlogQuotaMap")["destination_storage"]["limitSize"] == 1
    for part in (f"{path}-partition-0", f"{path}-partition-5"):
        for method, p, body in _calls(part):
            assert _status(admin, method, p, body) == ON_A_PARTITION, (method, p)


def test_creating_a_partition_named_topic(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/persistent/{ns}"
    admin.put(f"{base}/pp/partitions", 2)
    assert status_of(admin.put, f"{base}/pp-partition-0") == (409, "This topic already exists")
    assert status_of(admin.put, f"{base}/pp-partition-1") == (409, "This topic already exists")
    assert status_of(admin.put, f"{base}/pp-partition-2") == (
        412, 'Can\'t create topic pp-partition-2 with "-partition-" followed by a number smaller than the '
             'number of partitions of partitioned topic pp')
    assert status_of(admin.put, f"{base}/solo-partition-3") == (
        412, 'Can\'t create topic solo-partition-3 with "-partition-" followed by numeric value if there '
             'isn\'t a partitioned topic solo created.')
    admin.put(f"{base}/solo")  # a non-partitioned topic is not a partitioned one either
    assert status_of(admin.put, f"{base}/solo-partition-0")[0] == 412
    assert status_of(admin.put, f"/admin/v2/non-persistent/{ns}/np-partition-0")[0] == 412
    # only a number after the suffix names a partition
    admin.put(f"{base}/pp-partition-x")
    assert admin.get(f"{base}/pp/partitions") == {"partitions": 2, "deleted": False}
    assert sorted(admin.get(base)) == sorted(
        f"persistent://{ns}/{t}" for t in ("pp-partition-0", "pp-partition-1", "solo", "pp-partition-x"))


def test_the_cli_reports_the_refusals(server: Standalone, admin: AdminClient, ns: str) -> None:
    admin.put(f"/admin/v2/persistent/{ns}/cp/partitions", 2)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", "admin", "--admin-url", server.addresses["web"][0],
                               *args], capture_output=True, text=True, timeout=60)

    missing = cli("topics", "set-message-ttl", f"persistent://{ns}/nope", "--messageTTL", "10")
    assert missing.returncode == 1 and missing.stderr.strip() == "Topic not found (HTTP 404)"
    part = cli("topics", "get-message-ttl", f"persistent://{ns}/cp-partition-0")
    assert part.returncode == 1
    assert part.stderr.strip() == "Not allowed to set/get topic policy for a partition (HTTP 412)"
    created = cli("topics", "create", f"persistent://{ns}/cp-partition-9")
    assert created.returncode == 1 and "(HTTP 412)" in created.stderr and "cp-partition-9" in created.stderr
