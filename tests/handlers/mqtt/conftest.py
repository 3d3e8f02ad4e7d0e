from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._standalone import Standalone

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
