"""Processes that open the same fresh SQLite files at the same moments (tests/unit/test_sqlite_opening.py).

Run in a spawned process: `open_each` opens every path in turn with one of the product's
openers, meeting its siblings at a barrier before each, and reports what failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from multiprocessing.synchronize import Barrier
from typing import Any


def opener(kind: str) -> Callable[[str], Any]:
    if kind == "store":
        from pubsub_filter.backends.stores.sqlite import SqliteStore

        return SqliteStore
    if kind == "records":
        from pubsub_filter.backends.records.sqlite import SqliteSink

        return SqliteSink
    from pubsub_filter.consumer.stores.sqlite import SqliteFences

    return SqliteFences


def open_each(kind: str, paths: Sequence[str], barrier: Barrier, failures: Any) -> None:
    open_ = opener(kind)
    failed = []
    for path in paths:
        barrier.wait(timeout=60)
        try:
            open_(path)
        except Exception as exc:
            failed.append(f"{path}: {exc!r}")
    failures.put(failed)
