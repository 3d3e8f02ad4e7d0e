"""The Kafka protocol plugin: listens on ``kafkaListeners`` and runs one
:class:`KafkaSession` per connection; owns what outlives a connection (partition logs,
the group and transaction coordinators)."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from handlers._serve import open_listeners, run_session
from handlers.kafka import _admin, _configs, _fetch, _produce
from handlers.kafka._codec import DEFAULT_MAX_REQUEST_SIZE, Data, RequestReceived
from handlers.kafka._fetch_session import (
    DEFAULT_CACHE_SLOTS,
    DEFAULT_EVICTION_MS,
    FetchSessionCache,
)
from handlers.kafka._group import (
    DEFAULT_INITIAL_REBALANCE_DELAY_MS,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
    DEFAULT_OFFSETS_RETENTION_CHECK_MS,
    DEFAULT_OFFSETS_RETENTION_MINUTES,
    GroupCoordinator,
)
from handlers.kafka._sasl import handle_sasl_disabled
from handlers.kafka._session import DEFAULT_CONNECTIONS_MAX_IDLE_MS, KafkaSession, Later
from handlers.kafka._settings import CONFIG_KEYS
from handlers.kafka._topics import DEFAULT_RETENTION_HOURS, KafkaTopics
from handlers.kafka._txn import TxnCoordinator

__all__ = ["KafkaProtocolHandler"]

log = logging.getLogger(__name__)

_LISTENER = re.compile(r"^(?P<scheme>[A-Za-z0-9_]+)://(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:]*)):(?P<port>\d+)$")

DEFAULT_MAX_REQUEST_PARTITIONS = 2000
"""Kafka's default ``max.request.partition.size.limit``."""

Result = Data | Later | Callable[[], Awaitable[Data | None]] | None


def _parse_listener(item: Any) -> tuple[str, str, int]:
    if hasattr(item, "scheme") and hasattr(item, "port"):
        return str(item.scheme), str(item.host), int(item.port)
    m = _LISTENER.match(str(item).strip())
    if m is None:
        raise ValueError(f"kafkaListeners: {item!r} is not scheme://host:port")
    host = m.group("v6") if m.group("v6") is not None else m.group("host")
    return m.group("scheme"), host, int(m.group("port"))


