"""A topic's flusher runs the publish callbacks of every protocol: one that raises is
logged, and the topic goes on storing and answering the others."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.lowlevel

from core.naming import TopicName
from core.stats import BrokerStats
from core.storage import Position
from core.topic import (
    MAX_PUBLISH_BATCH,
    MAX_PUBLISH_BATCHES_IN_FLIGHT,
    MessageTooLargeError,
    NotAllowedError,
    PersistentTopic,
    PublishResult,
    PublishRun,
)


class _Ledger:
    """Stores nothing; gives each entry the next position, or fails while ``fail`` is set
    (and the next batch when ``fail_once`` is). Takes entries of up to ``max_entry_size``."""

    max_entry_size = 64

    def __init__(self) -> None:
        self.next = 0
        self.fail = False
        self.fail_once = False
        self.batches: list[int] = []
        self.deleted_cursors: list[str] = []

    async def delete_cursor(self, name: str) -> None:
        self.deleted_cursors.append(name)

    def last_confirmed(self) -> Position | None:
        return Position(1, self.next - 1) if self.next else None

    def _store(self, entries: list[bytes]) -> list[tuple[int, int, int, int]]:
        assert all(len(e) <= self.max_entry_size for e in entries), "an entry too large was handed over"
        if self.fail or self.fail_once:
            self.fail_once = False
            raise OSError("bookie gone")
        self.batches.append(len(entries))
        out = []
        for _ in entries:
            out.append((1, self.next, self.next, 0))
            self.next += 1
        return out

    def start_add_entries(self, entries: list[bytes], num_messages: list[int],
                          done: Callable[[list[tuple[int, int, int, int]] | BaseException], None]
                          ) -> None:
        # Completes later, from the run loop, as the native bridge does.
        try:
            got: list[tuple[int, int, int, int]] | BaseException = self._store(entries)
        except OSError as exc:
            got = exc
        trio.lowlevel.current_trio_token().run_sync_soon(done, got)


def _topic(name: str) -> tuple[PersistentTopic, _Ledger]:
    """A topic of a broker that has only stats, storing into a :class:`_Ledger`."""
    ledger = _Ledger()
    broker = SimpleNamespace(bridge=None, stats=BrokerStats(), config={})
    topic = PersistentTopic(broker, TopicName.parse(f"persistent://public/default/{name}"),  # type: ignore[arg-type]
                            ledger, {})  # type: ignore[arg-type]
    return topic, ledger


async def test_a_raising_callback_does_not_stop_the_topic(caplog: pytest.LogCaptureFixture) -> None:
    topic, ledger = _topic("cb")
    got: list[PublishResult] = []
    both = trio.Event()

    def record(result: PublishResult) -> None:
        got.append(result)
        if len(got) in (2, 4):
            both.set()

    def explode(_result: PublishResult) -> None:
        raise RuntimeError("a broken handler")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(topic._flusher)
        with caplog.at_level(logging.ERROR, logger="core.topic"):
            topic.publish(b"a", 1, None, 0, explode)
            topic.publish(b"b", 1, None, 0, record)
            topic.publish(b"c", 1, None, 0, record)
            with trio.fail_after(5):
                await both.wait()
            assert [r.position for r in got] == [Position(1, 1), Position(1, 2)]
            # a failed store's callbacks are guarded alike
            ledger.fail = True
            both = trio.Event()
            topic.publish(b"d", 1, None, 0, explode)
            topic.publish(b"e", 1, None, 0, record)
            topic.publish(b"f", 1, None, 0, record)
            with trio.fail_after(5):
                await both.wait()
        assert [r.error is not None for r in got[2:]] == [True, True]
        assert sum("a publish callback on" in r.getMessage() for r in caplog.records) == 2
        nursery.cancel_scope.cancel()


class _Answers:
    """A publish callback that keeps the outcomes; ``all_in`` is set once ``expected``
    of them came."""

    def __init__(self, expected: int) -> None:
        self.got: list[PublishResult] = []
        self.expected = expected
        self.all_in = trio.Event()

    def __call__(self, result: PublishResult) -> None:
        self.got.append(result)
        if len(self.got) == self.expected:
            self.all_in.set()

    async def wait(self) -> list[PublishResult]:
        with trio.fail_after(5):
            await self.all_in.wait()
        return self.got


async def test_held_publishes_are_stored_together_by_flush_alone() -> None:
    """A session publishes what one read brought with ``hold`` and then flushes: the
    entries go to the ledger as one batch, started right there (no flusher task runs
    here). What the next read brings goes at once, beside the batch in flight."""
    topic, ledger = _topic("held")
    record = _Answers(5)
    for payload in (b"a", b"b", b"c"):
        topic.publish(payload, 1, None, 0, record, hold=True)
    assert ledger.batches == []  # held: nothing started yet
    topic.flush()
    assert ledger.batches == [3]
    topic.publish(b"d", 1, None, 0, record, hold=True)
    topic.publish(b"e", 1, None, 0, record, hold=True)
    topic.flush()
    assert ledger.batches == [3, 2]
    assert [r.position for r in await record.wait()] == [Position(1, i) for i in range(5)]


async def test_an_entry_too_large_for_a_bookie_frame_is_refused_alone() -> None:
    """A message larger than one entry holds (a bookie frame of nettyMaxFrameSizeBytes,
    less its headers) fails at once, in Pulsar's terms (NotAllowedError), and never reaches
    the ledger; the publishes around it are stored, in one batch, and deduplication does
    not count it as published."""
    topic, ledger = _topic("too-large")
    topic._dedup, topic._dedup_decided_for = True, topic.policies
    record = _Answers(3)
    refused: list[PublishResult] = []
    topic.publish(b"a" * 64, 1, "p", 0, record, hold=True)
    topic.publish(b"b" * 65, 1, "p", 1, refused.append, hold=True)
    assert topic.dedup_pushed == {"p": 0}
    topic.publish(b"c", 1, "p", 2, record, hold=True)
    [result] = refused
    assert topic.dedup_pushed == {"p": 2}, "the refused message was never counted"
    assert isinstance(result.error, MessageTooLargeError)
    assert isinstance(result.error, NotAllowedError)
    assert str(result.error) == ("Exceed maximum message size: 65 bytes, more than the 64 one "
                                 "entry holds in a bookie frame (nettyMaxFrameSizeBytes)")
    assert result.position is None
    topic.flush()
    topic.publish(b"d", 1, "p", 3, record)
    topic.flush()
    got = await record.wait()
    assert [r.error for r in got] == [None, None, None]
    assert [r.position for r in got] == [Position(1, 0), Position(1, 1), Position(1, 2)]
    assert ledger.batches[0] == 2


def _publish_in_reads(topic: PersistentTopic, reads: int, record: Callable[[PublishResult], None],
                      *, producer: str | None = None) -> None:
    """``reads`` reads of one publish each, every one flushed as a session does."""
    for i in range(reads):
        topic.publish(b"m%d" % i, 1, producer, i, record, hold=True)
        topic.flush()


async def test_batches_in_flight_are_bounded_and_answered_in_order() -> None:
    """Up to MAX_PUBLISH_BATCHES_IN_FLIGHT batches are in the ledger at once; what comes
    beyond that waits for the first completion and then goes as one batch."""
    topic, ledger = _topic("inflight")
    n = MAX_PUBLISH_BATCHES_IN_FLIGHT + 3
    record = _Answers(n)
    _publish_in_reads(topic, n, record)
    assert ledger.batches == [1] * MAX_PUBLISH_BATCHES_IN_FLIGHT
    got = await record.wait()
    assert ledger.batches == [1] * MAX_PUBLISH_BATCHES_IN_FLIGHT + [3]
    assert [r.position for r in got] == [Position(1, i) for i in range(n)]


async def test_a_deduplicating_topic_stores_one_batch_at_a_time() -> None:
    topic, ledger = _topic("dedup-inflight")
    topic.policies = {"deduplicationEnabled": True}
    record = _Answers(3)
    _publish_in_reads(topic, 3, record, producer="p")
    assert ledger.batches == [1]
    got = await record.wait()
    assert ledger.batches == [1, 2]
    assert [r.position for r in got] == [Position(1, i) for i in range(3)]


async def test_a_failed_write_fails_what_queued_behind_it() -> None:
    """A producer resends from its first failed message on, so what it published after
    that must not be stored ahead of the resend: the publishes queued behind a failed
    batch fail with it, and the next ones are stored again."""
    topic, ledger = _topic("fail-behind")
    topic.policies = {"deduplicationEnabled": True}  # one batch in flight: the rest queue
    ledger.fail_once = True
    failed = _Answers(3)
    _publish_in_reads(topic, 3, failed, producer="p")
    assert ledger.batches == [] and len(topic._pending) == 2
    assert all(r.error is not None for r in await failed.wait())
    assert ledger.batches == [], "nothing queued behind the failure was stored"
    # The resend is stored, not taken for a duplicate of what failed.
    resent = _Answers(3)
    _publish_in_reads(topic, 3, resent, producer="p")
    assert [r.position for r in await resent.wait()] == [Position(1, i) for i in range(3)]


class _ReaderSub:
    """A non-durable subscription as far as a topic's bookkeeping looks at it."""

    def __init__(self, name: str) -> None:
        self.name, self.durable, self.consumers, self.closed = name, False, [], False
        self.msg_out = self.bytes_out = 0

    def remove_consumer(self, consumer: object) -> None:
        self.consumers.remove(consumer)

    def close(self) -> None:
        self.closed = True


