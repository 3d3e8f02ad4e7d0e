"""The group coordinator's state machine on trio's autojump clock: joins, syncs, heartbeats,
session expiry and rebalance timeouts, without a broker."""

from __future__ import annotations

import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from core.metadata._memory import MemoryMetadataStore
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode, LocalProtocolError
from handlers.kafka._group import COMPLETING, EMPTY, PREPARING, STABLE, Group, GroupCoordinator
from handlers.kafka._handler import KafkaProtocolHandler
from tests.handlers.kafka._coordinators import fake_handler, request


def _coordinator(h: Any = None) -> GroupCoordinator:
    """A coordinator whose first rebalance completes at once (these tests drive joins
    without its expiry loop, which ends group.initial.rebalance.delay.ms)."""
    return GroupCoordinator(h or fake_handler(), initial_rebalance_delay_ms=0)


def _join(member_id: str = "", session_ms: int = 10_000, rebalance_ms: int = 5_000) -> RequestReceived:
    return request(11, 7, group_id="g", session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                   member_id=member_id, group_instance_id=None, protocol_type="consumer",
                   protocols=[Data(name="range", metadata=b"m")], reason=None)


def _sync(member_id: str, generation: int, assignments: list[Data] | None = None) -> RequestReceived:
    return request(14, 5, group_id="g", generation_id=generation, member_id=member_id,
                   group_instance_id=None, protocol_type="consumer", protocol_name="range",
                   assignments=assignments or [])


def _hb(member_id: str, generation: int) -> RequestReceived:
    return request(12, 4, group_id="g", generation_id=generation, member_id=member_id,
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


async def test_a_member_waiting_for_its_assignment_outlives_its_session_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    """A follower waiting in SyncGroup is alive, as Kafka counts it: a leader whose assignor
    takes longer than the follower's session timeout (but less than its rebalance timeout)
    still settles the group; past the rebalance timeout the follower is dropped."""
    gc = _coordinator()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc.run)
        a = (await gc.join(_join(session_ms=6_000, rebalance_ms=30_000))).member_id
        await gc.sync(_sync(a, 1, [Data(member_id=a, assignment=b"all")]))
        joined: dict[str, Data] = {}

        async def join_b() -> None:
            joined["b"] = await gc.join(_join(session_ms=6_000, rebalance_ms=30_000))

        nursery.start_soon(join_b)
        await trio.sleep(0.5)
        await gc.join(_join(a, session_ms=6_000, rebalance_ms=30_000))
        await trio.sleep(0.1)
        b = joined["b"].member_id
        got: dict[str, Data] = {}

        async def sync_b() -> None:
            got["b"] = await gc.sync(_sync(b, 2))

        nursery.start_soon(sync_b)
        for _ in range(9):  # the leader's assignor takes 9 s, the leader heartbeating
            await trio.sleep(1)
            assert gc.heartbeat(_hb(a, 2)).error_code == 0
        led = await gc.sync(_sync(a, 2, [Data(member_id=a, assignment=b"p0"),
                                         Data(member_id=b, assignment=b"p1")]))
        await trio.sleep(0.1)
        assert (led.error_code, got["b"].error_code, got["b"].assignment) == (0, 0, b"p1")

        # a follower whose leader never answers is dropped at its rebalance timeout
        nursery.start_soon(join_b)
        await trio.sleep(0.5)
        await gc.join(_join(a, session_ms=6_000, rebalance_ms=30_000))
        await trio.sleep(0.1)
        c = joined["b"].member_id

        async def leader_heartbeats() -> None:
            while True:
                await trio.sleep(1)
                gc.heartbeat(_hb(a, 3))

        nursery.start_soon(leader_heartbeats)
        waited = trio.current_time()
        stuck = await gc.sync(_sync(c, 3))
        assert stuck.error_code != 0 and trio.current_time() - waited >= 30
        assert c not in gc.groups["g"].members
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


