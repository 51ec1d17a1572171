"""Decision records on the embedded default: readable as soon as the push has answered.

Someone who runs the quick start's curl and then `pubsub-filter skip-rate` at once must see the
decision, and a batch written up to a flush interval later is not there yet. So each request
is answered only once the commit holding its record is done (`committing()`, which
`Engine.recorded` awaits).

The commit never runs on the event loop: a writer thread of this recorder's own does every
insert and commit, so a file locked by someone else (a retention `DELETE`, an open `sqlite3`
shell) or a slow disk holds up the requests waiting for their records, never the loop, the
other requests or `/healthz`. The records made in one event-loop step are handed to the
thread together at the end of the step (`_hand_over`, through a `queue.SimpleQueue`), and the
thread takes every step waiting when it comes back for more: requests that arrive together pay
one commit. Once commits are shared, it waits `COMMIT_WINDOW` (a quarter of a millisecond)
before each, so that the steps of the next few loop turns join it; a lone request is never held
up. Rows are written in the order they were recorded.

What the thread costs is mostly not SQLite's work but the GIL: each time the thread takes it
back while the loop runs, both threads pay futex wake-ups and context switches (uvloop lets
the GIL go around each of its callbacks, and the waiting thread is woken each time). So the
values a step's rows bind are built on the loop (`sqlite.prepared`), and the thread writes
the group in one multi-row INSERT in SQLite's own transaction (`SqliteSink.insert_apart`):
the GIL is taken back three times a commit (the wake-up, after `sqlite3_step`, after the
reset) however many rows it holds, where a `threading.Condition`, a BEGIN, an INSERT a row and
a COMMIT took it back about twice a row. Measured (bench/README.md, P2, c=16, a loaded
machine): the server's CPU per suppressed request 0.91-0.98x the hand-over before in five
paired rounds of six, a sixth to a half of the way to committing on the loop; the writer's CPU
a request up to a third lower.

A locked file is waited for briefly (`LOCK_WAIT`), and once found locked, not again until a
write gets through: meanwhile every commit fails at once. Should a write fail (the file locked,
the disk full), its rows go to the batching recorder instead, which retries them off the request
path; a row that cannot be stored at all (a value SQLite cannot bind) costs only itself, never
the rows it shared the commit with. A row is never lost to an inline failure, only delayed, and
the request is answered as before. At most `max_waiting` rows wait for the thread (a disk far
slower than the requests); past that a new record goes straight to the batching recorder, whose
own buffer is bounded (it drops its oldest rows, counted and logged, when full).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
import time
from collections.abc import Awaitable, Mapping

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.sqlite import Prepared, Refused, SqliteSink, prepared
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.model import DecisionRecord

log = get_logger("pubsub_filter.records")

#: Seconds a commit waits for a file another connection holds locked, before its rows go to the
#: batching recorder: well under what a request may wait for its record.
LOCK_WAIT = 0.025

#: Rows waiting for the writer thread, at most; more go straight to the batching recorder.
MAX_WAITING = 10_000

#: Seconds the writer waits for more steps before a commit, once commits are shared (the last one
#: held more than one row): a commit delay, as databases have. Each commit costs the loop thread
#: the same GIL hand-backs however many rows it holds, and the loop is busiest exactly when
#: requests arrive together. bench/push.py, CPU a request against none: 0.75x at c=4, 0.79x at
#: c=16, the same requests/s and p50; 0.5 ms saved as much but cost requests/s at c=4, 0.1 ms
#: saved less. A lone request (the last commit held one row) never waits.
COMMIT_WINDOW = 0.00025

#: `time.sleep`, as the writer thread's commit delay calls it (a test holds it there)
_pause = time.sleep

#: A step's rows, as handed to the writer thread: the sequence number of its last row, and the rows.
Step = tuple[int, list[Prepared]]


class InlineSqliteRecorder:
    """A `DecisionRecorder`: `record()` queues the row for this step's commit, made by the writer
    thread; `committing()` is that commit; `fallback` takes what fails."""

    def __init__(self, sink: SqliteSink, fallback: BatchingRecorder, *, max_waiting: int = MAX_WAITING) -> None:
        # its own connection, used by the writer thread only: the fallback's batches use the other one
        self.sink = sink
        self.fallback = fallback
        self.max_waiting = max_waiting
        self.written = 0
        self.deferred = 0
        self.commits = 0
        self._loop: asyncio.AbstractEventLoop | None = None  # where the thread reports its commits
        self._step: list[DecisionRecord] = []  # recorded in this loop step, handed over at its end
        self._recorded = 0  # rows recorded so far (their sequence numbers: 1, 2, ...)
        self._done = 0  # rows through which every commit has reported
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        # the steps handed to the writer thread (None: stop), the one thing shared with it
        self._handed: queue.SimpleQueue[Step | None] = queue.SimpleQueue()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._locked = False  # the writer thread's: the last write found the file locked

    # --- the request path (the event loop's thread) -----------------------------------------

    def record(self, record: DecisionRecord) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to hold up: written now, on the caller's thread
            self._report(1, self._insert([prepared(record)]))
            return
        if self._stopping:
            self._defer(record, "closed")  # no writer any more: the batching recorder counts it dropped
            return
        if self._recorded - self._done >= self.max_waiting:
            self._defer(record, "waiting")  # the writer is far behind: its queue is full
            return
        self._loop = loop
        if not self._step:
            loop.call_soon(self._hand_over)
        self._step.append(record)
        self._recorded += 1

    def outcomes(self) -> Mapping[str, int]:
        """Its own rows written, and the fallback's: every row it could not write went there."""
        handed_on = self.fallback.outcomes()
        return {**handed_on, "written": self.written + handed_on["written"]}

    def committing(self) -> Awaitable[None] | None:
        """None when every record recorded so far is written (or handed to the fallback), else the
        commit that will write them. Each caller gets a future of its own: one that is cancelled
        (its request gone) must not cancel the commit the others wait for."""
        if self._done >= self._recorded:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._recorded, waiter))
        return waiter

    def _hand_over(self) -> None:
        """The end of a step: its records go to the writer thread, in one piece, with the values
        their INSERT binds built here, so that the thread runs little more than SQLite (each time
        it takes the GIL back while the loop runs costs both threads a wake-up)."""
        rows, self._step = self._step, []
        if not rows:
            return
        self._handed.put((self._recorded, [prepared(r) for r in rows]))
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_all, name="records-inline-writer", daemon=True)
            self._thread.start()

    def _committed(self, through: int, count: int, refused: Refused) -> None:
        """The writer thread's report, run on the loop: rows through `through` are written or refused."""
        self._report(count, refused)
        self._done = max(self._done, through)
        waiters = self._waiters
        while waiters and waiters[0][0] <= through:
            waiter = waiters.popleft()[1]
            if not waiter.done():
                waiter.set_result(None)

    def _report(self, count: int, refused: Refused) -> None:
        self.commits += 1
        self.written += count - len(refused)
        for row, why in refused:
            self._defer(row, f"{type(why).__name__}: {why}")

    def _defer(self, row: DecisionRecord, why: str) -> None:
        self.deferred += 1
        log.warning("records_write_deferred", sink="sqlite", error=why)
        self.fallback.record(row)

    # --- the writer thread ----------------------------------------------------------------------

    def _write_all(self) -> None:
        self._wait_for_lock(LOCK_WAIT)
        handed = self._handed
        shared = False  # the last commit held more than one row: requests are arriving together
        while True:
            steps = [handed.get()]  # waits with the GIL released
            if shared and steps[0] is not None:
                _pause(COMMIT_WINDOW)  # the commit delay: the steps handed over meanwhile join this commit
            while not handed.empty():  # the steps handed over while it committed: one commit for all
                steps.append(handed.get())
            stopping = steps[-1] is None  # close puts it last
            waiting = [step for step in steps if step is not None]
            if waiting:
                rows = waiting[0][1] if len(waiting) == 1 else [row for _, step in waiting for row in step]
                self._report_threadsafe(waiting[-1][0], len(rows), self._insert(rows))
                shared = len(rows) > 1
            if stopping:
                return

    def _report_threadsafe(self, through: int, count: int, refused: Refused) -> None:
        try:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._committed, through, count, refused)
        except RuntimeError:  # the loop is closed: nobody waits, and nothing is left to defer to
            log.error("records_write_unreported", sink="sqlite", rows=count, refused=len(refused))

    def _insert(self, rows: list[Prepared]) -> Refused:
        try:
            refused = self.sink.insert_apart(rows)
        except Exception as failed:
            refused = [(r[0], failed) for r in rows]
            if not self._locked and "locked" in str(failed):
                self._locked = True
                self._wait_for_lock(0.0)  # found locked: the next commits do not wait for it again
            return refused
        if self._locked:
            self._locked = False
            self._wait_for_lock(LOCK_WAIT)
        return refused

    def _wait_for_lock(self, seconds: float) -> None:
        # a connection that cannot take the setting cannot write either: its writes fail, and are deferred
        with contextlib.suppress(Exception):
            self.sink.wait_for_lock(seconds)

    # --- flush and close (the event loop's thread) ------------------------------------------

    async def _written(self) -> None:
        """Until every record recorded so far is written or handed to the fallback."""
        self._hand_over()
        committing = self.committing()
        if committing is not None:
            await committing

    async def flush(self) -> None:
        await self._written()
        await self.fallback.flush()

    async def close(self, deadline: float | None = None) -> None:
        try:
            try:
                async with asyncio.timeout(deadline):
                    await self._written()  # a step's records whose hand-over has not run yet included
            except TimeoutError:
                log.error("records_close_deadline", sink="sqlite", deadline=deadline, rows=self._recorded - self._done)
            finally:
                await self._stop()
            await self.fallback.close(deadline)
        finally:
            if self._thread is None or not self._thread.is_alive():
                await self.sink.close()

    async def _stop(self) -> None:
        # a step recorded since `_written` goes to the writer before it stops; records from now on are deferred
        self._hand_over()
        self._stopping = True
        self._handed.put(None)
        thread = self._thread
        if thread is not None:
            # what it is writing now is at most one commit, and a lock is waited for LOCK_WAIT at most
            await asyncio.to_thread(thread.join, 5.0)
