"""core.stats.BrokerStats: counters, publish-latency quantiles, per-protocol connections."""

from __future__ import annotations

import pytest

from core.stats import LATENCY_SAMPLES, BrokerStats


def test_latency_quantiles() -> None:
    s = BrokerStats()
    assert s.publish_latency_quantiles((0.5, 0.99)) == {0.5: 0.0, 0.99: 0.0}
    for ms in range(1, 101):
        s.record_publish_latency(float(ms))
    q = s.publish_latency_quantiles((0.5, 0.95, 0.99))
    assert q == {0.5: 51.0, 0.95: 96.0, 0.99: 100.0}
    assert s.publish_latency_count == 100
    assert s.publish_latency_sum_ms == sum(range(1, 101))


def test_latency_window_is_bounded() -> None:
    s = BrokerStats()
    for _ in range(LATENCY_SAMPLES + 10):
        s.record_publish_latency(1.0)
    assert len(s.publish_latencies_ms) == LATENCY_SAMPLES
    assert s.publish_latency_count == LATENCY_SAMPLES + 10


def test_connections_and_requests() -> None:
    s = BrokerStats()
    with s.connection("kafka"):
        assert s.connections_active == {"kafka": 1}
        with pytest.raises(RuntimeError), s.connection("kafka"):
            assert s.connections_active == {"kafka": 2}
            raise RuntimeError("session failed")
        assert s.connections_active == {"kafka": 1}
    assert s.connections_active == {"kafka": 0}
    assert s.connections_opened == {"kafka": 2}
    s.record_request("kafka", 3)
    s.record_request("kafka")
    assert s.requests == {"kafka": 4}


def test_publish_and_dispatch_counters() -> None:
    s = BrokerStats()
    s.record_publish(2, 10, 1000)
    s.record_dispatch(4, 400)
    assert (s.in_entries, s.in_messages, s.in_bytes, s.out_messages, s.out_bytes) == (2, 10, 1000, 4, 400)
