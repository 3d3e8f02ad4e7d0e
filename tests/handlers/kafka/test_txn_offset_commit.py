"""TxnOffsetCommit v3 carries the consumer's group metadata (KIP-447): the transaction
coordinator checks it as Kafka's group coordinator does, so a zombie whose consumer left
the group, or a producer with an older generation, cannot commit the group's offsets; nor
can anyone commit an offset for a partition that does not exist."""

from __future__ import annotations

from types import SimpleNamespace

from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from handlers.kafka._group import GroupCoordinator
from handlers.kafka._txn import TxnCoordinator
from tests.handlers.kafka._coordinators import fake_handler, request


async def test_txn_offset_commit_checks_member_and_generation() -> None:
    h = fake_handler(topics=SimpleNamespace(topic_name=lambda name: name,
                                            partition_count=lambda name: 1 if name == "t" else 0))
    h.groups = GroupCoordinator(h, initial_rebalance_delay_ms=0)
    h.txns = tc = TxnCoordinator(h)
    joined = await h.groups.join(request(
        11, 7, group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=5_000, member_id="",
        group_instance_id=None, protocol_type="consumer",
        protocols=[Data(name="range", metadata=b"")], reason=None))
    member, generation = joined.member_id, joined.generation_id
    pid = tc.init_producer_id(request(22, 3, transactional_id="tx", transaction_timeout_ms=60_000,
                                      producer_id=-1, producer_epoch=-1))
    ids = {"transactional_id": "tx", "producer_id": pid.producer_id,
           "producer_epoch": pid.producer_epoch}
    assert tc.add_offsets(request(25, 3, group_id="g", **ids)).error_code == 0

    def commit(member_id: str, generation_id: int, topic: str = "t") -> int:
        resp = tc.txn_offset_commit(request(
            28, 3, group_id="g", generation_id=generation_id, member_id=member_id,
            group_instance_id=None, topics=[Data(name=topic, partitions=[Data(
                partition_index=0, committed_offset=5, committed_leader_epoch=-1,
                committed_metadata="")])], **ids))
        return int(resp.topics[0].partitions[0].error_code)

    assert commit(member, generation) == 0
    assert commit("", -1) == 0  # no group metadata: nothing to check
    assert commit(member, generation - 1) == ErrorCode.ILLEGAL_GENERATION
    assert commit("zombie", generation) == ErrorCode.UNKNOWN_MEMBER_ID
    # As Kafka: a partition that does not exist gets no offset.
    assert commit(member, generation, "missing") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert {t.name for _, topics in tc.txns["tx"].offsets for t in topics if t.partitions} == {"t"}
