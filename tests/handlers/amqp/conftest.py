from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests._standalone import Standalone

#: Bodies up to 20 MiB: more than a stored entry holds (maxMessageSize, 5 MiB), so a 16 MiB
#: body is a chunked message, and little enough that the refusal above it is quick to test.
MAX_BODY = 20 << 20
AMQP_CONF = {"messagingProtocols": "pulsar,kafka,amqp,mqtt", "amqpListeners": "amqp://127.0.0.1:0",
             "amqpMaxMessageSize": str(MAX_BODY)}


def amqp_port(s: Standalone) -> int:
    return int(s.addresses["amqp"][0].rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def amqp_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("amqp")
    s = Standalone(data, conf=AMQP_CONF).start()
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture
def params(amqp_broker: Standalone) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", amqp_port(amqp_broker),
                                     credentials=pika.PlainCredentials("guest", "guest"),
                                     connection_attempts=1, socket_timeout=5,
                                     blocked_connection_timeout=10)


@pytest.fixture
def conn(params: pika.ConnectionParameters) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(params)
    try:
        yield c
    finally:
        if c.is_open:
            c.close()
