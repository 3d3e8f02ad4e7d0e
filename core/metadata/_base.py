"""The metadata store interface, its errors, and the watch plumbing shared by implementations.

Theory of operation
-------------------
The store is a versioned key-value tree, the Python face of the Rust trait
``magnetar_meta::MetadataStore`` (rust/meta): paths are ``/``-separated, versions start
at 0 when an entry is created and grow by one on every successful write, and writers that
must not lose a race use compare-and-set on the version. Every method blocks briefly and
is safe to call from any thread, including threads the native core owns.

Parents need not exist before a child is written. Whether a missing parent then becomes
an entry of its own is up to the implementation: ZooKeeper creates it (empty, version 0),
memory and SQLite do not (``children`` lists it either way). Portable code creates the
parents it will read or watch.

Watches: ``watch(path, callback)`` reports, as ``callback(changed_path, event)``, the
creation, change or deletion of ``path`` itself and of its direct children. Callbacks run
on one notifier thread per store, in the order the changes were made by this store; they
never run while the store holds its own lock, so a callback may call the store.
"""

from __future__ import annotations

import abc
import enum
import logging
import queue
import threading
from collections.abc import Callable

__all__ = [
    "AlreadyExistsError",
    "BadVersionError",
    "InvalidPathError",
    "MetadataError",
    "MetadataEvent",
    "MetadataStore",
    "NotEmptyError",
    "NotFoundError",
    "StoreClosedError",
    "WatchCallback",
    "WatchHandle",
    "check_path",
    "parent_of",
]

log = logging.getLogger("magnetar.metadata")


class MetadataError(Exception):
    """Base of every metadata store failure."""


class NotFoundError(MetadataError):
    """The path does not exist (a versioned write or delete, or a delete of nothing)."""


class BadVersionError(MetadataError):
    """The entry's version is not the one the caller expected."""


class AlreadyExistsError(MetadataError):
    """A create-only write (``expected_version=-1``) found the path already present."""


class NotEmptyError(MetadataError):
    """The path has children and the store cannot delete it alone (ZooKeeper)."""


class InvalidPathError(MetadataError, ValueError):
    """The path is not absolute, has an empty segment, or ends with ``/``."""


class StoreClosedError(MetadataError):
    """The store was closed."""


class MetadataEvent(enum.StrEnum):
    """What happened to a watched path."""

    CREATED = "created"
    CHANGED = "changed"
    DELETED = "deleted"


WatchCallback = Callable[[str, MetadataEvent], object]


def check_path(path: str) -> str:
    """Return ``path`` if it is a valid store path, else raise :class:`InvalidPathError`.

    A valid path is ``/`` or ``/`` followed by non-empty segments separated by ``/``.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidPathError(f"metadata path must start with '/': {path!r}")
    if path == "/":
        return path
    if path.endswith("/") or "//" in path or "\x00" in path:
        raise InvalidPathError(f"invalid metadata path: {path!r}")
    return path


def parent_of(path: str) -> str:
    """The parent of a valid path (``/`` for top-level entries and for ``/`` itself)."""
    head = path.rsplit("/", 1)[0]
    return head or "/"


def child_prefix(path: str) -> str:
    """The prefix every descendant of ``path`` starts with."""
    return "/" if path == "/" else path + "/"


class WatchHandle:
    """A registered watch; :meth:`cancel` stops further callbacks (idempotent)."""

    __slots__ = ("path", "callback", "_cancel", "_cancelled")

    def __init__(self, path: str, callback: WatchCallback, cancel: Callable[[WatchHandle], None]):
        self.path = path
        self.callback = callback
        self._cancel = cancel
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._cancel(self)

    def __enter__(self) -> WatchHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class MetadataStore(abc.ABC):
    """A versioned, thread-safe key-value tree (see the module docs for the contract)."""

    @abc.abstractmethod
    def get(self, path: str) -> tuple[bytes, int] | None:
        """The value and version at ``path``, or ``None`` when absent."""

    @abc.abstractmethod
    def put(
        self,
        path: str,
        data: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
    ) -> int:
        """Write ``data`` at ``path`` and return the new version.

        ``expected_version``: ``None`` writes unconditionally, ``-1`` only creates
        (:class:`AlreadyExistsError` when present), ``v`` replaces only version ``v``
        (:class:`BadVersionError`, or :class:`NotFoundError` when absent).
        ``ephemeral`` applies when the write creates the entry: the entry then belongs
        to this store's session and disappears when the session ends.
        """

    @abc.abstractmethod
    def delete(self, path: str, expected_version: int | None = None) -> None:
        """Remove ``path`` (only at version ``expected_version`` when given).

        Raises :class:`NotFoundError` when absent, :class:`BadVersionError` on a version
        mismatch.
        """

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """The names (last segment) of the direct children of ``path``, sorted; ``[]`` if none."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether an entry is stored at ``path``."""

    @abc.abstractmethod
    def watch(self, path: str, callback: WatchCallback) -> WatchHandle:
        """Call ``callback(changed_path, event)`` on changes to ``path`` and its direct children."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the session: remove its ephemeral entries, stop watches, release resources.

        Closing twice is harmless; any other call after closing raises :class:`StoreClosedError`.
        """

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WatchRegistry:
    """The watches of one store and the notifier thread that delivers their events.

    ``publish`` may be called with the store's lock held: it only enqueues. Delivery
    happens on a daemon thread started with the first watch.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._by_path: dict[str, list[WatchHandle]] = {}
        self._queue: queue.SimpleQueue[
            tuple[list[WatchHandle], str, MetadataEvent] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, path: str, callback: WatchCallback) -> WatchHandle:
        handle = WatchHandle(path, callback, self._remove)
        with self._lock:
            if self._closed:
                raise StoreClosedError("metadata store is closed")
            self._by_path.setdefault(path, []).append(handle)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"{self._name}-watch", daemon=True
                )
                self._thread.start()
        return handle

    def _remove(self, handle: WatchHandle) -> None:
        with self._lock:
            handles = self._by_path.get(handle.path)
            if handles is not None and handle in handles:
                handles.remove(handle)
                if not handles:
                    del self._by_path[handle.path]

    def watched_paths(self) -> list[str]:
        with self._lock:
            return list(self._by_path)

    def is_watched(self, path: str) -> bool:
        """Whether a change at ``path`` would reach any watch."""
        with self._lock:
            return bool(self._by_path) and (
                path in self._by_path or (path != "/" and parent_of(path) in self._by_path)
            )

    def publish(self, path: str, event: MetadataEvent) -> None:
        """Queue ``event`` on ``path`` for the watches of ``path`` and of its parent."""
        with self._lock:
            if not self._by_path or self._closed:
                return
            targets = list(self._by_path.get(path, ()))
            if path != "/":
                targets.extend(self._by_path.get(parent_of(path), ()))
        if targets:
            self._queue.put((targets, path, event))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            targets, path, event = item
            for handle in targets:
                if handle.cancelled:
                    continue
                try:
                    handle.callback(path, event)
                except Exception:
                    log.exception("metadata watch callback for %s failed", handle.path)

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then stop the notifier thread (unless called from it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._by_path.clear()
        if thread is not None:
            self._queue.put(None)
            if thread is not threading.current_thread():
                thread.join(timeout)
