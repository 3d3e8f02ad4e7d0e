"""An in-memory metadata store: for tests and tools that need no durability.

It behaves exactly like :class:`~core.metadata.SqliteMetadataStore` within one process,
including ephemeral entries (removed on :meth:`MemoryMetadataStore.close`).
"""

from __future__ import annotations

import threading

from ._base import (
    AlreadyExistsError,
    BadVersionError,
    MetadataEvent,
    MetadataStore,
    NotFoundError,
    StoreClosedError,
    WatchCallback,
    WatchHandle,
    WatchRegistry,
    check_path,
    child_prefix,
)

__all__ = ["MemoryMetadataStore"]


class MemoryMetadataStore(MetadataStore):
    """A dict of path → (data, version, ephemeral) behind one lock.

    >>> store = MemoryMetadataStore()
    >>> v0 = store.put("/a", b"one", -1)
    >>> store.put("/a", b"two", v0), store.get("/a")
    (1, (b'two', 1))
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[bytes, int, bool]] = {}
        self._watches = WatchRegistry("memory-metadata")
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("metadata store is closed")

    def get(self, path: str) -> tuple[bytes, int] | None:
        check_path(path)
        with self._lock:
            self._check_open()
            entry = self._entries.get(path)
        return None if entry is None else (entry[0], entry[1])

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
        with self._lock:
            self._check_open()
            current = self._entries.get(path)
            if current is None:
                if expected_version is not None and expected_version != -1:
                    raise NotFoundError(f"metadata path not found: {path}")
                self._entries[path] = (data, 0, ephemeral)
                self._watches.publish(path, MetadataEvent.CREATED)
                return 0
            if expected_version == -1:
                raise AlreadyExistsError(f"metadata path already exists: {path}")
            if expected_version is not None and expected_version != current[1]:
                raise BadVersionError(
                    f"metadata version mismatch on {path}: expected {expected_version}, "
                    f"found {current[1]}"
                )
            version = current[1] + 1
            self._entries[path] = (data, version, current[2])
            self._watches.publish(path, MetadataEvent.CHANGED)
            return version

    def delete(self, path: str, expected_version: int | None = None) -> None:
        check_path(path)
        with self._lock:
            self._check_open()
            current = self._entries.get(path)
            if current is None:
                raise NotFoundError(f"metadata path not found: {path}")
            if expected_version is not None and expected_version != current[1]:
                raise BadVersionError(
                    f"metadata version mismatch on {path}: expected {expected_version}, "
                    f"found {current[1]}"
                )
            del self._entries[path]
            self._watches.publish(path, MetadataEvent.DELETED)

    def children(self, path: str) -> list[str]:
        check_path(path)
        prefix = child_prefix(path)
        cut = len(prefix)
        with self._lock:
            self._check_open()
            names = {k[cut:].split("/", 1)[0] for k in self._entries if k.startswith(prefix)}
        names.discard("")
        return sorted(names)

    def exists(self, path: str) -> bool:
        check_path(path)
        with self._lock:
            self._check_open()
            return path in self._entries

    def watch(self, path: str, callback: WatchCallback) -> WatchHandle:
        check_path(path)
        self._check_open()
        return self._watches.add(path, callback)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            for path in [p for p, e in self._entries.items() if e[2]]:
                del self._entries[path]
                self._watches.publish(path, MetadataEvent.DELETED)
            self._closed = True
        self._watches.close()
