"""Pulsar behaviour that depends on broker configuration or on a restart: each test runs
its own `magnetar standalone`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pulsar
import pytest

from core.format import MessageMetadata, encode_entry
from core.format import pulsar_api_pb2 as pb
from gateway._admin_cli import AdminClient, AdminError
from handlers.pulsar import _events as ev
from tests._standalone import Standalone
from tests.core.test_faults import free_port
from tests.handlers.pulsar._raw import RawClient
from tests.handlers.pulsar._receive import receive_until_idle, wait_until

RECEIVE_MS = 10_000


def _receive_all(consumer, n: int) -> list:
    return [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(n)]


def test_restart_keeps_messages_and_acknowledged_positions(tmp_path):
    topic = "persistent://public/default/restart"
    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        consumer = client.subscribe(topic, "durable", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"m{i}".encode())
        got = _receive_all(consumer, 20)
        for m in got[:10]:
            consumer.acknowledge(m)
        consumer.acknowledge(got[15])
        client.close()
    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        consumer = client.subscribe(topic, "durable", consumer_type=pulsar.ConsumerType.Shared)
        rest = []
        while True:
            try:
                m = consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                break
            rest.append(m.data())
            consumer.acknowledge(m)
        assert sorted(rest) == sorted(f"m{i}".encode() for i in range(10, 20) if i != 15)
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(RECEIVE_MS).data() for _ in range(20)] == [f"m{i}".encode() for i in range(20)]
        client.close()


def test_deduplication_drops_resent_sequence_ids_across_restart(tmp_path):
    topic = "persistent://public/default/dedup"
    conf = {"brokerDeduplicationEnabled": True}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        producer = client.create_producer(topic, producer_name="p1", batching_enabled=False)
        for i in range(5):
            producer.send(f"m{i}".encode(), sequence_id=i)
        producer.send(b"dup", sequence_id=3)
        client.close()
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        producer = client.create_producer(topic, producer_name="p1", batching_enabled=False)
        assert producer.last_sequence_id() == 4
        producer.send(b"dup-again", sequence_id=4)
        producer.send(b"m5", sequence_id=5)
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(RECEIVE_MS).data())
        assert got == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
        client.close()


def test_deduplication_keeps_chunked_messages_whole(tmp_path):
    """Every chunk of a large message carries the message's sequence id: deduplication
    looks at the last chunk only, so the chunks after the first are stored, and the
    producer's last sequence id is its last whole message's, after a restart too."""
    topic = "persistent://public/default/dedup-chunks"
    conf = {"brokerDeduplicationEnabled": True}
    bigs = [bytes([i]) * (6 * 1024 * 1024 + i) for i in range(3)]  # two chunks each
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, producer_name="big", batching_enabled=False,
                                          chunking_enabled=True)
        ids = [producer.send(big) for big in bigs[:2]]
        assert [consumer.receive(timeout_millis=RECEIVE_MS).data() for _ in range(2)] == bigs[:2]
        assert ids[0] != ids[1]
        client.close()
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        producer = client.create_producer(topic, producer_name="big", batching_enabled=False,
                                          chunking_enabled=True)
        assert producer.last_sequence_id() == 1
        producer.send(bigs[2])
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(RECEIVE_MS).data())
        assert got == bigs
        client.close()


def test_generated_producer_names_never_come_back_after_a_restart(tmp_path):
    """A name the broker gave stays that producer's: after a restart the broker names new
    producers differently, so one from before that reconnects is not refused as busy, nor
    handed another producer's deduplication state."""
    topic = "persistent://public/default/named"
    names = []
    for _ in range(2):
        with Standalone(tmp_path / "data") as s:
            client = pulsar.Client(s.pulsar_url)
            names += [client.create_producer(topic).producer_name() for _ in range(2)]
            client.close()
    assert len(set(names)) == 4, names
    assert all(name.startswith("standalone-") for name in names)