def _subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0 of ``topics``, no user data."""
    body = b"".join(struct.pack(">h", len(t)) + t.encode() for t in topics)
    return struct.pack(">hi", 0, len(topics)) + body + struct.pack(">i", -1)


def _consumer_join(member_id: str = "", metadata: bytes = b"") -> RequestReceived:
    return request(11, 7, group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=5_000,
                   member_id=member_id, group_instance_id=None, protocol_type="consumer",
                   protocols=[Data(name="range", metadata=metadata or _subscription("t"))],
                   reason=None)


async def test_a_member_joining_again_unchanged_gets_its_generation_without_a_rebalance(
        autojump_clock: trio.testing.MockClock) -> None:
    """A client whose JoinGroup (or SyncGroup) answer arrived while it was not looking asks
    again with the same metadata: it is answered with the generation it is in, while the
    leader's assignment is awaited and once the group is stable, the leader too unless
    the subscribed topics' partitions changed. Changed metadata rebalances."""
    partitions = {"t": 4}
    gc = GroupCoordinator(fake_handler(topics=SimpleNamespace(
        topic_name=lambda name: name, partition_count=lambda name: partitions.get(name, 0))),
        initial_rebalance_delay_ms=0)
    g_state = lambda: gc.groups["g"].state  # noqa: E731
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc.run)
        a = (await gc.join(_consumer_join())).member_id
        await gc.sync(_sync(a, 1, [Data(member_id=a, assignment=b"all")]))
        joined: dict[str, Data] = {}

        async def join_b() -> None:
            joined["b"] = await gc.join(_consumer_join())

        nursery.start_soon(join_b)
        await trio.sleep(0.5)
        await gc.join(_consumer_join(a))
        await trio.sleep(0.1)
        b = joined["b"].member_id
        assert g_state() == COMPLETING and gc.groups["g"].generation == 2

        # while the leader assigns: the follower asks again, the leader too
        again = await gc.join(_consumer_join(b))
        assert (again.error_code, again.generation_id, again.members) == (0, 2, [])
        led = await gc.join(_consumer_join(a))
        assert led.generation_id == 2 and {m.member_id for m in led.members} == {a, b}
        assert g_state() == COMPLETING

        got: dict[str, Data] = {}

        async def sync_b() -> None:
            got["b"] = await gc.sync(_sync(b, 2))

        nursery.start_soon(sync_b)
        await trio.sleep(0.1)
        await gc.sync(_sync(a, 2, [Data(member_id=a, assignment=b"p01"),
                                   Data(member_id=b, assignment=b"p23")]))
        await trio.sleep(0.1)
        assert got["b"].assignment == b"p23" and g_state() == STABLE

        # stable: the follower, then the leader, ask again and sync into generation 2
        assert (await gc.join(_consumer_join(b))).generation_id == 2
        assert (await gc.sync(_sync(b, 2))).assignment == b"p23"
        led = await gc.join(_consumer_join(a))
        assert led.generation_id == 2 and len(led.members) == 2
        assert (await gc.sync(_sync(a, 2, []))).assignment == b"p01"
        assert g_state() == STABLE and gc.heartbeat(_hb(b, 2)).error_code == 0

        # assigning the same again changes nothing
        await gc.join(_consumer_join(a))
        same = await gc.sync(_sync(a, 2, [Data(member_id=a, assignment=b"p01"),
                                          Data(member_id=b, assignment=b"p23")]))
        assert (same.error_code, same.assignment, g_state()) == (0, b"p01", STABLE)

        # the topic gained partitions: the leader's rejoin rebalances, as in Kafka
        partitions["t"] = 6
        nursery.start_soon(gc.join, _consumer_join(a))
        await trio.sleep(0.1)
        assert g_state() == PREPARING
        assert gc.heartbeat(_hb(b, 2)).error_code == ErrorCode.REBALANCE_IN_PROGRESS
        third = await gc.join(_consumer_join(b))
        assert third.generation_id == 3
        await gc.sync(_sync(a, 3, [Data(member_id=a, assignment=b"x"),
                                   Data(member_id=b, assignment=b"y")]))
        assert g_state() == STABLE

        # a follower whose subscription changed rebalances the group
        nursery.start_soon(gc.join, _consumer_join(b, _subscription("t", "u")))
        await trio.sleep(0.1)
        assert g_state() == PREPARING
        nursery.cancel_scope.cancel()


