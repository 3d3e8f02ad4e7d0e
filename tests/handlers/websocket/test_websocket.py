"""Pulsar's WebSocket API against a real standalone, driven by a generic WebSocket client
(websocket-client) and checked with the official pulsar-client on the other side."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import websocket

from core.format import MessageIdData
from gateway._admin_cli import AdminClient, AdminError
from tests._standalone import Standalone

TIMEOUT = 15.0
ABSENT = 0.5
"""How long a test waits to see that nothing more arrives (a negative check)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def message_id(text: str) -> MessageIdData:
    mid = MessageIdData()
    mid.ParseFromString(base64.b64decode(text))
    return mid


def ws_base(s: Standalone) -> str:
    return s.addresses["web"][0].replace("http://", "ws://") + "/ws/v2"


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def connect(standalone: Standalone) -> Iterator[Callable[[str], websocket.WebSocket]]:
    opened: list[websocket.WebSocket] = []

    def open_ws(path: str) -> websocket.WebSocket:
        ws = websocket.create_connection(f"{ws_base(standalone)}/{path}", timeout=TIMEOUT)
        opened.append(ws)
        return ws

    yield open_ws
    for ws in opened:
        ws.close()


def recv_json(ws: websocket.WebSocket, timeout: float = TIMEOUT) -> dict[str, Any]:
    ws.settimeout(timeout)
    return json.loads(ws.recv())


def nothing_arrives(ws: websocket.WebSocket) -> bool:
    ws.settimeout(ABSENT)
    try:
        ws.recv()
    except websocket.WebSocketTimeoutException:
        return True
    return False


def receive_and_ack(consumers: list[websocket.WebSocket], count: int) -> list[tuple[int, dict[str, Any]]]:
    """``count`` messages from whichever of ``consumers`` has one, each acknowledged, as
    (the consumer's index, the message)."""
    got: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} messages arrived"
        for n, ws in enumerate(consumers):
            ws.settimeout(0.2)
            try:
                m = json.loads(ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            got.append((n, m))
            ws.send(json.dumps({"messageId": m["messageId"]}))
    return got


def publish(ws: websocket.WebSocket, payload: bytes, **fields: Any) -> dict[str, Any]:
    ws.send(json.dumps({"payload": b64(payload), **fields}))
    return recv_json(ws)


# -- producer ------------------------------------------------------------------------------------


def test_websocket_producer_message_is_read_by_pulsar_client(connect, client, unique):
    topic = f"persistent://public/default/ws-prod-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = connect(f"producer/persistent/public/default/ws-prod-{unique}?producerName=wsp-{unique}")
    ack = publish(producer, b"\x00hello\xff", key="k1", properties={"a": "1", "b": "two"},
                  context="ctx-1", eventTime="2024-01-02T03:04:05.678Z")
    assert ack["result"] == "ok" and ack["context"] == "ctx-1"
    msg = consumer.receive(int(TIMEOUT * 1000))
    assert msg.data() == b"\x00hello\xff"
    assert msg.partition_key() == "k1"
    assert msg.properties() == {"a": "1", "b": "two"}
    assert msg.event_timestamp() == 1704164645678
    mid = message_id(ack["messageId"])
    assert (mid.ledgerId, mid.entryId) == (msg.message_id().ledger_id(), msg.message_id().entry_id())
    assert not mid.HasField("partition") and mid.HasField("batch_size") and mid.batch_size == 0


def test_websocket_producer_answers_bad_frames_as_pulsar_and_keeps_serving(connect, unique):
    producer = connect(f"producer/persistent/public/default/ws-bad-{unique}")
    producer.send("this is not json")
    assert recv_json(producer)["result"] == "send-error:3"
    producer.send(json.dumps({"payload": "not base64 !!", "context": "c2"}))
    bad = recv_json(producer)
    assert bad["result"] == "send-error:7" and bad["context"] == "c2"
    assert bad["errorMsg"].startswith("Invalid Base64 message-payload")
    producer.send(json.dumps({"context": "c3"}))
    assert recv_json(producer) == {"result": "send-error:7", "context": "c3", "errorCode": 0,
                                   "schemaVersion": 0}
    producer.send(json.dumps({"payload": b64(b"x"), "eventTime": "yesterday", "context": "c4"}))
    assert recv_json(producer)["result"] == "send-error:7"
    producer.send('{"payload": "eA==", "key": "\\ud800", "context": "c6"}')  # a lone surrogate
    assert recv_json(producer)["result"] == "send-error:7"
    ok = publish(producer, b"still here", context="c5")
    assert (ok["result"], ok["context"]) == ("ok", "c5")


def test_publishes_not_stored_within_the_send_timeout_fail(connect, admin, unique):
    ns = f"public/ws-slow-{unique}"
    admin.put(f"/admin/v2/namespaces/{ns}")
    admin.post(f"/admin/v2/namespaces/{ns}/publishRate", {"publishThrottlingRateInMsg": 1})
    producer = connect(f"producer/persistent/{ns}/t?sendTimeoutMillis=300")
    for i in range(4):
        producer.send(json.dumps({"payload": b64(b"slow"), "context": str(i)}))
    answers = {a["context"]: a for a in (recv_json(producer) for _ in range(4))}
    assert answers["0"]["result"] == "ok"
    late = answers["3"]
    assert late["result"] == "send-error:8" and "within given timeout" in late["errorMsg"]


def test_websocket_sessions_carry_on_after_the_topic_unloads(connect, admin, unique):
    name = f"ws-unload-{unique}"
    ws = connect(f"consumer/persistent/public/default/{name}/sub")
    producer = connect(f"producer/persistent/public/default/{name}?producerName=u-{unique}")
    assert publish(producer, b"before")["result"] == "ok"
    ws.send(json.dumps({"messageId": recv_json(ws)["messageId"]}))
    admin.put(f"/admin/v2/persistent/public/default/{name}/unload")
    assert publish(producer, b"after")["result"] == "ok"
    assert base64.b64decode(recv_json(ws)["payload"]) == b"after"
    stats = admin.get(f"/admin/v2/persistent/public/default/{name}/stats")
    assert [p["producerName"] for p in stats["publishers"]] == [f"u-{unique}"]


def test_batching_websocket_producer_stores_batches(connect, client, unique):
    topic = f"persistent://public/default/ws-batch-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = connect(f"producer/persistent/public/default/ws-batch-{unique}"
                       "?batchingEnabled=true&batchingMaxMessages=3&batchingMaxPublishDelay=50")
    for i in range(4):  # a full batch of 3, then one that its delay sends
        producer.send(json.dumps({"payload": b64(f"m{i}".encode()), "key": f"k{i}", "context": str(i)}))
    acks = [recv_json(producer) for _ in range(4)]
    assert [a["context"] for a in acks] == ["0", "1", "2", "3"]
    ids = [message_id(a["messageId"]) for a in acks]
    assert len({(i.ledgerId, i.entryId) for i in ids[:3]}) == 1
    assert [(i.batch_index, i.batch_size) for i in ids] == [(0, 3), (1, 3), (2, 3), (0, 1)]
    got = [consumer.receive(int(TIMEOUT * 1000)) for _ in range(4)]
    assert [(m.data(), m.partition_key()) for m in got] == [(f"m{i}".encode(), f"k{i}") for i in range(4)]
    assert got[0].message_id().batch_index() == 0 and got[2].message_id().batch_index() == 2


