"""Policies set over REST take effect on real clients: backlog quotas (all three
policies), message TTL, max producers/consumers, auto-topic-creation, deduplication.
The standalone runs the TTL and quota checks every fraction of a second (FAST_CHECKS)."""

from __future__ import annotations

import time

import pulsar
import pytest

from core.format import MessageMetadata, encode_entry
from core.format import pulsar_api_pb2 as pb
from gateway._admin_cli import AdminClient
from handlers.pulsar import _events as ev
from tests._standalone import Standalone
from tests.handlers.pulsar._keys import key_reader

from .conftest import first_messages, raw_answers, status_of, wait_for


def _backlog(admin: AdminClient, path: str, sub: str) -> int:
    return int(admin.get(f"{path}/stats")["subscriptions"][sub]["msgBacklog"])


def _fill(client: pulsar.Client, topic: str, n: int, size: int = 100) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(n):
        producer.send(b"x" * size)
    producer.close()


@pytest.fixture
def quick_client(server: Standalone) -> pulsar.Client:
    c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=2)
    yield c
    c.close()


@pytest.mark.parametrize("policy", ["producer_exception", "producer_request_hold"])
def test_backlog_quota_refuses_producers(admin: AdminClient, ns: str, client: pulsar.Client,
                                         quick_client: pulsar.Client, policy: str) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/slow")
    _fill(client, topic, 50)
    admin.post(f"/admin/v2/namespaces/{ns}/backlogQuota", {"limitSize": 2000, "policy": policy})
    with pytest.raises(pulsar.PulsarException):
        quick_client.create_producer(topic)
    admin.post(f"{path}/subscription/slow/skip_all")
    quick_client.create_producer(topic).close()


