"""Fixtures for the handler tests that share the module's standalone: the official Pulsar
client and the admin REST client, both on it."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone


@pytest.fixture
def client(standalone: Standalone) -> Iterator[pulsar.Client]:
    c = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=15)
    yield c
    c.close()


@pytest.fixture
def admin(standalone: Standalone) -> AdminClient:
    return AdminClient(standalone.addresses["web"][0], timeout=30)
