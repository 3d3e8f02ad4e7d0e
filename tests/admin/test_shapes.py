"""The JSON documents carry the fields Pulsar's admin API documents for them, with the
same types, so tools written against pulsar-admin output keep working."""

from __future__ import annotations

import pulsar

from gateway._admin_cli import AdminClient

from .conftest import wait_for

TOPIC_STATS = {
    "msgRateIn": float, "msgThroughputIn": float, "msgRateOut": float, "msgThroughputOut": float,
    "bytesInCounter": int, "msgInCounter": int, "bytesOutCounter": int, "msgOutCounter": int,
    "averageMsgSize": float, "msgChunkPublished": bool, "storageSize": int, "backlogSize": int,
    "publishRateLimitedTimes": int, "earliestMsgPublishTimeInBacklogs": int, "offloadedStorageSize": int,
    "publishers": list, "waitingPublishers": int, "subscriptions": dict, "replication": dict,
    "deduplicationStatus": str, "nonContiguousDeletedMessagesRanges": int,
    "nonContiguousDeletedMessagesRangesSerializedSize": int, "compaction": dict,
}
SUBSCRIPTION_STATS = {
    "msgRateOut": float, "msgThroughputOut": float, "bytesOutCounter": int, "msgOutCounter": int,
    "msgRateRedeliver": float, "messageAckRate": float, "msgBacklog": int, "backlogSize": int,
    "msgBacklogNoDelayed": int, "blockedSubscriptionOnUnackedMsgs": bool, "msgDelayed": int,
    "unackedMessages": int, "type": str, "msgRateExpired": float, "totalMsgExpired": int,
    "lastExpireTimestamp": int, "consumers": list, "isDurable": bool, "isReplicated": bool,
    "allowOutOfOrderDelivery": bool, "consumersAfterMarkDeletePosition": dict,
    "nonContiguousDeletedMessagesRanges": int,
}
CONSUMER_STATS = {
    "msgRateOut": float, "msgThroughputOut": float, "bytesOutCounter": int, "msgOutCounter": int,
    "msgRateRedeliver": float, "consumerName": str, "availablePermits": int, "unackedMessages": int,
    "avgMessagesPerEntry": int, "blockedConsumerOnUnackedMsgs": bool, "metadata": dict,
    "connectedSince": str, "address": str, "clientVersion": str,
}
PUBLISHER_STATS = {
    "accessMode": str, "msgRateIn": float, "msgThroughputIn": float, "averageMsgSize": float,
    "producerId": int, "producerName": str, "metadata": dict, "connectedSince": str,
}
INTERNAL_STATS = {
    "entriesAddedCounter": int, "numberOfEntries": int, "totalSize": int, "currentLedgerEntries": int,
    "currentLedgerSize": int, "lastLedgerCreatedTimestamp": str, "waitingCursorsCount": int,
    "pendingAddEntriesCount": int, "lastConfirmedEntry": str, "state": str, "ledgers": list,
    "cursors": dict, "schemaLedgers": list, "compactedLedger": dict,
}
CURSOR_STATS = {
    "markDeletePosition": str, "readPosition": str, "waitingReadOp": bool, "pendingReadOps": int,
    "messagesConsumedCounter": int, "cursorLedger": int, "cursorLedgerLastEntry": int,
    "individuallyDeletedMessages": str, "lastLedgerSwitchTimestamp": str, "state": str,
    "numberOfEntriesSinceFirstNotAckedMessage": int, "totalNonContiguousDeletedMessagesRange": int,
    "properties": dict,
}
LEDGER_INFO = {"ledgerId": int, "entries": int, "size": int, "offloaded": bool}


def _check(doc: dict[str, object], shape: dict[str, type]) -> None:
    for key, kind in shape.items():
        assert key in doc, key
        value = doc[key]
        if kind is float:
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (key, value)
        else:
            assert isinstance(value, kind), (key, value)


def test_stats_shapes(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(4):
        producer.send(b"z")
    consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    consumer.receive(timeout_millis=10_000)  # delivered, not acknowledged
    stats = wait_for(lambda: (st := admin.get(f"{path}/stats"))["subscriptions"]["s"]["msgBacklog"] == 3 and st)
    _check(stats, TOPIC_STATS)
    _check(stats["publishers"][0], PUBLISHER_STATS)
    _check(stats["subscriptions"]["s"], SUBSCRIPTION_STATS)
    _check(stats["subscriptions"]["s"]["consumers"][0], CONSUMER_STATS)
    internal = admin.get(f"{path}/internalStats")
    _check(internal, INTERNAL_STATS)
    _check(internal["ledgers"][0], LEDGER_INFO)
    _check(internal["cursors"]["s"], CURSOR_STATS)
    producer.close()
    consumer.close()


def test_policies_shape(admin: AdminClient, ns: str) -> None:
    pol = admin.get(f"/admin/v2/namespaces/{ns}")
    for key in ("replication_clusters", "bundles", "backlog_quota_map", "message_ttl_in_seconds",
                "retention_policies", "deduplicationEnabled", "schema_compatibility_strategy",
                "autoTopicCreationOverride", "max_producers_per_topic", "max_consumers_per_topic",
                "auth_policies", "deleted"):
        assert key in pol, key
    assert pol["bundles"] == {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1}
