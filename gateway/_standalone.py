"""`magnetar standalone`: metadata store, bookies and broker in one process.

Bookies are in-process (``--bookies N``, default ``standaloneBookies``); with one bookie the
ledger quorums are 1/1/1, with more the configured ``managedLedgerDefault*`` apply. SIGINT
or SIGTERM shut down cleanly: topics close (cursors and dedup state persisted), bookies
sync their journals and close their files.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import threading
import time
from typing import Any

import trio

from core.broker import BrokerService
from core.metadata import open_metadata_store
from gateway._bookies import (
    bookie_directories,
    register_bookie,
    start_bookie,
    start_garbage_collector,
)
from gateway._config import Config, ConfigError
from gateway._plugins import load_protocol
from gateway._process import settle_garbage_collector
from gateway._runtime_config import RuntimeConfig
from gateway._web import WebService

log = logging.getLogger(__name__)


def run(cfg: Config, args: argparse.Namespace) -> int:
    started = time.monotonic()
    n = int(getattr(args, "bookies", None) or cfg.get("standaloneBookies"))
    data = str(cfg.get("dataDirectory"))
    if getattr(args, "wipe_data", False) and os.path.isdir(data):
        shutil.rmtree(data)
    try:
        os.makedirs(data, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"dataDirectory {data!r}: {exc.strerror or exc}") from None
    return trio.run(_main, cfg, n, started)


def _standalone_config(cfg: Config, bookies: int) -> RuntimeConfig:
    """What the broker reads: ``cfg``, with a one-bookie standalone's quorums at 1/1/1,
    and the dynamic keys' runtime values once attached to the metadata store."""
    if bookies == 1:
        quorums = ("managedLedgerDefaultEnsembleSize", "managedLedgerDefaultWriteQuorum",
                   "managedLedgerDefaultAckQuorum")
        asked = {key: cfg.get(key) for key in quorums if int(cfg.get(key)) != 1}
        if asked:
            log.warning("one bookie: ledgers are written to it alone, not as %s say; run more "
                        "with --bookies N", ", ".join(f"{k}={v}" for k, v in asked.items()))
        return RuntimeConfig(cfg, dict.fromkeys(quorums, 1))
    return RuntimeConfig(cfg)


async def serve(cfg: Any, bookies: int, *,
                task_status: trio.TaskStatus[dict[str, list[str]]] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a standalone broker until cancelled; reports the listening addresses."""
    cfg = _standalone_config(cfg, bookies)
    data = str(cfg.get("dataDirectory"))
    metadata = open_metadata_store(str(cfg.get("metadataStoreUrl")))
    started_bookies: list[Any] = []
    try:
        cfg.attach(metadata)
        base_port = int(cfg.get("bookiePort"))
        for i in range(bookies):
            port = 0 if base_port == 0 else base_port + i
            journal_dir, ledger_dirs = bookie_directories(
                cfg, os.path.join(data, "bookies", str(i)), str(i))
            bookie = start_bookie(cfg, journal_dir, port, ledger_dirs)
            started_bookies.append(bookie)
            register_bookie(metadata, bookie.address)
        broker = BrokerService(cfg, metadata)
        broker.bookies = started_bookies
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            start_garbage_collector(nursery, cfg, started_bookies, metadata)
            addresses: dict[str, list[str]] = {"bookies": [b.address for b in started_bookies]}
            for name in cfg.get("messagingProtocols"):
                handler = load_protocol(name)(cfg, broker)
                addresses[name] = await nursery.start(handler.serve)
            addresses["web"] = await nursery.start(WebService(cfg, broker).serve)
            task_status.started(addresses)
            # Once ready: the start time is not the time to open every topic.
            nursery.start_soon(broker.load_namespace_topics)
    finally:
        with trio.CancelScope(shield=True):
            for bookie in started_bookies:
                await trio.to_thread.run_sync(bookie.shutdown)
            metadata.close()


async def _main(cfg: Config, bookies: int, started: float) -> int:
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(serve, cfg, bookies)
        elapsed = time.monotonic() - started
        log.info("magnetar standalone ready in %.2fs", elapsed)
        # One machine-readable line: tools and tests read the bound addresses from it.
        print(f"magnetar standalone ready in {elapsed:.2f}s {json.dumps(addresses)}", flush=True)
        settle_garbage_collector()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for sig in signals:
                log.info("received %s: shutting down", signal.Signals(sig).name)
                break
        _exit_if_shutdown_takes(float(cfg.get("brokerShutdownTimeoutMs")) / 1000.0)
        nursery.cancel_scope.cancel()
    return 0


def _exit_if_shutdown_takes(seconds: float) -> None:
    """End the process once ``seconds`` pass, as Pulsar's brokerShutdownTimeoutMs does, in
    case the shutdown under way hangs (a client that does not read what is being written
    to it holds its write forever). What was acknowledged is on the journal's disk by then."""
    def give_up() -> None:
        log.error("shutdown did not finish within brokerShutdownTimeoutMs (%.0f ms): exiting",
                  seconds * 1000)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
