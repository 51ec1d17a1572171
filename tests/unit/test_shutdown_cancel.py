"""A shutdown past its grace cancels what is still running. Once a publish is handed over it
may land whatever we do (the publisher's close flushes it), so the first cancel waits for the
publish's outcome and for the commit that records it; a second cancel abandons the forward and
frees the key. Before, the first cancel released the lease and nacked: the copy published
anyway, and the redelivery was published a second time."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.stopping import PUBLISHER, RELEASE, Stop
from pubsub_filter.core.model import Decision, DecisionRecord, KeyState, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder, SwitchStore

ROUTES: list[dict[str, Any]] = [
    {"name": "reports", "destination": "phase3", "key": ["payload.game_date"]},
    {"name": "shadow", "destination": "phase3", "key": ["payload.game_date"], "mode": "shadow"},
]


class GatedCommits(SwitchStore):
    """Commits wait for `gate` once it is set to an Event; `committing` says one is waiting.
    Releases likewise wait for `release_gate`, and claims' replies for `reply_gate`."""

    def __init__(self, inner: SqliteStore) -> None:
        super().__init__(inner)
        self.gate: asyncio.Event | None = None
        self.committing = asyncio.Event()
        self.release_gate: asyncio.Event | None = None
        self.releasing = asyncio.Event()
        self.reply_gate: asyncio.Event | None = None
        self.replying = asyncio.Event()

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        """With `reply_gate` set, the claim lands and its reply waits for the gate (a slow network)."""
        held = await super().claim(route, key, seen, new)
        if self.reply_gate is not None:
            self.replying.set()
            await self.reply_gate.wait()
        return held

    async def release(self, route: str, key: str, held: KeyState) -> None:
        if self.release_gate is not None:
            self.releasing.set()
            await self.release_gate.wait()
        await super().release(route, key, held)

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        if self.gate is not None:
            self.committing.set()
            await self.gate.wait()
        return await super().commit(route, key, held, new)


#: The whole stop's budget in these tests: each step of the close has a share of it (core.engine.stopping).
BUDGET = 0.4


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.config: Config = parse({"routes": ROUTES, "server": {"shutdown_budget": BUDGET}})
        self.sqlite = SqliteStore(tmp_path / "state.db")
        self.store = GatedCommits(self.sqlite)
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.engine = Engine(
            self.config,
            GuardedStore(self.store, self.config.store_errors),
            self.publisher,
            self.recorder,
            ManualClock(),
            "one",
        )

    def message(self, content: str, message_id: str) -> Message:
        data = json.dumps({"game_date": "2025-01-10", "status": content}).encode()
        return Message(data=data, attributes={}, message_id=message_id)

    def start(self, route: str, content: str, message_id: str) -> asyncio.Task[DecisionRecord]:
        return asyncio.create_task(self.decided(route, self.message(content, message_id)))

    async def decided(self, route: str, msg: Message) -> DecisionRecord:
        return (await self.engine.handle(route, msg)).record

    async def held_in_publish(self, route: str, content: str, message_id: str) -> asyncio.Task[Any]:
        self.publisher.gate = asyncio.Event()
        self.publisher.started.clear()
        task = self.start(route, content, message_id)
        await self.publisher.started.wait()
        return task

    async def state(self) -> KeyState | None:
        return await self.sqlite.read("reports", "2025-01-10")


@pytest.fixture
async def rig(tmp_path: Path) -> Any:
    r = Rig(tmp_path)
    yield r
    await r.sqlite.close()


async def test_a_cancel_while_the_publish_is_in_flight_waits_for_its_outcome_and_commits_it(rig: Rig) -> None:
    task = await rig.held_in_publish("reports", "out", "m1")
    task.cancel()
    assert rig.publisher.gate is not None
    rig.publisher.gate.set()
    rec = await task
    assert (rec.decision, rec.acked, rec.extra.get("committed", True)) == (Decision.FORWARDED, True, True)
    state = await rig.state()
    assert state is not None and state.fingerprint == rec.fingerprint and state.lease is None


async def test_the_redelivery_of_a_forward_finished_through_a_cancel_is_not_published_again(rig: Rig) -> None:
    task = await rig.held_in_publish("reports", "out", "m1")
    task.cancel()
    assert rig.publisher.gate is not None
    rig.publisher.gate.set()
    await asyncio.gather(task, return_exceptions=True)  # whatever the surface answered
    again = (await rig.engine.handle("reports", rig.message("out", "m1"))).record
    assert again.decision is Decision.DUPLICATE and len(rig.publisher.published) == 1


