"""Kafka topic configs as Magnetar topic policies.

A Kafka topic's configs (set by CreateTopics, AlterConfigs or IncrementalAlterConfigs)
are stored as the Magnetar topic's own policies, so the admin REST API shows them
(``/admin/v2/persistent/t/ns/x/retention``, ``.../maxMessageSize``, ``.../ledgerRollover``)
and the storage applies them, and DescribeConfigs reports them back:

====================== ============================================ =======================
Kafka config           Magnetar topic policy                        note
====================== ============================================ =======================
retention.ms           retention_policies.retentionTimeInMinutes    whole minutes (rounded
                       and retention_exact.retentionTimeInMillis    up) and as given; -1
                                                                    (or unset) no time limit
retention.bytes        retention_policies.retentionSizeInMB         whole MiB (rounded up)
                       and retention_exact.retentionSizeInBytes     and as given; -1 (or
                                                                    unset) no size limit
max.message.bytes      max_message_size (``maxMessageSize``)        largest record batch
min.insync.replicas    persistence.bookkeeperAckQuorum              bookies an entry is on
                                                                    before it is
                                                                    acknowledged; at most
                                                                    the write quorum
segment.ms             ledger_rollover.rolloverTimeInMillis         a ledger this old rolls
                       (``ledgerRollover``)                         over at its next write
segment.bytes          ledger_rollover.rolloverSizeInMB             whole MiB (rounded up):
                       (``ledgerRollover``)                         a ledger holding this
                                                                    much rolls over at its
                                                                    next write
message.timestamp.type message_timestamp_type                       ``CreateTime`` or
                       (``messageTimestampType``)                   ``LogAppendTime``
cleanup.policy         (none)                                       only ``delete``
====================== ============================================ =======================

Retention in Magnetar is Pulsar's: it bounds how long (and how much) data that every
subscription has consumed is kept. Kafka consumer groups hold no subscription, so a topic
a Kafka client creates gets Kafka's default as its own ``retention.ms``
(``log.retention.hours``, a week), and a config reset or deleted goes back to that, not to
the namespace's retention. DescribeConfigs shows a retention equal to that default (and an
unlimited ``retention.bytes``) as the default, as Kafka shows a topic created without
retention configs.

The admin API's retention policy (``pulsar-admin topics get-retention``) has whole minutes
and MB, so a ``retention.ms`` or ``retention.bytes`` is stored twice: rounded up there, and
as given in the topic's ``retention_exact`` policy, which DescribeConfigs reports and the
storage enforces - the time at the storage's own resolution (milliseconds, from when a
ledger was sealed), the size by the broker's retention check
(``retentionCheckIntervalInSeconds``, Kafka's ``log.retention.check.interval.ms``), which
drops the oldest ledgers while the rest still hold ``retention.bytes``, as Kafka drops
segments. The exact value holds only while the retention policy still says what it
rounds up to: a retention set later through the admin API replaces it. The ledger being
written is not deleted by retention until it is sealed, which ``segment.ms`` bounds (Kafka
rolls an active segment past retention to delete it). ``cleanup.policy=compact`` is refused, since Magnetar
does not compact topics by itself. Any other name, and a value that is not valid for its
key, is INVALID_CONFIG with a message naming it, as Kafka answers.

A Kafka segment is a Magnetar ledger. ``segment.ms`` and ``segment.bytes`` are the topic's
own ``managedLedgerMaxLedgerRolloverTimeMinutes`` (in milliseconds here) and
``managedLedgerMaxSizePerLedgerMbytes``; unset, the broker's apply, and DescribeConfigs
reports those (not Kafka's week and GiB), as what the storage does. The size rule, like
Pulsar's, waits for ``managedLedgerMinLedgerRolloverTimeMinutes``: a younger ledger is not
rolled over for size, however full (the age rule has no such wait). A size past the largest
INT (2048 MiB) is reported as that INT. Changing either reopens the topic's loaded
partitions, as a retention change does, since the storage reads them when it opens.

With ``message.timestamp.type=LogAppendTime`` a fetched record batch carries the timestamp
type bit (attributes bit 3) and, as its max timestamp, the entry's broker publish time,
which Kafka consumers then take as every record's timestamp (the protocol guide, "Record
Batch"); the Produce response's ``log_append_time_ms`` is that time, and ListOffsets by
time searches by it. The producer's own times stay stored, so Pulsar consumers and a later
change back to ``CreateTime`` see them. A transactional batch is stored only when its
transaction commits, so its Produce response has no append time yet (-1).

A topic config the topic does not set takes its value from the broker, and DescribeConfigs
says where from as Kafka does (``ConfigHelper``): its source is that of its broker-level
synonym (:data:`BROKER_SYNONYMS`), which, asked for synonyms, it lists by Kafka's name
(``message.max.bytes`` for ``max.message.bytes``), first as STATIC_BROKER_CONFIG with the
broker's value when the Magnetar key behind it is in the broker's configuration, then as
DEFAULT_CONFIG with the default; a config set on the topic lists itself first, as
DYNAMIC_TOPIC_CONFIG. ``retention.ms`` and ``segment.ms`` list no broker synonym: Kafka lists
``log.retention.ms`` and ``log.roll.ms`` only when they are set, and drops the
``log.retention.hours`` and ``log.roll.hours`` that follow them; Magnetar takes neither key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.naming import TopicName
from core.policies import (
    LEDGER_ROLLOVER,
    RETENTION,
    RETENTION_EXACT,
    exact_retention,
    set_policy_field,
    set_retention_limit,
)
from handlers.kafka import _access
from handlers.kafka._access import topic_error
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode, ProtocolError

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = [
    "ConfigError",
    "TOPIC_CONFIGS",
    "known",
    "validate",
    "apply",
    "topic_values",
    "segment_values",
    "TIMESTAMP_TYPE",
    "LOG_APPEND_TIME",
    "TopicConfigs",
    "validate_all",
    "check_insync",
    "config_entry",
    "BROKER_SYNONYMS",
    "handle_alter_configs",
    "handle_incremental_alter_configs",
    "handle_describe_configs",
    "OP_SET",
    "OP_DELETE",
    "OP_APPEND",
    "OP_SUBTRACT",
]

OP_SET = 0
OP_DELETE = 1
OP_APPEND = 2
OP_SUBTRACT = 3

PERSISTENCE = "persistence"
ACK_QUORUM = "bookkeeperAckQuorum"
MAX_MESSAGE_SIZE = "max_message_size"
ROLLOVER_TIME = "rolloverTimeInMillis"
ROLLOVER_SIZE = "rolloverSizeInMB"
TIMESTAMP_TYPE = "message_timestamp_type"
LOG_APPEND_TIME = "LogAppendTime"
CREATE_TIME = "CreateTime"
MINUTE_MS = 60_000
MIB = 1024 * 1024
INT32_MAX = 0x7FFFFFFF
INT64_MAX = (1 << 63) - 1


class ConfigError(ProtocolError):
    """An unknown config name or an invalid value: INVALID_CONFIG."""

    def __init__(self, message: str):
        super().__init__(message, ErrorCode.INVALID_CONFIG)


@dataclass(frozen=True, slots=True)
class _Long:
    """A numeric config: its least allowed value and its largest (Kafka's INT or LONG:
    past it, a value does not parse as the type)."""

    minimum: int
    maximum: int = INT64_MAX

    def parse(self, name: str, value: str) -> str:
        kind = "INT" if self.maximum == INT32_MAX else "LONG"
        try:
            n = int(value.strip())
        except ValueError:
            n = None
        if n is None or n > self.maximum:
            raise ConfigError(f"Invalid value {value} for configuration {name}: "
                              f"Not a number of type {kind}")
        if n < self.minimum:
            raise ConfigError(f"Invalid value {value} for configuration {name}: "
                              f"Value must be at least {self.minimum}")
        return str(n)


@dataclass(frozen=True, slots=True)
class _OneOf:
    """A string config with a fixed set of values (Kafka's ``ValidString``)."""

    values: tuple[str, ...]

    def parse(self, name: str, value: str) -> str:
        if value.strip() not in self.values:
            raise ConfigError(f"Invalid value {value} for configuration {name}: "
                              f"String must be one of: {', '.join(self.values)}")
        return value.strip()


TOPIC_CONFIGS: dict[str, _Long | _OneOf | None] = {
    "retention.ms": _Long(-1),
    "retention.bytes": _Long(-1),
    "max.message.bytes": _Long(0, INT32_MAX),
    "min.insync.replicas": _Long(1, INT32_MAX),
    # Kafka's LegacyRecord.RECORD_OVERHEAD_V0 (Kafka 4 raised it to 1 MiB, which a ledger
    # rounded up to whole MiB holds anyway)
    "segment.bytes": _Long(14, INT32_MAX),
    "segment.ms": _Long(1),
    "message.timestamp.type": _OneOf((CREATE_TIME, LOG_APPEND_TIME)),
    "cleanup.policy": None,
}
"""The topic configs Magnetar applies; ``None`` marks the list-valued cleanup.policy."""


def known(name: str) -> _Long | _OneOf | None:
    """The kind of a config Magnetar applies (ConfigError for any other name)."""
    if name not in TOPIC_CONFIGS:
        raise ConfigError(f"Unknown topic config name: {name} (Magnetar applies "
                          f"{', '.join(sorted(TOPIC_CONFIGS))})")
    return TOPIC_CONFIGS[name]


def validate(name: str, value: str | None) -> str:
    """The canonical value of one config (ConfigError when unknown or invalid)."""
    kind = known(name)
    if value is None:
        raise ConfigError(f"Null value not supported for topic config: {name}")
    if kind is not None:
        return kind.parse(name, value)
    policies = [p.strip() for p in value.split(",") if p.strip()]
    if policies != ["delete"]:
        raise ConfigError(f"Invalid value {value} for configuration cleanup.policy: "
                          "Magnetar supports cleanup.policy=delete only (no log compaction)")
    return "delete"


def check_insync(insync: int, copies: int) -> None:
    """ConfigError when ``min.insync.replicas`` asks for more copies than the topic
    writes (its replication factor: the bookies each entry goes to)."""
    if insync > copies:
        raise ConfigError(f"Invalid value {insync} for configuration min.insync.replicas: "
                          f"more than the topic's replication factor ({copies})")


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def apply(policies: dict[str, Any], changes: Iterable[tuple[str, str | None]]) -> None:
    """Apply validated ``(name, value)`` changes to a topic's policies (mutating them); a
    value of None removes the topic's own setting."""
    for name, value in changes:
        if name == "max.message.bytes":
            if value is None:
                policies.pop(MAX_MESSAGE_SIZE, None)
            else:
                policies[MAX_MESSAGE_SIZE] = int(value)
        elif name in ("retention.ms", "retention.bytes"):
            _apply_retention(policies, name, value)
        elif name == "min.insync.replicas":
            set_policy_field(policies, PERSISTENCE, ACK_QUORUM, None if value is None else int(value))
        elif name == "segment.ms":
            set_policy_field(policies, LEDGER_ROLLOVER, ROLLOVER_TIME, None if value is None else int(value))
        elif name == "segment.bytes":
            set_policy_field(policies, LEDGER_ROLLOVER, ROLLOVER_SIZE,
                       None if value is None else _ceil_div(int(value), MIB))
        elif name == "message.timestamp.type":
            if value is None:
                policies.pop(TIMESTAMP_TYPE, None)
            else:
                policies[TIMESTAMP_TYPE] = value


def _apply_retention(policies: dict[str, Any], name: str, value: str | None) -> None:
    """Kafka limits retention by time and by size, each unlimited unless set; a Magnetar
    retention policy always has both halves. So the half a Kafka client has not set is
    unlimited (-1), and the one it set decides. Removing a half makes it unlimited again;
    when both are, the topic goes back to its namespace's retention. The value as given
    is kept beside it (:data:`RETENTION_EXACT`), which the retention policy shows rounded
    up to whole minutes and MB."""
    set_retention_limit(policies, "time" if name == "retention.ms" else "size",
                        None if value is None else int(value))
    if value is None and all(v == -1 for v in policies[RETENTION].values()):
        policies.pop(RETENTION, None)


def topic_values(topic_policies: dict[str, Any], effective: dict[str, Any],
                 default_minutes: int, default_mb: int, default_max_message: int
                 ) -> list[tuple[str, str, bool]]:
    """(name, value, set on the topic itself) of every config DescribeConfigs reports."""
    retention = effective.get(RETENTION) or {}
    own_retention = topic_policies.get(RETENTION) or {}
    minutes = int(retention.get("retentionTimeInMinutes", default_minutes))
    size_mb = int(retention.get("retentionSizeInMB", default_mb))
    exact_ms, exact_bytes = exact_retention(effective)
    max_message = topic_policies.get(MAX_MESSAGE_SIZE)
    return [
        ("cleanup.policy", "delete", False),
        ("max.message.bytes", str(max_message if max_message is not None else default_max_message),
         max_message is not None),
        ("retention.ms", str(exact_ms if exact_ms is not None else
                             -1 if minutes < 0 else minutes * MINUTE_MS),
         "retentionTimeInMinutes" in own_retention),
        ("retention.bytes", str(exact_bytes if exact_bytes is not None else
                                -1 if size_mb < 0 else size_mb * MIB),
         "retentionSizeInMB" in own_retention),
    ]


def segment_values(settings: dict[str, Any], own_rollover: dict[str, Any]
                   ) -> list[tuple[str, str, int]]:
    """``segment.bytes`` and ``segment.ms`` as the storage ``settings`` (the managed ledger
    config the topic opens with) have them; their source is the topic when its own
    ``ledger_rollover`` policy sets them. Past the largest INT a size shows as that INT, and
    a broker that rolls no ledger over for age as the largest LONG."""
    size = min(int(settings["max_ledger_size_mb"]) * MIB, INT32_MAX)
    age = int(settings["max_rollover_time_ms"])
    return [
        ("segment.bytes", str(size),
         SOURCE_DYNAMIC_TOPIC if ROLLOVER_SIZE in own_rollover else SOURCE_DEFAULT),
        ("segment.ms", str(age if age > 0 else INT64_MAX),
         SOURCE_DYNAMIC_TOPIC if ROLLOVER_TIME in own_rollover else SOURCE_DEFAULT),
    ]


# --------------------------------------------------------------------------- the APIs

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_LIST = 1, 2, 3, 5, 7
CONFIG_TYPES = {
    "cleanup.policy": TYPE_LIST, "compression.type": TYPE_STRING,
    "max.message.bytes": TYPE_INT, "message.timestamp.type": TYPE_STRING,
    "min.insync.replicas": TYPE_INT, "retention.bytes": TYPE_LONG, "retention.ms": TYPE_LONG,
    "segment.bytes": TYPE_INT, "segment.ms": TYPE_LONG,
    "auto.create.topics.enable": TYPE_BOOLEAN, "broker.id": TYPE_INT,
    "default.replication.factor": TYPE_INT, "max.incremental.fetch.session.cache.slots": TYPE_INT,
    "message.max.bytes": TYPE_INT, "num.partitions": TYPE_INT,
}
"""Each config's type as Kafka's ConfigDef declares it (DescribeConfigs v3+ ``config_type``)."""


@dataclass(frozen=True, slots=True)
class _BrokerSynonym:
    """The broker config a topic config falls back to: Kafka's name for it, the Magnetar
    key (if any) that gives its value (times ``scale``, at most the largest INT when
    scaled), and its default: that key's, else Kafka's (which Magnetar applies)."""

    name: str
    key: str | None
    default: int | str
    scale: int = 1

    def value(self, raw: Any) -> str:
        if self.scale == 1:
            return str(raw)
        return str(min(int(raw) * self.scale, INT32_MAX))


BROKER_SYNONYMS: dict[str, _BrokerSynonym] = {
    "cleanup.policy": _BrokerSynonym("log.cleanup.policy", None, "delete"),
    "compression.type": _BrokerSynonym("compression.type", None, "producer"),
    "max.message.bytes": _BrokerSynonym("message.max.bytes", "maxMessageSize", 5242880),
    "message.timestamp.type": _BrokerSynonym("log.message.timestamp.type", None, CREATE_TIME),
    "min.insync.replicas": _BrokerSynonym("min.insync.replicas", "managedLedgerDefaultAckQuorum", 1),
    "retention.bytes": _BrokerSynonym("log.retention.bytes", None, -1),
    "segment.bytes": _BrokerSynonym("log.segment.bytes", "managedLedgerMaxSizePerLedgerMbytes",
                                    2048, MIB),
}
"""Each topic config's broker-level synonym (Kafka's ``ServerTopicConfigSynonyms``), where
Kafka lists one (see the module docs)."""

STORAGE_POLICIES = (RETENTION, RETENTION_EXACT, PERSISTENCE, LEDGER_ROLLOVER)
"""The policies the storage reads when a topic opens: a change reopens its partitions."""


class TopicConfigs:
    """Reads and writes one handler's topic configs through the broker's policies."""

    def __init__(self, h: KafkaProtocolHandler):
        self.h = h

    def _namespace_policies(self, name: TopicName) -> dict[str, Any]:
        return dict(self.h.broker.namespace_policies(name.namespace_name))

    def values(self, name: TopicName) -> list[tuple[str, str, int]]:
        """(name, value, config source) of every topic config DescribeConfigs reports."""
        policies = self.h.broker.policies
        ns = self._namespace_policies(name)
        cfg = self.h.config
        found = topic_values(policies.topic_policies(name), policies.effective(name, ns),
                             int(cfg.get("defaultRetentionTimeInMinutes")),
                             int(cfg.get("defaultRetentionSizeInMB")), self.h.max_message_size)
        # A topic a Kafka client created holds Kafka's default retention as its own policy
        # (see ``store``); a retention equal to that default shows as the default, as it
        # does on a Kafka topic created without retention configs.
        kafka_default = self.h.topics.retention_ms
        defaults = {"retention.ms": str(-1 if kafka_default is None else kafka_default),
                    "retention.bytes": "-1"}
        out = [(k, v, SOURCE_DYNAMIC_TOPIC if own and defaults.get(k) != v else SOURCE_DEFAULT)
               for k, v, own in found]
        out.append(("compression.type", "producer", SOURCE_DEFAULT))
        own = policies.topic_policies(name)
        timestamps = own.get(TIMESTAMP_TYPE)
        out.append(("message.timestamp.type", timestamps or CREATE_TIME,
                    SOURCE_DYNAMIC_TOPIC if timestamps else SOURCE_DEFAULT))
        settings = self.storage_settings(name)
        out += segment_values(settings, own.get(LEDGER_ROLLOVER) or {})
        out.append(("min.insync.replicas", str(settings["ack_quorum"]),
                    SOURCE_DYNAMIC_TOPIC if ACK_QUORUM in (own.get(PERSISTENCE) or {})
                    else SOURCE_DEFAULT))
        # What the topic does not set itself comes from its broker-level synonym.
        return sorted((k, v, s if s == SOURCE_DYNAMIC_TOPIC else self.inherited_source(k))
                      for k, v, s in out)

    def broker_synonyms(self, name: str) -> list[tuple[str, str, int]]:
        """(name, value, source) of the broker configs the topic config ``name`` falls
        back to, highest first, as DescribeConfigs lists its synonyms."""
        synonym = BROKER_SYNONYMS.get(name)
        if synonym is None:
            return []
        out = []
        cfg = self.h.config
        if synonym.key is not None and cfg.is_set(synonym.key):
            out.append((synonym.name, synonym.value(cfg.get(synonym.key)), SOURCE_STATIC_BROKER))
        out.append((synonym.name, synonym.value(synonym.default), SOURCE_DEFAULT))
        return out

    def inherited_source(self, name: str) -> int:
        """The source of the topic config ``name`` when the topic does not set it: its
        broker synonym's (Kafka's ``createTopicConfigEntry``)."""
        synonyms = self.broker_synonyms(name)
        return synonyms[0][2] if synonyms else SOURCE_DEFAULT

    def storage_settings(self, name: TopicName, own: dict[str, Any] | None = None) -> dict[str, Any]:
        """The storage settings (quorums among them) the topic's policies give it: those
        stored, or the topic policies ``own``."""
        broker = self.h.broker
        return broker.ml_config(broker.policies.effective(name, self._namespace_policies(name), own))

    def keep_copies(self, name: TopicName, copies: int) -> None:
        """Store a topic's replication factor as its persistence policy: every entry
        written to ``copies`` bookies (ensemble and write quorum), acknowledged once the
        broker's ack quorum of them (at most ``copies``) has it, as Kafka's acks=all waits
        for min.insync.replicas."""
        ack = min(copies, int(self.h.config.get("managedLedgerDefaultAckQuorum")))

        def change(p: dict[str, Any]) -> None:
            p[PERSISTENCE] = {**(p.get(PERSISTENCE) or {}), "bookkeeperEnsemble": copies,
                              "bookkeeperWriteQuorum": copies, ACK_QUORUM: ack}

        self.h.broker.policies.update_topic_policies(name, change)

    async def store(self, name: TopicName, given: Sequence[tuple[str, str | None]], *,
                    replace: bool = False) -> None:
        """Apply validated changes to the topic's policies (``replace``: AlterConfigs,
        every config not given goes back to its default). Loaded partitions take them at
        once; when the retention, the persistence (quorums) or the ledger rollover changed
        they are reopened, since the storage reads those when it opens."""
        policies = self.h.broker.policies
        changes = list(given)
        if replace:
            named = {k for k, _ in changes}
            changes += [(k, None) for k in TOPIC_CONFIGS if k not in named]
        default_ms = self.h.topics.retention_ms
        if default_ms is not None:
            # back to Kafka's default retention (log.retention.hours), which a topic created
            # by a Kafka client holds as its own, not to the namespace's
            changes = [(k, str(default_ms) if k == "retention.ms" and v is None else v)
                       for k, v in changes]
        if any(k == "min.insync.replicas" for k, _ in changes):
            # Kafka's acks=all waits for min.insync.replicas copies; here an entry is
            # acknowledged once its ack quorum of bookies has it, which cannot exceed the
            # bookies it is written to
            trial = dict(policies.topic_policies(name))
            apply(trial, changes)
            quorums = self.storage_settings(name, trial)
            check_insync(quorums["ack_quorum"], quorums["write_quorum"])
        before: list[Any] = []

        def change(p: dict[str, Any]) -> None:
            before.append(tuple(p.get(k) for k in STORAGE_POLICIES))
            apply(p, changes)

        after = policies.update_topic_policies(name, change)
        reopen = before[-1] != tuple(after.get(k) for k in STORAGE_POLICIES)
        await self.h.broker.topic_policies_changed(name, reload=reopen)


def validate_all(configs: Iterable[Any]) -> list[tuple[str, str]]:
    """Validated ``(name, value)`` pairs of a request's configs (ConfigError on the
    first bad one)."""
    return [(c.name, validate(c.name, c.value)) for c in configs]


def _resource_error(res: Data, code: int, message: str) -> None:
    res.error_code = code
    res.error_message = message


def _topic_of(h: KafkaProtocolHandler, req: RequestReceived, r: Any, res: Data,
              actions: tuple[str, ...]) -> TopicName | None:
    """The existing topic a config resource names; None (and an error on ``res``)
    when the resource is not a topic, the request's role may not do ``actions`` to it
    (handlers.kafka._access), or no such topic exists."""
    if r.resource_type == RESOURCE_BROKER:
        _resource_error(res, ErrorCode.INVALID_REQUEST,
                        "Broker configs are static in Magnetar (set them in the broker's conf)")
        return None
    if r.resource_type != RESOURCE_TOPIC:
        _resource_error(res, ErrorCode.INVALID_REQUEST, f"Resource type {r.resource_type} is not supported")
        return None
    try:
        name = h.topics.topic_name(r.resource_name)
        _access.check(h, req, r.resource_name, actions)
    except Exception as exc:
        _resource_error(res, topic_error(exc), str(exc))
        return None
    if not h.topics.partition_count(name):
        _resource_error(res, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"Topic '{r.resource_name}' does not exist.")
        return None
    return name


async def _alter(h: KafkaProtocolHandler, req: RequestReceived,
                 changes_of: Callable[[Any], list[tuple[str, str | None]]], *, replace: bool) -> Data:
    """The shared body of AlterConfigs and IncrementalAlterConfigs: per resource, the
    validated changes are stored (unless ``validate_only``) or the error is reported."""
    out = []
    for r in req.body.resources:
        res = Data(error_code=0, error_message=None, resource_type=r.resource_type,
                   resource_name=r.resource_name)
        out.append(res)
        name = _topic_of(h, req, r, res, _access.MANAGE)
        if name is None:
            continue
        try:
            changes = changes_of(r)
            if len({k for k, _ in changes}) != len(changes):
                raise ProtocolError("A config was named twice in one resource", ErrorCode.INVALID_REQUEST)
            if not req.body.validate_only:
                await h.configs.store(name, changes, replace=replace)
        except ProtocolError as exc:
            _resource_error(res, exc.code, str(exc))
    return Data(throttle_time_ms=0, responses=out)


async def handle_alter_configs(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """AlterConfigs (key 33): the given configs replace all of the topic's own."""
    return await _alter(h, req, lambda r: list(validate_all(r.configs)), replace=True)


async def handle_incremental_alter_configs(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    """IncrementalAlterConfigs (key 44, KIP-339): SET and DELETE per config; APPEND and
    SUBTRACT apply to list configs only, and the one list config Magnetar applies
    (cleanup.policy) has a single allowed value."""
    return await _alter(h, req, lambda r: [(c.name, _incremental(c.name, c.config_operation, c.value))
                                           for c in r.configs], replace=False)


def _incremental(name: str, op: int, value: str | None) -> str | None:
    """The new value (None: back to the default) of one IncrementalAlterConfigs entry."""
    kind = known(name)
    if op == OP_SET:
        return validate(name, value)
    if op == OP_DELETE:
        return None
    if op not in (OP_APPEND, OP_SUBTRACT):
        raise ConfigError(f"Unknown config operation {op} for {name}")
    if kind is not None:
        # Kafka's controller (ConfigurationControlManager.incrementalAlterConfigResource)
        raise ConfigError(f"Can't {'APPEND' if op == OP_APPEND else 'SUBTRACT'} to key {name} "
                          "because its type is not LIST.")
    items = {x.strip() for x in (value or "").split(",") if x.strip()}
    if op == OP_SUBTRACT:
        if "delete" in items:
            raise ConfigError(f"Invalid value {value} for configuration {name}: "
                              "Magnetar topics keep cleanup.policy=delete")
        return "delete"
    return validate(name, ",".join(sorted(items | {"delete"})))


def _broker_configs(h: KafkaProtocolHandler) -> list[tuple[str, str, int]]:
    src = SOURCE_STATIC_BROKER
    return [
        ("auto.create.topics.enable", str(bool(h.config.get("allowAutoTopicCreation"))).lower(), src),
        ("broker.id", str(h.node_id), src),
        ("default.replication.factor", "1", src),
        ("max.incremental.fetch.session.cache.slots", str(h.fetch_sessions.slots), src),
        ("message.max.bytes", str(h.max_message_size), src),
        ("num.partitions", str(max(1, int(h.config.get("defaultNumPartitions")))), src),
    ]


async def handle_describe_configs(h: KafkaProtocolHandler, req: RequestReceived) -> Data:
    out = []
    for r in req.body.resources:
        res = Data(error_code=0, error_message=None, resource_type=r.resource_type,
                   resource_name=r.resource_name, configs=[])
        out.append(res)
        items: list[tuple[str, str, int]]
        if r.resource_type == RESOURCE_BROKER:
            if r.resource_name not in ("", str(h.node_id)):
                _resource_error(res, ErrorCode.INVALID_REQUEST, f"Unknown broker {r.resource_name}")
                continue
            # An empty name asks for the cluster-wide dynamic defaults, as on Kafka: Magnetar's
            # broker configs are all static, so there are none.
            items = _broker_configs(h) if r.resource_name else []
        else:
            name = _topic_of(h, req, r, res, _access.DESCRIBE)
            if name is None:
                continue
            items = h.configs.values(name)
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        synonyms = bool(req.api_version >= 1 and req.body.include_synonyms)
        topic = r.resource_type == RESOURCE_TOPIC
        res.configs = []
        for k, v, s in items:
            if keys is not None and k not in keys:
                continue
            # Asked for synonyms, Kafka lists the sources a value comes from, highest
            # first: the config itself where set (on the topic or the broker), then, for
            # a topic's, its broker synonyms.
            listed = [(k, v, s)] if synonyms and s != SOURCE_DEFAULT and \
                (s == SOURCE_DYNAMIC_TOPIC or not topic) else []
            if synonyms and topic:
                listed += h.configs.broker_synonyms(k)
            res.configs.append(config_entry(k, v, s, synonyms=listed))
    return Data(throttle_time_ms=0, results=out)


def config_entry(name: str, value: str, source: int, *,
                 synonyms: Sequence[tuple[str, str, int]] = ()) -> Data:
    """One config of a DescribeConfigs (or CreateTopics v5+) response, with ``synonyms``
    (name, value, source) as given; the topic configs that AlterConfigs can change are the
    ones not read-only."""
    return Data(name=name, value=value, read_only=name not in TOPIC_CONFIGS,
                is_default=source == SOURCE_DEFAULT, config_source=source, is_sensitive=False,
                synonyms=[Data(name=n, value=v, source=s) for n, v, s in synonyms],
                config_type=CONFIG_TYPES.get(name, 0), documentation=None)
