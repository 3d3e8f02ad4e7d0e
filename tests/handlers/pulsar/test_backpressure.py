"""Publishes piling up unanswered stop the broker reading, as in Pulsar: one connection's
past ``maxPendingPublishRequestsPerConnection``, every connection's past
``maxMessagePublishBufferSizeInMB``; reading resumes once half are answered. A client that
sends faster than its topics store cannot grow the broker's memory without bound."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from core.auth import AuthService
from core.format import MessageMetadata, encode_entry
from core.format import pulsar_api_pb2 as pb
from core.stats import BrokerStats
from core.storage import Position
from core.topic import Producer, ProducerAccessMode, PublishResult, PublishRun
from handlers._serve import ReadLimit
from handlers.pulsar import _events as ev
from handlers.pulsar._codec import NEED_DATA, PulsarConnection, Role
from handlers.pulsar._handler import PulsarProtocolHandler
from handlers.pulsar._session import PulsarSession

LIMIT = 4


class _HeldTopic:
    """Takes publishes and answers none until the test does."""

    partition_index = -1
    encryption_required = False

    def __init__(self) -> None:
        self.callbacks: list[Callable[[PublishResult], None]] = []

    def publish(self, entry: bytes, num: int, producer: str | None, seq: int,
                callback: Callable[[PublishResult], None], *, hold: bool = False) -> None:
        self.callbacks.append(callback)

    def publish_run(self, run: PublishRun, *, hold: bool = False) -> bool:
        while run.entries:  # held one by one, as single publishes are
            self.callbacks.append(_answering(run.split(1)))
        return True

    def flush(self) -> None:
        pass

    def note_delayed(self) -> None:
        pass

    def remove_producer(self, producer: Producer) -> None:
        pass


def _answering(part: PublishRun) -> Callable[[PublishResult], None]:
    """A single publish's callback that answers ``part``, a run of one entry."""

    def answer(result: PublishResult) -> None:
        if result.position is None:
            part.done(part, None, result.error)
        else:
            pos = result.position
            part.done(part, [(pos.ledger_id, pos.entry_id, result.index, result.publish_time)], None)

    return answer


def _send(codec: PulsarConnection, seq: int, payload: bytes = b"") -> bytes:
    md = MessageMetadata(producer_name="p", sequence_id=seq, publish_time=int(time.time() * 1000))
    return codec.send(ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=1),
                                     entry=encode_entry(md, payload or b"m%d" % seq)))


async def _collect(stream: trio.abc.ReceiveStream, codec: PulsarConnection, got: list[Any]) -> None:
    while data := await stream.receive_some():
        codec.receive_data(data)
        while (event := codec.next_event()) is not NEED_DATA:
            got.append(event)


def _kinds(got: list[Any]) -> list[str]:
    return [type(e).__name__ for e in got]


class _Client:
    """A session over an in-memory stream, with producer 1 on ``topic``, and what it sent."""

    def __init__(self, topic: _HeldTopic, buffer: ReadLimit, max_pending: int = 0) -> None:
        self.stream, server = trio.testing.memory_stream_pair()
        config = {"maxMessageSize": 5 << 20, "keepAliveIntervalSeconds": 0,
                  "maxPendingPublishRequestsPerConnection": max_pending}
        broker = SimpleNamespace(stats=BrokerStats(), auth=AuthService(config, None))
        handler = SimpleNamespace(broker=broker, config=config, publish_buffer=buffer)
        self.session = PulsarSession(handler, server)
        self.session.producers[1] = Producer(topic, 1, "p", ProducerAccessMode.Shared)  # type: ignore[arg-type]
        self.codec = PulsarConnection(Role.CLIENT)
        self.got: list[Any] = []

    async def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self.session.run)
        nursery.start_soon(_collect, self.stream, self.codec, self.got)
        await self.stream.send_all(self.codec.send(
            ev.CommandConnect.build(client_version="test", protocol_version=21)))
        await trio.testing.wait_all_tasks_blocked()
        assert _kinds(self.got) == ["CommandConnected"]

    async def send(self, *frames: bytes) -> None:
        await self.stream.send_all(b"".join(frames))
        await trio.testing.wait_all_tasks_blocked()

    def ping(self) -> bytes:
        return self.codec.send(ev.CommandPing.build())


