"""The admin API's limits keep the broker serving: a request body is bounded in size
(``httpMaxRequestSize``: 413, refused from its Content-Length before it is read) and in
the time it may take to arrive (``httpRequestBodyTimeoutInSeconds``: 408, connection
closed); listing a namespace with a partitioned topic of many partitions does not hold
the event loop that every other client is served from."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

LIMIT = 64 * 1024
BODY_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("limits")
    s = Standalone(data, conf={"httpMaxRequestSize": LIMIT,
                               "httpRequestBodyTimeoutInSeconds": BODY_TIMEOUT}).start()
    try:
        yield s
    finally:
        s.kill()


def _exchange(server: Standalone, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, Any, bytes]:
    """Send `head` (a request's line and headers, each ending in CRLF) and `body` on a raw
    connection and read until the server closes it: the status, the JSON body and
    anything that followed."""
    host, port = server.addresses["web"][0].split("://", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        received = b""
        deadline = time.monotonic() + timeout
        while chunk := sock.recv(65536):
            received += chunk
            assert time.monotonic() < deadline, received
    header, _, rest = received.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in header.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return int(header.split()[1]), json.loads(rest[:length]), rest[length:]


def _put_tenant(name: str, extra: str) -> str:
    return (f"PUT /admin/v2/tenants/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"{extra}\r\n")


def test_a_body_over_the_limit_is_refused_from_its_content_length(server: Standalone) -> None:
    # Only the headers are sent: the answer cannot wait for the body.
    status, body, _ = _exchange(server, _put_tenant("big", f"Content-Length: {LIMIT + 1}"))
    assert status == 413
    assert body == {"reason": f"Request body of {LIMIT + 1} bytes is larger than the {LIMIT} bytes "
                              "allowed (httpMaxRequestSize)"}


def test_a_chunked_body_growing_over_the_limit_is_413(server: Standalone) -> None:
    chunk = b"a" * 8192
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(LIMIT // len(chunk) + 2))
    status, reply, _ = _exchange(server, _put_tenant("chunked", "Transfer-Encoding: chunked"), body)
    assert (status, reply) == (413, {"reason": f"Request body is larger than the {LIMIT} bytes allowed "
                                               "(httpMaxRequestSize)"})


def test_a_body_at_the_limit_is_served(server: Standalone) -> None:
    admin = AdminClient(server.addresses["web"][0], timeout=30)
    prefix = '{"allowedClusters": ["standalone"], "pad": "'
    body = prefix + "a" * (LIMIT - len(prefix) - 2) + '"}'
    assert len(body) == LIMIT
    req = urllib.request.Request(server.addresses["web"][0] + "/admin/v2/tenants/at-limit", method="PUT",
                                 data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204
    assert admin.get("/admin/v2/tenants/at-limit")["allowedClusters"] == ["standalone"]


def test_an_unfinished_body_is_answered_408_and_its_connection_closed(server: Standalone) -> None:
    start = time.monotonic()
    status, body, after = _exchange(server, _put_tenant("slow", "Content-Length: 100"), b'{"adminR')
    assert (status, body, after) == (408, {"reason": f"Request body not received within {BODY_TIMEOUT:g} "
                                                     "seconds"}, b"")
    assert time.monotonic() - start >= BODY_TIMEOUT


#: Enough partitions that building their names in one go held the event loop for about a
#: second (the test's bound on another request's answer is a fraction of that).
PARTITIONS = 500_000


def test_listing_a_huge_partitioned_topic_keeps_the_broker_serving(server: Standalone) -> None:
    base = server.addresses["web"][0]
    admin = AdminClient(base, timeout=60)
    admin.put("/admin/v2/tenants/wide", {"allowedClusters": ["standalone"]})
    admin.put("/admin/v2/namespaces/wide/ns")
    admin.put("/admin/v2/persistent/wide/ns/huge/partitions", PARTITIONS)
    listed: list[Any] = []
    done = threading.Event()

    def list_namespace() -> None:
        try:
            listed.append(admin.get("/admin/v2/persistent/wide/ns"))
        finally:
            done.set()

    lister = threading.Thread(target=list_namespace)
    lister.start()
    latencies = []
    while not done.is_set():
        start = time.monotonic()
        with urllib.request.urlopen(base + "/admin/v2/brokers/ready", timeout=30) as r:
            assert r.read() == b"ok"
        latencies.append(time.monotonic() - start)
    lister.join(60)
    assert len(listed) == 1 and len(listed[0]) == PARTITIONS
    assert listed[0][:3] == [f"persistent://wide/ns/huge-partition-{i}" for i in ("0", "1", "10")]
    assert listed[0] == sorted(listed[0])
    # Half the second a one-go build held the loop for: a machine busy with the other
    # suites (and a collection of the listing's half a million strings) has been seen to
    # take 0.4 s for one answer, a loop held by the listing takes a second.
    assert len(latencies) >= 3 and max(latencies) < 0.5, latencies


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 99, 100, 101, 1000, 1234, 9999, 10_000, 10_001])
def test_partition_numbers_come_in_the_order_of_their_names(n: int) -> None:
    from core.broker import lexicographic

    assert list(lexicographic(n)) == sorted(range(n), key=str)
