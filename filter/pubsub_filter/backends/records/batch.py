"""Decision records off the request path: a bounded buffer drained in batches by one task.

`BatchingRecorder.record()` only appends to an in-memory buffer; a background asyncio
task hands the rows to a `Sink` (BigQuery, a file, ...) in batches, retries a failed
batch a few times with backoff, and then gives it up. A slow or failing sink therefore
costs rows, never latency or errors on the request path.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential

from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.model import DecisionRecord

log = get_logger("pubsub_filter.records")

#: The shortest gap between two `records_dropped` log events.
DROP_LOG_INTERVAL = 1.0


class Sink(Protocol):
    """Where batches of decision records end up. `write` raises when the rows were not stored."""

    name: str

    async def write(self, rows: list[DecisionRecord]) -> None: ...

    async def close(self) -> None: ...


class BatchingRecorder:
    """A `DecisionRecorder` that writes to `sink` in batches from a background task.

    - `record()` is synchronous, O(1) and never blocks or raises: it appends the row to a
      buffer and, when a threshold is crossed, wakes the writer task.
    - The writer task starts lazily on the first `record()` made inside a running event
      loop, or with `start()`; `__init__` creates no task, so a recorder may be built
      before the loop exists.
    - A batch is written when `batch_size` rows are waiting or the oldest waiting row is
      `flush_interval` seconds old (measured with `clock`).
    - A failed write is retried (`retry_attempts` attempts in all, exponential backoff
      starting at `retry_backoff` seconds); then the batch is dropped, counted in
      `failed_batches` and `dropped`, and logged as `records_write_failed`.
    - **The buffer is bounded.** At most `max_buffer` rows wait (plus the one batch being
      written). When the buffer is full, the OLDEST waiting row is dropped for each new
      one, so memory stays bounded and the newest decisions survive a sink outage. Drops
      are counted in `dropped` and logged as `records_dropped` at most once per second.
    - `flush()` writes everything waiting at the time of the call (and waits for a write
      already under way); `close()` flushes, stops the task and closes the sink (within
      an optional deadline). Rows recorded after `close()` are dropped and counted.

    Counters, for tests and health checks: `written` (rows the sink accepted), `dropped`
    (rows lost for any reason: buffer overflow, failed batches, recorded after close),
    `failed_batches` (batches given up after all attempts); `pending` is the number of
    rows waiting.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        batch_size: int = 500,
        flush_interval: float = 5.0,
        max_buffer: int = 50_000,
        retry_attempts: int = 3,
        retry_backoff: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if batch_size < 1 or max_buffer < 1 or retry_attempts < 1:
            raise ValueError("batch_size, max_buffer and retry_attempts must be at least 1")
        if flush_interval <= 0:
            raise ValueError("flush_interval must be positive")
        self.sink = sink
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.retry_attempts = retry_attempts
        self.retry_backoff = retry_backoff
        self._clock = clock

        self.written = 0
        self.retried = 0  # rows of batches whose first write failed (written or dropped since)
        self.dropped = 0
        self.failed_batches = 0

        # (time recorded by `clock`, record), oldest on the left
        self._buffer: collections.deque[tuple[float, DecisionRecord]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._write_lock: asyncio.Lock | None = None
        self._stopping = False  # close() has begun: no new task, the task winds down
        self._closed = False  # close() has drained the buffer: new rows are dropped
        self._unlogged_drops = 0
        self._last_drop_log: float | None = None

    # --- the request path ---------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def committing(self) -> None:
        """Nothing to wait for: a batch is written later, off the request path, by design."""
        return None

    def record(self, record: DecisionRecord) -> None:
        """Queue one record; never blocks, never raises."""
        try:
            now = self._clock()
            if self._closed:
                self._drop(1, now, reason="closed")
                return
            buf = self._buffer
            if len(buf) >= self.max_buffer:
                buf.popleft()
                self._drop(1, now, reason="buffer_full")
            buf.append((now, record))
            if self._task is None or self._task.done():
                self._start_if_loop()
            wake = self._wake
            if wake is not None and (
                len(buf) == 1 or len(buf) >= self.batch_size or now - buf[0][0] >= self.flush_interval
            ):
                wake.set()
        except Exception:  # pragma: no cover - a recorder must never break a request
            log.exception("records_record_failed", sink=self.sink.name)

    def _drop(self, n: int, now: float, *, reason: str) -> None:
        self.dropped += n
        self._unlogged_drops += n
        if self._drop_log_due(now):
            self._log_drops(now, reason)

    def _drop_log_due(self, now: float) -> bool:
        return self._last_drop_log is None or now - self._last_drop_log >= DROP_LOG_INTERVAL

    def _log_drops(self, now: float, reason: str) -> None:
        log.warning(
            "records_dropped",
            sink=self.sink.name,
            rows=self._unlogged_drops,
            total=self.dropped,
            reason=reason,
            max_buffer=self.max_buffer,
        )
        self._unlogged_drops = 0
        self._last_drop_log = now

    # --- the writer task ----------------------------------------------------------

    def start(self) -> None:
        """Start the writer task (needs a running loop). Idempotent; a no-op once closing."""
        if self._stopping or self._closed:
            return
        loop = asyncio.get_running_loop()
        task = self._task
        if task is not None and not task.done():
            return
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("records_writer_died", sink=self.sink.name, error=repr(task.exception()))
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run(), name=f"records-writer:{self.sink.name}")
        if self._buffer:
            self._wake.set()

    def _start_if_loop(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: rows wait for start() or a record() inside the loop
        self.start()

    def _lock(self) -> asyncio.Lock:
        if self._write_lock is None:
            self._write_lock = asyncio.Lock()
        return self._write_lock

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while not self._stopping:
            wake.clear()
            if self._unlogged_drops and self._drop_log_due(self._clock()):
                self._log_drops(self._clock(), "buffer_full")
            if not self._buffer:
                await wake.wait()
                continue
            age = self._clock() - self._buffer[0][0]
            if len(self._buffer) >= self.batch_size or age >= self.flush_interval:
                await self._write_next(self.batch_size)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=self.flush_interval - age)

    async def _write_next(self, limit: int) -> int:
        """Take up to `limit` rows off the buffer and write them; the number taken."""
        async with self._lock():
            n = min(limit, len(self._buffer))
            if n:
                await self._write([self._buffer.popleft()[1] for _ in range(n)])
            return n

    async def _write(self, rows: list[DecisionRecord]) -> None:
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.retry_attempts),
                wait=wait_exponential(multiplier=self.retry_backoff, max=max(self.retry_backoff, 30.0)),
                reraise=True,
            ):
                with attempt:
                    if attempt.retry_state.attempt_number == 2:
                        self.retried += len(rows)
                    await self.sink.write(rows)
        except asyncio.CancelledError:
            # close(deadline=...) ran out, or the loop is shutting down: the batch is lost
            # (a thread already inside the client may still finish the insert)
            self.dropped += len(rows)
            log.error("records_write_cancelled", sink=self.sink.name, rows=len(rows))
            raise
        except Exception as exc:
            self.failed_batches += 1
            self.dropped += len(rows)
            log.error(
                "records_write_failed",
                sink=self.sink.name,
                rows=len(rows),
                error=f"{type(exc).__name__}: {exc}",
                attempts=self.retry_attempts,
            )
        else:
            self.written += len(rows)

    # --- flush and close ------------------------------------------------------------

    def outcomes(self) -> Mapping[str, int]:
        return {"written": self.written, "retried": self.retried, "dropped": self.dropped}

    async def flush(self) -> None:
        """Write every row waiting now (in batches), after any write already under way."""
        if not self._stopping and not self._closed:
            self.start()
        remaining = len(self._buffer)
        while remaining > 0:
            taken = await self._write_next(min(self.batch_size, remaining))
            if taken == 0:
                break
            remaining -= taken

    async def close(self, deadline: float | None = None) -> None:
        """Write everything waiting, stop the writer task, then close the sink.

        Rows recorded while `close()` runs are still written; rows recorded after it
        returns are dropped. Sink errors are logged and counted, never raised. With
        `deadline` (seconds), whatever is not written by then is dropped and counted, so
        a hung sink cannot hold up shutdown past its share of the stop.
        """
        if self._stopping or self._closed:
            return
        self._stopping = True
        try:
            async with asyncio.timeout(deadline):
                await self._drain()
        except TimeoutError:
            lost = len(self._buffer)
            self._buffer.clear()
            if lost:
                self._drop(lost, self._clock(), reason="close_deadline")
            log.error("records_close_deadline", sink=self.sink.name, deadline=deadline, dropped=self.dropped)
        self._closed = True
        if self._unlogged_drops:
            self._log_drops(self._clock(), "closed")
        try:
            await self.sink.close()
        except Exception as exc:
            log.error("records_sink_close_failed", sink=self.sink.name, error=f"{type(exc).__name__}: {exc}")

    async def _drain(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            if self._wake is not None:
                self._wake.set()
            # the task finishes the batch it is writing, if any, then returns
            await asyncio.gather(task, return_exceptions=True)
        async with self._lock():
            while self._buffer:
                n = min(self.batch_size, len(self._buffer))
                await self._write([self._buffer.popleft()[1] for _ in range(n)])
            self._closed = True
