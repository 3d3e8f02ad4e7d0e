"""Namespaces and their policies over REST: shapes, round trips, and bad input as 4xx."""

from __future__ import annotations

import pytest

from gateway._admin_cli import AdminClient

from .conftest import status_of


def test_namespace_lifecycle(admin: AdminClient, unique: str) -> None:
    t = f"t-{unique}"
    admin.put(f"/admin/v2/tenants/{t}", {"allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{t}/a")
    admin.put(f"/admin/v2/namespaces/{t}/b", {"replication_clusters": ["standalone"]})
    assert sorted(admin.get(f"/admin/v2/namespaces/{t}")) == [f"{t}/a", f"{t}/b"]
    pol = admin.get(f"/admin/v2/namespaces/{t}/a")
    assert pol["replication_clusters"] == ["standalone"]
    assert pol["bundles"]["numBundles"] == 1
    assert pol["backlog_quota_map"] == {}
    assert status_of(admin.put, f"/admin/v2/namespaces/{t}/a") == (409, "Namespace already exists")
    assert status_of(admin.put, f"/admin/v2/namespaces/missing-{unique}/a") == (404, "Tenant does not exist")
    assert status_of(admin.get, f"/admin/v2/namespaces/{t}/zzz") == (404, "Namespace does not exist")
    assert status_of(admin.put, f"/admin/v2/namespaces/{t}/c", {"replication_clusters": ["mars"]})[0] == 412
    assert status_of(admin.put, f"/admin/v2/namespaces/{t}/c", {"no_such_policy": 1})[0] == 400
    admin.put(f"/admin/v2/persistent/{t}/a/topic")
    assert admin.get(f"/admin/v2/namespaces/{t}/a/topics") == [f"persistent://{t}/a/topic"]
    assert status_of(admin.delete, f"/admin/v2/namespaces/{t}/a") == (409, "Cannot delete non empty namespace")
    admin.delete(f"/admin/v2/namespaces/{t}/a", force="true")
    admin.delete(f"/admin/v2/namespaces/{t}/b")
    assert admin.get(f"/admin/v2/namespaces/{t}") == []


@pytest.mark.parametrize(("suffix", "key", "value"), [
    ("retention", "retention_policies", {"retentionTimeInMinutes": 4320, "retentionSizeInMB": 10240}),
    ("messageTTL", "message_ttl_in_seconds", 3600),
    ("deduplication", "deduplicationEnabled", True),
    ("autoTopicCreation", "autoTopicCreationOverride",
     {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3}),
    ("autoSubscriptionCreation", "autoSubscriptionCreationOverride",
     {"allowAutoSubscriptionCreation": False}),
    ("maxProducersPerTopic", "max_producers_per_topic", 5),
    ("maxSubscriptionsPerTopic", "max_subscriptions_per_topic", 4),
    ("maxTopicsPerNamespace", "max_topics_per_namespace", 100),
    ("subscriptionExpirationTime", "subscription_expiration_time_minutes", 30),
    ("compactionThreshold", "compaction_threshold", 10 << 20),
    ("persistence", "persistence", {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2,
                                    "bookkeeperAckQuorum": 2, "managedLedgerMaxMarkDeleteRate": 1.0}),
    ("maxConsumersPerSubscription", "max_consumers_per_subscription", 2),
    ("maxConsumersPerTopic", "max_consumers_per_topic", 7),
    ("maxUnackedMessagesPerConsumer", "max_unacked_messages_per_consumer", 1000),
    ("maxUnackedMessagesPerSubscription", "max_unacked_messages_per_subscription", 4000),
    ("subscriptionDispatchRate", "subscriptionDispatchRate",
     {"dispatchThrottlingRateInMsg": 50, "dispatchThrottlingRateInByte": -1,
      "relativeToPublishRate": False, "ratePeriodInSecond": 1}),
    ("dispatchRate", "topicDispatchRate",
     {"dispatchThrottlingRateInMsg": 100, "dispatchThrottlingRateInByte": -1,
      "relativeToPublishRate": False, "ratePeriodInSecond": 1}),
    ("publishRate", "publishMaxMessageRate",
     {"publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": 1000}),
])
def test_policy_set_get_remove(admin: AdminClient, ns: str, suffix: str, key: str, value: object) -> None:
    path = f"/admin/v2/namespaces/{ns}/{suffix}"
    assert admin.get(path) is None
    admin.post(path, value)
    assert admin.get(path) == value
    assert admin.get(f"/admin/v2/namespaces/{ns}")[key] == value
    admin.delete(path)
    assert admin.get(path) is None


@pytest.mark.parametrize(("suffix", "body", "status"), [
    ("retention", {"retentionTimeInMinutes": "x"}, 400),
    ("retention", {"retentionTimeInMinutes": -5, "retentionSizeInMB": 1}, 412),
    ("retention", [1, 2], 400),
    ("messageTTL", -1, 412),
    ("messageTTL", "soon", 400),
    ("deduplication", "yes", 400),
    ("autoTopicCreation", {"allowAutoTopicCreation": True, "topicType": "weird"}, 412),
    ("autoTopicCreation", {"allowAutoTopicCreation": True, "topicType": "partitioned"}, 412),
    ("autoSubscriptionCreation", {"allowAutoSubscriptionCreation": "no"}, 400),
    ("maxProducersPerTopic", -3, 412),
    ("maxSubscriptionsPerTopic", -1, 412),
    ("subscriptionExpirationTime", -5, 412),
    ("compactionThreshold", -1, 412),
    ("persistence", {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1}, 400),
    ("persistence", {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 0}, 400),
    ("maxUnackedMessagesPerConsumer", -1, 412),
    ("backlogQuota", {"limitSize": 10, "policy": "drop_everything"}, 412),
    ("backlogQuota", {"limitSize": "big", "policy": "producer_exception"}, 400),
])
def test_bad_policy_values_are_4xx(admin: AdminClient, ns: str, suffix: str, body: object, status: int) -> None:
    assert status_of(admin.post, f"/admin/v2/namespaces/{ns}/{suffix}", body)[0] == status


def test_subscription_types_enabled(admin: AdminClient, ns: str) -> None:
    path = f"/admin/v2/namespaces/{ns}/subscriptionTypesEnabled"
    assert admin.get(path) == []
    admin.post(path, ["Failover", "Shared", "Shared"])
    assert admin.get(path) == ["Shared", "Failover"]
    assert status_of(admin.post, path, ["Shared", "Round_Robin"])[0] == 400
    assert status_of(admin.post, path, "Shared")[0] == 400
    admin.delete(path)
    assert admin.get(path) == []


def test_schema_compatibility_strategy(admin: AdminClient, ns: str) -> None:
    path = f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy"
    assert admin.get(path) == "UNDEFINED"
    admin.put(path, "BACKWARD")
    assert admin.get(path) == "BACKWARD"
    assert status_of(admin.put, path, "SIDEWAYS")[0] == 412


def test_backlog_quota_map(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/namespaces/{ns}"
    admin.post(f"{base}/backlogQuota", {"limitSize": 5 * 1024 ** 3, "policy": "producer_exception"})
    admin.post(f"{base}/backlogQuota", {"limitTime": 3600, "policy": "consumer_backlog_eviction"},
               backlogQuotaType="message_age")
    assert admin.get(f"{base}/backlogQuotaMap") == {
        "destination_storage": {"limit": 5 * 1024 ** 3, "limitSize": 5 * 1024 ** 3, "limitTime": -1,
                                "policy": "producer_exception"},
        "message_age": {"limit": -1, "limitSize": -1, "limitTime": 3600, "policy": "consumer_backlog_eviction"},
    }
    admin.delete(f"{base}/backlogQuota", backlogQuotaType="message_age")
    assert list(admin.get(f"{base}/backlogQuotaMap")) == ["destination_storage"]
    assert status_of(admin.post, f"{base}/backlogQuota", {"policy": "producer_exception"},
                     backlogQuotaType="bogus")[0] == 412


def test_quota_larger_than_retention_is_refused(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/namespaces/{ns}"
    admin.post(f"{base}/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10})
    assert status_of(admin.post, f"{base}/backlogQuota",
                     {"limitSize": 100 * 1024 * 1024, "policy": "producer_exception"})[0] == 412


def test_retention_not_above_the_quota_is_refused(admin: AdminClient, ns: str) -> None:
    """Pulsar checks the pair whichever is set second: with a 5 GiB quota, a retention of
    1 GiB is refused (412, nothing stored) and one of 10 GiB, or unlimited, is taken."""
    base = f"/admin/v2/namespaces/{ns}"
    admin.post(f"{base}/backlogQuota", {"limitSize": 5 * 1024 ** 3, "policy": "producer_exception"})
    assert status_of(admin.post, f"{base}/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 1024}) \
        == (412, "Retention Quota must exceed configured backlog quota for namespace.")
    assert admin.get(f"{base}/retention") is None
    for size_mb in (10 * 1024, -1):
        admin.post(f"{base}/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": size_mb})
        assert admin.get(f"{base}/retention")["retentionSizeInMB"] == size_mb


def test_permissions(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/namespaces/{ns}/permissions"
    assert admin.get(base) == {}
    admin.post(f"{base}/app", ["produce", "consume"])
    assert admin.get(base) == {"app": ["consume", "produce"]}
    assert status_of(admin.post, f"{base}/app", ["fly"])[0] == 400
    admin.delete(f"{base}/app")
    assert admin.get(base) == {}


def test_replication_clusters(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/namespaces/{ns}/replication"
    assert admin.get(base) == ["standalone"]
    assert status_of(admin.post, base, ["mars"])[0] == 412


def test_replication_clusters_must_be_allowed_for_the_tenant(admin: AdminClient, ns: str, unique: str) -> None:
    """A cluster that exists but is not among the tenant's allowedClusters is refused with
    403 and Pulsar's reason, wherever replication clusters are set; nothing changes. A
    tenant cannot drop a cluster that one of its namespaces replicates to."""
    tenant = ns.split("/")[0]
    base = f"/admin/v2/namespaces/{ns}/replication"
    other = f"c-{unique}"
    admin.put(f"/admin/v2/clusters/{other}", {"serviceUrl": "http://x:8080"})
    try:
        reason = f"Cluster [{other}] is not in the list of allowed clusters list for tenant [{tenant}]"
        assert status_of(admin.put, f"/admin/v2/namespaces/{tenant}/other",
                         {"replication_clusters": ["standalone", other]}) == (403, reason)
        assert f"{tenant}/other" not in admin.get(f"/admin/v2/namespaces/{tenant}")
        assert status_of(admin.post, base, [other]) == (403, reason)
        assert admin.get(base) == ["standalone"]
        topic = f"/admin/v2/persistent/{ns}/t/replication"
        admin.put(f"/admin/v2/persistent/{ns}/t")
        assert status_of(admin.post, topic, [other]) == (403, reason)
        assert admin.get(topic) is None
        # once the tenant allows it, the same calls succeed
        admin.post(f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": ["standalone", other]})
        admin.post(base, ["standalone", other])
        assert admin.get(base) == ["standalone", other]
        admin.post(topic, [other])
        assert admin.get(topic) == [other]
        # and the tenant cannot take it back while a namespace replicates to it
        only_local = {"adminRoles": [], "allowedClusters": ["standalone"]}
        assert status_of(admin.post, f"/admin/v2/tenants/{tenant}", only_local) == (
            409, f"Failed to update the tenant because active namespaces are present in colos [{other}]. "
                 "Please delete those namespaces first")
        admin.post(base, ["standalone"])
        admin.post(f"/admin/v2/tenants/{tenant}", only_local)
        assert admin.get(f"/admin/v2/tenants/{tenant}")["allowedClusters"] == ["standalone"]
    finally:
        admin.post(base, ["standalone"])
        admin.post(f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": ["standalone"]})
        admin.delete(f"/admin/v2/clusters/{other}")
