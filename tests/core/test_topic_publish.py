"""A topic's flusher runs the publish callbacks of every protocol: one that raises is
logged, and the topic goes on storing and answering the others."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import trio

from core.naming import TopicName
from core.stats import BrokerStats
from core.storage import Position
from core.topic import PersistentTopic, PublishResult


class _Ledger:
    """Stores nothing; gives each entry the next position, or fails while ``fail`` is set."""

    def __init__(self) -> None:
        self.next = 0
        self.fail = False
        self.batches: list[int] = []

    def _store(self, entries: list[bytes]) -> list[tuple[Position, int, int]]:
        if self.fail:
            raise OSError("bookie gone")
        self.batches.append(len(entries))
        out = []
        for _ in entries:
            out.append((Position(1, self.next), self.next, 0))
            self.next += 1
        return out

    def start_add_entries(self, entries: list[bytes], num_messages: list[int],
                          done: Callable[[list[tuple[Position, int, int]] | BaseException], None]
                          ) -> None:
        # Completes later, from the run loop, as the native bridge does.
        try:
            got: list[tuple[Position, int, int]] | BaseException = self._store(entries)
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


async def test_held_publishes_are_stored_together_by_flush_alone() -> None:
    """A session publishes what one read brought with ``hold`` and then flushes: the
    entries go to the ledger as one batch, started right there (no flusher task runs
    here), and what is published while that batch is stored goes in the next one."""
    topic, ledger = _topic("held")
    got: list[PublishResult] = []
    all_in = trio.Event()

    def record(result: PublishResult) -> None:
        got.append(result)
        if len(got) == 5:
            all_in.set()

    for payload in (b"a", b"b", b"c"):
        topic.publish(payload, 1, None, 0, record, hold=True)
    assert ledger.batches == []  # held: nothing started yet
    topic.flush()
    assert ledger.batches == [3]
    topic.publish(b"d", 1, None, 0, record, hold=True)
    topic.publish(b"e", 1, None, 0, record, hold=True)
    topic.flush()  # a batch is in the ledger: these wait for its completion
    assert ledger.batches == [3]
    with trio.fail_after(5):
        await all_in.wait()
    assert ledger.batches == [3, 2]
    assert [r.position for r in got] == [Position(1, i) for i in range(5)]
