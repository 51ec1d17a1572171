"""Large messages decided in a process of their own (`core.engine.lane_process`, what `serve`
and `pull` run): the same decisions as on the thread lane, the payload kept in that process and
freed there, a process that ends mid-step answered `failed` and replaced, and no process left
once the engine closes (or once the engine's process is gone)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from structlog.testing import capture_logs

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.lane_process import ProcessLane
from pubsub_filter.core.engine.lane_worker import _portable
from pubsub_filter.core.engine.offload import OFF_LOOP_BYTES, Lane, ThreadLane
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from tests.support.children import alive
from tests.support.engine_model import STEPS
from tests.support.engine_sqlite import SqliteMachine
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.polling import eventually, wait_until

ROUTES = [
    {
        "name": "rows",
        "destination": "out",
        "key": ["attributes.id"],
        "rows": "payload.players",
        "row_key": ["player_lookup"],
        "rows_mode": "changed",
        "tolerance": {"minutes": 2},
        "changed_attributes": ["status"],
    },
    {"name": "whole", "destination": "out", "key": ["payload.id"], "tolerance": {"p": 5}, "exclude": ["scraped_at"]},
    {"name": "strict", "destination": "out", "key": ["payload.id"], "on_missing_key": "reject"},
]


def config() -> Config:
    return parse({"routes": ROUTES})


def players(n: int, status: str = "Out", minutes: int = 30, first: int = 0) -> bytes:
    rows = [
        {"player_lookup": f"p{i:06d}", "status": status if i == first else "Out", "minutes": minutes, "pad": "x" * 40}
        for i in range(n)
    ]
    return json.dumps({"players": rows}).encode()


def whole(p: int, scraped: str, pad: int = OFF_LOOP_BYTES, **more: Any) -> bytes:
    return json.dumps({"id": "w1", "p": p, "scraped_at": scraped, "pad": "y" * pad, **more}).encode()


#: Large messages (each at least `OFF_LOOP_BYTES`), in order: (route, attributes, data).
HISTORY: list[tuple[str, dict[str, str], bytes]] = [
    ("rows", {"id": "k1"}, players(3000)),  # new key
    ("rows", {"id": "k1"}, players(3000)),  # unchanged
    ("rows", {"id": "k1"}, players(3000, minutes=31)),  # within tolerance
    ("rows", {"id": "k1"}, players(3000, status="Questionable")),  # one row changed: only it forwarded
    ("rows", {}, players(3000)),  # no key: forwarded without a decision
    ("rows", {"id": "k2"}, b'{"players": 7, "pad": "' + b"z" * OFF_LOOP_BYTES + b'"}'),  # rows not a list
    ("whole", {}, whole(100, "a")),
    ("whole", {}, whole(103, "b")),  # within tolerance
    ("whole", {}, whole(110, "c")),  # changed
    ("whole", {}, whole(110, "d", extra=1)),  # another field changed
    ("strict", {}, whole(1, "a").replace(b'"id"', b'"di"')),  # no key, rejected
    ("whole", {}, b"\xff" * OFF_LOOP_BYTES),  # not JSON: no key
]


def shape(rec: DecisionRecord) -> dict[str, Any]:
    """What a record says of the decision, less what differs between two runs (times, ids)."""
    fields = ("route", "decision", "key", "reason", "fingerprint", "message_fingerprint", "previous_fingerprint")
    return {f: getattr(rec, f) for f in fields} | {"details": rec.details}


async def decide_all(cfg: Config, lane: Lane, scratch: Path) -> tuple[list[dict[str, Any]], list[Any]]:
    publisher, recorder = MemoryPublisher(), MemoryRecorder()
    engine = Engine(cfg, SqliteStore(scratch / "state.db"), publisher, recorder, instance="i", lane=lane)
    try:
        for i, (route, attributes, data) in enumerate(HISTORY):
            await engine.handle(route, Message(data, attributes, f"m{i}"))
    finally:
        await engine.close()
    return [shape(r) for r in recorder.records], [(p.data, dict(p.attributes)) for p in publisher.published]


def test_a_large_message_is_decided_in_its_process_exactly_as_on_the_thread(tmp_path: Path) -> None:
    (tmp_path / "thread").mkdir()
    (tmp_path / "process").mkdir()
    cfg = config()
    on_thread = asyncio.run(decide_all(cfg, ThreadLane(), tmp_path / "thread"))
    on_process = asyncio.run(decide_all(cfg, ProcessLane(cfg.routes), tmp_path / "process"))
    decisions = [r["decision"] for r in on_thread[0]]
    assert decisions == [
        Decision.FORWARDED,
        Decision.SUPPRESSED,
        Decision.SUPPRESSED,
        Decision.FORWARDED,
        Decision.FAIL_OPEN,
        Decision.REJECTED,
        Decision.FORWARDED,
        Decision.SUPPRESSED,
        Decision.FORWARDED,
        Decision.FORWARDED,
        Decision.REJECTED,
        Decision.FAIL_OPEN,
    ]
    assert on_process == on_thread  # every record's reason and details, every byte and attribute published
    # the changed rows alone were forwarded, flagged: the child's own data, sent back
    changed, attributes = on_process[1][1]
    assert len(json.loads(changed)["players"]) == 1 and "status" in " ".join(attributes)


@pytest.fixture
async def lane_engine(tmp_path: Path) -> AsyncIterator[tuple[Engine, ProcessLane, MemoryRecorder]]:
    cfg = config()
    lane, recorder = ProcessLane(cfg.routes), MemoryRecorder()
    engine = Engine(cfg, SqliteStore(tmp_path / "state.db"), MemoryPublisher(), recorder, instance="i", lane=lane)
    yield engine, lane, recorder
    await engine.close()


class _KillsOnRead:
    """A store whose next read first kills the lane's process: between a message's extract and its decide."""

    def __init__(self, store: Any, lane: ProcessLane) -> None:
        self.store, self.lane, self.armed = store, lane, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def read(self, route: str, key: str) -> Any:
        if self.armed and self.lane.pid is not None:
            self.armed = False
            os.kill(self.lane.pid, signal.SIGKILL)
        return await self.store.read(route, key)


async def test_a_lane_process_killed_mid_decision_fails_that_message_and_the_next_starts_a_new_one(
    lane_engine: tuple[Engine, ProcessLane, MemoryRecorder],
) -> None:
    engine, lane, recorder = lane_engine
    await engine.handle("rows", Message(players(3000), {"id": "k1"}, "m0"))
    first = lane.pid
    assert first is not None and first != os.getpid()
    engine.store = killing = _KillsOnRead(engine.store, lane)  # type: ignore[assignment]
    killing.armed = True
    await engine.handle("rows", Message(players(3000, minutes=99), {"id": "k1"}, "m1"))
    failed = recorder.records[-1]
    assert failed.decision is Decision.FAILED  # nacked: Pub/Sub sends it again
    assert failed.reason is not None and "large-message process ended" in failed.reason, failed.reason
    assert "signal 9" in failed.reason
    again = await engine.handle("rows", Message(players(3000, minutes=99), {"id": "k1"}, "m1"))
    assert again.record.decision is Decision.FORWARDED
    assert lane.pid not in (None, first)
    assert await lane.holding() == 0


async def test_a_decision_cancelled_during_its_first_step_leaves_nothing_held_in_the_lane_process(
    lane_engine: tuple[Engine, ProcessLane, MemoryRecorder],
) -> None:
    engine, lane, _ = lane_engine
    payload = await asyncio.to_thread(players, 20000)  # 3 MB of JSON: the test's to make, not the loop's
    task = asyncio.ensure_future(engine.handle("rows", Message(payload, {"id": "k1"}, "m0")))
    await eventually(lambda: lane.pid is not None, 30, "the lane process started")  # the extract is on its way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await lane.holding() == 0  # asked after the forget: the pipe is driven in order


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_a_stop_signal_to_the_whole_process_group_leaves_the_lane_process_deciding(
    lane_engine: tuple[Engine, ProcessLane, MemoryRecorder], sig: signal.Signals
) -> None:
    """The engine's process is the one to stop (it closes the lane when its decisions are done)."""
    engine, lane, _ = lane_engine
    await engine.handle("rows", Message(players(3000), {"id": "k1"}, "m0"))
    assert lane.pid is not None
    pid = lane.pid
    os.kill(pid, sig)  # what a terminal's Ctrl-C, or a supervisor's stop, sends the whole group
    done = await engine.handle("rows", Message(players(3000, minutes=50), {"id": "k1"}, "m1"))
    assert done.record.decision is Decision.FORWARDED
    assert lane.pid == pid


