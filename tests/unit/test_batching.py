"""BatchingRecorder against an in-memory sink of our own (the Sink protocol is ours)."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from structlog.testing import capture_logs

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.core.model import Decision, DecisionRecord


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeSink:
    name = "fake"

    def __init__(self, *, fail_first: int = 0, fail_always: bool = False) -> None:
        self.batches: list[list[DecisionRecord]] = []
        self.calls = 0
        self.fail_first = fail_first
        self.fail_always = fail_always
        self.gate: asyncio.Event | None = None  # when set up, writes wait for it
        self.wrote = asyncio.Event()
        self.closed = False
        self.close_error: Exception | None = None

    async def write(self, rows: list[DecisionRecord]) -> None:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_always or self.calls <= self.fail_first:
            raise RuntimeError(f"sink down (call {self.calls})")
        self.batches.append(list(rows))
        self.wrote.set()

    async def close(self) -> None:
        self.closed = True
        if self.close_error:
            raise self.close_error

    @property
    def rows(self) -> list[DecisionRecord]:
        return [r for b in self.batches for r in b]


def rec(i: int, route: str = "r") -> DecisionRecord:
    return DecisionRecord(time=float(i), route=route, decision=Decision.FORWARDED, enforced=True, message_id=str(i))


async def settle(rounds: int = 20) -> None:
    """Let every ready task run (no wall-clock waiting)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def next_write(sink: FakeSink) -> None:
    await asyncio.wait_for(sink.wrote.wait(), timeout=5)
    sink.wrote.clear()


def test_record_is_plain_sync_and_needs_no_loop() -> None:
    assert not inspect.iscoroutinefunction(BatchingRecorder.record)
    sink = FakeSink()  # no running loop in this test
    recorder = BatchingRecorder(sink, batch_size=10)
    for i in range(3):
        recorder.record(rec(i))  # no running loop: buffered, no task
    assert recorder.pending == 3
    assert recorder._task is None

    async def later() -> None:
        await recorder.close()

    asyncio.run(later())
    assert [r.message_id for r in sink.rows] == ["0", "1", "2"]
    assert recorder.written == 3 and sink.closed


async def test_size_threshold_writes_a_batch() -> None:
    sink, clock = FakeSink(), FakeClock()
    recorder = BatchingRecorder(sink, batch_size=3, flush_interval=1000, clock=clock)
    recorder.record(rec(0))
    recorder.record(rec(1))
    await settle()
    assert sink.calls == 0
    recorder.record(rec(2))
    await next_write(sink)
    assert [[r.message_id for r in b] for b in sink.batches] == [["0", "1", "2"]]
    assert recorder.written == 3 and recorder.pending == 0
    await recorder.close()


async def test_size_threshold_splits_into_batches() -> None:
    sink, clock = FakeSink(), FakeClock()
    recorder = BatchingRecorder(sink, batch_size=4, flush_interval=1000, clock=clock)
    for i in range(10):
        recorder.record(rec(i))
    await next_write(sink)
    await settle()
    assert [len(b) for b in sink.batches] == [4, 4]
    assert recorder.pending == 2  # below the size and not old: waits
    await recorder.close()
    assert [len(b) for b in sink.batches] == [4, 4, 2]
    assert [r.message_id for r in sink.rows] == [str(i) for i in range(10)]


async def test_age_threshold_with_injected_clock() -> None:
    sink, clock = FakeSink(), FakeClock(100.0)
    recorder = BatchingRecorder(sink, batch_size=1000, flush_interval=5.0, clock=clock)
    recorder.record(rec(0))
    clock.t = 104.9
    recorder.record(rec(1))
    await settle()
    assert sink.calls == 0, "nothing is old enough yet"
    clock.t = 105.0  # the oldest row is now flush_interval old
    recorder.record(rec(2))
    await next_write(sink)
    assert [[r.message_id for r in b] for b in sink.batches] == [["0", "1", "2"]]
    await recorder.close()


async def test_age_threshold_fires_without_further_records() -> None:
    # the timer path: no new record arrives to notice the age; the writer's own deadline does
    sink = FakeSink()
    recorder = BatchingRecorder(sink, batch_size=1000, flush_interval=0.02)
    recorder.record(rec(0))
    await next_write(sink)
    assert [r.message_id for r in sink.rows] == ["0"]
    await recorder.close()


async def test_buffer_bounded_drops_oldest_and_counts() -> None:
    sink, clock = FakeSink(), FakeClock()
    sink.gate = asyncio.Event()  # the sink hangs until we open it
    recorder = BatchingRecorder(sink, batch_size=10, flush_interval=1.0, max_buffer=100, clock=clock)
    with capture_logs() as logs:
        for i in range(10):
            recorder.record(rec(i))
        await settle()  # the writer takes rows 0..9 and hangs in the sink
        assert sink.calls == 1 and recorder.pending == 0
        for i in range(10, 10_010):
            recorder.record(rec(i))
        assert recorder.pending == 100, "the buffer never grows past max_buffer"
        assert recorder.dropped == 10_000 - 100
        drop_events = [e for e in logs if e["event"] == "records_dropped"]
        assert len(drop_events) == 1, "at most one drop event per second"
        assert drop_events[0]["sink"] == "fake" and drop_events[0]["rows"] == 1
        clock.t = 1.5
        recorder.record(rec(10_010))  # a second later: one more event, with the tally
        drop_events = [e for e in logs if e["event"] == "records_dropped"]
        assert len(drop_events) == 2 and drop_events[1]["rows"] == 10_000 - 100
        sink.gate.set()
        await recorder.close()
    kept = [int(r.message_id) for r in sink.rows]
    assert kept == [*range(10), *range(10_011 - 100, 10_011)], "the newest rows survive"
    assert recorder.written == 110 and recorder.dropped == 10_001 - 100


