"""The policies that both a namespace and a topic carry, as one table.

Each row names the URL suffix Pulsar uses (``/retention``, ``/messageTTL``, ...), the key
in Pulsar's ``Policies`` JSON, and how a request body becomes the stored value. The same
rows serve ``/admin/v2/namespaces/{tenant}/{namespace}/<suffix>`` and
``/admin/v2/{domain}/{tenant}/{namespace}/{topic}/<suffix>`` (topic-level overrides);
a topic's effective policy is its own value, else its namespace's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from core.policies import default_inactive_topic_policies
from core.schema import STRATEGIES
from core.subscription import SubType

from ._common import RestError, body_int, body_object, json_body, query_int

__all__ = ["PolicySpec", "POLICY_SPECS", "TOPIC_POLICY_SPECS", "BACKLOG_QUOTA_TYPES", "BACKLOG_POLICIES",
           "quota_within_retention", "default_backlog_quota"]

BACKLOG_QUOTA_TYPES = ("destination_storage", "message_age")
BACKLOG_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")


def _non_negative(value: Any, what: str) -> int:
    n = body_int(value, what)
    if n < 0:
        raise RestError(412, f"Invalid value for {what}: must be >= 0")
    return n


def _retention(body: Any, request: Request) -> Any:
    data = body_object(body, "RetentionPolicies")
    t = body_int(data.get("retentionTimeInMinutes", 0), "retentionTimeInMinutes")
    s = body_int(data.get("retentionSizeInMB", 0), "retentionSizeInMB")
    if t < -1 or s < -1:
        raise RestError(412, "Retention time and size must be >= -1")
    return {"retentionTimeInMinutes": t, "retentionSizeInMB": s}


def _ttl(body: Any, request: Request) -> Any:
    if body is None and "messageTTL" in request.query_params:
        body = query_int(request, "messageTTL")
    return _non_negative(body, "message TTL")


def _bool(body: Any, request: Request) -> Any:
    if body is None and "enable" in request.query_params:
        return request.query_params["enable"].lower() == "true"
    if not isinstance(body, bool):
        raise RestError(400, "Body must be true or false")
    return body


def _strategy(body: Any, request: Request) -> Any:
    if not isinstance(body, str) or body.upper() not in STRATEGIES:
        raise RestError(412, f"Invalid schema compatibility strategy {body!r}: one of {', '.join(STRATEGIES)}")
    return body.upper()


def _auto_topic(body: Any, request: Request) -> Any:
    data = body_object(body, "AutoTopicCreationOverride")
    allow = data.get("allowAutoTopicCreation")
    if not isinstance(allow, bool):
        raise RestError(400, "allowAutoTopicCreation must be true or false")
    kind = data.get("topicType", "non-partitioned")
    if kind not in ("partitioned", "non-partitioned"):
        raise RestError(412, "Invalid configuration for autoTopicCreationOverride. the detail is "
                             f"[field: 'topicType' must be partitioned or non-partitioned, got {kind!r}]")
    out: dict[str, Any] = {"allowAutoTopicCreation": allow, "topicType": kind}
    if kind == "partitioned":
        n = data.get("defaultNumPartitions")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RestError(412, "Invalid configuration for autoTopicCreationOverride. the detail is "
                                 "[field: 'defaultNumPartitions' must be > 0]")
        out["defaultNumPartitions"] = n
    return out


def _auto_subscription(body: Any, request: Request) -> Any:
    data = body_object(body, "AutoSubscriptionCreationOverride")
    allow = data.get("allowAutoSubscriptionCreation")
    if not isinstance(allow, bool):
        raise RestError(400, "allowAutoSubscriptionCreation must be true or false")
    return {"allowAutoSubscriptionCreation": allow}


def _delayed_delivery(body: Any, request: Request) -> Any:
    data = body_object(body, "DelayedDeliveryPolicies")
    active = data.get("active")
    if not isinstance(active, bool):
        raise RestError(400, "active must be true or false")
    out: dict[str, Any] = {"active": active}
    for key, default in (("tickTime", 1000), ("maxDeliveryDelayInMillis", 0)):
        value = body_int(data.get(key, default), key)
        if value < 0:
            raise RestError(412, f"{key} must be 0 or more")
        out[key] = value
    return out


def _default_delayed_delivery(config: Any) -> dict[str, Any]:
    # tickTime is Pulsar's delay tracker's granularity; delays here are kept exactly (a
    # timer heap), so the policy stores and shows it, and Pulsar's default stands in for it
    return {"active": bool(config.get("delayedDeliveryEnabled")), "tickTime": 1000,
            "maxDeliveryDelayInMillis": 0}


INACTIVE_TOPIC_DELETE_MODES = ("delete_when_no_subscriptions", "delete_when_subscriptions_caught_up")


def _inactive_topic_policies(body: Any, request: Request) -> Any:
    data = body_object(body, "InactiveTopicPolicies")
    mode = data.get("inactiveTopicDeleteMode")
    if mode not in INACTIVE_TOPIC_DELETE_MODES:
        raise RestError(400, f"inactiveTopicDeleteMode must be one of {', '.join(INACTIVE_TOPIC_DELETE_MODES)}")
    seconds = body_int(data.get("maxInactiveDurationSeconds"), "maxInactiveDurationSeconds")
    if seconds < 0:
        raise RestError(412, "maxInactiveDurationSeconds must be 0 or more")
    delete = data.get("deleteWhileInactive", False)
    if not isinstance(delete, bool):
        raise RestError(400, "deleteWhileInactive must be true or false")
    return {"inactiveTopicDeleteMode": mode, "maxInactiveDurationSeconds": seconds,
            "deleteWhileInactive": delete}


SUBSCRIPTION_TYPES = tuple(t.name for t in SubType)


def _subscription_types(body: Any, request: Request) -> Any:
    if not isinstance(body, list) or not all(isinstance(t, str) for t in body):
        raise RestError(400, "Body must be a list of subscription types")
    unknown = [t for t in body if t not in SUBSCRIPTION_TYPES]
    if unknown:
        raise RestError(400, f"Unknown subscription types {unknown}: one of {', '.join(SUBSCRIPTION_TYPES)}")
    return sorted(set(body), key=SUBSCRIPTION_TYPES.index)


def _persistence(body: Any, request: Request) -> Any:
    data = body_object(body, "PersistencePolicies")
    e, w, a = (body_int(data.get(k), k) for k in
               ("bookkeeperEnsemble", "bookkeeperWriteQuorum", "bookkeeperAckQuorum"))
    rate = data.get("managedLedgerMaxMarkDeleteRate", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
        raise RestError(400, "managedLedgerMaxMarkDeleteRate must be a number >= 0")
    if not e >= w >= a >= 1:
        raise RestError(400, f"Bookkeeper Ensemble ({e}) >= WriteQuorum ({w}) >= AckQuorum ({a}) "
                             "and all >= 1 are required")
    return {"bookkeeperEnsemble": e, "bookkeeperWriteQuorum": w, "bookkeeperAckQuorum": a,
            "managedLedgerMaxMarkDeleteRate": float(rate)}


def _ledger_rollover(body: Any, request: Request) -> Any:
    """A topic's own ledger rollover (Kafka's segment.ms and segment.bytes): either field
    may be left out, and the broker's setting applies to it."""
    data = body_object(body, "LedgerRollover")
    out = {}
    for key in ("rolloverTimeInMillis", "rolloverSizeInMB"):
        if data.get(key) is not None:
            n = body_int(data[key], key)
            if n < 1:
                raise RestError(412, f"Invalid value for {key}: must be >= 1")
            out[key] = n
    return out


TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


def _timestamp_type(body: Any, request: Request) -> Any:
    if body not in TIMESTAMP_TYPES:
        raise RestError(412, f"Invalid message timestamp type {body!r}: one of {', '.join(TIMESTAMP_TYPES)}")
    return body


def _max_count(what: str) -> Callable[[Any, Request], Any]:
    def parse(body: Any, request: Request) -> Any:
        return _non_negative(body, what)

    return parse


def _rates(fields: tuple[str, ...], extra: dict[str, Any]) -> Callable[[Any, Request], Any]:
    def parse(body: Any, request: Request) -> Any:
        data = body_object(body, "rate")
        out = dict(extra)
        for f in fields:
            if f in data:
                out[f] = body_int(data[f], f)
        for f in extra:
            if f in data:
                out[f] = data[f]
        return out

    return parse


_DISPATCH = _rates(("dispatchThrottlingRateInMsg", "dispatchThrottlingRateInByte", "ratePeriodInSecond"),
                   {"dispatchThrottlingRateInMsg": -1, "dispatchThrottlingRateInByte": -1,
                    "relativeToPublishRate": False, "ratePeriodInSecond": 1})
_PUBLISH = _rates(("publishThrottlingRateInMsg", "publishThrottlingRateInByte"),
                  {"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": -1})


