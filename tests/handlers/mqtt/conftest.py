from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.properties import Properties

from tests._standalone import Standalone

from ._clients import V5, V311, WAIT, Box

MQTT_CONF = {"messagingProtocols": "pulsar,mqtt", "mqttListeners": "mqtt://127.0.0.1:0"}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("mqtt")
    s = Standalone(data, conf=MQTT_CONF).start()
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture
def mqtt_addr(standalone: Standalone) -> tuple[str, int]:
    host, port = standalone.addresses["mqtt"][0].rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def connect(mqtt_addr: tuple[str, int]) -> Iterator:
    """``connect(client_id, version, clean, ...)``: a paho client past its CONNACK, looping in
    its thread, and the :class:`Box` it receives into (``box.props``: the CONNACK's
    properties); disconnected at the end of the test."""
    made: list[mqtt.Client] = []

    def make(client_id: str = "", version: int = V311, clean: bool = True, box: Box | None = None,
             will: tuple[str, bytes] | None = None, props: Properties | None = None,
             keepalive: int = 60) -> tuple[mqtt.Client, Box]:
        box = box or Box()
        kw = {"clean_session": clean} if version == V311 else {}
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version, **kw)
        connected = threading.Event()
        c.on_connect = lambda cl, u, flags, rc, p=None: (setattr(box, "flags", flags),
                                                         setattr(box, "rc", rc),
                                                         setattr(box, "props", p), connected.set())
        c.on_message = lambda cl, u, m: box.add(m)
        c.on_disconnect = lambda cl, u, flags, rc, p=None: box.disconnects.append(
            rc.value if hasattr(rc, "value") else rc)
        if will is not None:
            c.will_set(will[0], will[1], qos=1)
        if version == V5:
            c.connect(*mqtt_addr, keepalive=keepalive, clean_start=clean, properties=props)
        else:
            c.connect(*mqtt_addr, keepalive=keepalive)
        c.loop_start()
        assert connected.wait(WAIT), "no CONNACK"
        made.append(c)
        return c, box

    yield make
    for c in made:
        c.loop_stop()
        c.disconnect()
