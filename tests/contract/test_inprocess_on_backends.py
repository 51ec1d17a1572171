"""The in-process API on both state backends: the body runs under the lease, once, and only for a forward.

Each test runs on SQLite and on the Firestore emulator. The crash and race tests run real
consumer processes (`tests/support/inprocess_worker.py`, the sync API) on the same store:
one SIGKILLed inside its body, two deciding the same key at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.stores.firestore import FirestoreStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.model import Decision, KeyState, Message
from pubsub_filter.inprocess import Filter, Forward
from tests.contract.conftest import BACKENDS, COLLECTION
from tests.support.clock import ManualClock
from tests.support.emulators import FirestoreEmulator

#: Its bodies start worker processes and read their pipes, blocking: nothing is served here.
pytestmark = pytest.mark.loop_may_block("test bodies read worker processes' pipes; nothing is served")

ROOT = Path(__file__).resolve().parents[2]
ROUTE = "reports"
READ_TIMEOUT = 60.0  # a bound on a wait for a worker's line, never a stand-in for one


def payload(version: int, key: str = "g1") -> bytes:
    return json.dumps({"game": key, "version": version}).encode()


class Worker:
    """One `inprocess_worker` process; its stdout lines are read on a thread, so waits are bounded."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.inprocess_worker", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_of(self, *prefixes: str) -> str:
        """The next line starting with one of `prefixes` (log lines in between are kept in `seen`)."""
        deadline = time.monotonic() + READ_TIMEOUT
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"worker ended without {prefixes}: {self.seen[-20:]}")
            self.seen.append(line)
            if line.startswith(prefixes):
                return line

    def outcome(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.next_of("OUTCOME ").removeprefix("OUTCOME "))
        return found

    def answer(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(READ_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@dataclass
class Setup:
    """A config file on one backend, and how to open a `Filter`, a reader or a worker process on it."""

    backend: str
    path: Path
    config: Config
    emu: FirestoreEmulator | None
    workers: list[Worker] = field(default_factory=list)
    opened: list[Any] = field(default_factory=list)

    def env(self) -> contextlib.AbstractContextManager[None]:
        return self.emu.env() if self.emu is not None else contextlib.nullcontext()

    def open(self, clock: ManualClock | None = None) -> Filter:
        with self.env():  # the client reads FIRESTORE_EMULATOR_HOST when it is built
            f = Filter.open(self.config, clock=clock)
        self.opened.append(f)
        return f

    async def state(self, key: str = "g1") -> KeyState | None:
        with self.env():
            store: Any = (
                FirestoreStore(collection=COLLECTION) if self.emu is not None else SqliteStore(self.config.store.path)  # type: ignore[union-attr]
            )
        try:
            found: KeyState | None = await store.read(ROUTE, key)
            return found
        finally:
            await store.close()

    def worker(self, message_id: str, data: bytes) -> Worker:
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}"}
        if self.emu is not None:
            env.update(FIRESTORE_EMULATOR_HOST=self.emu.host, GOOGLE_CLOUD_PROJECT=self.emu.project)
        w = Worker([str(self.path), ROUTE, message_id, data.decode()], env)
        self.workers.append(w)
        return w


@pytest.fixture(params=BACKENDS)
async def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    backend = str(request.param)
    emu = request.getfixturevalue("firestore") if backend == "firestore" else None
    store: dict[str, Any] = (
        {"backend": "sqlite", "path": str(tmp_path / "state.db")}
        if emu is None
        else {"backend": "firestore", "project": emu.project, "collection": COLLECTION}
    )
    raw = {
        "store": store,
        "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
        "routes": [{"name": ROUTE, "destination": "phase3", "key": ["payload.game"]}],
    }
    path = tmp_path / "filter.yaml"
    path.write_text(json.dumps(raw))  # YAML is a superset of JSON
    s = Setup(backend, path, parse(raw), emu)
    yield s
    for w in s.workers:
        w.stop()
    for f in s.opened:
        await f.close()


async def test_body_runs_for_a_forward_and_its_fingerprint_is_committed_after_it(setup: Setup) -> None:
    f = setup.open()
    during: list[KeyState | None] = []

    async def body(forward: Forward) -> str:
        during.append(await setup.state())
        return "done"

    outcome = await f.process(ROUTE, Message(payload(1), {}, "m1"), body)

    assert (outcome.decision, outcome.ran, outcome.result, outcome.committed) == (
        Decision.FORWARDED,
        True,
        "done",
        True,
    )
    [held] = during
    assert held is not None and held.lease is not None and held.fingerprint is None  # leased, not yet committed
    state = await setup.state()
    assert state is not None and state.lease is None and state.fingerprint == outcome.record.fingerprint


async def test_unchanged_content_skips_the_body_and_says_so(setup: Setup) -> None:
    f = setup.open()
    runs: list[str] = []

    async def body(forward: Forward) -> None:
        runs.append(forward.attributes["filter_source_message_id"])

    await f.process(ROUTE, Message(payload(1), {}, "m1"), body)
    again = await f.process(ROUTE, Message(payload(1), {}, "m2"), body)

    assert runs == ["m1"]
    assert (again.decision, again.skipped, again.reason) == (
        Decision.SUPPRESSED,
        True,
        "unchanged since last forward",
    )


async def test_an_exception_in_the_body_releases_the_lease_commits_nothing_and_propagates(setup: Setup) -> None:
    f = setup.open()

    async def failing(forward: Forward) -> None:
        raise ValueError("downstream write failed")

    with pytest.raises(ValueError, match="downstream write failed"):
        await f.process(ROUTE, Message(payload(1), {}, "m1"), failing)

    state = await setup.state()
    assert state is not None and state.lease is None and state.fingerprint is None


async def test_the_redelivery_after_an_exception_runs_the_body_again(setup: Setup) -> None:
    f = setup.open()
    calls: list[int | None] = []

    async def body(forward: Forward) -> None:
        calls.append(forward.fence)
        if len(calls) == 1:
            raise ValueError("first attempt fails")

    with pytest.raises(ValueError):
        await f.process(ROUTE, Message(payload(1), {}, "m1"), body)
    redelivered = await f.process(ROUTE, Message(payload(1), {}, "m1"), body)

    assert calls == [1, 2]
    assert (redelivered.decision, redelivered.ran, redelivered.committed) == (Decision.FORWARDED, True, True)


async def test_a_message_without_its_key_runs_the_body_without_a_lease_as_a_fail_open(setup: Setup) -> None:
    f = setup.open()
    forwards: list[Forward] = []

    async def body(forward: Forward) -> str:
        forwards.append(forward)
        return "done"

    keyless = Message(b'{"version": 1}', {}, "m1")
    outcome = await f.process(ROUTE, keyless, body)
    again = await f.process(ROUTE, keyless, body)  # its redelivery: nothing recorded it, the body runs again

    assert (outcome.decision, outcome.ran, outcome.result, outcome.acked, outcome.committed) == (
        Decision.FAIL_OPEN,
        True,
        "done",
        True,
        False,
    )
    assert (outcome.reason or "").startswith("key field payload.game is missing: forwarded without a dedup decision")
    assert (again.decision, again.ran) == (Decision.FAIL_OPEN, True)
    assert [(fw.fence, fw.key, fw.attributes["filter_source_message_id"]) for fw in forwards] == [
        (None, None, "m1")
    ] * 2
    assert forwards[0].data == b'{"version": 1}' and await setup.state("") is None


async def test_a_body_failing_on_a_message_without_its_key_propagates_and_its_redelivery_runs_it_again(
    setup: Setup,
) -> None:
    f = setup.open()
    calls: list[int | None] = []

    async def body(forward: Forward) -> None:
        calls.append(forward.fence)
        if len(calls) == 1:
            raise ValueError("downstream write failed")

    keyless = Message(b'{"version": 1}', {}, "m1")
    with pytest.raises(ValueError, match="downstream write failed"):
        await f.process(ROUTE, keyless, body)
    again = await f.process(ROUTE, keyless, body)
    assert (again.decision, again.ran, calls) == (Decision.FAIL_OPEN, True, [None, None])


async def test_a_process_killed_inside_the_body_leaves_the_message_to_be_redone_after_its_lease(
    setup: Setup,
) -> None:
    crashed = setup.worker("m1", payload(1))
    assert crashed.next_of("BODY ") == "BODY 1"
    crashed.proc.send_signal(signal.SIGKILL)
    crashed.stop()

    clock = ManualClock(time.time())
    f = setup.open(clock)
    runs: list[int | None] = []

    async def body(forward: Forward) -> None:
        runs.append(forward.fence)

    while_leased = await f.process(ROUTE, Message(payload(1), {}, "m1"), body)
    clock.advance(setup.config.lease.duration + 1)
    after_expiry = await f.process(ROUTE, Message(payload(1), {}, "m1"), body)

    assert (while_leased.decision, while_leased.ran, while_leased.acked) == (Decision.CONTENDED, False, False)
    assert (after_expiry.decision, after_expiry.committed) == (Decision.FORWARDED, True)
    assert runs == [2]  # taken over with the next fence, and redone once
    state = await setup.state()
    assert state is not None and state.lease is None and state.fingerprint == after_expiry.record.fingerprint


async def test_two_processes_racing_on_one_key_run_one_body_and_the_other_is_told_why(setup: Setup) -> None:
    racers = [setup.worker("m1", payload(1)), setup.worker("m2", payload(2))]

    first = [w.next_of("BODY ", "OUTCOME ") for w in racers]

    [winner] = [w for w, line in zip(racers, first, strict=True) if line.startswith("BODY ")]
    [loser] = [line for line in first if line.startswith("OUTCOME ")]
    told = json.loads(loser.removeprefix("OUTCOME "))
    assert (told["decision"], told["ran"], told["reason"]) == (
        "contended",
        False,
        "other content for this key is in flight",
    )
    winner.answer("done")
    won = winner.outcome()
    assert (won["decision"], won["ran"], won["committed"], won["result"]) == ("forwarded", True, True, "done")


# --- cached results (cache_result) ---------------------------------------------------------


async def test_a_redelivery_returns_the_result_kept_with_its_forward(setup: Setup) -> None:
    f = setup.open()
    runs: list[int] = []

    async def body(forward: Forward) -> dict[str, Any]:
        version = json.loads(forward.data)["version"]
        runs.append(version)
        return {"rebuilt": version, "rows": [1, 2]}

    first = await f.process(ROUTE, Message(payload(1), {}, "m1"), body, cache_result=True)
    second = await f.process(ROUTE, Message(payload(2), {}, "m2"), body, cache_result=True)
    again = await f.process(ROUTE, Message(payload(1), {}, "m1"), body, cache_result=True)  # after a later change
    other = await f.process(ROUTE, Message(payload(2), {}, "m3"), body, cache_result=True)  # same content, other id

    assert (first.result, first.cached, second.result) == (
        {"rebuilt": 1, "rows": [1, 2]},
        False,
        {"rebuilt": 2, "rows": [1, 2]},
    )
    assert (again.decision, again.ran, again.cached, again.result) == (
        Decision.DUPLICATE,
        False,
        True,
        {"rebuilt": 1, "rows": [1, 2]},
    )
    assert (other.decision, other.cached, other.result) == (Decision.SUPPRESSED, False, None)
    assert runs == [1, 2]
    state = await setup.state()
    assert state is not None and [r[0] for r in state.results] == ["m1", "m2"]


async def test_kept_results_expire_with_the_key_state(setup: Setup) -> None:
    clock = ManualClock()
    f = setup.open(clock)
    runs: list[str] = []

    async def body(forward: Forward) -> str:
        runs.append("ran")
        return "result"

    await f.process(ROUTE, Message(payload(1), {}, "m1"), body, cache_result=True)
    clock.advance(setup.config.state_ttl + 1)
    later = await f.process(ROUTE, Message(payload(1), {}, "m1"), body, cache_result=True)

    assert (later.decision, later.ran, later.cached) == (Decision.FORWARDED, True, False)
    assert runs == ["ran", "ran"]


@pytest.mark.parametrize(
    "result",
    [pytest.param("x" * (100 * 1024), id="100 KiB"), pytest.param(object(), id="not JSON-encodable")],
)
async def test_a_body_whose_result_cannot_be_kept_is_committed_and_runs_once_over_redeliveries(
    setup: Setup, result: object
) -> None:
    f = setup.open()
    runs: list[str] = []

    async def body(forward: Forward) -> object:
        runs.append("ran")
        return result

    deliveries = [await f.process(ROUTE, Message(payload(1), {}, "m1"), body, cache_result=True) for _ in range(3)]

    first, *redelivered = deliveries
    assert runs == ["ran"], "the body ran again on a redelivery of a message it was committed for"
    assert (first.decision, first.ran, first.committed, first.acked, first.cached) == (
        Decision.FORWARDED,
        True,
        True,
        True,
        False,
    )
    assert first.result is result
    for again in redelivered:
        assert (again.decision, again.ran, again.result, again.cached, again.acked) == (
            Decision.DUPLICATE,
            False,
            None,
            False,
            True,
        )
    state = await setup.state()
    assert state is not None and state.lease is None
    assert state.fingerprint == first.record.fingerprint and "m1" in [mid for mid, _ in state.recent]
    assert state.results == ()
    other_copy = await f.process(ROUTE, Message(payload(1), {}, "m2"), body, cache_result=True)
    assert (other_copy.decision, runs) == (Decision.SUPPRESSED, ["ran"])
