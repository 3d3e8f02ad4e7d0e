"""What the paho-mqtt tests share: a box of received messages, unique names, a SUBSCRIBE
that waits for its SUBACK, a scrape of ``/metrics``, a waiting loop with a bound, and a
raw MQTT 5 client over the codec (:class:`Raw`) for what paho hides."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import paho.mqtt.client as mqtt

from handlers.mqtt._codec import NEED_DATA, MQTTConnection, Role
from handlers.mqtt._packets import (
    Connack,
    Connect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Suback,
    Subscribe,
    SubscribeOption,
    Will,
)
from tests._auth import Tokens
from tests._metrics import Samples, sample, scrape_url
from tests._standalone import Standalone

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


def scrape(web: str) -> Samples:
    return scrape_url(web + "/metrics", WAIT)[1]


def metric(samples: Samples, name: str, **labels: str) -> float:
    return sample(samples, name, **labels)


def wait_until(what: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.02)


class Socket:
    """An MQTT client made of a socket and the codec: :meth:`send` keeps to the codec's
    rules, :meth:`read` returns the next packet as it is on the wire. Every read waits
    at most ``WAIT`` seconds."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.sock = socket.create_connection(addr, timeout=WAIT)
        self.conn = MQTTConnection(Role.CLIENT)

    def send(self, packet: Packet) -> None:
        self.sock.sendall(self.conn.send(packet))

    def read(self) -> Packet:
        while (packet := self.conn.next_event()) is NEED_DATA:
            data = self.sock.recv(65536)
            assert data, "the broker closed the connection"
            self.conn.receive_data(data)
        return packet

    def close(self) -> None:
        self.sock.close()


class Raw(Socket):
    """An MQTT 5 client made of a socket and the codec, past its CONNECT and CONNACK
    (:attr:`connack`): it sends and acknowledges only what the test says, and the test
    reads the packets as they are on the wire. ``props`` are the CONNECT's properties."""

    def __init__(self, addr: tuple[str, int], client_id: str, *, clean: bool = True,
                 will: Will | None = None, **props: int) -> None:
        super().__init__(addr)
        self.send(Connect(protocol_level=5, client_id=client_id, clean_start=clean, will=will,
                          properties=Properties(**props)))
        got = self.read()
        assert isinstance(got, Connack) and got.reason_code == 0, got
        self.connack = got

    def ping(self) -> list[Packet]:
        """What the broker sent before it answered a PINGREQ (it handles packets in order,
        so this is all it sent in answer to what came before)."""
        self.send(Pingreq())
        out = []
        while not isinstance(packet := self.read(), Pingresp):
            out.append(packet)
        return out

    def subscribe(self, topic_filter: str, qos: int, packet_id: int = 1) -> None:
        self.send(Subscribe(packet_id=packet_id, subscriptions=(
            SubscribeOption(topic_filter=topic_filter, qos=qos),)))
        assert self.read() == Suback(packet_id=packet_id, reason_codes=(qos,))

    def eof(self) -> bool:
        """Whether the broker closed the connection (after what it had sent)."""
        return self.sock.recv(65536) == b""


@contextmanager
def token_broker(data: Path, tokens: Tokens, *, authorization: bool = True) -> Iterator[Standalone]:
    """A standalone serving Pulsar and MQTT with token authentication (and, unless told
    otherwise, authorization) on, by ``tokens``' key."""
    conf = {"messagingProtocols": "pulsar,mqtt", "mqttListeners": "mqtt://127.0.0.1:0",
            **tokens.conf(authorization=authorization)}
    s = Standalone(data, conf=conf).start()
    try:
        yield s
    finally:
        s.kill()
