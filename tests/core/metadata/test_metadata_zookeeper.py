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


def test_watches_survive_session_expiry(zk_url, zookeeper_hosts):
    import queue
    import time

    from kazoo.client import KazooClient

    from core.metadata import MetadataEvent

    events: queue.Queue[tuple[str, MetadataEvent]] = queue.Queue()
    with open_metadata_store(zk_url) as store, open_metadata_store(zk_url) as writer:
        store.put("/w", b"")
        store.watch("/w", lambda path, event: events.put((path, event)))
        store.put("/gone", b"", ephemeral=True)
        old_session, password = store._client.client_id  # type: ignore[attr-defined]
        # Expire the store's session the way ZooKeeper does it: another client takes the
        # session over and closes it.
        thief = KazooClient(hosts=zookeeper_hosts, client_id=(old_session, password))
        thief.start(timeout=15)
        thief.stop()
        thief.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            client = store._client  # type: ignore[attr-defined]
            if client.connected and client.client_id[0] != old_session:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the store did not get a new session")
        assert writer.get("/gone") is None
        # Watches are re-armed on the new session (asynchronously): a change made once
        # that has happened is reported.
        deadline = time.monotonic() + 30
        probe = 0
        while time.monotonic() < deadline:
            probe += 1
            writer.put(f"/w/probe-{probe}", b"")
            try:
                path, event = events.get(timeout=1)
            except queue.Empty:
                continue
            assert path.startswith("/w/probe-") and event == MetadataEvent.CREATED
            break
        else:
            raise AssertionError("no event after the session was replaced")