async def test_slow_sink_never_blocks_record() -> None:
    sink = FakeSink()
    sink.gate = asyncio.Event()
    recorder = BatchingRecorder(sink, batch_size=50, max_buffer=1000)
    for i in range(50):
        recorder.record(rec(i))
    await settle()
    assert sink.calls == 1  # the writer is stuck inside write()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    await settle()
    before = ticks
    for i in range(10_000):
        recorder.record(rec(i))
    assert ticks == before, "the loop never turned: record() did not await anything"
    assert recorder.pending == 1000 and recorder.dropped == 9000
    sink.gate.set()
    await recorder.close()
    tick_task.cancel()
    assert recorder.written == 1050


async def test_retry_then_drop_is_counted_and_logged() -> None:
    sink = FakeSink(fail_always=True)
    recorder = BatchingRecorder(sink, batch_size=100, retry_attempts=3, retry_backoff=0)
    for i in range(5):
        recorder.record(rec(i))
    with capture_logs() as logs:
        await recorder.flush()
    assert sink.calls == 3
    assert recorder.failed_batches == 1 and recorder.dropped == 5 and recorder.written == 0
    failed = [e for e in logs if e["event"] == "records_write_failed"]
    assert len(failed) == 1
    assert failed[0]["sink"] == "fake" and failed[0]["rows"] == 5
    assert "sink down" in failed[0]["error"] and failed[0]["log_level"] == "error"
    # the recorder keeps working after a dropped batch
    sink.fail_always = False
    recorder.record(rec(9))
    await recorder.close()
    assert [r.message_id for r in sink.rows] == ["9"] and recorder.written == 1


async def test_retry_succeeds_before_giving_up() -> None:
    sink = FakeSink(fail_first=2)
    recorder = BatchingRecorder(sink, batch_size=100, retry_attempts=3, retry_backoff=0)
    for i in range(5):
        recorder.record(rec(i))
    await recorder.flush()
    assert sink.calls == 3 and recorder.written == 5
    assert recorder.failed_batches == 0 and recorder.dropped == 0
    await recorder.close()


async def test_flush_writes_everything_waiting() -> None:
    sink = FakeSink()
    recorder = BatchingRecorder(sink, batch_size=4, flush_interval=1000, clock=FakeClock())
    for i in range(3):
        recorder.record(rec(i))
    await recorder.flush()
    assert [r.message_id for r in sink.rows] == ["0", "1", "2"] and recorder.pending == 0
    assert not sink.closed
    await recorder.close()


async def test_close_flushes_stops_and_closes_sink() -> None:
    sink = FakeSink()
    recorder = BatchingRecorder(sink, batch_size=5, flush_interval=1000, clock=FakeClock())
    for i in range(7):
        recorder.record(rec(i))
    task = recorder._task
    assert task is not None
    await recorder.close()
    assert task.done()
    assert sink.closed and recorder.written == 7 and recorder.pending == 0
    assert sorted(len(b) for b in sink.batches) == [2, 5]
    recorder.record(rec(99))  # after close: dropped and counted, not raised
    assert recorder.dropped == 1 and recorder.pending == 0
    await recorder.close()  # idempotent


async def test_close_with_failing_sink_does_not_raise() -> None:
    sink = FakeSink(fail_always=True)
    sink.close_error = RuntimeError("close failed")
    recorder = BatchingRecorder(sink, batch_size=5, retry_attempts=2, retry_backoff=0)
    for i in range(12):
        recorder.record(rec(i))
    await recorder.close()
    assert recorder.failed_batches == 3 and recorder.dropped == 12 and recorder.written == 0


async def test_close_deadline_bounds_a_hung_sink() -> None:
    sink = FakeSink()
    sink.gate = asyncio.Event()  # never opened: the sink hangs forever
    recorder = BatchingRecorder(sink, batch_size=5, flush_interval=1000, clock=FakeClock())
    for i in range(12):
        recorder.record(rec(i))
    await settle()
    assert sink.calls == 1  # rows 0..4 are stuck in the sink
    with capture_logs() as logs:
        await recorder.close(deadline=0.05)
    await settle()
    assert sink.closed and recorder.written == 0
    assert recorder.dropped == 12 and recorder.pending == 0, "the hung batch and the waiting rows"
    events = {e["event"] for e in logs}
    assert {"records_close_deadline", "records_dropped"} <= events


async def test_records_made_during_close_are_written() -> None:
    sink = FakeSink()
    sink.gate = asyncio.Event()
    recorder = BatchingRecorder(sink, batch_size=2, flush_interval=1000, clock=FakeClock())
    recorder.record(rec(0))
    recorder.record(rec(1))
    await settle()
    closing = asyncio.create_task(recorder.close())
    await settle()
    recorder.record(rec(2))  # a request finishing while we shut down
    sink.gate.set()
    await closing
    assert [r.message_id for r in sink.rows] == ["0", "1", "2"]


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        BatchingRecorder(FakeSink(), batch_size=0)
    with pytest.raises(ValueError):
        BatchingRecorder(FakeSink(), flush_interval=0)
