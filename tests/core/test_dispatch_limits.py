"""A subscription's dispatcher reads its broker-wide limits (``dispatcherMaxRead*``,
``keySharedLookAheadMsgInReplayThreshold*``, all dynamic) at each dispatch pass, so that a
change made while it runs applies from its next pass. How many entries a pass reads
shows to no client, hence this test of the dispatcher's own reckoning."""

from __future__ import annotations

from typing import Any

from core.storage import Position
from core.subscription import Consumer, Subscription, SubType


class _Topic:
    """What a dispatch pass asks of its topic: the broker's configuration, no policies."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.broker = type("Broker", (), {"config": config})()

    def limit(self, policy: str, config_key: str, default: int = 0) -> int:
        return 0

    def dispatch_allowance(self) -> tuple[int | None, int | None, float]:
        return None, None, float("inf")

    def rate_policy(self, *keys: str) -> None:
        return None


class _Cursor:
    def batch_acks(self) -> dict[Position, list[int]]:
        return {}


class _Sink:
    def writable(self) -> bool:
        return True


def _subscription(config: dict[str, Any], sub_type: SubType, consumers: int = 1) -> Subscription:
    sub = Subscription(_Topic(config), "s", _Cursor(), sub_type)  # type: ignore[arg-type]
    for i in range(consumers):
        consumer = Consumer(i, f"c{i}", _Sink())  # type: ignore[arg-type]
        consumer.flow(1000)
        sub.consumers.append(consumer)
    return sub


def test_read_limits_changed_at_runtime_apply_from_the_next_pass() -> None:
    config: dict[str, Any] = {}
    sub = _subscription(config, SubType.Shared)
    sub._avg_entry_bytes = 1000.0  # entries seen so far are of 1000 bytes
    assert sub._dispatch_budget() == 100  # dispatcherMaxReadBatchSize's default
    config["dispatcherMaxReadBatchSize"] = 10
    assert sub._dispatch_budget() == 10
    config["dispatcherMaxReadSizeBytes"] = 3000
    assert sub._dispatch_budget() == 3
    del config["dispatcherMaxReadBatchSize"], config["dispatcherMaxReadSizeBytes"]
    assert sub._dispatch_budget() == 100


def test_look_ahead_limits_changed_at_runtime_apply_from_the_next_pass() -> None:
    config: dict[str, Any] = {}
    sub = _subscription(config, SubType.Key_Shared, consumers=2)
    for i in range(50):
        sub.replay.add(Position(1, i), key_hash=i, messages=1)
    assert sub._may_look_ahead()  # 50 messages waiting, under 2 x 2000
    config["keySharedLookAheadMsgInReplayThresholdPerConsumer"] = 20
    assert not sub._may_look_ahead()  # 2 x 20
    config["keySharedLookAheadMsgInReplayThresholdPerConsumer"] = 0
    config["keySharedLookAheadMsgInReplayThresholdPerSubscription"] = 60
    assert sub._may_look_ahead()
    config["keySharedLookAheadMsgInReplayThresholdPerSubscription"] = 50
    assert not sub._may_look_ahead()