async def test_a_cancel_while_the_commit_is_in_flight_waits_for_the_commit(rig: Rig) -> None:
    rig.store.gate = asyncio.Event()
    task = rig.start("reports", "out", "m1")
    await rig.store.committing.wait()
    task.cancel()
    rig.store.gate.set()
    rec = await task
    assert (rec.decision, rec.extra.get("committed", True)) == (Decision.FORWARDED, True)
    state = await rig.state()
    assert state is not None and state.fingerprint == rec.fingerprint


async def test_a_publish_that_fails_after_a_cancel_is_nacked_and_frees_the_key(rig: Rig) -> None:
    task = await rig.held_in_publish("reports", "out", "m1")
    task.cancel()
    rig.publisher.fail = True
    assert rig.publisher.gate is not None
    rig.publisher.gate.set()
    rec = await task
    assert (rec.decision, rec.acked) == (Decision.FAILED, False)
    state = await rig.state()
    assert state is not None and state.lease is None and state.fingerprint is None


async def test_a_second_cancel_abandons_the_forward_and_frees_the_key(rig: Rig) -> None:
    task = await rig.held_in_publish("reports", "out", "m1")
    task.cancel()
    await asyncio.sleep(0)  # one loop step: the first cancel lands and is taken back
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await rig.state()
    assert state is not None and state.lease is None and state.fingerprint is None


async def test_a_cancel_while_a_shadow_forward_publishes_still_answers_it(rig: Rig) -> None:
    await rig.engine.handle("shadow", rig.message("out", "m1"))
    task = await rig.held_in_publish("shadow", "out", "m2")  # enforce would suppress; shadow publishes
    task.cancel()
    assert rig.publisher.gate is not None
    rig.publisher.gate.set()
    rec = await task
    assert (rec.decision, rec.acked, len(rig.publisher.published)) == (Decision.SUPPRESSED, True, 2)


async def test_a_cancel_while_a_fail_open_forward_publishes_still_answers_it(rig: Rig) -> None:
    rig.store.down = True
    task = await rig.held_in_publish("reports", "out", "m1")
    task.cancel()
    assert rig.publisher.gate is not None
    rig.publisher.gate.set()
    rec = await task
    assert (rec.decision, rec.acked, len(rig.publisher.published)) == (Decision.FAIL_OPEN, True, 1)


async def test_closing_right_after_the_cancel_lets_the_forward_commit_and_record_first(rig: Rig) -> None:
    """What uvicorn does past the grace: cancel the request, then run the lifespan's close at once."""
    task = await rig.held_in_publish("reports", "out", "m1")
    task.cancel()
    await asyncio.sleep(0)  # one loop step: the cancel lands and is taken back
    closing = asyncio.create_task(rig.engine.close())
    await asyncio.sleep(0)  # the close starts while the publish is still in flight
    assert rig.publisher.gate is not None
    rig.publisher.gate.set()
    rec, _ = await asyncio.gather(task, closing)
    assert (rec.decision, rec.extra.get("committed", True)) == (Decision.FORWARDED, True)
    assert rig.recorder.decisions == [Decision.FORWARDED]
    reopened = SqliteStore(rig.sqlite.path)
    state = await reopened.read("reports", "2025-01-10")
    await reopened.close()
    assert state is not None and state.fingerprint == rec.fingerprint and state.lease is None


async def test_a_cancel_during_the_release_waits_for_the_release_to_land(rig: Rig) -> None:
    """Before, the release ran shielded: a third cancel (asyncio.run's, once the server has
    returned) ended the request at once, and the store was closed under the release."""
    task = await rig.held_in_publish("reports", "out", "m1")
    rig.store.release_gate = asyncio.Event()
    task.cancel()
    await asyncio.sleep(0)  # one loop step: the first cancel lands and is taken back
    task.cancel()
    await rig.store.releasing.wait()
    task.cancel()
    for _ in range(10):  # loop steps enough for the cancel to reach the request's end
        await asyncio.sleep(0)
    assert not task.done()  # still releasing
    rig.store.release_gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await rig.state()
    assert state is not None and state.lease is None


