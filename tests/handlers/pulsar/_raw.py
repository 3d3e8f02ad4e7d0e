"""A Pulsar client made of our own codec and a blocking socket, for commands and byte
sequences the official client never sends."""

from __future__ import annotations

import socket
import time

from handlers.pulsar import _events as ev
from handlers.pulsar._codec import NEED_DATA, PulsarConnection, Role

TIMEOUT = 10.0


class RawClient:
    def __init__(self, url: str, *, receive_buffer: int | None = None):
        host, port = url.removeprefix("pulsar://").rsplit(":", 1)
        if receive_buffer is None:
            self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        else:  # set before connecting, so that the window the peer sees is small too
            self.sock = socket.socket()
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self.sock.settimeout(TIMEOUT)
            self.sock.connect((host, int(port)))
        self.codec = PulsarConnection(Role.CLIENT)

    def send(self, event) -> None:
        self.sock.sendall(self.codec.send(event))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_event(self):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            event = self.codec.next_event()
            if event is not NEED_DATA:
                return event
            data = self.sock.recv(65536)
            self.codec.receive_data(data)
        raise TimeoutError("no event from the broker")

    def read_raw_until_closed(self) -> bytes:
        got = b""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            data = self.sock.recv(65536)
            if not data:
                return got
            got += data
        raise TimeoutError("the broker did not close the connection")

    def connect(self, client_version: str = "raw-test", protocol_version: int = 21) -> None:
        self.send(ev.CommandConnect.build(client_version=client_version,
                                          protocol_version=protocol_version))
        assert isinstance(self.next_event(), ev.CommandConnected)

    def close(self) -> None:
        self.sock.close()
