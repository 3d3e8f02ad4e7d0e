"""Prometheus metrics under Pulsar's names, read from the broker's live state at scrape
time by one custom collector (nothing is counted twice and nothing is kept per scrape).

Topic-level series carry ``cluster``, ``namespace`` and ``topic`` labels (subscription-
level ones ``subscription`` too), as Pulsar's ``exposeTopicLevelMetricsInPrometheus``
does; broker-level series carry ``cluster``. Magnetar's own series (per-protocol
connections and requests) are prefixed ``magnetar_``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gateway.admin._stats import Rates

__all__ = ["BrokerCollector", "metrics_registry", "render_metrics", "CONTENT_TYPE_LATEST",
           "LATENCY_QUANTILES"]

#: Pulsar's publish-latency summary quantiles; 0.0 and 1.0 are the window's min and max.
LATENCY_QUANTILES = (0.0, 0.5, 0.95, 0.99, 0.999, 0.9999, 1.0)

_TOPIC = ("cluster", "namespace", "topic")
_SUB = ("cluster", "namespace", "topic", "subscription")


class BrokerCollector(Collector):
    def __init__(self, broker: Any, rates: Rates | None = None):
        self.broker = broker
        self.rates = rates or Rates()

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        cluster = b.cluster
        g = _Families(cluster)
        topics = list(b.topics.values())
        per_ns: dict[str, int] = {}
        broker_backlog = 0
        for t in topics:
            ns = str(t.name.namespace_name)
            per_ns[ns] = per_ns.get(ns, 0) + 1
            lbl = [cluster, ns, str(t.name)]
            subs = list(t.subscriptions.values())
            msg_out, bytes_out = t.dispatched
            key = str(t.name)
            st = t.ml.stats()
            backlogs = {s.name: s.backlog() for s in subs}
            broker_backlog += sum(backlogs.values())
            g.topic("pulsar_subscriptions_count", "Subscriptions of the topic", lbl, len(subs))
            g.topic("pulsar_producers_count", "Producers of the topic", lbl, len(t.producers))
            g.topic("pulsar_consumers_count", "Consumers of the topic", lbl,
                    sum(len(s.consumers) for s in subs))
            g.topic("pulsar_rate_in", "Messages per second published", lbl,
                    self.rates.rate((key, "msg_in"), t.msg_in))
            g.topic("pulsar_rate_out", "Messages per second dispatched", lbl,
                    self.rates.rate((key, "msg_out"), msg_out))
            g.topic("pulsar_throughput_in", "Bytes per second published", lbl,
                    self.rates.rate((key, "bytes_in"), t.bytes_in))
            g.topic("pulsar_throughput_out", "Bytes per second dispatched", lbl,
                    self.rates.rate((key, "bytes_out"), bytes_out))
            g.topic("pulsar_storage_size", "Bytes stored for the topic", lbl, int(st.get("total_size") or 0))
            g.topic("pulsar_storage_backlog_size", "Estimated bytes in the slowest backlog", lbl,
                    t.backlog_bytes())
            # Pulsar's topic backlog is the sum over its subscriptions (NamespaceStatsAggregator:
            # stats.msgBacklog += subscriptionStats.msgBacklog), not the slowest one.
            g.topic("pulsar_msg_backlog", "Entries in backlog, summed over the topic's subscriptions", lbl,
                    sum(backlogs.values()))
            g.topic("pulsar_storage_backlog_quota_limit", "Backlog quota size limit in bytes (-1: none)",
                    lbl, t.backlog_quota().limit_size)
            g.topic("pulsar_storage_write_rate", "Entries per second written", lbl,
                    self.rates.rate((key, "entries"), int(st.get("entries_added") or 0)))
            g.counter("pulsar_in_messages", "Messages published to the topic", _TOPIC, lbl, t.msg_in)
            g.counter("pulsar_in_bytes", "Bytes published to the topic", _TOPIC, lbl, t.bytes_in)
            g.counter("pulsar_out_messages", "Messages dispatched from the topic", _TOPIC, lbl, msg_out)
            g.counter("pulsar_out_bytes", "Bytes dispatched from the topic", _TOPIC, lbl, bytes_out)
            for s in subs:
                sl = lbl + [s.name]
                skey = (key, s.name)
                backlog = backlogs[s.name]
                delayed = s.delayed_messages
                g.sub("pulsar_subscription_back_log", "Entries not yet acknowledged", sl, backlog)
                g.sub("pulsar_subscription_msg_backlog", "Entries not yet acknowledged", sl, backlog)
                g.sub("pulsar_subscription_back_log_no_delayed", "Backlog less delayed messages", sl,
                      max(0, backlog - delayed))
                g.sub("pulsar_subscription_delayed", "Messages waiting for their delivery time", sl, delayed)
                g.sub("pulsar_subscription_msg_rate_redeliver", "Messages per second redelivered", sl,
                      self.rates.rate(skey + ("redelivered",), s.redelivered))
                g.sub("pulsar_subscription_blocked_on_unacked_messages",
                      "1 when dispatch is held by the unacked-messages limit", sl, int(s.blocked_on_unacked))
                g.sub("pulsar_subscription_consumers_count", "Consumers of the subscription", sl,
                      len(s.consumers))
                g.sub("pulsar_subscription_unacked_messages", "Delivered, unacknowledged messages", sl,
                      sum(c.unacked_messages for c in s.consumers))
                g.sub("pulsar_subscription_msg_rate_out", "Messages per second dispatched", sl,
                      self.rates.rate(skey + ("msg",), s.msg_out))
                g.sub("pulsar_subscription_msg_throughput_out", "Bytes per second dispatched", sl,
                      self.rates.rate(skey + ("bytes",), s.bytes_out))
                g.sub("pulsar_subscription_total_msg_expired", "Messages expired by TTL", sl, s.expired)
                dropped = getattr(s, "msg_dropped", None)  # non-persistent subscriptions
                if dropped is not None:
                    g.sub("pulsar_subscription_msg_drop_rate",
                          "Messages per second no consumer could take (non-persistent)", sl,
                          self.rates.rate(skey + ("dropped",), dropped))
                g.counter("pulsar_subscription_out_messages", "Messages dispatched", _SUB, sl, s.msg_out)
        yield from g.families()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            m = GaugeMetricFamily(name, doc, labels=["cluster"])
            m.add_metric([cluster], value)
            return m

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=["cluster"])
            m.add_metric([cluster], value)
            return m

        stats = b.stats
        topics_count = GaugeMetricFamily("pulsar_topics_count", "Loaded topics per namespace",
                                         labels=["cluster", "namespace"])
        for ns, n in sorted(per_ns.items()):
            topics_count.add_metric([cluster, ns], n)
        yield topics_count
        yield gauge("pulsar_broker_topics_count", "Loaded topics", len(topics))
        yield gauge("pulsar_broker_subscriptions_count", "Subscriptions of loaded topics",
                    sum(len(t.subscriptions) for t in topics))
        yield gauge("pulsar_broker_producers_count", "Connected producers", sum(len(t.producers) for t in topics))
        yield gauge("pulsar_broker_consumers_count", "Connected consumers",
                    sum(len(s.consumers) for t in topics for s in t.subscriptions.values()))
        yield gauge("pulsar_broker_rate_in", "Messages per second published",
                    self.rates.rate(("broker", "msg_in"), stats.in_messages))
        yield gauge("pulsar_broker_rate_out", "Messages per second dispatched",
                    self.rates.rate(("broker", "msg_out"), stats.out_messages))
        yield gauge("pulsar_broker_throughput_in", "Bytes per second published",
                    self.rates.rate(("broker", "bytes_in"), stats.in_bytes))
        yield gauge("pulsar_broker_throughput_out", "Bytes per second dispatched",
                    self.rates.rate(("broker", "bytes_out"), stats.out_bytes))
        yield gauge("pulsar_broker_storage_size", "Bytes stored for loaded topics",
                    sum(int(t.ml.stats().get("total_size") or 0) for t in topics))
        yield gauge("pulsar_broker_msg_backlog", "Entries in backlog over loaded topics' subscriptions",
                    broker_backlog)
        yield counter("pulsar_broker_in_messages", "Messages published", stats.in_messages)
        yield counter("pulsar_broker_out_messages", "Messages dispatched", stats.out_messages)
        yield counter("pulsar_broker_in_bytes", "Bytes published", stats.in_bytes)
        yield counter("pulsar_broker_out_bytes", "Bytes dispatched", stats.out_bytes)
        yield counter("pulsar_broker_in_entries", "Entries stored", stats.in_entries)

        latency = Metric("pulsar_broker_publish_latency",
                         "Publish latency: from a batch reaching storage to it being durable (ms)",
                         "summary")
        for q, v in stats.publish_latency_quantiles(LATENCY_QUANTILES).items():
            latency.add_sample("pulsar_broker_publish_latency", {"cluster": cluster, "quantile": str(q)}, v)
        latency.add_sample("pulsar_broker_publish_latency_count", {"cluster": cluster},
                           stats.publish_latency_count)
        latency.add_sample("pulsar_broker_publish_latency_sum", {"cluster": cluster},
                           stats.publish_latency_sum_ms)
        yield latency

        opened = CounterMetricFamily("magnetar_connections_opened", "Connections accepted per protocol",
                                     labels=["cluster", "protocol"])
        active = GaugeMetricFamily("magnetar_connections_active", "Open connections per protocol",
                                   labels=["cluster", "protocol"])
        requests = CounterMetricFamily("magnetar_requests", "Requests handled per protocol",
                                       labels=["cluster", "protocol"])
        for proto, n in sorted(stats.connections_opened.items()):
            opened.add_metric([cluster, proto], n)
        for proto, n in sorted(stats.connections_active.items()):
            active.add_metric([cluster, proto], n)
        for proto, n in sorted(stats.requests.items()):
            requests.add_metric([cluster, proto], n)
        yield opened
        yield active
        yield requests
        yield from _protocol_families(cluster, stats.protocol_series)
        yield from _bookie_families(cluster, getattr(self.broker, "bookies", []))


def _protocol_families(cluster: str, sources: dict[str, Any]) -> Iterator[Metric]:
    """The series protocol handlers keep of their own (``BrokerStats.protocol_series``)."""
    families: dict[str, Metric] = {}
    for _, source in sorted(sources.items()):
        for s in source():
            m = families.get(s.name)
            if m is None:
                names = ["cluster", *(k for k, _ in s.labels)]
                cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                m = families[s.name] = cls(s.name, s.doc, labels=names)
            m.add_metric([cluster, *(v for _, v in s.labels)], s.value)  # type: ignore[attr-defined]
    yield from families.values()


def _bookie_families(cluster: str, bookies: list[Any]) -> Iterator[Metric]:
    """The journal of each in-process bookie: group commits, entries, bytes, and its
    fdatasync latency (BookKeeper's JOURNAL_SYNC, as a summary in milliseconds)."""
    labels = ["cluster", "bookie"]
    groups = CounterMetricFamily("bookie_journal_JOURNAL_GROUP_COMMITS", "Journal group commits", labels=labels)
    records = CounterMetricFamily("bookie_journal_JOURNAL_ADD_ENTRY", "Journal records written", labels=labels)
    written = CounterMetricFamily("bookie_journal_JOURNAL_WRITE_BYTES", "Journal bytes written", labels=labels)
    sync_max = GaugeMetricFamily("bookie_journal_JOURNAL_SYNC_max", "Longest journal fdatasync (ms)",
                                 labels=labels)
    sync = Metric("bookie_journal_JOURNAL_SYNC", "Journal fdatasync latency (ms)", "summary")
    for bookie in bookies:
        st = bookie.stats()
        if not st:
            continue
        values = [cluster, bookie.address]
        groups.add_metric(values, st["journal_batches"])
        records.add_metric(values, st["journal_records"])
        written.add_metric(values, st["journal_bytes"])
        sync_max.add_metric(values, st["journal_sync_micros_max"] / 1000.0)
        sync.add_sample("bookie_journal_JOURNAL_SYNC_count", dict(zip(labels, values, strict=True)),
                        st["journal_syncs"])
        sync.add_sample("bookie_journal_JOURNAL_SYNC_sum", dict(zip(labels, values, strict=True)),
                        st["journal_sync_micros_total"] / 1000.0)
    yield from (groups, records, written, sync, sync_max)


class _Families:
    """Topic- and subscription-level families, created on first use, in a stable order."""

    def __init__(self, cluster: str):
        self.cluster = cluster
        self._families: dict[str, Metric] = {}

    def _get(self, name: str, doc: str, labels: tuple[str, ...], kind: str) -> Metric:
        m = self._families.get(name)
        if m is None:
            if kind == "counter":
                m = CounterMetricFamily(name, doc, labels=list(labels))
            else:
                m = GaugeMetricFamily(name, doc, labels=list(labels))
            self._families[name] = m
        return m

    def topic(self, name: str, doc: str, labels: list[str], value: float) -> None:
        m = self._get(name, doc, _TOPIC, "gauge")
        m.add_metric(labels, value)  # type: ignore[attr-defined]

    def sub(self, name: str, doc: str, labels: list[str], value: float) -> None:
        m = self._get(name, doc, _SUB, "gauge")
        m.add_metric(labels, value)  # type: ignore[attr-defined]

    def counter(self, name: str, doc: str, label_names: tuple[str, ...], labels: list[str], value: float) -> None:
        m = self._get(name, doc, label_names, "counter")
        m.add_metric(labels, value)  # type: ignore[attr-defined]

    def families(self) -> Iterator[Metric]:
        yield from self._families.values()


def metrics_registry(broker: Any, rates: Rates | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, rates))
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
