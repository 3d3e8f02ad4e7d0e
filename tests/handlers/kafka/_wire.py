"""A blocking Kafka wire client for tests: our codec on a plain socket."""

from __future__ import annotations

import itertools
import socket
import struct
from typing import Any

from handlers.kafka._codec import Data, decode_response, encode_request
from tests._ports import free_port

__all__ = ["Wire", "bootstrap", "free_port"]

TIMEOUT = 15.0


def bootstrap(addresses: dict[str, list[str]]) -> str:
    return addresses["kafka"][0].split("://", 1)[1]


class Wire:
    def __init__(self, address: str, *, source_host: str | None = None):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT,
                                             source_address=(source_host, 0) if source_host else None)
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, api_key: int, version: int, body: Any) -> int:
        cid = next(self._ids)
        self.sock.sendall(encode_request(api_key, version, cid, "wire-test", body))
        return cid

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes:
        head = self._exactly(4)
        (n,) = struct.unpack(">i", head)
        return self._exactly(n)

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed")
            buf += chunk
        return buf

    def receive(self, api_key: int, version: int) -> Data:
        _, body = decode_response(api_key, version, self.read_frame())
        return body

    def call(self, api_key: int, version: int, body: Any) -> Data:
        cid = self.send(api_key, version, body)
        got_cid, resp = decode_response(api_key, version, self.read_frame())
        assert got_cid == cid
        return resp