def test_deduplication_state_of_a_producer_long_gone_is_dropped(tmp_path):
    """brokerDeduplicationProducerInactivityTimeoutMinutes: a producer disconnected past it
    starts its sequence anew (its resent ids are stored again); one connected keeps its
    state; and brokerDeduplicationEntriesInterval snapshots the state as it goes."""
    topic = "persistent://public/default/dedup-purge"
    conf = {"brokerDeduplicationEnabled": True, "brokerDeduplicationProducerInactivityTimeoutMinutes": 0.05,
            "brokerDeduplicationEntriesInterval": 2}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        stays = client.create_producer(topic, producer_name="stays", batching_enabled=False)
        stays.send(b"s5", sequence_id=5)  # (the client takes a sequence id of 0 for none)
        gone = client.create_producer(topic, producer_name="gone", batching_enabled=False)
        for i in range(3):
            gone.send(f"g{i}".encode(), sequence_id=i)
        gone.close()
        wait_until(lambda: any("deduplication state dropped for producer(s) gone" in line for line in s.output),
                   timeout=20)
        again = client.create_producer(topic, producer_name="gone", batching_enabled=False)
        assert again.last_sequence_id() == -1
        again.send(b"g0-again", sequence_id=0)  # stored: no longer a duplicate
        stays.send(b"s5-dup", sequence_id=5)  # still one
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(RECEIVE_MS).data())
        assert got == [b"s5", b"g0", b"g1", b"g2", b"g0-again"]
        client.close()
        s.kill()  # no snapshot on close: what a restart finds was snapshotted on the way
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        assert client.create_producer(topic, producer_name="stays").last_sequence_id() == 5
        assert client.create_producer(topic, producer_name="gone").last_sequence_id() == 0
        client.close()


def test_auto_created_partitioned_topic(tmp_path):
    conf = {"allowAutoTopicCreationType": "partitioned", "defaultNumPartitions": 3}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        topic = "persistent://public/default/parted"
        assert len(client.get_topic_partitions(topic)) == 3
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, batching_enabled=False,
                                          message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
        for i in range(30):
            producer.send(str(i).encode())
        got = _receive_all(consumer, 30)
        assert sorted(int(m.data()) for m in got) == list(range(30))
        assert {m.topic_name() for m in got} == {f"{topic}-partition-{i}" for i in range(3)}
        client.close()


def test_auto_topic_creation_disabled_gives_topic_not_found(tmp_path):
    with Standalone(tmp_path / "data", conf={"allowAutoTopicCreation": False}) as s:
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=5)
        with pytest.raises(pulsar.TopicNotFound):
            client.create_producer("persistent://public/default/missing")
        with pytest.raises((pulsar.TopicNotFound, pulsar.Timeout)):
            client.create_producer("persistent://nosuch/ns/t")
        client.close()


def test_exclusive_producer_fences_others(tmp_path):
    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        topic = "excl-producer"
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
        with pytest.raises((pulsar.ProducerFenced, pulsar.ProducerBusy)):
            client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
        with pytest.raises((pulsar.ProducerFenced, pulsar.ProducerBusy)):
            client.create_producer(topic)
        client.close()


def test_consumed_ledgers_are_deleted_by_the_retention_check(tmp_path):
    import json
    import time
    import urllib.request

    conf = {"retentionCheckIntervalInSeconds": 1, "managedLedgerMaxEntriesPerLedger": 5,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        consumer = client.subscribe("trimmed", "s")
        producer = client.create_producer("trimmed", batching_enabled=False)
        sent = [producer.send(f"m{i}".encode()) for i in range(23)]
        # five entries a ledger: the messages went to at least four ledgers (asked of the
        # message ids: the check may trim the consumed ones before any admin call)
        assert len({m.ledger_id() for m in sent}) >= 4
        for m in _receive_all(consumer, 23):
            consumer.acknowledge(m)
        url = f"{s.addresses['web'][0]}/admin/v2/persistent/public/default/trimmed/internalStats"

        def ledgers() -> list:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())["ledgers"]

        deadline = time.monotonic() + 20
        while len(ledgers()) > 1:
            assert time.monotonic() < deadline, f"consumed ledgers kept: {ledgers()}"
            time.sleep(0.2)
        client.close()


