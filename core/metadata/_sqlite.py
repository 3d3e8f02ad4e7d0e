"""The SQLite metadata store: the standalone broker's durable metadata, in one file.

Theory of operation
-------------------
One connection, in WAL mode, guarded by one lock, serves every thread of the process
(``check_same_thread=False``). Every write is one ``BEGIN IMMEDIATE`` transaction: the
write lock is taken before the version is read, so a compare-and-set is atomic across
threads *and* across processes sharing the file; contention waits on SQLite's busy
timeout instead of failing.

Sessions and ephemeral entries: each open store registers a row in ``sessions`` (a
random id, the host name, the owner's pid and that process's start time, so a recycled
pid is not mistaken for the owner). Ephemeral entries carry their session id. ``close()``
deletes them; a store that opens the file later deletes the entries of any session whose
owning process on this host is gone (:meth:`SqliteMetadataStore.reap_dead_sessions`).

Watches across processes: every write also appends ``(path, event, session)`` to a
``changes`` log in the same transaction. Local changes are delivered at once; while a
watch is registered, a poller thread checks ``PRAGMA data_version`` (which moves when
another connection commits) and delivers the other sessions' changes from the log. The
log keeps :data:`CHANGE_LOG_RETENTION_S` seconds of history.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from ._base import (
    AlreadyExistsError,
    BadVersionError,
    MetadataError,
    MetadataEvent,
    MetadataStore,
    NotFoundError,
    StoreClosedError,
    WatchCallback,
    WatchHandle,
    WatchRegistry,
    check_path,
    child_prefix,
    log,
)

__all__ = ["SqliteMetadataStore", "CHANGE_LOG_RETENTION_S", "POLL_INTERVAL_S"]

#: How long entries of the cross-process change log are kept.
CHANGE_LOG_RETENTION_S = 60.0
#: How often a store with registered watches looks for other processes' changes.
POLL_INTERVAL_S = 0.05
#: How long a write waits for another process's write lock before failing.
BUSY_TIMEOUT_S = 30.0
#: Longest a listing goes on showing the ephemeral entries of a process that died.
REAP_INTERVAL_S = 1.0
#: Writes between two trims of the change log.
_PRUNE_EVERY = 512

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path    TEXT PRIMARY KEY,
    data    BLOB NOT NULL,
    version INTEGER NOT NULL,
    owner   TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nodes_by_owner ON nodes(owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions (
    id        TEXT PRIMARY KEY,
    host      TEXT NOT NULL,
    pid       INTEGER NOT NULL,
    pid_start TEXT,
    opened    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    path    TEXT NOT NULL,
    event   TEXT NOT NULL,
    session TEXT NOT NULL,
    ts      REAL NOT NULL
);
"""


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot) from /proc, or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    # Field 22 of stat(5) is starttime; fields[0] here is field 3 (state).
    return fields[19] if len(fields) > 19 else None


def _process_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None:
        current = _process_start(pid)
        if current is not None and current != start:
            return False
    return True


