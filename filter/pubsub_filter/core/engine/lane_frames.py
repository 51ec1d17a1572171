"""The frames between the engine and its large-message process (`lane_process`, `lane_worker`):
one pickled value each, after its length (8 bytes, big-endian), over a socket pair.

Pickle, because what crosses is the engine's own values (a `Message`, a `KeyState`, a
`Decided`) between a process and the child it started, over a socket no one else holds: no
other party can write to it. Protocol 5 copies a message's bytes once each way."""

from __future__ import annotations

import pickle
import socket
from typing import Any

_LENGTH = 8


def send(sock: socket.socket, value: Any) -> None:
    data = pickle.dumps(value, protocol=5)
    sock.sendall(len(data).to_bytes(_LENGTH, "big"))
    sock.sendall(data)


def receive(sock: socket.socket) -> Any:
    """The next value; raises `EOFError` when the other side has closed its end."""
    size = int.from_bytes(_exactly(sock, _LENGTH), "big")
    return pickle.loads(_exactly(sock, size))


def _exactly(sock: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the other side closed the socket")
        got += n
    return buf
