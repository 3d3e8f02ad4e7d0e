from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._standalone import Standalone
from tests.handlers.kafka._wire import bootstrap

KAFKA_CONF = {"messagingProtocols": "pulsar,kafka", "kafkaListeners": "PLAINTEXT://127.0.0.1:0"}


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("kafka")
    s = Standalone(data, conf=KAFKA_CONF).start()
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture
def boot(kafka_broker: Standalone) -> str:
    return bootstrap(kafka_broker.addresses)
