"""Theory of operation: the consumer group coordinator (the classic group protocol).

This broker coordinates every group (FindCoordinator answers with itself). A group moves
through Kafka's states, driven by the table in :data:`TRANSITIONS`::

    Empty --join--> PreparingRebalance --all known members joined, or the rebalance
    timeout--> CompletingRebalance --leader's SyncGroup--> Stable --join/leave/session
    expiry--> PreparingRebalance ... ; the last member leaving --> Empty

JoinGroup and SyncGroup are long polls: a JoinGroup waits until the rebalance completes
(members that do not rejoin within the rebalance timeout are removed), a follower's
SyncGroup waits for the leader's assignment. Heartbeats keep a member alive and tell it
(REBALANCE_IN_PROGRESS) to rejoin. The broker never looks inside the protocol metadata:
the clients' range, roundrobin and cooperative-sticky assignors all run on the leader.

Static membership (KIP-345): a member that joins with a ``group.instance.id`` keeps its
place across restarts. Rejoining with an empty member id while its old incarnation is
still in the group (within the session timeout), it gets a new member id, the old one's
assignment and, in a stable group, no rebalance; the old member id is fenced
(FENCED_INSTANCE_ID on its JoinGroup, SyncGroup, Heartbeat, OffsetCommit and LeaveGroup).
Static members are removed when their session expires or by LeaveGroup v3+ naming their
instance id.

Committed offsets are durable: one metadata-store document per group holds them all
(written on each commit, read back when the group is first used after a restart). An
OffsetCommit covering many partitions is one write of that document, so a crash keeps
all of it or none; memory changes only after the write succeeded. And
each committed partition also carries a durable subscription named after the group whose
mark-delete position follows the committed offset, so the group shows in Magnetar's topic
stats as a subscription with its backlog.
"""

from __future__ import annotations

import json
import logging
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import trio

from core.storage import Position
from handlers._ticker import Ticker
from handlers.kafka._access import CONSUME, DESCRIBE, allowed, topic_error
from handlers.kafka._admin import GROUP_OPERATIONS, NOT_ASKED
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode, LocalProtocolError

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = ["GroupCoordinator", "Group", "Member", "TRANSITIONS"]

log = logging.getLogger(__name__)

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
CLASSIC_TYPE = "classic"
"""The type ListGroups v5 gives a group of the JoinGroup/SyncGroup protocol."""

TRANSITIONS: dict[str, frozenset[str]] = {
    EMPTY: frozenset({PREPARING, DEAD}),
    PREPARING: frozenset({COMPLETING, EMPTY, DEAD}),
    COMPLETING: frozenset({PREPARING, STABLE, DEAD}),
    STABLE: frozenset({PREPARING, DEAD}),
    DEAD: frozenset(),
}

DEFAULT_MIN_SESSION_TIMEOUT_MS = 6_000
"""Kafka's ``group.min.session.timeout.ms`` default."""
DEFAULT_MAX_SESSION_TIMEOUT_MS = 1_800_000
"""Kafka's ``group.max.session.timeout.ms`` default."""
DEFAULT_OFFSETS_RETENTION_MINUTES = 10_080
"""Kafka's ``offsets.retention.minutes`` default (7 days)."""
DEFAULT_OFFSETS_RETENTION_CHECK_MS = 600_000
"""Kafka's ``offsets.retention.check.interval.ms`` default."""
DEFAULT_INITIAL_REBALANCE_DELAY_MS = 3_000
"""Kafka's ``group.initial.rebalance.delay.ms`` default."""
TICK_S = 0.1
CONSUMER_PROTOCOL_UNSUPPORTED = (
    "The broker does not support the new consumer group protocol (KIP-848): set "
    "group.protocol=classic on the consumer.")
GROUPS_PATH = "/kafka/groups"


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    deadline: float = 0.0
    assignment: bytes = b""
    joining: bool = False
    join_done: trio.Event = field(default_factory=trio.Event)
    join_response: Data | None = None
    sync_done: trio.Event | None = None
    sync_error: int = 0
    # while it waits in SyncGroup for the leader's assignment: until when it may wait
    sync_deadline: float = 0.0

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


@dataclass(eq=False)
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    rebalance_deadline: float = 0.0
    # group.initial.rebalance.delay.ms: a rebalance out of Empty waits until then for more
    # members, each new one putting it off again (never past rebalance_deadline).
    initial_until: float = 0.0
    # The partition counts of the subscribed topics when the leader last assigned (None:
    # not known, as for a protocol other than Kafka's consumer protocol).
    assigned_counts: dict[str, int] | None = None
    offsets: dict[tuple[str, int], tuple[int, str | None]] = field(default_factory=dict)
    # When each offset was last committed (wall clock, seconds), and since when the group
    # is empty (None: not seen becoming so since it was loaded), for offset expiry.
    committed_at: dict[tuple[str, int], float] = field(default_factory=dict)
    empty_since: float | None = None
    # Read back from the store: the subscriptions may lag the offsets (a crash after the
    # document was written), so they are moved up when the group is next used.
    cursors_pending: bool = False

    def static_member(self, instance_id: str | None) -> Member | None:
        """The member registered under a ``group.instance.id`` (KIP-345), if any."""
        if instance_id is None:
            return None
        return next((m for m in self.members.values() if m.group_instance_id == instance_id), None)

    def fenced(self, member_id: str, instance_id: str | None) -> bool:
        """Whether ``member_id`` is a stale incarnation of a static member: the instance id
        now belongs to another member id (FENCED_INSTANCE_ID)."""
        m = self.static_member(instance_id)
        return m is not None and m.member_id != member_id

    def transition(self, to: str) -> None:
        if to != self.state and to not in TRANSITIONS[self.state]:
            raise LocalProtocolError(f"group {self.group_id}: {self.state} -> {to} is not allowed")
        if to == EMPTY and self.state != EMPTY:
            self.empty_since = time.time()
        self.state = to


