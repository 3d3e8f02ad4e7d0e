"""The BrokerService: what every protocol handler talks to.

It resolves names against tenants, namespaces and policies, opens topics on demand
(honouring ``allowAutoTopicCreation`` and the namespace's override), and owns the trio
tasks that topics and subscriptions run in.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote

import trio

from core._bridge import NativeBridge
from core.auth import AuthService
from core.autorecovery import Auditor
from core.naming import PARTITION_SUFFIX, NamespaceName, TopicName
from core.nonpersistent import NonPersistentTopic
from core.policies import (
    INACTIVE_CHECK_SECONDS,
    PolicyStore,
    PreconditionError,
    exact_retention,
    size_retention_floor,
)
from core.schema import SchemaRegistry
from core.stats import BrokerStats
from core.storage import Storage
from core.topic import (
    DEDUP_PRODUCER_INACTIVITY_MINUTES,
    NotAllowedError,
    PersistentTopic,
    topic_metadata_paths,
)

__all__ = ["BrokerService", "TopicNotFoundError", "NamespaceNotFoundError", "TopicExistsError"]

log = logging.getLogger(__name__)


class TopicNotFoundError(LookupError):
    pass


class NamespaceNotFoundError(LookupError):
    pass


class TopicExistsError(Exception):
    pass


class SubscriptionNotFoundError(LookupError):
    pass


class PartitionCountError(ValueError):
    """A partitioned topic with more partitions than the broker allows (Pulsar answers
    406 over REST)."""


class TopicQuotaError(PreconditionError):
    """Creating the topic would take its namespace past ``maxTopicsPerNamespace``."""


#: Default period of the message-TTL and backlog-quota checks (Pulsar's defaults).
MESSAGE_EXPIRY_CHECK_MINUTES = 5.0
SUBSCRIPTION_EXPIRY_CHECK_MINUTES = 5.0
BACKLOG_QUOTA_CHECK_SECONDS = 60.0
COMPACTION_CHECK_SECONDS = 60.0


#: Names listed between two yields to the event loop: a partitioned topic may have
#: millions of partitions (``maxNumPartitionsPerPartitionedTopic=0`` sets no limit, as in
#: Pulsar) and the loop serves every client while a namespace is listed.
NAMES_PER_YIELD = 4096


def lexicographic(n: int) -> Iterator[int]:
    """``0 .. n-1`` in the order of their decimal strings (0, 1, 10, 100, ..., 11, ...):
    a partitioned topic's partition names in sorted order, without sorting them."""
    if n <= 0:
        return
    yield 0
    i = 1
    for _ in range(n - 1):
        yield i
        if i * 10 < n:
            i *= 10
        else:
            while i % 10 == 9 or i + 1 >= n:
                i //= 10
            i += 1


def _partition_names(name: TopicName, n: int) -> Iterator[str]:
    """The names of `name`'s `n` partitions, sorted."""
    prefix = f"{name}{PARTITION_SUFFIX}"
    for i in lexicographic(n):
        yield f"{prefix}{i}"


COUNTERS_ROOT = "/counters"
"""Where the metadata store keeps the numbers a broker claims (:meth:`BrokerService.claim_number`)."""


