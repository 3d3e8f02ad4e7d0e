"""The MetadataStore contract, run against every implementation (memory, SQLite, ZooKeeper).

The version rules are the native core's (rust/meta): create gives version 0, every
successful write adds one, ``expected_version`` None / -1 / v means unconditional /
create-only / compare-and-set.
"""

from __future__ import annotations

import queue
import threading

import pytest

from core.metadata import (
    AlreadyExistsError,
    BadVersionError,
    InvalidPathError,
    MetadataError,
    MetadataEvent,
    NotFoundError,
    StoreClosedError,
)

EVENT_TIMEOUT_S = 10.0


def test_get_of_absent_path_is_none(store):
    assert store.get("/nothing/here") is None
    assert not store.exists("/nothing/here")


def test_create_only_then_compare_and_set(store):
    v0 = store.put("/a", b"one", -1)
    assert v0 == 0
    with pytest.raises(BadVersionError):
        store.put("/a", b"two", v0 + 7)
    v1 = store.put("/a", b"two", v0)
    assert v1 == 1
    assert store.get("/a") == (b"two", 1)
    with pytest.raises(BadVersionError):
        store.put("/a", b"three", v0)
    assert store.get("/a") == (b"two", 1)


def test_create_only_on_existing_path_raises_already_exists(store):
    store.put("/a", b"x")
    with pytest.raises(AlreadyExistsError):
        store.put("/a", b"y", -1)
    assert store.get("/a") == (b"x", 0)


def test_versioned_put_on_absent_path_raises_not_found(store):
    with pytest.raises(NotFoundError):
        store.put("/absent", b"x", 0)
    assert not store.exists("/absent")


def test_unconditional_put_creates_then_counts_up(store):
    assert [store.put("/u", bytes([i])) for i in range(4)] == [0, 1, 2, 3]
    assert store.get("/u") == (b"\x03", 3)


def test_errors_are_metadata_errors():
    for cls in (NotFoundError, BadVersionError, AlreadyExistsError, InvalidPathError, StoreClosedError):
        assert issubclass(cls, MetadataError)


def test_delete_unconditional_versioned_and_absent(store):
    v = store.put("/k", b"1")
    with pytest.raises(BadVersionError):
        store.delete("/k", v + 1)
    assert store.exists("/k")
    store.delete("/k", v)
    assert store.get("/k") is None
    with pytest.raises(NotFoundError):
        store.delete("/k")
    store.put("/k", b"2")
    store.delete("/k")
    assert not store.exists("/k")


def test_recreated_entry_starts_at_version_zero(store):
    store.put("/r", b"a")
    store.put("/r", b"b")
    store.delete("/r")
    assert store.put("/r", b"c", -1) == 0


def test_children_lists_direct_names_once_sorted(store):
    for path in ("/l/b", "/l/a", "/l/a/x", "/l/a-b", "/lx", "/l/a/x/y"):
        store.put(path, b"")
    assert store.children("/l") == ["a", "a-b", "b"]
    assert store.children("/l/a") == ["x"]
    assert store.children("/l/b") == []
    assert store.children("/missing") == []
    assert "l" in store.children("/") and "lx" in store.children("/")


def test_nested_put_needs_no_parents(store):
    assert store.put("/x/y/z", b"deep", -1) == 0
    assert store.get("/x/y/z") == (b"deep", 0)
    assert store.children("/x") == ["y"]
    assert store.children("/x/y") == ["z"]


def test_binary_and_empty_values_round_trip(store):
    every_byte = bytes(range(256)) * 4
    store.put("/bin", every_byte)
    assert store.get("/bin") == (every_byte, 0)
    store.put("/empty", b"")
    assert store.get("/empty") == (b"", 0)
    store.put("/view", memoryview(b"from a view"))
    assert store.get("/view") == (b"from a view", 0)


def test_unicode_path_names(store):
    store.put("/topics/caf\u00e9/\u00fcber", b"1")
    assert store.children("/topics/caf\u00e9") == ["\u00fcber"]
    assert store.get("/topics/caf\u00e9/\u00fcber") == (b"1", 0)


