"""Starting bookies (in-process for standalone, or as `magnetar bookie`) and registering
them in the metadata store where ledger clients find them."""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from typing import Any

import trio

from core import _native
from core.autorecovery import (
    AVAILABLE_BOOKIES,
    LEDGER_ID_COUNTER,
    LEDGERS_ROOT,
    UNDER_REPLICATION,
    bookies_named,
)
from core.metadata import AlreadyExistsError, MetadataError
from gateway._config import ConfigError

__all__ = ["start_bookie", "bookie_directories", "register_bookie", "collect_garbage",
           "garbage_collector", "start_garbage_collector", "AVAILABLE_BOOKIES"]

log = logging.getLogger(__name__)


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
        max_frame_size=int(cfg.get("nettyMaxFrameSizeBytes")),
        advertised_host=str(cfg.get("advertisedAddress") or ""),
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


def collect_garbage(bookie: Any, metadata: Any, *, overreplicated: bool = False) -> list[int]:
    """Delete the ledgers ``bookie`` holds that the metadata store no longer lists: ledgers
    deleted while this bookie was down, or whose delete request failed, whose space would
    otherwise never come back. A ledger's record is written before any of its entries, so
    a held ledger without one is garbage; but only ledgers the store's id counter has
    issued are judged, so a bookie pointed at another cluster's store (whose counter is
    behind this bookie's ledgers) deletes nothing.

    With ``overreplicated``, also delete the ledgers whose record no longer names this
    bookie in any ensemble (its place was given to another bookie while it was away),
    except one being re-replicated (marked under ``/ledgers/underreplication``), whose
    record names its new bookie only once the copy is done. Returns the ledgers deleted."""
    held = bookie.ledgers()
    if not held:
        return []
    got = metadata.get(LEDGER_ID_COUNTER)
    issued = int(got[0].decode()) if got is not None else -1
    if held[-1] > issued:
        log.warning("bookie %s: garbage collection skipped: it holds ledger %d, which the "
                    "metadata store never issued (its counter is at %d); is "
                    "metadataStoreUrl this cluster's?", bookie.address, held[-1], issued)
        return []
    listed = set(metadata.children(LEDGERS_ROOT))
    gone = []
    for ledger in held:
        if str(ledger) not in listed:
            if not metadata.exists(f"{LEDGERS_ROOT}/{ledger}"):
                bookie.delete_ledger(ledger)
                gone.append(ledger)
        elif overreplicated and _delete_if_overreplicated(bookie, metadata, ledger):
            gone.append(ledger)
    if gone:
        log.info("bookie %s: garbage collected %d ledgers it no longer has a place in: %s",
                 bookie.address, len(gone),
                 ", ".join(map(str, gone[:20])) + (" ..." if len(gone) > 20 else ""))
    return gone


def _delete_if_overreplicated(bookie: Any, metadata: Any, ledger: int) -> bool:
    """Delete ``ledger`` from ``bookie`` if its record no longer names the bookie; whether
    it did. The check and the delete hold the ledger's under-replication marker, as the
    auditor does while it copies, so that a copy being made onto this bookie is never
    deleted under it."""
    path = f"{LEDGERS_ROOT}/{ledger}"
    record = metadata.get(path)
    if record is None or _names(record[0], bookie.address):
        return False
    marker = f"{UNDER_REPLICATION}/{ledger}"
    try:
        metadata.put(marker, b"garbage collection", -1, ephemeral=True)
    except AlreadyExistsError:
        return False  # being re-replicated: looked at again next time
    try:
        record = metadata.get(path)
        if record is None or _names(record[0], bookie.address):
            return False
        bookie.delete_ledger(ledger)
        return True
    finally:
        try:
            metadata.delete(marker)
        except MetadataError:
            pass


def _names(record: bytes, address: str) -> bool:
    """Whether a ledger record names ``address`` in any of its ensembles."""
    return address in bookies_named(json.loads(record))


def start_garbage_collector(nursery: trio.Nursery, cfg: Any, bookies: list[Any],
                            metadata: Any) -> None:
    """Run :func:`garbage_collector` on ``bookies`` in ``nursery`` as ``gcWaitTime`` and
    ``gcOverreplicatedLedgerWaitTime`` say (not at all when gcWaitTime is 0)."""
    period_ms = int(cfg.get("gcWaitTime"))
    if period_ms > 0:
        nursery.start_soon(garbage_collector, bookies, metadata, period_ms,
                           int(cfg.get("gcOverreplicatedLedgerWaitTime")))


async def garbage_collector(bookies: list[Any], metadata: Any, period_ms: int,
                            overreplicated_ms: int = 0) -> None:
    """Every ``period_ms`` (gcWaitTime), :func:`collect_garbage` on each of ``bookies``,
    looking for over-replicated ledgers too once ``overreplicated_ms``
    (gcOverreplicatedLedgerWaitTime, 0 never) have passed since it last did, until
    cancelled. A failed pass is logged and the next one runs on time."""
    last_overreplicated = trio.current_time()
    while True:
        await trio.sleep(period_ms / 1000)
        now = trio.current_time()
        overreplicated = overreplicated_ms > 0 and \
            now - last_overreplicated >= overreplicated_ms / 1000
        if overreplicated:
            last_overreplicated = now
        for bookie in bookies:
            try:
                await trio.to_thread.run_sync(
                    partial(collect_garbage, bookie, metadata, overreplicated=overreplicated))
            except Exception:
                log.exception("bookie %s: garbage collection failed", bookie.address)
