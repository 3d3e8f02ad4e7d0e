"""The coordinators' tick: it runs while something can expire and parks otherwise, and a
transaction past its timeout is still aborted by a tick that was parked when it began."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from core.metadata._memory import MemoryMetadataStore
from handlers._ticker import Ticker
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode
from handlers.kafka._txn import EMPTY, ONGOING, TICK_S, TxnCoordinator


async def test_a_busy_ticker_ticks_each_period(autojump_clock: trio.testing.MockClock) -> None:
    t = Ticker(0.5)
    start = trio.current_time()
    await t.next_tick(busy=True)
    await t.next_tick(busy=True)
    assert trio.current_time() - start == 1.0


async def test_an_idle_ticker_sleeps_until_armed(autojump_clock: trio.testing.MockClock) -> None:
    t = Ticker(0.5)
    ticked = trio.Event()

    async def tick() -> None:
        await t.next_tick(busy=False)
        ticked.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await trio.sleep(3600)
        assert not ticked.is_set(), "nothing to check: no tick in an hour"
        armed_at = trio.current_time()
        t.arm()
        await ticked.wait()
        assert trio.current_time() - armed_at == 0.5


def _req(key: int, **body: Any) -> RequestReceived:
    return RequestReceived(api_key=key, api_version=3, correlation_id=1, client_id="c",
                           body=Data(**body), size=0)


async def test_an_open_transaction_is_aborted_at_its_timeout_after_an_idle_spell(
        autojump_clock: trio.testing.MockClock) -> None:
    h: Any = SimpleNamespace(broker=SimpleNamespace(metadata=MemoryMetadataStore()))
    tc = TxnCoordinator(h)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tc.run)
        await trio.sleep(600)  # the coordinator has had nothing to expire all along
        pid = tc.init_producer_id(_req(22, transactional_id="tx", transaction_timeout_ms=5_000,
                                       producer_id=-1, producer_epoch=-1))
        added = tc.add_offsets(_req(25, transactional_id="tx", producer_id=pid.producer_id,
                                    producer_epoch=pid.producer_epoch, group_id="g"))
        assert added.error_code == 0 and tc.txns["tx"].state == ONGOING
        await trio.sleep(4.9)
        assert tc.txns["tx"].state == ONGOING, "not before its timeout"
        await trio.sleep(0.1 + TICK_S + 0.01)  # the timeout, then at most one tick
        assert tc.txns["tx"].state == EMPTY and tc.txns["tx"].epoch == pid.producer_epoch + 1
        fenced = tc.add_offsets(_req(25, transactional_id="tx", producer_id=pid.producer_id,
                                     producer_epoch=pid.producer_epoch, group_id="g"))
        assert fenced.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        nursery.cancel_scope.cancel()
