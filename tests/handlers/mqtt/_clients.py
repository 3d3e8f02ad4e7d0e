"""What the paho-mqtt tests share: a box of received messages, unique names, a SUBSCRIBE
that waits for its SUBACK, a scrape of ``/metrics``, and a waiting loop with a bound."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Callable

import paho.mqtt.client as mqtt
from prometheus_client.parser import text_string_to_metric_families

WAIT = 10.0
V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5


class Box:
    """Messages a client received, and a way to wait for a count of them."""

    def __init__(self) -> None:
        self.items: list[mqtt.MQTTMessage] = []
        self.cond = threading.Condition()
        self.disconnects: list[int] = []

    def add(self, msg: mqtt.MQTTMessage) -> None:
        with self.cond:
            self.items.append(msg)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.items) >= n, timeout)
            return list(self.items)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def subscribe(c: mqtt.Client, *args, **kw) -> None:
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.subscribe(*args, **kw)
    assert done.wait(WAIT), "no SUBACK"


def scrape(web: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(web + "/metrics", timeout=WAIT) as r:
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def metric(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    found = [v for lbl, v in samples.get(name, []) if all(lbl.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def wait_until(what: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.02)
