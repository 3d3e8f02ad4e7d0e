"""Topics over REST against a real broker: creation, partitions, listing, deletion,
stats shapes and counters after real pulsar-client traffic, lookup, terminate, unload,
topic-level policies."""

from __future__ import annotations

import pulsar
import pytest

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

from .conftest import status_of, wait_for


def _topic(ns: str, name: str = "t") -> tuple[str, str]:
    return f"persistent://{ns}/{name}", f"/admin/v2/persistent/{ns}/{name}"


def test_create_list_delete(admin: AdminClient, ns: str) -> None:
    full, path = _topic(ns)
    admin.put(path)
    assert status_of(admin.put, path) == (409, "This topic already exists")
    assert admin.get(f"/admin/v2/persistent/{ns}") == [full]
    assert admin.get(f"{path}/partitions") == {"partitions": 0, "deleted": False}
    admin.delete(path)
    assert admin.get(f"/admin/v2/persistent/{ns}") == []
    assert status_of(admin.delete, path)[0] == 404
    assert status_of(admin.get, f"{path}/stats") == (404, "Topic not found")


def test_bad_names_and_missing_namespaces(admin: AdminClient, ns: str) -> None:
    assert status_of(admin.put, f"/admin/v2/persistent/{ns.split('/')[0]}/nope/t")[0] == 404
    assert status_of(admin.put, "/admin/v2/persistent/no-such-tenant/ns/t")[0] == 404
    assert status_of(admin.get, "/admin/v2/persistent/bad%20tenant/ns/t/stats")[0] == 412


def test_partitioned_topics(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns, "p")
    admin.put(f"{path}/partitions", 2)
    assert status_of(admin.put, f"{path}/partitions", 2)[0] == 409
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/q/partitions", 0) == (
        406, "Number of partitions should be more than 0")
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/q/partitions", "two")[0] == 400
    assert admin.get(f"{path}/partitions")["partitions"] == 2
    assert admin.get(f"/admin/v2/persistent/{ns}/partitioned") == [full]
    admin.post(f"{path}/partitions", 3)
    assert status_of(admin.post, f"{path}/partitions", 2)[0] == 409
    assert admin.get(f"/admin/v2/persistent/{ns}") == [f"{full}-partition-{i}" for i in range(3)]
    producer = client.create_producer(full)
    for i in range(9):
        producer.send(f"m{i}".encode(), partition_key=str(i))
    producer.close()
    stats = admin.get(f"{path}/partitioned-stats", perPartition="true")
    assert stats["metadata"]["partitions"] == 3
    assert stats["msgInCounter"] == 9
    assert sum(p["msgInCounter"] for p in stats["partitions"].values()) == 9
    assert status_of(admin.get, f"{path}/stats")[0] == 404
    admin.delete(f"{path}/partitions")
    assert admin.get(f"/admin/v2/persistent/{ns}/partitioned") == []


