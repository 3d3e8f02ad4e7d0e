"""Clusters, tenants and namespaces in the metadata store, with Pulsar's JSON shapes.

Paths follow Pulsar's layout: ``/admin/clusters/<cluster>``, ``/admin/policies/<tenant>``
(TenantInfo), ``/admin/policies/<tenant>/<namespace>`` (Policies) and
``/admin/partitioned-topics/<tenant>/<namespace>/<domain>/<encoded-name>``.
"""

from __future__ import annotations

import json
from typing import Any

from core.naming import NamespaceName, TopicName

__all__ = ["PolicyStore", "NotFoundError", "ConflictError", "default_policies"]


class NotFoundError(LookupError):
    pass


class ConflictError(Exception):
    pass


def default_policies(clusters: list[str]) -> dict[str, Any]:
    return {
        "replication_clusters": clusters,
        "bundles": {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
        "backlog_quota_map": {},
        "message_ttl_in_seconds": None,
        "retention_policies": None,
        "deduplicationEnabled": None,
        "schema_compatibility_strategy": "UNDEFINED",
        "autoTopicCreationOverride": None,
        "max_producers_per_topic": None,
        "max_consumers_per_topic": None,
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

    def _put_json(self, path: str, value: Any, expected: int | None = None) -> int:
        return int(self.metadata.put(path, json.dumps(value).encode(), expected))

    def _get_json(self, path: str) -> tuple[Any, int] | None:
        got = self.metadata.get(path)
        if got is None:
            return None
        return json.loads(got[0]), got[1]

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

    # -- partitioned topics -------------------------------------------------------------------------

    @staticmethod
    def _partitioned_path(topic: TopicName) -> str:
        base = topic.partitioned_topic
        return f"/admin/partitioned-topics/{base.storage_name}"

    def partitions(self, topic: TopicName) -> int:
        got = self._get_json(self._partitioned_path(topic))
        return int(got[0]["partitions"]) if got else 0

    def create_partitioned(self, topic: TopicName, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("Number of partitions should be more than 0")
        if self.partitions(topic):
            raise ConflictError("Partitioned topic already exists")
        self._put_json(self._partitioned_path(topic), {"partitions": partitions}, -1)

    def partitioned_topics(self, ns: NamespaceName, domain: str = "persistent") -> list[str]:
        names = self.metadata.children(f"/admin/partitioned-topics/{ns}/{domain}")
        from urllib.parse import unquote
        return [f"{domain}://{ns}/{unquote(n)}" for n in names]
