"""``internalStats?metadata=true``: each ledger with its metadata record, as Pulsar's
``getInternalStats(topic, true)`` gives it - what a reader needs to fetch entries from
the bookies itself."""

from __future__ import annotations

import json

import pulsar

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone


def test_internal_stats_carry_ledger_metadata(admin: AdminClient, server: Standalone, ns: str,
                                              client: pulsar.Client) -> None:
    topic, path = f"persistent://{ns}/with-meta", f"/admin/v2/persistent/{ns}/with-meta"
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        producer.send(b"m%d" % i)
    producer.close()
    plain = admin.get(f"{path}/internalStats")
    assert all("metadata" not in led for led in plain["ledgers"])
    stats = admin.get(f"{path}/internalStats?metadata=true")
    assert stats["ledgers"], stats
    last_ledger = int(stats["lastConfirmedEntry"].split(":")[0])
    for led in stats["ledgers"]:
        meta = json.loads(led["metadata"])
        assert meta["ensembleSize"] == len(meta["ensembles"][0][1]) == 1
        assert meta["writeQuorumSize"] == meta["ackQuorumSize"] == 1
        assert meta["ensembles"][0][0] == 0
        assert meta["ensembles"][0][1][0] in server.addresses["bookies"]
        assert meta["state"] in ("OPEN", "CLOSED")
    assert any(led["ledgerId"] == last_ledger for led in stats["ledgers"])