async def test_a_leader_that_joined_again_and_assigns_otherwise_rebalances_the_group(
        autojump_clock: trio.testing.MockClock) -> None:
    """A leader joins a stable group again unchanged but assigns otherwise (its view of
    the topics changed, as a first assignment made before it had their metadata): the
    group rebalances, and the leader's next assignment is the one handed out."""
    gc = GroupCoordinator(fake_handler(topics=SimpleNamespace(
        topic_name=lambda name: name, partition_count=lambda name: 2)),
        initial_rebalance_delay_ms=0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc.run)
        a = (await gc.join(_consumer_join())).member_id
        await gc.sync(_sync(a, 1, [Data(member_id=a, assignment=b"")]))
        assert (await gc.join(_consumer_join(a))).generation_id == 1
        told = await gc.sync(_sync(a, 1, [Data(member_id=a, assignment=b"p01")]))
        assert told.error_code == ErrorCode.REBALANCE_IN_PROGRESS
        again = await gc.join(_consumer_join(a))
        assert again.generation_id == 2
        got = await gc.sync(_sync(a, 2, [Data(member_id=a, assignment=b"p01")]))
        assert (got.error_code, got.assignment) == (0, b"p01")
        nursery.cancel_scope.cancel()


async def test_the_first_rebalance_waits_the_initial_delay_for_more_members(
        autojump_clock: trio.testing.MockClock) -> None:
    """group.initial.rebalance.delay.ms: the first rebalance of an empty group completes
    that long after the last member joined (never past the rebalance timeout), so members
    starting together share the first generation; with 0, the first member is alone in it."""
    gc = GroupCoordinator(fake_handler(), initial_rebalance_delay_ms=3_000)
    results: dict[str, tuple[Data, float]] = {}

    async def join(name: str, after: float, rebalance_ms: int = 20_000) -> None:
        await trio.sleep(after)
        r = await gc.join(_join(rebalance_ms=rebalance_ms))
        results[name] = (r, trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc.run)
        async with trio.open_nursery() as joins:
            joins.start_soon(join, "a", 0.0)
            joins.start_soon(join, "b", 2.0)
        (ra, ta), (rb, tb) = results["a"], results["b"]
        assert ra.generation_id == rb.generation_id == 1 and len(ra.members + rb.members) == 2
        assert 5.0 <= ta - start < 5.5 and 5.0 <= tb - start < 5.5

        # the wait never outlasts the rebalance timeout
        gc.groups.clear()
        results.clear()
        start = trio.current_time()
        async with trio.open_nursery() as joins:
            for i in range(3):
                joins.start_soon(join, f"m{i}", 2.0 * i, 5_000)
        assert {r.generation_id for r, _ in results.values()} == {1}
        assert all(5.0 <= t - start < 5.5 for _, t in results.values())
        nursery.cancel_scope.cancel()

    at_once = GroupCoordinator(fake_handler(), initial_rebalance_delay_ms=0)
    start = trio.current_time()
    first = await at_once.join(_join())
    assert trio.current_time() - start < 0.5 and [m.member_id for m in first.members] == \
        [first.member_id]


async def test_last_member_leaving_empties_the_group(autojump_clock: trio.testing.MockClock) -> None:
    gc = _coordinator()
    a = (await gc.join(_join())).member_id
    await gc.sync(_sync(a, 1, []))
    resp = gc.leave(request(13, 5, group_id="g", members=[Data(member_id=a, group_instance_id=None,
                                                                reason=None)]))
    assert resp.members[0].error_code == 0
    assert gc.groups["g"].state == EMPTY and not gc.groups["g"].members


def _committing_coordinator(metadata: str) -> tuple[GroupCoordinator, list[Data]]:
    """A coordinator that stores commits (no subscriptions to move), and the topics of a
    commit of offset 5 on t-0."""
    gc = _coordinator()
    gc.h.topics = SimpleNamespace(topic_name=lambda name: name,
                                  partition_count=lambda name: 1 if name == "t" else 0)

    async def no_cursor(*args: Any) -> None:
        return None

    gc._move_cursor = no_cursor  # type: ignore[method-assign]
    return gc, [Data(name="t", partitions=[Data(partition_index=0, committed_offset=5,
                                                committed_metadata=metadata)])]


RETENTION_S = 7 * 24 * 3600.0


