"""The Pulsar protocol plugin: listens on ``brokerServicePort`` and runs one
:class:`PulsarSession` per connection."""

from __future__ import annotations

import itertools
import logging
from functools import partial
from typing import Any

import trio

from handlers._serve import ReadLimit, open_listeners, run_session
from handlers.pulsar._session import PulsarSession

__all__ = ["PulsarProtocolHandler"]

log = logging.getLogger(__name__)


def advertised_listeners(items: Any) -> dict[str, dict[str, str]]:
    """``advertisedListeners`` (``name:scheme://host:port`` items, checked when the
    configuration was read) as ``{name: {scheme: url}}``, in the order given."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        name, _, url = str(item).partition(":")
        out.setdefault(name, {})[url.split("://", 1)[0]] = url
    return out


class PulsarProtocolHandler:
    name = "pulsar"

    def __init__(self, config: Any, broker: Any):
        self.config = config
        self.broker = broker
        self.service_url = ""
        self._producer_names = itertools.count()
        self._producer_name_prefix: str | None = None
        self.sessions: set[PulsarSession] = set()
        #: Lookups and partitioned-metadata requests being answered, over every connection
        #: (at most :attr:`max_lookups`).
        self.pending_lookups = 0
        # Bytes of publishes read from every connection and not yet answered (Pulsar's
        # maxMessagePublishBufferSizeInMB, dynamic: each session refreshes it before it
        # reads): past it, no connection is read.
        def publish_buffer_bytes() -> int:
            return int(config.get("maxMessagePublishBufferSizeInMB")) << 20

        self.publish_buffer = ReadLimit(
            publish_buffer_bytes(),
            "pulsar: reading no connection until half of maxMessagePublishBufferSizeInMB is free",
            source=publish_buffer_bytes)

    @property
    def max_lookups(self) -> int:
        """How many lookups may be answered at once (maxConcurrentLookupRequest, dynamic:
        read at each lookup)."""
        return int(self.config.get("maxConcurrentLookupRequest"))

    def new_producer_name(self) -> str:
        """A name for a producer that gave none, as Pulsar makes one: the cluster, a
        number this broker claimed from the metadata store when it first named one (so that
        no name comes back after a restart, nor from another broker), and a count."""
        if self._producer_name_prefix is None:
            number = self.broker.claim_number("producer-name")
            self._producer_name_prefix = f"{self.broker.cluster}-{number}-"
        return f"{self._producer_name_prefix}{next(self._producer_names)}"

    async def serve(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        host = str(self.config.get("bindAddress"))
        port = int(self.config.get("brokerServicePort"))
        listeners = await open_listeners(port, host, "brokerServicePort")
        bound = listeners[0].socket.getsockname()[1]
        advertised = self.config.get("advertisedAddress") or host
        named = advertised_listeners(self.config.get("advertisedListeners"))
        internal = str(self.config.get("internalListenerName")) or next(iter(named), "internal")
        if not named:
            named = {internal: {"pulsar": f"pulsar://{advertised}:{bound}"}}
        self.broker.pulsar_listeners, self.broker.internal_listener = named, internal
        self.service_url = self.broker.pulsar_service_url
        log.info("pulsar listening on %s", self.service_url)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_listeners, self._connection, listeners))
            task_status.started([self.service_url])

    async def _connection(self, stream: trio.SocketStream) -> None:
        await run_session("pulsar", self.broker, self.sessions, PulsarSession(self, stream))