def test_stats_count_real_traffic(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns)
    consumer = client.subscribe(full, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(full, producer_name="prod-1", batching_enabled=False)
    for _ in range(20):
        producer.send(b"x" * 100)
    for _ in range(5):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    stats = wait_for(lambda: (st := admin.get(f"{path}/stats"))["subscriptions"]["sub"]["msgBacklog"] == 15 and st)
    assert stats["msgInCounter"] == 20
    assert stats["bytesInCounter"] >= 2000
    assert stats["storageSize"] >= 2000
    assert [p["producerName"] for p in stats["publishers"]] == ["prod-1"]
    assert stats["publishers"][0]["accessMode"] == "Shared"
    sub = stats["subscriptions"]["sub"]
    assert sub["type"] == "Shared"
    assert sub["msgBacklog"] == 15
    assert sub["msgOutCounter"] == 20  # all were dispatched to the consumer's queue
    assert len(sub["consumers"]) == 1
    assert sub["consumers"][0]["unackedMessages"] == 15
    assert stats["deduplicationStatus"] == "Disabled"
    internal = admin.get(f"{path}/internalStats")
    assert internal["numberOfEntries"] == 20
    assert internal["entriesAddedCounter"] == 20
    assert internal["state"] == "LedgerOpened"
    assert set(internal["cursors"]) == {"sub"}
    assert internal["lastConfirmedEntry"].endswith(":19")
    last = admin.get(f"{path}/lastMessageId")
    assert f"{last['ledgerId']}:{last['entryId']}" == internal["lastConfirmedEntry"]
    assert status_of(admin.delete, path)[0] == 412  # clients connected
    producer.close()
    consumer.close()


def test_delete_with_force_disconnects(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns)
    producer = client.create_producer(full)
    producer.send(b"a")
    admin.delete(path, force="true")
    # The disconnected producer may reconnect and, with auto-creation on, create the
    # topic anew: either way the old data is gone.
    if admin.get(f"/admin/v2/persistent/{ns}") == [full]:
        assert admin.get(f"{path}/internalStats")["numberOfEntries"] == 0
    producer.close()


def test_lookup(admin: AdminClient, ns: str, server: Standalone) -> None:
    _, path = _topic(ns)
    admin.put(path)
    data = admin.get(f"/lookup/v2/topic/persistent/{ns}/t")
    assert data["brokerUrl"] == server.pulsar_url
    assert data["httpUrl"] == server.addresses["web"][0]


def test_terminate_refuses_new_messages(admin: AdminClient, ns: str, server: Standalone) -> None:
    full, path = _topic(ns)
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=2)
    try:
        producer = client.create_producer(full, batching_enabled=False, send_timeout_millis=2000)
        mid = producer.send(b"last")
        got = admin.post(f"{path}/terminate")
        assert (got["ledgerId"], got["entryId"]) == (mid.ledger_id(), mid.entry_id())
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after")
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(full)
    finally:
        client.close()
    assert admin.get(f"{path}/stats")["msgInCounter"] == 1
    assert admin.get(f"{path}/internalStats")["state"] == "Terminated"


def test_unload_and_reconnect(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns)
    producer = client.create_producer(full, batching_enabled=False)
    consumer = client.subscribe(full, "s")
    producer.send(b"before")
    admin.put(f"{path}/unload")
    producer.send(b"after")  # the client reconnects to the reloaded topic
    got = {consumer.receive(timeout_millis=10_000).data() for _ in range(2)}
    assert got == {b"before", b"after"}
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/never/unload")[0] == 404


