"""A produce response is built by the callback of the last of its batches to be stored:
no task waits for it, and it is answered once, with what each partition's batches got."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import trio
import trio.testing

from core.topic import MessageTooLargeError, PublishResult
from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from handlers.kafka._produce import (
    Pending,
    ProduceReply,
    check_sequence,
    note_sequence,
    publish_batch,
)


def _partitions(body: Data) -> dict[tuple[str, int], tuple[int, int]]:
    return {(t.name, p.index): (p.error_code, p.base_offset)
            for t in body.responses for p in t.partition_responses}


def test_the_reply_comes_when_the_last_batch_is_stored() -> None:
    a1, a2, b1 = Pending(), Pending(), Pending()
    replies: list[Data] = []
    ProduceReply([("a", 0, 0, [a1, a2], None), ("b", 3, 0, [b1], None)]).then(replies.append)
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
    ProduceReply([("t", 0, 0, [ok], None), ("t", 1, 0, [failed], None)]).then(replies.append)
    failed.done(-1, ErrorCode.NOT_ENOUGH_REPLICAS)
    ok.done(40)
    assert _partitions(replies[0]) == {("t", 0): (0, 40),
                                       ("t", 1): (ErrorCode.NOT_ENOUGH_REPLICAS, -1)}


def test_a_reply_with_nothing_to_wait_for_is_answered_at_once() -> None:
    stored = Pending()
    stored.done(5)
    replies: list[Data] = []
    # A partition refused up front (no batches) and one whose batch is already stored.
    ProduceReply([("t", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [], None),
                  ("t", 1, 0, [stored], None)]).then(replies.append)
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


def test_failed_batches_of_an_idempotent_producer_take_its_sequence_back_to_the_first() -> None:
    """Two batches of one producer in flight fail together (the second queued behind the
    first): the producer resends from the first one's sequence, which must be accepted."""
    stored: list[Callable[[PublishResult], None]] = []
    topic = SimpleNamespace(publish=lambda entry, n, name, seq, done, hold=False: stored.append(done))
    plog = SimpleNamespace(producers={}, topic=topic, key=("t", 0), owner=None,
                           log_append_time=False)

    def batch(first: int, last: int) -> SimpleNamespace:
        return SimpleNamespace(producer_id=7, producer_epoch=0, base_sequence=first,
                               last_sequence=last, max_timestamp=1000 + last, raw=b"",
                               is_transactional=False)

    first, second = batch(0, 4), batch(5, 9)
    for b in (first, second):
        assert check_sequence(plog, b) == (0, None)  # type: ignore[arg-type]
        pending = Pending()
        note_sequence(plog, b, pending)  # type: ignore[arg-type]
        publish_batch(plog, b, pending, (b"entry", 5, True))  # type: ignore[arg-type]
    for done in stored:  # failures are answered in order
        done(PublishResult(None, error=OSError("bookie gone")))
    assert check_sequence(plog, first) == (0, None)  # type: ignore[arg-type]
    assert check_sequence(plog, second)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # type: ignore[arg-type]


def test_a_batch_too_large_for_a_bookie_frame_is_message_too_large() -> None:
    """The topic refuses an entry larger than one bookie frame holds (nettyMaxFrameSizeBytes):
    Kafka's producer is told MESSAGE_TOO_LARGE (its batch is too big to store), not a
    storage failure it would retry."""
    stored: list[Callable[[PublishResult], None]] = []
    topic = SimpleNamespace(publish=lambda entry, n, name, seq, done, hold=False: stored.append(done))
    plog = SimpleNamespace(producers={}, topic=topic, key=("t", 0), owner=None)
    batch = SimpleNamespace(producer_id=-1, raw=b"", is_transactional=False)
    too_large, failed = Pending(), Pending()
    publish_batch(plog, batch, too_large, (b"entry", 5, True))  # type: ignore[arg-type]
    publish_batch(plog, batch, failed, (b"entry", 5, True))  # type: ignore[arg-type]
    stored[0](PublishResult(None, error=MessageTooLargeError("Exceed maximum message size")))
    stored[1](PublishResult(None, error=OSError("bookie gone")))
    assert (too_large.error, failed.error) == (ErrorCode.MESSAGE_TOO_LARGE,
                                               ErrorCode.NOT_ENOUGH_REPLICAS)
