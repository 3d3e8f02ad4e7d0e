"""A real `magnetar standalone` process for tests: free ports, its own data directory."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


class Standalone:
    def __init__(self, data_dir: Path, *, bookies: int = 1, conf: dict[str, Any] | None = None):
        self.data_dir = data_dir
        self.bookies = bookies
        self.conf = {"brokerServicePort": 0, "webServicePort": 0, "bookiePort": 0,
                     "kafkaListeners": "PLAINTEXT://127.0.0.1:0",
                     "amqpListeners": "amqp://127.0.0.1:0", "mqttListeners": "mqtt://127.0.0.1:0",
                     "keepAliveIntervalSeconds": 30, **(conf or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.addresses: dict[str, list[str]] = {}
        self.output: list[str] = []
        self.startup_seconds = 0.0
        self._drainer: threading.Thread | None = None

    @property
    def pulsar_url(self) -> str:
        return self.addresses["pulsar"][0]

    def start(self) -> Standalone:
        args = [sys.executable, "-m", "gateway", "standalone", "--data-dir", str(self.data_dir),
                "--bookies", str(self.bookies)]
        for k, v in self.conf.items():
            args += ["-c", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = t0 + READY_TIMEOUT
        buf = b""
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                self.output.append(text)
                if text.startswith("magnetar standalone ready"):
                    self.startup_seconds = time.monotonic() - t0
                    self.addresses = json.loads(text[text.index("{"):])
                    sel.close()
                    self._drain_in_background()
                    return self
        self.kill()
        raise RuntimeError("standalone did not start:\n" + "\n".join(self.output) + buf.decode(errors="replace"))

    def _drain_in_background(self) -> None:
        def drain() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            with self.proc.stdout as out:
                for line in out:
                    self.output.append(line.decode(errors="replace").rstrip("\n"))

        self._drainer = threading.Thread(target=drain, daemon=True)
        self._drainer.start()

    def stop(self) -> int:
        """SIGINT, as Ctrl-C: a clean shutdown. Returns the exit code."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("standalone did not stop on SIGINT:\n" + "\n".join(self.output[-50:])) from None
        finally:
            self._close_pipe()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None and self._drainer is None:
            self.proc.stdout.close()
        if self._drainer is not None:
            self._drainer.join(10)
        self.proc = None

    def __enter__(self) -> Standalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            try:
                self.stop()
            finally:
                self.kill()
