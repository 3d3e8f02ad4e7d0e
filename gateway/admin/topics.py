"""Persistent and non-persistent topics under ``/admin/v2/{persistent|non-persistent}``:
create, create-partitioned, create missed partitions, update partitions, list, delete,
properties, stats, partitioned-stats, internal stats (of a topic and of each partition),
last message id, message id by time, backlog size, terminate, unload, trim, topic-level
policies, and the ``/lookup/v2/topic/...`` lookups. Subscription operations live in
:mod:`gateway.admin.subscriptions`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.broker import PartitionCountError
from core.naming import NamespaceName, TopicName
from core.policies import RETENTION_EXACT

from ._common import (
    RestError,
    body_int,
    body_object,
    endpoint,
    json_body,
    json_list,
    namespace_of,
    path_int,
    query_bool,
    replication_clusters,
    topic_of,
)
from ._permissions import topic_routes
from ._policies import (
    POLICY_SPECS,
    TOPIC_POLICY_SPECS,
    PolicySpec,
    backlog_quota_body,
    default_backlog_quota,
    quota_within_retention,
    read_body,
)
from ._stats import (
    Rates,
    add_earliest_publish_times,
    backlog_size_after,
    internal_stats,
    merge_partition_stats,
    topic_stats,
)

__all__ = ["routes", "DOMAINS", "load_topic", "partition_targets", "policy_topic"]

DOMAINS = ("persistent", "non-persistent")


def _partition_count(broker: Any, body: Any) -> int:
    """A request's partition count, checked as Pulsar checks it (406 when out of range)."""
    n = body_int(body, "Number of partitions")
    if n < 1:
        raise RestError(406, "Number of partitions should be more than 0")
    try:
        broker.check_partition_count(n)
    except PartitionCountError as exc:
        raise RestError(406, str(exc)) from None
    return n


def _properties(body: Any) -> dict[str, str]:
    """A topic's properties from a request body: a JSON object of strings (400 otherwise);
    none when the body is empty."""
    if body is None:
        return {}
    if not isinstance(body, dict) or not all(isinstance(v, str) for v in body.values()):
        raise RestError(400, "Properties must be a JSON object of string values")
    return body


def _partitioned_body(broker: Any, body: Any) -> tuple[int, dict[str, str]]:
    """A create-partitioned-topic body: the partition count, or Pulsar's
    PartitionedTopicMetadata ``{"partitions": n, "properties": {...}}``."""
    if isinstance(body, dict):
        return _partition_count(broker, body.get("partitions")), _properties(body.get("properties"))
    return _partition_count(broker, body), {}


def existing_namespace(broker: Any, ns: NamespaceName) -> None:
    if broker.policies.get_tenant(ns.tenant) is None:
        raise RestError(404, "Tenant does not exist")
    if broker.policies.get_namespace(ns) is None:
        raise RestError(404, "Namespace does not exist")


def policy_topic(broker: Any, name: TopicName) -> TopicName:
    """The topic whose topic-level policies a request names, checked as Pulsar's
    ``preValidation`` checks it for every get, set and remove of one: a partition's name
    is refused (412: a partitioned topic's policies are set on its base name), and the
    topic must exist, as a partitioned topic or a non-partitioned one (404 otherwise, so
    that no policy is left waiting for a topic of that name to be created)."""
    existing_namespace(broker, name.namespace_name)
    if name.partition_index >= 0:
        raise RestError(412, "Not allowed to set/get topic policy for a partition")
    if not broker.policies.partitions(name) and not broker.topic_exists(name):
        raise RestError(404, "Topic not found")
    return name


def check_non_partitioned_name(broker: Any, name: TopicName) -> None:
    """Refuse to create the non-partitioned topic `name` where its name is a partition's,
    as Pulsar's ``validateNonPartitionTopicName`` does: ``X-partition-N`` only names a
    partition of the partitioned topic ``X``, so it cannot be created when ``X`` is not
    partitioned or has no partition ``N`` (412), and a partition that ``X`` has already
    exists (409)."""
    index = name.partition_index
    if index < 0:
        return
    base = name.partitioned_topic
    n = broker.policies.partitions(base)
    prefix = f'Can\'t create topic {name.local_name} with "-partition-" followed by'
    if not n:
        raise RestError(412, f"{prefix} numeric value if there isn't a partitioned topic "
                             f"{base.local_name} created.")
    if index >= n:
        raise RestError(412, f"{prefix} a number smaller than the number of partitions of partitioned topic "
                             f"{base.local_name}")
    raise RestError(409, "This topic already exists")


