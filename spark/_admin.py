"""What the data source asks the admin REST API: partitions, ledgers, entry indexes.

Theory of operation: a Magnetar topic-partition is a sequence of entries spread over
ledgers; each entry carries the broker index of its last message (the Kafka-compatible
offset). The driver turns Kafka-style offsets into entry positions here, with a binary
search over the entries the internal stats list (one ``ledger/{l}/entry/{e}`` request
per probe), so planning a read costs O(log entries) requests per partition, whatever
the backlog. The internal stats also carry each ledger's metadata record (its bookie
ensembles), with which executors read straight from the bookies; a Pulsar Reader from
those positions is the fallback.

Everything here is blocking and stateless; each call is one HTTP request with a timeout.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["AdminClient", "AdminError", "EntryInfo", "TopicName", "split_topic_name"]

#: Seconds one admin request may take.
REQUEST_TIMEOUT = 30.0

_PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-partition-(?P<n>\d+)$")


class AdminError(RuntimeError):
    """The admin REST API answered with an error or could not be reached."""


@dataclass(frozen=True, slots=True)
class TopicName:
    """A topic as the data source names it: ``domain://tenant/namespace/local``."""

    domain: str
    tenant: str
    namespace: str
    local: str

    @property
    def full(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local}"

    def partition(self, n: int) -> TopicName:
        return TopicName(self.domain, self.tenant, self.namespace, f"{self.local}-partition-{n}")

    @property
    def rest_path(self) -> str:
        local = urllib.parse.quote(self.local, safe="")
        return f"/admin/v2/{self.domain}/{self.tenant}/{self.namespace}/{local}"


def split_topic_name(name: str) -> TopicName:
    """``orders``, ``tenant/ns/orders`` or ``persistent://tenant/ns/orders`` as a TopicName.

    A short name lives in ``public/default``, as for Pulsar and Kafka clients.
    """
    domain = "persistent"
    rest = name.strip()
    if "://" in rest:
        domain, rest = rest.split("://", 1)
    parts = rest.split("/", 2)
    if len(parts) == 1:
        if not parts[0]:
            raise ValueError(f"empty topic name in {name!r}")
        return TopicName(domain, "public", "default", parts[0])
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"topic {name!r} is not 'name', 'tenant/namespace/name' or a full name")
    return TopicName(domain, parts[0], parts[1], parts[2])


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """One stored entry: its position, the index of its last message, how many it holds."""

    ledger_id: int
    entry_id: int
    index: int
    num_messages: int

    @property
    def base_offset(self) -> int:
        return self.index - self.num_messages + 1