async def test_a_connection_is_read_no_further_past_its_pending_publishes() -> None:
    topic = _HeldTopic()
    c = _Client(topic, ReadLimit(0), max_pending=LIMIT)
    async with trio.open_nursery() as nursery:
        await c.start(nursery)
        await c.send(*(_send(c.codec, seq) for seq in range(LIMIT)))
        assert len(topic.callbacks) == LIMIT

        # Past the limit: what the client sends now stays unread, a PING included.
        await c.send(_send(c.codec, LIMIT), c.ping())
        assert _kinds(c.got) == ["CommandConnected"] and len(topic.callbacks) == LIMIT

        # One answer leaves it paused; the second brings the pending down to half, and the
        # connection is read again.
        topic.callbacks[0](PublishResult(Position(1, 0), 0, 0))
        await trio.testing.wait_all_tasks_blocked()
        assert len(topic.callbacks) == LIMIT
        topic.callbacks[1](PublishResult(Position(1, 1), 1, 0))
        await trio.testing.wait_all_tasks_blocked()
        assert len(topic.callbacks) == LIMIT + 1
        assert _kinds(c.got) == ["CommandConnected", "CommandSendReceipt", "CommandSendReceipt",
                                 "CommandPong"]
        assert [e.command.sequence_id for e in c.got[1:3]] == [0, 1]
        nursery.cancel_scope.cancel()


async def test_the_publish_buffer_past_its_limit_pauses_every_connection() -> None:
    topic = _HeldTopic()
    buffer = ReadLimit(1000)
    a, b = _Client(topic, buffer), _Client(topic, buffer)
    async with trio.open_nursery() as nursery:
        await a.start(nursery)
        await b.start(nursery)
        await a.send(_send(a.codec, 0, b"x" * 1500))
        assert buffer.paused and len(topic.callbacks) == 1
        # The other connection finishes the read it was waiting in, then reads no more.
        await b.send(b.ping())
        await b.send(b.ping())
        assert _kinds(b.got) == ["CommandConnected", "CommandPong"]
        topic.callbacks[0](PublishResult(Position(1, 0), 0, 0))
        await trio.testing.wait_all_tasks_blocked()
        assert not buffer.paused and buffer.used == 0
        assert _kinds(b.got) == ["CommandConnected", "CommandPong", "CommandPong"]
        assert _kinds(a.got) == ["CommandConnected", "CommandSendReceipt"]
        nursery.cancel_scope.cancel()


async def test_a_publish_buffer_limit_changed_at_runtime_applies_at_the_next_read() -> None:
    topic = _HeldTopic()
    config: dict[str, Any] = {"maxMessagePublishBufferSizeInMB": -1}
    buffer = PulsarProtocolHandler(config, SimpleNamespace()).publish_buffer
    a = _Client(topic, buffer)
    big = b"x" * (3 << 19)  # 1.5 MB
    async with trio.open_nursery() as nursery:
        await a.start(nursery)
        await a.send(_send(a.codec, 0, big))
        assert not buffer.paused and len(topic.callbacks) == 1  # no limit
        config["maxMessagePublishBufferSizeInMB"] = 1  # as a dynamic configuration update does
        await a.send(_send(a.codec, 1, big))
        assert buffer.paused and len(topic.callbacks) == 2
        await a.send(a.ping())
        assert _kinds(a.got) == ["CommandConnected"]  # read no further
        config["maxMessagePublishBufferSizeInMB"] = -1
        topic.callbacks[0](PublishResult(Position(1, 0), 0, 0))
        await trio.testing.wait_all_tasks_blocked()
        # still 1.5 MB pending, past half of the limit the pause began under; the next
        # answer ends it, and the read that follows takes the limit away again
        assert buffer.paused
        topic.callbacks[1](PublishResult(Position(1, 1), 1, 0))
        await trio.testing.wait_all_tasks_blocked()
        assert not buffer.paused and buffer.limit < 0
        assert _kinds(a.got) == ["CommandConnected", "CommandSendReceipt", "CommandSendReceipt",
                                 "CommandPong"]
        nursery.cancel_scope.cancel()
