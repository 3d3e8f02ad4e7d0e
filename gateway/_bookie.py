"""`magnetar bookie`: one bookie as its own process."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any

import trio

from core.metadata import open_metadata_store
from gateway._bookies import (
    bookie_directories,
    register_bookie,
    start_bookie,
    start_garbage_collector,
)

log = logging.getLogger(__name__)


def run(cfg: Any, args: argparse.Namespace) -> int:
    return trio.run(_main, cfg)


async def _main(cfg: Any) -> int:
    metadata = open_metadata_store(str(cfg.get("metadataStoreUrl")))
    journal_dir, ledger_dirs = bookie_directories(
        cfg, os.path.join(str(cfg.get("dataDirectory")), "bookie"))
    bookie = start_bookie(cfg, journal_dir, int(cfg.get("bookiePort")), ledger_dirs)
    try:
        register_bookie(metadata, bookie.address)
        print(f"bookie ready on {bookie.address}", flush=True)
        async with trio.open_nursery() as nursery:
            start_garbage_collector(nursery, cfg, [bookie], metadata)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(bookie.shutdown)
        metadata.close()
    return 0