class AdminClient:
    """Blocking calls on the admin REST API at ``admin_url`` (``http://host:port``)."""

    def __init__(self, admin_url: str, timeout: float = REQUEST_TIMEOUT):
        self.admin_url = admin_url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.admin_url + path, method="GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, {}, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(f"GET {self.admin_url}{path}: {exc}") from None

    def _json(self, path: str, *, missing: Any = None) -> Any:
        status, _, body = self._get(path)
        if status == 404 and missing is not None:
            return missing
        if status != 200:
            raise AdminError(f"GET {path}: HTTP {status}: {body[:200]!r}")
        try:
            return json.loads(body)
        except ValueError:
            raise AdminError(f"GET {path}: not JSON: {body[:200]!r}") from None

    def partitions(self, topic: TopicName) -> int:
        """The partition count of a partitioned topic; 0 for a non-partitioned one."""
        doc = self._json(topic.rest_path + "/partitions", missing={"partitions": 0})
        return int(doc.get("partitions", 0))

    def list_topics(self, tenant: str, namespace: str) -> list[str]:
        """Every topic of the namespace, partitions folded into their partitioned topic."""
        names: set[str] = set()
        for path in (f"/admin/v2/persistent/{tenant}/{namespace}",
                     f"/admin/v2/persistent/{tenant}/{namespace}/partitioned"):
            for full in self._json(path, missing=[]):
                m = _PARTITION_SUFFIX.match(full)
                names.add(m.group("base") if m else full)
        return sorted(names)

    def schema(self, topic: TopicName) -> tuple[str, str] | None:
        """The topic's latest schema as (type, definition), or None when it has none."""
        local = urllib.parse.quote(topic.local, safe="")
        doc = self._json(f"/admin/v2/schemas/{topic.tenant}/{topic.namespace}/{local}/schema", missing={})
        if not doc or "type" not in doc:
            return None
        return str(doc["type"]).upper(), str(doc.get("data", ""))

    def ledgers_with_metadata(self, topic: TopicName) -> tuple[list[tuple[int, int]], dict[int, str]]:
        """``[(ledger_id, entries), ...]`` of the stored ledgers holding entries, in order,
        and each ledger's metadata record (JSON text: its ensembles and quorums) where the
        broker reports it (``internalStats?metadata=true``).

        Only confirmed entries count: the ledger of ``lastConfirmedEntry`` is cut there and
        later ledgers are left out, so every entry listed is final on its bookies.
        """
        doc = self._json(topic.rest_path + "/internalStats?metadata=true", missing={})
        last = str(doc.get("lastConfirmedEntry", "-1:-1"))
        try:
            last_ledger, last_entry = (int(x) for x in last.split(":", 1))
        except ValueError:
            last_ledger, last_entry = -1, -1
        out = []
        metadata = {}
        for ledger in doc.get("ledgers", []):
            lid, n = int(ledger["ledgerId"]), int(ledger.get("entries", 0))
            if lid == last_ledger:
                n = last_entry + 1
            elif lid > last_ledger:
                continue
            if n > 0:
                out.append((lid, n))
                if isinstance(ledger.get("metadata"), str):
                    metadata[lid] = ledger["metadata"]
        return out, metadata

    def entry(self, topic: TopicName, ledger_id: int, entry_id: int) -> EntryInfo:
        """The index and message count of the entry at ``ledger_id:entry_id``."""
        status, headers, body = self._get(f"{topic.rest_path}/ledger/{ledger_id}/entry/{entry_id}")
        if status != 200:
            raise AdminError(f"entry {ledger_id}:{entry_id} of {topic.full}: HTTP {status}: {body[:200]!r}")
        try:
            index = int(headers["x-pulsar-broker-entry-metadata-index"])
            n = int(headers.get("x-pulsar-num-batch-message", "1"))
        except (KeyError, ValueError):
            raise AdminError(f"entry {ledger_id}:{entry_id} of {topic.full} carries no broker index") from None
        if index < 0:
            raise AdminError(f"entry {ledger_id}:{entry_id} of {topic.full} carries no broker index")
        return EntryInfo(ledger_id, entry_id, index, max(n, 1))


class PartitionLayout:
    """The entries of one topic-partition as the internal stats list them, addressable by
    ordinal, with offsets resolved by binary search."""

    def __init__(self, admin: AdminClient, topic: TopicName):
        self.admin = admin
        self.topic = topic
        self.ledgers, self.metadata = admin.ledgers_with_metadata(topic)
        self.total = sum(n for _, n in self.ledgers)
        self._cache: dict[int, EntryInfo] = {}

    def position(self, ordinal: int) -> tuple[int, int]:
        for lid, n in self.ledgers:
            if ordinal < n:
                return lid, ordinal
            ordinal -= n
        raise IndexError(ordinal)

    def info(self, ordinal: int) -> EntryInfo:
        if ordinal not in self._cache:
            self._cache[ordinal] = self.admin.entry(self.topic, *self.position(ordinal))
        return self._cache[ordinal]

    def earliest(self) -> int:
        """The offset of the first stored message (0 for an empty partition)."""
        return self.info(0).base_offset if self.total else 0

    def latest(self) -> int:
        """One past the offset of the last stored message (0 for an empty partition)."""
        return self.info(self.total - 1).index + 1 if self.total else 0

    def find(self, offset: int) -> int | None:
        """The ordinal of the entry holding ``offset`` (or the first after it), else None."""
        if not self.total or self.info(self.total - 1).index < offset:
            return None
        # Whole-backlog reads start at the first entry and end in the last one: no search.
        if self.info(0).index >= offset:
            return 0
        if self.info(self.total - 1).base_offset <= offset:
            return self.total - 1
        lo, hi = 0, self.total
        while lo < hi:
            mid = (lo + hi) // 2
            if self.info(mid).index < offset:
                lo = mid + 1
            else:
                hi = mid
        # The last entry holds the offset (checked above), so the search ends inside.
        return lo

    def ledger_starts(self, first: int, last: int) -> list[int]:
        """Ordinals in ``[first, last]`` at which a ledger begins, plus ``first``."""
        out = [first]
        ordinal = 0
        for _, n in self.ledgers:
            if first < ordinal <= last:
                out.append(ordinal)
            ordinal += n
        return out