def test_a_ledger_idle_for_the_inactive_rollover_time_is_sealed(tmp_path):
    # managedLedgerInactiveLedgerRolloverTimeSeconds: a topic that stops receiving
    # messages has its ledger sealed by the periodic check (a subscription that acknowledged
    # nothing keeps it from being trimmed), and the next message goes to a new ledger.
    conf = {"retentionCheckIntervalInSeconds": 1, "managedLedgerInactiveLedgerRolloverTimeSeconds": 2}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        client.subscribe("inactive", "s")
        producer = client.create_producer("inactive", batching_enabled=False)
        first = [producer.send(f"m{i}".encode()) for i in range(3)]
        assert {m.ledger_id() for m in first} == {first[0].ledger_id()}
        url = f"{s.addresses['web'][0]}/admin/v2/persistent/public/default/inactive/internalStats"

        def stats() -> dict:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())

        deadline = time.monotonic() + 20
        while len(stats()["ledgers"]) < 2:
            assert time.monotonic() < deadline, f"idle ledger not sealed: {stats()}"
            time.sleep(0.2)
        sealed = stats()
        assert [(led["ledgerId"], led["entries"]) for led in sealed["ledgers"]] == [
            (first[0].ledger_id(), 3), (sealed["ledgers"][1]["ledgerId"], 0)]
        assert sealed["currentLedgerEntries"] == 0
        after = producer.send(b"m3")
        assert after.ledger_id() == sealed["ledgers"][1]["ledgerId"] != first[0].ledger_id()
        assert after.entry_id() == 0
        client.close()


def test_standalone_with_three_bookies_replicates_with_the_configured_quorums(tmp_path):
    import json
    import urllib.request

    conf = {"managedLedgerDefaultEnsembleSize": 3, "managedLedgerDefaultWriteQuorum": 2,
            "managedLedgerDefaultAckQuorum": 2}
    s = Standalone(tmp_path / "data", bookies=3, conf=conf).start()
    try:
        assert len(s.addresses["bookies"]) == 3
        client = pulsar.Client(s.pulsar_url)
        consumer = client.subscribe("replicated", "s")
        producer = client.create_producer("replicated", batching_enabled=False)
        for i in range(10):
            producer.send(f"m{i}".encode())
        assert [m.data() for m in _receive_all(consumer, 10)] == [f"m{i}".encode() for i in range(10)]
        url = f"{s.addresses['web'][0]}/admin/v2/persistent/public/default/replicated/internalStats"
        with urllib.request.urlopen(url, timeout=10) as resp:
            ledger_id = json.loads(resp.read())["ledgers"][-1]["ledgerId"]
        from core.metadata import open_metadata_store
        store = open_metadata_store(f"sqlite:{tmp_path / 'data' / 'metadata.db'}")
        try:
            meta = json.loads(store.get(f"/ledgers/ledger/{ledger_id}")[0])
        finally:
            store.close()
        assert (meta["ensembleSize"], meta["writeQuorumSize"], meta["ackQuorumSize"]) == (3, 2, 2)
        assert sorted(meta["ensembles"][0][1]) == sorted(s.addresses["bookies"])
        client.close()
    finally:
        assert s.stop() == 0


def test_broker_schema_compatibility_strategy_applies_to_namespaces_that_set_none(tmp_path):
    from pulsar.schema import Integer, JsonSchema, Record, String

    class Book(Record):
        title = String(required=True)

    class Other(Record):
        pages = Integer(required=True)

    with Standalone(tmp_path / "data", conf={"schemaCompatibilityStrategy": "ALWAYS_COMPATIBLE"}) as s:
        client = pulsar.Client(s.pulsar_url)
        first = client.create_producer("schema-any", schema=JsonSchema(Book))
        first.send(Book(title="t"))
        # Under the default (FULL) this is IncompatibleSchema; here it is a new version.
        client.create_producer("schema-any", schema=JsonSchema(Other)).send(Other(pages=3))
        client.close()


