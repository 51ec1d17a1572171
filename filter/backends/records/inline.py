"""Decision records on the embedded default: readable as soon as the push has answered.

Someone who runs the README's curl and then `pubsub-filter skip-rate` at once must see the
decision, and a batch written up to a flush interval later is not there yet. On one
machine a SQLite row costs tens of microseconds (WAL, `synchronous=NORMAL`, and the state
store already writes inline on this backend), so each record is written inline, before
the engine returns. Should that write fail (the file locked past its timeout, the disk
full), the row goes to the batching recorder instead, which retries it off the request
path: a row is never lost to an inline failure, only delayed.
"""

from __future__ import annotations

import structlog

from filter.backends.records.batch import BatchingRecorder
from filter.backends.records.sqlite import SqliteSink
from filter.core.model import DecisionRecord

log = structlog.get_logger("pubsub_filter.records")


class InlineSqliteRecorder:
    """A `DecisionRecorder`: `record()` writes the row now; `fallback` takes it if that fails."""

    def __init__(self, sink: SqliteSink, fallback: BatchingRecorder) -> None:
        # its own connection: the fallback's writer thread uses the other one
        self.sink = sink
        self.fallback = fallback
        self.written = 0
        self.deferred = 0

    def record(self, record: DecisionRecord) -> None:
        try:
            self.sink.insert([record])
        except Exception as exc:
            self.deferred += 1
            log.warning("records_write_deferred", sink="sqlite", error=f"{type(exc).__name__}: {exc}")
            self.fallback.record(record)
        else:
            self.written += 1

    async def flush(self) -> None:
        await self.fallback.flush()

    async def close(self, deadline: float | None = None) -> None:
        try:
            await self.fallback.close(deadline)
        finally:
            await self.sink.close()