@pytest.mark.parametrize("bad", ["", "relative", "/trailing/", "//double", "/a//b", "/nul\x00"])
def test_invalid_paths_are_rejected(store, bad):
    with pytest.raises(InvalidPathError):
        store.put(bad, b"")
    with pytest.raises(InvalidPathError):
        store.get(bad)


def test_ephemeral_entry_is_removed_when_its_store_closes(shared_store_factory):
    owner = shared_store_factory()
    observer = shared_store_factory()
    owner.put("/brokers/b1", b"alive", ephemeral=True)
    owner.put("/brokers/persistent", b"stays")
    assert observer.get("/brokers/b1") == (b"alive", 0)
    owner.close()
    assert observer.get("/brokers/b1") is None
    assert observer.get("/brokers/persistent") == (b"stays", 0)
    assert observer.children("/brokers") == ["persistent"]


def test_ephemeral_entry_can_be_updated_and_deleted(store):
    v = store.put("/eph", b"1", -1, ephemeral=True)
    assert store.put("/eph", b"2", v) == v + 1
    store.delete("/eph")
    assert not store.exists("/eph")


def test_closed_store_refuses_calls_and_closes_twice(store_factory):
    s = store_factory()
    s.close()
    s.close()
    with pytest.raises(StoreClosedError):
        s.get("/a")
    with pytest.raises(StoreClosedError):
        s.put("/a", b"")


def test_concurrent_compare_and_set_increments_are_exact(store):
    threads, per_thread = 4, 40
    store.put("/counter", b"0", -1)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            done = 0
            for _ in range(per_thread * 200):
                if done == per_thread:
                    return
                value, version = store.get("/counter")
                try:
                    store.put("/counter", str(int(value) + 1).encode(), version)
                    done += 1
                except BadVersionError:
                    continue
            raise AssertionError("too many lost races")
        except BaseException as e:
            failures.append(e)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not failures
    value, version = store.get("/counter")
    assert int(value) == threads * per_thread
    assert version == threads * per_thread


# --- watches ------------------------------------------------------------------------------


