"""Pulsar's WebSocket API against a real standalone, driven by a generic WebSocket client
(websocket-client) and checked with the official pulsar-client on the other side."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    ok = publish(producer, b"still here", context="c5")
    assert (ok["result"], ok["context"]) == ("ok", "c5")


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


# -- handshake errors ------------------------------------------------------------------------------


def handshake_status(standalone: Standalone, path: str) -> tuple[int, str]:
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(f"{ws_base(standalone)}/{path}", timeout=TIMEOUT)
    return info.value.status_code, (info.value.resp_body or b"").decode()


def test_handshake_errors_answer_with_pulsars_statuses(standalone, connect, admin, unique):
    assert handshake_status(standalone, "producer/bogus/public/default/t")[0] == 400
    assert handshake_status(standalone, "producer/persistent/public/t")[0] == 400
    status, body = handshake_status(standalone, f"producer/persistent/public/no-ns-{unique}/t")
    assert status == 404 and body.startswith("Failed to create producer/consumer:")
    connect(f"producer/persistent/public/default/ws-busy-{unique}?producerName=same")
    assert handshake_status(standalone, f"producer/persistent/public/default/ws-busy-{unique}"
                                        "?producerName=same")[0] == 409
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(f"{ws_base(standalone)}/nothing/here", timeout=TIMEOUT)
    assert info.value.status_code == 404
    assert admin.get("/admin/v2/tenants")  # the broker serves on
    assert publish(connect(f"producer/persistent/public/default/ws-busy-{unique}"), b"ok")["result"] == "ok"


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
    with pytest.raises(AdminError):
        admin.get("/admin/v2/persistent/public/no-such-ns/x/stats")