def test_broker_limits_on_producers_consumers_and_subscriptions(tmp_path):
    """The broker's count limits apply where a namespace sets none; a namespace's own
    value replaces them."""
    conf = {"maxProducersPerTopic": 1, "maxConsumersPerTopic": 2, "maxConsumersPerSubscription": 1,
            "maxSubscriptionsPerTopic": 3}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=5)
        topic = "persistent://public/default/limits"
        client.create_producer(topic)
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        a = client.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
        with pytest.raises(pulsar.ConsumerBusy):  # "Subscription reached max consumers limit"
            client.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
        b = client.subscribe(topic, "b")
        with pytest.raises(pulsar.ConsumerBusy):  # "Topic reached max consumers limit"
            client.subscribe(topic, "c")
        a.close()
        b.close()  # the two subscriptions stay
        client.create_reader(topic, pulsar.MessageId.earliest).close()  # a third, for a while
        client.subscribe(topic, "c").close()
        with pytest.raises(pulsar.NotAllowedError):  # a fourth subscription
            client.subscribe(topic, "d")
        admin = AdminClient(s.addresses["web"][0])
        admin.post("/admin/v2/namespaces/public/default/maxProducersPerTopic", 2)
        client.create_producer(topic).close()
        client.close()


def test_broker_schema_validation_and_auto_update_keys(tmp_path):
    from pulsar.schema import Integer, JsonSchema, Record

    class V1(Record):
        a = Integer()

    class V2(Record):
        a = Integer()
        b = Integer()

    conf = {"schemaValidationEnforced": True, "isAllowAutoUpdateSchemaEnabled": False,
            "schemaCompatibilityStrategy": "ALWAYS_COMPATIBLE"}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=5)
        topic = "persistent://public/default/schema-keys"
        with pytest.raises(pulsar.IncompatibleSchema):  # nothing registered, no auto update
            client.create_producer(topic, schema=JsonSchema(V1))
        admin = AdminClient(s.addresses["web"][0])
        admin.post("/admin/v2/schemas/public/default/schema-keys/schema",
                   {"type": "JSON", "schema": JsonSchema(V1).schema_info().schema(), "properties": {}})
        client.create_producer(topic, schema=JsonSchema(V1)).close()
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=JsonSchema(V2))
        with pytest.raises(pulsar.IncompatibleSchema):  # no schema, on a topic with one
            client.create_producer(topic)
        admin.post("/admin/v2/namespaces/public/default/isAllowAutoUpdateSchema", True)
        client.create_producer(topic, schema=JsonSchema(V2)).close()
        client.close()


def test_broker_subscription_type_keys(tmp_path):
    conf = {"subscriptionTypesEnabled": "Shared,Key_Shared", "subscriptionKeySharedEnable": False}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=5)
        topic = "persistent://public/default/types"
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared).close()
        for kind in (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.KeyShared):
            with pytest.raises(pulsar.NotAllowedError):
                client.subscribe(topic, f"sub-{kind}", consumer_type=kind)
        client.close()


@pytest.mark.parametrize("disabled", ["persistent", "non-persistent"])
def test_a_disabled_topic_domain_is_refused_and_the_other_served(tmp_path, disabled):
    key = "enablePersistentTopics" if disabled == "persistent" else "enableNonPersistentTopics"
    served = "non-persistent" if disabled == "persistent" else "persistent"
    with Standalone(tmp_path / "data", conf={key: False}) as s:
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=5)
        admin = AdminClient(s.addresses["web"][0], timeout=30)
        with pytest.raises(pulsar.NotAllowedError):
            client.create_producer(f"{disabled}://public/default/t")
        with pytest.raises(pulsar.NotAllowedError):
            client.subscribe(f"{disabled}://public/default/t", "sub")
        with pytest.raises(AdminError) as refused:
            admin.put(f"/admin/v2/{disabled}/public/default/made")
        assert refused.value.status == 405
        consumer = client.subscribe(f"{served}://public/default/t", "sub")
        client.create_producer(f"{served}://public/default/t").send(b"served")
        assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"served"
        client.close()


