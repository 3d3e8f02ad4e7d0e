"""Clusters, tenants and namespaces in the metadata store, with Pulsar's JSON shapes.

Paths follow Pulsar's layout: ``/admin/clusters/<cluster>``, ``/admin/policies/<tenant>``
(TenantInfo), ``/admin/policies/<tenant>/<namespace>`` (Policies) and
``/admin/partitioned-topics/<tenant>/<namespace>/<domain>/<encoded-name>``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from core.naming import NamespaceName, TopicName

__all__ = [
    "RETENTION",
    "LEDGER_ROLLOVER",
    "set_policy_field",
    "set_retention_limit",
    "PolicyStore",
    "NotFoundError",
    "ConflictError",
    "PreconditionError",
    "default_policies",
    "TOPIC_POLICY_KEYS",
    "RETENTION_EXACT",
    "exact_retention",
    "size_retention_floor",
    "INACTIVE_CHECK_SECONDS",
    "INACTIVE_TOPIC_POLICIES",
    "default_inactive_topic_policies",
    "TOPIC_PROPERTIES_ROOT",
]

#: Where a topic that is not partitioned keeps its properties (Pulsar keeps them in its
#: managed ledger's properties); a partitioned topic keeps them in its metadata.
TOPIC_PROPERTIES_ROOT = "/topic-properties"


class NotFoundError(LookupError):
    pass


class ConflictError(Exception):
    pass


class PreconditionError(Exception):
    """A request that the current state does not allow (Pulsar answers 412)."""


#: Policies that a topic may override; the keys are the namespace Policies' own.
TOPIC_POLICY_KEYS = (
    "message_ttl_in_seconds",
    "retention_policies",
    "backlog_quota_map",
    "deduplicationEnabled",
    "max_producers_per_topic",
    "max_consumers_per_topic",
    "max_consumers_per_subscription",
    "max_subscriptions_per_topic",
    "subscription_types_enabled",
    "encryption_required",
    "subscription_expiration_time_minutes",
    "compaction_threshold",
    "persistence",
    "max_unacked_messages_per_consumer",
    "max_unacked_messages_per_subscription",
    "publishMaxMessageRate",
    "topicDispatchRate",
    "subscriptionDispatchRate",
    "replication_clusters",
    "max_message_size",
    "autoSubscriptionCreationOverride",
    "ledger_rollover",
    "message_timestamp_type",
    "schema_validation_enforced",
    "schema_compatibility_strategy",
    "delayed_delivery_policies",
    "retention_exact",
    "inactive_topic_policies",
)

RETENTION_EXACT = "retention_exact"
"""A topic's retention finer than whole minutes and MB (Kafka's ``retention.ms`` and
``retention.bytes`` as set): ``retentionTimeInMillis`` and ``retentionSizeInBytes``, kept
beside the ``retention_policies`` they round up to, which the admin API shows."""


INACTIVE_CHECK_SECONDS = 60.0
"""Pulsar's ``brokerDeleteInactiveTopicsFrequencySeconds``."""

INACTIVE_TOPIC_POLICIES = "inactive_topic_policies"
"""When a topic counts as inactive and is deleted (Pulsar's InactiveTopicPolicies):
``inactiveTopicDeleteMode``, ``maxInactiveDurationSeconds`` and ``deleteWhileInactive``."""


def default_inactive_topic_policies(config: Any) -> dict[str, Any]:
    """The broker's inactive topic policies, for topics whose namespace sets none: its
    ``brokerDeleteInactiveTopics*`` keys, the inactive duration defaulting to the check's
    frequency as in Pulsar."""
    seconds = int(config.get("brokerDeleteInactiveTopicsMaxInactiveDurationSeconds", 0) or 0) or \
        math.ceil(float(config.get("brokerDeleteInactiveTopicsFrequencySeconds", INACTIVE_CHECK_SECONDS)))
    return {"inactiveTopicDeleteMode": str(config.get("brokerDeleteInactiveTopicsMode",
                                                      "delete_when_no_subscriptions")),
            "maxInactiveDurationSeconds": seconds,
            "deleteWhileInactive": bool(config.get("brokerDeleteInactiveTopicsEnabled", False))}


