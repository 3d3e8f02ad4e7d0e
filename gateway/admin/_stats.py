"""Pulsar's TopicStats, PartitionedTopicStats and PersistentTopicInternalStats JSON,
built from the broker's live objects at request time.

Counters come from the topic, its producers, subscriptions and consumers (every
protocol's clients are among them: a Kafka consumer group is a subscription). Rates are
the change of those counters over the last ``RATE_WINDOW_SECONDS``, sampled whenever stats
or metrics are read.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

from core.autorecovery import LEDGERS_ROOT
from core.format import EntryFormatError, decode_entry
from core.storage import Position, last_confirmed_entry

from .brokers import broker_id

__all__ = ["Rates", "topic_stats", "subscription_stats", "internal_stats", "merge_partition_stats",
           "add_earliest_publish_times", "backlog_size_after", "RATE_WINDOW_SECONDS"]

RATE_WINDOW_SECONDS = 60.0
_MAX_SAMPLES = 256


class Rates:
    """Per-key rates of monotonically growing counters."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS):
        self.window = window
        self._samples: dict[Any, deque[tuple[float, float]]] = {}

    def rate(self, key: Any, counter: float, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        samples = self._samples.setdefault(key, deque(maxlen=_MAX_SAMPLES))
        if samples and counter < samples[-1][1]:
            samples.clear()  # the counter restarted (topic reloaded)
        samples.append((now, counter))
        while len(samples) > 2 and now - samples[1][0] >= self.window:
            samples.popleft()
        t0, c0 = samples[0]
        return (counter - c0) / (now - t0) if now > t0 else 0.0


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pos(p: Position | None) -> str:
    return f"{p.ledger_id}:{p.entry_id}" if p is not None else "-1:-1"


def _activity(key: tuple[Any, ...], who: Any, rates: Rates) -> dict[str, Any]:
    """The acknowledgement rate and last-activity timestamps of a consumer or subscription
    (a ``core.subscription.Activity``)."""
    return {
        "messageAckRate": rates.rate(key + ("acked",), who.acked),
        "lastAckedTimestamp": who.last_acked_ts,
        "lastConsumedTimestamp": who.last_consumed_ts,
        "lastConsumedFlowTimestamp": who.last_flow_ts,
    }


def consumer_stats(topic: Any, sub: Any, c: Any, rates: Rates) -> dict[str, Any]:
    key = (str(topic.name), sub.name, id(c))
    return {
        "msgRateOut": rates.rate(key + ("msg",), c.msg_out),
        "msgThroughputOut": rates.rate(key + ("bytes",), c.bytes_out),
        "bytesOutCounter": c.bytes_out,
        "msgOutCounter": c.msg_out,
        "msgRateRedeliver": rates.rate(key + ("redelivered",), c.redelivered),
        **_activity(key, c, rates),
        "chunkedMessageRate": 0.0,
        "consumerName": c.name,
        "availablePermits": c.permits,
        "unackedMessages": c.unacked_messages,
        "avgMessagesPerEntry": round(c.msg_out / c.entries_out) if c.entries_out else 0,
        "blockedConsumerOnUnackedMsgs": c.blocked_on_unacked,
        "priorityLevel": c.priority,
        "keyHashRanges": [f"[{a}, {b}]" for a, b in (c.sticky_ranges or [])] or None,
        "metadata": dict(c.metadata),
        "connectedSince": _iso(c.connected_since),
        "address": str(getattr(c.sink, "peer_address", "") or ""),
        "clientVersion": str(getattr(c.sink, "client_version", "") or ""),
    }


def subscription_stats(topic: Any, sub: Any, rates: Rates) -> dict[str, Any]:
    key = (str(topic.name), sub.name)
    # as Pulsar's isReplicated: marked by a consumer, and replicated subscriptions enabled
    replicated = sub.replicated and bool(topic.broker.config.get("enableReplicatedSubscriptions"))
    backlog = sub.backlog()
    active = sub.active_consumer
    delayed = sub.delayed_messages
    return {
        "msgRateOut": rates.rate(key + ("msg",), sub.msg_out),
        "msgThroughputOut": rates.rate(key + ("bytes",), sub.bytes_out),
        "bytesOutCounter": sub.bytes_out,
        "msgOutCounter": sub.msg_out,
        "msgRateRedeliver": rates.rate(key + ("redelivered",), sub.redelivered),
        **_activity(key, sub, rates),
        "chunkedMessageRate": 0,
        "msgBacklog": backlog,
        "backlogSize": topic.backlog_bytes(sub),
        "earliestMsgPublishTimeInBacklog": 0,
        "msgBacklogNoDelayed": max(0, backlog - delayed),
        "blockedSubscriptionOnUnackedMsgs": sub.blocked_on_unacked,
        "msgDelayed": delayed,
        "unackedMessages": sum(c.unacked_messages for c in sub.consumers),
        "type": sub.sub_type.name,
        "activeConsumerName": active.name if active is not None else None,
        "msgRateExpired": rates.rate(key + ("expired",), sub.expired),
        "totalMsgExpired": sub.expired,
        "lastExpireTimestamp": sub.last_expire_timestamp,
        "lastMarkDeleteAdvancedTimestamp": sub.last_mark_delete_ts,
        "consumers": [consumer_stats(topic, sub, c, rates) for c in sub.consumers],
        "isDurable": sub.durable,
        "isReplicated": replicated,
        "allowOutOfOrderDelivery": sub.allow_out_of_order,
        "consumersAfterMarkDeletePosition": {},
        "nonContiguousDeletedMessagesRanges": len(sub.cursor.individually_deleted()),
        "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        "subscriptionProperties": sub.cursor.properties(),
        "durable": sub.durable,
        "replicated": replicated,
        **_drop_rate(key, sub, rates),
    }


def _drop_rate(key: tuple[Any, ...], who: Any, rates: Rates) -> dict[str, float]:
    """A non-persistent topic's or subscription's ``msgDropRate``: messages per second it
    could not hand to a consumer (nothing for persistent ones, as in Pulsar)."""
    dropped = getattr(who, "msg_dropped", None)
    return {} if dropped is None else {"msgDropRate": rates.rate(key + ("dropped",), dropped)}


def producer_stats(topic: Any, p: Any, rates: Rates) -> dict[str, Any]:
    key = (str(topic.name), "producer", p.producer_id, p.name)
    msg_rate = rates.rate(key + ("msg",), p.msg_in)
    byte_rate = rates.rate(key + ("bytes",), p.bytes_in)
    return {
        "accessMode": p.access_mode.name,
        "msgRateIn": msg_rate,
        "msgThroughputIn": byte_rate,
        "averageMsgSize": (p.bytes_in / p.msg_in) if p.msg_in else 0.0,
        "chunkedMessageRate": 0.0,
        "producerId": p.producer_id,
        "supportsPartialProducer": False,
        "producerName": p.name,
        "metadata": dict(p.metadata),
        "connectedSince": _iso(p.connected_since),
        "address": p.address,
        "clientVersion": p.client_version,
        # Pulsar's NonPersistentPublisherStats: what it drops past
        # maxConcurrentNonPersistentMessagePerConnection. Here a non-persistent publish is
        # handed to the subscriptions before it is answered, so none is dropped.
        **({} if topic.name.persistent else {"msgDropRate": 0.0}),
    }


def topic_stats(topic: Any, rates: Rates) -> dict[str, Any]:
    """TopicStats of one (non-partitioned topic or partition) loaded topic."""
    key = str(topic.name)
    subs = {name: subscription_stats(topic, s, rates) for name, s in sorted(topic.subscriptions.items())}
    compactor = topic.compaction_subscription
    if compactor is not None:  # listed among the subscriptions, as Pulsar's is
        subs = dict(sorted({**subs, compactor.name: subscription_stats(topic, compactor, rates)}.items()))
    msg_out, bytes_out = topic.dispatched
    st = topic.ml.stats()
    return {
        "msgRateIn": rates.rate((key, "msg_in"), topic.msg_in),
        "msgThroughputIn": rates.rate((key, "bytes_in"), topic.bytes_in),
        "msgRateOut": rates.rate((key, "msg_out"), msg_out),
        "msgThroughputOut": rates.rate((key, "bytes_out"), bytes_out),
        "bytesInCounter": topic.bytes_in,
        "msgInCounter": topic.msg_in,
        "bytesOutCounter": bytes_out,
        "msgOutCounter": msg_out,
        "averageMsgSize": (topic.bytes_in / topic.msg_in) if topic.msg_in else 0.0,
        "msgChunkPublished": False,
        "storageSize": int(st.get("total_size") or 0),
        "backlogSize": topic.backlog_bytes(),
        "publishRateLimitedTimes": topic.publish_rate_limited_times,
        "earliestMsgPublishTimeInBacklogs": 0,
        "offloadedStorageSize": 0,
        "lastOffloadLedgerId": 0,
        "lastOffloadSuccessTimeStamp": 0,
        "lastOffloadFailureTimeStamp": 0,
        "ongoingTxnCount": 0,
        "abortedTxnCount": 0,
        "committedTxnCount": 0,
        "publishers": [producer_stats(topic, p, rates) for p in topic.producers],
        "waitingPublishers": topic.waiting_producers,
        "subscriptions": subs,
        "replication": {},
        "deduplicationStatus": "Enabled" if topic.dedup_enabled else "Disabled",
        "nonContiguousDeletedMessagesRanges": sum(s["nonContiguousDeletedMessagesRanges"] for s in subs.values()),
        "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        "delayedMessageIndexSizeInBytes": 0,
        "compaction": _compaction_stats(topic.compaction_status()),
        "ownerBroker": broker_id(topic.broker),
        **_drop_rate((key,), topic, rates),
        # only once an exclusive producer has taken the topic: Pulsar leaves nulls out
        **({} if topic.topic_epoch is None else {"topicEpoch": topic.topic_epoch}),
    }


def _compaction_stats(st: dict[str, Any]) -> dict[str, Any]:
    return {"lastCompactionRemovedEventCount": st.get("removed", 0),
            "lastCompactionSucceedTimestamp": st.get("succeededAt", 0),
            "lastCompactionFailedTimestamp": st.get("failedAt", 0),
            "lastCompactionDurationTimeInMills": st.get("durationMs", 0)}


async def add_earliest_publish_times(topic: Any, stats: dict[str, Any]) -> None:
    """Fill in what Pulsar computes only when asked (``getEarliestTimeInBacklog``): each
    subscription's ``earliestMsgPublishTimeInBacklog``, the publish time of its oldest
    unacknowledged entry (the broker's timestamp when it stamps one), and the topic's
    ``earliestMsgPublishTimeInBacklogs``, the earliest of those. 0 where nothing is held."""
    if topic.name.domain != "persistent":
        return
    earliest = 0
    for name, sub_stats in stats["subscriptions"].items():
        sub = topic.subscriptions.get(name)
        got = await sub.unacked_entries(1) if sub is not None else []
        if not got:
            continue
        when = got[0].publish_time
        if not when:
            try:
                when = decode_entry(got[0].data)[0].publish_time
            except EntryFormatError:
                continue
        sub_stats["earliestMsgPublishTimeInBacklog"] = when
        earliest = min(earliest, when) if earliest else when
    stats["earliestMsgPublishTimeInBacklogs"] = earliest


def _earliest(a: int, b: int) -> int:
    """The earlier of two publish times, 0 meaning none."""
    return min(a, b) if a and b else max(a, b)


_SUMMED = ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "bytesInCounter",
           "msgInCounter", "bytesOutCounter", "msgOutCounter", "storageSize", "backlogSize",
           "waitingPublishers", "nonContiguousDeletedMessagesRanges")
