"""The broker's metadata store: a versioned, watchable key-value tree.

Three implementations share one contract (:class:`MetadataStore`): SQLite for a
standalone broker, ZooKeeper for a cluster, memory for tests. Versions start at 0 and
grow by one per write, exactly like the native core's ``magnetar_meta::MetadataStore``.

>>> from core.metadata import open_metadata_store, BadVersionError
>>> store = open_metadata_store("memory:")
>>> v0 = store.put("/admin/clusters/standalone", b"{}", -1)
>>> try:
...     store.put("/admin/clusters/standalone", b"{}", v0 + 1)
... except BadVersionError:
...     print("lost the race")
lost the race
>>> store.children("/admin/clusters")
['standalone']
>>> store.close()
"""

from ._base import (
    AlreadyExistsError,
    BadVersionError,
    InvalidPathError,
    MetadataError,
    MetadataEvent,
    MetadataStore,
    NotEmptyError,
    NotFoundError,
    StoreClosedError,
    WatchCallback,
    WatchHandle,
)
from ._memory import MemoryMetadataStore
from ._open import open_metadata_store
from ._sqlite import SqliteMetadataStore
from ._zookeeper import ZooKeeperMetadataStore, parse_zk_url

__all__ = [
    "AlreadyExistsError",
    "BadVersionError",
    "InvalidPathError",
    "MemoryMetadataStore",
    "MetadataError",
    "MetadataEvent",
    "MetadataStore",
    "NotEmptyError",
    "NotFoundError",
    "SqliteMetadataStore",
    "StoreClosedError",
    "WatchCallback",
    "WatchHandle",
    "ZooKeeperMetadataStore",
    "open_metadata_store",
    "parse_zk_url",
]