def test_persistence_policies_set_the_replication_of_new_ledgers(tmp_path):
    import json

    with Standalone(tmp_path / "data", bookies=3) as s:
        admin = AdminClient(s.addresses["web"][0])
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=10)

        def quorums(topic: str) -> tuple[int, int, int]:
            client.create_producer(topic, batching_enabled=False).send(b"x")
            stats = admin.get(f"/admin/v2/persistent/public/default/{topic}/internalStats",
                              metadata="true")
            meta = json.loads(stats["ledgers"][-1]["metadata"])
            return meta["ensembleSize"], meta["writeQuorumSize"], meta["ackQuorumSize"]

        assert quorums("triples") == (1, 1, 1)  # the broker's defaults
        admin.post("/admin/v2/namespaces/public/default/persistence", {
            "bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2,
            "managedLedgerMaxMarkDeleteRate": 0})
        admin.put("/admin/v2/persistent/public/default/pairs")  # a topic's policy needs the topic
        admin.post("/admin/v2/persistent/public/default/pairs/persistence", {
            "bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1})
        assert quorums("triples") == (3, 3, 2)  # the loaded topic took the policy at once
        assert quorums("pairs") == (2, 2, 1)  # the topic's own policy wins
        with pytest.raises(AdminError) as bad:
            admin.post("/admin/v2/namespaces/public/default/persistence", {
                "bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2})
        assert bad.value.status == 400
        client.close()


def test_broker_publish_and_dispatch_rate_keys(tmp_path):
    """Without namespace rate policies, the broker's per-topic publish rate and
    per-subscription dispatch rate keys throttle (five messages a second here)."""
    import time

    conf = {"maxPublishRatePerTopicInMessages": 5, "dispatchThrottlingRatePerSubscriptionInMsg": 5}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=10)
        topic = "persistent://public/default/rates"
        client.subscribe(topic, "s").close()  # the subscription waits for what is published
        producer = client.create_producer(topic, batching_enabled=False)
        started = time.monotonic()
        for i in range(15):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        assert time.monotonic() - started >= 1.8  # three windows of five publishes
        consumer = client.subscribe(topic, "s")
        started = time.monotonic()
        for _ in range(15):
            consumer.acknowledge(consumer.receive(timeout_millis=RECEIVE_MS))
        assert time.monotonic() - started >= 1.8  # and of five deliveries
        client.close()


def test_max_partitions_per_partitioned_topic(tmp_path):
    conf = {"maxNumPartitionsPerPartitionedTopic": 2, "allowAutoTopicCreationType": "partitioned",
            "defaultNumPartitions": 3}
    with Standalone(tmp_path / "data", conf=conf) as s:
        admin = AdminClient(s.addresses["web"][0])
        base = "/admin/v2/persistent/public/default"
        for method, n in ((admin.put, 3), (admin.put, 2), (admin.post, 3)):
            try:
                method(f"{base}/two/partitions", n)
            except AdminError as exc:
                assert (n, exc.status, str(exc)) == (3, 406, "Number of partitions should be less "
                                                            "than or equal to 2")
            else:
                assert n == 2
        assert admin.get(f"{base}/two/partitions")["partitions"] == 2
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=3)
        with pytest.raises(pulsar.PulsarException):  # auto-created with 3 partitions: refused
            client.create_producer("persistent://public/default/auto")
        assert admin.get(f"{base}/partitioned") == ["persistent://public/default/two"]
        client.close()


def test_advertised_listeners_answer_lookups_by_the_clients_listener_name(tmp_path):
    port, dead = free_port(), free_port()
    listeners = (f"internal:pulsar://127.0.0.1:{port},external:pulsar://broker.example:{port},"
                 f"external:pulsar+ssl://broker.example:6651,elsewhere:pulsar://127.0.0.1:{dead}")
    with Standalone(tmp_path / "data", conf={"brokerServicePort": port,
                                             "advertisedListeners": listeners}) as s:
        assert s.pulsar_url == f"pulsar://127.0.0.1:{port}"
        raw = RawClient(s.pulsar_url)
        raw.connect()

        def lookup(request_id: int, name: str | None):
            fields = {} if name is None else {"advertised_listener_name": name}
            raw.send(ev.CommandLookupTopic.build(topic="persistent://public/default/l",
                                                 request_id=request_id, **fields))
            return raw.next_event().command

        internal, external, unknown = lookup(1, None), lookup(2, "external"), lookup(3, "nope")
        raw.close()
        assert internal.brokerServiceUrl == f"pulsar://127.0.0.1:{port}"
        assert not internal.HasField("brokerServiceUrlTls")
        assert (external.brokerServiceUrl, external.brokerServiceUrlTls) == (
            f"pulsar://broker.example:{port}", "pulsar+ssl://broker.example:6651")
        assert unknown.response == pb.CommandLookupTopicResponse.Failed
        assert unknown.error == pb.ServiceNotReady
        assert unknown.message == "the broker has no advertised listener named 'nope'"

        # The official client follows the listener it names: to the broker, or nowhere.
        ok = pulsar.Client(s.pulsar_url, listener_name="internal", operation_timeout_seconds=10)
        producer = ok.create_producer("persistent://public/default/l")
        producer.send(b"via internal")
        ok.close()
        lost = pulsar.Client(s.pulsar_url, listener_name="elsewhere", operation_timeout_seconds=3)
        with pytest.raises(pulsar.PulsarException):
            lost.create_producer("persistent://public/default/l")
        lost.close()

        # The REST lookup takes the name as Pulsar's listenerName parameter or header.
        web = s.addresses["web"][0]
        path = "/lookup/v2/topic/persistent/public/default/l"

        def rest(query: str = "", headers: dict[str, str] | None = None):
            req = urllib.request.Request(web + path + query, headers=headers or {})
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())

        assert rest()["brokerUrl"] == f"pulsar://127.0.0.1:{port}"
        assert rest("?listenerName=external")["brokerUrlTls"] == "pulsar+ssl://broker.example:6651"
        assert rest(headers={"X-Pulsar-ListenerName": "external"})["brokerUrl"] == (
            f"pulsar://broker.example:{port}")
        with pytest.raises(urllib.error.HTTPError) as info:
            rest("?listenerName=nope")
        assert info.value.code == 404
        assert "no advertised listener named 'nope'" in info.value.read().decode()


def test_lookups_past_max_concurrent_lookup_request_fail_with_too_many_requests(tmp_path):
    with Standalone(tmp_path / "data", conf={"maxConcurrentLookupRequest": 2}) as s:
        raw = RawClient(s.pulsar_url)
        raw.connect()
        topic = "persistent://public/default/lookups"
        # Five requests in one write: two are taken in, three find the limit reached.
        raw.send_raw(b"".join(
            raw.codec.send(ev.CommandLookupTopic.build(topic=topic, request_id=i) if i % 2
                           else ev.CommandPartitionedTopicMetadata.build(topic=topic, request_id=i))
            for i in range(5)))
        answers = {e.command.request_id: e.command for e in (raw.next_event() for _ in range(5))}
        refused = [i for i, c in answers.items() if c.HasField("error")]
        assert sorted(answers) == [0, 1, 2, 3, 4]
        assert sorted(refused) == [2, 3, 4]
        for i in refused:
            assert answers[i].error == pb.TooManyRequests
            assert answers[i].message == "Failed due to too many pending lookup requests"
        # Once answered, they no longer count: the official client looks up as usual.
        client = pulsar.Client(s.pulsar_url, operation_timeout_seconds=10)
        client.create_producer(topic).send(b"after")
        client.close()
        raw.close()


def test_a_message_larger_than_a_bookie_frame_is_refused_alone(tmp_path):
    """With maxMessageSize=16384, bookie frames are 16384 + 10240 bytes
    (nettyMaxFrameSizeBytes left to its default): messages up to maxMessageSize are stored
    and delivered; a SEND the Pulsar codec takes whose entry one frame cannot hold gets
    SEND_ERROR NotAllowedError ("Exceed maximum message size", as Pulsar answers for a
    topic's maximum), and the producer, the topic and the broker go on."""
    topic = "persistent://public/default/frame-limit"
    frame = 16384 + 10240
    # A frame holds of an entry: less an ADD_BATCH header and one entry's overhead (42),
    # the ledger entry header (13) and the broker's entry header (24).
    max_entry = frame - 42 - 13 - 24
    with Standalone(tmp_path / "data", conf={"maxMessageSize": 16384}) as s:
        client = pulsar.Client(s.pulsar_url)
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, batching_enabled=False)
        largest = bytes(range(250)) * 64  # the client counts its metadata in maxMessageSize
        producer.send(largest)
        raw = RawClient(s.pulsar_url)
        try:
            raw.connect()
            raw.send(ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1))
            assert isinstance(raw.next_event(), ev.CommandProducerSuccess)

            def send(seq: int, size: int) -> bytes:
                """A SEND of an entry of ``size`` bytes; returns its payload."""
                md = MessageMetadata(producer_name="raw", sequence_id=seq,
                                     publish_time=int(time.time() * 1000))
                payload = b"r" * (size - len(encode_entry(md, b"")))
                entry = encode_entry(md, payload)
                assert len(entry) == size
                raw.send(ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=seq,
                                                               num_messages=1), entry=entry))
                return payload

            send(0, max_entry + 1)
            reply = raw.next_event()
            assert isinstance(reply, ev.CommandSendError)
            assert (reply.command.sequence_id, reply.command.error) == (0, pb.NotAllowedError)
            assert reply.command.message == (
                f"Exceed maximum message size: {max_entry + 1} bytes, more than the "
                f"{max_entry} one entry holds in a bookie frame (nettyMaxFrameSizeBytes)")
            stored = send(1, max_entry)
            receipt = raw.next_event()
            assert isinstance(receipt, ev.CommandSendReceipt) and receipt.command.sequence_id == 1
        finally:
            raw.close()
        producer.send(b"after")
        got = _receive_all(consumer, 3)
        assert [m.data() for m in got] == [largest, stored, b"after"]
        client.close()