def test_topic_epoch_counts_the_exclusive_producers(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns)
    client.create_producer(full).close()
    assert "topicEpoch" not in admin.get(f"{path}/stats")  # no exclusive producer yet
    exclusive = pulsar.ProducerAccessMode.Exclusive
    client.create_producer(full, access_mode=exclusive).close()
    assert admin.get(f"{path}/stats")["topicEpoch"] == 0
    producer = client.create_producer(full, access_mode=exclusive, batching_enabled=False)
    assert admin.get(f"{path}/stats")["topicEpoch"] == 1
    admin.put(f"{path}/unload")
    producer.send(b"after")  # it reconnects with its epoch and keeps the topic
    assert admin.get(f"{path}/stats")["topicEpoch"] == 1
    producer.close()
    fencing = client.create_producer(full, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
    assert admin.get(f"{path}/stats")["topicEpoch"] == 2
    fencing.close()


def test_topic_level_policies(admin: AdminClient, ns: str) -> None:
    _, path = _topic(ns)
    admin.put(path)
    admin.post(f"{path}/messageTTL", messageTTL=3600)
    assert admin.get(f"{path}/messageTTL") == 3600
    admin.post(f"{path}/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100})
    assert admin.get(f"{path}/retention") == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
    admin.post(f"/admin/v2/namespaces/{ns}/maxProducersPerTopic", 4)
    assert admin.get(f"{path}/maxProducers") is None
    assert admin.get(f"{path}/maxProducers", applied="true") == 4
    admin.post(f"{path}/backlogQuota", {"limitSize": 1000, "policy": "producer_request_hold"})
    assert admin.get(f"{path}/backlogQuotaMap")["destination_storage"]["limitSize"] == 1000
    admin.delete(f"{path}/messageTTL")
    assert admin.get(f"{path}/messageTTL") is None
    assert status_of(admin.post, f"{path}/messageTTL", messageTTL="abc")[0] == 400


def test_applied_policies_fall_back_to_the_broker(admin: AdminClient, ns: str) -> None:
    """With applied=true a topic's policy is its own, else its namespace's, else the
    broker's config (Pulsar's answer, where it used to be null)."""
    _, path = _topic(ns)
    admin.put(path)
    assert admin.get(f"{path}/messageTTL") is None
    assert admin.get(f"{path}/messageTTL", applied="true") == 0  # ttlDurationDefaultInSeconds
    assert admin.get(f"{path}/retention", applied="true") == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    assert admin.get(f"{path}/maxProducers", applied="true") == 0
    assert admin.get(f"{path}/maxUnackedMessagesOnConsumer", applied="true") == 50000
    assert admin.get(f"{path}/deduplicationEnabled", applied="true") is False
    assert admin.get(f"{path}/persistence", applied="true") == {
        "bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1,
        "managedLedgerMaxMarkDeleteRate": 1.0}
    assert admin.get(f"{path}/backlogQuotaMap", applied="true") == {"destination_storage": {
        "limit": -1, "limitSize": -1, "limitTime": -1, "policy": "producer_request_hold"}}
    admin.post(f"/admin/v2/namespaces/{ns}/messageTTL", 600)
    assert admin.get(f"{path}/messageTTL", applied="true") == 600
    admin.post(f"{path}/messageTTL", messageTTL=60)
    assert admin.get(f"{path}/messageTTL", applied="true") == 60


def test_topic_retention_and_quota_must_agree(admin: AdminClient, ns: str) -> None:
    """As in Pulsar, a topic's retention must exceed the backlog quota that applies to it
    (its own, else its namespace's), and a quota set later must stay below the retention
    that applies (its own, else its namespace's)."""
    _, path = _topic(ns)
    admin.put(path)
    admin.post(f"/admin/v2/namespaces/{ns}/backlogQuota", {"limitSize": 100 * 1024 ** 2, "policy": "producer_exception"})
    assert status_of(admin.post, f"{path}/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 50}) == \
        (412, "Retention Quota must exceed configured backlog quota for topic. Please increase retention quota "
              "and retry")
    admin.post(f"{path}/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 200})
    assert status_of(admin.post, f"{path}/backlogQuota",
                     {"limitSize": 300 * 1024 ** 2, "policy": "producer_exception"}) == \
        (412, "Backlog Quota exceeds configured retention quota for topic. Please increase retention quota and retry")
    assert admin.get(f"{path}/backlogQuotaMap") == {}
    admin.post(f"{path}/backlogQuota", {"limitSize": 150 * 1024 ** 2, "policy": "producer_exception"})
    assert admin.get(f"{path}/backlogQuotaMap")["destination_storage"]["limitSize"] == 150 * 1024 ** 2


def test_compaction_keeps_latest_per_key(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns)
    admin.put(path)
    assert admin.get(f"{path}/compaction") == {"status": "NOT_RUN", "lastError": ""}
    producer = client.create_producer(full, batching_enabled=False)
    for key, value in [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("b", b"2")]:
        producer.send(value, partition_key=key)
    producer.send(b"", partition_key="c")  # an empty value deletes c, as a null one would
    producer.send(b"no-key")
    producer.close()
    admin.put(f"{path}/compaction")
    wait_for(lambda: admin.get(f"{path}/compaction")["status"] == "SUCCESS")
    stats = admin.get(f"{path}/stats")
    # as Pulsar counts: a and b replaced once each, c's tombstone, the message without key
    assert stats["compaction"]["lastCompactionRemovedEventCount"] == 4
    reader = client.create_reader(full, pulsar.MessageId.earliest, is_read_compacted=True)
    assert [reader.read_next(5000).data() for _ in range(2)] == [b"2", b"2"]
    with pytest.raises(pulsar.Timeout):
        reader.read_next(500)
    reader.close()
    assert stats["compaction"]["lastCompactionSucceedTimestamp"] > 0


def test_a_compacted_topic_lists_the_compaction_subscription(admin: AdminClient, ns: str,
                                                            client: pulsar.Client) -> None:
    full, path = _topic(ns)
    producer = client.create_producer(full, batching_enabled=False)
    for key, value in [("a", b"1"), ("a", b"2")]:
        producer.send(value, partition_key=key)
    client.subscribe(full, "s").close()
    assert admin.get(f"{path}/subscriptions") == ["s"]
    admin.put(f"{path}/compaction")
    wait_for(lambda: admin.get(f"{path}/compaction")["status"] == "SUCCESS")
    assert admin.get(f"{path}/subscriptions") == ["__compaction", "s"]
    compactor = admin.get(f"{path}/stats")["subscriptions"]["__compaction"]
    assert compactor["consumers"] == [] and compactor["isDurable"] is True

    def compacted() -> list[bytes]:
        reader = client.create_reader(full, pulsar.MessageId.earliest, is_read_compacted=True)
        got = []
        with pytest.raises(pulsar.Timeout):
            while True:
                got.append(reader.read_next(1000).data())
        reader.close()
        return got

    assert compacted() == [b"2"]
    # As in Pulsar, deleting it drops the compacted view; the next compaction makes a new one.
    admin.delete(f"{path}/subscription/__compaction")
    assert admin.get(f"{path}/subscriptions") == ["s"]
    assert "__compaction" not in admin.get(f"{path}/stats")["subscriptions"]
    assert compacted() == [b"1", b"2"]
    assert status_of(admin.delete, f"{path}/subscription/__compaction") == (404, "Subscription not found")
    producer.send(b"3", partition_key="a")
    admin.put(f"{path}/compaction")
    wait_for(lambda: "__compaction" in admin.get(f"{path}/subscriptions"))
    wait_for(lambda: admin.get(f"{path}/compaction")["status"] == "SUCCESS")
    assert compacted() == [b"3"]
    producer.close()


def test_compacting_a_partitioned_topic_compacts_each_partition(admin: AdminClient, ns: str,
                                                               client: pulsar.Client) -> None:
    full, path = _topic(ns)
    admin.put(f"{path}/partitions", 2)
    producer = client.create_producer(full, batching_enabled=False)
    for key, value in [("a", b"1"), ("b", b"1"), ("a", b"2"), ("b", b"2"), ("c", b"1")]:
        producer.send(value, partition_key=key)
    producer.close()
    admin.put(f"{path}/compaction")
    for i in range(2):
        wait_for(lambda i=i: admin.get(f"{path}-partition-{i}/compaction")["status"] == "SUCCESS")
    consumer = client.subscribe(full, "compacted", is_read_compacted=True,
                                initial_position=pulsar.InitialPosition.Earliest)
    got = []
    with pytest.raises(pulsar.Timeout):
        while True:
            got.append(consumer.receive(2000).partition_key())
    assert sorted(got) == ["a", "b", "c"]


@pytest.mark.parametrize("scope", ["namespace", "topic"])
def test_a_compaction_threshold_compacts_without_a_request(admin: AdminClient, ns: str,
                                                           client: pulsar.Client, scope: str) -> None:
    full, path = _topic(ns)
    admin.put(path)
    producer = client.create_producer(full, batching_enabled=False)
    for key, value in [("a", b"1"), ("b", b"1"), ("a", b"2")]:
        producer.send(value, partition_key=key)
    where = f"/admin/v2/namespaces/{ns}" if scope == "namespace" else path
    admin.post(f"{where}/compactionThreshold", 1)
    assert admin.get(f"{where}/compactionThreshold") == 1
    # The broker's monitor starts it: past 1 byte since the last compaction (none yet).
    wait_for(lambda: admin.get(f"{path}/compaction")["status"] == "SUCCESS")
    assert admin.get(f"{path}/stats")["compaction"]["lastCompactionRemovedEventCount"] == 1
    reader = client.create_reader(full, pulsar.MessageId.earliest, is_read_compacted=True)
    assert [reader.read_next(5000).data() for _ in range(2)] == [b"1", b"2"]  # b's, then a's latest
    reader.close()
    # Later messages pass the threshold again, and the next run covers them too.
    producer.send(b"3", partition_key="b")
    wait_for(lambda: admin.get(f"{path}/stats")["compaction"]["lastCompactionRemovedEventCount"] == 2)
    producer.close()


def test_retention_change_reloads_loaded_topics(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns)
    producer = client.create_producer(full, batching_enabled=False)
    consumer = client.subscribe(full, "s")
    producer.send(b"one")
    admin.post(f"/admin/v2/namespaces/{ns}/retention", {"retentionTimeInMinutes": 10, "retentionSizeInMB": 10})
    producer.send(b"two")  # the producer reconnected to the reloaded topic
    assert {consumer.receive(timeout_millis=10_000).data() for _ in range(2)} == {b"one", b"two"}
    assert admin.get(f"{path}/stats")["msgInCounter"] == 1  # counters restart with the reload


def test_namespace_unload_and_clear_backlog(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    for name in ("x", "y"):
        admin.put(f"/admin/v2/persistent/{ns}/{name}")
        admin.put(f"/admin/v2/persistent/{ns}/{name}/subscription/s")
        producer = client.create_producer(f"persistent://{ns}/{name}")
        producer.send(b"m")
        producer.close()
    admin.post(f"/admin/v2/namespaces/{ns}/clearBacklog")
    for name in ("x", "y"):
        assert admin.get(f"/admin/v2/persistent/{ns}/{name}/stats")["subscriptions"]["s"]["msgBacklog"] == 0
    admin.put(f"/admin/v2/namespaces/{ns}/unload")
    assert admin.get(f"/admin/v2/persistent/{ns}/x/subscriptions") == ["s"]  # reloaded on demand
    admin.post(f"/admin/v2/namespaces/{ns}/unsubscribe/s")
    assert admin.get(f"/admin/v2/persistent/{ns}/y/subscriptions") == []


def test_partitioned_subscription_operations(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    full, path = _topic(ns, "pp")
    admin.put(f"{path}/partitions", 2)
    admin.put(f"{path}/subscription/s", {"ledgerId": -1, "entryId": -1})
    assert admin.get(f"{path}/subscriptions") == ["s"]
    producer = client.create_producer(full, batching_enabled=False)
    for i in range(6):
        producer.send(b"m", partition_key=str(i))
    producer.close()
    assert admin.get(f"{path}/partitioned-stats")["subscriptions"]["s"]["msgBacklog"] == 6
    admin.post(f"{path}/subscription/s/skip_all")
    assert admin.get(f"{path}/partitioned-stats")["subscriptions"]["s"]["msgBacklog"] == 0
    admin.post(f"{path}/subscription/s/resetcursor/0")
    assert admin.get(f"{path}/partitioned-stats")["subscriptions"]["s"]["msgBacklog"] == 6
    lookups = admin.get(f"{path}/lookup/partitions")
    assert sorted(lookups) == [f"{full}-partition-0", f"{full}-partition-1"]


def test_non_persistent_domain(admin: AdminClient, ns: str) -> None:
    admin.put(f"/admin/v2/non-persistent/{ns}/np")
    assert admin.get(f"/admin/v2/non-persistent/{ns}") == [f"non-persistent://{ns}/np"]
    assert admin.get(f"/admin/v2/persistent/{ns}") == []
    assert admin.get(f"/admin/v2/non-persistent/{ns}/np/stats")["msgInCounter"] == 0


def test_non_persistent_drops_show_as_a_drop_rate(admin: AdminClient, ns: str, server: Standalone,
                                                  client: pulsar.Client) -> None:
    from tests.admin.test_metrics import scrape

    topic, path = f"non-persistent://{ns}/np-drops", f"/admin/v2/non-persistent/{ns}/np-drops"
    client.subscribe(topic, "slow", receiver_queue_size=10)  # takes 10 and reads none
    producer = client.create_producer(topic, batching_enabled=False)
    before = admin.get(f"{path}/stats")
    assert before["msgDropRate"] == 0 and before["subscriptions"]["slow"]["msgDropRate"] == 0
    for i in range(200):
        producer.send(f"m{i}".encode())
    after = admin.get(f"{path}/stats")
    assert after["msgDropRate"] > 0 and after["subscriptions"]["slow"]["msgDropRate"] > 0
    series = scrape(server)["pulsar_subscription_msg_drop_rate"]
    assert any(labels["topic"] == topic and labels["subscription"] == "slow" for labels, _ in series)


@pytest.mark.parametrize("local", ["a/b/c", "a%2Fb", "sp ace", "x:y=z"])
def test_local_names_with_special_characters(admin: AdminClient, ns: str, client: pulsar.Client,
                                             local: str) -> None:
    from urllib.parse import quote

    full = f"persistent://{ns}/{local}"
    path = f"/admin/v2/persistent/{ns}/{quote(local, safe='')}"
    admin.put(path)
    assert full in admin.get(f"/admin/v2/persistent/{ns}")
    producer = client.create_producer(full)
    producer.send(b"m")
    producer.close()
    assert admin.get(f"{path}/stats")["msgInCounter"] == 1
    admin.delete(path)
    assert full not in admin.get(f"/admin/v2/persistent/{ns}")


def test_partitioned_stats_show_each_producer_and_consumer_once(admin: AdminClient, ns: str,
                                                                 client: pulsar.Client) -> None:
    full, path = _topic(ns)
    admin.put(f"{path}/partitions", 3)
    consumer = client.subscribe(full, "sub", consumer_name="c1")
    producer = client.create_producer(full, producer_name="p1", batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(9):
        producer.send(f"m{i}".encode())
    for _ in range(9):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    stats = admin.get(f"{path}/partitioned-stats")
    assert [p["producerName"] for p in stats["publishers"]] == ["p1"]
    # the broker that owns a partition, as brokers list names it
    owner = admin.get(f"{path}-partition-0/stats")["ownerBroker"]
    assert owner and owner in admin.get("/admin/v2/brokers/standalone")
    consumers = stats["subscriptions"]["sub"]["consumers"]
    assert [c["consumerName"] for c in consumers] == ["c1"]
    assert consumers[0]["msgOutCounter"] == 9  # summed over the three partitions
    producer.close()
    consumer.close()


def test_terminating_an_empty_topic_answers_its_current_ledger(
        admin: AdminClient, ns: str, server: Standalone) -> None:
    full, path = _topic(ns)
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=5)
    try:
        client.create_producer(full).close()  # the topic and its first ledger, no entry
    finally:
        client.close()
    current = admin.get(f"{path}/internalStats")["ledgers"][-1]["ledgerId"]
    assert admin.get(f"{path}/internalStats")["lastConfirmedEntry"] == f"{current}:-1"
    got = admin.post(f"{path}/terminate")
    # Pulsar's managed ledger: entry -1 of the current ledger, before the first entry
    assert (got["ledgerId"], got["entryId"]) == (current, -1)
