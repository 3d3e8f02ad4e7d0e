"""Cluster and topic administration: ApiVersions, Metadata, DescribeTopicPartitions,
FindCoordinator, CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords,
DescribeCluster, ElectLeaders, DescribeUserScramCredentials (the configs APIs are in
:mod:`handlers.kafka._configs`).

This broker is the only node Kafka clients see (node id ``kafkaNodeId``, 0): it leads
every partition and coordinates every group and transaction. Replication is the ledger's
(``managedLedgerDefault*`` quorums), so a topic's replication factor is reported as 1 and
a requested one is accepted as long as it is -1 or positive.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from core.autorecovery import bookies
from core.broker import PartitionCountError, TopicNotFoundError, TopicQuotaError
from core.naming import InvalidNameError, TopicName
from handlers.kafka import _access
from handlers.kafka._access import allowed, topic_error
from handlers.kafka._codec import Data, RequestReceived, api_versions_table, topic_uuid
from handlers.kafka._configs import (
    SOURCE_DYNAMIC_TOPIC,
    ConfigError,
    check_insync,
    config_entry,
    validate_all,
)
from handlers.kafka._errors import ErrorCode

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = [
    "handle_api_versions",
    "handle_metadata",
    "handle_describe_topic_partitions",
    "handle_find_coordinator",
    "handle_create_topics",
    "handle_delete_topics",
    "handle_create_partitions",
    "handle_delete_records",
    "handle_describe_cluster",
    "handle_elect_leaders",
    "handle_describe_user_scram_credentials",
    "handle_list_partition_reassignments",
    "handle_describe_log_dirs",
    "handle_acls",
]

# Kafka's ACL operation codes (AclOperation), and the operations each resource type has.
# With no authorizer, as here, Kafka answers a request for a resource's authorized
# operations with all of its type's operations, as a bit field of their codes.
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12


def _bits(*ops: int) -> int:
    return sum(1 << op for op in ops)


TOPIC_OPERATIONS = _bits(READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS,
                         ALTER_CONFIGS)
GROUP_OPERATIONS = _bits(READ, DESCRIBE, DELETE)
CLUSTER_OPERATIONS = _bits(CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
                           IDEMPOTENT_WRITE, ALTER, DESCRIBE)
NOT_ASKED = -2147483648
"""The authorized operations of a resource whose client did not ask for them."""


_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
"""What a client software name or version (ApiVersions v3+, KIP-511) must match."""


METADATA_VERSION = "metadata.version"
METADATA_VERSION_LEVEL = 21
"""The ``metadata.version`` (KIP-778) reported finalized: 3.9-IV0, Kafka 3.9's, the last
3.x release."""
METADATA_VERSION_MIN = 1
"""The lowest ``metadata.version`` a Kafka 3.x broker supports: 3.0-IV1, KRaft's first."""
FEATURES_EPOCH = 0
"""The epoch of the finalized features, which never change here."""


