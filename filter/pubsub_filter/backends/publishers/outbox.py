"""The embedded publisher: append each message to a JSON-lines file (the local stand-in for a topic).

What a confirmed publish guarantees: the whole line, newline included, is in the file
(the kernel's page cache) before `publish` returns, so it survives the process crashing
or being killed. A machine crash (power loss, kernel panic) may still lose the lines of
the last few seconds, unless the publisher was built with `fsync=True`, which flushes
each line to the disk before confirming it (one `fdatasync` per message: milliseconds on
most disks, so off by default).

A write that cannot be completed (disk full, file size limit) is undone and the publish
fails, so the message is nacked and comes back: a torn line is never confirmed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pubsub_filter.core.engine.offload import OFF_LOOP_BYTES
from pubsub_filter.core.ports import PublishFailed

#: Below this much free space on the outbox's file system, `ping` says not ready.
MIN_FREE_BYTES = 64 * 1024


class OutboxPublisher:
    """One line per publish: destination, data (base64), attributes, ordering key, id, time.

    Several processes may append to one file: each append holds an exclusive `flock` on
    it, so a failed write can be truncated away without cutting off another process's
    line, and a line left torn by anything else (a writer killed mid-write) is closed
    with a newline before the next one. When the path stops naming the file that is
    open (deleted, rotated), the path is opened again: appending to an unlinked file
    would confirm messages nobody can read. That is checked again once the lock is held, so a
    shipper that renames the file, locks it, reads it and deletes it misses no line.
    """

    def __init__(self, path: str | Path, *, fsync: bool = False):
        self.path = str(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None

    def _names_open_file(self) -> bool:
        """Whether the path still names the file that is open (not deleted, not renamed away)."""
        assert self._fd is not None
        try:
            named, held = os.stat(self.path), os.fstat(self._fd)
        except FileNotFoundError:
            return False
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def _current(self) -> int:
        """The descriptor of the file the path names now (opening it if needed); call under `_lock`."""
        if self._fd is not None:
            if self._names_open_file():
                return self._fd
            os.close(self._fd)
            self._fd = None
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _locked(self, wait: bool) -> int | None:
        """The current file's descriptor, flock'ed; call under `_lock`. None when `wait` is False
        and another process holds the lock.

        The path is checked again once the lock is held: a shipper may rename the file between
        the first check and the lock, then lock, read and delete it, and a line appended after
        that would be confirmed into a deleted file. Checked under the lock, a rename that comes
        later still finds this append in the renamed file: the shipper's lock waits for it.
        """
        while True:
            fd = self._current()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            if self._names_open_file():
                return fd
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _append(self, line: bytes, wait: bool = True) -> bool:
        """Append `line` under the locks; False (nothing written) when `wait` is False and a lock is held."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            fd = self._locked(wait)
            if fd is None:
                return False
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
                written = 0
                try:
                    while written < len(line):
                        n = os.write(fd, line[written:])
                        if n == 0:
                            raise OSError(errno.EIO, "write() made no progress")
                        written += n
                    if self.fsync:
                        os.fdatasync(fd)
                except OSError:
                    if written:
                        # Nobody else appended meanwhile (we hold the lock): cut the torn line off.
                        # If even that fails, the next append starts on a fresh line.
                        with contextlib.suppress(OSError):
                            os.ftruncate(fd, size)
                    raise
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return True
        finally:
            self._lock.release()

    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        message_id = uuid.uuid4().hex
        line_of = (message_id, time.time(), destination, data, dict(attributes), ordering_key)
        try:
            if len(data) >= OFF_LOOP_BYTES:
                # a large message's base64, its line and its write take 0.1-0.2 s: not on the event loop
                await asyncio.to_thread(lambda: self._append(_line(*line_of)))
                return message_id
            line = _line(*line_of)
            # A disk flush takes milliseconds, and a lock another process holds (a shipper reading
            # the file) as long as it likes: neither is waited for on the event loop.
            if self.fsync or not self._append(line, wait=False):
                await asyncio.to_thread(self._append, line)
        except OSError as exc:
            raise PublishFailed(f"cannot append to {self.path}: {exc}") from exc
        return message_id

    async def ping(self) -> None:
        """Raise when an append would certainly fail: the file cannot be opened, or its disk is full."""
        if not self._lock.acquire(blocking=False):
            return  # an append is under way (waiting for another process's lock): it will say how it went
        try:
            fd = self._current()
            fs = os.fstatvfs(fd)
        finally:
            self._lock.release()
        # root may write into the blocks reserved for it
        free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize
        if free < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, f"{free} bytes free for {self.path}")

    async def close(self) -> None:
        await asyncio.to_thread(self._close)  # an append may hold the lock, waiting for another process's

    def _close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


@dataclass(frozen=True)
class BadLine:
    """A line of an outbox file that is not a message: where it is and why."""

    line: int  # 1-based
    offset: int  # byte offset of its start
    reason: str
    preview: bytes  # its first bytes

    def __str__(self) -> str:
        return f"line {self.line} (byte {self.offset}): {self.reason}: {self.preview!r}"


@dataclass
class OutboxContents:
    messages: list[dict[str, Any]] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


_decode_line = msgspec.json.Decoder(dict[str, Any]).decode


def read_outbox(path: str | Path) -> OutboxContents:
    """Every message in an outbox file, oldest first, and every line that is not one.

    A torn line (a write that was cut short and could not be undone, or one still being
    written) is reported in `bad` and the lines around it are still read.
    """
    p = Path(path)
    out = OutboxContents()
    if not p.exists():
        return out
    raw = p.read_bytes()
    offset = 0
    for number, text in enumerate(raw.split(b"\n"), 1):
        start, offset = offset, offset + len(text) + 1
        if not text.strip():
            continue
        if offset > len(raw):
            out.bad.append(BadLine(number, start, "torn: no newline at the end of the file", text[:80]))
            continue
        try:
            out.messages.append(_decode_line(text))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            out.bad.append(BadLine(number, start, f"not a message: {exc}", text[:80]))
    return out


def _line(
    message_id: str, at: float, destination: str, data: bytes, attributes: dict[str, str], ordering_key: str | None
) -> bytes:
    """One outbox line, its newline included."""
    fields = {
        "id": message_id,
        "time": at,
        "destination": destination,
        "data": base64.b64encode(data).decode(),
        "attributes": attributes,
        "ordering_key": ordering_key,
    }
    return msgspec.json.encode(fields) + b"\n"
