"""A Pulsar connection whose publishes pile up unanswered is read no further until half of
them are answered (``maxPendingPublishRequestsPerConnection``, as in Pulsar): a client that
sends faster than the topic stores cannot grow the broker's memory without bound."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from core.format import MessageMetadata, encode_entry
from core.format import pulsar_api_pb2 as pb
from core.stats import BrokerStats
from core.storage import Position
from core.topic import Producer, ProducerAccessMode, PublishResult
from handlers.pulsar import _events as ev
from handlers.pulsar._codec import NEED_DATA, PulsarConnection, Role
from handlers.pulsar._session import PulsarSession

LIMIT = 4


class _HeldTopic:
    """Takes publishes and answers none until the test does."""

    partition_index = -1

    def __init__(self) -> None:
        self.callbacks: list[Callable[[PublishResult], None]] = []

    def publish(self, entry: bytes, num: int, producer: str | None, seq: int,
                callback: Callable[[PublishResult], None], *, hold: bool = False) -> None:
        self.callbacks.append(callback)

    def flush(self) -> None:
        pass

    def note_delayed(self) -> None:
        pass

    def remove_producer(self, producer: Producer) -> None:
        pass


def _send(codec: PulsarConnection, seq: int) -> bytes:
    md = MessageMetadata(producer_name="p", sequence_id=seq, publish_time=int(time.time() * 1000))
    return codec.send(ev.CommandSend(command=pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=1),
                                     entry=encode_entry(md, b"m%d" % seq)))


async def _collect(stream: trio.abc.ReceiveStream, codec: PulsarConnection, got: list[Any]) -> None:
    while data := await stream.receive_some():
        codec.receive_data(data)
        while (event := codec.next_event()) is not NEED_DATA:
            got.append(event)


def _kinds(got: list[Any]) -> list[str]:
    return [type(e).__name__ for e in got]


async def test_a_connection_is_read_no_further_past_its_pending_publishes() -> None:
    client, server = trio.testing.memory_stream_pair()
    config = {"maxMessageSize": 5 << 20, "keepAliveIntervalSeconds": 0,
              "maxPendingPublishRequestsPerConnection": LIMIT}
    session = PulsarSession(SimpleNamespace(broker=SimpleNamespace(stats=BrokerStats()), config=config),
                            server)
    topic = _HeldTopic()
    session.producers[1] = Producer(topic, 1, "p", ProducerAccessMode.Shared)  # type: ignore[arg-type]
    codec = PulsarConnection(Role.CLIENT)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        nursery.start_soon(_collect, client, codec, got)
        await client.send_all(codec.send(ev.CommandConnect.build(client_version="test", protocol_version=21)))
        await trio.testing.wait_all_tasks_blocked()
        for seq in range(LIMIT):
            await client.send_all(_send(codec, seq))
        await trio.testing.wait_all_tasks_blocked()
        assert _kinds(got) == ["CommandConnected"] and len(topic.callbacks) == LIMIT

        # Past the limit: what the client sends now stays unread, a PING included.
        await client.send_all(_send(codec, LIMIT) + codec.send(ev.CommandPing.build()))
        await trio.testing.wait_all_tasks_blocked()
        assert _kinds(got) == ["CommandConnected"] and len(topic.callbacks) == LIMIT

        # One answer leaves it paused; the second brings the pending down to half, and the
        # connection is read again.
        topic.callbacks[0](PublishResult(Position(1, 0), 0, 0))
        await trio.testing.wait_all_tasks_blocked()
        assert len(topic.callbacks) == LIMIT
        topic.callbacks[1](PublishResult(Position(1, 1), 1, 0))
        await trio.testing.wait_all_tasks_blocked()
        assert len(topic.callbacks) == LIMIT + 1
        assert _kinds(got) == ["CommandConnected", "CommandSendReceipt", "CommandSendReceipt",
                               "CommandPong"]
        assert [e.command.sequence_id for e in got[1:3]] == [0, 1]
        nursery.cancel_scope.cancel()
