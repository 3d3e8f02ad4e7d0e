"""ZooKeeperMetadataStore specifics: chroot, ZooKeeper's own rules, URL opening."""

from __future__ import annotations

import uuid

import pytest

from core.metadata import (
    MetadataError,
    NotEmptyError,
    ZooKeeperMetadataStore,
    open_metadata_store,
)


@pytest.fixture
def zk_url(zookeeper_hosts):
    return f"zk:{zookeeper_hosts}/it-{uuid.uuid4().hex[:10]}/nested"


def test_chroot_is_created_and_isolates(zk_url, zookeeper_hosts):
    with open_metadata_store(zk_url) as store:
        assert isinstance(store, ZooKeeperMetadataStore)
        store.put("/k", b"v")
    with open_metadata_store(zk_url) as again:
        assert again.get("/k") == (b"v", 0)
    with open_metadata_store(f"zk:{zookeeper_hosts}/other-{uuid.uuid4().hex[:10]}") as other:
        assert other.get("/k") is None


def test_parents_become_entries_and_guard_their_children(zk_url):
    with open_metadata_store(zk_url) as store:
        store.put("/p/q/r", b"leaf")
        assert store.get("/p/q") == (b"", 0)
        with pytest.raises(NotEmptyError):
            store.delete("/p/q")
        store.delete("/p/q/r")
        store.delete("/p/q")
        assert store.children("/p") == []


def test_ephemeral_entry_cannot_have_children(zk_url):
    with open_metadata_store(zk_url) as store:
        store.put("/eph", b"", ephemeral=True)
        with pytest.raises(MetadataError):
            store.put("/eph/child", b"")


def test_unreachable_server_is_a_metadata_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(MetadataError, match="cannot connect"):
            ZooKeeperMetadataStore(f"127.0.0.1:{port}", connect_timeout=1.0)
