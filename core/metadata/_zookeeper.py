"""The ZooKeeper metadata store (kazoo): the cluster's shared metadata.

Theory of operation
-------------------
Entries are znodes and versions are znode versions (0 on create, +1 per ``setData``),
so compare-and-set is ZooKeeper's own. Ephemeral entries are ZooKeeper ephemeral nodes
of this client's session. Parents are created (empty, persistent) as needed, as Pulsar
does. Two ZooKeeper rules show through: an entry with children cannot be deleted
(:class:`NotEmptyError`), and an ephemeral entry cannot have children.

Watches: ZooKeeper watches fire once. Each watched path keeps an ``exists`` watch on
itself, a ``getChildren`` watch on itself and an ``exists`` watch on each child, and
re-arms whichever fired, on a private worker thread (never on kazoo's callback thread,
which must not block). Child creation and deletion are reported by diffing the children
list; a child's data change by its own watch. Because a fired watch is re-armed only
after the fact, ZooKeeper may fold several quick changes of one path into one event:
callers read the current value on an event rather than count events. After a session
loss (or a reconnection) every watch is armed again, and what changed in between is
reported as the difference between what was known and what is found.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from ._base import (
    AlreadyExistsError,
    BadVersionError,
    MetadataError,
    MetadataEvent,
    MetadataStore,
    NotEmptyError,
    NotFoundError,
    StoreClosedError,
    WatchCallback,
    WatchHandle,
    WatchRegistry,
    check_path,
)

__all__ = ["ZooKeeperMetadataStore", "parse_zk_url"]

log = logging.getLogger("magnetar.metadata.zk")

#: Attempts of an unconditional put racing creates and deletes of the same path.
_MAX_PUT_ATTEMPTS = 100


def parse_zk_url(url: str) -> tuple[str, str]:
    """Split ``zk:host:port[,host:port]/chroot`` (the ``zk:`` optional) into hosts and chroot.

    >>> parse_zk_url("zk:127.0.0.1:2181,127.0.0.1:2182/magnetar")
    ('127.0.0.1:2181,127.0.0.1:2182', '/magnetar')
    >>> parse_zk_url("localhost:2181")
    ('localhost:2181', '')
    """
    body = url[3:] if url.startswith("zk:") else url
    hosts, slash, chroot = body.partition("/")
    if not hosts:
        raise MetadataError(f"no ZooKeeper hosts in {url!r}")
    chroot = ("/" + chroot.strip("/")) if slash and chroot.strip("/") else ""
    if chroot:
        check_path(chroot)
    return hosts, chroot


def _join(parent: str, name: str) -> str:
    return ("" if parent == "/" else parent) + "/" + name


class _PathWatcher:
    """The ZooKeeper watches behind every handle on one path (worker thread only)."""

    def __init__(self, store: ZooKeeperMetadataStore, path: str) -> None:
        self.store = store
        self.path = path
        self.children: set[str] = set()
        self.child_armed: set[str] = set()
        self.present = False
        self.version = -1
        self.active = True

    # kazoo calls these on its own thread: hand over to the worker.
    def on_self(self, event: Any) -> None:
        self.store._submit(lambda: self._self_fired(event.type))

    def on_children(self, event: Any) -> None:
        self.store._submit(lambda: self._children_fired(event.type))

    def on_child(self, event: Any) -> None:
        name = event.path.rsplit("/", 1)[-1]
        self.store._submit(lambda: self._child_fired(name, event.type))

    def arm(self, report: bool = False) -> None:
        """Arm every watch from a clean slate; with ``report`` (after a session loss),
        report what changed while no watch was set."""
        self.child_armed.clear()
        stat = self.store._client.exists(self.path, watch=self.on_self)
        present = stat is not None
        version = stat.version if stat is not None else -1
        if report and present != self.present:
            event = MetadataEvent.CREATED if present else MetadataEvent.DELETED
            self.store._watches.publish(self.path, event)
        elif report and present and version != self.version:
            self.store._watches.publish(self.path, MetadataEvent.CHANGED)
        self.present, self.version = present, version
        if present:
            self._refresh_children(report=report)
        else:
            if report:
                for name in sorted(self.children):
                    self.store._watches.publish(_join(self.path, name), MetadataEvent.DELETED)
            self.children = set()

    def _refresh_children(self, report: bool) -> None:
        from kazoo.exceptions import NoNodeError

        client = self.store._client
        try:
            now = set(client.get_children(self.path, watch=self.on_children))
        except NoNodeError:
            now = set()
        if report:
            for name in sorted(now - self.children):
                self.store._watches.publish(_join(self.path, name), MetadataEvent.CREATED)
            for name in sorted(self.children - now):
                self.store._watches.publish(_join(self.path, name), MetadataEvent.DELETED)
        self.children = now
        self.child_armed &= now
        for name in sorted(now - self.child_armed):
            self.child_armed.add(name)
            stat = client.exists(_join(self.path, name), watch=self.on_child)
            if report and stat is not None and stat.version > 0:
                # Changed between its creation and this watch being set.
                self.store._watches.publish(_join(self.path, name), MetadataEvent.CHANGED)

    def _self_fired(self, kind: str) -> None:
        if not self.active:
            return
        event = {"CREATED": MetadataEvent.CREATED, "CHANGED": MetadataEvent.CHANGED,
                 "DELETED": MetadataEvent.DELETED}.get(kind)
        if event is None:
            return
        self.store._watches.publish(self.path, event)
        believed_present = event is not MetadataEvent.DELETED
        stat = self.store._client.exists(self.path, watch=self.on_self)
        present = stat is not None
        self.present, self.version = present, (stat.version if stat is not None else -1)
        if present and not believed_present:
            self.store._watches.publish(self.path, MetadataEvent.CREATED)
        elif believed_present and not present:
            self.store._watches.publish(self.path, MetadataEvent.DELETED)
        if present and event is not MetadataEvent.CHANGED:
            self._refresh_children(report=True)

    def _children_fired(self, kind: str) -> None:
        if not self.active:
            return
        if kind == "CHILD":
            self._refresh_children(report=True)
        elif kind == "DELETED":
            for name in sorted(self.children):
                self.store._watches.publish(_join(self.path, name), MetadataEvent.DELETED)
            self.children = set()

    def _child_fired(self, name: str, kind: str) -> None:
        self.child_armed.discard(name)
        if not self.active:
            return
        if kind == "CHANGED":
            self.store._watches.publish(_join(self.path, name), MetadataEvent.CHANGED)
            if name in self.children:
                self.child_armed.add(name)
                self.store._client.exists(_join(self.path, name), watch=self.on_child)


class ZooKeeperMetadataStore(MetadataStore):
    """A metadata store on a ZooKeeper ensemble, optionally under a chroot path.

    ``hosts`` is ``host:port[,host:port...]``; ``chroot`` (e.g. ``/magnetar``) is created
    when missing. Connecting waits up to ``connect_timeout`` seconds.
    """

    def __init__(
        self,
        hosts: str,
        chroot: str = "",
        *,
        session_timeout: float = 30.0,
        connect_timeout: float = 15.0,
    ) -> None:
        from kazoo.client import KazooClient

        self.hosts = hosts
        self.chroot = chroot
        if chroot:
            check_path(chroot)
            boot = KazooClient(hosts=hosts, timeout=session_timeout)
            try:
                boot.start(timeout=connect_timeout)
                boot.ensure_path(chroot)
            except Exception as e:
                raise MetadataError(f"cannot connect to ZooKeeper at {hosts}: {e}") from e
            finally:
                boot.stop()
                boot.close()
        self._client = KazooClient(hosts=hosts + chroot, timeout=session_timeout)
        try:
            self._client.start(timeout=connect_timeout)
        except Exception as e:
            self._client.close()
            raise MetadataError(f"cannot connect to ZooKeeper at {hosts}: {e}") from e
        self._closed = False
        self._lock = threading.Lock()
        self._watches = WatchRegistry("zk-metadata")
        self._watchers: dict[str, _PathWatcher] = {}
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name="zk-metadata-watch", daemon=True)
        self._worker.start()
        self._session_lost = False
        self._disconnected = False
        self._client.add_listener(self._on_state)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> ZooKeeperMetadataStore:
        """Open ``zk:host:port[,host:port]/chroot``."""
        hosts, chroot = parse_zk_url(url)
        return cls(hosts, chroot, **kwargs)

    # ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("metadata store is closed")

    def _error(self, path: str, e: Exception) -> MetadataError:
        from kazoo import exceptions as kz

        if isinstance(e, kz.NoNodeError):
            return NotFoundError(f"metadata path not found: {path}")
        if isinstance(e, kz.NodeExistsError):
            return AlreadyExistsError(f"metadata path already exists: {path}")
        if isinstance(e, kz.BadVersionError):
            return BadVersionError(f"metadata version mismatch on {path}")
        if isinstance(e, kz.NotEmptyError):
            return NotEmptyError(f"metadata path has children: {path}")
        return MetadataError(f"ZooKeeper error on {path}: {type(e).__name__}: {e}")

    def get(self, path: str) -> tuple[bytes, int] | None:
        from kazoo.exceptions import NoNodeError

        check_path(path)
        self._check_open()
        try:
            data, stat = self._client.retry(self._client.get, path)
        except NoNodeError:
            return None
        except Exception as e:
            raise self._error(path, e) from e
        return bytes(data or b""), int(stat.version)

    def put(
        self,
        path: str,
        data: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
    ) -> int:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        check_path(path)
        self._check_open()
        data = bytes(data)
        client = self._client
        if expected_version is not None and expected_version < -1:
            if self.exists(path):
                raise BadVersionError(f"metadata version mismatch on {path}")
            raise NotFoundError(f"metadata path not found: {path}")
        try:
            if expected_version == -1:
                client.create(path, data, ephemeral=ephemeral, makepath=True)
                return 0
            if expected_version is not None:
                return int(client.set(path, data, version=expected_version).version)
            for _ in range(_MAX_PUT_ATTEMPTS):
                try:
                    return int(client.set(path, data, version=-1).version)
                except NoNodeError:
                    pass
                try:
                    client.create(path, data, ephemeral=ephemeral, makepath=True)
                    return 0
                except NodeExistsError:
                    pass
        except Exception as e:
            raise self._error(path, e) from e
        raise MetadataError(f"put of {path} kept racing concurrent creates and deletes")

    def delete(self, path: str, expected_version: int | None = None) -> None:
        check_path(path)
        self._check_open()
        if expected_version is not None and expected_version < 0:
            # No entry has a negative version; ZooKeeper would read -1 as "any version".
            if self.exists(path):
                raise BadVersionError(f"metadata version mismatch on {path}")
            raise NotFoundError(f"metadata path not found: {path}")
        try:
            self._client.delete(path, version=-1 if expected_version is None else expected_version)
        except Exception as e:
            raise self._error(path, e) from e

    def children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        check_path(path)
        self._check_open()
        try:
            names = self._client.retry(self._client.get_children, path)
        except NoNodeError:
            return []
        except Exception as e:
            raise self._error(path, e) from e
        return sorted(names)

    def exists(self, path: str) -> bool:
        check_path(path)
        self._check_open()
        try:
            return self._client.retry(self._client.exists, path) is not None
        except Exception as e:
            raise self._error(path, e) from e

    def watch(self, path: str, callback: WatchCallback) -> WatchHandle:
        check_path(path)
        armed: threading.Event | None = None
        failure: list[Exception] = []
        with self._lock:
            self._check_open()
            handle = self._watches.add(path, callback)
            if path not in self._watchers:
                watcher = _PathWatcher(self, path)
                self._watchers[path] = watcher
                armed = threading.Event()
                done = armed

                def arm() -> None:
                    try:
                        watcher.arm()
                    except Exception as e:
                        failure.append(e)
                    finally:
                        done.set()

                self._submit(arm)
        if armed is not None:
            ok = armed.wait(30.0)
            if not ok or failure:
                with self._lock:
                    self._watchers.pop(path, None)
                handle.cancel()
                if failure:
                    raise self._error(path, failure[0]) from failure[0]
                raise MetadataError(f"timed out arming a ZooKeeper watch on {path}")
        return handle

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for watcher in self._watchers.values():
                watcher.active = False
        self._jobs.put(None)
        if self._worker is not threading.current_thread():
            self._worker.join(5.0)
        self._watches.close()
        try:
            self._client.stop()
        finally:
            self._client.close()

    # ----------------------------------------------------------------------------------

    def _submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:
                if not self._closed:
                    log.exception("re-arming a ZooKeeper watch failed")

    def _on_state(self, state: str) -> None:
        from kazoo.client import KazooState

        if self._closed:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            log.warning("ZooKeeper session lost; this session's ephemeral entries are gone")
        elif state == KazooState.SUSPENDED:
            self._disconnected = True
        elif state == KazooState.CONNECTED and (self._session_lost or self._disconnected):
            # After a new session every watch is gone; after a mere reconnection a re-arm
            # that failed while disconnected may be missing. Arming again is idempotent.
            self._session_lost = self._disconnected = False
            self._submit(self._rearm_all)

    def _rearm_all(self) -> None:
        with self._lock:
            watchers = list(self._watchers.values())
        for watcher in watchers:
            if watcher.active:
                watcher.arm(report=True)
