"""A produce response is built by the callback of the last of its batches to be stored:
no task waits for it, and it is answered once, with what each partition's batches got."""

from __future__ import annotations

import trio
import trio.testing

from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from handlers.kafka._produce import Pending, ProduceReply


def _partitions(body: Data) -> dict[tuple[str, int], tuple[int, int]]:
    return {(t.name, p.index): (p.error_code, p.base_offset)
            for t in body.responses for p in t.partition_responses}


def test_the_reply_comes_when_the_last_batch_is_stored() -> None:
    a1, a2, b1 = Pending(), Pending(), Pending()
    replies: list[Data] = []
    ProduceReply([("a", 0, 0, [a1, a2]), ("b", 3, 0, [b1])]).then(replies.append)
    a2.done(110)
    b1.done(7)
    assert replies == []  # a1, the first batch of partition a-0, is not stored yet
    a1.done(100)
    assert len(replies) == 1
    assert _partitions(replies[0]) == {("a", 0): (0, 100), ("b", 3): (0, 7)}
    a1.done(100)  # a batch finishes once; nothing is answered twice
    assert len(replies) == 1


def test_a_failed_batch_fails_its_partition_only() -> None:
    ok, failed = Pending(), Pending()
    replies: list[Data] = []
    ProduceReply([("t", 0, 0, [ok]), ("t", 1, 0, [failed])]).then(replies.append)
    failed.done(-1, ErrorCode.NOT_ENOUGH_REPLICAS)
    ok.done(40)
    assert _partitions(replies[0]) == {("t", 0): (0, 40),
                                       ("t", 1): (ErrorCode.NOT_ENOUGH_REPLICAS, -1)}


def test_a_reply_with_nothing_to_wait_for_is_answered_at_once() -> None:
    stored = Pending()
    stored.done(5)
    replies: list[Data] = []
    # A partition refused up front (no batches) and one whose batch is already stored.
    ProduceReply([("t", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
                  ("t", 1, 0, [stored])]).then(replies.append)
    assert _partitions(replies[0]) == {("t", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
                                       ("t", 1): (0, 5)}


def test_a_pending_can_also_be_awaited() -> None:
    async def main() -> None:
        p = Pending()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.wait)
            await trio.testing.wait_all_tasks_blocked()
            p.done(9)
        assert p.finished and p.base_offset == 9

    trio.run(main)
