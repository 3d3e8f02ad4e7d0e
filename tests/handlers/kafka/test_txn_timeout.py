"""The transaction coordinator's timeout on trio's autojump clock, without a broker: its
tick parks while no transaction is open, and a transaction begun after an idle spell is
still aborted at its timeout."""

from __future__ import annotations

import trio
import trio.testing

from handlers.kafka._errors import ErrorCode
from handlers.kafka._txn import EMPTY, ONGOING, TICK_S, TxnCoordinator
from tests.handlers.kafka._coordinators import fake_handler, request


async def test_an_open_transaction_is_aborted_at_its_timeout_after_an_idle_spell(
        autojump_clock: trio.testing.MockClock) -> None:
    tc = TxnCoordinator(fake_handler())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tc.run)
        await trio.sleep(600)  # the coordinator has had nothing to expire all along
        pid = tc.init_producer_id(request(22, 3, transactional_id="tx",
                                          transaction_timeout_ms=5_000,
                                          producer_id=-1, producer_epoch=-1))
        added = tc.add_offsets(request(25, 3, transactional_id="tx", producer_id=pid.producer_id,
                                       producer_epoch=pid.producer_epoch, group_id="g"))
        assert added.error_code == 0 and tc.txns["tx"].state == ONGOING
        await trio.sleep(4.9)
        assert tc.txns["tx"].state == ONGOING, "not before its timeout"
        await trio.sleep(0.1 + TICK_S + 0.01)  # the timeout, then at most one tick
        assert tc.txns["tx"].state == EMPTY and tc.txns["tx"].epoch == pid.producer_epoch + 1
        fenced = tc.add_offsets(request(25, 3, transactional_id="tx", producer_id=pid.producer_id,
                                       producer_epoch=pid.producer_epoch, group_id="g"))
        assert fenced.error_code == ErrorCode.PRODUCER_FENCED  # v3: KIP-588
        nursery.cancel_scope.cancel()