RETENTION = "retention_policies"
"""A topic's or namespace's retention (Pulsar's RetentionPolicies): ``retentionTimeInMinutes``
and ``retentionSizeInMB``, -1 for no limit."""

LEDGER_ROLLOVER = "ledger_rollover"
"""When a topic's ledgers roll over: ``rolloverSizeInMB``, ``rolloverTimeInMinutes``."""

_RETENTION_FIELDS = {"time": ("retentionTimeInMinutes", "retentionTimeInMillis", 60_000),
                     "size": ("retentionSizeInMB", "retentionSizeInBytes", 1024 * 1024)}


def set_policy_field(policies: dict[str, Any], key: str, field: str, value: Any) -> None:
    """Set (or, with None, remove) one field of the policy ``key`` in ``policies``; the
    policy goes once it has no fields left."""
    policy = dict(policies.get(key) or {})
    if value is None:
        policy.pop(field, None)
    else:
        policy[field] = value
    if policy:
        policies[key] = policy
    else:
        policies.pop(key, None)


def set_retention_limit(policies: dict[str, Any], half: str, limit: int | None) -> None:
    """Set one half (``"time"``, in ms, or ``"size"``, in bytes) of the retention in
    ``policies`` as a protocol gives it (Kafka's ``retention.ms``, an AMQP stream's
    ``x-max-age``): the retention policy holds it in whole minutes or MB, rounded up, and
    :data:`RETENTION_EXACT` as given, which the storage enforces. None or negative: no
    limit (-1). The other half stays as it was (no limit when there was no policy)."""
    coarse, exact, unit = _RETENTION_FIELDS[half]
    unlimited = limit is None or limit < 0
    set_policy_field(policies, RETENTION_EXACT, exact, None if unlimited else limit)
    current = dict(policies.get(RETENTION) or {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    current[coarse] = -1 if unlimited else -(-int(limit) // unit)  # type: ignore[arg-type]
    policies[RETENTION] = current


def exact_retention(policies: dict[str, Any]) -> tuple[int | None, int | None]:
    """The retention time (ms) and size (bytes) that ``policies`` (a topic's effective
    ones) set finer than their retention policy. Each counts only while the retention
    policy still holds the whole minutes (MB) it rounds up to, so a retention set later
    through the admin API, in minutes and MB, takes over from it."""
    exact = policies.get(RETENTION_EXACT) or {}
    retention = policies.get("retention_policies") or {}

    def agreed(field: str, coarse: str, unit: int) -> int | None:
        value = exact.get(field)
        if value is None or int(value) < 0 or retention.get(coarse) != -(-int(value) // unit):
            return None
        return int(value)

    return (agreed("retentionTimeInMillis", "retentionTimeInMinutes", 60_000),
            agreed("retentionSizeInBytes", "retentionSizeInMB", 1024 * 1024))


def size_retention_floor(ledgers: list[dict[str, Any]], limit: int) -> int:
    """The first message index a size retention of ``limit`` bytes keeps, given a managed
    ledger's ``ledgers()`` (oldest first): as Kafka's ``retention.bytes`` deletes log
    segments, the oldest ledger goes while the ones after it still hold ``limit`` bytes; the
    last (current) one always stays. 0 when nothing goes."""
    total = sum(int(info["size"]) for info in ledgers)
    floor = 0
    for info, after in zip(ledgers, ledgers[1:], strict=False):
        if total - int(info["size"]) < limit:
            break
        total -= int(info["size"])
        floor = int(after["firstIndex"])
    return floor


def default_policies(clusters: list[str]) -> dict[str, Any]:
    return {
        "replication_clusters": clusters,
        "bundles": {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
        "backlog_quota_map": {},
        "message_ttl_in_seconds": None,
        "retention_policies": None,
        "deduplicationEnabled": None,
        "schema_compatibility_strategy": "UNDEFINED",
        "schema_validation_enforced": False,
        "is_allow_auto_update_schema": None,
        "autoTopicCreationOverride": None,
        "autoSubscriptionCreationOverride": None,
        "max_producers_per_topic": None,
        "max_consumers_per_topic": None,
        "max_consumers_per_subscription": None,
        "max_subscriptions_per_topic": None,
        "subscription_types_enabled": [],
        "encryption_required": False,
        "subscription_expiration_time_minutes": None,
        "compaction_threshold": None,
        "persistence": None,
        "max_topics_per_namespace": None,
        "max_unacked_messages_per_consumer": None,
        "max_unacked_messages_per_subscription": None,
        "auth_policies": {"namespace_auth": {}, "destination_auth": {}, "subscription_auth_roles": {}},
        "topicDispatchRate": None,
        "subscriptionDispatchRate": None,
        "publishMaxMessageRate": None,
        "properties": {},
        "deleted": False,
    }


class PolicyStore:
    def __init__(self, metadata: Any, cluster: str):
        self.metadata = metadata
        self.cluster = cluster

    # -- bootstrap ------------------------------------------------------------------------

    def ensure_defaults(self, service_url: str, web_url: str) -> None:
        """What `pulsar standalone` creates: the cluster, tenant `public`, namespace
        `public/default`."""
        self._put_json(f"/admin/clusters/{self.cluster}",
                       {"serviceUrl": web_url, "brokerServiceUrl": service_url})
        if self.get_tenant("public") is None:
            self.create_tenant("public", {"adminRoles": [], "allowedClusters": [self.cluster]})
        if self.get_namespace(NamespaceName("public", "default")) is None:
            self.create_namespace(NamespaceName("public", "default"))

    def _update_json(self, path: str, change: Any) -> Any:
        """Apply ``change(value) -> value`` to the JSON at ``path`` with a version check,
        retrying on a concurrent update; raises NotFoundError when nothing is there."""
        from core.metadata import BadVersionError

        while True:
            got = self._get_json(path)
            if got is None:
                raise NotFoundError(f"{path} does not exist")
            value = change(got[0])
            try:
                self._put_json(path, value, got[1])
            except BadVersionError:
                continue
            return value

    def _put_json(self, path: str, value: Any, expected: int | None = None) -> int:
        return int(self.metadata.put(path, json.dumps(value).encode(), expected))

    def _get_json(self, path: str) -> tuple[Any, int] | None:
        got = self.metadata.get(path)
        if got is None:
            return None
        return json.loads(got[0]), got[1]

    # -- clusters -----------------------------------------------------------------------------

    def clusters(self) -> list[str]:
        return list(self.metadata.children("/admin/clusters"))

    def get_cluster(self, name: str) -> dict[str, Any] | None:
        got = self._get_json(f"/admin/clusters/{name}")
        return got[0] if got else None

    def create_cluster(self, name: str, data: dict[str, Any]) -> None:
        if self.get_cluster(name) is not None:
            raise ConflictError("Cluster already exists")
        self._put_json(f"/admin/clusters/{name}", data, -1)

    def update_cluster(self, name: str, data: dict[str, Any]) -> None:
        self._update_json(f"/admin/clusters/{name}", lambda _: data)

    def delete_cluster(self, name: str) -> None:
        if self.get_cluster(name) is None:
            raise NotFoundError("Cluster does not exist")
        for tenant in self.tenants():
            info = self.get_tenant(tenant) or {}
            if name in info.get("allowedClusters", []):
                raise PreconditionError(f"Cluster {name} is still used by tenant {tenant}")
        self.metadata.delete(f"/admin/clusters/{name}")

    # -- tenants -----------------------------------------------------------------------------

    def tenants(self) -> list[str]:
        return list(self.metadata.children("/admin/policies"))

    def get_tenant(self, tenant: str) -> dict[str, Any] | None:
        got = self._get_json(f"/admin/policies/{tenant}")
        return got[0] if got else None

    def create_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        if self.get_tenant(tenant) is not None:
            raise ConflictError("Tenant already exists")
        self._put_json(f"/admin/policies/{tenant}", info, -1)

    def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        """Replace the tenant's info; a cluster that one of its namespaces replicates to
        cannot leave ``allowedClusters`` (Pulsar's ConflictError and reason)."""
        current = self.get_tenant(tenant) or {}
        removed = set(current.get("allowedClusters") or []) - set(info.get("allowedClusters") or [])
        if removed:
            used: set[str] = set()
            for ns in self.namespaces(tenant):
                used.update((self.get_namespace(NamespaceName.parse(ns)) or {}).get("replication_clusters") or [])
            if in_use := sorted(removed & used):
                raise ConflictError(f"Failed to update the tenant because active namespaces are present in "
                                    f"colos [{', '.join(in_use)}]. Please delete those namespaces first")
        self._update_json(f"/admin/policies/{tenant}", lambda _: info)

    def delete_tenant(self, tenant: str) -> None:
        if self.get_tenant(tenant) is None:
            raise NotFoundError("Tenant does not exist")
        if self.metadata.children(f"/admin/policies/{tenant}"):
            raise ConflictError("The tenant still has active namespaces")
        self.metadata.delete(f"/admin/policies/{tenant}")

    # -- namespaces ------------------------------------------------------------------------------

    def namespaces(self, tenant: str) -> list[str]:
        return [f"{tenant}/{n}" for n in self.metadata.children(f"/admin/policies/{tenant}")]

    def get_namespace(self, ns: NamespaceName) -> dict[str, Any] | None:
        got = self._get_json(f"/admin/policies/{ns}")
        return got[0] if got else None

    def create_namespace(self, ns: NamespaceName, policies: dict[str, Any] | None = None) -> None:
        if self.get_tenant(ns.tenant) is None:
            raise NotFoundError("Tenant does not exist")
        if self.get_namespace(ns) is not None:
            raise ConflictError("Namespace already exists")
        body = default_policies([self.cluster])
        body.update(policies or {})
        self._put_json(f"/admin/policies/{ns}", body, -1)

    def update_namespace(self, ns: NamespaceName, change: Any) -> dict[str, Any]:
        """Apply ``change(policies) -> None`` (mutating) to the namespace's Policies."""

        def apply(pol: dict[str, Any]) -> dict[str, Any]:
            change(pol)
            return pol

        try:
            return dict(self._update_json(f"/admin/policies/{ns}", apply))
        except NotFoundError:
            raise NotFoundError("Namespace does not exist") from None

    def delete_namespace(self, ns: NamespaceName) -> None:
        if self.get_namespace(ns) is None:
            raise NotFoundError("Namespace does not exist")
        for domain in ("persistent", "non-persistent"):
            base = f"/admin/partitioned-topics/{ns}/{domain}"
            if self.metadata.children(base):
                raise ConflictError("Cannot delete non empty namespace")
        for domain in ("persistent", "non-persistent"):
            base = f"/admin/topic-policies/{ns}/{domain}"
            for child in self.metadata.children(base):
                self.metadata.delete(f"{base}/{child}")
        self.metadata.delete(f"/admin/policies/{ns}")

    # -- topic policies ----------------------------------------------------------------------------

    @staticmethod
    def _topic_policies_path(topic: TopicName) -> str:
        return f"/admin/topic-policies/{topic.partitioned_topic.storage_name}"

    def topic_policies(self, topic: TopicName) -> dict[str, Any]:
        """The policies set on the topic itself (a partition shares its topic's)."""
        got = self._get_json(self._topic_policies_path(topic))
        return dict(got[0]) if got else {}

    def update_topic_policies(self, topic: TopicName, change: Any) -> dict[str, Any]:
        """Apply ``change(policies) -> None`` (mutating) to the topic-level policies."""
        return self._upsert_json(self._topic_policies_path(topic), change)

    def _upsert_json(self, path: str, change: Any) -> dict[str, Any]:
        """Apply ``change(value) -> None`` (mutating) to the JSON object at ``path``, ``{}``
        when nothing is there yet, with a version check, retrying on a concurrent update."""
        from core.metadata import BadVersionError

        while True:
            got = self._get_json(path)
            value, version = (dict(got[0]), got[1]) if got else ({}, -1)
            change(value)
            try:
                self._put_json(path, value, version)
            except BadVersionError:
                continue
            return value

    def delete_topic_policies(self, topic: TopicName) -> None:
        path = self._topic_policies_path(topic)
        if self.metadata.exists(path):
            self.metadata.delete(path)

    def effective(self, topic: TopicName, namespace_policies: dict[str, Any],
                  own: dict[str, Any] | None = None) -> dict[str, Any]:
        """The namespace's policies with the topic's own overrides applied: those stored,
        or ``own`` (a change weighed before it is stored)."""
        merged = dict(namespace_policies)
        for key, value in (self.topic_policies(topic) if own is None else own).items():
            if key in TOPIC_POLICY_KEYS and value is not None:
                merged[key] = value
        return merged

    # -- topic properties ----------------------------------------------------------------------------

    def topic_properties(self, topic: TopicName) -> dict[str, str]:
        """A topic's properties (Pulsar's ``create --metadata`` and ``update-properties``):
        a partitioned topic's are in its metadata, any other topic's (a partition's too)
        in a node of its own that goes when the topic is deleted."""
        if topic.partition_index < 0:
            got = self._get_json(self._partitioned_path(topic))
            if got is not None:
                return dict(got[0].get("properties") or {})
        got = self._get_json(f"{TOPIC_PROPERTIES_ROOT}/{topic.storage_name}")
        return dict(got[0]) if got else {}

    def update_topic_properties(self, topic: TopicName, change: Any) -> dict[str, str]:
        """Apply ``change(properties) -> None`` (mutating) to the topic's properties."""
        if topic.partition_index < 0 and self.partitions(topic):
            def apply(metadata: dict[str, Any]) -> dict[str, Any]:
                properties = dict(metadata.get("properties") or {})
                change(properties)
                return {**metadata, "properties": properties}

            return dict(self._update_json(self._partitioned_path(topic), apply)["properties"])
        return self._upsert_json(f"{TOPIC_PROPERTIES_ROOT}/{topic.storage_name}", change)

    # -- partitioned topics -------------------------------------------------------------------------

    @staticmethod
    def _partitioned_path(topic: TopicName) -> str:
        base = topic.partitioned_topic
        return f"/admin/partitioned-topics/{base.storage_name}"

    def partitions(self, topic: TopicName) -> int:
        got = self._get_json(self._partitioned_path(topic))
        return int(got[0]["partitions"]) if got else 0

    def create_partitioned(self, topic: TopicName, partitions: int,
                           properties: dict[str, str] | None = None) -> None:
        if partitions < 1:
            raise ValueError("Number of partitions should be more than 0")
        if self.partitions(topic):
            raise ConflictError("Partitioned topic already exists")
        metadata: dict[str, Any] = {"partitions": partitions}
        if properties:
            metadata["properties"] = dict(properties)
        self._put_json(self._partitioned_path(topic), metadata, -1)

    def update_partitions(self, topic: TopicName, partitions: int) -> int:
        """Raise the partition count; returns the old one."""
        old = self.partitions(topic)
        if not old:
            raise NotFoundError("Partitioned topic does not exist")
        if partitions <= old:
            raise ConflictError(
                f"Number of new partitions {partitions} must be greater than existing number of partitions {old}")
        self._update_json(self._partitioned_path(topic), lambda m: {**m, "partitions": partitions})
        return old

    def delete_partitioned(self, topic: TopicName) -> None:
        if not self.partitions(topic):
            raise NotFoundError("Partitioned topic does not exist")
        self.metadata.delete(self._partitioned_path(topic))

    def partitioned_topics(self, ns: NamespaceName, domain: str = "persistent") -> list[str]:
        names = self.metadata.children(f"/admin/partitioned-topics/{ns}/{domain}")
        from urllib.parse import unquote
        return [f"{domain}://{ns}/{unquote(n)}" for n in names]