async def test_a_reader_subscription_waits_for_its_reader_after_a_seek(autojump_clock) -> None:
    from core.topic import RESET_RECONNECT_GRACE

    topic, _ = _topic("reader-reset")
    claimed, unclaimed, closed = _ReaderSub("claimed"), _ReaderSub("unclaimed"), _ReaderSub("closed")
    async with trio.open_nursery() as nursery:
        topic._nursery = nursery
        for sub in (claimed, unclaimed, closed):
            consumer = SimpleNamespace(subscription=sub)
            sub.consumers.append(consumer)
            topic.subscriptions[sub.name] = sub  # type: ignore[assignment]
            # a seek disconnected `claimed` and `unclaimed`; `closed` was closed by its client
            topic.consumer_closed(consumer, reset=sub is not closed)  # type: ignore[arg-type]
        assert closed.closed and "closed" not in topic.subscriptions
        assert not claimed.closed and not unclaimed.closed
        claimed.consumers.append(SimpleNamespace(subscription=claimed))  # the reader is back
        await trio.sleep(RESET_RECONNECT_GRACE + 1)
    assert topic.subscriptions.get("claimed") is claimed and not claimed.closed
    assert unclaimed.closed and "unclaimed" not in topic.subscriptions


async def test_a_reader_that_keeps_seeking_has_one_waiting_task(autojump_clock) -> None:
    from core.topic import RESET_RECONNECT_GRACE

    topic, _ = _topic("reader-seeks")
    sub = _ReaderSub("seeker")
    topic.subscriptions[sub.name] = sub  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        topic._nursery = nursery
        for _ in range(50):  # seek, come back, seek again...
            consumer = SimpleNamespace(subscription=sub)
            sub.consumers.append(consumer)
            topic.consumer_closed(consumer, reset=True)  # type: ignore[arg-type]
            await trio.sleep(1)
        assert len(nursery.child_tasks) == 1
        # the grace runs from the last seek
        await trio.sleep(RESET_RECONNECT_GRACE - 2)
        assert not sub.closed
        await trio.sleep(3)
        assert sub.closed and "seeker" not in topic.subscriptions