async def load_topic(broker: Any, name: TopicName) -> Any:
    """The loaded topic; 404 when it does not exist (a partitioned topic's base name is
    not a topic: use its partitions)."""
    existing_namespace(broker, name.namespace_name)
    if name.partition_index < 0 and broker.policies.partitions(name):
        raise RestError(404, f"Topic {name} is a partitioned topic: use its partitions or partitioned-stats")
    if not broker.topic_exists(name):
        parent = name.partitioned_topic
        if not (name.partition_index >= 0 and broker.policies.partitions(parent) > name.partition_index):
            raise RestError(404, "Topic not found")
    return await broker.get_topic(name)


async def _durable_subscriptions(broker: Any, partitions: list[TopicName]) -> set[str]:
    """The durable subscriptions of any of a persistent partitioned topic's `partitions`."""
    names: set[str] = set()
    for p in partitions:
        if p.persistent and broker.topic_exists(p):
            topic = await broker.get_topic(p)
            names.update(s.name for s in topic.subscriptions.values() if s.durable)
    return names


async def _create_subscriptions(broker: Any, partition: TopicName, subs: set[str]) -> None:
    """Give a partition added by a partition-count update the partitioned topic's
    subscriptions, as Pulsar's update does: without them, what is published there before
    the subscription's consumers see the new partition (a client refreshes the count every
    minute; an offline consumer comes back at the latest message) would be missed."""
    if not subs:
        return
    topic = await broker.get_topic(partition)
    for sub in sorted(subs - set(topic.subscriptions)):
        await topic.create_subscription(sub, None)


def partition_targets(broker: Any, name: TopicName) -> list[TopicName]:
    """The partitions of a partitioned topic, else the topic itself."""
    return list(broker.partition_targets(name))