@pytest.mark.parametrize("limit", [50, 0])
def test_key_shared_reads_past_a_stuck_consumers_keys_up_to_the_look_ahead_limit(tmp_path, limit):
    # `a` takes one message and reads no more; its keys' entries wait in the replay set
    # while `b`'s flow on, until that set holds the subscription's limit of messages
    # (0: no limit, and `b` gets all of its keys' messages while `a` reads nothing).
    conf = {"keySharedLookAheadMsgInReplayThresholdPerSubscription": limit,
            "keySharedLookAheadMsgInReplayThresholdPerConsumer": 0}
    topic = "persistent://public/default/ks-look-ahead"
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        try:
            a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                                 consumer_name="a", receiver_queue_size=1)
            b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                                 consumer_name="b", receiver_queue_size=1000)
            producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
            keys = [f"k{k}" for k in range(16)]
            for i in range(1600):
                producer.send_async(f"{keys[i % 16]}:{i}".encode(), None, partition_key=keys[i % 16])
            producer.flush()

            def drain(consumer) -> list[str]:
                return [m.data().decode() for m in receive_until_idle(consumer, idle_ms=1500)]

            before = drain(b)
            after_a = drain(a)
            rest = drain(b)
            assert sorted(int(t.split(":")[1]) for t in before + after_a + rest) == list(range(1600))
            assert before and after_a
            # with a limit, reading on stopped short of b's share; without, it did not
            assert bool(rest) == (limit > 0), (len(before), len(rest))
        finally:
            client.close()


