"""Bounds on calls that may never return, and what an in-process call left behind in the embedded files.

`within(call)` runs `call` on a thread of its own and fails the test if it has not ended in
`WATCHDOG` seconds: a watchdog that turns a hang into a failure, never a stand-in for
synchronisation (every call it watches ends by itself in milliseconds). Whatever the call
raised, `KeyboardInterrupt` and `SystemExit` included, comes back as a value, so a test
can look at it without it ending the test session.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

T = TypeVar("T")

#: Seconds a watched call may take before the test calls it hung.
WATCHDOG = float(os.environ.get("INPROCESS_WATCHDOG", "20"))


@dataclass(frozen=True)
class Ended(Generic[T]):
    """How a watched call ended: its value, or what it raised."""

    value: T | None = None
    error: BaseException | None = None

    def result(self) -> T:
        if self.error is not None:
            raise AssertionError(f"raised {type(self.error).__name__}: {self.error}") from self.error
        return self.value  # type: ignore[return-value]


def start(call: Callable[[], T], name: str = "watched") -> Callable[[float], Ended[T]]:
    """`call` started on a thread now; the returned function waits (at most its argument) for its end."""
    ended: list[Ended[T]] = []

    def run() -> None:
        try:
            ended.append(Ended(value=call()))
        except BaseException as exc:  # every exception is a result here: the test looks at it
            ended.append(Ended(error=exc))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def wait(seconds: float = WATCHDOG) -> Ended[T]:
        thread.join(seconds)
        if thread.is_alive():
            pytest.fail(f"{name} did not return within {seconds:g}s: it hangs")
        return ended[0]

    return wait


def within(call: Callable[[], T], seconds: float = WATCHDOG, name: str = "watched") -> Ended[T]:
    """`call` run on a thread of its own; the test fails if it has not ended in `seconds`."""
    return start(call, name)(seconds)


def _rows(path: str | Path, sql: str) -> list[Any]:
    """Read as another process would: a connection of its own, closed after."""
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def leased(state: str | Path) -> list[tuple[str, str]]:
    """(route, key) of every key whose lease is held in the SQLite state file."""
    return sorted(_rows(state, "SELECT route, key FROM key_state WHERE lease_holder IS NOT NULL"))


def decisions(records: str | Path) -> list[tuple[str, str, str | None]]:
    """(message_id, decision, reason) of every committed decision record, in the order written."""
    try:
        return _rows(records, "SELECT message_id, decision, reason FROM decisions ORDER BY rowid")
    except sqlite3.OperationalError:  # no table yet: nothing was recorded
        return []
