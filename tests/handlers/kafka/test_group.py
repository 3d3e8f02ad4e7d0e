"""The group coordinator's state machine on trio's autojump clock: joins, syncs, heartbeats,
session expiry and rebalance timeouts, without a broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from core.metadata._memory import MemoryMetadataStore
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode, LocalProtocolError
from handlers.kafka._group import COMPLETING, EMPTY, PREPARING, STABLE, Group, GroupCoordinator


def _coordinator() -> GroupCoordinator:
    h: Any = SimpleNamespace(broker=SimpleNamespace(metadata=MemoryMetadataStore()))
    return GroupCoordinator(h)


def _req(key: int, version: int, **body: Any) -> RequestReceived:
    return RequestReceived(api_key=key, api_version=version, correlation_id=1, client_id="c",
                           body=Data(**body), size=0)


def _join(member_id: str = "", session_ms: int = 10_000, rebalance_ms: int = 5_000) -> RequestReceived:
    return _req(11, 7, group_id="g", session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                member_id=member_id, group_instance_id=None, protocol_type="consumer",
                protocols=[Data(name="range", metadata=b"m")], reason=None)


def _sync(member_id: str, generation: int, assignments: list[Data] | None = None) -> RequestReceived:
    return _req(14, 5, group_id="g", generation_id=generation, member_id=member_id,
                group_instance_id=None, protocol_type="consumer", protocol_name="range",
                assignments=assignments or [])


def _hb(member_id: str, generation: int) -> RequestReceived:
    return _req(12, 4, group_id="g", generation_id=generation, member_id=member_id,
                group_instance_id=None)


def test_transitions_outside_the_table_are_refused() -> None:
    g = Group("g")
    with pytest.raises(LocalProtocolError):
        g.transition(STABLE)


async def test_two_members_join_sync_and_a_silent_one_expires(
        autojump_clock: trio.testing.MockClock) -> None:
    gc = _coordinator()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc.run)
        first = await gc.join(_join())
        assert first.error_code == 0 and first.leader == first.member_id
        a = first.member_id
        synced = await gc.sync(_sync(a, first.generation_id, [Data(member_id=a, assignment=b"all")]))
        assert synced.assignment == b"all" and gc.groups["g"].state == STABLE

        # b joins: a is told to rejoin by its heartbeat, then both get generation 2.
        results: dict[str, Data] = {}

        async def join_b() -> None:
            results["b"] = await gc.join(_join())

        nursery.start_soon(join_b)
        await trio.sleep(0.5)
        assert gc.groups["g"].state == PREPARING
        assert gc.heartbeat(_hb(a, 1)).error_code == ErrorCode.REBALANCE_IN_PROGRESS
        again = await gc.join(_join(a))
        await trio.sleep(0.1)
        b = results["b"]
        assert again.generation_id == b.generation_id == 2
        assert {m.member_id for m in again.members} == {a, b.member_id} and b.members == []
        assert gc.groups["g"].state == COMPLETING

        follower: dict[str, Data] = {}

        async def sync_b() -> None:
            follower["r"] = await gc.sync(_sync(b.member_id, 2))

        nursery.start_soon(sync_b)
        await trio.sleep(0.1)
        await gc.sync(_sync(a, 2, [Data(member_id=a, assignment=b"p0"),
                                   Data(member_id=b.member_id, assignment=b"p1")]))
        await trio.sleep(0.1)
        assert follower["r"].assignment == b"p1"
        assert gc.heartbeat(_hb(a, 1)).error_code == ErrorCode.ILLEGAL_GENERATION

        # Only a keeps heartbeating: b's session (10 s) expires and a is asked to rejoin.
        for _ in range(12):
            await trio.sleep(1)
            code = gc.heartbeat(_hb(a, 2)).error_code
            if code:
                break
        assert code == ErrorCode.REBALANCE_IN_PROGRESS
        assert b.member_id not in gc.groups["g"].members
        third = await gc.join(_join(a))
        assert third.generation_id == 3 and [m.member_id for m in third.members] == [a]
        nursery.cancel_scope.cancel()


async def test_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    gc = _coordinator()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc.run)
        a = (await gc.join(_join(rebalance_ms=3_000))).member_id
        await gc.sync(_sync(a, 1, []))
        start = trio.current_time()
        b = await gc.join(_join(rebalance_ms=3_000))
        assert trio.current_time() - start >= 3.0
        assert b.generation_id == 2 and [m.member_id for m in b.members] == [b.member_id]
        assert gc.heartbeat(_hb(a, 1)).error_code == ErrorCode.UNKNOWN_MEMBER_ID
        nursery.cancel_scope.cancel()


async def test_last_member_leaving_empties_the_group(autojump_clock: trio.testing.MockClock) -> None:
    gc = _coordinator()
    a = (await gc.join(_join())).member_id
    await gc.sync(_sync(a, 1, []))
    resp = gc.leave(_req(13, 5, group_id="g", members=[Data(member_id=a, group_instance_id=None,
                                                             reason=None)]))
    assert resp.members[0].error_code == 0
    assert gc.groups["g"].state == EMPTY and not gc.groups["g"].members


async def test_commit_checks_generation_and_member() -> None:
    gc = _coordinator()
    gc.h.topics = SimpleNamespace(topic_name=lambda name: name)

    async def no_cursor(*args: Any) -> None:
        return None

    gc._move_cursor = no_cursor  # type: ignore[method-assign]
    topics = [Data(name="t", partitions=[Data(partition_index=0, committed_offset=5,
                                              committed_metadata="m")])]
    simple = await gc.commit(_req(8, 8, group_id="g", generation_id_or_member_epoch=-1,
                                  member_id="", group_instance_id=None, topics=topics))
    assert simple.topics[0].partitions[0].error_code == 0
    stale = await gc.commit(_req(8, 8, group_id="g", generation_id_or_member_epoch=3,
                                 member_id="nobody", group_instance_id=None, topics=topics))
    assert stale.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    fetched = gc.fetch_offsets(_req(9, 7, group_id="g", topics=None, require_stable=False))
    assert fetched.topics[0].partitions[0].committed_offset == 5
    # Durable: a new coordinator over the same store reads the commit back.
    again = GroupCoordinator(gc.h)
    fetched = again.fetch_offsets(_req(9, 7, group_id="g", topics=[
        Data(name="t", partition_indexes=[0, 1])], require_stable=False))
    assert [p.committed_offset for p in fetched.topics[0].partitions] == [5, -1]