def test_websocket_producer_routes_keys_over_partitions(connect, client, admin, unique):
    name = f"ws-part-{unique}"
    admin.put(f"/admin/v2/persistent/public/default/{name}/partitions", 3)
    consumer = client.subscribe(f"persistent://public/default/{name}", "s")
    producer = connect(f"producer/persistent/public/default/{name}")
    partitions = {}
    for key in ("a", "b", "c", "d", "e", "f"):
        ack = publish(producer, key.encode(), key=key)
        assert ack["result"] == "ok"
        partitions[key] = message_id(ack["messageId"]).partition
    # Pulsar's routing of a key: Java's String.hashCode & Integer.MAX_VALUE, mod partitions
    assert partitions == {k: (ord(k) & 0x7FFFFFFF) % 3 for k in partitions}
    got = {}
    for _ in partitions:
        msg = consumer.receive(int(TIMEOUT * 1000))
        got[msg.partition_key()] = msg.topic_name()
    assert {k: t.rsplit("-", 1)[1] for k, t in got.items()} == {k: str(p) for k, p in partitions.items()}


# -- consumer ------------------------------------------------------------------------------------


def test_pulsar_client_batched_and_plain_messages_reach_a_websocket_consumer(connect, client, admin,
                                                                           unique):
    name = f"ws-cons-{unique}"
    ws = connect(f"consumer/persistent/public/default/{name}/sub?consumerName=wsc-{unique}")
    batched = client.create_producer(f"persistent://public/default/{name}", batching_enabled=True,
                                     batching_max_publish_delay_ms=100)
    for i in range(3):
        batched.send_async(f"b{i}".encode(), None, partition_key=f"k{i}", properties={"i": str(i)})
    batched.flush()
    plain = client.create_producer(f"persistent://public/default/{name}", batching_enabled=False)
    plain.send(b"plain", event_timestamp=1704164645678)
    got = [recv_json(ws) for _ in range(4)]
    assert [base64.b64decode(m["payload"]) for m in got] == [b"b0", b"b1", b"b2", b"plain"]
    assert [m.get("key") for m in got[:3]] == ["k0", "k1", "k2"]
    assert [m["properties"] for m in got[:3]] == [{"i": "0"}, {"i": "1"}, {"i": "2"}]
    ids = [message_id(m["messageId"]) for m in got]
    assert [(i.batch_index, i.batch_size) for i in ids[:3]] == [(0, 3), (1, 3), (2, 3)]
    assert not ids[3].HasField("batch_index") and got[3]["eventTime"].startswith("2024-01-02T")
    assert all(m["redeliveryCount"] == 0 for m in got)

    def stats() -> dict[str, Any]:
        return admin.get(f"/admin/v2/persistent/public/default/{name}/stats")["subscriptions"]["sub"]

    consumer = stats()["consumers"][0]
    assert consumer["consumerName"] == f"wsc-{unique}" and consumer["address"].startswith("/127.0.0.1:")
    assert stats()["msgBacklog"] == 2  # entries: the batch, and the plain message
    ws.send(json.dumps({"messageId": got[3]["messageId"]}))
    wait_for(lambda: stats()["msgBacklog"] == 1, "the plain message's ack")
    for m in got[:2]:  # part of the batch: the batch stays in the backlog
        ws.send(json.dumps({"messageId": m["messageId"]}))
    ws.send(json.dumps({"type": "isEndOfTopic"}))  # answered after the acks before it
    assert recv_json(ws) == {"endOfTopic": False}
    assert stats()["msgBacklog"] == 1
    ws.send(json.dumps({"messageId": got[2]["messageId"]}))
    wait_for(lambda: stats()["msgBacklog"] == 0, "the batch's last ack to empty the backlog")
    ws.close()
    wait_for(lambda: stats()["consumers"] == [], "the closed session's consumer to leave")


