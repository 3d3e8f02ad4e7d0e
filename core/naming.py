"""Topic and namespace names, as Pulsar spells them.

``persistent://tenant/namespace/local-name`` is the full form; ``local-name`` alone means
``persistent://public/default/local-name`` and ``tenant/namespace/local-name`` means the
persistent topic in that namespace. A partition of a partitioned topic is the topic whose
local name ends in ``-partition-N``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["InvalidNameError", "NamespaceName", "TopicName", "PARTITION_SUFFIX", "is_valid_name"]

PARTITION_SUFFIX = "-partition-"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
DOMAINS = ("persistent", "non-persistent")

# Pulsar's rule for tenant, namespace and cluster names.
_NAME_PART = re.compile(r"^[-=:.\w]+$")
_PARTITION = re.compile(r"^(.*)-partition-(\d+)$")


class InvalidNameError(ValueError):
    """A tenant, namespace or topic name Pulsar would refuse."""


def is_valid_name(value: str) -> bool:
    """Whether ``value`` may name a tenant, namespace or (local) topic part."""
    return bool(value) and _NAME_PART.match(value) is not None


def _check_part(kind: str, value: str) -> str:
    if not value or not _NAME_PART.match(value):
        raise InvalidNameError(f"Invalid {kind} name: {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class NamespaceName:
    tenant: str
    namespace: str

    @classmethod
    def parse(cls, text: str) -> NamespaceName:
        parts = text.split("/")
        if len(parts) != 2:
            raise InvalidNameError(f"Invalid namespace name: {text!r} (expected tenant/namespace)")
        return cls(_check_part("tenant", parts[0]), _check_part("namespace", parts[1]))

    def __str__(self) -> str:
        return f"{self.tenant}/{self.namespace}"


@dataclass(frozen=True, slots=True)
class TopicName:
    domain: str
    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, text: str) -> TopicName:
        domain = "persistent"
        rest = text
        if "://" in text:
            domain, rest = text.split("://", 1)
            if domain not in DOMAINS:
                raise InvalidNameError(f"Invalid topic domain in {text!r}: {domain!r}")
            parts = rest.split("/", 2)
            if len(parts) != 3:
                raise InvalidNameError(
                    f"Invalid topic name: {text!r} (expected {domain}://tenant/namespace/topic)"
                )
        else:
            parts = rest.split("/", 2)
            if len(parts) == 1:
                parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
            elif len(parts) != 3:
                raise InvalidNameError(f"Invalid short topic name: {text!r}")
        tenant, namespace, local = parts
        _check_part("tenant", tenant)
        _check_part("namespace", namespace)
        if not local or local.strip() != local or "\x00" in local:
            raise InvalidNameError(f"Invalid topic name: {text!r}")
        return cls(domain, tenant, namespace, local)

    @property
    def persistent(self) -> bool:
        return self.domain == "persistent"

    @property
    def namespace_name(self) -> NamespaceName:
        return NamespaceName(self.tenant, self.namespace)

    @property
    def partition_index(self) -> int:
        """The partition number, or -1 for a topic that is not a partition."""
        m = _PARTITION.match(self.local_name)
        return int(m.group(2)) if m else -1

    @property
    def partitioned_topic(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        m = _PARTITION.match(self.local_name)
        return TopicName(self.domain, self.tenant, self.namespace, m.group(1)) if m else self

    def partition(self, index: int) -> TopicName:
        return TopicName(self.domain, self.tenant, self.namespace,
                         f"{self.local_name}{PARTITION_SUFFIX}{index}")

    @property
    def storage_name(self) -> str:
        """The managed-ledger name: tenant/namespace/domain/encoded-local-name."""
        return f"{self.tenant}/{self.namespace}/{self.domain}/{quote(self.local_name, safe='')}"

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"
