"""The Pulsar protocol plugin: listens on ``brokerServicePort`` and runs one
:class:`PulsarSession` per connection."""

from __future__ import annotations

import itertools
import logging
from functools import partial
from typing import Any

import trio

from handlers._serve import run_session
from handlers.pulsar._session import PulsarSession

__all__ = ["PublishBuffer", "PulsarProtocolHandler"]

log = logging.getLogger(__name__)


class PublishBuffer:
    """The bytes of publishes read from every Pulsar connection and not yet answered
    (``maxMessagePublishBufferSizeInMB``, as in Pulsar): once they reach the limit, no
    connection is read until they are down to half of it. ``limit`` <= 0 is no limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.paused = False
        self._resumed = trio.Event()

    def take(self, size: int) -> None:
        self.used += size
        if 0 < self.limit <= self.used and not self.paused:
            self.paused = True
            self._resumed = trio.Event()
            log.info("pulsar: %d bytes of publishes pending; reading no connection until half "
                     "of maxMessagePublishBufferSizeInMB is free", self.used)

    def give(self, size: int) -> None:
        self.used -= size
        if self.paused and self.used <= self.limit // 2:
            self.paused = False
            self._resumed.set()

    async def wait_resumed(self) -> None:
        await self._resumed.wait()


class PulsarProtocolHandler:
    name = "pulsar"

    def __init__(self, config: Any, broker: Any):
        self.config = config
        self.broker = broker
        self.service_url = ""
        self._producer_names = itertools.count()
        self.sessions: set[PulsarSession] = set()
        self.publish_buffer = PublishBuffer(int(config.get("maxMessagePublishBufferSizeInMB")) << 20)

    def new_producer_name(self) -> str:
        return f"{self.broker.cluster}-0-{next(self._producer_names)}"

    async def serve(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        host = str(self.config.get("bindAddress"))
        port = int(self.config.get("brokerServicePort"))
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        advertised = self.config.get("advertisedAddress") or host
        self.service_url = f"pulsar://{advertised}:{bound}"
        self.broker.pulsar_service_url = self.service_url
        log.info("pulsar listening on %s", self.service_url)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_listeners, self._connection, listeners))
            task_status.started([self.service_url])

    async def _connection(self, stream: trio.SocketStream) -> None:
        await run_session("pulsar", self.broker, self.sessions, PulsarSession(self, stream))