async def test_closing_the_engine_ends_its_lane_process(tmp_path: Path) -> None:
    cfg = config()
    lane = ProcessLane(cfg.routes)
    engine = Engine(cfg, SqliteStore(tmp_path / "state.db"), MemoryPublisher(), MemoryRecorder(), lane=lane)
    await engine.handle("rows", Message(players(3000), {"id": "k1"}, "m0"))
    pid = lane.pid
    assert pid is not None
    await engine.close()
    await eventually(lambda: not alive(pid), 30, f"lane process {pid} ended")
    with pytest.raises(Exception, match="stopped"):
        await lane.extract(engine.rules["rows"], Message(b"{}", {}, "x"), lane.ticket())


_ORPHAN = """
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
from tests.unit.test_process_lane import config, players
from pubsub_filter.core.engine.lane_process import ProcessLane
from pubsub_filter.core.model import Message
cfg = config()
lane = ProcessLane(cfg.routes)
async def main():
    rules = __import__("pubsub_filter.core.compare.routes", fromlist=["RouteRules"]).RouteRules(cfg.routes[0])
    await lane.extract(rules, Message(players(3000), {"id": "k"}, "m"), lane.ticket())
asyncio.run(main())
print(lane.pid, flush=True)
os._exit(0)  # gone without closing anything, as a killed process is
"""