_SUB_SUMMED = ("msgRateOut", "msgThroughputOut", "bytesOutCounter", "msgOutCounter", "msgBacklog",
               "backlogSize", "msgBacklogNoDelayed", "msgDelayed", "unackedMessages", "msgRateExpired",
               "totalMsgExpired", "nonContiguousDeletedMessagesRanges")


def merge_partition_stats(partitions: int, per_partition: dict[str, dict[str, Any]],
                          include_partitions: bool) -> dict[str, Any]:
    """PartitionedTopicStats: the partitions' TopicStats summed, plus ``metadata``."""
    out: dict[str, Any] = {k: 0 for k in _SUMMED}
    out.update({"averageMsgSize": 0.0, "publishers": [], "subscriptions": {}, "replication": {},
                "metadata": {"partitions": partitions, "deleted": False}, "partitions": {}})
    for name, st in sorted(per_partition.items()):
        for k in _SUMMED:
            out[k] += st.get(k, 0)
        _add_drop_rate(out, st)
        out["earliestMsgPublishTimeInBacklogs"] = _earliest(out.get("earliestMsgPublishTimeInBacklogs", 0),
                                                            st.get("earliestMsgPublishTimeInBacklogs", 0))
        _merge_clients(out["publishers"], st["publishers"], "producerName", _PUBLISHER_KEPT)
        for sub_name, sub in st["subscriptions"].items():
            merged = out["subscriptions"].get(sub_name)
            if merged is None:
                merged = out["subscriptions"][sub_name] = {**sub, "consumers": []}
            else:
                for k in _SUB_SUMMED:
                    merged[k] += sub.get(k, 0)
                _add_drop_rate(merged, sub)
                merged["earliestMsgPublishTimeInBacklog"] = _earliest(
                    merged.get("earliestMsgPublishTimeInBacklog", 0), sub.get("earliestMsgPublishTimeInBacklog", 0))
            _merge_clients(merged["consumers"], sub["consumers"], "consumerName", _CONSUMER_KEPT)
        if include_partitions:
            out["partitions"][name] = st
    if out["msgInCounter"]:
        out["averageMsgSize"] = out["bytesInCounter"] / out["msgInCounter"]
    for pub in out["publishers"]:
        if pub.get("msgRateIn"):
            pub["averageMsgSize"] = pub["msgThroughputIn"] / pub["msgRateIn"]
    return out


