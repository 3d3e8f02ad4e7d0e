"""MemoryMetadataStore specifics: its session ends with close()."""

from __future__ import annotations

import queue

from core.metadata import MemoryMetadataStore, MetadataEvent, open_metadata_store


def test_close_removes_ephemeral_entries_and_reports_them():
    store = MemoryMetadataStore()
    events: queue.Queue[tuple[str, MetadataEvent]] = queue.Queue()
    store.watch("/brokers", lambda path, event: events.put((path, event)))
    store.put("/brokers/b1", b"", ephemeral=True)
    assert events.get(timeout=10) == ("/brokers/b1", MetadataEvent.CREATED)
    store.close()
    assert events.get(timeout=10) == ("/brokers/b1", MetadataEvent.DELETED)


def test_memory_url_opens_independent_stores():
    a, b = open_metadata_store("memory:"), open_metadata_store("memory:")
    a.put("/only-in-a", b"")
    assert b.get("/only-in-a") is None
    a.close()
    b.close()
