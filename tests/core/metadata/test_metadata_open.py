"""open_metadata_store: URL schemes and their errors."""

from __future__ import annotations

import pytest

from core.metadata import (
    MemoryMetadataStore,
    MetadataError,
    SqliteMetadataStore,
    open_metadata_store,
    parse_zk_url,
)


def test_sqlite_url_creates_the_file_and_directories(tmp_path):
    path = tmp_path / "a" / "b" / "metadata.db"
    store = open_metadata_store(f"sqlite:{path}")
    try:
        assert isinstance(store, SqliteMetadataStore)
        assert path.exists()
    finally:
        store.close()


def test_sqlite_url_with_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_metadata_store("sqlite:data/metadata.db") as store:
        store.put("/x", b"1")
    assert (tmp_path / "data" / "metadata.db").exists()


def test_memory_url():
    with open_metadata_store("memory:") as store:
        assert isinstance(store, MemoryMetadataStore)


@pytest.mark.parametrize("url", ["", "sqlite:", "etcd:127.0.0.1:2379", "no-scheme", "zk:/chroot-only"])
def test_bad_urls_are_metadata_errors(url):
    with pytest.raises(MetadataError):
        open_metadata_store(url)


@pytest.mark.parametrize(
    ("url", "hosts", "chroot"),
    [
        ("zk:127.0.0.1:2181", "127.0.0.1:2181", ""),
        ("zk:127.0.0.1:2181/", "127.0.0.1:2181", ""),
        ("zk:a:1,b:2,c:3/magnetar/prod", "a:1,b:2,c:3", "/magnetar/prod"),
        ("zk:h:2181/ledgers/", "h:2181", "/ledgers"),
    ],
)
def test_parse_zk_url(url, hosts, chroot):
    assert parse_zk_url(url) == (hosts, chroot)