class GroupCoordinator:
    def __init__(self, handler: KafkaProtocolHandler, *,
                 min_session_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS,
                 max_session_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
                 offsets_retention_ms: int = DEFAULT_OFFSETS_RETENTION_MINUTES * 60_000,
                 retention_check_ms: int = DEFAULT_OFFSETS_RETENTION_CHECK_MS,
                 initial_rebalance_delay_ms: int = DEFAULT_INITIAL_REBALANCE_DELAY_MS):
        self.h = handler
        # Kafka's group.initial.rebalance.delay.ms: how long the first rebalance of an
        # empty group waits for more members before it completes.
        self.initial_delay = initial_rebalance_delay_ms / 1000.0
        # A member's session timeout must be within these (Kafka's group.min/max.session.
        # timeout.ms), else its JoinGroup is INVALID_SESSION_TIMEOUT.
        self.min_session_ms = min_session_ms
        self.max_session_ms = max_session_ms
        # Kafka's offsets.retention.minutes and offsets.retention.check.interval.ms.
        self.offsets_retention = offsets_retention_ms / 1000.0
        self.retention_check = retention_check_ms / 1000.0
        self.groups: dict[str, Group] = {}
        self._ticker = Ticker(TICK_S)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Expire sessions and rebalance timeouts until cancelled; parked while no group
        has members."""
        while True:
            await self._ticker.next_tick(
                any(g.members or g.state == PREPARING for g in self.groups.values()))
            now = trio.current_time()
            for g in list(self.groups.values()):
                self._expire(g, now)

    def _expire(self, g: Group, now: float) -> None:
        if g.state == PREPARING:
            if now >= g.rebalance_deadline:
                self._complete_join(g)
                return
            if g.initial_until and now >= g.initial_until:
                g.initial_until = 0.0
                self._maybe_complete(g)
                if g.state != PREPARING:
                    return
        for m in list(g.members.values()):
            if m.joining:
                continue
            # A member waiting in SyncGroup is alive, as Kafka counts it: it may wait for the
            # leader's assignment up to its rebalance timeout, past its session timeout.
            deadline = m.sync_deadline if m.sync_done is not None else m.deadline
            if deadline and now >= deadline:
                log.info("kafka group %s: member %s %s", g.group_id, m.member_id,
                         "waited for its assignment past its rebalance timeout"
                         if m.sync_done is not None else "session expired")
                self._remove(g, m)

    # -- expiry of offsets ----------------------------------------------------------------------

    async def expire_offsets_forever(self) -> None:
        """Expire committed offsets every offsets.retention.check.interval.ms, until
        cancelled."""
        while True:
            await trio.sleep(self.retention_check)
            try:
                await self.expire_offsets(time.time())
            except Exception as exc:
                log.warning("kafka: offset expiry failed: %r", exc)

    async def expire_offsets(self, now: float) -> None:
        """Remove the offsets older than offsets.retention.minutes, as Kafka (KIP-211): an
        empty group's all once it has been empty that long (counted from its last commit
        of each when it has not been seen becoming empty), a group that only stores
        offsets each one that long after it was committed, and a consumer group with
        members those of topics none of them subscribes to. Offsets of a transaction still
        open stay. A group left empty with no offsets is deleted, as Kafka's goes Dead."""
        for group_id in sorted(set(self.stored_group_ids()) | set(self.groups)):
            g = self.group(group_id, create=False)
            if g is None or not g.offsets:
                continue
            expired = self._expired(g, now) - self.h.txns.pending_offsets(group_id)
            if not expired:
                continue
            log.info("kafka group %s: %d committed offsets expired", group_id, len(expired))
            if expired >= g.offsets.keys() and g.state == EMPTY:
                try:
                    self.h.broker.metadata.delete(self._path(group_id))
                except Exception:
                    pass
                self.groups.pop(group_id, None)
            else:
                self._drop_offsets(g, expired)
            for topic, partition in sorted(expired):
                await self._unsubscribe(group_id, topic, partition)

    def _expired(self, g: Group, now: float) -> set[tuple[str, int]]:
        def old(key: tuple[str, int], since: float | None = None) -> bool:
            base = since if since is not None else g.committed_at.get(key, now)
            return now - base >= self.offsets_retention

        if g.protocol_type and g.state == EMPTY:
            return {k for k in g.offsets if old(k, g.empty_since)}
        if not g.protocol_type:
            return {k for k in g.offsets if old(k)}
        if g.protocol_type == "consumer" and g.state == STABLE:
            subscribed = _subscribed_topics(g)
            if subscribed is not None:
                return {k for k in g.offsets if k[0] not in subscribed and old(k)}
        return set()

    # -- storage of offsets -------------------------------------------------------------------

    def _path(self, group_id: str) -> str:
        return f"{GROUPS_PATH}/{quote(group_id, safe='')}"

    def group(self, group_id: str, *, create: bool = True) -> Group | None:
        g = self.groups.get(group_id)
        if g is not None:
            return g
        got = self.h.broker.metadata.get(self._path(group_id))
        if got is None and not create:
            return None
        g = Group(group_id)
        if got is not None:
            doc = json.loads(got[0])
            loaded = time.time()
            for topic, partition, offset, meta in doc.get("offsets", []):
                g.offsets[(topic, int(partition))] = (int(offset), meta)
                g.committed_at[(topic, int(partition))] = loaded
            # Documents written before commit times were kept count from their loading.
            for topic, partition, ms in doc.get("committed_ms", []):
                g.committed_at[(topic, int(partition))] = ms / 1000.0
            # Documents written before the protocol type was kept were consumer groups'.
            g.protocol_type = doc.get("protocol_type", "consumer")
            g.cursors_pending = bool(g.offsets)
        self.groups[group_id] = g
        return g

    def _persist(self, g: Group, offsets: dict[tuple[str, int], tuple[int, str | None]]) -> None:
        """Write the group's document with ``offsets``: one metadata-store write, so a
        crash leaves either the old document or the new one, never a part of a commit."""
        now = time.time()
        doc = {"offsets": [[t, p, o, m] for (t, p), (o, m) in sorted(offsets.items())],
               "committed_ms": [[t, p, int(g.committed_at.get((t, p), now) * 1000)]
                                for t, p in sorted(offsets)],
               "protocol_type": g.protocol_type}
        self.h.broker.metadata.put(self._path(g.group_id), json.dumps(doc).encode())

    def _drop_offsets(self, g: Group, gone: set[tuple[str, int]]) -> None:
        """Remove the committed offsets ``gone`` from the group: its document is written
        without them first (a failure raises and leaves the group as it was), then they
        are forgotten with their commit times."""
        kept = {k: v for k, v in g.offsets.items() if k not in gone}
        self._persist(g, kept)
        g.offsets = kept
        for key in gone:
            g.committed_at.pop(key, None)

    def stored_group_ids(self) -> list[str]:
        return [unquote(n) for n in self.h.broker.metadata.children(GROUPS_PATH)]

    # -- membership -----------------------------------------------------------------------------

    def _prepare(self, g: Group) -> None:
        if g.state == PREPARING:
            return
        initial = g.state == EMPTY
        if g.state == COMPLETING:
            for m in g.members.values():
                if m.sync_done is not None:
                    m.sync_error = ErrorCode.REBALANCE_IN_PROGRESS
                    m.sync_done.set()
        g.transition(PREPARING)
        now = trio.current_time()
        timeout = max((m.rebalance_timeout for m in g.members.values()), default=0.0)
        g.rebalance_deadline = now + timeout
        g.initial_until = min(now + self.initial_delay, g.rebalance_deadline) \
            if initial and self.initial_delay > 0 else 0.0

    def _delay_initial(self, g: Group) -> None:
        """A new member joined while an empty group's first rebalance waits for members:
        it waits group.initial.rebalance.delay.ms more, up to the rebalance timeout."""
        if g.state == PREPARING and g.initial_until:
            g.initial_until = min(trio.current_time() + self.initial_delay,
                                  g.rebalance_deadline)

    def _maybe_complete(self, g: Group) -> None:
        if g.state == PREPARING and not g.initial_until \
                and all(m.joining for m in g.members.values()):
            self._complete_join(g)

    def _complete_join(self, g: Group) -> None:
        g.initial_until = 0.0
        for m in [m for m in g.members.values() if not m.joining]:
            del g.members[m.member_id]
        g.generation += 1
        if not g.members:
            g.protocol_name = None
            g.leader = None
            g.transition(EMPTY)
            return
        members = list(g.members.values())
        common = set.intersection(*[{n for n, _ in m.protocols} for m in members])
        votes: dict[str, int] = {}
        for m in members:
            for name, _ in m.protocols:
                if name in common:
                    votes[name] = votes.get(name, 0) + 1
                    break
        g.protocol_name = max(votes, key=lambda n: votes[n]) if votes else None
        g.protocol_type = members[0].protocol_type
        if g.leader not in g.members:
            g.leader = members[0].member_id
        g.transition(COMPLETING)
        now = trio.current_time()
        for m in members:
            m.joining = False
            m.deadline = now + m.session_timeout
            m.join_response = self._join_result(g, m)
            m.join_done.set()

    @staticmethod
    def _join_result(g: Group, m: Member, *, skip_assignment: bool = False) -> Data:
        """The JoinGroup response of ``m``: the leader gets every member's metadata.
        ``skip_assignment`` (v9) tells a static leader that rejoined a stable group to
        keep the current assignment rather than compute one."""
        listing = [Data(member_id=x.member_id, group_instance_id=x.group_instance_id,
                        metadata=x.metadata_for(g.protocol_name)) for x in g.members.values()
                   ] if m.member_id == g.leader else []
        return Data(throttle_time_ms=0, error_code=0, generation_id=g.generation,
                    protocol_type=g.protocol_type, protocol_name=g.protocol_name, leader=g.leader,
                    skip_assignment=skip_assignment, member_id=m.member_id, members=listing)

    def _replace_static(self, g: Group, old: Member, new: Member) -> None:
        """A static member rejoined with a new member id: the new one takes the old one's
        place (assignment, leadership); the old one's pending calls fail with
        FENCED_INSTANCE_ID, as do its later ones."""
        del g.members[old.member_id]
        new.assignment = old.assignment
        if g.leader == old.member_id:
            g.leader = new.member_id
        if old.joining:
            old.join_response = _join_error(ErrorCode.FENCED_INSTANCE_ID, old.member_id)
            old.join_done.set()
            new.joining = True
        if old.sync_done is not None:
            old.sync_error = ErrorCode.FENCED_INSTANCE_ID
            old.sync_done.set()
        if g.state == COMPLETING:
            self._prepare(g)

    def _remove(self, g: Group, m: Member) -> None:
        g.members.pop(m.member_id, None)
        if m.joining:
            m.join_response = _join_error(ErrorCode.UNKNOWN_MEMBER_ID, m.member_id)
            m.join_done.set()
        if m.sync_done is not None:
            m.sync_error = ErrorCode.UNKNOWN_MEMBER_ID
            m.sync_done.set()
        if g.state == PREPARING:
            self._maybe_complete(g)
        elif g.state in (STABLE, COMPLETING):
            if g.members:
                self._prepare(g)
            else:
                g.generation += 1
                g.leader = None
                g.protocol_name = None
                g.transition(PREPARING)
                g.transition(EMPTY)

    async def join(self, req: RequestReceived) -> Data:
        b = req.body
        if not b.group_id:
            return _join_error(ErrorCode.INVALID_GROUP_ID, b.member_id)
        g = self.group(b.group_id)
        assert g is not None
        await self._recover_cursors(g)
        if not self.min_session_ms <= b.session_timeout_ms <= self.max_session_ms:
            return _join_error(ErrorCode.INVALID_SESSION_TIMEOUT, b.member_id)
        protocols = [(p.name, p.metadata) for p in b.protocols]
        if not protocols or (g.members and (
                b.protocol_type != g.protocol_type
                or not any(n == pn for n, _ in protocols for m in g.members.values()
                           for pn, _ in m.protocols))):
            return _join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, b.member_id)
        instance = b.group_instance_id
        old: Member | None = None
        if b.member_id:
            if g.fenced(b.member_id, instance):
                return _join_error(ErrorCode.FENCED_INSTANCE_ID, b.member_id)
            m = g.members.get(b.member_id)
            if m is None:
                return _join_error(ErrorCode.UNKNOWN_MEMBER_ID, b.member_id)
            if self._rejoined_unchanged(g, m, b.protocol_type, protocols):
                # A member that joins again with the metadata it joined with gets this
                # generation's answer again and no rebalance: a client whose JoinGroup
                # or SyncGroup answer came while it was not looking, and that asks again,
                # then syncs into the generation it is already in.
                m.deadline = trio.current_time() + m.session_timeout
                return self._join_result(g, m)
        else:
            m = Member(member_id=f"{instance or req.client_id or 'member'}-{uuid.uuid4()}",
                       group_instance_id=instance, client_id=req.client_id or "",
                       client_host=req.client_host, session_timeout=0, rebalance_timeout=0,
                       protocol_type=b.protocol_type, protocols=[])
            old = g.static_member(instance)
            if old is not None:
                self._replace_static(g, old, m)
            g.members[m.member_id] = m
            self._ticker.arm()
            if g.protocol_type is None or len(g.members) == 1:
                g.protocol_type = b.protocol_type
        m.session_timeout = b.session_timeout_ms / 1000.0
        rebalance = b.rebalance_timeout_ms if b.rebalance_timeout_ms > 0 else b.session_timeout_ms
        m.rebalance_timeout = rebalance / 1000.0
        m.protocols = protocols
        m.protocol_type = b.protocol_type
        if old is not None and g.state == STABLE \
                and any(n == g.protocol_name for n, _ in protocols):
            # KIP-345: a static member back within its session timeout takes its old
            # place (and assignment) without a rebalance.
            log.info("kafka group %s: static member %s rejoined as %s", g.group_id, instance,
                     m.member_id)
            m.deadline = trio.current_time() + m.session_timeout
            return self._join_result(g, m, skip_assignment=m.member_id == g.leader)
        m.joining = True
        m.join_done = trio.Event()
        m.join_response = None
        if g.state in (EMPTY, STABLE, COMPLETING):
            self._prepare(g)
        elif not b.member_id:
            self._delay_initial(g)
        self._maybe_complete(g)
        await m.join_done.wait()
        assert m.join_response is not None
        return m.join_response

    def _rejoined_unchanged(self, g: Group, m: Member, protocol_type: str,
                            protocols: list[tuple[str, bytes]]) -> bool:
        """Whether a known member's JoinGroup, with the protocols it joined with, needs no
        rebalance. As Kafka: while the group awaits the leader's assignment, or in a
        stable group from a follower. Kafka rebalances when the leader of a stable group
        rejoins, since a leader rejoins when it sees the partitions of the subscribed
        topics change; here the coordinator knows them, and rebalances only if they did
        (or if it cannot tell: a protocol other than the consumer protocol)."""
        if m.joining or protocol_type != m.protocol_type or protocols != m.protocols:
            return False
        if g.state == COMPLETING or (g.state == STABLE and m.member_id != g.leader):
            return True
        return g.state == STABLE and g.assigned_counts is not None \
            and g.assigned_counts == self._partition_counts(g)

    def _partition_counts(self, g: Group) -> dict[str, int] | None:
        """The partitions of each topic a consumer group's members subscribe to."""
        if g.protocol_type != "consumer":
            return None
        topics = _subscribed_topics(g)
        if topics is None:
            return None
        counts = {}
        for t in topics:
            try:
                counts[t] = self.h.topics.partition_count(self.h.topics.topic_name(t))
            except ValueError:
                counts[t] = 0
        return counts

    async def sync(self, req: RequestReceived) -> Data:
        b = req.body
        g = self.group(b.group_id, create=False)
        if g is not None and g.fenced(b.member_id, b.group_instance_id):
            return _sync(ErrorCode.FENCED_INSTANCE_ID)
        m = g.members.get(b.member_id) if g is not None else None
        if g is None or m is None:
            return _sync(ErrorCode.UNKNOWN_MEMBER_ID)
        if b.generation_id != g.generation:
            return _sync(ErrorCode.ILLEGAL_GENERATION)
        if g.state == PREPARING:
            return _sync(ErrorCode.REBALANCE_IN_PROGRESS)
        if g.state == STABLE and b.member_id == g.leader and b.assignments:
            # The leader of a stable group joined again unchanged (see _rejoined_unchanged)
            # and assigned anew: the same assignment is this generation's; another one
            # means the leader sees the topics otherwise, and the group rebalances to it.
            given = {a.member_id: a.assignment for a in b.assignments}
            if any(given.get(x.member_id, b"") != x.assignment for x in g.members.values()):
                self._prepare(g)
                return _sync(ErrorCode.REBALANCE_IN_PROGRESS)
        if g.state == COMPLETING:
            if b.member_id == g.leader:
                given = {a.member_id: a.assignment for a in b.assignments}
                for member in g.members.values():
                    member.assignment = given.get(member.member_id, b"")
                g.transition(STABLE)
                g.assigned_counts = self._partition_counts(g)
                for member in g.members.values():
                    if member.sync_done is not None:
                        member.sync_error = 0
                        member.sync_done.set()
            else:
                m.sync_done = trio.Event()
                m.sync_error = 0
                m.sync_deadline = trio.current_time() + max(m.rebalance_timeout, m.session_timeout)
                await m.sync_done.wait()
                m.sync_done = None
                if m.sync_error:
                    return _sync(m.sync_error)
        m.deadline = trio.current_time() + m.session_timeout
        return _sync(0, g.protocol_type, g.protocol_name, m.assignment)

    def heartbeat(self, req: RequestReceived) -> Data:
        b = req.body
        g = self.group(b.group_id, create=False)
        if g is not None and g.fenced(b.member_id, b.group_instance_id):
            return Data(throttle_time_ms=0, error_code=ErrorCode.FENCED_INSTANCE_ID)
        m = g.members.get(b.member_id) if g is not None else None
        if g is None or m is None:
            return Data(throttle_time_ms=0, error_code=ErrorCode.UNKNOWN_MEMBER_ID)
        if b.generation_id != g.generation:
            return Data(throttle_time_ms=0, error_code=ErrorCode.ILLEGAL_GENERATION)
        m.deadline = trio.current_time() + m.session_timeout
        if g.state == PREPARING:
            return Data(throttle_time_ms=0, error_code=ErrorCode.REBALANCE_IN_PROGRESS)
        return Data(throttle_time_ms=0, error_code=0)

    def leave(self, req: RequestReceived) -> Data:
        """LeaveGroup; from v3 a batch of members, each named by member id, by
        ``group.instance.id`` or both (an admin removing static members names only the
        instance id). Errors are then per member and the top-level code stays NONE."""
        b = req.body
        g = self.group(b.group_id, create=False)
        ids = [(x.member_id, x.group_instance_id) for x in b.members] if req.api_version >= 3 \
            else [(b.member_id, None)]
        results = []
        top = 0
        for member_id, instance in ids:
            code, m = self._leaving(g, member_id, instance)
            results.append(Data(member_id=member_id, group_instance_id=instance, error_code=code))
            if code or m is None or g is None:
                top = top or code
                continue
            log.info("kafka group %s: member %s left", g.group_id, m.member_id)
            self._remove(g, m)
        if req.api_version >= 3:
            top = 0
        return Data(throttle_time_ms=0, error_code=top, members=results)

    @staticmethod
    def _leaving(g: Group | None, member_id: str, instance: str | None) -> tuple[int, Member | None]:
        if g is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, None
        if instance is not None:
            m = g.static_member(instance)
            if m is None:
                return ErrorCode.UNKNOWN_MEMBER_ID, None
            if member_id and m.member_id != member_id:
                return ErrorCode.FENCED_INSTANCE_ID, None
            return 0, m
        m = g.members.get(member_id)
        return (0, m) if m is not None else (ErrorCode.UNKNOWN_MEMBER_ID, None)

    # -- offsets ---------------------------------------------------------------------------------

    async def _recover_cursors(self, g: Group) -> None:
        if g.cursors_pending:
            g.cursors_pending = False
            for (topic, partition), (offset, _) in sorted(g.offsets.items()):
                await self._move_cursor(g.group_id, topic, partition, offset)

    async def commit(self, req: RequestReceived) -> Data:
        b = req.body
        g = self.group(b.group_id, create=False) if b.group_id else None
        if g is not None:
            await self._recover_cursors(g)
        error = self._check_commit(b.group_id, b.generation_id_or_member_epoch, b.member_id,
                                   b.group_instance_id)
        denied = frozenset(t.name for t in b.topics if not allowed(self.h, req, t.name, CONSUME))
        return await self.store_offsets(b.group_id, b.topics, error, denied)

    def _check_commit(self, group_id: str, generation: int, member_id: str,
                      instance: str | None, *, transactional: bool = False) -> int:
        """OffsetCommit's checks; with ``transactional``, TxnOffsetCommit v3+'s (KIP-447:
        the consumer's group metadata fences a zombie), which check the member id only
        when given and the generation only when not negative."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        g = self.group(group_id)
        assert g is not None
        if g.fenced(member_id, instance):
            return ErrorCode.FENCED_INSTANCE_ID
        if transactional:
            if member_id and member_id not in g.members:
                return ErrorCode.UNKNOWN_MEMBER_ID
            return ErrorCode.ILLEGAL_GENERATION if 0 <= generation != g.generation else 0
        if generation < 0 and not g.members:
            return 0  # a group that only stores offsets (or an admin client's commit)
        m = g.members.get(member_id)
        if m is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != g.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if g.state == COMPLETING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        m.deadline = trio.current_time() + m.session_timeout
        return 0

    def check_txn_commit(self, group_id: str, generation: int, member_id: str,
                         instance: str | None) -> int:
        return self._check_commit(group_id, generation, member_id, instance, transactional=True)

    def partition_errors(self, topics: list[Any]) -> dict[tuple[str, int], int]:
        """The error of each partition of an offset commit's ``topics`` that cannot have an
        offset: an invalid topic name, or (as Kafka answers) UNKNOWN_TOPIC_OR_PARTITION for
        a partition that does not exist."""
        out: dict[tuple[str, int], int] = {}
        for t in topics:
            try:
                count, error = self.h.topics.partition_count(self.h.topics.topic_name(t.name)), 0
            except Exception as exc:
                count, error = 0, topic_error(exc)
            for p in t.partitions:
                if error or not 0 <= p.partition_index < count:
                    out[(t.name, p.partition_index)] = error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return out

    async def store_offsets(self, group_id: str, topics: list[Any], error: int,
                            denied: frozenset[str] = frozenset()) -> Data:
        """Record one OffsetCommit (or a committed transaction's offsets) all or nothing:
        the group's new offsets go to the store in one write of its document, and only
        once that write has succeeded do they replace the ones in memory; a failed write
        fails every partition of the request (COORDINATOR_NOT_AVAILABLE, which clients
        retry) and changes nothing. The subscriptions follow afterwards. The topics in
        ``denied`` (the role may not consume them) are TOPIC_AUTHORIZATION_FAILED."""
        g = self.group(group_id) if not error else None
        codes: dict[tuple[str, int], int] = {}
        staged: dict[tuple[str, int], tuple[int, str | None]] = {}
        unknown = self.partition_errors(topics) if not error else {}
        for t in topics:
            if t.name in denied:
                unknown.update(dict.fromkeys(((t.name, p.partition_index) for p in t.partitions),
                                             ErrorCode.TOPIC_AUTHORIZATION_FAILED))
        for t in topics:
            for p in t.partitions:
                key = (t.name, p.partition_index)
                codes[key] = error or unknown.get(key, 0)
                if not codes[key]:
                    staged[key] = (p.committed_offset, p.committed_metadata)
        if staged and g is not None:
            before = dict(g.committed_at)
            g.committed_at.update(dict.fromkeys(staged, time.time()))
            try:
                self._persist(g, {**g.offsets, **staged})
            except Exception as exc:
                log.warning("kafka group %s: offset commit not stored: %r", group_id, exc)
                codes = dict.fromkeys(codes, ErrorCode.COORDINATOR_NOT_AVAILABLE)
                staged = {}
                g.committed_at = before
            g.offsets.update(staged)
            for (topic, partition), (offset, _) in staged.items():
                await self._move_cursor(group_id, topic, partition, offset)
        return Data(throttle_time_ms=0, topics=[
            Data(name=t.name, partitions=[Data(partition_index=p.partition_index,
                                               error_code=codes[(t.name, p.partition_index)])
                                          for p in t.partitions]) for t in topics])

    async def _move_cursor(self, group_id: str, topic: str, partition: int, offset: int) -> None:
        """Mark-delete the group's subscription up to the last entry wholly below ``offset``."""
        try:
            plog = await self.h.topics.log(topic, partition, create=False)
            sub = await plog.topic.durable_subscription(group_id)
            if offset <= 0:
                return
            ml = plog.topic.ml
            pos = await ml.find_by_index(offset - 1)
            if pos is None:
                return
            entries = await ml.read_entries(pos, 1)
            if entries and entries[0].position == pos and entries[0].index == offset - 1:
                target = pos
            elif pos.entry_id > 0:
                target = Position(pos.ledger_id, pos.entry_id - 1)
            else:
                return
            if target > sub.cursor.mark_delete_position():
                sub.ack_cumulative(None, target)
        except Exception as exc:
            log.debug("kafka group %s: cursor of %s-%d not moved: %s", group_id, topic, partition, exc)

    async def follow_log_start(self, topic: str, partition: int, log_start: int) -> None:
        """DeleteRecords moved the partition's log start: the subscriptions of the groups
        reading it move past the deleted records (which no Kafka client can read any
        more), so that they do not keep those records' ledgers in storage."""
        for group_id in sorted(set(self.groups) | set(self.stored_group_ids())):
            g = self.group(group_id, create=False)
            if g is not None and (topic, partition) in g.offsets:
                await self._move_cursor(group_id, topic, partition, log_start)

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: every group's offsets for it go, as Kafka removes the
        offsets of deleted partitions, so that a topic created again under the name is
        read from where ``auto.offset.reset`` says, not from the old topic's offsets."""
        for group_id in sorted(set(self.groups) | set(self.stored_group_ids())):
            g = self.group(group_id, create=False)
            if g is None or not any(t == topic for t, _ in g.offsets):
                continue
            try:
                self._drop_offsets(g, {k for k in g.offsets if k[0] == topic})
            except Exception as exc:
                log.warning("kafka group %s: offsets of deleted topic %s not removed: %r",
                            group_id, topic, exc)

    def fetch_offsets(self, req: RequestReceived) -> Data:
        b = req.body
        g = self.group(b.group_id, create=False)
        offsets = g.offsets if g is not None else {}
        if b.topics is None:
            names: dict[str, list[int]] = {}
            for (t, p) in sorted(offsets):
                names.setdefault(t, []).append(p)
            wanted = list(names.items())
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in b.topics]
        # KIP-447: a partition whose offset an open transaction commits has no stable
        # offset yet; a consumer asking for one (read_committed) retries until it ends.
        unstable = self.h.txns.pending_offsets(b.group_id) if (
            req.api_version >= 7 and b.require_stable) else set()
        out = []
        for name, parts in wanted:
            ps = []
            permitted = allowed(self.h, req, name, DESCRIBE)
            if not permitted and b.topics is None:
                continue
            for p in parts:
                if not permitted:
                    ps.append(Data(partition_index=p, committed_offset=-1, committed_leader_epoch=-1,
                                   metadata="", error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                if (name, p) in unstable:
                    ps.append(Data(partition_index=p, committed_offset=-1, committed_leader_epoch=-1,
                                   metadata="", error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT))
                    continue
                offset, meta = offsets.get((name, p), (-1, ""))
                ps.append(Data(partition_index=p, committed_offset=offset,
                               committed_leader_epoch=-1, metadata=meta if meta is not None else "",
                               error_code=0))
            out.append(Data(name=name, partitions=ps))
        return Data(throttle_time_ms=0, topics=out, error_code=0)

    def refuse_consumer_protocol(self, req: RequestReceived) -> Data:
        """ConsumerGroupHeartbeat (KIP-848's consumer group protocol) is not served: every
        one is answered UNSUPPORTED_VERSION, as a Kafka broker whose
        group.coordinator.rebalance.protocols leaves out ``consumer`` answers it, so that a
        consumer with group.protocol=consumer fails at once rather than, with the API
        missing from ApiVersions, retrying unheard."""
        return Data(throttle_time_ms=0, error_code=ErrorCode.UNSUPPORTED_VERSION,
                    error_message=CONSUMER_PROTOCOL_UNSUPPORTED, member_id=None,
                    member_epoch=-1, heartbeat_interval_ms=0)

    # -- admin -----------------------------------------------------------------------------------

    def describe(self, req: RequestReceived) -> Data:
        # With no authorizer Kafka gives a group's every operation when asked (v3+).
        ops = GROUP_OPERATIONS if req.api_version >= 3 and req.body.include_authorized_operations \
            else NOT_ASKED
        out = []
        for group_id in req.body.groups:
            g = self.group(group_id, create=False)
            if g is None:
                out.append(Data(error_code=0, group_id=group_id, group_state=DEAD,
                                protocol_type="", protocol_data="", members=[],
                                authorized_operations=ops))
                continue
            members = [Data(member_id=m.member_id, group_instance_id=m.group_instance_id,
                            client_id=m.client_id, client_host=m.client_host,
                            member_metadata=m.metadata_for(g.protocol_name) if g.state == STABLE else b"",
                            member_assignment=m.assignment if g.state == STABLE else b"")
                       for m in g.members.values()]
            out.append(Data(error_code=0, group_id=group_id, group_state=g.state,
                            protocol_type=g.protocol_type or "",
                            protocol_data=(g.protocol_name or "") if g.state == STABLE else "",
                            members=members, authorized_operations=ops))
        return Data(throttle_time_ms=0, groups=out)

    def list_groups(self, req: RequestReceived) -> Data:
        ids = set(self.groups) | set(self.stored_group_ids())
        # Kafka compares the states filter case-insensitively, each one trimmed.
        states = {s.strip().lower() for s in req.body.states_filter or []}
        # v5 (KIP-848) types, matched case-insensitively: every group here is a classic one.
        types = {t.lower() for t in req.body.types_filter or []} if req.api_version >= 5 else set()
        if types and CLASSIC_TYPE not in types:
            return Data(throttle_time_ms=0, error_code=0, groups=[])
        out = []
        for group_id in sorted(ids):
            g = self.group(group_id, create=False)
            state = g.state if g is not None else EMPTY
            if states and state.lower() not in states:
                continue
            out.append(Data(group_id=group_id, protocol_type=(g.protocol_type if g else None) or "",
                            group_state=state, group_type=CLASSIC_TYPE))
        return Data(throttle_time_ms=0, error_code=0, groups=out)

    async def delete(self, req: RequestReceived) -> Data:
        out = []
        for group_id in req.body.groups_names:
            g = self.group(group_id, create=False)
            if g is None:
                out.append(Data(group_id=group_id, error_code=ErrorCode.GROUP_ID_NOT_FOUND))
                continue
            if g.members:
                out.append(Data(group_id=group_id, error_code=ErrorCode.NON_EMPTY_GROUP))
                continue
            for topic, partition in list(g.offsets):
                await self._unsubscribe(group_id, topic, partition)
            try:
                self.h.broker.metadata.delete(self._path(group_id))
            except Exception:
                pass
            self.groups.pop(group_id, None)
            out.append(Data(group_id=group_id, error_code=0))
        return Data(throttle_time_ms=0, results=out)

    async def _unsubscribe(self, group_id: str, topic: str, partition: int) -> None:
        """Remove the group's subscription on a partition whose offset it no longer has."""
        try:
            plog = await self.h.topics.log(topic, partition, create=False)
            await plog.topic.unsubscribe(group_id)
        except Exception as exc:
            log.debug("kafka group %s: subscription on %s-%d not removed: %s",
                      group_id, topic, partition, exc)

    async def delete_offsets(self, req: RequestReceived) -> Data:
        """OffsetDelete (KIP-496): an empty group's committed offsets may all be deleted; a
        consumer group with members only those of topics none of them subscribes to
        (GROUP_SUBSCRIBED_TO_TOPIC for the others); any other group with members is
        NON_EMPTY_GROUP. A deleted offset's subscription goes with it."""
        b = req.body

        def reply(error: int, topics: list[Data]) -> Data:
            return Data(error_code=error, throttle_time_ms=0, topics=topics)

        if not b.group_id:
            return reply(ErrorCode.INVALID_GROUP_ID, [])
        g = self.group(b.group_id, create=False)
        if g is None:
            return reply(ErrorCode.GROUP_ID_NOT_FOUND, [])
        subscribed: set[str] | None = set()
        if g.members:
            if g.protocol_type != "consumer":
                return reply(ErrorCode.NON_EMPTY_GROUP, [])
            subscribed = _subscribed_topics(g)
        codes: dict[tuple[str, int], int] = {}
        for t in b.topics:
            if not allowed(self.h, req, t.name, CONSUME):  # Kafka: READ on the topic
                codes.update(((t.name, p.partition_index), ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                             for p in t.partitions)
                continue
            try:
                _, n = await self.h.topics.ensure(t.name, create=False)
            except Exception:
                n = 0
            for p in t.partitions:
                if not 0 <= p.partition_index < n:
                    codes[(t.name, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif subscribed is None or t.name in subscribed:
                    codes[(t.name, p.partition_index)] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    codes[(t.name, p.partition_index)] = 0
        gone = [key for key, code in codes.items() if not code and key in g.offsets]
        if gone:
            try:
                self._drop_offsets(g, set(gone))
            except Exception as exc:
                log.warning("kafka group %s: offsets not deleted: %r", g.group_id, exc)
                return reply(ErrorCode.COORDINATOR_NOT_AVAILABLE, [])
            for topic, partition in gone:
                await self._unsubscribe(g.group_id, topic, partition)
        return reply(0, [Data(name=t.name, partitions=[
            Data(partition_index=p.partition_index, error_code=codes[(t.name, p.partition_index)])
            for p in t.partitions]) for t in b.topics])


def _subscribed_topics(g: Group) -> set[str] | None:
    """The topics the members of a consumer group subscribe to, read from their
    ConsumerProtocolSubscription (version, then the topic names); None when one does not
    read as one, which counts every topic as subscribed."""
    topics: set[str] = set()
    for m in g.members.values():
        meta = m.metadata_for(g.protocol_name) if g.protocol_name else (
            m.protocols[0][1] if m.protocols else b"")
        try:
            (count,) = struct.unpack_from(">i", meta, 2)
            pos = 6
            for _ in range(count):
                (size,) = struct.unpack_from(">h", meta, pos)
                if size < 0 or pos + 2 + size > len(meta):
                    return None
                topics.add(meta[pos + 2:pos + 2 + size].decode())
                pos += 2 + size
        except (struct.error, UnicodeDecodeError):
            return None
    return topics


def _join_error(code: int, member_id: str) -> Data:
    return Data(throttle_time_ms=0, error_code=code, generation_id=-1, protocol_type=None,
                protocol_name=None, leader="", skip_assignment=False, member_id=member_id,
                members=[])


def _sync(code: int, protocol_type: str | None = None, protocol_name: str | None = None,
          assignment: bytes = b"") -> Data:
    return Data(throttle_time_ms=0, error_code=code, protocol_type=protocol_type,
                protocol_name=protocol_name, assignment=assignment)
