"""``magnetar admin mqtt``: sessions (connected or not, persistent, expiry, subscriptions,
messages queued offline) and retained topics, through the CLI and the REST API."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests._standalone import Standalone

from ._clients import V5, WAIT, subscribe, unique, wait_until


def _run(web: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "admin", "--admin-url", web, "mqtt", *args],
                          capture_output=True, text=True, timeout=60)


def _admin(web: str, *args: str) -> list[Any]:
    out = _run(web, *args)
    assert out.returncode == 0, out.stderr
    # a list prints one item after another, as pulsar-admin does
    items, text, dec = [], out.stdout.strip(), json.JSONDecoder()
    while text:
        item, end = dec.raw_decode(text)
        items.append(item)
        text = text[end:].strip()
    return items


def _rest(web: str, path: str) -> Any:
    with urllib.request.urlopen(web + path, timeout=WAIT) as r:
        return json.loads(r.read())


def test_admin_lists_mqtt_sessions_and_retained_topics(connect, standalone):
    web = standalone.addresses["web"][0]
    cid, pcid, base = unique("adm"), unique("p"), unique("adm")
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    sub, _ = connect(cid, V5, clean=False, props=props)
    subscribe(sub, [(f"{base}/#", 1), (f"{base}/q0/+", 0)])
    sub.loop_stop()
    sub.disconnect()
    pub, _ = connect(pcid, V5)
    for i in range(3):
        pub.publish(f"{base}/x", b"m%d" % i, qos=1).wait_for_publish(WAIT)
    pub.publish(f"{base}-kept/t", b"12345", qos=1, retain=True).wait_for_publish(WAIT)

    def mine() -> dict[str, Any]:
        [s] = [s for s in _rest(web, "/admin/v2/mqtt/sessions") if s["client_id"] == cid]
        return s

    wait_until(lambda: mine()["queued"] == 3)
    sessions = _admin(web, "sessions")
    assert {"client_id": cid, "connected": False, "persistent": True, "expiry": 300,
            "subscriptions": [{"filter": f"{base}/#", "qos": 1}, {"filter": f"{base}/q0/+", "qos": 0}],
            "queued": 3} in sessions
    assert {"client_id": pcid, "connected": True, "persistent": False, "expiry": 0,
            "subscriptions": [], "queued": 0} in sessions
    assert {"topic": f"{base}-kept/t", "size": 5} in _admin(web, "retained")


def test_admin_mqtt_is_a_404_where_mqtt_is_not_served(tmp_path: Path):
    with Standalone(tmp_path, conf={"messagingProtocols": "pulsar"}) as s:
        web = s.addresses["web"][0]
        for what in ("sessions", "retained"):
            try:
                urllib.request.urlopen(f"{web}/admin/v2/mqtt/{what}", timeout=WAIT)
                raise AssertionError("no MQTT: a 404")
            except urllib.error.HTTPError as exc:
                assert exc.code == 404
                assert "MQTT is not served" in json.loads(exc.read())["reason"]
            out = _run(web, what)
            assert out.returncode != 0 and "MQTT is not served" in out.stderr, out
