"""What the coordinator tests drive a Kafka coordinator with, without a broker: a handler
that holds only a metadata store, and decoded requests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from core.auth import AuthService
from core.metadata._memory import MemoryMetadataStore
from handlers.kafka._codec import Data, RequestReceived


def fake_handler(metadata: Any = None, **more: Any) -> Any:
    """A stand-in for the Kafka handler: ``broker.metadata`` (an in-memory store unless
    given), ``broker.auth`` (authentication and authorization off) and any other
    attributes ``more`` names."""
    return SimpleNamespace(broker=SimpleNamespace(metadata=metadata or MemoryMetadataStore(),
                                                  auth=AuthService({}, None)),
                           **more)


def request(key: int, version: int, **body: Any) -> RequestReceived:
    """A decoded request of API ``key`` at ``version`` with ``body``'s fields."""
    return RequestReceived(api_key=key, api_version=version, correlation_id=1, client_id="c",
                           body=Data(**body), size=0)