class BrokerService:
    def __init__(self, config: Any, metadata: Any):
        self.config = config
        self.metadata = metadata
        self.cluster = str(config.get("clusterName"))
        self.policies = PolicyStore(metadata, self.cluster)
        #: Who a client is and what it may do (authenticationEnabled, authorizationEnabled).
        self.auth = AuthService(config, self.policies)
        self.bridge = NativeBridge()
        self.storage: Storage | None = None
        self.topics: dict[str, PersistentTopic] = {}
        self._opening: dict[str, trio.Event] = {}
        self.stats = BrokerStats()
        self.schemas = SchemaRegistry(self)
        #: Pulsar's advertised listeners, {name: {scheme: url}}, and the one that answers
        #: a lookup naming none (set when the Pulsar handler binds).
        self.pulsar_listeners: dict[str, dict[str, str]] = {}
        self.internal_listener = ""
        self.web_service_url = ""
        # In-process bookies (standalone), for their metrics.
        self.bookies: list[Any] = []
        self._nursery: trio.Nursery | None = None
        #: Restores the copies of lost bookies (when this broker is the auditor).
        self.auditor: Auditor | None = None
        #: How many topics compact at once (``compactionServiceThreads``).
        self.compaction_limiter = trio.CapacityLimiter(int(config.get("compactionServiceThreads", 1)))
        #: How many topics load at once (``maxConcurrentTopicLoadRequest``, a dynamic key:
        #: see :meth:`_topic_load_slots`).
        self.topic_load_limiter = trio.CapacityLimiter(self._topic_load_slots())
        #: Called with each topic once it is loaded (a handler routing by pattern attaches
        #: the subscriptions whose filters match a topic created after them).
        self.topic_loaded: list[Callable[[PersistentTopic], None]] = []
        #: What a protocol handler shows the admin API, by protocol name (the AMQP handler
        #: lists each vhost's exchanges, queues and bindings).
        self.protocol_views: dict[str, Any] = {}

    def claim_number(self, counter: str) -> int:
        """The next number (0 first) of the counter ``counter`` in the metadata store:
        never the same twice, across restarts and brokers sharing the store. Pulsar names
        the producers it names with one such number per broker start (the counters under
        ``/counters``), so that a name never comes back."""
        from core.metadata import AlreadyExistsError, BadVersionError

        path = f"{COUNTERS_ROOT}/{counter}"
        while True:
            got = self.metadata.get(path)
            number = 0 if got is None else int(got[0]) + 1
            try:
                self.metadata.put(path, str(number).encode(), -1 if got is None else got[1])
            except (AlreadyExistsError, BadVersionError):
                continue  # another broker took one meanwhile
            return number

    def _topic_load_slots(self) -> int:
        """``maxConcurrentTopicLoadRequest`` as it is now; the limiter follows it at each
        load (loads under way when it is lowered finish, and no new one starts until fewer
        than the new limit are under way)."""
        return max(1, int(self.config.get("maxConcurrentTopicLoadRequest", 5000)))

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; then close every topic (cursors and dedup persisted)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.bridge.run)
                self.storage = Storage(self.bridge, self.metadata,
                                       int(self.config.get("bookkeeperClientTimeoutInSeconds", 30)) * 1000,
                                       int(self.config.get("managedLedgerCacheSizeMB")),
                                       float(self.config.get("managedLedgerCacheEvictionWatermark")),
                                       int(self.config.get("nettyMaxFrameSizeBytes")))
                host = self.config.get("advertisedAddress") or self.config.get("bindAddress")
                self.policies.ensure_defaults(
                    f"pulsar://{host}:{self.config.get('brokerServicePort')}",
                    f"http://{host}:{self.config.get('webServicePort')}",
                )
                nursery.start_soon(self._housekeeping)
                if self.config.get("autoRecoveryDaemonEnabled", True):
                    self.auditor = Auditor(
                        self.metadata, self.storage,
                        lost_delay_s=float(self.config.get("lostBookieRecoveryDelay", 0)),
                        batch=int(self.config.get("rereplicationEntryBatchSize", 100)))
                    nursery.start_soon(self.auditor.run)
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self._close_all()

    async def _close_all(self) -> None:
        if self.storage is None:
            return
        # The bridge task is gone with the nursery; run a private one for the shutdown.
        async with trio.open_nursery() as nursery:
            await nursery.start(self.bridge.run)
            for topic in list(self.topics.values()):
                try:
                    await topic.close()
                except Exception:
                    log.exception("closing %s", topic.name)
            self.topics.clear()
            nursery.cancel_scope.cancel()
        self.storage.shutdown()

    # -- names and policies ------------------------------------------------------------------------

    @property
    def pulsar_service_url(self) -> str:
        """The internal listener's pulsar:// URL ("" until the Pulsar handler binds)."""
        urls = self.pulsar_listener()
        return urls.get("pulsar", "") if urls else ""

    def pulsar_listener(self, name: str = "") -> dict[str, str] | None:
        """The URLs ({scheme: url}) of the advertised listener `name`, the internal one when
        `name` is empty; None when the broker has no listener of that name."""
        return self.pulsar_listeners.get(name or self.internal_listener)

    def namespace_policies(self, ns: NamespaceName) -> dict[str, Any]:
        pol = self.policies.get_namespace(ns)
        if pol is None:
            raise NamespaceNotFoundError(f"Namespace {ns} does not exist")
        return pol

    def auto_creation(self, pol: dict[str, Any]) -> tuple[bool, str, int]:
        """What auto-creation does in a namespace of policies ``pol``: (allowed, topic
        type, partitions), its ``autoTopicCreationOverride`` else the broker's settings."""
        override = pol.get("autoTopicCreationOverride")
        if override:
            return (bool(override.get("allowAutoTopicCreation")),
                    str(override.get("topicType", "non-partitioned")),
                    int(override.get("defaultNumPartitions") or 1))
        return (bool(self.config.get("allowAutoTopicCreation")),
                str(self.config.get("allowAutoTopicCreationType")),
                int(self.config.get("defaultNumPartitions")))

    def check_partition_count(self, partitions: int) -> None:
        """Refuse a partitioned topic of `partitions` past ``maxNumPartitionsPerPartitionedTopic``
        (0: no limit), as Pulsar does."""
        limit = int(self.config.get("maxNumPartitionsPerPartitionedTopic", 0) or 0)
        if limit > 0 and partitions > limit:
            raise PartitionCountError(f"Number of partitions should be less than or equal to {limit}")

    def check_topic_quota(self, name: TopicName, pol: dict[str, Any], new_topics: int = 1) -> None:
        """Refuse to create `new_topics` persistent topics (a partitioned topic's
        partitions count one each) where the namespace's ``max_topics_per_namespace`` (in
        its policies `pol`), else the broker's ``maxTopicsPerNamespace``, would be passed."""
        if not name.persistent:
            return
        ns = name.namespace_name
        limit = pol.get("max_topics_per_namespace")
        if limit is None:
            limit = self.config.get("maxTopicsPerNamespace", 0)
        if not limit or limit <= 0:
            return
        if self._persistent_topic_count(ns) + new_topics > limit:
            raise TopicQuotaError("Exceed maximum number of topics in namespace.")

    def _persistent_topic_count(self, ns: NamespaceName) -> int:
        """The namespace's persistent topics as the topic quota counts them: each stored
        topic, and each partition of its partitioned topics, stored yet or not (a
        partition is stored when first opened; Pulsar creates them with the topic)."""
        names = set(self.metadata.children(f"/managed-ledgers/{ns}/persistent"))
        for full in self.policies.partitioned_topics(ns):
            topic = TopicName.parse(full)
            names.update(topic.partition(i).storage_name.rpartition("/")[2]
                         for i in range(self.policies.partitions(topic)))
        return len(names)

    def _ml_exists(self, name: TopicName) -> bool:
        if not name.persistent:
            return False  # a non-persistent topic exists only while it is loaded
        return self.metadata.get(f"/managed-ledgers/{name.storage_name}") is not None

    async def partitioned_metadata(self, name: TopicName, *, create: bool = True) -> int:
        """The partition count of `name` (0 for a non-partitioned topic); creates the
        partitioned topic when auto-creation says so and nothing exists yet."""
        pol = self.namespace_policies(name.namespace_name)
        n = self.policies.partitions(name)
        if n or name.partition_index >= 0:
            return n if name.partition_index < 0 else 0
        if create and not self.topic_exists(name):
            allowed, kind, count = self.auto_creation(pol)
            if allowed and kind == "partitioned":
                self.check_partition_count(count)
                self.check_topic_quota(name, pol, count)
                self.policies.create_partitioned(name, count)
                return count
        return 0

    def ml_config(self, pol: dict[str, Any]) -> dict[str, Any]:
        c = self.config
        retention = pol.get("retention_policies") or {}
        rt = retention.get("retentionTimeInMinutes", c.get("defaultRetentionTimeInMinutes"))
        rs = retention.get("retentionSizeInMB", c.get("defaultRetentionSizeInMB"))
        exact_ms, exact_bytes = exact_retention(pol)
        # A namespace's or topic's persistence policy replaces the broker's defaults, and a
        # topic's ledger rollover policy (Kafka's segment.ms and segment.bytes) its rollover.
        persistence = pol.get("persistence") or {}
        rollover = pol.get("ledger_rollover") or {}
        return {
            "ensemble_size": int(persistence.get("bookkeeperEnsemble",
                                                 c.get("managedLedgerDefaultEnsembleSize"))),
            "write_quorum": int(persistence.get("bookkeeperWriteQuorum",
                                                c.get("managedLedgerDefaultWriteQuorum"))),
            "ack_quorum": int(persistence.get("bookkeeperAckQuorum",
                                              c.get("managedLedgerDefaultAckQuorum"))),
            "max_entries_per_ledger": int(c.get("managedLedgerMaxEntriesPerLedger")),
            "min_rollover_time_ms": int(float(c.get("managedLedgerMinLedgerRolloverTimeMinutes")) * 60_000),
            "max_rollover_time_ms": int(rollover.get(
                "rolloverTimeInMillis", float(c.get("managedLedgerMaxLedgerRolloverTimeMinutes")) * 60_000)),
            "max_ledger_size_mb": int(rollover.get("rolloverSizeInMB", c.get("managedLedgerMaxSizePerLedgerMbytes"))),
            "inactive_rollover_time_ms": int(c.get("managedLedgerInactiveLedgerRolloverTimeSeconds")) * 1000,
            # A retention finer than minutes (Kafka's retention.ms) is the storage's own
            # resolution; one finer than MB (retention.bytes) the retention check applies
            # (``_housekeeping``), so the storage has no size limit of its own then.
            "retention_time_ms": exact_ms if exact_ms is not None else -1 if int(rt) < 0 else int(rt) * 60_000,
            "retention_size_mb": -1 if exact_bytes is not None else int(rs),
            "mark_delete_rate_per_sec": float(persistence.get(
                "managedLedgerMaxMarkDeleteRate", c.get("managedLedgerDefaultMarkDeleteRateLimit"))),
            "cache_eviction_time_ms": int(c.get("managedLedgerCacheEvictionTimeThresholdMillis")),
        }

    def check_domain_enabled(self, name: TopicName) -> None:
        """Refuse a topic of a domain the broker does not serve (Pulsar's
        ``enablePersistentTopics`` and ``enableNonPersistentTopics``)."""
        key = "enablePersistentTopics" if name.persistent else "enableNonPersistentTopics"
        if not self.config.get(key, True):
            raise NotAllowedError(f"The broker does not serve {name.domain} topics ({key}=false): {name}")

    async def get_topic(self, name: TopicName, *, create: bool = True) -> PersistentTopic:
        key = str(name)
        while True:
            topic = self.topics.get(key)
            if topic is not None:
                return topic  # loaded, so of a domain the broker serves
            opening = self._opening.get(key)
            if opening is None:
                break
            await opening.wait()
        self.check_domain_enabled(name)
        pol = self.namespace_policies(name.namespace_name)
        if not self._ml_exists(name):
            partitions = self.policies.partitions(name)
            if partitions and name.partition_index < 0:
                raise TopicNotFoundError(f"Topic {name} is a partitioned topic: use its partitions")
            allowed, _, _ = self.auto_creation(pol)
            parent = self.policies.partitions(name.partitioned_topic) if name.partition_index >= 0 else 0
            if parent and name.partition_index >= parent:
                # Pulsar's BrokerService: a partition past the count is refused (a
                # non-persistent one is not found), never created as a topic of its own
                if not name.persistent:
                    raise TopicNotFoundError(f"Topic {name} does not exist")
                raise NotAllowedError(f"Illegal topic partition name {name} with max allowed "
                                      f"{parent} partitions")
            implicit_partition = parent > name.partition_index >= 0
            if not (create and (allowed or implicit_partition)):
                raise TopicNotFoundError(f"Topic {name} does not exist")
            if not implicit_partition:
                self.check_topic_quota(name, pol)
        return await self._load(name, pol)

    async def _load(self, name: TopicName, pol: dict[str, Any]) -> PersistentTopic:
        key = str(name)
        event = self._opening[key] = trio.Event()
        try:
            assert self.storage is not None and self._nursery is not None
            self.topic_load_limiter.total_tokens = self._topic_load_slots()
            async with self.topic_load_limiter:
                pol = self.policies.effective(name, pol)
                if name.persistent:
                    topic = PersistentTopic(self, name, await self.storage.open(
                        name.storage_name, self.ml_config(pol)), pol)
                else:
                    topic = NonPersistentTopic(self, name, pol)
                await topic.start(self._nursery)
            self.topics[key] = topic
            for listener in self.topic_loaded:
                listener(topic)
            return topic
        finally:
            del self._opening[key]
            event.set()

    def topics_of_namespace(self, ns: NamespaceName, domain: str = "persistent") -> list[str]:
        if self.policies.get_namespace(ns) is None:
            raise NamespaceNotFoundError(f"Namespace {ns} does not exist")
        # Non-persistent topics are listed while they are loaded, as Pulsar does.
        names = self.metadata.children(f"/managed-ledgers/{ns}/{domain}") if domain == "persistent" else []
        found = {f"{domain}://{ns}/{unquote(n)}" for n in names}
        found.update(k for k in self.topics if k.startswith(f"{domain}://{ns}/"))
        return sorted(found)

    def partitioned_topics(self, ns: NamespaceName, domain: str = "persistent") -> list[tuple[TopicName, int]]:
        """The namespace's partitioned topics, each with its partition count."""
        return [(name, self.policies.partitions(name))
                for name in map(TopicName.parse, self.policies.partitioned_topics(ns, domain))]

    async def topic_names(self, ns: NamespaceName, domain: str = "persistent") -> list[str]:
        """Every topic of the namespace, sorted: non-partitioned topics and the partitions
        of partitioned ones, as ``topics list`` and GET_TOPICS_OF_NAMESPACE show them. Each
        partitioned topic's names are generated in order and merged with the others,
        yielding to the event loop every :data:`NAMES_PER_YIELD` names."""
        runs = [iter(self.topics_of_namespace(ns, domain))]
        runs += [_partition_names(name, n) for name, n in self.partitioned_topics(ns, domain)]
        out: list[str] = []
        for count, topic in enumerate(heapq.merge(*runs), 1):
            if not out or out[-1] != topic:
                out.append(topic)
            if count % NAMES_PER_YIELD == 0:
                await trio.lowlevel.checkpoint()
        return out

    def _persistent_topics(self) -> list[TopicName]:
        """Every persistent topic with a managed ledger, in every namespace."""
        found = []
        for tenant in self.policies.tenants():
            for ns in self.policies.namespaces(tenant):
                try:
                    names = self.topics_of_namespace(NamespaceName.parse(ns))
                except (NamespaceNotFoundError, ValueError):
                    continue  # deleted meanwhile, or not a name this broker serves
                for n in names:
                    try:
                        found.append(TopicName.parse(n))
                    except ValueError:
                        log.warning("not loading %s: not a valid topic name", n)
        return found

    async def load_namespace_topics(self) -> None:
        """Load every persistent topic, as a Pulsar broker does for the namespace bundles
        it takes ownership of (``loadNamespaceTopics``; a standalone owns them all): their
        subscriptions' backlogs are in the metrics and the periodic policy checks (TTL,
        backlog quota, retention) reach them without a client touching them first.

        Runs in the background once the broker is ready; at most
        ``maxConcurrentTopicLoadRequest`` topics load at once (clients' loads included). A
        topic that fails to load is logged and left for a client to load on demand."""
        names = self._persistent_topics() if self.config.get("enablePersistentTopics", True) else []
        pending = iter(names)

        async def loader() -> None:
            for name in pending:
                try:
                    await self.get_topic(name, create=False)
                except (TopicNotFoundError, NamespaceNotFoundError):
                    pass  # deleted since it was listed
                except Exception:
                    log.exception("loading %s", name)

        workers = min(len(names), self._topic_load_slots())
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(workers):
                nursery.start_soon(loader)
        if names:
            log.info("loaded %d topics of the owned namespaces in %.2fs",
                     len(names), trio.current_time() - started)

    async def delete_topic(self, name: TopicName, *, force: bool = False) -> None:
        """Delete the topic's data; refused while clients are connected unless `force`,
        which disconnects them first."""
        topic = self.topics.get(str(name))
        if topic is not None:
            if topic.producers or any(s.consumers for s in topic.subscriptions.values()):
                if not force:
                    raise PreconditionError("Topic has active producers/subscriptions")
        elif not self._ml_exists(name):
            raise TopicNotFoundError(f"Topic {name} not found")
        assert self.storage is not None
        async with self._closing(name):
            if topic is not None:
                self.topics.pop(str(name), None)
                topic.disconnect_all()
                await topic.close()
            if not name.persistent:
                return
            ml = await self.storage.open(name.storage_name,
                                         self.ml_config(self.namespace_policies(name.namespace_name)))
            await ml.delete()
        for leftover in topic_metadata_paths(name):
            if self.metadata.exists(leftover):
                self.metadata.delete(leftover)

    async def _delete_inactive(self, topic: PersistentTopic, policy: dict[str, Any]) -> None:
        """Delete a topic its inactive topic policies found inactive for long enough, with
        its own policies, as Pulsar's topic garbage collection does. Its consumers are
        disconnected in ``delete_when_subscriptions_caught_up``, as there; otherwise a
        client that arrived since the check keeps it."""
        mode = str(policy.get("inactiveTopicDeleteMode"))
        try:
            await self.delete_topic(topic.name, force=mode == "delete_when_subscriptions_caught_up")
        except (PreconditionError, TopicNotFoundError):
            return
        self.policies.delete_topic_policies(topic.name)
        log.info("%s: deleted after %d s inactive (%s)", topic.name,
                 int(policy.get("maxInactiveDurationSeconds") or 0), mode)
        if topic.name.partition_index >= 0 and self.config.get(
                "brokerDeleteInactivePartitionedTopicMetadataEnabled", False):
            self._delete_partitioned_if_no_partitions(topic.name.partitioned_topic)

    def _delete_partitioned_if_no_partitions(self, name: TopicName) -> None:
        """Delete the partitioned topic `name` (its metadata and its own policies) once
        none of its partitions exists any more, as Pulsar's
        ``PersistentTopic.tryToDeletePartitionedMetadata`` does after an inactive
        partition is deleted: each partition goes when it is found inactive, and the
        last one to go takes the partitioned topic with it."""
        partitions = self.policies.partitions(name)
        if not partitions or any(self.topic_exists(name.partition(i)) for i in range(partitions)):
            return
        self.delete_partitioned_metadata(name)
        log.info("%s: partitioned topic deleted, none of its %d partitions is left", name, partitions)

    def delete_partitioned_metadata(self, name: TopicName) -> None:
        """Delete what the partitioned topic `name` itself holds: its metadata (the
        partition count) and its topic policies. Its partitions are not touched."""
        self.policies.delete_partitioned(name)
        self.policies.delete_topic_policies(name)

    # -- administration ------------------------------------------------------------------------------

    def topic_exists(self, name: TopicName) -> bool:
        return str(name) in self.topics or self._ml_exists(name)

    async def create_topic(self, name: TopicName) -> PersistentTopic:
        """Create a non-partitioned topic explicitly (whatever auto-creation says)."""
        self.namespace_policies(name.namespace_name)
        self.check_domain_enabled(name)
        if self.topic_exists(name) or (name.partition_index < 0 and self.policies.partitions(name)):
            raise TopicExistsError("This topic already exists")
        assert self.storage is not None
        if not name.persistent:
            while str(name) in self._opening:
                await self._opening[str(name)].wait()
            if str(name) in self.topics:
                raise TopicExistsError("This topic already exists")
            return await self._load(name, self.namespace_policies(name.namespace_name))
        ns_pol = self.namespace_policies(name.namespace_name)
        self.check_topic_quota(name, ns_pol)
        await self._create_ledger(name, ns_pol)
        return await self.get_topic(name)

    async def create_missed_partitions(self, name: TopicName) -> list[TopicName]:
        """Create the partitions of the partitioned topic `name` that have no managed
        ledger yet (Pulsar's ``tryCreatePartitionsAsync``); returns them. Partitions count
        against the topic quota when the partitioned topic is created, so none is asked
        for here. A non-persistent topic's partitions store nothing: there is none to
        create."""
        created: list[TopicName] = []
        if not name.persistent:
            return created
        for i in range(self.policies.partitions(name)):
            part = name.partition(i)
            if not self.topic_exists(part):
                await self._create_ledger(part, self.namespace_policies(name.namespace_name))
                created.append(part)
        return created

    async def _create_ledger(self, name: TopicName, ns_pol: dict[str, Any]) -> None:
        """Create the (empty) managed ledger of the persistent topic `name`."""
        assert self.storage is not None
        ml = await self.storage.open(name.storage_name, self.ml_config(self.policies.effective(name, ns_pol)))
        await ml.close()

    def refresh_policies(self, ns: NamespaceName | None = None) -> None:
        """Give open topics (of `ns`, or all) their current effective policies."""
        for topic in list(self.topics.values()):
            if ns is not None and topic.name.namespace_name != ns:
                continue
            pol = self.policies.get_namespace(topic.name.namespace_name)
            if pol is not None:
                topic.policies = self.policies.effective(topic.name, pol)
                topic.wake_subscriptions()

    def partition_targets(self, name: TopicName) -> list[TopicName]:
        """The partitions of a partitioned topic, else the topic itself."""
        n = self.policies.partitions(name) if name.partition_index < 0 else 0
        return [name.partition(i) for i in range(n)] if n else [name]

    async def topic_policies_changed(self, name: TopicName, *, reload: bool) -> None:
        """Give open topics their current policies after a change to ``name``'s; with
        ``reload``, unload every partition of it (a policy the storage reads only when it
        opens, such as retention, then takes effect as clients reconnect)."""
        self.refresh_policies(name.namespace_name)
        if reload:
            for t in self.partition_targets(name.partitioned_topic):
                await self.unload_topic(t)

    async def unload_topic(self, name: TopicName) -> bool:
        """Close the topic here (its clients are asked to reconnect, which reopens it with
        the current policies); returns whether it was loaded."""
        topic = self.topics.pop(str(name), None)
        if topic is None:
            return False
        async with self._closing(name):
            topic.disconnect_all()
            await topic.close()
        return True

    @asynccontextmanager
    async def _closing(self, name: TopicName) -> AsyncIterator[None]:
        """Hold off `get_topic` for `name` (clients reconnecting at once) until the old
        topic has closed its ledger and cursors."""
        key = str(name)
        while key in self._opening:
            await self._opening[key].wait()
        event = self._opening[key] = trio.Event()
        try:
            yield
        finally:
            del self._opening[key]
            event.set()

    async def check_backlog_quotas(self) -> None:
        """Enforce the backlog quota of every loaded persistent topic now: what the periodic
        check does (Pulsar's ``monitorBacklogQuota``), on request."""
        for topic in list(self.topics.values()):
            if not topic.name.persistent:
                continue
            try:
                await topic.enforce_backlog_quota()
            except Exception:
                log.exception("backlog quota check of %s", topic.name)

    async def trim_topic(self, topic: PersistentTopic) -> None:
        """The retention check of one persistent topic, run by housekeeping every
        ``retentionCheckIntervalInSeconds`` and by the admin API's trim at once: seal idle
        ledgers past their rollover age, without entries for the inactive rollover time,
        or whose entries all outlived retention; then drop what every cursor has passed
        and retention no longer needs."""
        await topic.ml.check_rollover()
        _, exact_bytes = exact_retention(topic.policies)
        if exact_bytes is not None:
            # a size in bytes, not whole MB: the ledgers past it go as ones below a
            # trim floor, once every durable cursor has passed them
            floor = size_retention_floor(topic.ml.ledgers(), exact_bytes)
            if floor > 0:
                topic.ml.raise_trim_floor(floor)
        await topic.ml.trim()

    async def _housekeeping(self) -> None:
        """Message TTL expiry, backlog quota enforcement, retention trimming
        (``retentionCheckIntervalInSeconds``), the deletion of unused subscriptions
        (``subscriptionExpiryCheckIntervalInMinutes``) and compaction past a threshold
        (``brokerServiceCompactionMonitorIntervalInSeconds``), the deduplication state of
        producers gone for ``brokerDeduplicationProducerInactivityTimeoutMinutes`` (every
        third of it, as in Pulsar) and the deletion of inactive
        topics (``brokerDeleteInactiveTopicsFrequencySeconds``), each on its own period
        (``messageExpiryCheckIntervalInMinutes`` - or, finer, Magnetar's
        ``messageExpiryCheckIntervalInSeconds`` - and ``backlogQuotaCheckIntervalInSeconds``).
        Non-persistent topics store nothing: only the deletion of unused subscriptions
        and of inactive topics applies to them, as in Pulsar."""
        config = self.config
        expiry = float(config.get("messageExpiryCheckIntervalInMinutes",
                                  MESSAGE_EXPIRY_CHECK_MINUTES)) * 60.0
        finer = config.get("messageExpiryCheckIntervalInSeconds")
        if finer not in (None, "", 0):
            expiry = float(finer)

        async def compaction_check(topic: PersistentTopic) -> None:
            topic.check_compaction()

        async def dedup_purge(topic: PersistentTopic) -> None:
            topic.purge_inactive_dedup_producers()

        async def inactivity_check(topic: PersistentTopic) -> None:
            policy = topic.inactive_past_limit()
            if policy is not None:
                await self._delete_inactive(topic, policy)

        # (period in seconds, the check), in the order a topic's checks run
        checks: list[tuple[float, Callable[[PersistentTopic], Awaitable[object]]]] = [
            (expiry, lambda topic: topic.expire_messages())]
        if str(config.get("backlogQuotaCheckEnabled", "true")).lower() != "false":
            checks.append((float(config.get("backlogQuotaCheckIntervalInSeconds",
                                            BACKLOG_QUOTA_CHECK_SECONDS)),
                           lambda topic: topic.enforce_backlog_quota()))
        async def subscription_expiry(topic: PersistentTopic) -> None:
            await topic.expire_inactive_subscriptions()

        checks += [
            (float(config.get("retentionCheckIntervalInSeconds")), self.trim_topic),
            (float(config.get("subscriptionExpiryCheckIntervalInMinutes",
                              SUBSCRIPTION_EXPIRY_CHECK_MINUTES)) * 60.0, subscription_expiry),
            (float(config.get("brokerServiceCompactionMonitorIntervalInSeconds",
                              COMPACTION_CHECK_SECONDS)), compaction_check),
            (float(config.get("brokerDeduplicationProducerInactivityTimeoutMinutes",
                              DEDUP_PRODUCER_INACTIVITY_MINUTES)) * 20.0, dedup_purge),
            # last: it may delete the topic. It runs whatever the broker's setting, since
            # a namespace or topic may turn deletion on for itself.
            (float(config.get("brokerDeleteInactiveTopicsFrequencySeconds", INACTIVE_CHECK_SECONDS)),
             inactivity_check),
        ]
        due = [trio.current_time() + period for period, _ in checks]
        while True:
            await trio.sleep_until(min(due))
            now = trio.current_time()
            ready = [check for (_, check), at in zip(checks, due, strict=True) if now >= at]
            for topic in list(self.topics.values()):
                try:
                    for check in ready:
                        if not topic.name.persistent and check not in (subscription_expiry, inactivity_check):
                            continue  # it stores nothing: only its unused subscriptions expire
                        await check(topic)
                except Exception:
                    log.exception("policy check of %s", topic.name)
            due = [now + period if now >= at else at
                   for (period, _), at in zip(checks, due, strict=True)]