def test_the_lane_process_ends_when_the_engines_process_is_gone() -> None:
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", _ORPHAN, root], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    wait_until(lambda: not alive(pid), 30, f"lane process {pid} ended")


def test_an_exception_that_does_not_pickle_crosses_as_a_runtime_error_that_says_what_it_was() -> None:
    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

    crossed = _portable(Odd(1, 2))
    assert type(crossed) is RuntimeError and str(crossed) == "Odd: 1/2"
    plain = ValueError("x")
    assert _portable(plain) is plain


class ProcessLaneMachine(SqliteMachine):
    """The engine model (`tests/support/engine_model.py`) with every message decided in the lane
    process: a threshold of 0 bytes. The slot is left wide: the model holds forwards in flight
    across steps, and what this run checks is the decisions, not the one-at-a-time turn."""

    def __init__(self) -> None:
        super().__init__()
        for engine in self.engines:
            engine.lane = ProcessLane(self.config.routes)
            engine.lane.slot = asyncio.Semaphore(10_000)
            engine.off_loop_bytes = 0

    def teardown(self) -> None:
        super().teardown()
        for engine in self.engines:
            engine.lane.close()


def test_the_engine_agrees_with_the_reference_model_when_every_message_is_decided_in_the_lane_process() -> None:
    before = STEPS["sqlite"]
    run_state_machine_as_test(
        ProcessLaneMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    assert STEPS["sqlite"] > before


async def test_large_messages_are_decided_on_a_thread_when_no_lane_process_can_be_started(tmp_path: Path) -> None:
    cfg = config()
    lane = ProcessLane(cfg.routes, python=str(tmp_path / "no-such-python"))
    recorder = MemoryRecorder()
    engine = Engine(cfg, SqliteStore(tmp_path / "state.db"), MemoryPublisher(), recorder, lane=lane)
    try:
        with capture_logs() as logs:
            first = await engine.handle("rows", Message(players(3000), {"id": "k1"}, "m0"))
            again = await engine.handle("rows", Message(players(3000), {"id": "k1"}, "m1"))
        assert (first.record.decision, again.record.decision) == (Decision.FORWARDED, Decision.SUPPRESSED)
        assert lane.pid is None and lane.fallback is not None
        assert await lane.holding() == 0
    finally:
        await engine.close()
    said = [line for line in logs if line["event"] == "large_message_process_unavailable"]
    assert len(said) == 1 and "no-such-python" in said[0]["reason"], said


async def test_a_lane_starts_no_process_until_its_first_large_message() -> None:
    lane = ProcessLane(config().routes)
    try:
        assert await lane.holding() == 0
        assert lane.pid is None
    finally:
        lane.close()