def routes(broker: Any, rates: Rates) -> list[Route]:
    policies = broker.policies

    # -- listing and creation ------------------------------------------------------------------

    @endpoint
    async def list_topics(request: Request) -> Any:
        ns = namespace_of(request)
        existing_namespace(broker, ns)
        return await json_list(await broker.topic_names(ns, request.url.path.split("/")[3]))

    @endpoint
    async def list_partitioned(request: Request) -> Any:
        ns = namespace_of(request)
        existing_namespace(broker, ns)
        return sorted(policies.partitioned_topics(ns, request.url.path.split("/")[3]))

    @endpoint
    async def create_topic(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        check_non_partitioned_name(broker, name)
        if name.partition_index < 0 and policies.partitions(name):
            raise RestError(409, "This topic already exists")
        properties = _properties(await json_body(request, required=False))
        if properties and not name.persistent:
            raise RestError(405, "Properties on a non-persistent topic are not supported")
        await broker.create_topic(name)
        if properties:
            policies.update_topic_properties(name, lambda p: p.update(properties))
        return None

    @endpoint
    async def delete_topic(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        if name.partition_index < 0 and policies.partitions(name):
            raise RestError(409, "Topic is a partitioned topic: use delete-partitioned-topic")
        await broker.delete_topic(name, force=query_bool(request, "force"))
        policies.delete_topic_policies(name)
        return None

    @endpoint
    async def create_partitioned(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        if name.partition_index >= 0:
            raise RestError(412, "Partitioned topic name must not end in -partition-N")
        n, properties = _partitioned_body(broker, await json_body(request))
        if broker.topic_exists(name):
            raise RestError(409, "This topic already exists")
        broker.check_topic_quota(name, broker.namespace_policies(name.namespace_name), n)
        policies.create_partitioned(name, n, properties)
        return None

    @endpoint
    async def update_partitions(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        n = _partition_count(broker, await json_body(request))
        old = policies.partitions(name)
        subs = await _durable_subscriptions(broker, [name.partition(i) for i in range(old)])
        policies.update_partitions(name, n)
        for i in range(old, n):
            await _create_subscriptions(broker, name.partition(i), subs)
        return None

    @endpoint
    async def create_missed_partitions(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        if name.partition_index >= 0 or not policies.partitions(name):
            raise RestError(404, f"Topic {name} does not exist")
        await broker.create_missed_partitions(name)
        return None

    @endpoint
    async def partition_metadata(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        n = policies.partitions(name) if name.partition_index < 0 else 0
        if not n and not broker.topic_exists(name):
            raise RestError(404, "Topic not found")
        return partitioned_metadata(name, n)

    def partitioned_metadata(name: TopicName, n: int) -> dict[str, Any]:
        """Pulsar's PartitionedTopicMetadata of `name`, which has `n` partitions."""
        out: dict[str, Any] = {"partitions": n, "deleted": False}
        if n and (properties := policies.topic_properties(name)):
            out["properties"] = properties
        return out

    # -- properties ------------------------------------------------------------------------------

    def properties_target(request: Request) -> TopicName:
        """The topic whose properties a request names: a partitioned topic, or a persistent
        topic that exists (404 otherwise, 405 for a non-persistent one)."""
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        if name.partition_index < 0 and policies.partitions(name):
            return name
        if not broker.topic_exists(name):
            raise RestError(404, "Topic not found")
        if not name.persistent:
            raise RestError(405, "Properties on a non-persistent topic are not supported")
        return name

    @endpoint
    async def get_properties(request: Request) -> Any:
        return policies.topic_properties(properties_target(request))

    @endpoint
    async def update_properties(request: Request) -> Any:
        name = properties_target(request)
        properties = _properties(await json_body(request, required=False))
        if properties:  # as Pulsar: nothing to add is not an error
            policies.update_topic_properties(name, lambda p: p.update(properties))
        return None

    @endpoint
    async def remove_properties(request: Request) -> Any:
        name = properties_target(request)
        key = request.query_params.get("key")
        if key is None:
            raise RestError(400, "Query parameter key is required")
        policies.update_topic_properties(name, lambda p: p.pop(key, None))
        return None

    @endpoint
    async def delete_partitioned(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        n = policies.partitions(name)
        if not n:
            raise RestError(404, "Partitioned topic does not exist")
        force = query_bool(request, "force")
        for i in range(n):
            part = name.partition(i)
            if broker.topic_exists(part):
                await broker.delete_topic(part, force=force)
        broker.delete_partitioned_metadata(name)
        return None

    # -- stats -------------------------------------------------------------------------------------

    async def stats_of(topic: Any, request: Request) -> dict[str, Any]:
        out = topic_stats(topic, rates)
        if query_bool(request, "getEarliestTimeInBacklog"):
            await add_earliest_publish_times(topic, out)
        return out

    @endpoint
    async def stats(request: Request) -> Any:
        return await stats_of(await load_topic(broker, topic_of(request)), request)

    @endpoint
    async def partitioned_stats(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        n = policies.partitions(name)
        if not n:
            raise RestError(404, "Partitioned Topic not found")
        per: dict[str, dict[str, Any]] = {}
        for i in range(n):
            part = name.partition(i)
            per[str(part)] = await stats_of(await broker.get_topic(part), request)
        return merge_partition_stats(n, per, query_bool(request, "perPartition", True))

    @endpoint
    async def stats_internal(request: Request) -> Any:
        topic = await load_topic(broker, topic_of(request))
        return internal_stats(topic, broker.metadata if query_bool(request, "metadata") else None)

    @endpoint
    async def partitioned_stats_internal(request: Request) -> Any:
        """PartitionedTopicInternalStats: the partitioned topic's metadata and each
        partition's internal stats, by partition name."""
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        n = policies.partitions(name) if name.partition_index < 0 else 0
        if not n:
            raise RestError(404, "Partitioned Topic not found")
        per = {str(part): internal_stats(await broker.get_topic(part)) for part in partition_targets(broker, name)}
        return {"metadata": partitioned_metadata(name, n), "partitions": per}

    @endpoint
    async def last_message_id(request: Request) -> Any:
        topic = await load_topic(broker, topic_of(request))
        if not topic.name.persistent:
            # as Pulsar: a non-persistent topic keeps no last message
            raise RestError(405, "GetLastMessageId on a non-persistent topic is not allowed")
        last = topic.ml.last_confirmed()
        return {"ledgerId": last.ledger_id if last else -1, "entryId": last.entry_id if last else -1,
                "partitionIndex": topic.name.partition_index}

    @endpoint
    async def backlog_size(request: Request) -> Any:
        """The bytes stored after a message id (Pulsar's getBacklogSizeByMessageId)."""
        body = body_object(await json_body(request), "MessageId")
        ledger_id = body_int(body.get("ledgerId"), "ledgerId")
        entry_id = body_int(body.get("entryId", -1), "entryId")
        topic = await load_topic(broker, topic_of(request))
        if not topic.name.persistent:
            raise RestError(405, "Get backlog size on a non-persistent topic is not allowed")
        return backlog_size_after(topic.ml, ledger_id, entry_id)

    @endpoint
    async def message_id_by_time(request: Request) -> Any:
        """The id of the first message published at or after ``{timestamp}`` (epoch ms), as
        Pulsar's getMessageIdByTimestamp answers it; 404 when none was."""
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        timestamp = path_int(request, "timestamp", lo=0)
        if name.partition_index < 0 and policies.partitions(name):
            raise RestError(412, "Get message ID by timestamp on a partitioned topic is not allowed, "
                                 "please try do it on specific topic partition")
        if not name.persistent:
            raise RestError(405, "Get message ID by timestamp on a non-persistent topic is not allowed")
        topic = await load_topic(broker, name)
        found = await topic.ml.find_by_publish_time(timestamp)
        last = topic.ml.last_confirmed()
        # past the last message, the search answers where the next one will go
        if found is None or last is None or found > last:
            raise RestError(404, "Message ID not found")
        return {"ledgerId": found.ledger_id, "entryId": found.entry_id,
                "partitionIndex": topic.name.partition_index}

    # -- lifecycle ----------------------------------------------------------------------------------

    @endpoint
    async def terminate(request: Request) -> Any:
        topic = await load_topic(broker, topic_of(request))
        last = await topic.terminate()
        return {"ledgerId": last.ledger_id, "entryId": last.entry_id,
                "partitionIndex": topic.name.partition_index}

    @endpoint
    async def terminate_partitioned(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        if not policies.partitions(name):
            raise RestError(404, "Partitioned topic does not exist")
        out = {}
        for part in partition_targets(broker, name):
            last = await (await broker.get_topic(part)).terminate()
            out[part.partition_index] = {"ledgerId": last.ledger_id, "entryId": last.entry_id,
                                         "partitionIndex": part.partition_index}
        return out

    @endpoint
    async def unload(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        targets = partition_targets(broker, name)
        if targets == [name] and not broker.topic_exists(name):
            raise RestError(404, "Topic not found")
        for t in targets:
            await broker.unload_topic(t)
        return None

    @endpoint
    async def compact(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        # a partitioned topic's base name compacts every partition, as in Pulsar
        topics = [await load_topic(broker, t) for t in partition_targets(broker, name)]
        started = [topic.start_compaction() for topic in topics]
        if not all(started):
            raise RestError(409, "Compaction already in progress")
        return None

    @endpoint
    async def trim(request: Request) -> Any:
        """Run the retention check now (Pulsar's trimTopic), on each partition of a
        partitioned topic."""
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        if not name.persistent:
            raise RestError(405, "Trim on a non-persistent topic is not allowed")
        for t in partition_targets(broker, name):
            await broker.trim_topic(await load_topic(broker, t))
        return None

    @endpoint
    async def compaction_status(request: Request) -> Any:
        topic = await load_topic(broker, topic_of(request))
        st = topic.compaction_status()
        return {"status": st["status"], "lastError": st.get("lastError", "")}

    # -- topic-level policies -------------------------------------------------------------------------

    def policy_routes(base: str, spec: PolicySpec) -> list[Route]:
        @endpoint
        async def get(request: Request) -> Any:
            name = policy_topic(broker, topic_of(request))
            if not query_bool(request, "applied"):
                return JSONResponse(policies.topic_policies(name).get(spec.key))
            value = applied(name, spec.key)
            if value is None and spec.default is not None:
                value = spec.default(broker.config)
            return JSONResponse(value)

        @endpoint
        async def put(request: Request) -> Any:
            name = policy_topic(broker, topic_of(request))
            value = spec.parse(await read_body(request), request)
            if spec.key == "retention_policies" and not quota_within_retention(
                    broker.config, applied(name, "backlog_quota_map").get("destination_storage"), value):
                raise RestError(412, "Retention Quota must exceed configured backlog quota for topic. "
                                     "Please increase retention quota and retry")
            store_policy(name, spec.key, lambda p: p.__setitem__(spec.key, value))
            await changed(name, spec)
            return None

        @endpoint
        async def delete(request: Request) -> Any:
            name = policy_topic(broker, topic_of(request))
            store_policy(name, spec.key, lambda p: p.pop(spec.key, None))
            await changed(name, spec)
            return None

        path = f"{base}/{{topic}}/{spec.suffix}"
        return [Route(path, get, methods=["GET"]), Route(path, put, methods=list(spec.set_methods)),
                Route(path, delete, methods=["DELETE"])]

    def store_policy(name: TopicName, key: str, change: Any) -> None:
        """Apply ``change`` to the topic's own policies. A retention set or removed here,
        in whole minutes and MB, replaces the finer one a Kafka client may have set
        (``retention_exact``) as well."""

        def apply(p: dict[str, Any]) -> None:
            change(p)
            if key == "retention_policies":
                p.pop(RETENTION_EXACT, None)

        policies.update_topic_policies(name, apply)

    def applied(name: TopicName, key: str) -> Any:
        """A policy of the topic's own, else of its namespace (None: neither sets it)."""
        value = policies.topic_policies(name).get(key)
        return (policies.get_namespace(name.namespace_name) or {}).get(key) if value is None else value

    async def changed(name: TopicName, spec: PolicySpec | None = None) -> None:
        await broker.topic_policies_changed(name, reload=spec is not None and spec.reload)

    @endpoint
    async def get_backlog_quotas(request: Request) -> Any:
        name = policy_topic(broker, topic_of(request))
        value = policies.topic_policies(name).get("backlog_quota_map")
        if not value and query_bool(request, "applied"):
            value = (policies.get_namespace(name.namespace_name) or {}).get("backlog_quota_map") or \
                {"destination_storage": default_backlog_quota(broker.config)}
        return value or {}

    @endpoint
    async def set_backlog_quota(request: Request) -> Any:
        name = policy_topic(broker, topic_of(request))
        kind, quota = backlog_quota_body(await json_body(request), request)
        retention = applied(name, "retention_policies") or {
            "retentionTimeInMinutes": int(broker.config.get("defaultRetentionTimeInMinutes")),
            "retentionSizeInMB": int(broker.config.get("defaultRetentionSizeInMB"))}
        if not quota_within_retention(broker.config, quota, retention):
            raise RestError(412, "Backlog Quota exceeds configured retention quota for topic. "
                                 "Please increase retention quota and retry")

        def apply(p: dict[str, Any]) -> None:
            p["backlog_quota_map"] = {**(p.get("backlog_quota_map") or {}), kind: quota}

        policies.update_topic_policies(name, apply)
        await changed(name)
        return None

    @endpoint
    async def remove_backlog_quota(request: Request) -> Any:
        name = policy_topic(broker, topic_of(request))
        kind = request.query_params.get("backlogQuotaType", "destination_storage")

        def apply(p: dict[str, Any]) -> None:
            remaining = {k: v for k, v in (p.get("backlog_quota_map") or {}).items() if k != kind}
            if remaining:
                p["backlog_quota_map"] = remaining
            else:
                p.pop("backlog_quota_map", None)

        policies.update_topic_policies(name, apply)
        await changed(name)
        return None

    @endpoint
    async def get_replication(request: Request) -> Any:
        name = policy_topic(broker, topic_of(request))
        value = policies.topic_policies(name).get("replication_clusters")
        if value is None and query_bool(request, "applied"):
            value = (policies.get_namespace(name.namespace_name) or {}).get("replication_clusters")
        return JSONResponse(value)

    @endpoint
    async def set_replication(request: Request) -> Any:
        name = policy_topic(broker, topic_of(request))
        clusters = replication_clusters(policies, name.tenant, await json_body(request))
        policies.update_topic_policies(name, lambda p: p.__setitem__("replication_clusters", clusters))
        return None

    # -- lookup -------------------------------------------------------------------------------------------

    def lookup_data(request: Request) -> dict[str, Any]:
        """The broker's URLs for the advertised listener the request names (Pulsar's
        ``listenerName`` parameter or ``X-Pulsar-ListenerName`` header), else the internal one."""
        wanted = (request.query_params.get("listenerName")
                  or request.headers.get("X-Pulsar-ListenerName") or "")
        urls = broker.pulsar_listener(wanted)
        if urls is None:
            raise RestError(404, f"the broker has no advertised listener named {wanted!r}")
        url = urls.get("pulsar", "")
        return {"brokerUrl": url, "brokerUrlTls": urls.get("pulsar+ssl", ""),
                "httpUrl": broker.web_service_url, "httpUrlTls": "", "nativeUrl": url}

    @endpoint
    async def lookup(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        return lookup_data(request)

    @endpoint
    async def lookup_partitions(request: Request) -> Any:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        url = lookup_data(request)["brokerUrl"]
        return {str(t): url for t in partition_targets(broker, name)}

    out: list[Route] = []
    for domain in DOMAINS:
        base = f"/admin/v2/{domain}/{{tenant}}/{{namespace}}"
        out += topic_routes(broker, base)
        out += [
            Route(base, list_topics, methods=["GET"]),
            Route(f"{base}/partitioned", list_partitioned, methods=["GET"]),
            Route(f"{base}/{{topic}}/partitions", create_partitioned, methods=["PUT"]),
            Route(f"{base}/{{topic}}/partitions", update_partitions, methods=["POST"]),
            Route(f"{base}/{{topic}}/partitions", partition_metadata, methods=["GET"]),
            Route(f"{base}/{{topic}}/partitions", delete_partitioned, methods=["DELETE"]),
            Route(f"{base}/{{topic}}/createMissedPartitions", create_missed_partitions, methods=["POST"]),
            Route(f"{base}/{{topic}}/properties", get_properties, methods=["GET"]),
            Route(f"{base}/{{topic}}/properties", update_properties, methods=["PUT"]),
            Route(f"{base}/{{topic}}/properties", remove_properties, methods=["DELETE"]),
            Route(f"{base}/{{topic}}/stats", stats, methods=["GET"]),
            Route(f"{base}/{{topic}}/partitioned-stats", partitioned_stats, methods=["GET"]),
            Route(f"{base}/{{topic}}/internalStats", stats_internal, methods=["GET"]),
            Route(f"{base}/{{topic}}/partitioned-internalStats", partitioned_stats_internal, methods=["GET"]),
            Route(f"{base}/{{topic}}/lastMessageId", last_message_id, methods=["GET"]),
            Route(f"{base}/{{topic}}/messageid/{{timestamp}}", message_id_by_time, methods=["GET"]),
            Route(f"{base}/{{topic}}/backlogSize", backlog_size, methods=["PUT"]),
            Route(f"{base}/{{topic}}/terminate", terminate, methods=["POST"]),
            Route(f"{base}/{{topic}}/terminate/partitions", terminate_partitioned, methods=["POST"]),
            Route(f"{base}/{{topic}}/unload", unload, methods=["PUT"]),
            Route(f"{base}/{{topic}}/compaction", compact, methods=["PUT"]),
            Route(f"{base}/{{topic}}/compaction", compaction_status, methods=["GET"]),
            Route(f"{base}/{{topic}}/trim", trim, methods=["POST"]),
            Route(f"{base}/{{topic}}/backlogQuotaMap", get_backlog_quotas, methods=["GET"]),
            Route(f"{base}/{{topic}}/backlogQuota", set_backlog_quota, methods=["POST"]),
            Route(f"{base}/{{topic}}/backlogQuota", remove_backlog_quota, methods=["DELETE"]),
            Route(f"{base}/{{topic}}/replication", get_replication, methods=["GET"]),
            Route(f"{base}/{{topic}}/replication", set_replication, methods=["POST"]),
        ]
        for spec in POLICY_SPECS + TOPIC_POLICY_SPECS:
            out += policy_routes(base, spec)
        out += [
            Route(f"{base}/{{topic}}", create_topic, methods=["PUT"]),
            Route(f"{base}/{{topic}}", delete_topic, methods=["DELETE"]),
        ]
        out += [
            Route(f"/lookup/v2/topic/{domain}/{{tenant}}/{{namespace}}/{{topic}}", lookup, methods=["GET"]),
            Route(f"/admin/v2/{domain}/{{tenant}}/{{namespace}}/{{topic}}/lookup/partitions",
                  lookup_partitions, methods=["GET"]),
        ]
    return out