def _open_sealed(message: dict[str, Any]) -> bytes:
    """What a key holder reads from an encrypted message a consumer was given as is: the
    data key under the test private key (RSA-OAEP), the payload under it (AES-GCM, the
    context's param as IV), then decompressed."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from core.format import LZ4, decompress
    from tests.handlers.pulsar._keys import KEYS

    ctx = message["encryptionContext"]
    private = serialization.load_pem_private_key((KEYS / "test-private.pem").read_bytes(), None)
    data_key = private.decrypt(base64.b64decode(ctx["keys"]["app-key"]["keyValue"]),  # type: ignore[union-attr]
                               padding.OAEP(padding.MGF1(hashes.SHA1()), hashes.SHA1(), None))
    sealed = AESGCM(data_key).decrypt(base64.b64decode(ctx["param"]), base64.b64decode(message["payload"]), None)
    assert ctx["compressionType"] == "LZ4"
    return decompress(LZ4, sealed, ctx["uncompressedMessageSize"])


def test_encrypted_messages_reach_websocket_consumers_per_crypto_failure_action(connect, client, admin,
                                                                               unique):
    """The broker holds no key: with ``cryptoFailureAction=CONSUME`` an encrypted message
    arrives as stored, with its encryption context (a batch whole); with FAIL (the
    default) it is not delivered and stays in the backlog; with DISCARD it is not
    delivered and is acknowledged."""
    from tests.handlers.pulsar._keys import key_reader

    name = f"ws-sealed-{unique}"
    path = f"consumer/persistent/public/default/{name}"
    consume = connect(f"{path}/consume?cryptoFailureAction=CONSUME")
    fail = connect(f"{path}/fail")
    discard = connect(f"{path}/discard?cryptoFailureAction=DISCARD")
    topic = f"persistent://public/default/{name}"
    sealed = client.create_producer(topic, batching_enabled=False, encryption_key="app-key",
                                    crypto_key_reader=key_reader(), compression_type=pulsar.CompressionType.LZ4)
    sealed.send(b"secret " * 20, partition_key="k", properties={"p": "1"})
    batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50,
                                     encryption_key="app-key", crypto_key_reader=key_reader(),
                                     compression_type=pulsar.CompressionType.LZ4)
    for i in range(2):
        batched.send_async(f"in a batch {i}".encode(), None)
    batched.flush()
    client.create_producer(topic, batching_enabled=False).send(b"plain")

    one, batch, plain = (recv_json(consume) for _ in range(3))
    ctx = one["encryptionContext"]
    assert base64.b64decode(one["payload"]) != b"secret " * 20
    assert (one["key"], one["properties"]) == ("k", {"p": "1"})
    assert set(ctx) == {"keys", "param", "algorithm", "compressionType", "uncompressedMessageSize", "batchSize"}
    assert list(ctx["keys"]) == ["app-key"] and ctx["batchSize"] is None
    assert ctx["uncompressedMessageSize"] == len(b"secret " * 20)
    assert _open_sealed(one) == b"secret " * 20
    assert batch["encryptionContext"]["batchSize"] == 2
    assert not message_id(batch["messageId"]).HasField("batch_index")
    assert base64.b64decode(plain["payload"]) == b"plain" and "encryptionContext" not in plain

    def backlog(sub: str) -> int:
        return int(admin.get(f"/admin/v2/persistent/public/default/{name}/stats")["subscriptions"][sub]["msgBacklog"])

    for ws, sub, left in ((fail, "fail", 2), (discard, "discard", 0)):
        first = recv_json(ws)
        assert base64.b64decode(first["payload"]) == b"plain", sub
        ws.send(json.dumps({"messageId": first["messageId"]}))
        wait_for(lambda sub=sub, left=left: backlog(sub) == left, f"{sub}'s backlog of {left}")  # type: ignore[misc]
    for m in (one, batch, plain):
        consume.send(json.dumps({"messageId": m["messageId"]}))
    wait_for(lambda: backlog("consume") == 0, "the encrypted messages' acks")


def test_websocket_consumer_of_a_partitioned_topic(connect, client, admin, unique):
    name = f"ws-pcons-{unique}"
    admin.put(f"/admin/v2/persistent/public/default/{name}/partitions", 2)
    ws = connect(f"consumer/persistent/public/default/{name}/sub")
    producer = client.create_producer(f"persistent://public/default/{name}", batching_enabled=False)
    for key in "abcd":
        producer.send(key.encode(), partition_key=key)
    got = [recv_json(ws) for _ in range(4)]
    assert sorted(base64.b64decode(m["payload"]) for m in got) == [b"a", b"b", b"c", b"d"]
    assert {message_id(m["messageId"]).partition for m in got} == {0, 1}
    for m in got:
        ws.send(json.dumps({"messageId": m["messageId"]}))

    def backlog() -> int:
        stats = admin.get(f"/admin/v2/persistent/public/default/{name}/partitioned-stats")
        return int(stats["subscriptions"]["sub"]["msgBacklog"])

    wait_for(lambda: backlog() == 0, "the acks to reach both partitions")


def test_chunked_message_arrives_whole(connect, client, admin, unique):
    name = f"ws-chunk-{unique}"
    ws = connect(f"consumer/persistent/public/default/{name}/sub")
    producer = client.create_producer(f"persistent://public/default/{name}", chunking_enabled=True,
                                      batching_enabled=False)
    big = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # over one entry's 5 MB: two chunks
    producer.send(big, properties={"p": "v"}, partition_key="big")
    producer.send(b"small")
    m = recv_json(ws, timeout=60)
    assert base64.b64decode(m["payload"]) == big and m["properties"] == {"p": "v"} and m["key"] == "big"
    mid = message_id(m["messageId"])
    assert mid.HasField("first_chunk_message_id") and mid.first_chunk_message_id.entryId < mid.entryId
    small = recv_json(ws)
    assert base64.b64decode(small["payload"]) == b"small"

    def backlog() -> int:
        stats = admin.get(f"/admin/v2/persistent/public/default/{name}/stats")
        return int(stats["subscriptions"]["sub"]["msgBacklog"])

    ws.send(json.dumps({"messageId": m["messageId"]}))
    wait_for(lambda: backlog() == 1, "the chunked message's entries to be acknowledged")
    ws.send(json.dumps({"messageId": small["messageId"]}))
    wait_for(lambda: backlog() == 0, "the backlog to empty")


def test_shared_subscription_splits_messages_between_two_websocket_consumers(connect, unique):
    base = f"consumer/persistent/public/default/ws-shared-{unique}/sub?subscriptionType=Shared"
    first, second = connect(base + "&receiverQueueSize=2"), connect(base + "&receiverQueueSize=2")
    producer = connect(f"producer/persistent/public/default/ws-shared-{unique}")
    sent = {f"m{i}".encode() for i in range(10)}
    for payload in sorted(sent):
        assert publish(producer, payload)["result"] == "ok"
    seen: dict[int, list[bytes]] = {0: [], 1: []}
    for n, m in receive_and_ack([first, second], len(sent)):
        seen[n].append(base64.b64decode(m["payload"]))
    assert seen[0] and seen[1]
    assert sorted(seen[0] + seen[1]) == sorted(sent)


def test_key_shared_keeps_each_key_on_one_websocket_consumer(connect, unique):
    base = f"consumer/persistent/public/default/ws-ks-{unique}/sub?subscriptionType=Key_Shared"
    consumers = [connect(base), connect(base)]
    producer = connect(f"producer/persistent/public/default/ws-ks-{unique}")
    keys = [f"key-{i % 6}" for i in range(24)]
    for key in keys:
        assert publish(producer, key.encode(), key=key)["result"] == "ok"
    owner: dict[str, int] = {}
    for n, m in receive_and_ack(consumers, len(keys)):
        assert owner.setdefault(m["key"], n) == n
    assert set(owner) == set(keys)


def test_non_persistent_topic_over_websocket(connect, unique):
    ws = connect(f"consumer/non-persistent/public/default/ws-np-{unique}/sub")
    producer = connect(f"producer/non-persistent/public/default/ws-np-{unique}")
    assert publish(producer, b"fleeting")["result"] == "ok"
    assert base64.b64decode(recv_json(ws)["payload"]) == b"fleeting"


def test_negative_ack_redelivers_with_a_redelivery_count(connect, unique):
    ws = connect(f"consumer/persistent/public/default/ws-nack-{unique}/sub"
                 "?subscriptionType=Shared&negativeAckRedeliveryDelay=100")
    producer = connect(f"producer/persistent/public/default/ws-nack-{unique}")
    publish(producer, b"again")
    first = recv_json(ws)
    assert first["redeliveryCount"] == 0
    ws.send(json.dumps({"type": "negativeAcknowledge", "messageId": first["messageId"]}))
    second = recv_json(ws)
    assert base64.b64decode(second["payload"]) == b"again"
    assert second["redeliveryCount"] == 1 and second["messageId"] == first["messageId"]


def test_ack_timeout_redelivers_what_is_not_acknowledged(connect, standalone, unique):
    ws = connect(f"consumer/persistent/public/default/ws-ackto-{unique}/sub"
                 "?subscriptionType=Shared&ackTimeoutMillis=1000")
    producer = connect(f"producer/persistent/public/default/ws-ackto-{unique}")
    publish(producer, b"late")
    first = recv_json(ws)
    second = recv_json(ws)  # not acknowledged within a second: sent again
    assert second["messageId"] == first["messageId"] and second["redeliveryCount"] == 1
    ws.send(json.dumps({"messageId": second["messageId"]}))
    assert handshake_status(standalone, f"consumer/persistent/public/default/ws-ackto-{unique}/s2"
                                        "?ackTimeoutMillis=10") == (
        400, "Invalid query params: Ack timeout should be greater than 1000 ms")


def test_dead_letter_topic_after_max_redeliveries(connect, client, unique):
    name = f"ws-dlq-{unique}"
    ws = connect(f"consumer/persistent/public/default/{name}/sub?subscriptionType=Shared"
                 "&negativeAckRedeliveryDelay=50&maxRedeliverCount=1")
    producer = connect(f"producer/persistent/public/default/{name}")
    publish(producer, b"poison", key="pk")
    for count in (0, 1):
        m = recv_json(ws)
        assert m["redeliveryCount"] == count
        ws.send(json.dumps({"type": "negativeAcknowledge", "messageId": m["messageId"]}))
    reader = client.create_reader(f"persistent://public/default/{name}-sub-DLQ", pulsar.MessageId.earliest)
    dead = reader.read_next(int(TIMEOUT * 1000))
    assert dead.data() == b"poison" and dead.partition_key() == "pk"
    assert dead.properties()["REAL_TOPIC"] == f"persistent://public/default/{name}"
    assert nothing_arrives(ws)


def test_pull_mode_sends_only_what_the_client_permits(connect, unique):
    ws = connect(f"consumer/persistent/public/default/ws-pull-{unique}/sub?pullMode=true")
    producer = connect(f"producer/persistent/public/default/ws-pull-{unique}")
    for i in range(5):
        publish(producer, f"p{i}".encode())
    assert nothing_arrives(ws)
    ws.send(json.dumps({"type": "permit", "permitMessages": 2}))
    got = [recv_json(ws) for _ in range(2)]
    for m in got:
        ws.send(json.dumps({"messageId": m["messageId"]}))  # acks give no permits in pull mode
    assert nothing_arrives(ws)
    ws.send(json.dumps({"type": "permit", "permitMessages": 3}))
    got += [recv_json(ws) for _ in range(3)]
    assert [base64.b64decode(m["payload"]) for m in got] == [f"p{i}".encode() for i in range(5)]


def test_push_mode_stops_at_the_receiver_queue_until_acks(connect, unique):
    ws = connect(f"consumer/persistent/public/default/ws-push-{unique}/sub?receiverQueueSize=2")
    producer = connect(f"producer/persistent/public/default/ws-push-{unique}")
    for i in range(4):
        publish(producer, f"q{i}".encode())
    got = [recv_json(ws) for _ in range(2)]
    assert nothing_arrives(ws)
    ws.send(json.dumps({"messageId": got[0]["messageId"]}))
    assert base64.b64decode(recv_json(ws)["payload"]) == b"q2"


def test_websocket_consumer_follows_a_reset_cursor(connect, admin, unique):
    name = f"ws-reset-{unique}"
    ws = connect(f"consumer/persistent/public/default/{name}/sub")
    producer = connect(f"producer/persistent/public/default/{name}")
    for i in range(3):
        publish(producer, f"x{i}".encode())
    for m in [recv_json(ws) for _ in range(3)]:
        ws.send(json.dumps({"messageId": m["messageId"]}))
    admin.post(f"/admin/v2/persistent/public/default/{name}/subscription/sub/resetcursor/0")
    # the broker closes the subscription's consumers; the session subscribes again
    again = [base64.b64decode(recv_json(ws)["payload"]) for _ in range(3)]
    assert again == [b"x0", b"x1", b"x2"]


def test_end_of_topic_and_unsubscribe(connect, admin, unique):
    name = f"ws-end-{unique}"
    ws = connect(f"consumer/persistent/public/default/{name}/sub")
    producer = connect(f"producer/persistent/public/default/{name}")
    publish(producer, b"last")
    m = recv_json(ws)
    ws.send(json.dumps({"type": "isEndOfTopic"}))
    assert recv_json(ws) == {"endOfTopic": False}
    admin.post(f"/admin/v2/persistent/public/default/{name}/terminate")

    def at_end() -> bool:
        ws.send(json.dumps({"type": "isEndOfTopic"}))
        return recv_json(ws)["endOfTopic"] is True

    ws.send(json.dumps({"messageId": m["messageId"]}))
    wait_for(at_end, "the consumer to reach the end of the terminated topic")
    ws.send(json.dumps({"type": "unsubscribe"}))
    wait_for(lambda: "sub" not in admin.get(f"/admin/v2/persistent/public/default/{name}/subscriptions"),
             "the subscription to go")


def test_websocket_pings_are_answered(standalone, connect):
    pingpong = websocket.create_connection(ws_base(standalone) + "/pingpong",
                                           timeout=TIMEOUT)
    for ws in (connect("producer/persistent/public/default/ws-ping"), pingpong):
        ws.ping(b"are you there")
        ws.settimeout(TIMEOUT)
        opcode, data = ws.recv_data(control_frame=True)
        assert (opcode, data) == (websocket.ABNF.OPCODE_PONG, b"are you there")
    pingpong.close()


def test_malformed_consumer_frame_closes_the_session_only(connect, unique):
    ws = connect(f"consumer/persistent/public/default/ws-badc-{unique}/sub")
    ws.send("{not json")
    ws.settimeout(TIMEOUT)
    opcode, data = ws.recv_data(control_frame=True)
    assert opcode == websocket.ABNF.OPCODE_CLOSE
    assert int.from_bytes(data[:2], "big") == 1002
    assert data[2:].decode().startswith("Failed to de-serialize from JSON")
    producer = connect(f"producer/persistent/public/default/ws-badc-{unique}")
    assert publish(producer, b"alive")["result"] == "ok"


# -- reader --------------------------------------------------------------------------------------


def plain_messages(client: pulsar.Client, name: str, n: int) -> pulsar.Producer:
    """``n`` messages r0, r1, ... on the topic, each an entry of its own; the producer."""
    producer = client.create_producer(f"persistent://public/default/{name}", batching_enabled=False)
    for i in range(n):
        producer.send(f"r{i}".encode())
    return producer


def test_reader_from_earliest_and_from_a_message_id(standalone, connect, client, unique):
    name = f"ws-read-{unique}"
    producer = plain_messages(client, name, 3)
    reader = connect(f"reader/persistent/public/default/{name}?messageId=earliest&readerName=rd")
    got = [recv_json(reader) for _ in range(3)]
    assert [base64.b64decode(m["payload"]) for m in got] == [b"r0", b"r1", b"r2"]
    for m in got:
        reader.send(json.dumps({"messageId": m["messageId"]}))
    after = connect(f"reader/persistent/public/default/{name}?messageId={got[0]['messageId']}")
    assert [base64.b64decode(recv_json(after)["payload"]) for _ in range(2)] == [b"r1", b"r2"]
    latest = connect(f"reader/persistent/public/default/{name}?messageId=latest")
    assert nothing_arrives(latest)
    producer.send(b"r3")
    assert base64.b64decode(recv_json(latest)["payload"]) == b"r3"
    status, body = handshake_status(standalone, f"reader/persistent/public/default/{name}?messageId=@@")
    assert status == 500 and body.startswith("Failed to create reader:")


def test_reader_from_a_message_inside_a_batch(connect, client, unique):
    name = f"ws-readb-{unique}"
    producer = client.create_producer(f"persistent://public/default/{name}", batching_enabled=True,
                                      batching_max_publish_delay_ms=100)
    for i in range(3):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    producer.send(b"after")
    first = connect(f"reader/persistent/public/default/{name}?messageId=earliest")
    ids = [recv_json(first)["messageId"] for _ in range(4)]
    assert message_id(ids[1]).batch_index == 1
    reader = connect(f"reader/persistent/public/default/{name}?messageId={ids[1]}")
    assert [base64.b64decode(recv_json(reader)["payload"]) for _ in range(2)] == [b"b2", b"after"]


def test_reader_holds_back_past_its_receiver_queue_until_acknowledged(connect, client, unique):
    name = f"ws-readq-{unique}"
    plain_messages(client, name, 3)
    reader = connect(f"reader/persistent/public/default/{name}?messageId=earliest&receiverQueueSize=1")
    first = recv_json(reader)
    assert nothing_arrives(reader)
    reader.send(json.dumps({"messageId": first["messageId"]}))
    assert base64.b64decode(recv_json(reader)["payload"]) == b"r1"


# -- handshake errors ------------------------------------------------------------------------------


def handshake_status(standalone: Standalone, path: str) -> tuple[int, str]:
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(f"{ws_base(standalone)}/{path}", timeout=TIMEOUT)
    return info.value.status_code, (info.value.resp_body or b"").decode()


def test_handshake_errors_answer_with_pulsars_statuses(standalone, connect, admin, unique):
    assert handshake_status(standalone, "producer/bogus/public/default/t")[0] == 400
    assert handshake_status(standalone, "producer/persistent/public/t")[0] == 400
    assert handshake_status(standalone, f"consumer/persistent/public/default/t-{unique}/s"
                                        "?subscriptionType=Bogus") == (
        400, "Invalid query params: Invalid subscriptionType Bogus")
    status, body = handshake_status(standalone, f"producer/persistent/public/no-ns-{unique}/t")
    assert status == 404 and body.startswith("Failed to create producer/consumer:")
    connect(f"consumer/persistent/public/default/ws-busy-{unique}/s")
    assert handshake_status(standalone, f"consumer/persistent/public/default/ws-busy-{unique}/s")[0] == 409
    connect(f"producer/persistent/public/default/ws-busy-{unique}?producerName=same")
    assert handshake_status(standalone, f"producer/persistent/public/default/ws-busy-{unique}"
                                        "?producerName=same")[0] == 409
    ns = f"public/ws-nosub-{unique}"
    admin.put(f"/admin/v2/namespaces/{ns}")
    admin.post(f"/admin/v2/namespaces/{ns}/autoSubscriptionCreation",
               {"allowAutoSubscriptionCreation": False})
    assert handshake_status(standalone, f"consumer/persistent/{ns}/t/new-sub") == (
        500, "Failed to create producer/consumer: Subscription does not exist")
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(f"{ws_base(standalone)}/nothing/here", timeout=TIMEOUT)
    assert info.value.status_code == 404
    assert admin.get("/admin/v2/tenants")  # the broker serves on
    assert publish(connect(f"producer/persistent/public/default/ws-busy-{unique}"), b"ok")["result"] == "ok"


def test_v1_paths_are_refused_as_a_namespace_that_does_not_exist(standalone, unique):
    """Pulsar's v1 paths name a topic with a cluster (``persistent://tenant/cluster/ns/t``);
    this broker keeps no namespaces under a cluster, so the handshake is answered as
    Pulsar answers a topic of a namespace that does not exist (a reader, 500 whatever
    the cause); a v1 path Pulsar cannot read is 400."""
    v1 = ws_base(standalone).removesuffix("/v2")
    expected = {
        f"producer/persistent/public/standalone/default/t-{unique}": 404,
        f"consumer/persistent/public/standalone/default/t-{unique}/s": 404,
        f"reader/persistent/public/global/default/t-{unique}": 500,
        "producer/persistent/public/standalone/default": 400,
        "consumer/persistent/public/standalone/default/t/": 400,
    }
    for path, status in expected.items():
        with pytest.raises(websocket.WebSocketBadStatusException) as info:
            websocket.create_connection(f"{v1}/{path}", timeout=TIMEOUT)
        assert info.value.status_code == status, path
        if status != 400:
            assert "Namespace public/" in (info.value.resp_body or b"").decode()


def test_disabling_the_websocket_service_leaves_ws_paths_unserved(tmp_path: Path):
    with Standalone(tmp_path, conf={"webSocketServiceEnabled": False}) as s:
        status, _ = handshake_status(s, "producer/persistent/public/default/t")
        assert status == 404
        assert AdminClient(s.addresses["web"][0]).get("/admin/v2/tenants")


def test_websocket_producer_shows_in_topic_stats(connect, admin, unique):
    producer = connect(f"producer/persistent/public/default/ws-stats-{unique}?producerName=p-{unique}")
    publish(producer, b"s")
    stats = admin.get(f"/admin/v2/persistent/public/default/ws-stats-{unique}/stats")
    [p] = stats["publishers"]
    assert p["producerName"] == f"p-{unique}" and p["address"].startswith("/127.0.0.1:")
    producer.close()
    wait_for(lambda: not admin.get(f"/admin/v2/persistent/public/default/ws-stats-{unique}/stats")["publishers"],
             "the closed session's producer to leave")
    metrics = admin.request("GET", "/metrics").body.decode()
    assert 'magnetar_connections_opened_total{cluster="standalone",protocol="websocket"}' in metrics
    assert 'magnetar_requests_total{cluster="standalone",protocol="websocket"}' in metrics
    with pytest.raises(AdminError):
        admin.get("/admin/v2/persistent/public/no-such-ns/x/stats")


def close_frame(ws: websocket.WebSocket) -> tuple[int, str]:
    """The code and reason of the close frame the broker sends next."""
    ws.settimeout(TIMEOUT)
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(data[:2], "big"), data[2:].decode()


def test_idle_sessions_and_oversized_frames_are_closed(tmp_path: Path):
    conf = {"webSocketSessionIdleTimeoutMillis": 700, "webSocketMaxTextFrameSize": 2048}
    with Standalone(tmp_path, conf=conf) as s:
        url = f"{ws_base(s)}/producer/persistent/public/default/limits"
        idle = websocket.create_connection(url, timeout=TIMEOUT)
        started = time.monotonic()
        assert close_frame(idle) == (1001, "Connection Idle Timeout")
        assert time.monotonic() - started >= 0.6
        big = websocket.create_connection(url, timeout=TIMEOUT)
        assert publish(big, b"x" * 100)["result"] == "ok"
        big.send(json.dumps({"payload": b64(b"x" * 4096)}))
        assert close_frame(big)[0] == 1009
        fine = websocket.create_connection(url, timeout=TIMEOUT)
        assert publish(fine, b"after")["result"] == "ok"
        for ws in (idle, big, fine):
            ws.close()


def _upgrade_status(url: str, **headers: str) -> int:
    """The HTTP status a refused WebSocket upgrade answers with (0 when it is accepted)."""
    try:
        ws = websocket.create_connection(url, timeout=TIMEOUT, header=[f"{k}: {v}" for k, v in headers.items()])
    except websocket.WebSocketBadStatusException as exc:
        return int(exc.status_code)
    ws.close()
    return 0


def test_websocket_sessions_need_a_token_and_the_roles_permissions(secured, tokens, unique):
    """With authentication on, an upgrade without a valid token (a Bearer header, or the
    ``token`` query parameter browsers use) is refused 401; with authorization, a role
    produces or consumes only what it was granted."""
    from tests._auth import SUPER_USER

    admin = AdminClient(secured.addresses["web"][0], timeout=30, token=tokens.token(SUPER_USER))
    tenant = f"ws-{unique}"
    admin.put(f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{tenant}/ns")
    admin.post(f"/admin/v2/namespaces/{tenant}/ns/permissions/writer", ["produce"])
    base = f"{ws_base(secured)}/producer/persistent/{tenant}/ns/t"
    assert _upgrade_status(base) == 401
    assert _upgrade_status(base, Authorization="Bearer not-a-token") == 401
    assert _upgrade_status(f"{base}?token={tokens.token('reader')}") == 401  # not granted produce
    ws = websocket.create_connection(f"{base}?token={tokens.token('writer')}", timeout=TIMEOUT)
    assert publish(ws, b"hello")["result"] == "ok"
    ws.close()
    consumer = f"{ws_base(secured)}/consumer/persistent/{tenant}/ns/t/s"
    assert _upgrade_status(consumer, Authorization=f"Bearer {tokens.token('writer')}") == 401
    assert _upgrade_status(consumer, Authorization=f"Bearer {tokens.token(SUPER_USER)}") == 0


def test_v1_paths_need_a_token_too(secured, tokens, unique):
    """A v1 path is authenticated as a v2 one; under authorization only a tenant's admin
    (or a super-user) gets as far as its namespace not being found."""
    from tests._auth import SUPER_USER

    base = f"{ws_base(secured).removesuffix('/v2')}/producer/persistent/public/standalone/default/t-{unique}"
    assert _upgrade_status(base) == 401
    assert _upgrade_status(base, Authorization="Bearer not-a-token") == 401
    assert _upgrade_status(f"{base}?token={tokens.token('nobody')}") == 401
    assert _upgrade_status(base, Authorization=f"Bearer {tokens.token(SUPER_USER)}") == 404