def backlog_quota_body(body: Any, request: Request) -> tuple[str, dict[str, Any]]:
    """``(quota type, BacklogQuota)`` from ``?backlogQuotaType=`` and the body."""
    kind = request.query_params.get("backlogQuotaType", "destination_storage")
    if kind not in BACKLOG_QUOTA_TYPES:
        raise RestError(412, f"Invalid backlogQuotaType {kind!r}: one of {', '.join(BACKLOG_QUOTA_TYPES)}")
    data = body_object(body, "BacklogQuota")
    policy = data.get("policy", "producer_request_hold")
    if policy not in BACKLOG_POLICIES:
        raise RestError(412, f"Invalid backlog quota policy {policy!r}: one of {', '.join(BACKLOG_POLICIES)}")
    size = body_int(data.get("limitSize", data.get("limit", -1)), "limitSize")
    limit_time = body_int(data.get("limitTime", -1), "limitTime")
    if kind == "message_age" and limit_time <= 0:
        raise RestError(412, "A message_age backlog quota needs limitTime > 0")
    return kind, {"limit": size, "limitSize": size, "limitTime": limit_time, "policy": policy}


def default_backlog_quota(config: Any) -> dict[str, Any]:
    """The broker's destination_storage quota (``backlogQuotaDefault*``), as a BacklogQuota."""
    gb = float(config.get("backlogQuotaDefaultLimitGB", -1.0))
    size = -1 if gb < 0 else int(gb * 1024 ** 3)
    return {"limit": size, "limitSize": size, "limitTime": -1,
            "policy": str(config.get("backlogQuotaDefaultRetentionPolicy", "producer_request_hold"))}


def quota_within_retention(config: Any, quota: dict[str, Any] | None,
                           retention: dict[str, Any] | None) -> bool:
    """Pulsar's rule between a backlog quota and retention, checked whichever of the two is
    set second: a retention size (time) that is set must exceed the quota's size (time).
    ``quota`` None is the broker's default quota (``backlogQuotaDefaultLimitGB``)."""
    if not retention:
        return True
    size_mb = int(retention.get("retentionSizeInMB", 0))
    minutes = int(retention.get("retentionTimeInMinutes", 0))
    if size_mb <= 0 and minutes <= 0:
        return True
    if quota is None:
        quota = default_backlog_quota(config)
    limit_size = int(quota.get("limitSize", quota.get("limit", -1)))
    limit_time = int(quota.get("limitTime", -1))
    if size_mb > 0 and limit_size >= size_mb * 1024 * 1024:
        return False
    return not (minutes > 0 and limit_time >= minutes * 60)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    suffix: str
    key: str
    parse: Callable[[Any, Request], Any]
    set_methods: tuple[str, ...] = ("POST",)
    #: Policies applied by the storage layer when a topic loads: changing one reloads the
    #: namespace's (or topic's) loaded topics so it takes effect at once.
    reload: bool = False
    #: The value a GET of an unset policy returns.
    unset: Any = None
    #: The broker's value, from its config, where neither a topic nor its namespace sets
    #: the policy: what a topic's GET with ``applied=true`` answers then, as in Pulsar.
    default: Callable[[Any], Any] | None = None


def _config(key: str) -> Callable[[Any], Any]:
    return lambda config: config.get(key)


def _default_retention(config: Any) -> dict[str, Any]:
    return {"retentionTimeInMinutes": int(config.get("defaultRetentionTimeInMinutes")),
            "retentionSizeInMB": int(config.get("defaultRetentionSizeInMB"))}


def _default_persistence(config: Any) -> dict[str, Any]:
    return {"bookkeeperEnsemble": int(config.get("managedLedgerDefaultEnsembleSize")),
            "bookkeeperWriteQuorum": int(config.get("managedLedgerDefaultWriteQuorum")),
            "bookkeeperAckQuorum": int(config.get("managedLedgerDefaultAckQuorum")),
            "managedLedgerMaxMarkDeleteRate": float(config.get("managedLedgerDefaultMarkDeleteRateLimit"))}


