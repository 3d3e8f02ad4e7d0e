"""Broker-wide counters that the metrics endpoint and admin stats read."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

__all__ = ["BrokerStats", "LATENCY_SAMPLES", "Series"]

#: Publish latencies kept for the quantiles (the most recent ones).
LATENCY_SAMPLES = 4096


class Series(NamedTuple):
    """One sample of a protocol handler's own series: ``/metrics`` shows it as ``name``
    (a counter gains ``_total``) with the labels ``cluster`` and ``labels``."""

    name: str
    kind: Literal["counter", "gauge"]
    doc: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass
class BrokerStats:
    in_entries: int = 0
    in_messages: int = 0
    in_bytes: int = 0
    out_messages: int = 0
    out_bytes: int = 0
    publish_latency_count: int = 0
    publish_latency_sum_ms: float = 0.0
    publish_latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    #: Per protocol: connections accepted, connections open, requests handled.
    connections_opened: dict[str, int] = field(default_factory=dict)
    connections_active: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    #: Per protocol: what its handler counts beyond the above, read at each scrape.
    protocol_series: dict[str, Callable[[], Iterable[Series]]] = field(default_factory=dict)

    def record_publish(self, entries: int, messages: int, size: int) -> None:
        self.in_entries += entries
        self.in_messages += messages
        self.in_bytes += size

    def record_dispatch(self, messages: int, size: int) -> None:
        self.out_messages += messages
        self.out_bytes += size

    def record_publish_latency(self, millis: float) -> None:
        """Time from a batch of entries being handed to storage to it being durable."""
        self.publish_latency_count += 1
        self.publish_latency_sum_ms += millis
        self.publish_latencies_ms.append(millis)

    def publish_latency_quantiles(self, quantiles: tuple[float, ...]) -> dict[float, float]:
        """The recent publish latency at each quantile (ms); 0.0 before any publish."""
        ordered = sorted(self.publish_latencies_ms)
        if not ordered:
            return {q: 0.0 for q in quantiles}
        last = len(ordered) - 1
        return {q: ordered[min(last, int(q * len(ordered)))] for q in quantiles}

    def record_connection_opened(self, protocol: str) -> None:
        self.connections_opened[protocol] = self.connections_opened.get(protocol, 0) + 1
        self.connections_active[protocol] = self.connections_active.get(protocol, 0) + 1

    def record_connection_closed(self, protocol: str) -> None:
        self.connections_active[protocol] = max(0, self.connections_active.get(protocol, 0) - 1)

    @contextmanager
    def connection(self, protocol: str) -> Iterator[None]:
        """Count one connection of `protocol` while the block runs (a session's lifetime)."""
        self.record_connection_opened(protocol)
        try:
            yield
        finally:
            self.record_connection_closed(protocol)

    def record_request(self, protocol: str, count: int = 1) -> None:
        self.requests[protocol] = self.requests.get(protocol, 0) + count
