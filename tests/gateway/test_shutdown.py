"""How `magnetar standalone` ends: a bounded shutdown, and start-up errors in one line."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pulsar

from tests._standalone import STOP_TIMEOUT, Standalone


def test_a_client_that_stops_reading_cannot_hold_up_the_shutdown(tmp_path):
    """An admin client that sent a request and reads none of its (large) answer holds the
    web server's write forever: brokerShutdownTimeoutMs ends the process anyway, as
    Pulsar's does, and what was acknowledged is there at the next start."""
    topic = "persistent://public/default/held"
    conf = {"brokerShutdownTimeoutMs": 2000}
    with Standalone(tmp_path / "data", conf=conf) as s:
        client = pulsar.Client(s.pulsar_url)
        client.subscribe(topic, "s").close()
        client.create_producer(topic, batching_enabled=False).send(b"x" * 4_000_000)
        client.close()
        host, port = s.addresses["web"][0].split("//")[1].rsplit(":", 1)
        stalled = socket.create_connection((host, int(port)))
        try:
            stalled.sendall(f"GET /admin/v2/{topic.replace('://', '/')}/subscription/s/position/1 "
                            f"HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            time.sleep(1)  # the answer is being written; none of it is read
            started = time.monotonic()
            assert s.proc is not None
            s.proc.send_signal(2)
            s.proc.wait(STOP_TIMEOUT)
            assert time.monotonic() - started < 2 + 5
            assert s.proc.returncode == 1  # ended by the timeout, not by the (held) shutdown
        finally:
            stalled.close()
    with Standalone(tmp_path / "data") as s:
        client = pulsar.Client(s.pulsar_url)
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert len(reader.read_next(10_000).data()) == 4_000_000
        client.close()


def test_a_data_directory_that_is_a_file_is_an_error_in_one_line(tmp_path):
    taken = tmp_path / "file"
    taken.write_text("not a directory")
    out = subprocess.run([sys.executable, "-m", "gateway", "standalone", "--data-dir", str(taken)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(f"magnetar: error: dataDirectory '{taken}':")
    assert "Traceback" not in out.stderr
