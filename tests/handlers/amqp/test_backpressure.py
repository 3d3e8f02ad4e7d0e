"""A publisher faster than storage is held back: past amqpPublishWindow publishes waiting
to be stored, its connection reads nothing more and is told connection.blocked, then
unblocked; nothing it published is lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests._standalone import Standalone
from tests.handlers.amqp.conftest import amqp_port
from tests.handlers.amqp.test_pika import drain


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("amqp-window")
    s = Standalone(data, conf={"messagingProtocols": "amqp", "amqpPublishWindow": 2}).start()
    try:
        yield s
    finally:
        s.kill()


def test_a_fast_publisher_is_blocked_then_unblocked_and_loses_nothing(narrow: Standalone,
                                                                      unique: str) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port(narrow),
                                                             blocked_connection_timeout=30))
    seen: list[str] = []
    conn.add_on_connection_blocked_callback(lambda c, frame: seen.append(frame.method.NAME))
    conn.add_on_connection_unblocked_callback(lambda c, frame: seen.append(frame.method.NAME))
    ch = conn.channel()
    q = f"window-{unique}"
    ch.queue_declare(q)
    n = 2000
    for i in range(n):
        ch.basic_publish("", q, b"%d" % i)
    got: list[Any] = drain(ch, q, n)
    conn.process_data_events(0.1)
    assert [b for _, _, b in got] == [b"%d" % i for i in range(n)]
    assert "Connection.Blocked" in seen and "Connection.Unblocked" in seen
    assert seen.index("Connection.Blocked") < seen.index("Connection.Unblocked")
    conn.close()
