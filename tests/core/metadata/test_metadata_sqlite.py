"""SqliteMetadataStore specifics: durability, several processes on one file, dead owners."""

from __future__ import annotations

import os
import queue
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from core.metadata import MetadataEvent, SqliteMetadataStore, open_metadata_store
from core.metadata._sqlite import REAP_INTERVAL_S

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CHILD_TIMEOUT_S = 120


def _python(code: str, *args: str, **kwargs) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        **kwargs,
    )


def test_data_survives_reopen(tmp_path):
    db = str(tmp_path / "sub" / "dir" / "meta.db")
    with SqliteMetadataStore(db) as store:
        store.put("/ledgers/7", b"meta", -1)
        store.put("/ledgers/7", b"meta2", 0)
    with open_metadata_store("sqlite:" + db) as store:
        assert store.get("/ledgers/7") == (b"meta2", 1)
        assert store.children("/ledgers") == ["7"]


def test_uses_wal_mode(tmp_path):
    db = str(tmp_path / "meta.db")
    with SqliteMetadataStore(db):
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()


COUNTER_WORKER = """
    import sys
    from core.metadata import SqliteMetadataStore, BadVersionError
    path, increments = sys.argv[1], int(sys.argv[2])
    store = SqliteMetadataStore(path)
    done = lost = 0
    for _ in range(increments * 1000):
        if done == increments:
            break
        value, version = store.get("/counter")
        try:
            store.put("/counter", str(int(value) + 1).encode(), version)
            done += 1
        except BadVersionError:
            lost += 1
    store.close()
    print(done, lost)
    sys.exit(0 if done == increments else 1)
"""


def test_two_processes_compare_and_set_one_counter_exactly(tmp_path):
    db = str(tmp_path / "meta.db")
    with SqliteMetadataStore(db) as store:
        store.put("/counter", b"0", -1)
    workers = [_python(COUNTER_WORKER, db, "500") for _ in range(2)]
    for w in workers:
        out, err = w.communicate(timeout=CHILD_TIMEOUT_S)
        assert w.returncode == 0, err
    with SqliteMetadataStore(db) as store:
        value, version = store.get("/counter")
    assert int(value) == 1000
    assert version == 1000


OWNER = """
    import sys
    from core.metadata import SqliteMetadataStore
    store = SqliteMetadataStore(sys.argv[1])
    store.put("/brokers/owner", b"alive", ephemeral=True)
    store.put("/brokers/kept", b"persistent")
    print("ready", flush=True)
    sys.stdin.readline()
"""


def _start_owner(db: str) -> subprocess.Popen[str]:
    owner = _python(OWNER, db)
    assert owner.stdout is not None
    assert owner.stdout.readline().strip() == "ready"
    return owner


def test_ephemerals_of_a_killed_process_go_on_next_open(tmp_path):
    db = str(tmp_path / "meta.db")
    owner = _start_owner(db)
    with SqliteMetadataStore(db) as live_view:
        assert live_view.get("/brokers/owner") == (b"alive", 0)
    os.kill(owner.pid, signal.SIGKILL)
    owner.communicate(timeout=CHILD_TIMEOUT_S)
    with SqliteMetadataStore(db) as store:
        assert store.get("/brokers/owner") is None
        assert store.get("/brokers/kept") == (b"persistent", 0)
        assert store.children("/brokers") == ["kept"]


def test_ephemerals_of_a_process_that_dies_while_the_store_is_open_leave_its_listings(tmp_path):
    # as a bookie killed beside a running broker must leave /ledgers/available
    db = str(tmp_path / "meta.db")
    owner = _start_owner(db)
    with SqliteMetadataStore(db) as store:
        assert store.children("/brokers") == ["kept", "owner"]
        os.kill(owner.pid, signal.SIGKILL)
        owner.communicate(timeout=CHILD_TIMEOUT_S)
        deadline = time.monotonic() + 5 * REAP_INTERVAL_S
        while store.children("/brokers") != ["kept"]:
            assert time.monotonic() < deadline, "the dead process's entry is still listed"
            time.sleep(0.05)
        assert store.get("/brokers/owner") is None


def test_ephemerals_of_a_live_process_stay(tmp_path):
    db = str(tmp_path / "meta.db")
    owner = _start_owner(db)
    try:
        with SqliteMetadataStore(db) as store:
            assert store.reap_dead_sessions() == 0
            assert store.exists("/brokers/owner")
    finally:
        owner.communicate("\n", timeout=CHILD_TIMEOUT_S)


def test_recycled_pid_is_not_taken_for_the_owner(tmp_path):
    db = str(tmp_path / "meta.db")
    with SqliteMetadataStore(db) as store:
        store.put("/e", b"", ephemeral=True)
        # Pretend the owner was an earlier process that had this pid.
        raw = sqlite3.connect(db)
        raw.execute("UPDATE sessions SET pid_start = 'earlier' WHERE id = ?", (store.session_id,))
        raw.commit()
        raw.close()
        with SqliteMetadataStore(db) as other:
            assert other.get("/e") is None


def test_watch_sees_changes_made_by_another_process(tmp_path):
    db = str(tmp_path / "meta.db")
    events: queue.Queue[tuple[str, MetadataEvent]] = queue.Queue()
    with SqliteMetadataStore(db) as store:
        store.put("/brokers", b"")
        store.watch("/brokers", lambda path, event: events.put((path, event)))
        owner = _start_owner(db)
        got = {events.get(timeout=10), events.get(timeout=10)}
        assert got == {("/brokers/owner", MetadataEvent.CREATED), ("/brokers/kept", MetadataEvent.CREATED)}
        owner.communicate("\n", timeout=CHILD_TIMEOUT_S)
        # The owner exited without closing: its ephemeral entry goes when someone reaps it.
        with SqliteMetadataStore(db):
            pass
        assert events.get(timeout=10) == ("/brokers/owner", MetadataEvent.DELETED)


def test_bad_file_is_a_metadata_error(tmp_path):
    from core.metadata import MetadataError

    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(MetadataError):
        SqliteMetadataStore(str(bad))


def test_newer_schema_is_refused(tmp_path):
    from core.metadata import MetadataError

    db = str(tmp_path / "meta.db")
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(MetadataError, match="schema version 99"):
        SqliteMetadataStore(db)


WRITER = """
    import sys
    from core.metadata import SqliteMetadataStore
    store = SqliteMetadataStore(sys.argv[1])
    for i in range(1_000_000):
        version = store.put("/counter", str(i).encode())
        print(version, flush=True)
"""


def test_acknowledged_writes_survive_kill_9(tmp_path):
    db = str(tmp_path / "meta.db")
    writer = _python(WRITER, db)
    assert writer.stdout is not None
    acknowledged = -1
    for _ in range(300):
        acknowledged = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)
    writer.communicate(timeout=CHILD_TIMEOUT_S)
    with SqliteMetadataStore(db) as store:
        value, version = store.get("/counter")
    assert version >= acknowledged
    assert int(value) == version
