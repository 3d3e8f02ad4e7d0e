"""Topic loading in a real broker (in this process, one real bookie)."""

from __future__ import annotations

import pytest
import trio

from core.broker import BrokerService
from core.naming import TopicName
from gateway._config import load_config
from tests.core._storage_env import SlowOpens, storage_env


@pytest.mark.parametrize("limit", [1, 3])
async def test_topic_loads_past_max_concurrent_topic_load_request_wait_their_turn(tmp_path, limit):
    """maxConcurrentTopicLoadRequest bounds how many topics open their storage at once;
    every topic asked for still loads."""
    async with storage_env(tmp_path) as env:
        cfg = load_config(None, {"maxConcurrentTopicLoadRequest": str(limit)}, environ={})
        broker = BrokerService(cfg, env.metadata)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            assert broker.storage is not None
            opens = SlowOpens(broker)  # a storage that takes a while to open
            names = [TopicName.parse(f"persistent://public/default/load-{i}") for i in range(6)]
            async with trio.open_nursery() as loads:
                for name in names:
                    loads.start_soon(broker.get_topic, name)
            assert opens.most == limit
            assert sorted(broker.topics) == sorted(str(n) for n in names)
            nursery.cancel_scope.cancel()
