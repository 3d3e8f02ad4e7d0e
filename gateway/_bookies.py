"""Starting bookies (in-process for standalone, or as `magnetar bookie`) and registering
them in the metadata store where ledger clients find them."""

from __future__ import annotations

import logging
import os
from typing import Any

from core import _native
from gateway._config import ConfigError

__all__ = ["start_bookie", "bookie_directories", "register_bookie", "AVAILABLE_BOOKIES"]

log = logging.getLogger(__name__)

AVAILABLE_BOOKIES = "/ledgers/available"


PORT_FILE = "bookie.port"


def bookie_directories(cfg: Any, default: str, name: str | None = None) -> tuple[str, list[str]]:
    """A bookie's journal directory and ledger directories (an empty list: the journal's).
    ``default`` is where both go when journalDirectory and ledgerDirectories are not set;
    ``name`` is the subdirectory of each that this bookie takes (a standalone's bookie N
    takes N), None for all of it."""
    def own(path: str) -> str:
        return os.path.join(path, name) if name is not None else path

    index = list(cfg.get("indexDirectories"))
    ledgers = list(cfg.get("ledgerDirectories"))
    if index and index != ledgers:
        raise ConfigError("indexDirectories must be empty or the same as ledgerDirectories: "
                          "a ledger's index is kept beside its entry log")
    journal = str(cfg.get("journalDirectory"))
    if ledgers:
        ledger_dirs = [own(d) for d in ledgers]
    else:
        ledger_dirs = [default] if journal else []
    return (own(journal) if journal else default), ledger_dirs


def start_bookie(cfg: Any, data_dir: str, port: int, ledger_dirs: list[str] | None = None) -> Any:
    """Start a bookie on `port`, its journal in `data_dir` and its ledgers there too or in
    `ledger_dirs` (see :func:`bookie_directories`). A bookie is known to ledger metadata by
    its address, so one started on port 0 records the port it got and comes back on it
    after a restart."""
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
        ledger_dirs=list(ledger_dirs or []),
    )
    with open(port_file, "w") as f:
        f.write(bookie.address.rsplit(":", 1)[1])
    log.info("bookie %s serving from %s", bookie.address,
             data_dir + "".join(f", {d}" for d in ledger_dirs or []))
    return bookie


def register_bookie(metadata: Any, address: str) -> None:
    """Announce the bookie as available for writes (an entry of this process's session)."""
    path = f"{AVAILABLE_BOOKIES}/{address}"
    if metadata.exists(path):
        metadata.delete(path)
    metadata.put(path, b"{}", ephemeral=True)