def _commit(group_id: str, topics: list[Data], member_id: str = "",
            generation: int = -1) -> RequestReceived:
    return request(8, 8, group_id=group_id, generation_id_or_member_epoch=generation,
                   member_id=member_id, group_instance_id=None, topics=topics)


async def test_offsets_expire_after_the_retention() -> None:
    """offsets.retention.minutes (KIP-211): a group that only stores offsets loses each one
    that long after its commit, an empty consumer group all of them that long after it
    became empty, and a group left with none is gone; a group with members keeps those
    of topics it subscribes to."""
    gc, topics = _committing_coordinator("")
    gc.h.txns = SimpleNamespace(pending_offsets=lambda group_id: set())
    unsubscribed: list[tuple[str, str, int]] = []

    async def unsubscribe(group_id: str, topic: str, partition: int) -> None:
        unsubscribed.append((group_id, topic, partition))

    gc._unsubscribe = unsubscribe  # type: ignore[method-assign]
    await gc.commit(_commit("simple", topics))
    committed = time.time()
    joined = await gc.join(_join())
    await gc.sync(_sync(joined.member_id, joined.generation_id, []))
    await gc.commit(_commit("g", topics, joined.member_id, joined.generation_id))

    await gc.expire_offsets(committed + RETENTION_S - 60)
    assert set(gc.groups) == {"simple", "g"} and not unsubscribed
    await gc.expire_offsets(committed + RETENTION_S + 60)
    # "simple" is gone, store and all; "g", with a member subscribing to every topic
    # (its metadata does not read as a subscription), keeps its offset.
    assert "simple" not in gc.groups and "simple" not in gc.stored_group_ids()
    assert unsubscribed == [("simple", "t", 0)]
    assert gc.groups["g"].offsets

    gc.leave(request(13, 5, group_id="g", members=[
        Data(member_id=joined.member_id, group_instance_id=None, reason=None)]))
    emptied = gc.groups["g"].empty_since
    assert gc.groups["g"].state == EMPTY and emptied is not None
    await gc.expire_offsets(emptied + RETENTION_S - 60)
    assert gc.groups["g"].offsets, "kept until the group has been empty for the retention"
    await gc.expire_offsets(emptied + RETENTION_S + 60)
    assert "g" not in gc.groups and "g" not in gc.stored_group_ids()
    fetched = gc.fetch_offsets(request(9, 7, group_id="g", topics=None, require_stable=False))
    assert fetched.topics == []


async def test_commit_checks_generation_and_member() -> None:
    gc, topics = _committing_coordinator("m")
    simple = await gc.commit(request(8, 8, group_id="g", generation_id_or_member_epoch=-1,
                                     member_id="", group_instance_id=None, topics=topics))
    assert simple.topics[0].partitions[0].error_code == 0
    stale = await gc.commit(request(8, 8, group_id="g", generation_id_or_member_epoch=3,
                                    member_id="nobody", group_instance_id=None, topics=topics))
    assert stale.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    fetched = gc.fetch_offsets(request(9, 7, group_id="g", topics=None, require_stable=False))
    assert fetched.topics[0].partitions[0].committed_offset == 5
    # Durable: a new coordinator over the same store reads the commit back.
    again = _coordinator(gc.h)
    fetched = again.fetch_offsets(request(9, 7, group_id="g", topics=[
        Data(name="t", partition_indexes=[0, 1])], require_stable=False))
    assert [p.committed_offset for p in fetched.topics[0].partitions] == [5, -1]


