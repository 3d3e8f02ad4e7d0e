"""pulsar-admin's topic and namespace operations end to end: ``magnetar admin`` drives
the REST API, and a real client sees the effect on the broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pulsar
import pytest

from core.format import MessageMetadata, encode_entry
from core.format import pulsar_api_pb2 as pb
from gateway._admin_cli import AdminClient
from handlers.pulsar import _events as ev
from tests._standalone import Standalone

from .conftest import first_messages, raw_answers, status_of, wait_for

CLI_TIMEOUT = 60

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(server: Standalone) -> Cli:
    web = server.addresses["web"][0]

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "gateway", "admin", "--admin-url", web, *args],
                              capture_output=True, text=True, timeout=CLI_TIMEOUT)
        if check and proc.returncode != 0:
            raise AssertionError(f"{args} exited {proc.returncode}: {proc.stderr}")
        return proc

    return run


def _out(proc: subprocess.CompletedProcess[str]) -> object:
    return json.loads(proc.stdout)


# -- delayed delivery and max message size ---------------------------------------------------------


def _send_answers(server: Standalone, topic: str, *entries: tuple[bytes, int]) -> list[Any]:
    """The broker's answer to each SEND of (payload, delivery delay in ms) on `topic`, from
    a raw connection: the official client reconnects on a SEND_ERROR and resends rather
    than show it."""
    now = int(time.time() * 1000)

    def send(seq: int, payload: bytes, delay: int) -> ev.CommandSend:
        md = MessageMetadata(producer_name="raw", sequence_id=seq, publish_time=now)
        if delay:
            md.deliver_at_time = now + delay
        return ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=1),
                              entry=encode_entry(md, payload))

    return raw_answers(server, [ev.CommandProducer.build(topic=topic, producer_id=1, request_id=1),
                                *(send(i, p, d) for i, (p, d) in enumerate(entries))])[1:]


def _refusal(answer: Any) -> tuple[int, str] | None:
    if isinstance(answer, ev.CommandSendError):
        return answer.command.error, answer.command.message
    return None


def test_delayed_delivery_verbs_set_what_the_broker_follows(cli: Cli, ns: str, client: pulsar.Client,
                                                           server: Standalone) -> None:
    assert cli("namespaces", "get-delayed-delivery", ns).stdout.strip() == "null"
    cli("namespaces", "set-delayed-delivery", ns, "--disable")
    assert _out(cli("namespaces", "get-delayed-delivery", ns)) == \
        {"active": False, "tickTime": 1000, "maxDeliveryDelayInMillis": 0}
    # off: a message asking for a delay arrives at once, in publish order
    assert first_messages(client, f"persistent://{ns}/off", timedelta(minutes=5)) == [b"later", b"now"]

    topic = f"persistent://{ns}/on"
    cli("topics", "create", topic)  # topic policies are set on a topic that exists
    cli("topics", "set-delayed-delivery", topic, "-e", "-t", "2s", "--maxDelay", "1h")
    assert _out(cli("topics", "get-delayed-delivery", topic)) == \
        {"active": True, "tickTime": 2000, "maxDeliveryDelayInMillis": 3_600_000}
    # the topic's own policy wins over its namespace's: the delayed message waits ...
    assert first_messages(client, topic, timedelta(minutes=5)) == [b"now"]
    # ... and one asking for more than --maxDelay is refused
    soon, too_late = _send_answers(server, topic, (b"soon", 60_000), (b"too late", 7_200_000))
    assert _refusal(soon) is None
    assert _refusal(too_late) == (pb.NotAllowedError, "Exceeds max allowed delivery delay of 3600000 milliseconds")

    cli("topics", "remove-delayed-delivery", topic)
    assert cli("topics", "get-delayed-delivery", topic).stdout.strip() == "null"
    assert _out(cli("topics", "get-delayed-delivery", topic, "--applied"))["active"] is False
    cli("namespaces", "remove-delayed-delivery", ns)
    assert cli("namespaces", "get-delayed-delivery", ns).stdout.strip() == "null"

    neither = cli("topics", "set-delayed-delivery", topic, check=False)
    assert neither.returncode == 1 and "--enable or --disable" in neither.stderr


def test_max_message_size_verbs_bound_what_a_producer_may_send(cli: Cli, ns: str, client: pulsar.Client,
                                                                server: Standalone) -> None:
    topic = f"persistent://{ns}/bounded"
    cli("topics", "create", topic)
    assert cli("topics", "get-max-message-size", topic).stdout.strip() == "null"
    cli("topics", "set-max-message-size", topic, "-m", "1024")
    assert cli("topics", "get-max-message-size", topic).stdout.strip() == "1024"

    small, large = _send_answers(server, topic, (b"x" * 500, 0), (b"x" * 2000, 0))
    assert _refusal(small) is None
    assert _refusal(large) == (pb.NotAllowedError, "Exceed maximum message size")
    # a message split into chunks is let through whatever its size, as in Pulsar
    chunked = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
    chunked.send(b"c" * (6 * 1024 * 1024))
    chunked.close()

    cli("topics", "remove-max-message-size", topic)
    assert cli("topics", "get-max-message-size", topic).stdout.strip() == "null"
    [large] = _send_answers(server, topic, (b"x" * 2000, 0))
    assert _refusal(large) is None


def test_a_negative_max_message_size_is_refused(admin: AdminClient, ns: str) -> None:
    admin.put(f"/admin/v2/persistent/{ns}/t")
    status, reason = status_of(admin.post, f"/admin/v2/persistent/{ns}/t/maxMessageSize", -1)
    assert status == 412 and reason


# -- topic properties ---------------------------------------------------------------------------------


def test_topic_properties_verbs(cli: Cli, ns: str) -> None:
    topic = f"persistent://{ns}/with-props"
    cli("topics", "create", topic, "-m", "owner=ops", "--metadata", "tier=gold")
    assert _out(cli("topics", "get-properties", topic)) == {"owner": "ops", "tier": "gold"}
    cli("topics", "update-properties", topic, "-p", "tier=silver", "-p", "team=core")
    assert _out(cli("topics", "get-properties", topic)) == {"owner": "ops", "tier": "silver", "team": "core"}
    cli("topics", "remove-properties", topic, "-k", "owner")
    cli("topics", "unload", topic)
    assert _out(cli("topics", "get-properties", topic)) == {"tier": "silver", "team": "core"}

    # deleted with the topic: a topic created again under the name has none
    cli("topics", "delete", topic)
    cli("topics", "create", topic)
    assert _out(cli("topics", "get-properties", topic)) == {}

    partitioned = f"persistent://{ns}/parted-props"
    cli("topics", "create-partitioned-topic", partitioned, "-p", "2", "-m", "k=v")
    assert _out(cli("topics", "get-properties", partitioned)) == {"k": "v"}
    cli("topics", "update-partitioned-topic", partitioned, "-p", "3")
    assert _out(cli("topics", "get-partitioned-topic-metadata", partitioned)) == \
        {"partitions": 3, "deleted": False, "properties": {"k": "v"}}
    cli("topics", "update-properties", partitioned, "-p", "k2=v2")
    assert _out(cli("topics", "get-properties", partitioned)) == {"k": "v", "k2": "v2"}
    cli("topics", "delete-partitioned-topic", partitioned)
    cli("topics", "create-partitioned-topic", partitioned, "-p", "2")
    assert _out(cli("topics", "get-properties", partitioned)) == {}

    missing = cli("topics", "get-properties", f"persistent://{ns}/missing", check=False)
    assert missing.returncode == 1 and "404" in missing.stderr


def test_topic_properties_bad_input(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/persistent/{ns}"
    assert status_of(admin.put, f"{base}/bad-props", {"n": 1})[0] == 400
    assert status_of(admin.put, f"{base}/bad-parted/partitions", {"partitions": 2, "properties": []})[0] == 400
    admin.put(f"{base}/props")
    assert status_of(admin.put, f"{base}/props/properties", ["a"])[0] == 400
    assert status_of(admin.delete, f"{base}/props/properties")[0] == 400
    admin.put(f"/admin/v2/non-persistent/{ns}/np")
    assert status_of(admin.get, f"/admin/v2/non-persistent/{ns}/np/properties")[0] == 405


def test_topic_properties_survive_a_restart(tmp_path: Path) -> None:
    server = Standalone(tmp_path).start()
    try:
        admin = AdminClient(server.addresses["web"][0], timeout=30)
        base = "/admin/v2/persistent/public/default"
        admin.put(f"{base}/kept", {"a": "1"})
        admin.put(f"{base}/kept-parted/partitions", {"partitions": 2, "properties": {"b": "2"}})
        assert server.stop() == 0
        server.start()
        admin = AdminClient(server.addresses["web"][0], timeout=30)
        assert admin.get(f"{base}/kept/properties") == {"a": "1"}
        assert admin.get(f"{base}/kept-parted/properties") == {"b": "2"}
    finally:
        server.kill()


# -- namespace properties -----------------------------------------------------------------------------


def test_namespace_properties_verbs(cli: Cli, ns: str, admin: AdminClient) -> None:
    assert _out(cli("namespaces", "get-properties", ns)) == {}
    assert cli("namespaces", "get-property", ns, "-k", "a").stdout.strip() == "null"
    cli("namespaces", "set-property", ns, "-k", "a", "-v", "1")
    assert cli("namespaces", "get-property", ns, "-k", "a").stdout.strip() == "1"
    cli("namespaces", "set-properties", ns, "-p", "b=2,c=3", "-p", "d=4")
    assert _out(cli("namespaces", "get-properties", ns)) == {"a": "1", "b": "2", "c": "3", "d": "4"}
    # pulsar-admin prints the value it removed, null when there was none
    assert cli("namespaces", "remove-property", ns, "-k", "a").stdout.strip() == "1"
    assert cli("namespaces", "remove-property", ns, "-k", "a").stdout.strip() == "null"
    # the Policies document carries them as Pulsar's `properties`
    assert _out(cli("namespaces", "policies", ns))["properties"] == {"b": "2", "c": "3", "d": "4"}
    cli("namespaces", "clear-properties", ns)
    assert _out(cli("namespaces", "get-properties", ns)) == {}
    assert admin.get(f"/admin/v2/namespaces/{ns}")["properties"] == {}

    # the REST answer for one value is the value itself, as Pulsar's
    admin.put(f"/admin/v2/namespaces/{ns}/property/k/v")
    assert admin.request("GET", f"/admin/v2/namespaces/{ns}/property/k").body == b"v"
    assert status_of(admin.put, f"/admin/v2/namespaces/{ns}/properties", {"n": 1})[0] == 400
    assert status_of(admin.get, "/admin/v2/namespaces/public/no-such-ns/properties")[0] == 404


# -- message id by time -------------------------------------------------------------------------------


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def test_get_message_id_finds_the_first_message_at_or_after_a_time(cli: Cli, ns: str,
                                                                    client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/timed"
    producer = client.create_producer(topic, batching_enabled=False)
    ids, after = [], []
    for body in (b"a", b"b", b"c"):
        ids.append(producer.send(body))
        # the message was stamped (by client and broker) by the time its receipt came:
        # a millisecond later, only later messages are at or after the time
        after.append(int(time.time() * 1000) + 1)
        wait_for(lambda t=after[-1]: int(time.time() * 1000) >= t)
    producer.close()

    def found(ms: int) -> tuple[int, int]:
        got = _out(cli("topics", "get-message-id", topic, "-d", _iso(ms)))
        assert isinstance(got, dict) and got["partitionIndex"] == -1
        return got["ledgerId"], got["entryId"]

    expected = [(m.ledger_id(), m.entry_id()) for m in ids]
    assert found(after[0] - 3_600_000) == expected[0]
    assert found(after[0]) == expected[1]
    assert found(after[1]) == expected[2]
    later = cli("topics", "get-message-id", topic, "-d", _iso(after[2]), check=False)
    assert later.returncode == 1 and "Message ID not found" in later.stderr

    cli("topics", "create-partitioned-topic", f"persistent://{ns}/parted", "-p", "2")
    parted = cli("topics", "get-message-id", f"persistent://{ns}/parted", "-d", _iso(after[0]), check=False)
    assert parted.returncode == 1 and "412" in parted.stderr
    naive = cli("topics", "get-message-id", topic, "-d", "2021-06-28T16:53:08", check=False)
    assert naive.returncode == 2


# -- backlog size ----------------------------------------------------------------------------------------


def test_get_backlog_size_counts_the_bytes_after_a_message(cli: Cli, ns: str, admin: AdminClient,
                                                           client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/sized"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"%04d" % i) for i in range(10)]
    producer.close()
    total = admin.get(f"/admin/v2/persistent/{ns}/sized/internalStats")["totalSize"]
    assert total > 0

    def size(*flags: str) -> int:
        return int(cli("topics", "get-backlog-size", topic, *flags).stdout)

    # as Pulsar: the entries after the one named, at the ledger's average entry size
    assert size() == total
    assert size("-m", f"{ids[3].ledger_id()}:{ids[3].entry_id()}") == 6 * (total // 10)
    assert size("--messageId", f"{ids[9].ledger_id()}:{ids[9].entry_id()}") == 0

    base = f"/admin/v2/persistent/{ns}"
    assert status_of(admin.put, f"{base}/sized/backlogSize", {"entryId": 1})[0] == 400
    assert status_of(admin.put, f"{base}/missing/backlogSize", {"ledgerId": -1, "entryId": -1})[0] == 404


# -- create missed partitions ------------------------------------------------------------------------------


def test_create_missed_partitions(cli: Cli, ns: str, admin: AdminClient) -> None:
    topic = f"persistent://{ns}/gappy"
    cli("topics", "create-partitioned-topic", topic, "-p", "3")
    partitions = [f"/admin/v2/persistent/{ns}/gappy-partition-{i}" for i in range(3)]
    # a partitioned topic's partitions are created when first used: until then, none exists
    assert [status_of(admin.get, f"{p}/partitions")[0] for p in partitions] == [404] * 3
    cli("topics", "create-missed-partitions", topic)
    assert [admin.get(f"{p}/partitions") for p in partitions] == [{"partitions": 0, "deleted": False}] * 3
    cli("topics", "create-missed-partitions", topic)  # nothing left to create: no error

    cli("topics", "create", f"persistent://{ns}/plain")
    plain = cli("topics", "create-missed-partitions", f"persistent://{ns}/plain", check=False)
    assert plain.returncode == 1 and "does not exist" in plain.stderr and "404" in plain.stderr


# -- partitioned internal stats ------------------------------------------------------------------------------


def test_partitioned_stats_internal(cli: Cli, ns: str, client: pulsar.Client) -> None:
    topic = f"persistent://{ns}/parted-internal"
    cli("topics", "create-partitioned-topic", topic, "-p", "2")
    producer = client.create_producer(f"{topic}-partition-1", batching_enabled=False)
    for _ in range(3):
        producer.send(b"x")
    producer.close()

    stats = _out(cli("topics", "partitioned-stats-internal", topic))
    assert isinstance(stats, dict)
    assert stats["metadata"] == {"partitions": 2, "deleted": False}
    assert sorted(stats["partitions"]) == [f"{topic}-partition-0", f"{topic}-partition-1"]
    # each partition's entry is what stats-internal shows for it
    one = stats["partitions"][f"{topic}-partition-1"]
    assert one["numberOfEntries"] == 3 and stats["partitions"][f"{topic}-partition-0"]["numberOfEntries"] == 0
    assert one["ledgers"] == _out(cli("topics", "stats-internal", f"{topic}-partition-1"))["ledgers"]

    cli("topics", "create", f"persistent://{ns}/single")
    single = cli("topics", "partitioned-stats-internal", f"persistent://{ns}/single", check=False)
    assert single.returncode == 1 and "404" in single.stderr


# -- trim ------------------------------------------------------------------------------------------------


def test_trim_topic_runs_the_retention_check_at_once(tmp_path: Path) -> None:
    # The periodic retention check is an hour away, so only trim-topic seals the ledger
    # that has been idle past the inactive rollover time and deletes it, every message in
    # it being acknowledged and retention keeping none.
    conf = {"retentionCheckIntervalInSeconds": 3600, "managedLedgerInactiveLedgerRolloverTimeSeconds": 1}
    server = Standalone(tmp_path, conf=conf).start()
    try:
        web = server.addresses["web"][0]
        admin = AdminClient(web, timeout=30)
        topic = "persistent://public/default/trimmed"
        internal = "/admin/v2/persistent/public/default/trimmed/internalStats"
        client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10)
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, batching_enabled=False)
        last = [producer.send(b"m%d" % i) for i in range(5)][-1]
        idle_from = time.monotonic()
        for _ in range(5):
            consumer.acknowledge(consumer.receive(5000))
        acked = f"{last.ledger_id()}:{last.entry_id()}"
        wait_for(lambda: admin.get(internal)["cursors"]["s"]["markDeletePosition"] == acked)
        wait_for(lambda: time.monotonic() > idle_from + 1.5)  # idle past the rollover time
        assert [led["ledgerId"] for led in admin.get(internal)["ledgers"]] == [last.ledger_id()]

        proc = subprocess.run([sys.executable, "-m", "gateway", "admin", "--admin-url", web,
                               "topics", "trim-topic", topic], capture_output=True, text=True,
                              timeout=CLI_TIMEOUT)
        assert proc.returncode == 0, proc.stderr
        after = admin.get(internal)
        assert last.ledger_id() not in [led["ledgerId"] for led in after["ledgers"]]
        assert after["numberOfEntries"] == 0
        client.close()

        admin.put("/admin/v2/persistent/public/default/parted/partitions", 2)
        admin.post("/admin/v2/persistent/public/default/parted/trim")  # every partition
        assert status_of(admin.post, "/admin/v2/non-persistent/public/default/np/trim")[0] == 405
        assert status_of(admin.post, "/admin/v2/persistent/public/default/missing/trim")[0] == 404
    finally:
        server.kill()
