"""Storage test environment: a metadata store, bookies and a managed-ledger factory, all
real, in this process (for trio tests) or as a script run in a subprocess (fault tests)."""

from __future__ import annotations

import json
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from core._bridge import NativeBridge
from core.metadata import open_metadata_store
from core.storage import Storage
from gateway._bookies import start_bookie
from gateway._config import load_config

AVAILABLE = "/ledgers/available"


class SlowOpens:
    """Make ``broker``'s storage take a while to open each managed ledger (and fail to
    open those named in ``failing``), counting how many open at once: ``most`` is the
    highest count seen."""

    def __init__(self, broker: Any, failing: set[str] | None = None, delay: float = 0.05):
        self.loading = self.most = 0
        self._real = broker.storage.open
        self._failing = failing or set()
        self._delay = delay
        broker.storage.open = self._open

    async def _open(self, name: str, config: dict[str, Any]) -> Any:
        self.loading += 1
        self.most = max(self.most, self.loading)
        try:
            await trio.sleep(self._delay)
            if name in self._failing:
                raise OSError("a ledger that cannot be read")
            return await self._real(name, config)
        finally:
            self.loading -= 1


def ml_config(**overrides: Any) -> dict[str, Any]:
    base = {"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1,
            "retention_time_ms": 0, "retention_size_mb": 0, "mark_delete_rate_per_sec": 0.0}
    base.update(overrides)
    return base


class StorageEnv:
    def __init__(self, root: Path, bridge: NativeBridge, metadata: Any):
        self.root = root
        self.bridge = bridge
        self.metadata = metadata
        self.bookies: list[Any] = []
        self.config = load_config(None, {}, environ={})
        self.storage = Storage(bridge, metadata, 5000)

    def add_bookie(self, index: int | None = None) -> Any:
        i = len(self.bookies) if index is None else index
        bookie = start_bookie(self.config, str(self.root / f"bookie-{i}"), 0)
        self.metadata.put(f"{AVAILABLE}/{bookie.address}", b"{}")
        self.bookies.append(bookie)
        return bookie

    def stop_bookie(self, bookie: Any) -> None:
        self.metadata.delete(f"{AVAILABLE}/{bookie.address}")
        bookie.shutdown()


@asynccontextmanager
async def storage_env(root: Path, bookies: int = 1, metadata_url: str | None = None):
    metadata = open_metadata_store(metadata_url or f"sqlite:{root / 'metadata.db'}")
    bridge = NativeBridge()
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        env = StorageEnv(root, bridge, metadata)
        for _ in range(bookies):
            env.add_bookie()
        try:
            yield env
        finally:
            for b in env.bookies:
                b.shutdown()
            nursery.cancel_scope.cancel()
    metadata.close()


async def _writer_main(metadata_url: str, name: str, config: dict[str, Any], count: int) -> None:
    """Append `count` entries `entry-<i>` one batch at a time, printing each acknowledged
    index as soon as it is durable, then `done`."""
    metadata = open_metadata_store(metadata_url)
    bridge = NativeBridge()
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        storage = Storage(bridge, metadata, 3000)
        ml = await storage.open(name, config)
        print("opened", flush=True)
        i = 0
        while i < count:
            batch = list(range(i, min(i + 10, count)))
            try:
                await ml.add_entries([f"entry-{j}".encode() for j in batch], [1] * len(batch))
            except Exception as exc:
                print(f"error {type(exc).__name__}: {exc}", flush=True)
                await trio.sleep(0.05)
                continue
            for j in batch:
                print(f"acked {j}", flush=True)
            i += len(batch)
        print("done", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    url, name, config, count = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    trio.run(_writer_main, url, name, config, count)