def test_backlog_quota_disconnects_existing_producer(admin: AdminClient, ns: str, client: pulsar.Client,
                                                     quick_client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/slow")
    producer = quick_client.create_producer(topic, batching_enabled=False, send_timeout_millis=2000)
    _fill(client, topic, 50)
    admin.post(f"{path}/backlogQuota", {"limitSize": 2000, "policy": "producer_exception"})
    # The periodic check disconnects it; reconnecting is refused while over quota.
    wait_for(lambda: not admin.get(f"{path}/stats")["publishers"])
    with pytest.raises(pulsar.PulsarException):
        producer.send(b"more")
    assert admin.get(f"{path}/stats")["msgInCounter"] == 50


def test_backlog_quota_consumer_eviction(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/slow")
    admin.post(f"/admin/v2/namespaces/{ns}/backlogQuota",
               {"limitSize": 2000, "policy": "consumer_backlog_eviction"})
    _fill(client, topic, 60)
    wait_for(lambda: admin.get(f"{path}/stats")["subscriptions"]["slow"]["backlogSize"] <= 2000)
    left = _backlog(admin, path, "slow")
    assert 0 < left < 60
    client.create_producer(topic).close()  # eviction never refuses producers
    consumer = client.subscribe(topic, "slow")
    got = 0
    while got < left:
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        got += 1
    consumer.close()


def test_message_ttl_expires_backlog(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/s")
    admin.post(f"/admin/v2/namespaces/{ns}/messageTTL", 1)
    _fill(client, topic, 5)
    wait_for(lambda: _backlog(admin, path, "s") == 0, timeout=15)
    assert admin.get(f"{path}/stats")["subscriptions"]["s"]["totalMsgExpired"] == 5


def test_topic_ttl_overrides_namespace(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/s")
    admin.post(f"/admin/v2/namespaces/{ns}/messageTTL", 3600)
    admin.post(f"{path}/messageTTL", messageTTL=1)
    _fill(client, topic, 3)
    wait_for(lambda: _backlog(admin, path, "s") == 0, timeout=15)


def test_max_producers_and_consumers(admin: AdminClient, ns: str, client: pulsar.Client,
                                     quick_client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    first = client.create_producer(topic)  # the topic is loaded before the policy changes
    admin.post(f"/admin/v2/namespaces/{ns}/maxProducersPerTopic", 1)
    with pytest.raises(pulsar.PulsarException):
        quick_client.create_producer(topic)
    admin.delete(f"/admin/v2/namespaces/{ns}/maxProducersPerTopic")
    client.create_producer(topic).close()
    first.close()
    admin.post(f"{path}/maxConsumers", 1)
    c1 = client.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        quick_client.subscribe(topic, "b", consumer_type=pulsar.ConsumerType.Shared)
    c1.close()
    admin.delete(f"{path}/maxConsumers")
    admin.post(f"{path}/maxSubscriptionsPerTopic", 1)
    with pytest.raises(pulsar.NotAllowedError):
        quick_client.subscribe(topic, "b")
    client.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared).close()


def test_auto_topic_creation_override(admin: AdminClient, ns: str, client: pulsar.Client,
                                      quick_client: pulsar.Client) -> None:
    base = f"/admin/v2/namespaces/{ns}/autoTopicCreation"
    admin.post(base, {"allowAutoTopicCreation": False})
    with pytest.raises(pulsar.PulsarException):
        quick_client.create_producer(f"persistent://{ns}/not-created")
    assert admin.get(f"/admin/v2/persistent/{ns}") == []
    admin.post(base, {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3})
    client.create_producer(f"persistent://{ns}/auto").close()
    assert admin.get(f"/admin/v2/persistent/{ns}/auto/partitions")["partitions"] == 3


def test_auto_subscription_creation_override(admin: AdminClient, ns: str, server: Standalone,
                                             client: pulsar.Client, quick_client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/subs", f"/admin/v2/persistent/{ns}/subs"
    client.subscribe(topic, "existing").close()
    admin.post(f"/admin/v2/namespaces/{ns}/autoSubscriptionCreation",
               {"allowAutoSubscriptionCreation": False})
    refused_subscribe, refused_producer = raw_answers(server, [
        ev.CommandSubscribe.build(topic=topic, subscription="new", consumer_id=1, request_id=1,
                                  subType=pb.CommandSubscribe.Shared),
        # Nor is a producer's initial subscription (a dead-letter policy's) created.
        ev.CommandProducer.build(topic=topic, producer_id=1, request_id=2,
                                 initial_subscription_name="dlq-watch")])
    assert isinstance(refused_subscribe, ev.CommandError)
    assert (refused_subscribe.command.error, refused_subscribe.command.message) == (
        pb.SubscriptionNotFound, "Subscription does not exist")
    assert isinstance(refused_producer, ev.CommandError)
    assert refused_producer.command.error == pb.NotAllowedError
    assert "auto subscription creation is not allowed" in refused_producer.command.message
    # The official client takes SubscriptionNotFound for a passing condition and retries
    # until its operation timeout, as it does against Pulsar.
    with pytest.raises(pulsar.PulsarException):
        quick_client.subscribe(topic, "new")
    assert admin.get(f"{path}/subscriptions") == ["existing"]
    client.subscribe(topic, "existing").close()  # what exists may still be joined
    client.create_reader(topic, pulsar.MessageId.earliest).close()  # readers are not durable
    admin.put(f"{path}/subscription/made-by-admin")
    client.subscribe(topic, "made-by-admin").close()
    # The topic's own override wins over its namespace's.
    admin.post(f"{path}/autoSubscriptionCreation", {"allowAutoSubscriptionCreation": True})
    client.subscribe(topic, "new").close()
    assert sorted(admin.get(f"{path}/subscriptions")) == ["existing", "made-by-admin", "new"]


def test_subscription_types_enabled(admin: AdminClient, ns: str, server: Standalone,
                                    client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/types", f"/admin/v2/persistent/{ns}/types"
    admin.post(f"/admin/v2/namespaces/{ns}/subscriptionTypesEnabled", ["Shared"])
    client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared).close()
    with pytest.raises(pulsar.NotAllowedError):
        client.subscribe(topic, "exclusive")
    with pytest.raises(pulsar.NotAllowedError):  # a reader's subscription is Exclusive
        client.create_reader(topic, pulsar.MessageId.earliest)
    [refused] = raw_answers(server, [ev.CommandSubscribe.build(
        topic=topic, subscription="f", consumer_id=1, request_id=1, subType=pb.CommandSubscribe.Failover)])
    assert (refused.command.error, refused.command.message) == (
        pb.NotAllowedError, f"Topic[{{{topic}}}] doesn't support Failover sub type!")
    admin.post(f"{path}/subscriptionTypesEnabled", ["Exclusive"])  # the topic's own wins
    client.subscribe(topic, "exclusive").close()
    with pytest.raises(pulsar.NotAllowedError):
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)


def test_encryption_required(admin: AdminClient, ns: str, server: Standalone, client: pulsar.Client,
                             quick_client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/secret"
    policy = f"/admin/v2/namespaces/{ns}/encryptionRequired"
    assert admin.get(policy) is False
    admin.post(policy, True)
    assert admin.get(policy) is True
    refused, accepted, unencrypted = raw_answers(server, [
        ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1),
        ev.CommandProducer.build(topic=topic, producer_id=2, request_id=2, encrypted=True),
        # A producer that says it encrypts, sending a message with no encryption keys.
        ev.CommandSend(command=pb.CommandSend(producer_id=2, sequence_id=0, num_messages=1),
                       entry=encode_entry(MessageMetadata(producer_name="raw", sequence_id=0,
                                                          publish_time=int(time.time() * 1000)),
                                          b"plain"))])
    assert (refused.command.error, refused.command.message) == (
        pb.MetadataError, f"Encryption is required in {topic}")
    assert isinstance(accepted, ev.CommandProducerSuccess)
    assert isinstance(unencrypted, ev.CommandSendError)
    assert (unencrypted.command.error, unencrypted.command.message) == (
        pb.MetadataError, "Messages must be encrypted")
    # The official client retries MetadataError until its operation timeout.
    with pytest.raises(pulsar.PulsarException):
        quick_client.create_producer(topic)
    keys = key_reader()
    consumer = client.subscribe(topic, "s", crypto_key_reader=keys)
    producer = client.create_producer(topic, encryption_key="app-key", crypto_key_reader=keys)
    producer.send(b"secret")
    assert consumer.receive(timeout_millis=10_000).data() == b"secret"


def test_max_topics_per_namespace(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    admin.post(f"/admin/v2/namespaces/{ns}/maxTopicsPerNamespace", 3)
    admin.put(f"/admin/v2/persistent/{ns}/one")
    client.create_producer(f"persistent://{ns}/two").close()  # created on first use
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/parts/partitions", 2) == (
        412, "Exceed maximum number of topics in namespace.")
    client.create_producer(f"persistent://{ns}/three").close()
    with pytest.raises(pulsar.NotAllowedError):
        client.create_producer(f"persistent://{ns}/four")
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/four")[0] == 412
    client.create_producer(f"non-persistent://{ns}/fleeting").close()  # not counted
    admin.delete(f"/admin/v2/namespaces/{ns}/maxTopicsPerNamespace")
    client.create_producer(f"persistent://{ns}/four").close()


def test_the_topic_quota_counts_partitions_not_opened_yet(admin: AdminClient, ns: str,
                                                         client: pulsar.Client) -> None:
    """A partitioned topic's partitions count against maxTopicsPerNamespace from its
    creation, as Pulsar creates them with it, not only once each is first used."""
    admin.post(f"/admin/v2/namespaces/{ns}/maxTopicsPerNamespace", 3)
    admin.put(f"/admin/v2/persistent/{ns}/parts/partitions", 2)
    admin.put(f"/admin/v2/persistent/{ns}/one")
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/two")[0] == 412
    with pytest.raises(pulsar.NotAllowedError):
        client.create_producer(f"persistent://{ns}/two")
    client.create_producer(f"persistent://{ns}/parts").close()  # its partitions were counted


def test_deduplication_enabled_by_rest(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.post(f"/admin/v2/namespaces/{ns}/deduplication", True)
    producer = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    producer.send(b"a", sequence_id=1)
    producer.send(b"a", sequence_id=1)
    producer.send(b"b", sequence_id=2)
    producer.close()
    stats = admin.get(f"{path}/stats")
    assert stats["msgInCounter"] == 2
    assert stats["deduplicationStatus"] == "Enabled"


def test_namespace_must_exist_for_clients(admin: AdminClient, quick_client: pulsar.Client, unique: str) -> None:
    with pytest.raises(pulsar.PulsarException):
        quick_client.create_producer(f"persistent://public/missing-{unique}/t")
    assert status_of(admin.get, f"/admin/v2/persistent/public/missing-{unique}")[0] == 404


def test_publish_rate_throttles_producers(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.post(f"/admin/v2/namespaces/{ns}/publishRate", {"publishThrottlingRateInMsg": 5})
    producer = client.create_producer(topic, batching_enabled=False)
    started = time.monotonic()
    for _ in range(15):
        producer.send(b"p")
    elapsed = time.monotonic() - started
    producer.close()
    assert elapsed >= 1.8  # three one-second windows of five messages
    stats = admin.get(f"{path}/stats")
    assert stats["msgInCounter"] == 15 and stats["publishRateLimitedTimes"] >= 2


def _topic_with_subscriptions(admin: AdminClient, ns: str, *subscriptions: str) -> tuple[str, str]:
    """A created topic ``t`` of ``ns`` with ``subscriptions``: its name and admin path."""
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    for name in subscriptions:
        admin.put(f"{path}/subscription/{name}")
    return topic, path


def _seconds_to_receive(consumers: list[pulsar.Consumer], n: int) -> float:
    """How long each of ``consumers`` in turn takes to receive and acknowledge ``n``."""
    started = time.monotonic()
    for consumer in consumers:
        for _ in range(n):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    return time.monotonic() - started


@pytest.mark.parametrize("policy", ["dispatchRate", "subscriptionDispatchRate"])
def test_dispatch_rate_throttles_consumers(admin: AdminClient, ns: str, client: pulsar.Client,
                                           policy: str) -> None:
    """The topic's dispatch rate, or each subscription's, at five messages a second."""
    topic, _ = _topic_with_subscriptions(admin, ns, "s")
    _fill(client, topic, 15)
    admin.post(f"/admin/v2/namespaces/{ns}/{policy}",
               {"dispatchThrottlingRateInMsg": 5, "ratePeriodInSecond": 1})
    consumer = client.subscribe(topic, "s")
    assert _seconds_to_receive([consumer], 15) >= 1.8
    consumer.close()



@pytest.mark.parametrize("policy", ["dispatchRate", "subscriptionDispatchRate"])
def test_a_dispatch_rate_in_bytes_alone_throttles_consumers(admin: AdminClient, ns: str,
                                                          client: pulsar.Client, policy: str) -> None:
    """A read takes no more entries than the bytes the window has left (at least one):
    about four 200-byte messages a second here."""
    topic, _ = _topic_with_subscriptions(admin, ns, "s")
    _fill(client, topic, 15, size=200)
    admin.post(f"/admin/v2/namespaces/{ns}/{policy}",
               {"dispatchThrottlingRateInMsg": -1, "dispatchThrottlingRateInByte": 1000,
                "ratePeriodInSecond": 1})
    consumer = client.subscribe(topic, "s")
    assert _seconds_to_receive([consumer], 15) >= 1.8
    consumer.close()


def test_a_topic_dispatch_rate_holds_for_all_its_subscriptions_together(
        admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    """The topic's dispatch rate is one limit its subscriptions share: two of them draining
    fifteen messages each at ten a second in all take three windows, not two."""
    topic, _ = _topic_with_subscriptions(admin, ns, "a", "b")
    _fill(client, topic, 15)
    admin.post(f"/admin/v2/namespaces/{ns}/dispatchRate",
               {"dispatchThrottlingRateInMsg": 10, "ratePeriodInSecond": 1})
    consumers = [client.subscribe(topic, name) for name in ("a", "b")]
    assert _seconds_to_receive(consumers, 15) >= 1.8
    for consumer in consumers:
        consumer.close()


def test_delayed_delivery_policy_turns_delays_off_and_on(admin: AdminClient, ns: str,
                                                         client: pulsar.Client) -> None:
    from datetime import timedelta

    policy = f"/admin/v2/namespaces/{ns}/delayedDelivery"
    assert admin.get(policy) is None
    admin.post(policy, {"active": False, "tickTime": 1000})
    assert admin.get(policy) == {"active": False, "tickTime": 1000, "maxDeliveryDelayInMillis": 0}

    def first_two(topic: str) -> list[bytes]:
        return first_messages(client, topic, timedelta(minutes=5))

    # off in the namespace: a delayed message comes at once, in order
    assert first_two(f"persistent://{ns}/off") == [b"later", b"now"]
    # the topic's own policy wins over the namespace's
    admin.put(f"/admin/v2/persistent/{ns}/on")
    admin.put(f"/admin/v2/persistent/{ns}/other")
    admin.post(f"/admin/v2/persistent/{ns}/on/delayedDelivery", {"active": True})
    assert first_two(f"persistent://{ns}/on") == [b"now"]
    admin.delete(policy)
    assert admin.get(f"/admin/v2/persistent/{ns}/other/delayedDelivery", applied="true")["active"] is True


def test_a_delay_past_the_policys_maximum_is_refused(admin: AdminClient, ns: str,
                                                     server: Standalone) -> None:
    admin.post(f"/admin/v2/namespaces/{ns}/delayedDelivery",
               {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 60_000})
    now = int(time.time() * 1000)

    def send(seq: int, delay: int) -> ev.CommandSend:
        md = MessageMetadata(producer_name="raw", sequence_id=seq, publish_time=now, deliver_at_time=now + delay)
        return ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=1),
                              entry=encode_entry(md, b"x"))

    _, soon, too_late = raw_answers(server, [
        ev.CommandProducer.build(topic=f"persistent://{ns}/capped", producer_id=1, request_id=1),
        send(0, 30_000), send(1, 300_000)])
    assert isinstance(soon, ev.CommandSendReceipt)
    assert isinstance(too_late, ev.CommandSendError)
    assert (too_late.command.error, too_late.command.message) == (
        pb.NotAllowedError, "Exceeds max allowed delivery delay of 60000 milliseconds")