async def test_offsets_of_partitions_that_do_not_exist_are_not_committed() -> None:
    gc, _ = _committing_coordinator("")
    resp = await gc.commit(request(8, 8, group_id="g", generation_id_or_member_epoch=-1,
                                   member_id="", group_instance_id=None, topics=[
                                       Data(name=name, partitions=[Data(
                                           partition_index=i, committed_offset=5,
                                           committed_metadata="") for i in (0, 1)])
                                       for name in ("t", "missing")]))
    assert [[p.error_code for p in t.partitions] for t in resp.topics] == [
        [0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION], [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 2]
    assert set(gc.groups["g"].offsets) == {("t", 0)}


async def test_a_commit_without_generation_to_a_group_with_members_is_unknown_member() -> None:
    """An admin client's commit (generation -1, no member id), as to reset offsets: fine
    once the group is empty; while it has members, UNKNOWN_MEMBER_ID, as Kafka answers."""
    gc, topics = _committing_coordinator("")

    def admin_commit() -> RequestReceived:
        return request(8, 8, group_id="g", generation_id_or_member_epoch=-1, member_id="",
                       group_instance_id=None, topics=topics)

    a = (await gc.join(_join())).member_id
    await gc.sync(_sync(a, 1, []))
    busy = await gc.commit(admin_commit())
    assert busy.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    gc.leave(request(13, 5, group_id="g", members=[Data(member_id=a, group_instance_id=None,
                                                         reason=None)]))
    idle = await gc.commit(admin_commit())
    assert idle.topics[0].partitions[0].error_code == 0


async def test_list_groups_shows_an_offsets_only_group_without_protocol_type() -> None:
    """A group that only stores offsets has no protocol type (a "simple" group to admin
    clients), one whose members joined has theirs, also after a restart."""
    gc, topics = _committing_coordinator("")

    def commit(group_id: str, member_id: str = "", generation: int = -1) -> RequestReceived:
        return request(8, 8, group_id=group_id, generation_id_or_member_epoch=generation,
                       member_id=member_id, group_instance_id=None, topics=topics)

    await gc.commit(commit("simple"))
    joined = await gc.join(_join())
    await gc.sync(_sync(joined.member_id, joined.generation_id, []))
    await gc.commit(commit("g", joined.member_id, joined.generation_id))
    for coordinator in (gc, _coordinator(gc.h)):
        listed = coordinator.list_groups(request(16, 4, states_filter=[]))
        assert {x.group_id: x.protocol_type for x in listed.groups} == {
            "simple": "", "g": "consumer"}


async def test_list_groups_states_filter_ignores_case() -> None:
    """As Kafka's group coordinator, ListGroups v4+ matches its states filter
    case-insensitively, each state trimmed."""
    gc = _coordinator()
    joined = await gc.join(_join())
    await gc.sync(_sync(joined.member_id, joined.generation_id, []))
    for states in (["Stable"], ["stable"], [" STABLE "], ["Empty", "stable"]):
        listed = gc.list_groups(request(16, 4, states_filter=states))
        assert [x.group_state for x in listed.groups] == ["Stable"], states
    assert gc.list_groups(request(16, 4, states_filter=["empty"])).groups == []


async def test_list_groups_v5_gives_and_filters_the_group_type() -> None:
    """ListGroups v5 (KIP-848) gives each group its type, "classic" for a group of the
    JoinGroup protocol, and filters by type case-insensitively (an unknown type matches
    no group), as Kafka's Group.GroupType.parse."""
    gc = _coordinator()
    joined = await gc.join(_join())
    await gc.sync(_sync(joined.member_id, joined.generation_id, []))
    for types in ([], ["classic"], ["CLASSIC", "consumer"]):
        listed = gc.list_groups(request(16, 5, states_filter=[], types_filter=types))
        assert [x.group_type for x in listed.groups] == ["classic"], types
    for types in (["consumer"], ["share"], ["nonsense"]):
        assert gc.list_groups(request(16, 5, states_filter=[], types_filter=types)).groups == []


async def test_session_timeout_must_be_within_the_group_bounds() -> None:
    """As Kafka's group.min/max.session.timeout.ms (6 s and 30 min by default): a member
    asking for a session timeout outside them is INVALID_SESSION_TIMEOUT."""
    gc = _coordinator()
    for ms in (1_000, 5_999, 1_800_001):
        assert (await gc.join(_join(session_ms=ms))).error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    assert (await gc.join(_join(session_ms=6_000))).error_code == 0
    # The bounds are the broker's keys of the same names.
    h = KafkaProtocolHandler({"group.min.session.timeout.ms": 1_000,
                              "group.max.session.timeout.ms": 2_000}, SimpleNamespace(cluster="c"))
    assert (h.groups.min_session_ms, h.groups.max_session_ms) == (1_000, 2_000)


# -- static membership (KIP-345) ---------------------------------------------------------------


def _static_join(instance: str, member_id: str = "", version: int = 9) -> RequestReceived:
    return request(11, version, group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=5_000,
                   member_id=member_id, group_instance_id=instance, protocol_type="consumer",
                   protocols=[Data(name="range", metadata=instance.encode())], reason=None)


async def _two_static_members(gc: GroupCoordinator, nursery: trio.Nursery) -> tuple[str, str]:
    a = await gc.join(_static_join("ia"))
    await gc.sync(_sync(a.member_id, a.generation_id, [Data(member_id=a.member_id, assignment=b"all")]))
    got: dict[str, Data] = {}

    async def join_b() -> None:
        got["b"] = await gc.join(_static_join("ib"))

    nursery.start_soon(join_b)
    await trio.sleep(0.5)
    a2 = await gc.join(_static_join("ia", a.member_id))
    await trio.sleep(0.1)
    b = got["b"]
    assert b.error_code == 0 and a2.error_code == 0, (a2, b)
    sync_b: dict[str, Data] = {}

    async def sync_follower() -> None:
        sync_b["r"] = await gc.sync(_sync(b.member_id, b.generation_id))

    nursery.start_soon(sync_follower)
    await trio.sleep(0.1)
    await gc.sync(_sync(a.member_id, a2.generation_id, [Data(member_id=a.member_id, assignment=b"p0"),
                                                        Data(member_id=b.member_id, assignment=b"p1")]))
    await trio.sleep(0.1)
    assert sync_b["r"].assignment == b"p1" and gc.groups["g"].state == STABLE, sync_b
    return a.member_id, b.member_id


@asynccontextmanager
async def _static_group() -> AsyncIterator[tuple[GroupCoordinator, str, str]]:
    """A running coordinator with the stable group g of static members ia and ib."""
    gc = _coordinator()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc.run)
        a, b = await _two_static_members(gc, nursery)
        yield gc, a, b
        nursery.cancel_scope.cancel()


