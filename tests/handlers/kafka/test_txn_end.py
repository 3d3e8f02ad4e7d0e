"""EndTxn outside an open transaction answers as Kafka's coordinator does: a transaction
that never began (nothing added since InitProducerId) is INVALID_TXN_STATE, a retry of the
EndTxn that ended the last one succeeds again, and ending it the other way is
INVALID_TXN_STATE."""

from __future__ import annotations

from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from handlers.kafka._txn import TxnCoordinator
from tests.handlers.kafka._coordinators import fake_handler, request


async def _end(tc: TxnCoordinator, ids: Data, committed: bool) -> int:
    resp = await tc.end_txn(request(26, 3, transactional_id="tx", producer_id=ids.producer_id,
                                    producer_epoch=ids.producer_epoch, committed=committed))
    return int(resp.error_code)


async def test_end_txn_outside_a_transaction() -> None:
    tc = TxnCoordinator(fake_handler())
    ids = tc.init_producer_id(request(22, 4, transactional_id="tx", transaction_timeout_ms=60_000,
                                      producer_id=-1, producer_epoch=-1))
    assert await _end(tc, ids, True) == ErrorCode.INVALID_TXN_STATE
    assert await _end(tc, ids, False) == ErrorCode.INVALID_TXN_STATE

    added = tc.add_offsets(request(25, 3, transactional_id="tx", producer_id=ids.producer_id,
                                   producer_epoch=ids.producer_epoch, group_id="g"))
    assert added.error_code == 0
    assert await _end(tc, ids, False) == 0
    assert await _end(tc, ids, False) == 0, "a retried abort succeeds again"
    assert await _end(tc, ids, True) == ErrorCode.INVALID_TXN_STATE

    # What the last transaction ended with is kept across a restart of the coordinator.
    restarted = TxnCoordinator(tc.h)
    assert await _end(restarted, ids, False) == 0
    assert await _end(restarted, ids, True) == ErrorCode.INVALID_TXN_STATE
