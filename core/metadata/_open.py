"""Open a metadata store from its URL (the ``metadataStoreUrl`` setting)."""

from __future__ import annotations

from typing import Any

from ._base import MetadataError, MetadataStore

__all__ = ["open_metadata_store"]


def open_metadata_store(url: str, **options: Any) -> MetadataStore:
    """Open the store named by ``url``.

    - ``sqlite:PATH`` — :class:`~core.metadata.SqliteMetadataStore` (file created if missing);
    - ``memory:`` — :class:`~core.metadata.MemoryMetadataStore`;
    - ``zk:host:port[,host:port]/chroot`` — :class:`~core.metadata.ZooKeeperMetadataStore`.

    ``options`` are passed to the store's constructor (e.g. ``session_timeout`` for
    ZooKeeper, ``durable`` for SQLite).

    >>> store = open_metadata_store("memory:")
    >>> store.put("/a", b"x")
    0
    >>> store.close()
    """
    scheme, sep, rest = url.partition(":")
    if not sep:
        raise MetadataError(f"metadata store URL {url!r} has no scheme (sqlite:, memory:, zk:)")
    if scheme == "sqlite":
        if not rest:
            raise MetadataError(f"metadata store URL {url!r} names no file")
        from ._sqlite import SqliteMetadataStore

        return SqliteMetadataStore(rest, **options)
    if scheme == "memory":
        from ._memory import MemoryMetadataStore

        return MemoryMetadataStore(**options)
    if scheme == "zk":
        from ._zookeeper import ZooKeeperMetadataStore

        return ZooKeeperMetadataStore.from_url(url, **options)
    raise MetadataError(
        f"unknown metadata store scheme {scheme!r} in {url!r} (expected sqlite:, memory:, zk:)"
    )