class _DurableSub:
    """A durable subscription as far as the expiration check looks at it."""

    def __init__(self, name: str, last_active: int, consumers: int = 0) -> None:
        self.name, self.durable, self.last_active = name, True, last_active
        self.replicated = False
        self.consumers = [object()] * consumers
        self.msg_out = self.bytes_out = 0
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(("broker_minutes", "policy_minutes", "expired"), [
    (10, None, ["idle"]),
    (0, None, []),           # the broker's default keeps every subscription
    (0, 10, ["idle"]),       # the namespace's (or topic's) policy applies
    (10, 0, []),             # and a policy of 0 keeps them where the broker would not
    (10, 3, ["idle", "recent"]),
])
async def test_unused_durable_subscriptions_expire(broker_minutes: int, policy_minutes: int | None,
                                                   expired: list[str]) -> None:
    topic, ledger = _topic("expiry")
    topic.broker.config["subscriptionExpirationTimeMinutes"] = broker_minutes  # type: ignore[index]
    topic.policies["subscription_expiration_time_minutes"] = policy_minutes
    now = 1_000_000_000_000
    minute = 60_000
    subs = [_DurableSub("idle", now - 11 * minute), _DurableSub("recent", now - 5 * minute),
            _DurableSub("connected", now - 60 * minute, consumers=1)]
    reader = _DurableSub("reader", now - 60 * minute)
    reader.durable = False
    for sub in subs + [reader]:
        topic.subscriptions[sub.name] = sub  # type: ignore[assignment]
    assert await topic.expire_inactive_subscriptions(now) == expired
    assert ledger.deleted_cursors == expired
    assert sorted(topic.subscriptions) == sorted({"idle", "recent", "connected", "reader"} - set(expired))


