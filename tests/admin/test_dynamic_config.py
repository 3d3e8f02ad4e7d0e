"""Pulsar's dynamic broker configuration: ``/admin/v2/brokers/configuration...`` and
``magnetar admin brokers ...-dynamic-config``, against a real broker: a change is stored,
takes effect at once, survives a restart, and goes back to the static value when deleted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pulsar
import pytest

from core.format import pulsar_api_pb2 as pb
from core.metadata import open_metadata_store
from gateway._admin_cli import AdminClient
from gateway._config import load_config
from gateway._runtime_config import RuntimeConfig
from handlers.pulsar import _events as ev
from tests._standalone import Standalone
from tests.admin.conftest import status_of, wait_for
from tests.handlers.pulsar._raw import RawClient
from tests.handlers.pulsar._receive import receive_until_idle

CONFIG = "/admin/v2/brokers/configuration"
CLI_TIMEOUT = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    # The periodic backlog quota check is out of the way: only the one on request runs.
    s = Standalone(tmp_path_factory.mktemp("dyncfg"), conf={"backlogQuotaCheckIntervalInSeconds": 3600}).start()
    try:
        yield s
    finally:
        s.kill()



def _cli(server: Standalone, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gateway", "admin", "--admin-url", server.addresses["web"][0],
                           "brokers", *args], capture_output=True, text=True, timeout=CLI_TIMEOUT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}: {proc.stderr}")
    return proc


def test_lists_the_dynamic_keys(admin: AdminClient) -> None:
    names = admin.get(CONFIG)
    assert {"allowAutoTopicCreation", "maxTopicsPerNamespace", "subscriptionTypesEnabled",
            "dispatchThrottlingRatePerTopicInMsg", "maxPublishRatePerTopicInMessages"} <= set(names)
    # read once at start (ports, storage), or not dynamic in Pulsar either
    assert not {"brokerServicePort", "managedLedgerCacheSizeMB", "maxMessageSize"} & set(names)


def test_auto_topic_creation_changes_at_runtime(admin: AdminClient, client: pulsar.Client, ns: str,
                                                dynamic: Callable[[str, str], None]) -> None:
    client.create_producer(f"persistent://{ns}/before").close()
    dynamic("allowAutoTopicCreation", "false")
    assert admin.get(f"{CONFIG}/values") == {"allowAutoTopicCreation": "false"}
    assert admin.get(f"{CONFIG}/runtime")["allowAutoTopicCreation"] == "false"
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(f"persistent://{ns}/refused")
    assert f"persistent://{ns}/refused" not in admin.get(f"/admin/v2/persistent/{ns}")

    admin.delete(f"{CONFIG}/allowAutoTopicCreation")
    assert admin.get(f"{CONFIG}/values") == {}
    assert admin.get(f"{CONFIG}/runtime")["allowAutoTopicCreation"] == "true"
    client.create_producer(f"persistent://{ns}/after").close()


def test_subscription_types_change_at_runtime(admin: AdminClient, client: pulsar.Client, ns: str,
                                              dynamic: Callable[[str, str], None]) -> None:
    topic = f"persistent://{ns}/types"
    dynamic("subscriptionTypesEnabled", "Exclusive,Failover")
    assert admin.get(f"{CONFIG}/runtime")["subscriptionTypesEnabled"] == "Exclusive,Failover"
    with pytest.raises(pulsar.NotAllowedError):
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    client.subscribe(topic, "exclusive").close()

    admin.delete(f"{CONFIG}/subscriptionTypesEnabled")
    client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared).close()


def test_topic_limit_changes_at_runtime(admin: AdminClient, ns: str,
                                        dynamic: Callable[[str, str], None]) -> None:
    admin.put(f"/admin/v2/persistent/{ns}/a")
    dynamic("maxTopicsPerNamespace", "1")
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/b") == \
        (412, "Exceed maximum number of topics in namespace.")
    admin.delete(f"{CONFIG}/maxTopicsPerNamespace")
    admin.put(f"/admin/v2/persistent/{ns}/b")


def test_publish_rate_changes_at_runtime(admin: AdminClient, client: pulsar.Client, ns: str,
                                         dynamic: Callable[[str, str], None]) -> None:
    topic, path = f"persistent://{ns}/rate", f"/admin/v2/persistent/{ns}/rate"
    producer = client.create_producer(topic, batching_enabled=False)

    def limited() -> int:
        return int(admin.get(f"{path}/stats")["publishRateLimitedTimes"])

    def send(n: int) -> None:
        for i in range(n):
            producer.send_async(b"m%d" % i, None)
        producer.flush()

    send(20)
    assert limited() == 0
    dynamic("maxPublishRatePerTopicInMessages", "1")
    send(3)  # one a second: the topic holds the others back
    assert limited() > 0
    admin.delete(f"{CONFIG}/maxPublishRatePerTopicInMessages")
    before = limited()
    send(20)
    assert limited() == before
    producer.close()


def test_lookup_limit_changes_at_runtime(server: Standalone, admin: AdminClient, ns: str,
                                         dynamic: Callable[[str, str], None]) -> None:
    topic = f"persistent://{ns}/lookups"

    def refused() -> list[int]:
        """The requests refused of three lookups sent in one write: the first is taken in
        before the others are read."""
        raw = RawClient(server.pulsar_url)
        try:
            raw.connect()
            raw.send_raw(b"".join(raw.codec.send(ev.CommandLookupTopic.build(topic=topic, request_id=i))
                                  for i in range(3)))
            answers = [raw.next_event().command for _ in range(3)]
        finally:
            raw.close()
        return sorted(c.request_id for c in answers if c.HasField("error") and c.error == pb.TooManyRequests)

    assert refused() == []
    dynamic("maxConcurrentLookupRequest", "1")
    assert refused() == [1, 2]
    admin.delete(f"{CONFIG}/maxConcurrentLookupRequest")
    assert refused() == []


def test_key_shared_look_ahead_limit_changes_at_runtime(client: pulsar.Client, ns: str,
                                                        dynamic: Callable[[str, str], None]) -> None:
    """`a` takes one message and no more; under the default limits (2000 messages per
    consumer) the dispatcher reads on past `a`'s keys to the end for `b`. Lowered at
    runtime to 50 in all, it stops short: `b` gets the rest only once `a` has read."""
    topic = f"persistent://{ns}/ks-look-ahead"
    a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                         consumer_name="a", receiver_queue_size=1)
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                         consumer_name="b", receiver_queue_size=1000)
    # changed for the subscription already running
    dynamic("keySharedLookAheadMsgInReplayThresholdPerConsumer", "0")
    dynamic("keySharedLookAheadMsgInReplayThresholdPerSubscription", "50")
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    keys = [f"k{k}" for k in range(16)]
    for i in range(1600):
        producer.send_async(f"{i}".encode(), None, partition_key=keys[i % 16])
    producer.flush()
    before = receive_until_idle(b, idle_ms=1500)
    after_a = receive_until_idle(a, idle_ms=1500)
    rest = receive_until_idle(b, idle_ms=1500)
    assert sorted(int(m.data()) for m in before + after_a + rest) == list(range(1600))
    assert before and after_a and rest


def test_refusals(admin: AdminClient) -> None:
    before = admin.get(f"{CONFIG}/values")
    for name in ("brokerServicePort", "managedLedgerCacheSizeMB", "noSuchKey"):
        assert status_of(admin.post, f"{CONFIG}/{name}/1") == (412, "Can't update non-dynamic configuration")
        assert status_of(admin.delete, f"{CONFIG}/{name}") == (412, "Can't delete non-dynamic configuration")
    for name, value in (("maxTopicsPerNamespace", "many"), ("maxTopicsPerNamespace", "-1"),
                        ("allowAutoTopicCreation", "maybe"), ("subscriptionTypesEnabled", "Fanout")):
        status, reason = status_of(admin.post, f"{CONFIG}/{name}/{value}")
        assert status == 412
        assert reason.startswith(f"Invalid dynamic-config value: {name}: '{value}'"), reason
    assert admin.get(f"{CONFIG}/values") == before
    assert admin.get(f"{CONFIG}/runtime")["maxTopicsPerNamespace"] == "0"
    # deleting a dynamic key that was never set is no error, and changes nothing
    assert admin.request("DELETE", f"{CONFIG}/maxTopicsPerNamespace").status == 200
    assert admin.get(f"{CONFIG}/values") == before


def test_backlog_quota_check_on_request(admin: AdminClient, client: pulsar.Client, ns: str) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/slow")
    admin.post(f"/admin/v2/namespaces/{ns}/backlogQuota",
               {"limitSize": 2000, "policy": "consumer_backlog_eviction"})
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(60):
        producer.send(b"x" * 100)
    producer.close()

    def backlog() -> int:
        return int(admin.get(f"{path}/stats")["subscriptions"]["slow"]["msgBacklog"])

    assert backlog() == 60  # the periodic check is an hour away
    assert admin.request("GET", "/admin/v2/brokers/backlog-quota-check").status == 204
    wait_for(lambda: backlog() < 60)


def test_cli(server: Standalone, admin: AdminClient) -> None:
    assert "allowAutoTopicCreation" in _cli(server, "list-dynamic-config").stdout.splitlines()
    assert _cli(server, "update-dynamic-config", "--config", "defaultNumPartitions", "--value", "3").stdout == ""
    try:
        # maps as pulsar-admin prints them: "key    value" lines
        assert _cli(server, "get-all-dynamic-config").stdout == "defaultNumPartitions    3\n"
        assert "defaultNumPartitions    3" in _cli(server, "get-runtime-config").stdout.splitlines()
    finally:
        assert _cli(server, "delete-dynamic-config", "--config", "defaultNumPartitions").stdout == ""
    assert _cli(server, "get-all-dynamic-config").stdout == ""
    runtime = _cli(server, "get-runtime-config").stdout.splitlines()
    assert "defaultNumPartitions    1" in runtime and "brokerServicePort    0" in runtime
    internal = json.loads(_cli(server, "get-internal-config").stdout)  # InternalConfigurationData
    assert set(internal) == {"zookeeperServers", "configurationStoreServers", "metadataStoreUrl",
                             "configurationMetadataStoreUrl", "ledgersRootPath",
                             "bookkeeperMetadataServiceUri", "stateStorageServiceUrl"}
    assert internal["metadataStoreUrl"].startswith("sqlite:")
    assert _cli(server, "backlog-quota-check").stdout.strip() == "ok"

    refused = _cli(server, "update-dynamic-config", "--config", "brokerServicePort", "--value", "1",
                   check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "Can't update non-dynamic configuration (HTTP 412)"
    missing = _cli(server, "update-dynamic-config", "--config", "maxTopicsPerNamespace", check=False)
    assert missing.returncode == 2 and "--value" in missing.stderr


def test_survives_restart_and_ignores_stale_values(tmp_path: Path, unique: str) -> None:
    broker = Standalone(tmp_path).start()
    try:
        AdminClient(broker.addresses["web"][0]).post(f"{CONFIG}/allowAutoTopicCreation/false")
    finally:
        assert broker.stop() == 0

    # What an older or other broker may have left in the store: no longer valid here.
    store = open_metadata_store(f"sqlite:{tmp_path}/metadata.db")
    try:
        data, version = store.get("/admin/configuration") or (b"{}", -1)
        stored = json.loads(data)
        assert stored == {"allowAutoTopicCreation": "false"}
        stored.update(brokerServicePort="1", maxTopicsPerNamespace="many")
        store.put("/admin/configuration", json.dumps(stored).encode(), version)
    finally:
        store.close()

    broker.start()
    try:
        admin = AdminClient(broker.addresses["web"][0])
        runtime = admin.get(f"{CONFIG}/runtime")
        assert runtime["allowAutoTopicCreation"] == "false"
        assert runtime["maxTopicsPerNamespace"] == "0"
        assert any("maxTopicsPerNamespace" in line and "ignoring" in line for line in broker.output)
        client = pulsar.Client(broker.pulsar_url, operation_timeout_seconds=10)
        try:
            with pytest.raises(pulsar.PulsarException):
                client.create_producer(f"persistent://public/default/{unique}")
            admin.delete(f"{CONFIG}/allowAutoTopicCreation")
            client.create_producer(f"persistent://public/default/{unique}").close()
        finally:
            client.close()
    finally:
        broker.kill()


def test_brokers_sharing_a_store_keep_each_others_values(caplog: pytest.LogCaptureFixture) -> None:
    store = open_metadata_store("memory:")
    try:
        store.put("/admin/configuration", b"not json")
        one, two = RuntimeConfig(load_config(None, environ={})), RuntimeConfig(load_config(None, environ={}))
        one.attach(store)  # what is stored is unusable: logged, the broker runs on
        assert "not a JSON object" in caplog.text
        two.attach(store)
        one.update("maxTopicsPerNamespace", "5")
        two.update("allowAutoTopicCreation", "false")  # written over what `one` wrote, not instead
        assert one.stored() == {"maxTopicsPerNamespace": "5", "allowAutoTopicCreation": "false"}
        assert (one.maxTopicsPerNamespace, two.get("allowAutoTopicCreation")) == (5, False)
        restarted = RuntimeConfig(load_config(None, environ={}))
        restarted.attach(store)
        assert restarted.get("maxTopicsPerNamespace") == 5 and restarted.is_set("allowAutoTopicCreation")
    finally:
        store.close()
