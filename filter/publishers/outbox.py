"""The embedded publisher: append each message to a JSON-lines file (the local stand-in for a topic)."""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import msgspec

from ..ports import PublishFailed


class OutboxPublisher:
    """One line per publish: destination, data (base64), attributes, ordering key, id, time.

    Each line is written with a single `write()` on an O_APPEND descriptor, so lines from
    several processes never interleave.
    """

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._lock = threading.Lock()
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    async def publish(
        self,
        destination: str,
        data: bytes,
        attributes: Mapping[str, str],
        ordering_key: str | None = None,
    ) -> str:
        message_id = uuid.uuid4().hex
        line = msgspec.json.encode(
            {
                "id": message_id,
                "time": time.time(),
                "destination": destination,
                "data": base64.b64encode(data).decode(),
                "attributes": dict(attributes),
                "ordering_key": ordering_key,
            }
        )
        try:
            with self._lock:
                os.write(self._open(), line + b"\n")
        except OSError as exc:
            raise PublishFailed(f"cannot append to {self.path}: {exc}") from exc
        return message_id

    async def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_outbox(path: str | Path) -> list[dict[str, object]]:
    """Every message in an outbox file, oldest first (for tests, examples and curious users)."""
    p = Path(path)
    if not p.exists():
        return []
    return [msgspec.json.decode(line) for line in p.read_bytes().splitlines() if line.strip()]