def _range_end(prefix: str) -> str:
    """The smallest string greater than every string that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class SqliteMetadataStore(MetadataStore):
    """A metadata store in one SQLite file (created with its directory when missing).

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with SqliteMetadataStore(os.path.join(d, "meta.db")) as store:
    ...     v0 = store.put("/ledgers/1", b"meta", -1)
    ...     store.children("/ledgers"), store.get("/ledgers/1")
    (['1'], (b'meta', 0))
    """

    def __init__(self, path: str, *, durable: bool = True) -> None:
        """Open (or create) the store at ``path``.

        ``durable`` syncs every commit to disk (``synchronous=FULL``); without it a power
        loss may lose the latest commits (a process crash still loses nothing).
        """
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
            self._conn = sqlite3.connect(
                path,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
        except (OSError, sqlite3.Error) as e:
            raise MetadataError(f"cannot open metadata store {path}: {e}") from e
        self._lock = threading.RLock()
        self._closed = False
        self._session = uuid.uuid4().hex
        self._host = socket.gethostname()
        self._writes = 0
        self._watches = WatchRegistry("sqlite-metadata")
        self._poller: threading.Thread | None = None
        self._stop_polling = threading.Event()
        self._last_seq = 0
        self._data_version = -1
        self._last_reap = time.monotonic()  # the open below reaps
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            with self._write() as (conn, _events):
                found = int(conn.execute("PRAGMA user_version").fetchone()[0])
                if found > _SCHEMA_VERSION:
                    raise MetadataError(
                        f"metadata store {path} has schema version {found}, newer than "
                        f"this Magnetar understands ({_SCHEMA_VERSION})"
                    )
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
                conn.execute(
                    "INSERT INTO sessions (id, host, pid, pid_start, opened) VALUES (?, ?, ?, ?, ?)",
                    (self._session, self._host, os.getpid(), _process_start(os.getpid()), time.time()),
                )
            self.reap_dead_sessions()
        except sqlite3.Error as e:
            self._conn.close()
            raise MetadataError(f"cannot open metadata store {path}: {e}") from e
        except BaseException:
            self._conn.close()
            raise

    # ----------------------------------------------------------------------------------
    # transactions

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("metadata store is closed")

    @contextlib.contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Connection, list[tuple[str, MetadataEvent]]]]:
        """One immediate transaction; events appended to the list are logged and published."""
        events: list[tuple[str, MetadataEvent]] = []
        with self._lock:
            self._check_open()
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise MetadataError(f"metadata store {self.path}: {e}") from e
            try:
                yield conn, events
                if events:
                    now = time.time()
                    conn.executemany(
                        "INSERT INTO changes (path, event, session, ts) VALUES (?, ?, ?, ?)",
                        [(p, ev.value, self._session, now) for p, ev in events],
                    )
                    self._writes += 1
                    if self._writes % _PRUNE_EVERY == 0:
                        conn.execute(
                            "DELETE FROM changes WHERE ts < ?", (now - CHANGE_LOG_RETENTION_S,)
                        )
                conn.execute("COMMIT")
            except BaseException as e:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise MetadataError(f"metadata store {self.path}: {e}") from e
                raise
            for path, event in events:
                self._watches.publish(path, event)

    def _read(self, sql: str, params: tuple[object, ...]) -> list[Any]:
        with self._lock:
            self._check_open()
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as e:
                raise MetadataError(f"metadata store {self.path}: {e}") from e

    # ----------------------------------------------------------------------------------
    # the interface

    def get(self, path: str) -> tuple[bytes, int] | None:
        check_path(path)
        rows = self._read("SELECT data, version FROM nodes WHERE path = ?", (path,))
        if not rows:
            return None
        data, version = rows[0]
        return bytes(data), int(version)

    def put(
        self,
        path: str,
        data: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
    ) -> int:
        check_path(path)
        data = bytes(data)
        with self._write() as (conn, events):
            row = conn.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                if expected_version is not None and expected_version != -1:
                    raise NotFoundError(f"metadata path not found: {path}")
                conn.execute(
                    "INSERT INTO nodes (path, data, version, owner) VALUES (?, ?, 0, ?)",
                    (path, data, self._session if ephemeral else None),
                )
                events.append((path, MetadataEvent.CREATED))
                return 0
            current = int(row[0])
            if expected_version == -1:
                raise AlreadyExistsError(f"metadata path already exists: {path}")
            if expected_version is not None and expected_version != current:
                raise BadVersionError(
                    f"metadata version mismatch on {path}: expected {expected_version}, "
                    f"found {current}"
                )
            conn.execute(
                "UPDATE nodes SET data = ?, version = ? WHERE path = ?", (data, current + 1, path)
            )
            events.append((path, MetadataEvent.CHANGED))
            return current + 1

    def delete(self, path: str, expected_version: int | None = None) -> None:
        check_path(path)
        with self._write() as (conn, events):
            row = conn.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                raise NotFoundError(f"metadata path not found: {path}")
            if expected_version is not None and expected_version != int(row[0]):
                raise BadVersionError(
                    f"metadata version mismatch on {path}: expected {expected_version}, "
                    f"found {row[0]}"
                )
            conn.execute("DELETE FROM nodes WHERE path = ?", (path,))
            events.append((path, MetadataEvent.DELETED))

    def children(self, path: str) -> list[str]:
        check_path(path)
        self._reap_now_and_then()
        prefix = child_prefix(path)
        rows = self._read(
            "SELECT path FROM nodes WHERE path >= ? AND path < ?", (prefix, _range_end(prefix))
        )
        cut = len(prefix)
        names = {str(r[0])[cut:].split("/", 1)[0] for r in rows}
        names.discard("")
        return sorted(names)

    def exists(self, path: str) -> bool:
        check_path(path)
        return bool(self._read("SELECT 1 FROM nodes WHERE path = ?", (path,)))

    def watch(self, path: str, callback: WatchCallback) -> WatchHandle:
        check_path(path)
        with self._lock:
            self._check_open()
            if self._poller is None:
                row = self._read("SELECT COALESCE(MAX(seq), 0) FROM changes", ())
                self._last_seq = int(row[0][0])
                self._data_version = self._current_data_version()
                self._poller = threading.Thread(
                    target=self._poll_loop, name="sqlite-metadata-poll", daemon=True
                )
                self._poller.start()
            return self._watches.add(path, callback)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                with self._write() as (conn, events):
                    owned = conn.execute(
                        "SELECT path FROM nodes WHERE owner = ?", (self._session,)
                    ).fetchall()
                    conn.execute("DELETE FROM nodes WHERE owner = ?", (self._session,))
                    conn.execute("DELETE FROM sessions WHERE id = ?", (self._session,))
                    events.extend((str(r[0]), MetadataEvent.DELETED) for r in owned)
            except MetadataError:
                log.exception("could not remove the ephemeral entries of %s", self.path)
            self._closed = True
            self._stop_polling.set()
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join(5.0)
        self._watches.close()
        with self._lock:
            self._conn.close()

    # ----------------------------------------------------------------------------------
    # sessions

    @property
    def session_id(self) -> str:
        """This store's session id (the owner recorded on its ephemeral entries)."""
        return self._session

    def _reap_now_and_then(self) -> None:
        """Before a listing, at most every :data:`REAP_INTERVAL_S`: drop the ephemeral
        entries of processes that died while this store was open. A bookie killed beside a
        running broker must not stay listed as available, or new ledgers keep going to it
        (ZooKeeper's session expiry does this for a cluster). No timer: only a listing,
        such as choosing a ledger's bookies, pays for it."""
        now = time.monotonic()
        if now - self._last_reap >= REAP_INTERVAL_S:
            self._last_reap = now
            self.reap_dead_sessions()

    def reap_dead_sessions(self) -> int:
        """Delete the ephemeral entries of sessions whose process on this host is gone.

        Returns how many entries were removed.
        """
        rows = self._read("SELECT id, pid, pid_start FROM sessions WHERE host = ? AND id != ?",
                          (self._host, self._session))
        dead = [str(r[0]) for r in rows if not _process_alive(int(r[1]), r[2])]
        removed = 0
        for session in dead:
            with self._write() as (conn, events):
                owned = conn.execute("SELECT path FROM nodes WHERE owner = ?", (session,)).fetchall()
                conn.execute("DELETE FROM nodes WHERE owner = ?", (session,))
                conn.execute("DELETE FROM sessions WHERE id = ?", (session,))
                events.extend((str(r[0]), MetadataEvent.DELETED) for r in owned)
                removed += len(owned)
            if owned:
                log.info("removed %d ephemeral entries of dead session %s", len(owned), session)
        return removed

    # ----------------------------------------------------------------------------------
    # cross-process change delivery

    def _current_data_version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def _poll_loop(self) -> None:
        while not self._stop_polling.wait(POLL_INTERVAL_S):
            try:
                self._poll_once()
            except StoreClosedError:
                return
            except MetadataError:
                log.exception("polling metadata changes of %s failed", self.path)

    def _poll_once(self) -> None:
        with self._lock:
            self._check_open()
            try:
                version = self._current_data_version()
                if version == self._data_version:
                    return
                self._data_version = version
                rows = self._conn.execute(
                    "SELECT seq, path, event, session FROM changes WHERE seq > ? ORDER BY seq",
                    (self._last_seq,),
                ).fetchall()
            except sqlite3.Error as e:
                raise MetadataError(f"metadata store {self.path}: {e}") from e
            for seq, path, event, session in rows:
                self._last_seq = max(self._last_seq, int(seq))
                if session != self._session:
                    self._watches.publish(str(path), MetadataEvent(event))