def test_a_delayed_message_still_waits_for_its_time_after_a_restart(tmp_path):
    topic = "persistent://public/default/delayed-restart"
    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared).close()
        producer = client.create_producer(topic, batching_enabled=False)
        due = time.time() + 10
        producer.send(b"later", deliver_at=int(due * 1000))
        producer.send(b"now")
        client.close()
    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        try:
            consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
            assert time.time() < due - 2, "the restart took too long for this test to tell"
            got = []
            for _ in range(2):
                m = consumer.receive(timeout_millis=15_000)
                consumer.acknowledge(m)
                got.append((m.data(), time.time()))
            assert [data for data, _ in got] == [b"now", b"later"]
            assert got[1][1] >= due - 0.1  # not before its time
        finally:
            client.close()


def test_batch_index_acks_hold_across_a_restart(tmp_path):
    topic = "persistent://public/default/batch-acks-restart"

    def subscribe(client):
        return client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)

    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        consumer = subscribe(client)
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                          batching_max_publish_delay_ms=60_000)
        for i in range(10):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        got = _receive_all(consumer, 10)
        assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1
        for m in got[::2]:
            consumer.acknowledge(m)
        consumer.close()  # the client sends its acknowledgements before it closes
        client.close()
    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        try:
            rest = receive_until_idle(subscribe(client), idle_ms=2000, ack=False)
            assert [m.data().decode() for m in rest] == [f"m{i}" for i in range(1, 10, 2)]
        finally:
            client.close()