def _add_drop_rate(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Sum a non-persistent partition's ``msgDropRate`` (topic or subscription) into
    ``into``, as Pulsar's NonPersistentTopicStats and NonPersistentSubscriptionStats add
    theirs; persistent stats have none."""
    if "msgDropRate" in more:
        into["msgDropRate"] = into.get("msgDropRate", 0.0) + more["msgDropRate"]


_PUBLISHER_KEPT = frozenset({"producerId", "averageMsgSize"})
_CONSUMER_KEPT = frozenset({"priorityLevel", "avgMessagesPerEntry"})


def _merge_clients(merged: list[dict[str, Any]], more: list[dict[str, Any]], name_key: str,
                   kept: frozenset[str]) -> None:
    """Fold a partition's producers or consumers into ``merged``: one entry per client
    (by ``name_key``), as Pulsar's partitioned stats show one per producer or consumer of
    the partitioned topic, with its rates and counts summed over the partitions (its
    latest timestamps kept, and the ``kept`` fields as the first partition had them)."""
    by_name = {m.get(name_key): m for m in merged}
    for client in more:
        into = by_name.get(client.get(name_key))
        if into is None:
            into = by_name[client.get(name_key)] = dict(client)
            merged.append(into)
            continue
        for k, v in client.items():
            if k in kept or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            into[k] = max(into.get(k) or 0, v) if k.endswith("Timestamp") else (into.get(k) or 0) + v
        if "blockedConsumerOnUnackedMsgs" in client:
            into["blockedConsumerOnUnackedMsgs"] = bool(
                into.get("blockedConsumerOnUnackedMsgs") or client["blockedConsumerOnUnackedMsgs"])


def _deleted_ranges(ranges: list[tuple[Position, Position]]) -> str:
    # Pulsar prints open-closed ranges: (before-first..last]
    parts = [f"({a.ledger_id}:{a.entry_id - 1}..{b.ledger_id}:{b.entry_id}]" for a, b in ranges]
    return "[" + ", ".join(parts) + "]"


def _ledger_metadata(store: Any, ledger_id: int) -> str | None:
    """The ledger's metadata record as stored (JSON text: ensembles, quorums, state)."""
    got = store.get(f"{LEDGERS_ROOT}/{ledger_id}")
    return got[0].decode() if got is not None else None


def internal_stats(topic: Any, metadata_store: Any = None) -> dict[str, Any]:
    """PersistentTopicInternalStats: the managed ledger's ledgers and cursors.

    With ``metadata_store`` (Pulsar's ``?metadata=true``), each ledger also carries its
    metadata record as ``metadata`` (JSON text, null when the store has none): what a
    reader needs to fetch its entries from the bookies itself.
    """
    st = topic.ml.stats()
    ledgers = topic.ml.ledgers()
    cursors = {}
    for name, sub in sorted(topic.subscriptions.items()):
        c = sub.cursor
        md = c.mark_delete_position()
        cursors[name] = {
            "markDeletePosition": _pos(md),
            "readPosition": _pos(c.read_position()),
            "waitingReadOp": False,
            "pendingReadOps": 0,
            "messagesConsumedCounter": sub.msg_out,
            "cursorLedger": -1,
            "cursorLedgerLastEntry": -1,
            "individuallyDeletedMessages": _deleted_ranges(c.individually_deleted()),
            "lastLedgerSwitchTimestamp": "",
            "state": "Closed" if sub.closed else "Open",
            "active": bool(sub.consumers),
            "numberOfEntriesSinceFirstNotAckedMessage": sub.backlog(),
            "totalNonContiguousDeletedMessagesRange": len(c.individually_deleted()),
            "subscriptionHavePendingRead": False,
            "subscriptionHavePendingReplayRead": False,
            "properties": {},
        }
    ledger_infos: list[dict[str, Any]] = [{"ledgerId": int(led["ledgerId"]), "entries": int(led["entries"]),
                     "size": int(led["size"]), "offloaded": False, "underReplicated": False}
                    for led in ledgers]
    if metadata_store is not None:
        for info in ledger_infos:
            info["metadata"] = _ledger_metadata(metadata_store, info["ledgerId"])
    return {
        "entriesAddedCounter": int(st.get("entries_added") or 0),
        "numberOfEntries": int(st.get("number_of_entries") or 0),
        "totalSize": int(st.get("total_size") or 0),
        "currentLedgerEntries": int(st.get("current_ledger_entries") or 0),
        "currentLedgerSize": int(st.get("current_ledger_size") or 0),
        "lastLedgerCreatedTimestamp": _iso(int(st.get("current_ledger_created_ms") or 0) / 1000),
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "lastConfirmedEntry": "{}:{}".format(*last_confirmed_entry(st)),
        "state": "Terminated" if topic.terminated_at is not None else
        {"Open": "LedgerOpened", "Closed": "Closed"}.get(str(st.get("status")), str(st.get("status"))),
        "ledgers": ledger_infos,
        "cursors": cursors,
        "schemaLedgers": [],
        "compactedLedger": {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False,
                            "underReplicated": False},
    }


def backlog_size_after(ml: Any, ledger_id: int, entry_id: int) -> int:
    """The bytes stored after the position ``ledger_id:entry_id``, as Pulsar's
    ``getBacklogSizeByMessageId`` estimates them (ManagedLedgerImpl
    .estimateBacklogFromPosition): every ledger from the position's on, less the entries
    of its ledger up to and including the position, at that ledger's average entry size.
    A ledger id of -1, or one the topic no longer has, counts every stored byte from
    there on."""
    total = int(ml.stats().get("total_size") or 0)
    if ledger_id == -1:
        return total
    ledgers = {int(led["ledgerId"]): led for led in ml.ledgers()}
    after = total - sum(int(led["size"]) for lid, led in ledgers.items() if lid < ledger_id)
    led = ledgers.get(ledger_id)
    if led is None:
        return after
    size, entries = int(led["size"]), int(led["entries"])
    if entries <= 0 or entry_id < 0:
        return after
    if entries <= entry_id + 1:
        return after - size
    return after - (entry_id + 1) * (size // entries)
