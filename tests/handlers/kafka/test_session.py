"""The Kafka session against a real broker: ``connections.max.idle.ms`` closes a connection
that has been idle that long, with the reason logged, and leaves alone one that is in use
(a client long-polling, a large request still arriving)."""

from __future__ import annotations

import re
import select
import socket
import struct
import time
import urllib.request
import warnings
from collections.abc import Iterator

import pytest

from handlers.kafka._codec import DEFAULT_MAX_REQUEST_SIZE, LARGE_FRAME, Data, encode_request
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, bootstrap
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE, wait_for
from tests.handlers.kafka.test_wire import (
    API_VERSIONS,
    FETCH,
    PRODUCE,
    batch,
    fetch_body,
    part,
    produce_body,
)

with warnings.catch_warnings():
    # kafka-python 3.0 reads its schemas with a deprecated importlib.resources call.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")

IDLE_MS = 1000
IDLE = IDLE_MS / 1000
IDLE_CLOSE = "kafka: closing connection idle for"


@pytest.fixture(scope="module")
def idle_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    s = Standalone(tmp_path_factory.mktemp("idle"),
                   conf={**KAFKA_CONF, "connections.max.idle.ms": IDLE_MS}).start()
    try:
        yield s
    finally:
        s.kill()


def _idle_closes(server: Standalone) -> int:
    return sum(IDLE_CLOSE in line for line in list(server.output))


def _kafka_connections_opened(server: Standalone) -> int:
    with urllib.request.urlopen(server.addresses["web"][0] + "/metrics", timeout=DEADLINE) as r:
        text = r.read().decode()
    m = re.search(r'^magnetar_connections_opened_total\{[^}]*protocol="kafka"[^}]*\} (\S+)$',
                  text, re.MULTILINE)
    assert m is not None
    return int(float(m.group(1)))


def _read(consumer: KafkaConsumer, got: list[bytes], want: list[bytes]) -> None:
    """Poll ``consumer`` into ``got`` until it holds ``want``."""
    def more() -> bool:
        got.extend(r.value for rs in consumer.poll(timeout_ms=200).values() for r in rs)
        return got == want
    wait_for(more)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_are_closed_and_a_long_polling_client_is_not(
        idle_broker: Standalone, unique: str) -> None:
    """Two raw sockets, one silent and one that announced a ~100 MB request and sent its
    first 8 bytes, are closed once idle for connections.max.idle.ms, each with the reason
    logged; meanwhile a kafka-python consumer whose fetches the broker holds for three
    times that stays on its one connection, and reads what is produced afterwards."""
    topic = f"idle-{unique}"
    boot = bootstrap(idle_broker.addresses)
    host, port = boot.rsplit(":", 1)
    producer = KafkaProducer(bootstrap_servers=boot)
    producer.send(topic, b"before", partition=0).get(timeout=DEADLINE)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest",
                             enable_auto_commit=False, fetch_max_wait_ms=3 * IDLE_MS)
    got: list[bytes] = []
    idle: list[socket.socket] = []
    try:
        consumer.assign([KTopicPartition(topic, 0)])
        _read(consumer, got, [b"before"])
        opened, closes = _kafka_connections_opened(idle_broker), _idle_closes(idle_broker)
        silent = socket.create_connection((host, int(port)), timeout=DEADLINE)
        idle.append(silent)
        partial = socket.create_connection((host, int(port)), timeout=DEADLINE)
        idle.append(partial)
        partial.sendall(struct.pack(">ihhi", DEFAULT_MAX_REQUEST_SIZE - 16, 18, 3, 1))
        start = time.monotonic()
        pending = set(idle)
        while pending or time.monotonic() < start + 3 * IDLE:
            assert time.monotonic() < start + DEADLINE, "idle connections left open"
            assert consumer.poll(timeout_ms=200) == {}
            for sock in select.select(list(pending), [], [], 0)[0]:
                assert _closed_by_peer(sock)
                assert time.monotonic() - start >= 0.9 * IDLE
                pending.discard(sock)
        wait_for(lambda: _idle_closes(idle_broker) >= closes + 2)
        assert _idle_closes(idle_broker) == closes + 2
        assert _kafka_connections_opened(idle_broker) == opened + 2  # the consumer's is kept
        with Wire(boot) as w:
            assert part(w.call(PRODUCE, 9, produce_body(topic, batch([b"after"])))).error_code == 0
        _read(consumer, got, [b"before", b"after"])
    finally:
        consumer.close()
        for sock in idle:
            sock.close()


def test_a_request_still_arriving_or_a_long_poll_is_not_idle(
        idle_broker: Standalone, unique: str) -> None:
    """A large produce whose pieces arrive a third of connections.max.idle.ms apart, for
    over twice that, is received and answered; so is a fetch the broker holds for three
    times that; and the connection is still open after both."""
    topic = f"busy-{unique}"
    frame = encode_request(PRODUCE, 9, 1, "trickle", produce_body(topic, batch([bytes(4 * LARGE_FRAME)])))
    pieces = [frame[i:i + len(frame) // 8 + 1] for i in range(0, len(frame), len(frame) // 8 + 1)]
    with Wire(bootstrap(idle_broker.addresses)) as w:
        start = time.monotonic()
        for piece in pieces:
            w.send_raw(piece)
            time.sleep(IDLE / 3)
        assert time.monotonic() - start > 2 * IDLE
        assert part(w.receive(PRODUCE, 9)).error_code == 0
        start = time.monotonic()
        fetched = w.call(FETCH, 12, fetch_body(topic, 1, max_wait=3 * IDLE_MS))
        assert time.monotonic() - start >= 2.5 * IDLE
        assert fetched.responses[0].partitions[0].error_code == 0
        assert w.call(API_VERSIONS, 0, Data()).error_code == 0
