"""``/metrics`` scraped and parsed with prometheus_client's parser: Pulsar's names and
labels, values matching what real clients produced and consumed."""

from __future__ import annotations

from datetime import timedelta

import pulsar

from gateway._admin_cli import AdminClient
from tests._metrics import Samples, sample, scrape_url
from tests._standalone import Standalone

from .conftest import wait_for


def scrape(server: Standalone, path: str = "/metrics") -> Samples:
    content_type, samples = scrape_url(server.addresses["web"][0] + path)
    assert content_type.startswith("text/plain")
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return sample(samples, name, **labels)


def test_metrics_follow_real_traffic(server: Standalone, admin: AdminClient, ns: str,
                                     client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/m"
    before = scrape(server)
    in_before = value(before, "pulsar_broker_in_messages_total", cluster="standalone")
    out_before = value(before, "pulsar_broker_out_messages_total", cluster="standalone")
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(12):
        producer.send(b"y" * 50)
    for _ in range(4):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    path = f"/admin/v2/persistent/{ns}/m"
    wait_for(lambda: admin.get(f"{path}/stats")["subscriptions"]["sub"]["msgBacklog"] == 8)

    m = scrape(server, "/metrics/")
    t = {"cluster": "standalone", "namespace": ns, "topic": topic}
    assert value(m, "pulsar_in_messages_total", **t) == 12
    assert value(m, "pulsar_out_messages_total", **t) == 12
    assert value(m, "pulsar_in_bytes_total", **t) >= 12 * 50
    assert value(m, "pulsar_producers_count", **t) == 1
    assert value(m, "pulsar_consumers_count", **t) == 1
    assert value(m, "pulsar_subscriptions_count", **t) == 1
    assert value(m, "pulsar_subscription_back_log", subscription="sub", **t) == 8
    assert value(m, "pulsar_msg_backlog", **t) == 8
    assert value(m, "pulsar_storage_size", **t) >= 12 * 50
    assert value(m, "pulsar_rate_in", **t) >= 0
    assert value(m, "pulsar_rate_out", **t) >= 0
    assert value(m, "pulsar_broker_in_messages_total", cluster="standalone") == in_before + 12
    assert value(m, "pulsar_broker_out_messages_total", cluster="standalone") == out_before + 12
    assert value(m, "pulsar_broker_in_bytes_total", cluster="standalone") >= 12 * 50
    assert value(m, "pulsar_broker_out_bytes_total", cluster="standalone") >= 12 * 50
    assert value(m, "pulsar_topics_count", cluster="standalone", namespace=ns) == 1
    quantiles = {lbl["quantile"]: v for lbl, v in m["pulsar_broker_publish_latency"]}
    # Pulsar's set, with the window's min and max as 0.0 and 1.0
    assert set(quantiles) == {"0.0", "0.5", "0.95", "0.99", "0.999", "0.9999", "1.0"}
    ordered = [quantiles[q] for q in ("0.0", "0.5", "0.95", "0.99", "0.999", "0.9999", "1.0")]
    assert 0 < ordered[0] and ordered == sorted(ordered)
    assert quantiles["0.0"] < quantiles["1.0"] or quantiles["0.0"] == quantiles["0.5"] == quantiles["1.0"]
    assert value(m, "pulsar_broker_publish_latency_count", cluster="standalone") >= 12
    producer.close()
    consumer.close()


def test_topic_backlog_is_the_sum_of_its_subscriptions(server: Standalone, admin: AdminClient, ns: str,
                                                      client: pulsar.Client) -> None:
    """Pulsar's msgBacklog of a topic adds up its subscriptions' (not the slowest one's)."""
    topic = f"persistent://{ns}/summed"
    fast = client.subscribe(topic, "fast")
    client.subscribe(topic, "slow")
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(10):
        producer.send(b"z")
    for _ in range(4):
        fast.acknowledge(fast.receive(timeout_millis=10_000))
    path = f"/admin/v2/persistent/{ns}/summed"
    wait_for(lambda: admin.get(f"{path}/stats")["subscriptions"]["fast"]["msgBacklog"] == 6)

    m = scrape(server)
    t = {"cluster": "standalone", "namespace": ns, "topic": topic}
    assert value(m, "pulsar_subscription_back_log", subscription="slow", **t) == 10
    assert value(m, "pulsar_msg_backlog", **t) == 16
    every_subscription = sum(v for _, v in m["pulsar_subscription_back_log"])
    assert value(m, "pulsar_broker_msg_backlog", cluster="standalone") == every_subscription


def test_delayed_messages_per_subscription(server: Standalone, admin: AdminClient, ns: str,
                                           client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/delayed"
    client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"now")
    for _ in range(3):
        producer.send(b"later", deliver_after=timedelta(hours=1))
    path = f"/admin/v2/persistent/{ns}/delayed"
    wait_for(lambda: admin.get(f"{path}/stats")["subscriptions"]["s"]["msgDelayed"] == 3)

    m = scrape(server)
    s = {"cluster": "standalone", "namespace": ns, "topic": topic, "subscription": "s"}
    assert value(m, "pulsar_subscription_delayed", **s) == 3
    backlog = value(m, "pulsar_subscription_back_log", **s)
    assert backlog == 4  # the prompt message is delivered but not acknowledged
    assert value(m, "pulsar_subscription_back_log_no_delayed", **s) == backlog - 3


def test_redelivery_rate_per_subscription(server: Standalone, ns: str, client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/redeliver"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    s = {"cluster": "standalone", "namespace": ns, "topic": topic, "subscription": "s"}
    assert value(scrape(server), "pulsar_subscription_msg_rate_redeliver", **s) == 0
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(5):
        producer.send(b"r")
    for _ in range(5):
        consumer.receive(timeout_millis=10_000)
    consumer.redeliver_unacknowledged_messages()
    wait_for(lambda: value(scrape(server), "pulsar_subscription_msg_rate_redeliver", **s) > 0)


def test_subscription_blocked_on_unacked_messages(server: Standalone, admin: AdminClient, ns: str,
                                                  client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/blocked"
    path = f"/admin/v2/persistent/{ns}/blocked"
    consumer = client.subscribe(topic, "held", consumer_type=pulsar.ConsumerType.Shared)
    client.subscribe(topic, "idle", consumer_type=pulsar.ConsumerType.Shared).close()  # nothing in flight
    admin.post(path + "/maxUnackedMessagesOnSubscription", 4)
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(10):
        producer.send(b"b")
    for _ in range(4):
        consumer.receive(timeout_millis=10_000)
    wait_for(lambda: admin.get(f"{path}/stats")["subscriptions"]["held"]["blockedSubscriptionOnUnackedMsgs"])

    m = scrape(server)
    t = {"cluster": "standalone", "namespace": ns, "topic": topic}
    assert value(m, "pulsar_subscription_blocked_on_unacked_messages", subscription="held", **t) == 1
    assert value(m, "pulsar_subscription_blocked_on_unacked_messages", subscription="idle", **t) == 0


def test_backlog_quota_limit_is_the_effective_quota(server: Standalone, admin: AdminClient, ns: str,
                                                    client: pulsar.Client) -> None:
    client.subscribe(f"persistent://{ns}/unlimited", "s")
    client.subscribe(f"persistent://{ns}/quota", "s")
    admin.post(f"/admin/v2/persistent/{ns}/quota/backlogQuota",
               {"limitSize": 10 * 1024 * 1024, "policy": "producer_request_hold"})
    limit = "pulsar_storage_backlog_quota_limit"
    labels = {"cluster": "standalone", "namespace": ns}
    wait_for(lambda: value(scrape(server), limit, topic=f"persistent://{ns}/quota", **labels) == 10 * 1024 * 1024)
    # No quota anywhere: the broker default, backlogQuotaDefaultLimitGB=-1, no limit.
    assert value(scrape(server), limit, topic=f"persistent://{ns}/unlimited", **labels) == -1


def test_alert_and_dashboard_expressions_have_series(server: Standalone, ns: str, client: pulsar.Client) -> None:
    """The seed's alert rules and Grafana panels select these series."""
    client.subscribe(f"persistent://{ns}/a", "s").close()
    m = scrape(server)
    for name in ("pulsar_broker_publish_latency", "pulsar_subscription_back_log",
                 "pulsar_subscription_delayed", "pulsar_subscription_msg_rate_redeliver",
                 "pulsar_subscription_blocked_on_unacked_messages", "pulsar_subscription_back_log_no_delayed",
                 "pulsar_storage_backlog_quota_limit",
                 "pulsar_broker_in_messages_total", "pulsar_broker_out_messages_total",
                 "pulsar_broker_in_bytes_total", "pulsar_broker_out_bytes_total", "pulsar_storage_size"):
        assert m.get(name), name


def test_http_requests_are_counted(server: Standalone, admin: AdminClient) -> None:
    first = value(scrape(server), "magnetar_requests_total", cluster="standalone", protocol="http")
    admin.get("/admin/v2/clusters")
    second = value(scrape(server), "magnetar_requests_total", cluster="standalone", protocol="http")
    assert second == first + 2  # the admin call and the second scrape


def test_bookie_journal_metrics_count_durable_adds(server: Standalone, ns: str,
                                                   client: pulsar.Client) -> None:
    bookie = server.addresses["bookies"][0]
    before = scrape(server)
    syncs_before = value(before, "bookie_journal_JOURNAL_SYNC_count", bookie=bookie)
    adds_before = value(before, "bookie_journal_JOURNAL_ADD_ENTRY_total", bookie=bookie)
    producer = client.create_producer(f"persistent://{ns}/journal", batching_enabled=False)
    for _ in range(5):
        producer.send(b"durable")
    after = scrape(server)
    assert value(after, "bookie_journal_JOURNAL_ADD_ENTRY_total", bookie=bookie) >= adds_before + 5
    assert value(after, "bookie_journal_JOURNAL_SYNC_count", bookie=bookie) > syncs_before
    assert value(after, "bookie_journal_JOURNAL_SYNC_sum", bookie=bookie) > 0


def test_connections_and_requests_are_counted_per_protocol(server: Standalone, client: pulsar.Client,
                                                           ns: str) -> None:
    import socket
    import struct

    client.create_producer(f"persistent://{ns}/counted").send(b"x")
    # One Kafka ApiVersions v0 request over a raw socket.
    host, port = server.addresses["kafka"][0].removeprefix("PLAINTEXT://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        body = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", sock.recv(4))
        assert size > 0
        m = scrape(server)
        assert value(m, "magnetar_connections_active", protocol="kafka") >= 1
    assert value(m, "magnetar_connections_active", protocol="pulsar") >= 1
    assert value(m, "magnetar_requests_total", protocol="pulsar") >= 3
    assert value(m, "magnetar_requests_total", protocol="kafka") >= 1
    assert value(m, "magnetar_connections_opened_total", protocol="kafka") >= 1


def test_out_counters_keep_what_removed_subscriptions_dispatched(
        server: Standalone, admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    """As Pulsar's topic counters: unsubscribing one subscription does not take back what it
    was sent (a counter that went down would read as a reset to Prometheus' rate())."""
    topic = f"persistent://{ns}/gone-subs"
    consumers = [client.subscribe(topic, name) for name in ("a", "b")]
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(10):
        producer.send(b"z" * 20)
    for c in consumers:
        for _ in range(10):
            c.acknowledge(c.receive(timeout_millis=10_000))
    path = f"/admin/v2/persistent/{ns}/gone-subs/stats"
    before = admin.get(path)
    sent = before["bytesOutCounter"]
    assert before["msgOutCounter"] == 20 and sent >= 20 * 20
    consumers[1].unsubscribe()
    after = admin.get(path)
    assert list(after["subscriptions"]) == ["a"]
    assert (after["msgOutCounter"], after["bytesOutCounter"]) == (20, sent)
    m = scrape(server)
    t = {"cluster": "standalone", "namespace": ns, "topic": topic}
    assert (value(m, "pulsar_out_messages_total", **t), value(m, "pulsar_out_bytes_total", **t)) == (20, sent)