async def test_static_member_rejoins_without_a_rebalance_and_fences_its_old_id(
        autojump_clock: trio.testing.MockClock) -> None:
    async with _static_group() as (gc, a, b):
        g = gc.groups["g"]
        generation = g.generation
        # b restarts (no LeaveGroup, as static members do) and is back within its session.
        await trio.sleep(3)
        back = await gc.join(_static_join("ib"))
        assert back.error_code == 0 and back.member_id != b
        assert back.generation_id == generation and g.state == STABLE
        assert back.leader == a and back.members == [] and not back.skip_assignment
        synced = await gc.sync(request(14, 5, group_id="g", generation_id=generation,
                                       member_id=back.member_id, group_instance_id="ib",
                                       protocol_type="consumer", protocol_name="range", assignments=[]))
        assert synced.error_code == 0 and synced.assignment == b"p1"
        # a saw no rebalance.
        assert gc.heartbeat(_hb(a, generation)).error_code == 0
        # The old incarnation is fenced everywhere.
        old_hb = request(12, 4, group_id="g", generation_id=generation, member_id=b, group_instance_id="ib")
        assert gc.heartbeat(old_hb).error_code == ErrorCode.FENCED_INSTANCE_ID
        old_sync = request(14, 5, group_id="g", generation_id=generation, member_id=b,
                           group_instance_id="ib", protocol_type="consumer", protocol_name="range",
                           assignments=[])
        assert (await gc.sync(old_sync)).error_code == ErrorCode.FENCED_INSTANCE_ID
        assert (await gc.join(_static_join("ib", b))).error_code == ErrorCode.FENCED_INSTANCE_ID
        gc.h.topics = SimpleNamespace(topic_name=lambda name: name,
                                  partition_count=lambda name: 1 if name == "t" else 0)
        commit = await gc.commit(request(8, 8, group_id="g", generation_id_or_member_epoch=generation,
                                         member_id=b, group_instance_id="ib", topics=[Data(
                                             name="t", partitions=[Data(partition_index=0, committed_offset=1,
                                                                        committed_metadata=None)])]))
        assert commit.topics[0].partitions[0].error_code == ErrorCode.FENCED_INSTANCE_ID
        leave = gc.leave(request(13, 5, group_id="g", members=[
            Data(member_id=b, group_instance_id="ib", reason=None)]))
        assert leave.error_code == 0 and leave.members[0].error_code == ErrorCode.FENCED_INSTANCE_ID
        assert g.state == STABLE and len(g.members) == 2