POLICY_SPECS: tuple[PolicySpec, ...] = (
    PolicySpec("retention", "retention_policies", _retention, reload=True, default=_default_retention),
    PolicySpec("persistence", "persistence", _persistence, reload=True, default=_default_persistence),
    PolicySpec("messageTTL", "message_ttl_in_seconds", _ttl, default=_config("ttlDurationDefaultInSeconds")),
    PolicySpec("deduplication", "deduplicationEnabled", _bool, default=_config("brokerDeduplicationEnabled")),
    PolicySpec("deduplicationEnabled", "deduplicationEnabled", _bool,
               default=_config("brokerDeduplicationEnabled")),
    PolicySpec("schemaCompatibilityStrategy", "schema_compatibility_strategy", _strategy,
               ("PUT", "POST"), unset="UNDEFINED"),
    PolicySpec("delayedDelivery", "delayed_delivery_policies", _delayed_delivery,
               default=_default_delayed_delivery),
    PolicySpec("inactiveTopicPolicies", "inactive_topic_policies", _inactive_topic_policies,
               default=default_inactive_topic_policies),
    PolicySpec("schemaValidationEnforced", "schema_validation_enforced", _bool, unset=False),
    PolicySpec("encryptionRequired", "encryption_required", _bool, unset=False),
    PolicySpec("isAllowAutoUpdateSchema", "is_allow_auto_update_schema", _bool),
    PolicySpec("autoTopicCreation", "autoTopicCreationOverride", _auto_topic),
    PolicySpec("autoSubscriptionCreation", "autoSubscriptionCreationOverride", _auto_subscription),
    PolicySpec("maxProducersPerTopic", "max_producers_per_topic", _max_count("maxProducersPerTopic"),
               default=_config("maxProducersPerTopic")),
    PolicySpec("maxTopicsPerNamespace", "max_topics_per_namespace", _max_count("maxTopicsPerNamespace")),
    PolicySpec("maxConsumersPerTopic", "max_consumers_per_topic", _max_count("maxConsumersPerTopic"),
               default=_config("maxConsumersPerTopic")),
    PolicySpec("maxConsumersPerSubscription", "max_consumers_per_subscription",
               _max_count("maxConsumersPerSubscription"), default=_config("maxConsumersPerSubscription")),
    PolicySpec("maxSubscriptionsPerTopic", "max_subscriptions_per_topic",
               _max_count("maxSubscriptionsPerTopic"), default=_config("maxSubscriptionsPerTopic")),
    PolicySpec("subscriptionExpirationTime", "subscription_expiration_time_minutes",
               _max_count("subscriptionExpirationTime"), default=_config("subscriptionExpirationTimeMinutes")),
    PolicySpec("compactionThreshold", "compaction_threshold", _max_count("compactionThreshold"),
               default=_config("brokerServiceCompactionThresholdInBytes")),
    PolicySpec("subscriptionTypesEnabled", "subscription_types_enabled", _subscription_types,
               unset=[]),
    PolicySpec("maxProducers", "max_producers_per_topic", _max_count("maxProducers"),
               default=_config("maxProducersPerTopic")),
    PolicySpec("maxConsumers", "max_consumers_per_topic", _max_count("maxConsumers"),
               default=_config("maxConsumersPerTopic")),
    PolicySpec("dispatchRate", "topicDispatchRate", _DISPATCH),
    PolicySpec("subscriptionDispatchRate", "subscriptionDispatchRate", _DISPATCH),
    PolicySpec("publishRate", "publishMaxMessageRate", _PUBLISH),
    # Pulsar names these ...PerConsumer/...PerSubscription on a namespace and
    # ...OnConsumer/...OnSubscription on a topic; both scopes answer to both.
    PolicySpec("maxUnackedMessagesPerConsumer", "max_unacked_messages_per_consumer",
               _max_count("maxUnackedMessagesPerConsumer"), default=_config("maxUnackedMessagesPerConsumer")),
    PolicySpec("maxUnackedMessagesPerSubscription", "max_unacked_messages_per_subscription",
               _max_count("maxUnackedMessagesPerSubscription"),
               default=_config("maxUnackedMessagesPerSubscription")),
    PolicySpec("maxUnackedMessagesOnConsumer", "max_unacked_messages_per_consumer",
               _max_count("maxUnackedMessagesOnConsumer"), default=_config("maxUnackedMessagesPerConsumer")),
    PolicySpec("maxUnackedMessagesOnSubscription", "max_unacked_messages_per_subscription",
               _max_count("maxUnackedMessagesOnSubscription"),
               default=_config("maxUnackedMessagesPerSubscription")),
)

#: Policies a topic has but a namespace does not: Pulsar's topic-level ``maxMessageSize``,
#: and Magnetar's for Kafka's segment configs (``ledgerRollover``) and the record times
#: Kafka consumers see (``messageTimestampType``, CreateTime unless set).
TOPIC_POLICY_SPECS: tuple[PolicySpec, ...] = (
    PolicySpec("maxMessageSize", "max_message_size", _max_count("maxMessageSize")),
    PolicySpec("ledgerRollover", "ledger_rollover", _ledger_rollover, reload=True),
    PolicySpec("messageTimestampType", "message_timestamp_type", _timestamp_type),
)


async def read_body(request: Request) -> Any:
    return await json_body(request, required=False)