class _CheckedTopic:
    """A loaded topic as the broker's housekeeping sees it: records when each check ran."""

    def __init__(self, name: str = "persistent://public/default/checked") -> None:
        self.name = TopicName.parse(name)
        self.ran: dict[str, list[float]] = {"ttl": [], "quota": [], "retention": [], "expiry": [],
                                            "compaction": []}
        self.ml = SimpleNamespace(check_rollover=self._note("retention"), trim=self._async_none)
        self.policies: dict[str, object] = {}

    def _note(self, what: str) -> Callable[[], object]:
        async def run() -> None:
            self.ran[what].append(trio.current_time())
        return run

    async def _async_none(self) -> None:
        return None

    async def expire_messages(self) -> None:
        await self._note("ttl")()

    async def enforce_backlog_quota(self) -> None:
        await self._note("quota")()

    async def expire_inactive_subscriptions(self) -> None:
        await self._note("expiry")()

    def check_compaction(self) -> bool:
        self.ran["compaction"].append(trio.current_time())
        return False


async def _housekeeping_runs(topic: _CheckedTopic, seconds: float,
                             config: dict[str, int]) -> dict[str, list[int]]:
    """The broker's housekeeping over ``topic`` with ``config`` for ``seconds``: when each
    check ran, in seconds from the start."""
    from core.broker import BrokerService

    broker = SimpleNamespace(topics={"t": topic}, config=config)
    broker.trim_topic = functools.partial(BrokerService.trim_topic, broker)
    start = trio.current_time()
    with trio.move_on_after(seconds):
        await BrokerService._housekeeping(broker)  # type: ignore[arg-type]
    return {what: [round(t - start) for t in times] for what, times in topic.ran.items()}


async def test_housekeeping_runs_each_check_on_its_own_period(autojump_clock) -> None:
    ran = await _housekeeping_runs(_CheckedTopic(), 601, {
        "messageExpiryCheckIntervalInMinutes": 5, "backlogQuotaCheckIntervalInSeconds": 60,
        "retentionCheckIntervalInSeconds": 120, "subscriptionExpiryCheckIntervalInMinutes": 2,
        "brokerServiceCompactionMonitorIntervalInSeconds": 150})
    assert ran == {"ttl": [300, 600], "quota": list(range(60, 601, 60)),
                   "retention": [120, 240, 360, 480, 600], "expiry": [120, 240, 360, 480, 600],
                   "compaction": [150, 300, 450, 600]}


async def test_housekeeping_expires_only_unused_subscriptions_of_a_non_persistent_topic(autojump_clock) -> None:
    ran = await _housekeeping_runs(_CheckedTopic("non-persistent://public/default/checked"), 301, {
        "messageExpiryCheckIntervalInMinutes": 1, "backlogQuotaCheckIntervalInSeconds": 60,
        "retentionCheckIntervalInSeconds": 60, "subscriptionExpiryCheckIntervalInMinutes": 2,
        "brokerServiceCompactionMonitorIntervalInSeconds": 60})
    assert ran == {"ttl": [], "quota": [], "retention": [], "expiry": [120, 240], "compaction": []}


async def test_a_non_persistent_consumers_subscription_expires_once_unused() -> None:
    from core.nonpersistent import NonPersistentTopic
    from core.subscription import Consumer, SubType

    class _Sink:
        def send_messages(self, consumer: object, deliveries: object) -> None:
            return None

        def active_consumer_changed(self, consumer: object, active: bool) -> None:
            return None

        def writable(self) -> bool:
            return True

    broker = SimpleNamespace(bridge=None, stats=BrokerStats(), config={"subscriptionExpirationTimeMinutes": 1})
    topic = NonPersistentTopic(broker, TopicName.parse("non-persistent://public/default/np"), {})  # type: ignore[arg-type]
    kept = Consumer(1, "kept", _Sink())
    await topic.subscribe("busy", kept, SubType.Shared)
    left = Consumer(2, "left", _Sink())
    sub = await topic.subscribe("unused", left, SubType.Shared)
    topic.consumer_closed(left)
    assert set(topic.subscriptions) == {"busy", "unused"}
    assert await topic.expire_inactive_subscriptions(sub.last_active + 59_000) == []
    assert await topic.expire_inactive_subscriptions(sub.last_active + 61_000) == ["unused"]
    assert set(topic.subscriptions) == {"busy"}