def _read_until_idle(reader) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(reader.read_next(2000).data())
        except pulsar.Timeout:
            return got


def test_retention_keeps_what_a_compacted_read_needs(tmp_path):
    # Small ledgers, trimmed every second, no subscription and no retention: only the
    # compaction holds the topic's data, as Pulsar's compacted ledger and its
    # __compaction subscription do (the view up to the horizon, and what came after).
    conf = {"managedLedgerMaxEntriesPerLedger": 3, "managedLedgerMinLedgerRolloverTimeMinutes": 0,
            "retentionCheckIntervalInSeconds": 1}
    topic = "persistent://public/default/compacted-retained"
    path = "/admin/v2/persistent/public/default/compacted-retained"
    expected = [b"b1", b"c1", b"a2", b"d1", b"n0", b"n1", b"n2", b"n3", b"n4", b"n5"]
    with Standalone(tmp_path / "data", conf=conf) as s:
        admin = AdminClient(s.addresses["web"][0], timeout=30)
        client = pulsar.Client(s.pulsar_url)
        producer = client.create_producer(topic, batching_enabled=False)
        for key, value in [("a", "a1"), ("b", "b1"), ("c", "c1"), ("a", "a2"), ("d", "d1")]:
            producer.send(value.encode(), partition_key=key)
        admin.put(f"{path}/compaction")
        deadline = time.monotonic() + 20
        while admin.get(f"{path}/compaction")["status"] != "SUCCESS":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for i in range(6):
            producer.send(f"n{i}".encode(), partition_key=f"n{i}")
        time.sleep(3)  # several retention checks, past the ledgers' rollovers
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert _read_until_idle(reader) == expected
        client.close()
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        time.sleep(3)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert _read_until_idle(reader) == expected
        client.close()


def test_keep_alive_pings_idle_clients_and_closes_the_silent_ones(tmp_path):
    """keepAliveIntervalSeconds, as Pulsar's: the broker answers a PING, PINGs a client it
    has heard nothing from for an interval, keeps one that answers, closes one that stays
    silent for two intervals, and closes a connection that sent no CONNECT after one."""
    interval = 1
    with Standalone(tmp_path, conf={"keepAliveIntervalSeconds": interval}) as s:
        live = RawClient(s.pulsar_url)
        live.connect()
        live.send(ev.CommandPing.build())
        assert isinstance(live.next_event(), ev.CommandPong)
        for _ in range(3):  # past two intervals: answered, it stays open
            assert isinstance(live.next_event(), ev.CommandPing)
            live.send(ev.CommandPong.build())

        silent = RawClient(s.pulsar_url)
        silent.connect()
        connected_at = time.monotonic()
        assert isinstance(silent.next_event(), ev.CommandPing)
        assert isinstance(silent.next_event(), ev.ConnectionClosed)
        assert time.monotonic() - connected_at >= 2 * interval - 0.2

        mute = RawClient(s.pulsar_url)  # never sends CONNECT
        assert mute.read_raw_until_closed() == b""

        for raw in (live, silent, mute):
            raw.close()
