"""Starting bookies (in-process for standalone, or as `magnetar bookie`) and registering
them in the metadata store where ledger clients find them."""

from __future__ import annotations

import logging
import os
from typing import Any

from core import _native

__all__ = ["start_bookie", "register_bookie", "AVAILABLE_BOOKIES"]

log = logging.getLogger(__name__)

AVAILABLE_BOOKIES = "/ledgers/available"


PORT_FILE = "bookie.port"


def start_bookie(cfg: Any, data_dir: str, port: int) -> Any:
    """Start a bookie on `port`. A bookie is known to ledger metadata by its address, so one
    started on port 0 records the port it got and comes back on it after a restart."""
    os.makedirs(data_dir, exist_ok=True)
    port_file = os.path.join(data_dir, PORT_FILE)
    if port == 0 and os.path.exists(port_file):
        with open(port_file) as f:
            port = int(f.read().strip() or 0)
    bookie = _native.BookieServer(
        data_dir,
        str(cfg.get("bindAddress")),
        port,
        journal_sync_data=bool(cfg.get("journalSyncData")),
        journal_max_group_wait_ms=float(cfg.get("journalMaxGroupWaitMSec")),
        journal_buffered_writes_threshold=int(cfg.get("journalBufferedWritesThreshold")),
        journal_max_size_mb=int(cfg.get("journalMaxSizeMB")),
        journal_flush_when_queue_empty=bool(cfg.get("journalFlushWhenQueueEmpty")),
        journal_pre_alloc_size_mb=int(cfg.get("journalPreAllocSizeMB")),
        flush_entry_log_bytes=int(cfg.get("flushEntrylogBytes")),
        flush_interval_ms=int(cfg.get("flushInterval")),
        journal_max_backups=int(cfg.get("journalMaxBackups")),
    )
    with open(port_file, "w") as f:
        f.write(bookie.address.rsplit(":", 1)[1])
    log.info("bookie %s serving from %s", bookie.address, data_dir)
    return bookie


def register_bookie(metadata: Any, address: str) -> None:
    """Announce the bookie as available for writes (an entry of this process's session)."""
    path = f"{AVAILABLE_BOOKIES}/{address}"
    if metadata.exists(path):
        metadata.delete(path)
    metadata.put(path, b"{}", ephemeral=True)
