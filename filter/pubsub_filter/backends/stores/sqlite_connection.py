"""One connection of the embedded store, and the thread that waits for the file's lock for it.

A call runs inline on the event loop when the connection is free: a local WAL statement
takes microseconds, far less than a hop to a thread, and on the loop a statement never waits
for the file's lock (`busy_timeout` 0). A call that finds the file locked is undone and made
again, whole, on the connection's own thread, which waits for the lock up to `busy_timeout`
from when the call was made. One caller has the connection at a time (`lock`): while its
thread has it, the loop's calls on this connection go to the thread too, behind it.

The store keeps two of them (`pubsub_filter.backends.stores.sqlite`), a writer and a reader, so
that a read never queues behind a write waiting for another process's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pubsub_filter.backends.sqlite_file import is_locked
from pubsub_filter.core.ports import StoreUnavailable

T = TypeVar("T")


class Locked(StoreUnavailable):
    """Another connection holds the file's lock (SQLITE_BUSY) and the statement waited as long as
    it was allowed to: on the event loop, not at all. From `Connection.now`, also: the connection
    is in use by its thread. Either way the call changed nothing and may be made elsewhere."""


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), usable from the loop and the thread."""
    return sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)


class Connection:
    """`db`, used by one caller at a time (`lock`): the event loop inline, or its own thread."""

    def __init__(self, db: sqlite3.Connection, path: str, busy_timeout: float, role: str):
        self.db = db
        self.path = path
        self.busy_timeout = busy_timeout
        self.lock = threading.Lock()  # held by whoever uses the connection: the loop or the thread
        self._role = role
        self._thread: ThreadPoolExecutor | None = None  # the calls that wait for the file's lock
        self.exec("PRAGMA busy_timeout = 0")  # on the loop: only the thread waits, and says so

    def exec(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            return self.db.execute(sql, params)
        except sqlite3.Error as exc:  # locked beyond busy_timeout, disk I/O, a corrupt file, ...
            error = Locked if is_locked(exc) else StoreUnavailable
            raise error(f"sqlite {self.path}: {exc}") from exc

    def now(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` on the loop, now: `Locked` if the connection is in use (by its thread) or
        the file is locked, and then the call has changed nothing (its single statements did not
        run, and a transaction is rolled back), so it can be made again from the start."""
        if not self.lock.acquire(False):
            raise Locked(f"sqlite {self.path}: the {self._role} connection is in use")
        try:
            return call(*args)
        finally:
            self.lock.release()

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` on the loop if the connection and the file are free (`now`), else on the thread."""
        try:
            return self.now(call, *args)
        except Locked:
            pass
        return await self.on_thread(call, *args)

    def on_thread(self, call: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`call(*args)` on the connection's thread, waiting for the file's lock up to `busy_timeout` from now."""
        deadline = time.monotonic() + self.busy_timeout
        if self._thread is None:
            name = f"sqlite-store-{self._role}-{Path(self.path).name}"
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=name)
        return asyncio.get_running_loop().run_in_executor(self._thread, self.waiting, deadline, call, *args)

    def waiting(self, deadline: float, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)`, its statements waiting for the file's lock until `deadline` (monotonic)."""
        with self.lock:
            self.exec(f"PRAGMA busy_timeout = {max(0, round((deadline - time.monotonic()) * 1000))}")
            try:
                return call(*args)
            finally:
                with contextlib.suppress(StoreUnavailable):
                    self.exec("PRAGMA busy_timeout = 0")

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.shutdown)  # a call under way ends within `busy_timeout`
        # The last connection to a WAL file checkpoints it and removes the log as it closes: file
        # I/O, synced, that must not hold the loop (measured 0.19 s on a busy disk).
        await asyncio.to_thread(self.db.close)
