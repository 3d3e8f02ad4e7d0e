from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pulsar
import pytest

from gateway._admin_cli import AdminClient, AdminError
from tests._standalone import Standalone
from tests.handlers.pulsar._raw import RawClient

#: Fast policy checks so TTL expiry and backlog quota enforcement are observable in tests.
FAST_CHECKS = {"messageExpiryCheckIntervalInSeconds": 1, "backlogQuotaCheckIntervalInSeconds": 1,
               "brokerServiceCompactionMonitorIntervalInSeconds": 0.2}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("admin")
    s = Standalone(data, conf=FAST_CHECKS).start()
    try:
        yield s
    finally:
        # Clean shutdown is covered by the standalone's own tests; here only the API is.
        s.kill()


@pytest.fixture(scope="module")
def admin(server: Standalone) -> AdminClient:
    return AdminClient(server.addresses["web"][0], timeout=30)


@pytest.fixture
def client(server: Standalone) -> Iterator[pulsar.Client]:
    c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10)
    try:
        yield c
    finally:
        c.close()


def status_of(call: Any, *args: Any, **kw: Any) -> tuple[int, str]:
    """The HTTP status and reason of a call expected to fail."""
    try:
        call(*args, **kw)
    except AdminError as exc:
        return exc.status, exc.reason
    raise AssertionError("the call succeeded")


@pytest.fixture
def ns(admin: AdminClient, unique: str) -> str:
    """A fresh namespace in a fresh tenant."""
    tenant = f"t-{unique}"
    admin.put(f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{tenant}/ns")
    return f"{tenant}/ns"


def wait_for(condition: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll `condition()` until it returns a truthy value (returned) or `timeout` passes."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        time.sleep(interval)


@pytest.fixture
def dynamic(admin: AdminClient) -> Iterator[Callable[[str, str], None]]:
    """Set a dynamic broker configuration key for the test; whatever it set is deleted
    afterwards."""
    touched: list[str] = []

    def update(name: str, value: str) -> None:
        touched.append(name)
        admin.post(f"/admin/v2/brokers/configuration/{name}/{value}")

    yield update
    for name in touched:
        admin.delete(f"/admin/v2/brokers/configuration/{name}")


def raw_answers(server: Standalone, commands: list) -> list:  # type: ignore[type-arg]
    """The broker's answer to each command, sent one at a time on a raw connection (for
    the error codes and messages the official client does not show)."""
    raw = RawClient(server.pulsar_url)
    try:
        raw.connect()
        out = []
        for command in commands:
            raw.send(command)
            out.append(raw.next_event())
        return out
    finally:
        raw.close()


def first_messages(client: pulsar.Client, topic: str, delay: timedelta) -> list[bytes]:
    """What a Shared consumer of `topic` gets within a second of its first message, after
    a message delayed by `delay` and then a plain one are published."""
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"later", deliver_after=delay)
    producer.send(b"now")
    got = [consumer.receive(5000).data()]
    try:
        got.append(consumer.receive(1000).data())
    except pulsar.Timeout:
        pass
    consumer.close()
    producer.close()
    return got