def handle_api_versions(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """ApiVersions: the served table, and from v3 the features (KIP-584) as a Kafka 3.9
    broker in KRaft mode reports them: ``metadata.version`` supported and finalized, at
    3.9-IV0. No other feature is reported, at any level: ``transaction.version`` and
    ``group.version`` 1 or more would tell clients that the protocols of KIP-890 part 2
    and KIP-848, which Magnetar does not serve, are on."""
    if req.api_version >= 3 and not all(
            _SOFTWARE.fullmatch(v or "") for v in (req.body.client_software_name,
                                                   req.body.client_software_version)):
        # As Kafka: INVALID_REQUEST, with no API listed.
        return Data(error_code=ErrorCode.INVALID_REQUEST, api_keys=[], throttle_time_ms=0)
    return Data(error_code=0, api_keys=api_versions_table(), throttle_time_ms=0,
                supported_features=[Data(name=METADATA_VERSION, min_version=METADATA_VERSION_MIN,
                                         max_version=METADATA_VERSION_LEVEL)],
                finalized_features_epoch=FEATURES_EPOCH,
                finalized_features=[Data(name=METADATA_VERSION,
                                         max_version_level=METADATA_VERSION_LEVEL,
                                         min_version_level=METADATA_VERSION_LEVEL)],
                zk_migration_ready=False)


def _partitions(h: KafkaProtocolHandler, indexes: range) -> list[Data]:
    """The partitions of a topic this node leads alone: led here, one replica, in sync
    (no eligible leader replicas, KIP-966, beyond it)."""
    node = h.node_id
    return [Data(error_code=0, partition_index=i, leader_id=node, leader_epoch=0,
                 replica_nodes=[node], isr_nodes=[node], eligible_leader_replicas=[],
                 last_known_elr=[], offline_replicas=[]) for i in indexes]


async def handle_metadata(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    b = req.body
    auto = (b.allow_auto_topic_creation if req.api_version >= 4 else True) and h.auto_create_on_metadata
    topics = []
    if b.topics is None:
        for name in h.topics.all_topics():
            n = h.topics.partition_count(name)
            if n and h.broker.auth.allows(name, req.principal, *_access.DESCRIBE):
                kname = h.topics.kafka_name(name)
                topics.append(Data(error_code=0, name=kname, topic_id=topic_uuid(str(name)),
                                   is_internal=False, partitions=_partitions(h, range(n))))
    else:
        for t in b.topics:
            kname = t.name
            if kname is None:
                topics.append(Data(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=None,
                                   topic_id=t.topic_id, is_internal=False, partitions=[]))
                continue
            if not allowed(h, req, kname, _access.DESCRIBE):
                topics.append(Data(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=kname,
                                   is_internal=False, partitions=[]))
                continue
            try:
                name, n = await h.topics.ensure(kname, create=auto)
            except Exception as exc:
                topics.append(Data(error_code=topic_error(exc), name=kname, is_internal=False,
                                   partitions=[]))
                continue
            if n == 0:
                topics.append(Data(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=kname,
                                   is_internal=False, partitions=[]))
                continue
            topics.append(Data(error_code=0, name=kname, topic_id=topic_uuid(str(name)),
                               is_internal=False, partitions=_partitions(h, range(n))))
    if req.api_version >= 8 and b.include_topic_authorized_operations:
        for t in topics:
            if t.name is not None:
                t.topic_authorized_operations = TOPIC_OPERATIONS
    cluster_ops = NOT_ASKED
    if 8 <= req.api_version <= 10 and b.include_cluster_authorized_operations:
        cluster_ops = CLUSTER_OPERATIONS
    return Data(throttle_time_ms=0, brokers=[h.broker_entry()], cluster_id=h.cluster_id,
                controller_id=h.node_id, topics=topics, cluster_authorized_operations=cluster_ops)


def handle_describe_topic_partitions(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """DescribeTopicPartitions (KIP-966), as a Kafka broker answers it: the topics named,
    or every topic when none is, in name order from the cursor's topic on (starting at the
    cursor's partition), with at most ``response_partition_limit`` partitions (and no more
    than ``max.request.partition.size.limit``) in all. Where the limit cuts a topic short,
    or falls at the end of one with more topics to come, ``next_cursor`` says where to go
    on. A topic named that does not exist is listed with its error; when every topic is
    asked for, only existing ones are. Named topics must include the cursor's, else the
    request is INVALID_REQUEST. Topics are never created here."""
    b = req.body
    cursor = b.cursor
    first = cursor.topic_name if cursor is not None else ""
    everything = not b.topics
    if everything:
        asked = {h.topics.kafka_name(name) for name in h.topics.all_topics()}
    else:
        asked = {t.name for t in b.topics}
    names = sorted(n for n in asked if n >= first)
    if not everything and cursor is not None and cursor.topic_name not in names:
        return Data(throttle_time_ms=0, next_cursor=None, topics=[
            Data(error_code=ErrorCode.INVALID_REQUEST, name=t.name, is_internal=False,
                 partitions=[]) for t in b.topics])
    remaining = min(h.max_request_partitions, b.response_partition_limit)
    topics: list[Data] = []
    next_cursor = None
    for kname in names:
        if remaining <= 0:
            if remaining == 0:
                next_cursor = Data(topic_name=kname, partition_index=0)
            break
        try:
            name = h.topics.topic_name(kname)
            _access.check(h, req, kname, _access.DESCRIBE)
            n = h.topics.partition_count(name)
            error = 0 if n else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        except Exception as exc:
            error = topic_error(exc)
        if error:
            if not everything:
                topics.append(Data(error_code=error, name=kname, is_internal=False, partitions=[],
                                   topic_authorized_operations=TOPIC_OPERATIONS))
            continue
        start = cursor.partition_index if cursor is not None and kname == cursor.topic_name else 0
        upper = min(n, start + remaining)
        partitions = _partitions(h, range(max(start, 0), upper))
        topics.append(Data(error_code=0, name=kname, topic_id=topic_uuid(str(name)),
                           is_internal=False, partitions=partitions,
                           topic_authorized_operations=TOPIC_OPERATIONS))
        if upper < n:
            next_cursor = Data(topic_name=kname, partition_index=upper)
            break
        remaining -= len(partitions)
    return Data(throttle_time_ms=0, topics=topics, next_cursor=next_cursor)


def handle_find_coordinator(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    b = req.body
    keys = b.coordinator_keys if req.api_version >= 4 else [b.key]
    coordinators = []
    for key in keys:
        err = 0 if b.key_type in (0, 1) else ErrorCode.INVALID_REQUEST
        coordinators.append(Data(key=key, node_id=h.node_id, host=h.advertised_host,
                                 port=h.advertised_port, error_code=err, error_message=None))
    first = coordinators[0] if coordinators else Data(error_code=ErrorCode.INVALID_REQUEST)
    return Data(throttle_time_ms=0, error_code=first.error_code, error_message=None,
                node_id=h.node_id, host=h.advertised_host, port=h.advertised_port,
                coordinators=coordinators)


async def handle_create_topics(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    b = req.body
    out = []
    for t in b.topics:
        res = Data(name=t.name, topic_id=b"\x00" * 16, error_code=0, error_message=None,
                   num_partitions=-1, replication_factor=-1, configs=[])
        out.append(res)
        try:
            name = h.topics.topic_name(t.name)
            _access.check(h, req, t.name, _access.MANAGE)
            h.broker.namespace_policies(name.namespace_name)
        except Exception as exc:
            res.error_code = topic_error(exc)
            res.error_message = str(exc)
            continue
        n = t.num_partitions
        if n == -1:
            n = h.topics.default_partitions(name)
        if t.assignments:
            refused = _manual_assignment_error(h, t)
            if refused is not None:
                res.error_code, res.error_message = refused
                continue
            n = len(t.assignments)
        # Kafka's controller (ReplicationControlManager.createTopic) checks the replication
        # factor first
        if t.replication_factor == 0 or t.replication_factor < -1:
            res.error_code = ErrorCode.INVALID_REPLICATION_FACTOR
            res.error_message = "Replication factor must be larger than 0, or -1 to use the default value."
            continue
        if n < 1:
            res.error_code = ErrorCode.INVALID_PARTITIONS
            res.error_message = "Number of partitions was set to an invalid non-positive value."
            continue
        # A Kafka replica is a copy of the data: here, a bookie's. More copies than
        # writable bookies cannot be kept, as Kafka refuses more than its brokers.
        writable = len(bookies(h.broker.metadata)["readWrite"])
        if t.replication_factor > writable:
            res.error_code = ErrorCode.INVALID_REPLICATION_FACTOR
            res.error_message = (f"Replication factor: {t.replication_factor} larger than "
                                 f"available bookies: {writable}.")
            continue
        if h.topics.partition_count(name):
            res.error_code = ErrorCode.TOPIC_ALREADY_EXISTS
            res.error_message = f"Topic '{t.name}' already exists."
            continue
        copies = t.replication_factor if t.replication_factor > 0 else \
            int(h.configs.storage_settings(name)["write_quorum"])
        try:
            nulls = [c.name for c in t.configs if c.value is None]
            if nulls:
                # Kafka's controller names them all (ReplicationControlManager.computeConfigChanges)
                raise ConfigError(f"Null value not supported for topic configs: {','.join(nulls)}")
            configs = validate_all(t.configs)
            insync = dict(configs).get("min.insync.replicas")
            if insync is not None:
                check_insync(int(insync), copies)
        except ConfigError as exc:
            res.error_code = exc.code
            res.error_message = str(exc)
            continue
        refused = _limits_refusal(h, name, n, n)
        if refused is not None:
            res.error_code, res.error_message = refused
            continue
        if not b.validate_only:
            try:
                h.topics.create(name, n)
            except Exception as exc:
                res.error_code = ErrorCode.TOPIC_ALREADY_EXISTS
                res.error_message = str(exc)
                continue
            if t.replication_factor > 0:
                h.configs.keep_copies(name, t.replication_factor)
            if configs:
                await h.configs.store(name, configs)
        res.topic_id = topic_uuid(str(name))
        res.num_partitions = n
        res.replication_factor = copies
        if b.validate_only:
            given = dict(configs)
            res.configs = [config_entry(k, given.get(k, v), SOURCE_DYNAMIC_TOPIC if k in given else s)
                           for k, v, s in h.configs.values(name)]
        else:
            res.configs = [config_entry(k, v, s) for k, v, s in h.configs.values(name)]
    return Data(throttle_time_ms=0, topics=out)


def _replicas_error(h: KafkaProtocolHandler, replicas: list[int], factor: int | None) -> str | None:
    """Why one partition's manual replica list is refused (Kafka's
    ``ReplicationControlManager.validateManualPartitionAssignment``), or None: it names
    each broker once, every one of them registered (this node is the only one), and has
    ``factor`` replicas when given."""
    if not replicas:
        return "The manual partition assignment includes an empty replica list."
    previous = None
    for broker in sorted(replicas):
        if broker != h.node_id:
            return (f"The manual partition assignment includes broker {broker}, but no such "
                    "broker is registered.")
        if broker == previous:
            return f"The manual partition assignment includes the broker {broker} more than once."
        previous = broker
    if factor is not None and len(replicas) != factor:
        return (f"The manual partition assignment includes a partition with {len(replicas)} "
                "replica(s), but this is not consistent with previous partitions, which have "
                f"{factor} replica(s).")
    return None


def _manual_assignment_error(h: KafkaProtocolHandler, t: Data) -> tuple[int, str] | None:
    """The error of a CreateTopics topic whose partitions are assigned by hand, as Kafka's
    controller (``ReplicationControlManager.createTopic``) answers it, or None: partition
    count and replication factor must then be -1, each partition assigned once, to
    registered brokers, all with as many replicas, numbered from 0 without a gap."""
    if t.replication_factor != -1:
        return ErrorCode.INVALID_REQUEST, ("A manual partition assignment was specified, but "
                                           "replication factor was not set to -1.")
    if t.num_partitions != -1:
        return ErrorCode.INVALID_REQUEST, ("A manual partition assignment was specified, but "
                                           "numPartitions was not set to -1.")
    seen: set[int] = set()
    factor: int | None = None
    for a in t.assignments:
        if a.partition_index in seen:
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, (
                f"Found multiple manual partition assignments for partition {a.partition_index}")
        refused = _replicas_error(h, list(a.broker_ids), factor)
        if refused is not None:
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, refused
        factor = len(a.broker_ids)
        seen.add(a.partition_index)
    if seen != set(range(len(seen))):
        return ErrorCode.INVALID_REPLICA_ASSIGNMENT, ("partitions should be a consecutive "
                                                      "0-based integer sequence")
    return None


async def handle_delete_topics(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    out = []
    for kname in req.body.topic_names:
        res = Data(name=kname, error_code=0, error_message=None)
        out.append(res)
        try:
            name = h.topics.topic_name(kname)
            _access.check(h, req, kname, _access.MANAGE)
            n = h.topics.partition_count(name)
            if n == 0:
                res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            partitioned = h.broker.policies.partitions(name) > 0
            h.topics.forget(kname)
            for i in range(n):
                try:
                    await h.broker.delete_topic(name.partition(i) if partitioned else name)
                except TopicNotFoundError:
                    pass  # a partition never written to has no storage yet
            if partitioned:
                h.broker.delete_partitioned_metadata(name)
            else:
                h.broker.policies.delete_topic_policies(name)
            h.groups.forget_topic(kname)
        except Exception as exc:
            res.error_code = topic_error(exc)
            res.error_message = str(exc)
    return Data(throttle_time_ms=0, responses=out)


def _limits_refusal(h: KafkaProtocolHandler, name: TopicName, partitions: int,
                    new_topics: int) -> tuple[int, str] | None:
    """The error a topic of ``partitions`` (``new_topics`` of them new) gets from the
    broker's limits on partitions per topic and topics per namespace, or None."""
    try:
        h.topics.check_limits(name, partitions, new_topics)
    except PartitionCountError as exc:
        return ErrorCode.INVALID_PARTITIONS, str(exc)
    except TopicQuotaError as exc:
        return ErrorCode.POLICY_VIOLATION, str(exc)
    return None


async def handle_create_partitions(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    b = req.body
    out = []
    for t in b.topics:
        res = Data(name=t.name, error_code=0, error_message=None)
        out.append(res)
        try:
            name = h.topics.topic_name(t.name)
        except InvalidNameError as exc:
            res.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
            res.error_message = str(exc)
            continue
        if not allowed(h, req, t.name, _access.MANAGE):
            res.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            res.error_message = f"Not authorized to access topic {t.name}"
            continue
        current = h.broker.policies.partitions(name)
        if current == 0:
            res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            res.error_message = f"Topic '{t.name}' does not exist (or is not partitioned)."
            continue
        # Kafka's controller (ReplicationControlManager.createPartitions): the count must
        # grow, by as many partitions as assignments are given, each of one replica (the
        # replication factor the topic's partitions report) on a registered broker.
        if t.count == current:
            res.error_code = ErrorCode.INVALID_PARTITIONS
            res.error_message = f"Topic already has {current} partition(s)."
            continue
        if t.count < current:
            res.error_code = ErrorCode.INVALID_PARTITIONS
            res.error_message = (f"The topic {t.name} currently has {current} partition(s); "
                                 f"{t.count} would not be an increase.")
            continue
        if t.assignments is not None:
            added = t.count - current
            refused = (f"Attempted to add {added} additional partition(s), but only "
                       f"{len(t.assignments)} assignment(s) were specified."
                       if len(t.assignments) != added else None)
            for a in t.assignments:
                refused = refused or _replicas_error(h, list(a.broker_ids), 1)
            if refused is not None:
                res.error_code = ErrorCode.INVALID_REPLICA_ASSIGNMENT
                res.error_message = refused
                continue
        over = _limits_refusal(h, name, t.count, t.count - current)
        if over is not None:
            res.error_code, res.error_message = over
            continue
        if not b.validate_only:
            h.broker.policies.update_partitions(name, t.count)  # the topic's properties stay
    return Data(throttle_time_ms=0, results=out)


async def handle_delete_records(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    out = []
    for t in req.body.topics:
        parts = []
        for p in t.partitions:
            res = Data(partition_index=p.partition_index, low_watermark=-1, error_code=0)
            parts.append(res)
            try:
                _access.check(h, req, t.name, _access.MANAGE)
                plog = await h.topics.log(t.name, p.partition_index, create=False)
                hw = plog.high_watermark()
                offset = hw if p.offset == -1 else p.offset
                if offset < 0 or offset > hw:
                    res.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                    continue
                start = plog.log_start_offset(fresh=True)
                if offset > start:
                    h.broker.metadata.put(h.topics.log_start_path(plog.topic.name),
                                          json.dumps(offset).encode())
                    await h.groups.follow_log_start(t.name, p.partition_index, offset)
                    await h.topics.trim_deleted(plog)
                res.low_watermark = plog.log_start_offset(fresh=True)
            except Exception as exc:
                res.error_code = topic_error(exc)
        out.append(Data(name=t.name, partitions=parts))
    return Data(throttle_time_ms=0, topics=out)


def handle_describe_cluster(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    e = h.broker_entry()
    ops = CLUSTER_OPERATIONS if req.body.include_cluster_authorized_operations else NOT_ASKED
    return Data(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1,
                cluster_id=h.cluster_id, controller_id=h.node_id, cluster_authorized_operations=ops,
                brokers=[Data(broker_id=e.node_id, host=e.host, port=e.port, rack=None)])


ELECTION_PREFERRED, ELECTION_UNCLEAN = 0, 1


def handle_elect_leaders(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """ElectLeaders (KIP-460) as Kafka's controller answers it
    (``ReplicationControlManager.electLeaders``): a partition's one replica, this node, is
    its preferred leader and leads it, so no election is needed (ELECTION_NOT_NEEDED) for
    either type; a topic or partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION.
    Asked for every partition (null), Kafka lists each topic but leaves out the
    partitions needing no election, so here every topic has none; an unknown election type
    is INVALID_REQUEST for the whole request."""
    b = req.body
    if b.election_type not in (ELECTION_PREFERRED, ELECTION_UNCLEAN):
        return Data(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST,
                    replica_election_results=[])
    if b.topic_partitions is None:
        return Data(throttle_time_ms=0, error_code=0, replica_election_results=[
            Data(topic=h.topics.kafka_name(name), partition_result=[])
            for name in h.topics.all_topics()])
    out = []
    for t in b.topic_partitions:
        try:
            count = h.topics.partition_count(h.topics.topic_name(t.topic))
        except Exception:
            count = 0
        results = []
        for p in t.partition_id:
            if not count:
                code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such topic as {t.topic}"
            elif not 0 <= p < count:
                code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such partition as {t.topic}-{p}"
            else:
                code, message = ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."
            results.append(Data(partition_id=p, error_code=code, error_message=message))
        out.append(Data(topic=t.topic, partition_result=results))
    return Data(throttle_time_ms=0, error_code=0, replica_election_results=out)


def handle_describe_user_scram_credentials(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """DescribeUserScramCredentials (KIP-554) as a Kafka broker with no SCRAM credentials
    answers it (``ScramImage.describe``): all users (null or none named) is no result; a
    user named is RESOURCE_NOT_FOUND, one named twice DUPLICATE_RESOURCE. Magnetar's Kafka listener does not authenticate with SASL, so no user has
    a credential; AlterUserScramCredentials is not served."""
    named: dict[str, bool] = {}
    for u in req.body.users or []:
        named[u.name] = u.name in named
    results = [
        Data(user=user, error_code=ErrorCode.DUPLICATE_RESOURCE, credential_infos=[],
             error_message=f"Cannot describe SCRAM credentials for the same user twice in a "
                           f"single request: {user}") if twice else
        Data(user=user, error_code=ErrorCode.RESOURCE_NOT_FOUND, credential_infos=[],
             error_message=f"Attempt to describe a user credential that does not exist: {user}")
        for user, twice in named.items()]
    return Data(throttle_time_ms=0, error_code=0, error_message=None, results=results)


def handle_list_partition_reassignments(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """No reassignment is ever under way: a partition's one replica is its topic's, placed
    by Pulsar's bundles, and AlterPartitionReassignments is not served. Kafka answers such
    a cluster, for every topic or the ones named (those that do not exist left out), with
    no topics."""
    return Data(throttle_time_ms=0, error_code=0, error_message=None, topics=[])


async def handle_describe_log_dirs(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """One log directory, the broker's data directory, holding every partition: a
    partition's size is the bytes of its ledgers, its offset lag 0 (it is the only
    replica). As Kafka's, the partitions asked about (all when topics is null) that do
    not exist are left out; the directory's total and usable bytes are unknown (-1), its
    ledgers being on the bookies."""
    auth = h.broker.auth
    if auth.authorization_enabled and not auth.is_super_user(req.principal):
        # Kafka: DESCRIBE on the cluster, which a super-user holds here
        return Data(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results=[])
    wanted: list[tuple[str, list[int]]] = []
    if req.body.topics is None:
        for name in h.topics.all_topics():
            wanted.append((h.topics.kafka_name(name), list(range(h.topics.partition_count(name)))))
    else:
        wanted = [(t.topic, list(t.partitions)) for t in req.body.topics]
    topics = []
    for kname, indexes in wanted:
        parts = []
        for index in indexes:
            try:
                plog = await h.topics.log(kname, index, create=False)
            except Exception:
                continue
            size = sum(int(info.get("size", 0)) for info in plog.topic.ml.ledgers())
            parts.append(Data(partition_index=index, partition_size=size, offset_lag=0,
                              is_future_key=False))
        if parts:
            topics.append(Data(name=kname, partitions=parts))
    return Data(throttle_time_ms=0, error_code=0, results=[Data(
        error_code=0, log_dir=_log_dir(h), topics=topics, total_bytes=-1, usable_bytes=-1)])


def _log_dir(h: KafkaProtocolHandler) -> str:
    return os.path.abspath(str(h.config.get("dataDirectory") or "data"))


def handle_acls(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """DescribeAcls, CreateAcls and DeleteAcls as a Kafka broker with no authorizer
    answers them: SECURITY_DISABLED, for the request (describe) or each creation or
    filter, with Kafka's messages."""
    if req.api_key == 29:
        return Data(throttle_time_ms=0, error_code=ErrorCode.SECURITY_DISABLED,
                    error_message="No Authorizer is configured on the broker", resources=[])
    refused = Data(error_code=ErrorCode.SECURITY_DISABLED,
                   error_message="No Authorizer is configured.")
    if req.api_key == 30:
        return Data(throttle_time_ms=0, results=[refused for _ in req.body.creations])
    return Data(throttle_time_ms=0, filter_results=[
        Data(error_code=refused.error_code, error_message=refused.error_message,
             matching_acls=[]) for _ in req.body.filters])
