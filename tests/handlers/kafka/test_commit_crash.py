"""An OffsetCommit covering many partitions survives a ``kill -9`` of the broker all or
nothing: after the restart every partition has the offset of the same commit."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from handlers.kafka._codec import Data
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, bootstrap
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE

OFFSET_COMMIT = 8
OFFSET_FETCH = 9
PARTITIONS = 16
ACKED = 5
IN_FLIGHT = 20
CRASHES = 3


def _commit(group: str, topic: str, offset: int) -> Data:
    return Data(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                group_instance_id=None, topics=[Data(name=topic, partitions=[
                    Data(partition_index=i, committed_offset=offset, committed_leader_epoch=-1,
                         committed_metadata=f"commit {offset}") for i in range(PARTITIONS)])])


def _committed(w: Wire, group: str, topic: str) -> list[int]:
    resp = w.call(OFFSET_FETCH, 7, Data(group_id=group, topics=[
        Data(name=topic, partition_indexes=list(range(PARTITIONS)))], require_stable=False))
    return [p.committed_offset for p in resp.topics[0].partitions]


def test_kill_9_during_multi_partition_commits_keeps_each_all_or_nothing(
        tmp_path: Path, unique: str) -> None:
    topic, group = f"atomic-{unique}", f"atomic-g-{unique}"
    acked = -1
    sent = -1
    for crash in range(CRASHES + 1):
        server = Standalone(tmp_path, conf=KAFKA_CONF).start()
        try:
            boot = bootstrap(server.addresses)
            if crash == 0:
                admin = AdminClient({"bootstrap.servers": boot})
                admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(DEADLINE)
            with Wire(boot) as w:
                offsets = _committed(w, group, topic)
                # Never a mix: one commit's offset on every partition, at least the last
                # one acknowledged and at most the last one sent.
                assert len(set(offsets)) == 1, offsets
                assert acked <= offsets[0] <= sent
                if crash == CRASHES:
                    break
                base = max(offsets[0], sent) + 1
                for k in range(base, base + ACKED):
                    resp = w.call(OFFSET_COMMIT, 8, _commit(group, topic, k))
                    assert {p.error_code for p in resp.topics[0].partitions} == {0}
                    acked = k
                # Pipelined commits with no answer awaited, then the process is killed
                # while it works through them.
                for k in range(acked + 1, acked + 1 + IN_FLIGHT):
                    w.send(OFFSET_COMMIT, 8, _commit(group, topic, k))
                    sent = k
                w.read_frame()
        finally:
            server.kill()
