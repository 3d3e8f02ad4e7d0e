"""Subscription operations over REST with real pulsar-client traffic: create, list,
delete, skip, skip-all, expire, reset-cursor by time and by id, peek, get by id, examine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pulsar

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

from .conftest import status_of, wait_for


def _fill(client: pulsar.Client, topic: str, n: int, **kw: object) -> list[pulsar.MessageId]:
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode(), **kw) for i in range(n)]  # type: ignore[arg-type]
    producer.close()
    return ids


def _backlog(admin: AdminClient, path: str, sub: str) -> int:
    return int(admin.get(f"{path}/stats")["subscriptions"][sub]["msgBacklog"])


def _partitioned(admin: AdminClient, ns: str) -> tuple[str, str]:
    """A topic of two partitions in ``ns`` with the subscription ``s``: its name and its
    admin path."""
    topic, path = f"persistent://{ns}/p", f"/admin/v2/persistent/{ns}/p"
    admin.put(f"{path}/partitions", 2)
    admin.put(f"{path}/subscription/s")
    return topic, path


def test_create_list_delete(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    _fill(client, topic, 3)
    admin.put(f"{path}/subscription/from-start", {"ledgerId": -1, "entryId": -1})
    admin.put(f"{path}/subscription/from-end")
    assert status_of(admin.put, f"{path}/subscription/from-end")[0] == 409
    assert admin.get(f"{path}/subscriptions") == ["from-end", "from-start"]
    assert _backlog(admin, path, "from-start") == 3
    assert _backlog(admin, path, "from-end") == 0
    consumer = client.subscribe(topic, "from-start")
    assert status_of(admin.delete, f"{path}/subscription/from-start") == \
        (412, "Subscription has active connected consumers")
    consumer.close()
    admin.delete(f"{path}/subscription/from-start")
    assert admin.get(f"{path}/subscriptions") == ["from-end"]
    assert status_of(admin.delete, f"{path}/subscription/nope") == (404, "Subscription not found")


def test_skip_and_clear_backlog(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/s")
    _fill(client, topic, 10)
    admin.post(f"{path}/subscription/s/skip/4")
    assert _backlog(admin, path, "s") == 6
    consumer = client.subscribe(topic, "s")
    assert consumer.receive(timeout_millis=10_000).data() == b"m4"
    consumer.close()
    admin.post(f"{path}/subscription/s/skip_all")
    assert _backlog(admin, path, "s") == 0
    assert status_of(admin.post, f"{path}/subscription/s/skip/-1")[0] == 412
    assert status_of(admin.post, f"{path}/subscription/s/skip/many")[0] == 400


def test_expire(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/a")
    admin.put(f"{path}/subscription/b")
    _fill(client, topic, 5)
    admin.post(f"{path}/subscription/a/expireMessages/3600")
    assert _backlog(admin, path, "a") == 5  # nothing is an hour old
    admin.post(f"{path}/subscription/a/expireMessages/0")
    assert _backlog(admin, path, "a") == 0
    stats = admin.get(f"{path}/stats")["subscriptions"]["a"]
    assert stats["totalMsgExpired"] == 5
    admin.post(f"{path}/all_subscription/expireMessages/0")
    assert _backlog(admin, path, "b") == 0


def test_reset_cursor_by_id_and_time(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/s")
    before = int(time.time() * 1000)
    ids = _fill(client, topic, 6)
    admin.post(f"{path}/subscription/s/skip_all")
    target = ids[2]
    admin.post(f"{path}/subscription/s/resetcursor",
               {"ledgerId": target.ledger_id(), "entryId": target.entry_id(), "partitionIndex": -1})
    assert _backlog(admin, path, "s") == 4
    consumer = client.subscribe(topic, "s")
    assert consumer.receive(timeout_millis=10_000).data() == b"m2"
    consumer.close()
    admin.post(f"{path}/subscription/s/resetcursor/{before}")
    assert _backlog(admin, path, "s") == 6
    admin.post(f"{path}/subscription/s/resetcursor", {"ledgerId": target.ledger_id(), "entryId": target.entry_id()},
               isExcluded="true")
    assert _backlog(admin, path, "s") == 3
    assert status_of(admin.post, f"{path}/subscription/s/resetcursor/yesterday")[0] == 400
    assert status_of(admin.post, f"{path}/subscription/zz/resetcursor/0")[0] == 404


def test_reset_cursor_redelivers_to_connected_consumer(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    _fill(client, topic, 3)
    for _ in range(3):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    wait_for(lambda: _backlog(admin, path, "s") == 0)
    admin.post(f"{path}/subscription/s/resetcursor", {"ledgerId": -1, "entryId": -1})
    assert consumer.receive(timeout_millis=10_000).data() == b"m0"
    consumer.close()


def test_peek_get_by_id_examine(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/s")
    props = {"color": "red", "Mixed-Case": "v", "city=shanghai": "tag"}
    ids = _fill(client, topic, 3, properties=props, partition_key="k")
    admin.post(f"{path}/subscription/s/skip/1")
    reply = admin.request("GET", f"{path}/subscription/s/position/1")
    assert reply.body == b"m1"
    headers = {k.lower(): v for k, v in reply.headers.items()}
    assert headers["x-pulsar-message-id"] == f"{ids[1].ledger_id()}:{ids[1].entry_id()}"
    assert headers["x-pulsar-property-color"] == "red"
    # Pulsar 3.1+ admin clients read them all from one JSON header, names as they are
    assert json.loads(headers["x-pulsar-property"]) == props
    assert headers["x-pulsar-partition-key"] == "k"
    # the broker entry metadata, under the names Pulsar's admin client reads: the index of
    # the entry's last message (the second message has index 1) and the broker's time
    assert headers["x-pulsar-broker-entry-metadata-index"] == "1"
    assert headers["x-pulsar-broker-entry-metadata-timestamp"].startswith(
        headers["x-pulsar-publish-time"][:4])
    assert admin.request("GET", f"{path}/subscription/s/position/2").body == b"m2"
    assert status_of(admin.request, "GET", f"{path}/subscription/s/position/3")[0] == 404
    assert status_of(admin.request, "GET", f"{path}/subscription/s/position/0")[0] == 412
    by_id = admin.request("GET", f"{path}/ledger/{ids[0].ledger_id()}/entry/{ids[0].entry_id()}")
    assert by_id.body == b"m0"
    assert status_of(admin.request, "GET", f"{path}/ledger/{ids[0].ledger_id()}/entry/999")[0] == 404
    first = admin.request("GET", f"{path}/examinemessage", query={"initialPosition": "earliest",
                                                                   "messagePosition": 1})
    assert first.body == b"m0"
    last = admin.request("GET", f"{path}/examinemessage", query={"initialPosition": "latest",
                                                                  "messagePosition": 1})
    assert last.body == b"m2"


def test_peek_batch(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    admin.put(path)
    admin.put(f"{path}/subscription/s")
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                      batching_max_publish_delay_ms=1000,
                                      compression_type=pulsar.CompressionType.LZ4)
    for i in range(3):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    producer.close()
    reply = admin.request("GET", f"{path}/subscription/s/position/1")
    headers = {k.lower(): v for k, v in reply.headers.items()}
    assert headers["x-pulsar-num-batch-message"] == "3"
    from gateway._admin_cli import _split_batch

    assert _split_batch(reply.body, 3) == [b"b0", b"b1", b"b2"]


def test_subscription_properties_from_subscribe_admin_and_stats(admin: AdminClient, ns: str,
                                                                server: Standalone) -> None:
    # The official Python client cannot send subscription properties; a raw SUBSCRIBE can.
    from core.format import pulsar_api_pb2 as pb
    from handlers.pulsar import _events as ev
    from tests.handlers.pulsar._raw import RawClient

    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    raw = RawClient(server.pulsar_url)
    try:
        raw.connect()
        raw.send(ev.CommandSubscribe.build(
            topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared, consumer_id=1,
            request_id=1, subscription_properties=[pb.KeyValue(key="team", value="billing")]))
        assert isinstance(raw.next_event(), ev.CommandSuccess)
        assert admin.get(f"{path}/stats")["subscriptions"]["s"]["subscriptionProperties"] == {
            "team": "billing"}
        assert admin.get(f"{path}/subscription/s/properties") == {"team": "billing"}
    finally:
        raw.close()
    admin.put(f"{path}/subscription/s/properties", {"a": "b"})  # replaces them all
    assert admin.get(f"{path}/subscription/s/properties") == {"a": "b"}
    assert status_of(admin.put, f"{path}/subscription/s/properties", {"a": 1})[0] == 400
    admin.put(f"{path}/subscription/s2", {"ledgerId": -1, "entryId": -1, "properties": {"x": "y"}})
    assert admin.get(f"{path}/stats")["subscriptions"]["s2"]["subscriptionProperties"] == {"x": "y"}


def test_a_subscription_a_consumer_asks_to_replicate_is_replicated(admin: AdminClient, ns: str,
                                                                   client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/t", f"/admin/v2/persistent/{ns}/t"
    client.subscribe(topic, "plain").close()
    consumer = client.subscribe(topic, "geo", replicate_subscription_state_enabled=True)
    subs = admin.get(f"{path}/stats")["subscriptions"]
    assert subs["geo"]["isReplicated"] is True
    assert subs["plain"]["isReplicated"] is False
    consumer.close()
    client.subscribe(topic, "plain", replicate_subscription_state_enabled=True).close()
    admin.put(f"{path}/unload")  # the mark is kept with the subscription
    subs = admin.get(f"{path}/stats")["subscriptions"]
    assert subs["geo"]["isReplicated"] is True and subs["plain"]["isReplicated"] is True
    admin.delete(f"{path}/subscription/geo")
    client.subscribe(topic, "geo").close()
    assert admin.get(f"{path}/stats")["subscriptions"]["geo"]["isReplicated"] is False


def test_replicated_subscriptions_turned_off_mark_nothing(tmp_path: Path) -> None:
    """With the key off, a consumer's request to replicate is not kept: turning the key on
    later does not make the subscription replicated."""
    for enabled in (False, True):
        with Standalone(tmp_path, conf={"enableReplicatedSubscriptions": enabled}) as server:
            admin = AdminClient(server.addresses["web"][0], timeout=30)
            client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10)
            try:
                if not enabled:
                    client.subscribe("geo-off", "geo", replicate_subscription_state_enabled=True).close()
                stats = admin.get("/admin/v2/persistent/public/default/geo-off/stats")
                assert stats["subscriptions"]["geo"]["isReplicated"] is False
            finally:
                client.close()


def test_skip_expire_peek_and_last_message_id_are_refused_on_a_non_persistent_topic(
        admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    topic, path = f"non-persistent://{ns}/np", f"/admin/v2/non-persistent/{ns}/np"
    consumer = client.subscribe(topic, "s")
    for call, reason in [
        ("subscription/s/skip/1", "Skip messages on a non-persistent topic is not allowed"),
        ("subscription/s/skip_all", "Skip all messages on a non-persistent topic is not allowed"),
        ("subscription/s/expireMessages/0", "Expire messages on a non-persistent topic is not allowed"),
        ("all_subscription/expireMessages/0",
         "Expire messages for all subscriptions on a non-persistent topic is not allowed"),
    ]:
        assert status_of(admin.post, f"{path}/{call}") == (405, reason)
    assert status_of(admin.request, "GET", f"{path}/subscription/s/position/1") == \
        (405, "Peek messages on a non-persistent topic is not allowed")
    assert status_of(admin.request, "GET", f"{path}/lastMessageId") == \
        (405, "GetLastMessageId on a non-persistent topic is not allowed")
    consumer.close()
    missing = f"/admin/v2/non-persistent/{ns}/never"
    assert status_of(admin.post, f"{missing}/subscription/s/skip_all")[0] == 404


def test_peek_and_examine_refuse_a_partitioned_topic(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    # Pulsar answers 405 on the base name (only partitions hold messages) and serves each partition.
    topic, path = _partitioned(admin, ns)
    _fill(client, f"{topic}-partition-0", 1)
    assert status_of(admin.request, "GET", f"{path}/subscription/s/position/1") == \
        (405, "Peek messages on a partitioned topic is not allowed")
    assert status_of(admin.request, "GET", f"{path}/examinemessage")[0] == 405
    assert admin.request("GET", f"{path}-partition-0/subscription/s/position/1").body == b"m0"
    assert admin.request("GET", f"{path}-partition-0/examinemessage").body == b"m0"


def test_reset_cursor_by_id_refuses_a_partitioned_topic(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    # Pulsar: 405 on the base name (a message id is one partition's); by time and per partition work.
    topic, path = _partitioned(admin, ns)
    ids = _fill(client, f"{topic}-partition-1", 3)
    assert status_of(admin.post, f"{path}/subscription/s/resetcursor", {"ledgerId": -1, "entryId": -1}) == \
        (405, "Reset-cursor at position is not allowed for partitioned-topic")
    assert _backlog(admin, f"{path}-partition-1", "s") == 3
    admin.post(f"{path}-partition-1/subscription/s/resetcursor",
               {"ledgerId": ids[1].ledger_id(), "entryId": ids[1].entry_id()})
    assert _backlog(admin, f"{path}-partition-1", "s") == 2
    admin.post(f"{path}/subscription/s/resetcursor/0")
    assert _backlog(admin, f"{path}-partition-1", "s") == 3


def test_create_subscription_creates_a_missing_topic(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    # Pulsar loads the topic with auto-creation (allowed by default), so the subscription
    # exists before any producer; with auto-creation off the topic stays missing: 404.
    topic, path = f"persistent://{ns}/new", f"/admin/v2/persistent/{ns}/new"
    admin.put(f"{path}/subscription/s")
    assert admin.get(f"{path}/subscriptions") == ["s"]
    _fill(client, topic, 2)
    assert _backlog(admin, path, "s") == 2
    admin.post(f"/admin/v2/namespaces/{ns}/autoTopicCreation",
               {"allowAutoTopicCreation": False, "topicType": "non-partitioned"})
    assert status_of(admin.put, f"/admin/v2/persistent/{ns}/other/subscription/s")[0] == 404


def test_skip_refuses_a_partitioned_topic(admin: AdminClient, ns: str, client: pulsar.Client) -> None:
    # Pulsar: skip N is 405 on the base name, served per partition; skip-all serves every partition.
    topic, path = _partitioned(admin, ns)
    _fill(client, f"{topic}-partition-0", 3)
    assert status_of(admin.post, f"{path}/subscription/s/skip/1") == \
        (405, "Skip messages on a partitioned topic is not allowed")
    assert _backlog(admin, f"{path}-partition-0", "s") == 3
    admin.post(f"{path}-partition-0/subscription/s/skip/1")
    assert _backlog(admin, f"{path}-partition-0", "s") == 2
    admin.post(f"{path}/subscription/s/skip_all")
    assert _backlog(admin, f"{path}-partition-0", "s") == 0