class KafkaProtocolHandler:
    name = "kafka"
    config_keys = CONFIG_KEYS

    def __init__(self, config: Any, broker: Any):
        self.config = config
        self.broker = broker
        retention_hours = int(config.get("log.retention.hours", DEFAULT_RETENTION_HOURS))
        self.topics = KafkaTopics(broker, str(config.get("kafkaTenant") or "public"),
                                  str(config.get("kafkaNamespace") or "default"),
                                  retention_ms=retention_hours * 3_600_000 if retention_hours >= 0 else None)
        self.groups = GroupCoordinator(
            self, min_session_ms=int(config.get("group.min.session.timeout.ms",
                                                DEFAULT_MIN_SESSION_TIMEOUT_MS)),
            max_session_ms=int(config.get("group.max.session.timeout.ms",
                                          DEFAULT_MAX_SESSION_TIMEOUT_MS)),
            offsets_retention_ms=60_000 * int(config.get("offsets.retention.minutes",
                                                         DEFAULT_OFFSETS_RETENTION_MINUTES)),
            retention_check_ms=int(config.get("offsets.retention.check.interval.ms",
                                              DEFAULT_OFFSETS_RETENTION_CHECK_MS)),
            initial_rebalance_delay_ms=int(config.get("group.initial.rebalance.delay.ms",
                                                      DEFAULT_INITIAL_REBALANCE_DELAY_MS)))
        self.configs = _configs.TopicConfigs(self)
        self.txns = TxnCoordinator(self)
        # Kafka's own broker keys for the fetch session cache (KIP-227).
        self.fetch_sessions = FetchSessionCache(
            int(config.get("max.incremental.fetch.session.cache.slots", DEFAULT_CACHE_SLOTS)),
            float(config.get("min.incremental.fetch.session.eviction.ms", DEFAULT_EVICTION_MS)))
        # Kafka's broker key, in milliseconds; kept in seconds, < 0 for never.
        max_idle_ms = int(config.get("connections.max.idle.ms", DEFAULT_CONNECTIONS_MAX_IDLE_MS))
        self.connections_max_idle = max_idle_ms / 1000.0 if max_idle_ms >= 0 else -1.0
        self.node_id = 0
        self.cluster_id = str(broker.cluster)
        self.advertised_host = "127.0.0.1"
        self.advertised_port = 9092
        self.max_message_size = int(config.get("maxMessageSize") or 5 * 1024 * 1024)
        self.max_request_size = max(DEFAULT_MAX_REQUEST_SIZE, self.max_message_size + 1024 * 1024)
        self.max_uncompressed_size = max(64 * 1024 * 1024, 4 * self.max_message_size)
        # Kafka's broker key: the most partitions one DescribeTopicPartitions answers with.
        self.max_request_partitions = int(config.get("max.request.partition.size.limit",
                                                     DEFAULT_MAX_REQUEST_PARTITIONS))
        self.auto_create_on_produce = True
        self.auto_create_on_metadata = True
        self.sessions: set[KafkaSession] = set()
        self.addresses: list[str] = []
        self._dispatch: dict[int, Callable[[KafkaProtocolHandler, RequestReceived], Any]] = {
            0: _produce.handle_produce,
            1: _fetch.handle_fetch,
            2: _fetch.handle_list_offsets,
            3: _admin.handle_metadata,
            8: lambda h, r: h.groups.commit(r),
            9: lambda h, r: h.groups.fetch_offsets(r),
            10: _admin.handle_find_coordinator,
            11: lambda h, r: partial(h.groups.join, r),
            12: lambda h, r: h.groups.heartbeat(r),
            13: lambda h, r: h.groups.leave(r),
            14: lambda h, r: partial(h.groups.sync, r),
            15: lambda h, r: h.groups.describe(r),
            16: lambda h, r: h.groups.list_groups(r),
            17: handle_sasl_disabled,
            18: _admin.handle_api_versions,
            19: _admin.handle_create_topics,
            20: _admin.handle_delete_topics,
            21: _admin.handle_delete_records,
            22: lambda h, r: h.txns.init_producer_id(r),
            24: lambda h, r: h.txns.add_partitions(r),
            25: lambda h, r: h.txns.add_offsets(r),
            26: lambda h, r: partial(h.txns.end_txn, r),
            28: lambda h, r: h.txns.txn_offset_commit(r),
            29: _admin.handle_acls,
            30: _admin.handle_acls,
            31: _admin.handle_acls,
            32: _configs.handle_describe_configs,
            33: _configs.handle_alter_configs,
            35: _admin.handle_describe_log_dirs,
            36: handle_sasl_disabled,
            37: _admin.handle_create_partitions,
            42: lambda h, r: partial(h.groups.delete, r),
            43: _admin.handle_elect_leaders,
            44: _configs.handle_incremental_alter_configs,
            46: _admin.handle_list_partition_reassignments,
            47: lambda h, r: partial(h.groups.delete_offsets, r),
            50: _admin.handle_describe_user_scram_credentials,
            60: _admin.handle_describe_cluster,
            61: _produce.handle_describe_producers,
            65: lambda h, r: h.txns.describe_transactions(r),
            66: lambda h, r: h.txns.list_transactions(r),
            68: lambda h, r: h.groups.refuse_consumer_protocol(r),
            75: _admin.handle_describe_topic_partitions,
        }

    def broker_entry(self) -> Data:
        return Data(node_id=self.node_id, host=self.advertised_host, port=self.advertised_port,
                    rack=None)

    async def dispatch(self, req: RequestReceived) -> Result:
        """Handle one request: a response body, a :class:`Later` or a deferred producing
        one, or None (no response: acks=0)."""
        result = self._dispatch[req.api_key](self, req)
        if isinstance(result, Awaitable):
            result = await result
        return result  # type: ignore[no-any-return]

    async def serve(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        raw = self.config.get("kafkaListeners") or ["PLAINTEXT://127.0.0.1:9092"]
        if isinstance(raw, str):
            raw = [x for x in raw.split(",") if x.strip()]
        listeners: list[trio.SocketListener] = []
        bound: list[tuple[str, str, int]] = []
        for item in raw:
            scheme, host, port = _parse_listener(item)
            if scheme.upper() not in ("PLAINTEXT", "SASL_PLAINTEXT"):
                raise ValueError(f"kafkaListeners: {item} uses {scheme}; only PLAINTEXT and "
                                 "SASL_PLAINTEXT are served")
            if scheme.upper() == "SASL_PLAINTEXT" and not self.broker.auth.authentication_enabled:
                raise ValueError(f"kafkaListeners: {item} needs authenticationEnabled=true (with "
                                 "it, every Kafka listener requires SASL/PLAIN)")
            opened = await open_listeners(port, host or None, "kafkaListeners")
            listeners.extend(opened)
            bound.append((scheme, host or "0.0.0.0", opened[0].socket.getsockname()[1]))
        advertised = self.config.get("kafkaAdvertisedListeners") or []
        if isinstance(advertised, str):
            advertised = [x for x in advertised.split(",") if x.strip()]
        if advertised:
            _, host, port = _parse_listener(advertised[0])
            self.advertised_host = host
            self.advertised_port = port or bound[0][2]
        else:
            host = bound[0][1]
            if host in ("0.0.0.0", "::", ""):
                host = str(self.config.get("advertisedAddress") or "127.0.0.1")
            self.advertised_host = host
            self.advertised_port = bound[0][2]
        self.addresses = [f"{s}://{h}:{p}" for s, h, p in bound]
        log.info("kafka listening on %s (advertised %s:%d)", ", ".join(self.addresses),
                 self.advertised_host, self.advertised_port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.groups.run)
            nursery.start_soon(self.groups.expire_offsets_forever)
            nursery.start_soon(self.txns.run)
            await nursery.start(partial(trio.serve_listeners, self._connection, listeners))
            task_status.started(list(self.addresses))

    async def _connection(self, stream: trio.SocketStream) -> None:
        await run_session("kafka", self.broker, self.sessions, KafkaSession(self, stream))