class Recorder:
    """Collects (path, event) pairs from a watch callback, for bounded waiting."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, MetadataEvent]] = queue.Queue()

    def __call__(self, path: str, event: MetadataEvent) -> None:
        self.events.put((path, event))

    def next(self) -> tuple[str, MetadataEvent]:
        try:
            return self.events.get(timeout=EVENT_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError("no watch event arrived in time") from None


def test_watch_reports_the_path_and_its_direct_children(store):
    rec = Recorder()
    handle = store.watch("/w", rec)
    store.put("/w", b"a")
    assert rec.next() == ("/w", MetadataEvent.CREATED)
    store.put("/w", b"b")
    assert rec.next() == ("/w", MetadataEvent.CHANGED)
    store.put("/w/c", b"1")
    assert rec.next() == ("/w/c", MetadataEvent.CREATED)
    store.put("/w/c", b"2")
    assert rec.next() == ("/w/c", MetadataEvent.CHANGED)
    store.put("/w/c/grandchild", b"")
    store.delete("/w/c/grandchild")
    store.put("/elsewhere", b"")
    store.delete("/w/c")
    assert rec.next() == ("/w/c", MetadataEvent.DELETED)
    store.delete("/w")
    assert rec.next() == ("/w", MetadataEvent.DELETED)
    # Nothing else was reported in between: the next event is this one.
    store.put("/w", b"again")
    assert rec.next() == ("/w", MetadataEvent.CREATED)
    handle.cancel()


def test_cancelled_watch_gets_no_more_events(store):
    cancelled, sentinel = Recorder(), Recorder()
    handle = store.watch("/c", cancelled)
    store.put("/c", b"1")
    assert cancelled.next() == ("/c", MetadataEvent.CREATED)
    handle.cancel()
    handle.cancel()
    store.watch("/c", sentinel)
    store.put("/c", b"2")
    assert sentinel.next() == ("/c", MetadataEvent.CHANGED)
    store.put("/c", b"3")
    assert sentinel.next() == ("/c", MetadataEvent.CHANGED)
    assert cancelled.events.empty()


def test_two_watches_on_one_path_both_fire(store):
    first, second = Recorder(), Recorder()
    store.watch("/two", first)
    store.watch("/two", second)
    store.put("/two", b"")
    assert first.next() == ("/two", MetadataEvent.CREATED)
    assert second.next() == ("/two", MetadataEvent.CREATED)


def test_watch_callback_may_call_the_store(store):
    seen: queue.Queue[tuple[bytes, int] | None] = queue.Queue()
    store.watch("/re", lambda path, event: seen.put(store.get(path)))
    store.put("/re", b"value")
    assert seen.get(timeout=EVENT_TIMEOUT_S) == (b"value", 0)


def test_failing_callback_does_not_stop_other_events(store, caplog):
    rec = Recorder()

    def broken(path: str, event: MetadataEvent) -> None:
        raise RuntimeError("callback bug")

    store.watch("/f", broken)
    store.watch("/f", rec)
    store.put("/f", b"1")
    assert rec.next() == ("/f", MetadataEvent.CREATED)
    store.put("/f", b"2")
    assert rec.next() == ("/f", MetadataEvent.CHANGED)


def test_watch_sees_ephemeral_removal_by_another_session(shared_store_factory):
    watcher, owner = shared_store_factory(), shared_store_factory()
    watcher.put("/live", b"")
    rec = Recorder()
    watcher.watch("/live", rec)
    owner.put("/live/b1", b"", ephemeral=True)
    assert rec.next() == ("/live/b1", MetadataEvent.CREATED)
    owner.close()
    assert rec.next() == ("/live/b1", MetadataEvent.DELETED)


def test_watch_handle_is_a_context_manager(store):
    rec = Recorder()
    with store.watch("/cm", rec) as handle:
        store.put("/cm", b"")
        assert rec.next() == ("/cm", MetadataEvent.CREATED)
    assert handle.cancelled


# --- model check ----------------------------------------------------------------------------


class Model:
    """The contract as a plain dict (the rules of rust/meta's MemStore)."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[bytes, int]] = {}

    def put(self, path: str, data: bytes, expected: int | None) -> int:
        current = self.entries.get(path)
        if current is None:
            if expected not in (None, -1):
                raise NotFoundError(path)
            version = 0
        elif expected == -1:
            raise AlreadyExistsError(path)
        elif expected is not None and expected != current[1]:
            raise BadVersionError(path)
        else:
            version = current[1] + 1
        self.entries[path] = (data, version)
        return version

    def delete(self, path: str, expected: int | None) -> None:
        current = self.entries.get(path)
        if current is None:
            raise NotFoundError(path)
        if expected is not None and expected != current[1]:
            raise BadVersionError(path)
        del self.entries[path]

    def children(self, root: str) -> list[str]:
        return sorted(p.rsplit("/", 1)[1] for p in self.entries if p.startswith(root + "/"))


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except MetadataError as e:
        return ("error", type(e).__name__)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_match_the_model(store, seed):
    import random

    rng = random.Random(seed)
    root = "/model"
    store.put(root, b"")
    model = Model()
    names = [f"{root}/{n}" for n in ("a", "b", "c", "d")]
    for step in range(250):
        path = rng.choice(names)
        known = model.entries.get(path)
        expected = rng.choice([None, -1, -2, 0, 1, 2, known[1] if known else 0, known[1] if known else 3])
        op = rng.random()
        if op < 0.55:
            data = rng.randbytes(rng.randrange(0, 40))
            got = _outcome(store.put, path, data, expected)
            want = _outcome(model.put, path, data, expected)
        elif op < 0.8:
            got = _outcome(store.delete, path, expected)
            want = _outcome(model.delete, path, expected)
        elif op < 0.9:
            got = ("ok", store.children(root))
            want = ("ok", model.children(root))
        else:
            got = ("ok", store.get(path))
            want = ("ok", model.entries.get(path))
        assert got == want, f"step {step}: {path} expected_version={expected}"
    for path in names:
        assert store.get(path) == model.entries.get(path)