async def test_static_leader_rejoin_is_told_to_skip_assignment(
        autojump_clock: trio.testing.MockClock) -> None:
    async with _static_group() as (gc, a, b):
        back = await gc.join(_static_join("ia"))
        assert back.leader == back.member_id and back.skip_assignment
        assert {m.group_instance_id for m in back.members} == {"ia", "ib"}
        assert gc.groups["g"].state == STABLE


async def test_static_member_expires_and_leaves_by_instance_id(
        autojump_clock: trio.testing.MockClock) -> None:
    async with _static_group() as (gc, a, b):
        g = gc.groups["g"]
        # An admin removes ib by instance id alone (member id empty): a rebalance follows.
        leave = gc.leave(request(13, 5, group_id="g", members=[
            Data(member_id="", group_instance_id="ib", reason=None),
            Data(member_id="", group_instance_id="nobody", reason=None)]))
        assert [m.error_code for m in leave.members] == [0, ErrorCode.UNKNOWN_MEMBER_ID]
        assert g.state == PREPARING and b not in g.members
        # a stops heartbeating: past its session timeout it is gone too, and the
        # instance id no longer fences anybody.
        await trio.sleep(20)
        assert g.state == EMPTY and not g.members
        fresh = await gc.join(_static_join("ia"))
        assert fresh.error_code == 0 and fresh.member_id != a


# -- atomic offset commits ----------------------------------------------------------------------


class _Crash(Exception):
    """The process dying at an injected point."""


class _FailingStore(MemoryMetadataStore):
    """A metadata store whose next writes fail, as a crash or a lost store would."""

    fail = False

    def put(self, path: str, data: bytes, expected_version: int | None = None, *,
            ephemeral: bool = False) -> int:
        if self.fail:
            raise OSError("injected: metadata store unavailable")
        return super().put(path, data, expected_version, ephemeral=ephemeral)


def _commit_all(offset: int, partitions: int = 4) -> RequestReceived:
    return request(8, 8, group_id="g", generation_id_or_member_epoch=-1, member_id="",
                   group_instance_id=None, topics=[
                    Data(name="t", partitions=[Data(partition_index=i, committed_offset=offset,
                                                    committed_metadata=None)
                                               for i in range(partitions)])])


def _committed(gc: GroupCoordinator) -> list[int]:
    got = gc.fetch_offsets(request(9, 7, group_id="g", topics=None, require_stable=False))
    return [p.committed_offset for t in got.topics for p in t.partitions]


async def test_a_multi_partition_commit_is_all_or_nothing() -> None:
    store = _FailingStore()
    h = fake_handler(store, topics=SimpleNamespace(topic_name=lambda name: name,
                                                   partition_count=lambda name: 4))
    moved: list[tuple[str, int, int]] = []

    async def crash_after_first_cursor(group_id: str, topic: str, partition: int, offset: int) -> None:
        # A crash after the commit was stored, while the subscriptions follow.
        if moved and offset == 9:
            raise _Crash
        moved.append((topic, partition, offset))

    async def follow(group_id: str, topic: str, partition: int, offset: int) -> None:
        moved.append((topic, partition, offset))

    gc = _coordinator(h)
    gc._move_cursor = crash_after_first_cursor  # type: ignore[method-assign]
    assert all(p.error_code == 0 for p in (await gc.commit(_commit_all(5))).topics[0].partitions)

    # The store fails the write: every partition fails, nothing changes, here or stored.
    store.fail = True
    failed = await gc.commit(_commit_all(7))
    assert {p.error_code for p in failed.topics[0].partitions} == {ErrorCode.COORDINATOR_NOT_AVAILABLE}
    assert _committed(gc) == [5, 5, 5, 5]
    store.fail = False

    # The process dies between the stored commit and the subscriptions: after a restart
    # every partition has the new offset, and the subscriptions catch up on first use.
    with pytest.raises(_Crash):
        await gc.commit(_commit_all(9))
    restarted = _coordinator(h)
    moved.clear()
    restarted._move_cursor = follow  # type: ignore[method-assign]
    assert _committed(restarted) == [9, 9, 9, 9]
    await restarted.commit(_commit_all(9, partitions=0))
    assert sorted(moved) == [("t", i, 9) for i in range(4)]
