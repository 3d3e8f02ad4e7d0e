"""``magnetar admin amqp``: a vhost's exchanges, queues (ready, unacknowledged, consumers)
and bindings, through the CLI and the REST API."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pika

from tests._standalone import Standalone
from tests.handlers.amqp.test_pika import get


def _admin(web: str, *args: str) -> list[Any]:
    out = subprocess.run([sys.executable, "-m", "gateway", "admin", "--admin-url", web, "amqp", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # a list prints one item after another, as pulsar-admin does
    items, text, dec = [], out.stdout.strip(), json.JSONDecoder()
    while text:
        item, end = dec.raw_decode(text)
        items.append(item)
        text = text[end:].strip()
    return items


def test_admin_lists_exchanges_queues_and_bindings(amqp_broker: Standalone,
                                                   conn: pika.BlockingConnection, unique: str) -> None:
    web = amqp_broker.addresses["web"][0]
    ch = conn.channel()
    ex, q = f"adm-{unique}", f"adm-q-{unique}"
    ch.exchange_declare(ex, "topic", durable=True)
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, ex, routing_key="a.*")
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish(ex, "a.b", b"%d" % i)
    get(ch, q, auto_ack=False)  # one unacknowledged, two ready
    exchanges = _admin(web, "exchanges")
    assert {"name": ex, "type": "topic", "durable": True, "auto_delete": False, "internal": False,
            "topic": f"persistent://public/default/{ex}"} in exchanges
    assert any(e["name"] == "amq.direct" for e in exchanges)
    [queue] = [x for x in _admin(web, "queues", "--vhost", "/") if x["name"] == q]
    assert (queue["messages_ready"], queue["messages_unacknowledged"], queue["consumers"]) == (2, 1, 0)
    assert f"persistent://public/default/{ex}" in queue["topics"]
    bindings = _admin(web, "bindings")
    assert {"source": ex, "destination": q, "destination_type": "queue", "routing_key": "a.*",
            "arguments": {}} in bindings
    try:
        urllib.request.urlopen(f"{web}/admin/v2/amqp/vhosts/nowhere/queues", timeout=10)
        raise AssertionError("an unknown vhost is a 404")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404 and "Vhost nowhere not found" in json.loads(exc.read())["reason"]
