"""Theory of operation: restoring the copies a lost bookie held (BookKeeper's autorecovery).

A ledger written with Qw copies keeps them only while its bookies live. When a bookie
is gone for good, every ledger it was in is one copy short until something copies its
share elsewhere; without that, losing one more bookie can lose acknowledged entries.

One broker at a time is the *auditor* (``autoRecoveryDaemonEnabled``): the one whose
session holds the ephemeral entry :data:`AUDITOR_PATH`; when its process ends, another
broker takes over at its next check. The auditor lists the available bookies every
:data:`IDLE_CHECK_SECONDS` while all it knows of are there, so that an idle broker stays
asleep (a ZooKeeper session, and so a dead bookie's registration, outlives it by about as
long), and every :data:`CHECK_SECONDS` while one is missing. A bookie it knows of (it was
available, or a ledger's ensemble names it) that is not available is *missing*; one
missing for ``lostBookieRecoveryDelay`` seconds is *lost*. The auditor then reads every
ledger record and, for each closed ledger naming a lost bookie, has the storage core copy
the entries that bookie held to another one and put that bookie in its place
(:meth:`core.storage.Storage.replace_bookie`, ``rereplicationEntryBatchSize`` entries at a
time). While it copies, the ledger is marked
under :data:`UNDER_REPLICATION` so that the new bookie's garbage collection leaves the
copy alone until the ledger's record names it (the collection takes the same marker
while it decides, so the two never overlap on one ledger).

Ledgers still open are left to their writers (a writer replaces a failed bookie itself
when it next writes) and looked at again every :data:`RESCAN_SECONDS` until they are
closed. A lost bookie no ledger names any more is forgotten: if it comes back, it is a
new bookie, and its garbage collection deletes what it held.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import trio

from core import _native
from core.metadata import AlreadyExistsError, MetadataError

__all__ = ["AUDITOR_PATH", "AVAILABLE_BOOKIES", "LEDGERS_ROOT", "LEDGER_ID_COUNTER",
           "READ_ONLY_BOOKIES", "UNDER_REPLICATION", "Auditor", "bookies", "bookies_named"]

log = logging.getLogger(__name__)

# Where the ledger client keeps its records in the metadata store (BookKeeper's layout).
AUDITOR_PATH = "/ledgers/auditor"
#: Ledgers being re-replicated, one marker each.
UNDER_REPLICATION = "/ledgers/underreplication"
#: One entry per bookie serving now.
AVAILABLE_BOOKIES = "/ledgers/available"
READ_ONLY_BOOKIES = f"{AVAILABLE_BOOKIES}/readonly"
#: One record per ledger, named by its id; and the counter ledger ids come from.
LEDGERS_ROOT = "/ledgers/ledger"
LEDGER_ID_COUNTER = "/ledgers/idgen"
#: How often the auditor looks while a bookie is missing.
CHECK_SECONDS = 1.0
#: How often the auditor looks while every bookie it knows of is available, and how often
#: another broker looks whether the auditor is gone.
IDLE_CHECK_SECONDS = 30.0
RESCAN_SECONDS = 60.0


def bookies(metadata: Any) -> dict[str, list[str]]:
    """``{"readWrite": [...], "readOnly": [...]}`` ids of the bookies serving now."""
    read_only = list(metadata.children(READ_ONLY_BOOKIES))
    read_write = [b for b in metadata.children(AVAILABLE_BOOKIES)
                  if b != "readonly" and b not in read_only]
    return {"readWrite": read_write, "readOnly": read_only}


def bookies_named(record: dict[str, Any]) -> set[str]:
    """The bookies a ledger record (parsed) names in any of its ensembles."""
    return {b for _, ensemble in record.get("ensembles", []) for b in ensemble}


class Auditor:
    """Finds lost bookies and restores the copies they held (see the module docs)."""

    def __init__(self, metadata: Any, storage: Any, *, lost_delay_s: float, batch: int,
                 clock: Callable[[], float] = trio.current_time):
        self.metadata = metadata
        self.storage = storage
        self.lost_delay_s = lost_delay_s
        self.batch = batch
        self._clock = clock
        self._id = f"{os.getpid()}-{os.urandom(6).hex()}"
        #: Bookies known to exist: seen available, or named by a ledger.
        self.known: set[str] = set()
        #: When each missing bookie was first found missing.
        self.missing_since: dict[str, float] = {}
        self._next_scan = -math.inf
        #: Per lost bookie: ledgers re-replicated and entries copied, since it was lost.
        self.recovered: dict[str, tuple[int, int]] = {}

    async def run(self) -> None:
        """Check until cancelled, as often as :meth:`next_check_in` says; a failed check is
        logged and tried again soon."""
        while True:
            try:
                await self.check()
                delay = self.next_check_in()
            except (MetadataError, OSError) as exc:
                log.warning("auditor: check failed: %s", exc)
                delay = CHECK_SECONDS
            await trio.sleep(delay)

    def next_check_in(self) -> float:
        """Seconds until the next check: soon while a bookie is missing (to see it come back
        or become lost on time), rarely while all are there."""
        return CHECK_SECONDS if self.missing_since else IDLE_CHECK_SECONDS

    def is_auditor(self) -> bool:
        """Whether this broker is the auditor, becoming it when nobody is."""
        try:
            self.metadata.put(AUDITOR_PATH, self._id.encode(), -1, ephemeral=True)
            log.info("auditor: this broker audits the bookies")
            return True
        except AlreadyExistsError:
            got = self.metadata.get(AUDITOR_PATH)
            return got is not None and got[0] == self._id.encode()

    async def check(self) -> None:
        """One pass: note missing bookies; when some are lost (and a scan is due), scan the
        ledgers and re-replicate what the lost bookies held."""
        if not self.is_auditor():
            return
        now = self._clock()
        available = {b for b in self.metadata.children(AVAILABLE_BOOKIES) if ":" in b}
        self.known |= available
        for bookie in list(self.missing_since):
            if bookie in available:
                log.info("auditor: bookie %s is back", bookie)
                del self.missing_since[bookie]
        for bookie in self.known - available:
            if bookie not in self.missing_since:
                log.warning("auditor: bookie %s is missing", bookie)
                self.missing_since[bookie] = now
        lost = {b for b, since in self.missing_since.items() if now - since >= self.lost_delay_s}
        # The first pass scans in any case: it learns the bookies the ledgers name.
        if (lost or self._next_scan == -math.inf) and now >= self._next_scan:
            await self._scan(lost, available)

    async def _scan(self, lost: set[str], available: set[str]) -> None:
        still_named: set[str] = set()
        waiting = 0
        for name in self.metadata.children(LEDGERS_ROOT):
            if not name.isdigit():
                continue
            got = self.metadata.get(f"{LEDGERS_ROOT}/{name}")
            if got is None:
                continue
            record = json.loads(got[0])
            named = bookies_named(record)
            new = named - self.known
            if new:
                self.known |= new
                for bookie in new - available:
                    self.missing_since.setdefault(bookie, self._clock())
            for bookie in named & lost:
                if record.get("state") != "CLOSED":
                    still_named.add(bookie)
                    waiting += 1
                    continue
                if not await self._replace(int(name), bookie):
                    still_named.add(bookie)
        for bookie in lost - still_named:
            ledgers, entries = self.recovered.pop(bookie, (0, 0))
            log.info("auditor: bookie %s is no longer in any ledger (%d re-replicated, %d "
                     "entries copied)", bookie, ledgers, entries)
            self.known.discard(bookie)
            self.missing_since.pop(bookie, None)
        if still_named:
            log.info("auditor: %d open ledgers wait to be closed before their lost bookies "
                     "(%s) are replaced", waiting, ", ".join(sorted(still_named)))
            self._next_scan = self._clock() + RESCAN_SECONDS
        else:
            self._next_scan = self._clock()

    async def _replace(self, ledger: int, bookie: str) -> bool:
        """Re-replicate ``ledger`` off ``bookie``; whether the bookie no longer holds a
        place in it."""
        marker = f"{UNDER_REPLICATION}/{ledger}"
        try:
            self.metadata.put(marker, self._id.encode(), -1, ephemeral=True)
        except AlreadyExistsError:
            return False  # a bookie's garbage collection is looking at it: next scan
        except MetadataError as exc:
            log.warning("auditor: ledger %d: cannot mark it under replication: %s", ledger, exc)
            return False
        try:
            status, bookies, entries = await self.storage.replace_bookie(ledger, bookie, self.batch)
        except _native.NoSuchLedgerError:
            return True  # deleted meanwhile
        except _native.NativeError as exc:
            log.warning("auditor: ledger %d: re-replicating off bookie %s failed: %s",
                        ledger, bookie, exc)
            return False
        finally:
            try:
                self.metadata.delete(marker)
            except MetadataError:
                pass
        if status == "replaced":
            ledgers, copied = self.recovered.get(bookie, (0, 0))
            self.recovered[bookie] = (ledgers + 1, copied + entries)
            log.info("auditor: ledger %d: bookie %s replaced by %s (%d entries copied)",
                     ledger, bookie, ", ".join(bookies), entries)
        return status != "not-closed"
