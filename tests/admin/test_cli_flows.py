"""The seed's "Basic Operations" and "Troubleshooting" flows with ``magnetar admin`` and
``magnetar client`` in place of pulsar-admin and pulsar-client, against a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from tests._standalone import Standalone

CLI_TIMEOUT = 60


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}: {proc.stderr}")
    return proc


@pytest.fixture
def cli(server: Standalone) -> object:
    web = server.addresses["web"][0]

    def admin(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run("admin", "--admin-url", web, *args, check=check)

    return admin


def test_basic_operations(cli, server: Standalone, unique: str) -> None:  # type: ignore[no-untyped-def]
    tenant = f"my-tenant-{unique}"
    ns = f"{tenant}/my-namespace"
    topic = f"persistent://{ns}/my-topic"
    cli("tenants", "create", tenant, "--admin-roles", "my-admin-role", "--allowed-clusters", "standalone")
    cli("namespaces", "create", ns)
    cli("namespaces", "set-retention", ns, "--size", "10G", "--time", "3d")
    cli("namespaces", "set-backlog-quota", ns, "--limit", "5G", "--policy", "producer_exception")
    cli("topics", "create", topic)
    cli("topics", "set-message-ttl", topic, "--messageTTL", "3600")

    # the seed's own spellings: --num-messages to produce, --subscription to consume
    produced = run("client", "--url", server.pulsar_url, "produce", topic,
                   "--messages", "Hello Pulsar", "--num-messages", "10")
    assert "10 messages successfully produced" in produced.stdout
    consumed = run("client", "--url", server.pulsar_url, "consume", topic, "--subscription",
                   "my-subscription", "--num-messages", "10", "-p", "Earliest", "--timeout", "10")
    assert consumed.stdout.count("content:Hello Pulsar") == 10
    assert "10 messages successfully consumed" in consumed.stdout

    shown = cli("topics", "stats", topic).stdout
    assert '"msgInCounter" : 10,' in shown and '"publishers" : [ ],' in shown  # pulsar-admin's layout
    stats = json.loads(shown)
    assert stats["msgInCounter"] == 10
    assert stats["subscriptions"]["my-subscription"]["msgOutCounter"] == 10
    assert cli("topics", "list", ns).stdout.split() == [topic]
    assert json.loads(cli("namespaces", "get-retention", ns).stdout) == \
        {"retentionTimeInMinutes": 3 * 24 * 60, "retentionSizeInMB": 10 * 1024}
    quota = json.loads(cli("namespaces", "get-backlog-quotas", ns).stdout)["destination_storage"]
    assert (quota["limitSize"], quota["policy"]) == (5 * 1024 ** 3, "producer_exception")
    assert cli("topics", "get-message-ttl", topic).stdout.strip() == "3600"
    assert json.loads(cli("tenants", "get", tenant).stdout) == \
        {"adminRoles": ["my-admin-role"], "allowedClusters": ["standalone"]}


def test_troubleshooting(cli, server: Standalone) -> None:  # type: ignore[no-untyped-def]
    with urllib.request.urlopen(server.addresses["web"][0] + "/admin/v2/brokers/health") as r:
        assert r.read() == b"ok"
    topic = "persistent://public/default/test-topic"
    before = datetime.now(UTC) - timedelta(seconds=1)  # the timestamp keeps milliseconds
    run("client", "--url", server.pulsar_url, "produce", topic, "-m", "a,b,c", "-k", "key1",
        "-p", "source=test")
    stats = json.loads(cli("topics", "stats", topic).stdout)
    assert stats["msgInCounter"] == 3
    internal = json.loads(cli("topics", "stats-internal", topic).stdout)
    assert internal["numberOfEntries"] >= 1
    created = datetime.fromisoformat(internal["lastLedgerCreatedTimestamp"])
    assert before <= created <= datetime.now(UTC), "when the topic's ledger was created"
    assert cli("clusters", "list").stdout.split() == ["standalone"]
    web_host_port = server.addresses["web"][0].removeprefix("http://")
    assert cli("brokers", "list", "standalone").stdout.split() == [web_host_port]
    assert cli("brokers", "healthcheck").stdout.strip() == "ok"
    with urllib.request.urlopen(server.addresses["web"][0] + "/metrics/") as r:
        lines = [ln for ln in r.read().decode().splitlines()
                 if ln.startswith(("pulsar_broker", "pulsar_storage"))]
    assert any(ln.startswith("pulsar_broker_in_messages_total") for ln in lines)
    assert any(ln.startswith("pulsar_storage_size") for ln in lines)


def test_stats_earliest_time_in_backlog(cli, server: Standalone, unique: str) -> None:  # type: ignore[no-untyped-def]
    """`topics stats -etb` (and `partitioned-stats -etb`) give the publish time of the
    oldest message a subscription holds; without it, as in Pulsar, 0. -gpb and -sbs parse."""
    topic = f"persistent://public/default/etb-{unique}"
    cli("topics", "create", topic)
    cli("topics", "create-subscription", topic, "-s", "s")
    before = int(time.time() * 1000) - 1
    run("client", "--url", server.pulsar_url, "produce", topic, "-m", "a,b", "-db")
    after = int(time.time() * 1000) + 1
    assert json.loads(cli("topics", "stats", topic).stdout)["subscriptions"]["s"]["earliestMsgPublishTimeInBacklog"] == 0
    stats = json.loads(cli("topics", "stats", topic, "-etb", "-gpb", "-sbs").stdout)
    earliest = stats["subscriptions"]["s"]["earliestMsgPublishTimeInBacklog"]
    assert before <= earliest <= after
    assert stats["earliestMsgPublishTimeInBacklogs"] == earliest
    cli("topics", "clear-backlog", topic, "-s", "s")
    assert json.loads(cli("topics", "stats", topic, "-etb").stdout)["earliestMsgPublishTimeInBacklogs"] == 0

    parted = f"persistent://public/default/etb-p-{unique}"
    cli("topics", "create-partitioned-topic", parted, "-p", "2")
    cli("topics", "create-subscription", parted, "-s", "s")
    run("client", "--url", server.pulsar_url, "produce", parted, "-m", "a,b,c,d", "-db")
    merged = json.loads(cli("topics", "partitioned-stats", parted, "--per-partition", "-etb").stdout)
    per = [p["earliestMsgPublishTimeInBacklogs"] for p in merged["partitions"].values()]
    assert merged["earliestMsgPublishTimeInBacklogs"] == min(t for t in per if t) > 0
    assert merged["subscriptions"]["s"]["earliestMsgPublishTimeInBacklog"] == merged["earliestMsgPublishTimeInBacklogs"]


def test_unset_policies_print_null(cli, unique: str) -> None:  # type: ignore[no-untyped-def]
    """pulsar-admin prints a policy nobody set as null, so a script can tell it from a value."""
    topic = f"persistent://public/default/unset-{unique}"
    cli("topics", "create", topic)
    assert cli("topics", "get-message-ttl", topic).stdout == "null\n"
    assert cli("topics", "get-retention", topic).stdout == "null\n"
    assert cli("namespaces", "get-retention", "public/default").stdout == "null\n"
    assert cli("topics", "set-message-ttl", topic, "--ttl", "60").stdout == ""  # a set prints nothing
    assert cli("topics", "get-message-ttl", topic).stdout == "60\n"


def test_tenant_without_allowed_clusters_gets_every_cluster(cli, unique: str) -> None:  # type: ignore[no-untyped-def]
    """pulsar-admin fills in every existing cluster when --allowed-clusters is left out."""
    cluster, tenant = f"c-{unique}", f"t-all-{unique}"
    cli("clusters", "create", cluster, "--url", "http://x:8080", "--broker-url", "pulsar://x:6650")
    try:
        cli("tenants", "create", tenant)
        assert sorted(json.loads(cli("tenants", "get", tenant).stdout)["allowedClusters"]) == \
            sorted([cluster, "standalone"])
        cli("tenants", "delete", tenant)
    finally:
        cli("clusters", "delete", cluster)


def test_subscription_verbs(cli, server: Standalone, unique: str) -> None:  # type: ignore[no-untyped-def]
    topic = f"persistent://public/default/sub-verbs-{unique}"
    cli("topics", "create", topic)
    cli("topics", "create-subscription", topic, "-s", "s", "-m", "earliest")
    run("client", "--url", server.pulsar_url, "produce", topic, "-m", "one,two,three", "-p", "Key=v")
    assert cli("topics", "subscriptions", topic).stdout.split() == ["s"]
    peek = cli("topics", "peek-messages", topic, "-s", "s", "-n", "2").stdout
    assert peek.count("Message ID:") == 2 and "|one" in peek and "|two" in peek
    assert '"Key": "v"' in peek  # the name as it was sent
    cli("topics", "skip", topic, "-s", "s", "-n", "1")
    stats = json.loads(cli("topics", "stats", topic).stdout)
    assert stats["subscriptions"]["s"]["msgBacklog"] == 2
    cli("topics", "clear-backlog", topic, "-s", "s")
    cli("topics", "reset-cursor", topic, "-s", "s", "-t", "1h")
    assert json.loads(cli("topics", "stats", topic).stdout)["subscriptions"]["s"]["msgBacklog"] == 3
    cli("topics", "expire-messages", topic, "-s", "s", "-t", "0")
    assert json.loads(cli("topics", "stats", topic).stdout)["subscriptions"]["s"]["msgBacklog"] == 0
    cli("topics", "unsubscribe", topic, "-s", "s")
    assert cli("topics", "subscriptions", topic).stdout.strip() == ""
    examined = cli("topics", "examine-message", topic, "-i", "earliest", "-m", "1").stdout
    assert "|one" in examined
    terminated = cli("topics", "terminate", topic).stdout
    assert terminated.startswith("Topic successfully terminated at ")


def test_errors_exit_nonzero_with_reason(cli) -> None:  # type: ignore[no-untyped-def]
    missing = cli("tenants", "get", "no-such-tenant", check=False)
    assert missing.returncode == 1
    assert "Tenant does not exist" in missing.stderr
    dup = cli("tenants", "create", "public", check=False)
    assert dup.returncode == 1 and "already exists" in dup.stderr
    usage = cli("topics", "skip", "persistent://public/default/x", check=False)
    assert usage.returncode == 2
    bad = cli("namespaces", "set-retention", "public/default", "--size", "lots", "--time", "1d", check=False)
    assert bad.returncode == 2 and "invalid size" in bad.stderr
    unreachable = run("admin", "--admin-url", "http://127.0.0.1:1", "clusters", "list", check=False)
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr


def test_partitioned_and_schema_verbs(cli, tmp_path, unique: str) -> None:  # type: ignore[no-untyped-def]
    topic = f"persistent://public/default/parts-{unique}"
    cli("topics", "create-partitioned-topic", topic, "-p", "2")
    assert json.loads(cli("topics", "get-partitioned-topic-metadata", topic).stdout)["partitions"] == 2
    cli("topics", "update-partitioned-topic", topic, "-p", "4")
    stats = json.loads(cli("topics", "partitioned-stats", topic, "--per-partition").stdout)
    assert stats["metadata"]["partitions"] == 4 and len(stats["partitions"]) == 4
    fleeting = f"non-persistent://public/default/parts-{unique}"
    cli("topics", "create-partitioned-topic", fleeting, "-p", "2")
    # pulsar-admin lists the partitioned topics of both domains
    listed = cli("topics", "list-partitioned-topics", "public/default").stdout.split()
    assert topic in listed and fleeting in listed
    cli("topics", "delete-partitioned-topic", topic)
    cli("topics", "delete-partitioned-topic", fleeting)
    schema_file = tmp_path / "schema.json"
    definition = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "int"}]}
    schema_file.write_text(json.dumps({"type": "AVRO", "schema": json.dumps(definition), "properties": {}}))
    st = f"persistent://public/default/schema-{unique}"
    cli("schemas", "upload", st, "-f", str(schema_file))
    got = json.loads(cli("schemas", "get", st).stdout)  # pulsar-admin's SchemaInfoWithVersion
    assert got["version"] == 0 and set(got["schemaInfo"]) == {"name", "schema", "type", "timestamp", "properties"}
    assert got["schemaInfo"]["name"] == f"schema-{unique}" and got["schemaInfo"]["type"] == "AVRO"
    assert got["schemaInfo"]["schema"] == definition  # the definition itself, not a string of it
    assert json.loads(cli("schemas", "get", st, "--version", "0").stdout) == got["schemaInfo"]
    cli("schemas", "delete", st)
    assert cli("schemas", "get", st, check=False).returncode == 1
    key = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "int"}]}
    schema_file.write_text(json.dumps({
        "type": "KEY_VALUE", "schema": json.dumps({"key": key, "value": ""}),
        "properties": {"key.schema.name": "K", "key.schema.type": "JSON", "key.schema.properties": "{}",
                       "value.schema.name": "String", "value.schema.type": "STRING",
                       "value.schema.properties": "{}", "kv.encoding.type": "INLINE"}}))
    cli("schemas", "upload", st, "-f", str(schema_file))
    # pulsar-admin prints a KeyValue schema as the SchemaInfo of its key and of its value
    assert json.loads(cli("schemas", "get", st).stdout)["schemaInfo"]["schema"] == {
        "key": {"name": "K", "schema": key, "type": "JSON", "timestamp": 0, "properties": {}},
        "value": {"name": "String", "schema": "", "type": "STRING", "timestamp": 0, "properties": {}}}


def _got(cli, noun: str, name: str, target: str) -> str:  # type: ignore[no-untyped-def]
    """What ``<noun> get-<name> <target>`` prints."""
    return str(cli(noun, f"get-{name}", target).stdout.strip())


def _removed(cli, noun: str, name: str, target: str) -> None:  # type: ignore[no-untyped-def]
    """``<noun> remove-<name> <target>``, and the policy then reads back unset."""
    cli(noun, f"remove-{name}", target)
    assert _got(cli, noun, name, target) in ("", "null")


def test_unacked_message_limits_by_namespace_and_topic(cli, unique: str) -> None:  # type: ignore[no-untyped-def]
    ns = f"public/unacked-{unique}"
    topic = f"persistent://{ns}/t"
    cli("namespaces", "create", ns)
    cli("namespaces", "set-max-unacked-messages-per-consumer", ns, "--maxUnackedMessagesPerConsumer", "500")
    cli("namespaces", "set-max-unacked-messages-per-subscription", ns, "-m", "2000")
    cli("topics", "create", topic)
    cli("topics", "set-max-unacked-messages-per-consumer", topic, "--maxNum", "50")
    assert _got(cli, "namespaces", "max-unacked-messages-per-consumer", ns) == "500"
    assert _got(cli, "namespaces", "max-unacked-messages-per-subscription", ns) == "2000"
    assert _got(cli, "topics", "max-unacked-messages-per-consumer", topic) == "50"
    _removed(cli, "topics", "max-unacked-messages-per-consumer", topic)


def test_auto_subscription_creation_by_namespace(cli, unique: str) -> None:  # type: ignore[no-untyped-def]
    ns = f"public/autosub-{unique}"
    cli("namespaces", "create", ns)
    assert _got(cli, "namespaces", "auto-subscription-creation", ns) in ("", "null")
    cli("namespaces", "set-auto-subscription-creation", ns)
    assert json.loads(_got(cli, "namespaces", "auto-subscription-creation", ns)) == {
        "allowAutoSubscriptionCreation": False}
    cli("namespaces", "set-auto-subscription-creation", ns, "--enable")
    assert json.loads(_got(cli, "namespaces", "auto-subscription-creation", ns)) == {
        "allowAutoSubscriptionCreation": True}
    _removed(cli, "namespaces", "auto-subscription-creation", ns)


def test_subscription_and_consumer_limits_by_namespace_and_topic(cli, unique: str) -> None:  # type: ignore[no-untyped-def]
    ns = f"public/sublimits-{unique}"
    topic = f"persistent://{ns}/t"
    cli("namespaces", "create", ns)
    cli("namespaces", "set-max-subscriptions-per-topic", ns, "--max-subscriptions-per-topic", "5")
    cli("namespaces", "set-max-consumers-per-subscription", ns, "-c", "2")
    cli("topics", "create", topic)
    cli("topics", "set-max-subscriptions-per-topic", topic, "-m", "1")
    assert _got(cli, "namespaces", "max-subscriptions-per-topic", ns) == "5"
    assert _got(cli, "namespaces", "max-consumers-per-subscription", ns) == "2"
    assert _got(cli, "topics", "max-subscriptions-per-topic", topic) == "1"
    cli("topics", "create-subscription", topic, "-s", "first")
    _removed(cli, "topics", "max-subscriptions-per-topic", topic)
    cli("namespaces", "set-persistence", ns, "-e", "3", "-w", "2", "-a", "2", "-r", "5")
    assert json.loads(_got(cli, "namespaces", "persistence", ns)) == {
        "bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2,
        "managedLedgerMaxMarkDeleteRate": 5.0}
    cli("namespaces", "set-max-topics-per-namespace", ns, "-t", "50")
    assert _got(cli, "namespaces", "max-topics-per-namespace", ns) == "50"
    cli("namespaces", "set-subscription-expiration-time", ns, "-t", "30")
    assert _got(cli, "namespaces", "subscription-expiration-time", ns) == "30"
    cli("namespaces", "set-compaction-threshold", ns, "-t", "10M")
    assert _got(cli, "namespaces", "compaction-threshold", ns) == str(10 << 20)
    cli("topics", "set-compaction-threshold", topic, "--threshold", "0")
    assert _got(cli, "topics", "compaction-threshold", topic) == "0"
    _removed(cli, "topics", "compaction-threshold", topic)
    _removed(cli, "namespaces", "max-consumers-per-subscription", ns)


def test_admission_flags_by_namespace(cli, unique: str) -> None:  # type: ignore[no-untyped-def]
    ns = f"public/flags-{unique}"
    cli("namespaces", "create", ns)
    assert _got(cli, "namespaces", "schema-validation-enforce", ns) == "false"
    cli("namespaces", "set-schema-validation-enforce", ns, "--enable")
    assert _got(cli, "namespaces", "schema-validation-enforce", ns) == "true"
    cli("namespaces", "set-is-allow-auto-update-schema", ns, "-d")
    assert _got(cli, "namespaces", "is-allow-auto-update-schema", ns) == "false"
    assert cli("namespaces", "set-is-allow-auto-update-schema", ns, check=False).returncode != 0
    assert _got(cli, "namespaces", "encryption-required", ns) == "false"
    cli("namespaces", "set-encryption-required", ns, "-e")
    assert _got(cli, "namespaces", "encryption-required", ns) == "true"


def test_subscription_types_enabled_by_namespace_and_topic(cli, unique: str) -> None:  # type: ignore[no-untyped-def]
    ns = f"public/subtypes-{unique}"
    topic = f"persistent://{ns}/t"
    cli("namespaces", "create", ns)
    cli("namespaces", "set-subscription-types-enabled", ns, "--types", "Shared,Key_Shared")
    assert cli("namespaces", "get-subscription-types-enabled", ns).stdout.split() == ["Shared", "Key_Shared"]
    cli("topics", "create", topic)
    cli("topics", "set-subscription-types-enabled", topic, "-t", "Exclusive")
    assert cli("topics", "get-subscription-types-enabled", topic).stdout.split() == ["Exclusive"]
    assert cli("topics", "set-subscription-types-enabled", topic, "-t", "Sometimes", check=False).returncode != 0
    cli("namespaces", "remove-subscription-types-enabled", ns)
    assert cli("namespaces", "get-subscription-types-enabled", ns).stdout.split() == []


def test_peek_messages_counts_messages_of_a_batch(cli, server: Standalone, unique: str) -> None:  # type: ignore[no-untyped-def]
    """pulsar-admin's -n counts a batch's messages one by one, and a count past the backlog
    lists what there is instead of failing."""
    import pulsar

    topic = f"persistent://public/default/peek-batch-{unique}"
    cli("topics", "create-subscription", topic, "-s", "s")
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10)
    try:
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                          batching_max_publish_delay_ms=1000)
        for i in range(3):
            producer.send_async(f"b{i}".encode(), None)
        producer.flush()
        producer.send(b"single")
    finally:
        client.close()
    two = cli("topics", "peek-messages", topic, "-s", "s", "-n", "2").stdout
    assert "|b0" in two and "|b1" in two and "|b2" not in two and "|single" not in two
    everything = cli("topics", "peek-messages", topic, "-s", "s", "-n", "10").stdout
    assert all(f"|{m}" in everything for m in ("b0", "b1", "b2", "single"))
    missing = cli("topics", "peek-messages", topic, "-s", "nope", "-n", "1", check=False)
    assert missing.returncode == 1 and "Subscription not found" in missing.stderr
    # examine-message shows one message: the first of a batched entry, as pulsar-admin does
    examined = cli("topics", "examine-message", topic, "-i", "earliest", "-m", "1").stdout
    assert "|b0" in examined and "|b1" not in examined


def test_a_batched_entry_is_shown_message_by_message_as_pulsar_admin_does(  # type: ignore[no-untyped-def]
        cli, server: Standalone, unique: str) -> None:
    """pulsar-admin's admin client splits a batched entry into its messages: get-message-by-id
    and examine-message print the first, under ``Batch Message ID: ledger:entry:0``, and
    peek-messages prints each under its own id; times are epoch milliseconds."""
    import pulsar

    from tests.handlers.pulsar._receive import wait_until

    topic = f"persistent://public/default/by-id-batch-{unique}"
    cli("topics", "create-subscription", topic, "-s", "s")
    ids: list = []
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10)
    try:
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                          batching_max_publish_delay_ms=1000)
        before = int(time.time() * 1000)
        for i in range(3):
            producer.send_async(f"b{i}".encode(), lambda _res, mid: ids.append(mid), properties={"n": str(i)})
        producer.flush()
        wait_until(lambda: len(ids) == 3)
    finally:
        client.close()
    ledger, entry = ids[0].ledger_id(), ids[0].entry_id()
    shown = cli("topics", "get-message-by-id", topic, "-l", str(ledger), "-e", str(entry)).stdout
    lines = shown.splitlines()
    assert lines[0] == f"Batch Message ID: {ledger}:{entry}:0"
    assert before - 1000 <= int(lines[1].removeprefix("Publish time: ")) <= int(time.time() * 1000)
    assert lines[2] == "Event time: 0"
    assert "|b0" in shown and "|b1" not in shown and '"n": "0"' in shown
    assert cli("topics", "examine-message", topic, "-i", "earliest", "-m", "1").stdout == shown
    peek = cli("topics", "peek-messages", topic, "-s", "s", "-n", "3").stdout
    assert [line for line in peek.splitlines() if "Message ID" in line] == \
        [f"Batch Message ID: {ledger}:{entry}:{i}" for i in range(3)]
    assert peek.count("\n" + "-" * 73 + "\n\n") == 2
    assert all(f'"n": "{i}"' in peek for i in range(3))
