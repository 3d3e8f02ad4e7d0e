"""InitProducerId with the producer's current id and epoch (KIP-360, v3+): the producer
recovering from an abortable error gets its epoch bumped, a retry of that bump gets the
same epoch again, and a zombie with an older epoch is PRODUCER_FENCED (INVALID_PRODUCER_EPOCH
before v4) rather than fencing the current producer."""

from __future__ import annotations

from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from handlers.kafka._txn import TxnCoordinator
from tests.handlers.kafka._coordinators import fake_handler, request


def _init(tc: TxnCoordinator, producer_id: int = -1, epoch: int = -1, version: int = 4) -> Data:
    return tc.init_producer_id(request(22, version, transactional_id="tx",
                                       transaction_timeout_ms=60_000, producer_id=producer_id,
                                       producer_epoch=epoch))


def test_a_zombie_recovering_its_producer_id_is_fenced() -> None:
    tc = TxnCoordinator(fake_handler())
    zombie = _init(tc)
    current = _init(tc)  # a new instance of the same transactional id
    assert current.producer_epoch == zombie.producer_epoch + 1
    for version, code in ((4, ErrorCode.PRODUCER_FENCED), (3, ErrorCode.INVALID_PRODUCER_EPOCH)):
        fenced = _init(tc, zombie.producer_id, zombie.producer_epoch, version)
        assert fenced.error_code == code
    assert tc.txns["tx"].epoch == current.producer_epoch, "the current producer is not fenced"

    bumped = _init(tc, current.producer_id, current.producer_epoch)
    assert (bumped.error_code, bumped.producer_epoch) == (0, current.producer_epoch + 1)
    retried = _init(tc, current.producer_id, current.producer_epoch)
    assert (retried.error_code, retried.producer_epoch) == (0, bumped.producer_epoch)


async def test_requests_of_a_fenced_epoch_are_producer_fenced_from_v2() -> None:
    """AddPartitionsToTxn, AddOffsetsToTxn and EndTxn from an older epoch: PRODUCER_FENCED
    from v2 on (KIP-588), INVALID_PRODUCER_EPOCH before, as Kafka answers."""
    tc = TxnCoordinator(fake_handler())
    zombie = _init(tc)
    _init(tc)  # a new instance fences the zombie's epoch
    ids = {"transactional_id": "tx", "producer_id": zombie.producer_id,
           "producer_epoch": zombie.producer_epoch}
    for version, code in ((2, ErrorCode.PRODUCER_FENCED), (1, ErrorCode.INVALID_PRODUCER_EPOCH)):
        added = await tc.add_partitions(request(24, version, topics=[Data(name="t", partitions=[0])],
                                                **ids))
        assert added.results[0].results[0].error_code == code
        assert tc.add_offsets(request(25, version, group_id="g", **ids)).error_code == code
        ended = await tc.end_txn(request(26, version, committed=True, **ids))
        assert ended.error_code == code