@pytest.mark.parametrize("threads", [1, 2])
async def test_compactions_past_compaction_service_threads_wait_their_turn(autojump_clock,
                                                                           threads: int) -> None:
    running, most = [0], [0]

    async def compact() -> tuple[list[Position], dict[Position, list[int]], int, Position | None]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await trio.sleep(1)  # the clock jumps: a compaction that takes a second
        running[0] -= 1
        return [], {}, 0, None

    stored: list[str] = []
    broker = SimpleNamespace(bridge=None, stats=BrokerStats(), config={},
                             compaction_limiter=trio.CapacityLimiter(threads),
                             metadata=SimpleNamespace(put=lambda path, data: stored.append(path)))
    topics = [PersistentTopic(broker, TopicName.parse(f"persistent://public/default/c{i}"),  # type: ignore[arg-type]
                              _Ledger(), {}) for i in range(3)]  # type: ignore[arg-type]
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for topic in topics:
            topic._nursery = nursery
            topic.compact = compact  # type: ignore[method-assign]
            assert topic.start_compaction()
        assert all(t.compaction_status()["status"] == "RUNNING" for t in topics)
    assert most[0] == threads
    assert round(trio.current_time() - start) == -(-3 // threads)
    assert len(stored) == 3


def test_a_dedup_snapshot_keeps_at_most_the_configured_producers_connected_ones_first() -> None:
    """brokerDeduplicationMaxNumberOfProducers bounds what one snapshot of the
    deduplication state holds: the connected producers, then the most recent others."""
    topic, _ = _topic("dedup-cap")
    stored: dict[str, bytes] = {}
    topic.broker.config = {"brokerDeduplicationMaxNumberOfProducers": 3}  # type: ignore[misc]
    topic.broker.metadata = SimpleNamespace(put=stored.__setitem__)  # type: ignore[attr-defined]
    topic.dedup_persisted = {f"p{i}": i for i in range(6)}
    topic.producers = [SimpleNamespace(name="p1")]  # type: ignore[list-item]
    topic._snapshot_dedup()
    assert json.loads(stored[topic.dedup_path])["sequences"] == {"p1": 1, "p5": 5, "p4": 4}
    topic.broker.config = {}  # type: ignore[misc]
    topic._snapshot_dedup()
    assert len(json.loads(stored[topic.dedup_path])["sequences"]) == 6


def test_dedup_state_is_dropped_only_for_producers_disconnected_past_the_timeout() -> None:
    topic, _ = _topic("dedup-idle")
    topic.broker.config = {"brokerDeduplicationProducerInactivityTimeoutMinutes": 1}  # type: ignore[misc]
    topic.dedup_pushed = {"left-early": 3, "left-late": 4, "connected": 5}
    topic.dedup_persisted = dict(topic.dedup_pushed)
    topic._dedup_idle_since = {"left-early": 1_000, "left-late": 50_000}
    assert topic.purge_inactive_dedup_producers(now_ms=61_001) == ["left-early"]
    assert topic.dedup_pushed == topic.dedup_persisted == {"left-late": 4, "connected": 5}
    assert topic.purge_inactive_dedup_producers(now_ms=61_002) == []


async def test_a_run_is_stored_with_the_single_publishes_and_answered_part_by_part() -> None:
    """A run (a read's SENDs from one producer) queues behind the publishes before it and
    goes to the ledger with them; a run longer than one batch takes is split, and each
    part is answered once, in order, with its own entries' context and positions."""
    topic, ledger = _topic("run")
    single = _Answers(1)
    parts: list[tuple[list[Any], list[tuple[int, int, int, int]]]] = []
    answered = trio.Event()

    def done(part: PublishRun, rows: list[tuple[int, int, int, int]] | None,
             error: BaseException | None) -> None:
        assert rows is not None and error is None
        parts.append((part.context, rows))
        if sum(len(c) for c, _ in parts) == n:
            answered.set()

    n = MAX_PUBLISH_BATCH + 4
    topic.publish(b"first", 1, "p", 0, single, hold=True)
    run = PublishRun([b"m%d" % i for i in range(n)], [1] * n, "p", list(range(1, n + 1)),
                     [f"seq-{i}" for i in range(n)], done)
    assert topic.publish_run(run, hold=True)
    topic.flush()
    with trio.fail_after(5):
        while len(ledger.batches) < 2:  # the second batch starts once there is room
            topic.flush()
            await trio.lowlevel.checkpoint()
        await answered.wait()
    assert ledger.batches == [MAX_PUBLISH_BATCH, 5]
    assert [len(c) for c, _ in parts] == [MAX_PUBLISH_BATCH - 1, 5]
    assert [x for c, _ in parts for x in c] == [f"seq-{i}" for i in range(n)]
    assert [row[1] for _, rows in parts for row in rows] == list(range(1, n + 1))
    assert (await single.wait())[0].position == Position(1, 0)
    assert topic.dedup_persisted["p"] == n
    # deduplication looks at each entry: a run is refused whole, the caller goes one by one
    topic._dedup, topic._dedup_decided_for = True, topic.policies
    refused = PublishRun([b"x"], [1], "p", [n + 1], [None], done)
    assert not topic.publish_run(refused) and not topic._pending
