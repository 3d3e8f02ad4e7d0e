"""The native core keeps its ledger, managed-ledger and cursor records in ZooKeeper, as a
cluster does: replicated appends, cursor state and a reopen, all through zk metadata."""

from __future__ import annotations

import json
import uuid

from tests.core._storage_env import ml_config, storage_env


async def test_managed_ledger_over_zookeeper_metadata(tmp_path, zookeeper_hosts):
    url = f"zk:{zookeeper_hosts}/magnetar-{uuid.uuid4().hex[:8]}"
    config = ml_config(ensemble_size=3, write_quorum=2, ack_quorum=2)
    async with storage_env(tmp_path, bookies=3, metadata_url=url) as env:
        ml = await env.storage.open("t/ns/persistent/zk", config)
        cursor = await ml.open_cursor("sub", True)
        done = await ml.add_entries([f"e{i}".encode() for i in range(50)], [1] * 50)
        cursor.mark_delete(done[19][0])
        await cursor.flush()
        ledger = json.loads(env.metadata.get(f"/ledgers/ledger/{done[0][0].ledger_id}")[0])
        assert (ledger["ensembleSize"], ledger["writeQuorumSize"], ledger["ackQuorumSize"]) == (3, 2, 2)
        await ml.close()
    async with storage_env(tmp_path, bookies=3, metadata_url=url) as env:
        ml = await env.storage.open("t/ns/persistent/zk", config)
        cursor = await ml.open_cursor("sub", True)
        assert cursor.mark_delete_position() == done[19][0]
        assert [e.data for e in await cursor.read_entries(100)] == [f"e{i}".encode() for i in range(20, 50)]
