"""The coordinators' tick: it runs while something can expire and parks otherwise."""

from __future__ import annotations

import trio
import trio.testing

from handlers._ticker import Ticker


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
