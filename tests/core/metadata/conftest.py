"""Fixtures for the metadata store suite: one store per implementation, and a ZooKeeper server.

The ZooKeeper server is Debian's ``zookeeper`` package run as a standalone server in a
temporary directory on a loopback port. Without the package the ZooKeeper cases skip,
except under CI (``CI=true``), where a missing server is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from core.metadata import (
    MemoryMetadataStore,
    MetadataStore,
    SqliteMetadataStore,
    ZooKeeperMetadataStore,
)

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
START_TIMEOUT_S = 60.0


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="session")
def zookeeper_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a ZooKeeper server started for this test session."""
    java = shutil.which("java")
    if java is None or not os.path.exists(ZOOKEEPER_JAR):
        reason = "ZooKeeper is not installed (apt-get install zookeeper)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("zookeeper")
    # ZooKeeper cannot report a port it chose itself, so the port comes from the kernel
    # (bind to port 0, read it, release it); a lost race is retried on a new port.
    for _attempt in range(3):
        port = _free_loopback_port()
        cfg = base / f"zoo-{port}.cfg"
        cfg.write_text(
            "tickTime=500\n"
            f"dataDir={base / f'data-{port}'}\n"
            "clientPortAddress=127.0.0.1\n"
            f"clientPort={port}\n"
            "admin.enableServer=false\n"
            "maxSessionTimeout=60000\n"
        )
        log = open(base / f"zookeeper-{port}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [java, "-Xmx256m", "-Dzookeeper.admin.enableServer=false", "-cp", ZOOKEEPER_JAR,
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        try:
            if _wait_for_port(port, proc, time.monotonic() + START_TIMEOUT_S):
                yield f"127.0.0.1:{port}"
                return
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
    pytest.fail(f"ZooKeeper did not start; see {base}")


StoreFactory = Callable[[], MetadataStore]


def _factory(kind: str, request: pytest.FixtureRequest, tmp_path) -> Iterator[StoreFactory]:
    opened: list[MetadataStore] = []
    if kind == "memory":
        def open_store() -> MetadataStore:
            return MemoryMetadataStore()
    elif kind == "sqlite":
        db = str(tmp_path / "meta.db")

        def open_store() -> MetadataStore:
            return SqliteMetadataStore(db)
    else:
        hosts = request.getfixturevalue("zookeeper_hosts")
        chroot = f"/test-{uuid.uuid4().hex[:12]}"

        def open_store() -> MetadataStore:
            return ZooKeeperMetadataStore(hosts, chroot, session_timeout=10.0)

    def factory() -> MetadataStore:
        store = open_store()
        opened.append(store)
        return store

    factory.kind = kind  # type: ignore[attr-defined]
    yield factory
    for store in opened:
        store.close()


@pytest.fixture(params=["memory", "sqlite", "zookeeper"])
def store_factory(request: pytest.FixtureRequest, tmp_path) -> Iterator[StoreFactory]:
    """Opens stores of one implementation; for ``memory`` each call gives a new, empty store."""
    yield from _factory(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", "zookeeper"])
def shared_store_factory(request: pytest.FixtureRequest, tmp_path) -> Iterator[StoreFactory]:
    """Opens stores (sessions) that share one backing: a file, or a ZooKeeper chroot."""
    yield from _factory(request.param, request, tmp_path)


@pytest.fixture
def store(store_factory: StoreFactory) -> MetadataStore:
    return store_factory()
