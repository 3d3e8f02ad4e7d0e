"""Autorecovery with real bookies in this process: the auditor restores the copies of a
lost bookie; the bookie, back, deletes what it no longer has a place in."""

from __future__ import annotations

import json

import pytest

from core.autorecovery import (
    CHECK_SECONDS,
    IDLE_CHECK_SECONDS,
    RESCAN_SECONDS,
    UNDER_REPLICATION,
    Auditor,
)
from core.storage import Position, Storage
from gateway._bookies import collect_garbage
from tests.core._storage_env import ml_config, storage_env

LEDGERS = "/ledgers/ledger"
QUORUM = {"ensemble_size": 2, "write_quorum": 2, "ack_quorum": 2,
          "max_entries_per_ledger": 5, "min_rollover_time_ms": 0}


def named_bookies(metadata) -> dict[int, set[str]]:
    out = {}
    for name in metadata.children(LEDGERS):
        record = json.loads(metadata.get(f"{LEDGERS}/{name}")[0])
        out[int(name)] = {b for _, ensemble in record["ensembles"] for b in ensemble}
    return out


async def read_all(ml, count: int) -> list[bytes]:
    first = ml.first_position()
    assert first is not None
    got = await ml.read_entries(first, count + 5)
    return [e.data for e in got]


async def one_entry_topic(env, name: str, ensemble: int):
    """Storage without a cache (reads go to the bookies) and a managed ledger with one
    entry, on ``ensemble`` bookies, two copies each."""
    storage = Storage(env.bridge, env.metadata, 5000, cache_size_mb=0)
    ml = await storage.open(name, ml_config(ensemble_size=ensemble, write_quorum=2, ack_quorum=2))
    await ml.add_entries([b"x"], [1])
    return storage, ml


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_lost_bookie_is_replaced_and_its_entries_survive_losing_another(tmp_path):
    async with storage_env(tmp_path, bookies=2) as env:
        storage = Storage(env.bridge, env.metadata, 5000, cache_size_mb=0)
        ml = await storage.open("t/ns/persistent/recover", ml_config(**QUORUM))
        for i in range(12):
            await ml.add_entries([b"m%d" % i], [1])
        await ml.close()  # every ledger closed: 0-4, 5-9, 10-11
        a, b = env.bookies
        c, d = env.add_bookie(), env.add_bookie()
        clock = Clock()
        auditor = Auditor(env.metadata, storage, lost_delay_s=30, batch=2, clock=clock)
        await auditor.check()
        assert auditor.known == {a.address, b.address, c.address, d.address}
        held = a.ledgers()
        assert len(held) == 3
        # Every bookie there: the auditor looks again only rarely.
        assert auditor.next_check_in() == IDLE_CHECK_SECONDS

        env.stop_bookie(a)
        await auditor.check()
        assert auditor.missing_since == {a.address: clock.now}
        assert auditor.next_check_in() == CHECK_SECONDS
        clock.now += 29  # lostBookieRecoveryDelay not reached: nothing moves
        await auditor.check()
        assert all(a.address in named for named in named_bookies(env.metadata).values())

        clock.now += 1
        await auditor.check()
        named = named_bookies(env.metadata)
        assert held and all(a.address not in bookies for bookies in named.values())
        assert all(len(named[ledger]) == 2 for ledger in held)
        assert a.address not in auditor.known and not auditor.missing_since
        assert auditor.next_check_in() == IDLE_CHECK_SECONDS
        assert not env.metadata.children(UNDER_REPLICATION)

        # The other original copy goes too: every entry is still there, on C and D.
        env.stop_bookie(b)
        fresh = Storage(env.bridge, env.metadata, 5000, cache_size_mb=0)
        again = await fresh.open("t/ns/persistent/recover", ml_config(**QUORUM))
        assert await read_all(again, 12) == [b"m%d" % i for i in range(12)]
        await again.close()

        # Bookie A comes back: its old copies are over-replicated, and its garbage
        # collection deletes them once it looks for such ledgers.
        back = env.add_bookie(index=0)
        assert back.ledgers() == held
        assert collect_garbage(back, env.metadata) == []
        assert sorted(collect_garbage(back, env.metadata, overreplicated=True)) == held
        assert back.ledgers() == []


async def test_open_ledgers_wait_for_their_writer_and_one_broker_audits(tmp_path):
    async with storage_env(tmp_path, bookies=4) as env:
        storage, ml = await one_entry_topic(env, "t/ns/persistent/open", 3)
        clock = Clock()
        first, second = (Auditor(env.metadata, storage, lost_delay_s=0, batch=10, clock=clock)
                         for _ in range(2))
        assert first.is_auditor() and not second.is_auditor()
        await first.check()
        (ensemble,) = named_bookies(env.metadata).values()
        lost = next(b for b in env.bookies if b.address in ensemble)
        env.stop_bookie(lost)
        await first.check()
        await first.check()
        # The ledger is open: its writer replaces the bookie when it writes next.
        assert all(lost.address in named for named in named_bookies(env.metadata).values())
        assert lost.address in first.known
        # Once it writes to every slot, the writer has replaced it in a new fragment ...
        got = await ml.add_entries([b"y0", b"y1", b"y2"], [1, 1, 1])
        assert [p for p, _, _ in got] == [Position(got[0][0].ledger_id, i) for i in (1, 2, 3)]
        (record,) = (json.loads(env.metadata.get(f"{LEDGERS}/{n}")[0])
                     for n in env.metadata.children(LEDGERS))
        assert lost.address not in record["ensembles"][-1][1]
        # ... and once the ledger is closed, the auditor's next scan replaces it in the
        # earlier one.
        await ml.close()
        await first.check()
        assert any(lost.address in named for named in named_bookies(env.metadata).values())
        clock.now += RESCAN_SECONDS
        await first.check()
        assert all(lost.address not in named for named in named_bookies(env.metadata).values())
        assert lost.address not in first.known


async def test_a_ledger_under_replication_is_not_garbage_collected(tmp_path):
    async with storage_env(tmp_path, bookies=3) as env:
        _, ml = await one_entry_topic(env, "t/ns/persistent/marked", 2)
        await ml.close()
        ledger = next(iter(named_bookies(env.metadata)))
        outsider = next(b for b in env.bookies if b.address not in named_bookies(env.metadata)[ledger])
        # A copy on a bookie the record does not name yet, as while the auditor copies.
        holder = next(b for b in env.bookies if b is not outsider)
        assert ledger in holder.ledgers()
        env.metadata.put(f"{UNDER_REPLICATION}/{ledger}", b"auditor", -1, ephemeral=True)
        record = json.loads(env.metadata.get(f"{LEDGERS}/{ledger}")[0])
        record["ensembles"][0][1] = [outsider.address if x == holder.address else x
                                     for x in record["ensembles"][0][1]]
        env.metadata.put(f"{LEDGERS}/{ledger}", json.dumps(record).encode())
        assert collect_garbage(holder, env.metadata, overreplicated=True) == []
        env.metadata.delete(f"{UNDER_REPLICATION}/{ledger}")
        assert collect_garbage(holder, env.metadata, overreplicated=True) == [ledger]


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_broker_runs_the_auditor_when_enabled(tmp_path, enabled):
    import trio

    from core.broker import BrokerService
    from gateway._config import load_config

    async with storage_env(tmp_path) as env:
        cfg = load_config(None, {"autoRecoveryDaemonEnabled": str(enabled).lower()}, environ={})
        broker = BrokerService(cfg, env.metadata)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            assert (broker.auditor is not None) == enabled
            nursery.cancel_scope.cancel()