async def test_an_abandoned_decision_records_why_before_its_cancel_goes_on(rig: Rig) -> None:
    task = await rig.held_in_publish("reports", "out", "m1")
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [rec] = rig.recorder.records
    assert (rec.decision, rec.message_id, rec.extra["cause"]) == (Decision.FAILED, "m1", "cancelled")


async def test_close_abandons_a_publish_that_does_not_end_and_frees_its_key_before_closing_the_store(
    rig: Rig,
) -> None:
    """No surface cancelled it first (the in-process API closes so): close cancels it past the
    grace, through the cancel a publish under way takes back, and waits for its release."""
    task = await rig.held_in_publish("reports", "out", "m1")
    await rig.engine.close()
    assert task.done() and task.cancelled()
    assert rig.recorder.decisions == [Decision.FAILED] and rig.recorder.closed
    reopened = SqliteStore(rig.sqlite.path)
    state = await reopened.read("reports", "2025-01-10")
    await reopened.close()
    assert state is not None and state.lease is None


async def test_close_waits_for_a_decision_under_way_that_nobody_cancelled(rig: Rig) -> None:
    task = await rig.held_in_publish("reports", "out", "m1")
    closing = asyncio.create_task(rig.engine.close(Stop.begin(10.0)))
    await asyncio.sleep(0)
    assert rig.publisher.gate is not None
    rig.publisher.gate.set()
    rec, _ = await asyncio.gather(task, closing)
    assert rec.decision is Decision.FORWARDED and rig.recorder.decisions == [Decision.FORWARDED]


async def test_a_cancel_while_the_claims_reply_is_on_its_way_frees_the_key_the_claim_took(rig: Rig) -> None:
    """The claim landed; the request was cancelled before its reply came back (a slow store at
    the shutdown). Before, the key stayed leased for `lease.duration` though the caller was
    answered, and every redelivery meanwhile was `contended`."""
    rig.store.reply_gate = asyncio.Event()
    task = rig.start("reports", "out", "m1")
    await rig.store.replying.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await rig.state()
    assert state is not None and state.lease is None and state.fingerprint is None
    assert rig.recorder.decisions == [Decision.FAILED] and rig.publisher.published == []


async def test_close_gives_a_cancelled_decision_until_its_share_of_the_budget_to_release_its_lease(
    rig: Rig,
) -> None:
    """The release of a decision cancelled by the close is waited for until the stop's share for
    releases, though the share for the decisions under way has passed: the store is not closed
    under it."""
    await rig.held_in_publish("reports", "out", "m1")  # a publish that never ends
    rig.store.release_gate = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        stop = Stop.begin(BUDGET)
        closing = asyncio.create_task(rig.engine.close(stop))
        await rig.store.releasing.wait()  # the close cancelled the decision: its release is under way
        assert stop.left(PUBLISHER) == 0.0  # the share for the decisions and the publisher has passed
        # a release slower than a loop step, well inside its share
        asyncio.get_running_loop().call_later(BUDGET * (RELEASE - PUBLISHER) / 4, rig.store.release_gate.set)
        await closing
    assert "decisions_abandoned" not in {e["event"] for e in logs}
    reopened = SqliteStore(rig.sqlite.path)
    state = await reopened.read("reports", "2025-01-10")
    await reopened.close()
    assert state is not None and state.lease is None


async def test_a_release_that_does_not_end_is_left_at_its_share_and_the_close_ends_inside_the_budget(
    rig: Rig,
) -> None:
    """A store that hangs at the stop (each call is bounded by `store_errors.budget`, 5 s) used
    to hold the close for that long past the grace: Cloud Run's SIGKILL came first, and the
    records still batched were lost. Now the records are closed at their share, and the close
    ends inside the budget; the lease lapses by itself."""
    await rig.held_in_publish("reports", "out", "m1")  # a publish that never ends
    rig.store.release_gate = asyncio.Event()  # ...and a release that does not end either
    loop = asyncio.get_running_loop()
    started = loop.time()
    with structlog.testing.capture_logs() as logs:
        await rig.engine.close(Stop.begin(BUDGET))
    took = loop.time() - started
    rig.store.release_gate.set()
    assert took < BUDGET, f"the close took {took:.2f}s of a {BUDGET}s budget"
    assert "decisions_abandoned" in {e["event"] for e in logs}
    assert rig.recorder.closed
