"""Decisions at the edges (shadow routes, forged replay times, shared row keys, store errors in
the heartbeat, expired state, lapsed and fail-open forwards) that once lost a message or
published it twice while every other test was green. One behaviour per test; each failed
before its fix."""

from __future__ import annotations

import asyncio
import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import structlog

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import ATTR_ORIGINAL_TIME, make_envelope, parse_envelope
from pubsub_filter.core.model import Decision, KeyState, Message
from pubsub_filter.runtime.wiring import make_store
from tests.support.clock import ManualClock
from tests.support.decision_world import DownStore, World, report
from tests.support.fakes import MemoryPublisher, MemoryRecorder, SwitchStore


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


# --- 3. shadow mode publishes once per delivery ----------------------------------------


async def test_shadow_route_acks_a_contended_message_it_published(world: World) -> None:
    world.publisher.gate = asyncio.Event()
    first = asyncio.create_task(world.send("shadow", {"game_date": "d", "v": 1}))
    await world.publisher.started.wait()
    world.publisher.started.clear()
    second = asyncio.create_task(world.send("shadow", {"game_date": "d", "v": 2}))
    await world.publisher.started.wait()  # the second is publishing too: shadow mode holds nothing back
    world.publisher.gate.set()
    rec = await second
    await first
    assert (rec.decision, rec.enforced) == (Decision.CONTENDED, False)
    assert rec.acked and answer_for(rec).status == 200  # acked, so Pub/Sub does not redeliver and republish it
    assert len(world.publisher.published) == 2


async def test_shadow_route_that_could_not_publish_is_not_acked(world: World) -> None:
    await world.send("shadow", {"game_date": "d", "v": 1, "scraped": "a"})
    world.publisher.fail = True
    rec = await world.send("shadow", {"game_date": "d", "v": 1, "scraped": "b"})
    assert rec.decision is Decision.FAILED and not rec.acked and answer_for(rec).status == 500


# --- 4. a producer cannot poison a key with a forged replay time --------------------------


def test_a_replay_time_later_than_the_real_publish_time_is_not_believed() -> None:
    body = make_envelope(b"{}", "1", {ATTR_ORIGINAL_TIME: "2999-01-01T00:00:00Z"}, publish_time="2026-01-01T00:00:00Z")
    assert parse_envelope(body).publish_time == parse_envelope(make_envelope(b"{}", "1")).publish_time


async def test_a_forged_future_replay_time_does_not_make_later_changes_stale(world: World) -> None:
    forged = parse_envelope(
        make_envelope(
            json.dumps({"game_date": "d", "v": 1}).encode(),
            "1",
            {ATTR_ORIGINAL_TIME: "2999-01-01T00:00:00Z"},
            publish_time="2026-01-01T00:00:00Z",
        )
    )
    assert (await world.engine.handle("strict", forged)).record.decision is Decision.FORWARDED
    later = parse_envelope(
        make_envelope(json.dumps({"game_date": "d", "v": 2}).encode(), "2", publish_time="2026-01-01T00:01:00Z")
    )
    assert (await world.engine.handle("strict", later)).record.decision is Decision.FORWARDED


# --- 5. row mode never suppresses a change the fingerprint sees ---------------------------

ROW_ROUTES: list[dict[str, Any]] = [
    {
        "name": "changed-rows",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["player"],
        "rows_mode": "changed",
    }
]


class RowRig:
    def __init__(self, tmp_path: Path):
        self.config = parse({"routes": ROW_ROUTES})
        self.publisher = MemoryPublisher()
        store = GuardedStore(SqliteStore(tmp_path / "state.db"), self.config.store_errors)
        self.engine = Engine(self.config, store, self.publisher, MemoryRecorder(), ManualClock())
        self.n = 0

    async def send(self, payload: Any) -> Decision:
        self.n += 1
        msg = Message(json.dumps(payload).encode(), {}, f"m{self.n}")
        return (await self.engine.handle("changed-rows", msg)).record.decision


async def test_a_change_in_a_row_that_shares_its_key_is_forwarded(tmp_path: Path) -> None:
    rig = RowRig(tmp_path)
    first = {"game_date": "d", "players": [{"player": "a", "status": "out"}, {"player": "a", "status": "in"}]}
    assert await rig.send(first) is Decision.FORWARDED
    changed = copy.deepcopy(first)
    changed["players"][0]["status"] = "questionable"
    assert await rig.send(changed) is Decision.FORWARDED
    body = json.loads(rig.publisher.published[-1].data)
    assert sorted(p["status"] for p in body["players"]) == ["in", "questionable"]  # every row of that key


async def test_rows_sharing_a_key_in_another_order_are_unchanged(tmp_path: Path) -> None:
    rig = RowRig(tmp_path)
    rows_ = [{"player": "a", "status": "out"}, {"player": "a", "status": "in"}]
    await rig.send({"game_date": "d", "players": rows_})
    assert await rig.send({"game_date": "d", "players": rows_[::-1]}) is Decision.SUPPRESSED


async def test_a_change_outside_the_row_objects_is_forwarded_whole(tmp_path: Path) -> None:
    rig = RowRig(tmp_path)
    await rig.send({"game_date": "d", "players": [{"player": "a", "status": "out"}, "note: x"]})
    assert await rig.send({"game_date": "d", "players": [{"player": "a", "status": "out"}, "note: y"]}) is (
        Decision.FORWARDED
    )
    assert json.loads(rig.publisher.published[-1].data)["players"][1] == "note: y"


# --- 6. a store error in the heartbeat after a confirmed publish ---------------------------


class CorruptOnExtend(SqliteStore):
    """The SQLite store, but every lease extension meets a corrupt page."""

    def __init__(self, path: Path, beat: asyncio.Event):
        super().__init__(path)
        self.beat = beat

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        self.beat.set()
        raise sqlite3.DatabaseError("database disk image is malformed")


async def _forward_with_failing_heartbeat(tmp_path: Path, guarded: bool) -> tuple[World, Any]:
    world = World(
        tmp_path,
        lease={"duration": "3s", "ack_deadline": "2s", "heartbeat": "1s"},
        store_errors={"timeout": "0.5s", "budget": "1s"},
    )
    beat = asyncio.Event()
    inner = CorruptOnExtend(tmp_path / "state.db", beat)
    world.engine.store = GuardedStore(inner, world.config.store_errors, inline=True) if guarded else inner
    world.publisher.gate = asyncio.Event()
    sent = asyncio.create_task(world.send("reports", report("out")))
    await world.sleep.wake()  # one beat of the injected clock, while the publish is held
    await beat.wait()  # the heartbeat has failed once
    world.publisher.gate.set()
    return world, await sent


async def test_a_raw_store_error_in_the_heartbeat_still_commits_the_forward(tmp_path: Path) -> None:
    world, rec = await _forward_with_failing_heartbeat(tmp_path, guarded=False)
    assert rec.decision is Decision.FORWARDED and rec.acked and rec.extra.get("committed", True)
    state = await world.state("reports", "2025-01-10")
    assert state is not None and state.lease is None and state.fingerprint == rec.fingerprint


async def test_the_guard_turns_any_store_error_into_store_unavailable(tmp_path: Path) -> None:
    world, rec = await _forward_with_failing_heartbeat(tmp_path, guarded=True)
    assert rec.decision is Decision.FORWARDED and rec.acked
    assert (await world.send("reports", report("out"))).decision is Decision.SUPPRESSED  # committed


async def test_a_failed_release_is_logged_as_failed_not_released(world: World) -> None:
    class NoRelease(SqliteStore):
        async def release(self, route: str, key: str, held: KeyState) -> None:
            raise sqlite3.DatabaseError("disk I/O error")

    world.engine.store = NoRelease(world.tmp_path / "state.db")
    world.publisher.fail = True
    with structlog.testing.capture_logs() as logs:
        rec = await world.send("reports", report("out"))
    events = [e["event"] for e in logs]
    assert rec.decision is Decision.FAILED and not rec.acked
    assert "lease_release_failed" in events and "lease_released" not in events


# --- 7. expired state never decides -------------------------------------------------------


async def test_state_past_its_expiry_does_not_suppress(world: World) -> None:
    first = await world.send("raw", b"same", attributes={"id": "k"})
    world.clock.advance(world.config.state_ttl + 1)  # the TTL has not deleted it yet (Firestore: up to a day late)
    rec = await world.send("raw", b"same", attributes={"id": "k"})
    assert (first.decision, rec.decision) == (Decision.FORWARDED, Decision.FORWARDED)
    assert rec.fence == 2  # the fence still only grows


async def test_a_redelivery_past_the_state_expiry_is_forwarded_again(world: World) -> None:
    await world.send("raw", b"same", attributes={"id": "k"}, message_id="m1")
    world.clock.advance(world.config.state_ttl + 1)
    assert (await world.send("raw", b"same", attributes={"id": "k"}, message_id="m1")).decision is Decision.FORWARDED


async def test_the_embedded_store_purges_expired_keys_by_itself(tmp_path: Path) -> None:
    clock = ManualClock()
    store = SqliteStore(tmp_path / "state.db", purge_every=60, clock=clock.now)
    engine = Engine(
        parse({"routes": [{"name": "r", "destination": "phase3", "key": ["attributes.id"]}], "state_ttl": "1d"}),
        GuardedStore(store, parse({"routes": ROW_ROUTES}).store_errors, inline=True),
        MemoryPublisher(),
        MemoryRecorder(),
        clock,
    )
    await engine.handle("r", Message(b"x", {"id": "old"}, "1"))
    clock.advance(86400 + 61)
    await engine.handle("r", Message(b"x", {"id": "new"}, "2"))  # a claim: the purge is due
    assert await store.read("r", "old") is None and await store.read("r", "new") is not None


def test_the_configured_embedded_store_purges_by_itself(tmp_path: Path) -> None:
    cfg = parse({"routes": ROW_ROUTES, "store": {"backend": "sqlite", "path": str(tmp_path / "s.db")}})
    store = make_store(cfg)
    assert isinstance(store, GuardedStore) and isinstance(store.inner, SqliteStore)
    assert store.inner.purge_every is not None


# --- 4. attributes only the filter writes ------------------------------------------------


async def test_a_producer_cannot_forge_the_filters_own_attributes_downstream(world: World) -> None:
    forged = {"filter_rows_changed": "0", "filter_rows_removed_keys": '["x"]', "filter_fingerprint": "sha256:0"}
    rec = await world.send("strict", {"game_date": "d", "v": 1}, attributes={**forged, "source": "scraper"})
    attributes = world.publisher.published[-1].attributes
    assert rec.decision is Decision.FORWARDED and attributes["source"] == "scraper"
    assert "filter_rows_changed" not in attributes and "filter_rows_removed_keys" not in attributes
    assert attributes["filter_fingerprint"] == rec.fingerprint


# --- found by the model-based test (tests/unit/test_engine_model.py) -----------------------


async def test_content_equal_to_the_state_is_forwarded_after_a_lapsed_forward_of_other_content(
    world: World,
) -> None:
    # A is forwarded; B's publish lands but its commit cannot reach the store, so the state
    # still says A while the destination holds B. Once B's lease lapses, A again is a change.
    store = SwitchStore(SqliteStore(world.tmp_path / "state.db"))
    world.engine.store = store
    await world.send("strict", {"game_date": "d", "v": "A"})
    store.commit_fails = True
    b = await world.send("strict", {"game_date": "d", "v": "B"})
    store.commit_fails = False
    assert b.decision is Decision.FORWARDED and b.extra["committed"] is False
    world.clock.advance(world.config.lease.duration + 1)
    again = await world.send("strict", {"game_date": "d", "v": "A"})
    assert (again.decision, again.reason) == (Decision.FORWARDED, "a lapsed forward of other content may be downstream")
    assert [json.loads(p.data)["v"] for p in world.publisher.published] == ["A", "B", "A"]


async def test_content_equal_to_a_live_lease_is_still_a_duplicate_not_a_forward(world: World) -> None:
    store = SwitchStore(SqliteStore(world.tmp_path / "state.db"))
    world.engine.store = store
    await world.send("strict", {"game_date": "d", "v": "A"})
    store.commit_fails = True
    await world.send("strict", {"game_date": "d", "v": "B"})  # its lease stays until it lapses
    store.commit_fails = False
    assert (await world.send("strict", {"game_date": "d", "v": "B"})).decision is Decision.DUPLICATE


# --- content downstream the state does not record (found by the engine model test) -------


async def _lapsed_forward_of_b_over_a(world: World) -> SwitchStore:
    """A is committed; B's publish lands but its commit never reaches the store; B's lease lapses."""
    store = SwitchStore(SqliteStore(world.tmp_path / "state.db"))
    world.engine.store = store
    await world.send("strict", {"game_date": "d", "v": "A"})
    store.commit_fails = True
    await world.send("strict", {"game_date": "d", "v": "B"})
    store.commit_fails = False
    world.clock.advance(world.config.lease.duration + 1)
    return store


def _published(world: World) -> list[str]:
    return [json.loads(p.data)["v"] for p in world.publisher.published]


async def test_a_failed_forward_over_a_lapsed_forward_of_other_content_keeps_the_next_message_forwarded(
    world: World,
) -> None:
    # The forward of A that takes over B's lapsed lease fails and releases its own lease:
    # before the fix that release erased the only trace of B, and A's redelivery was suppressed.
    await _lapsed_forward_of_b_over_a(world)
    world.publisher.fail_next = 1
    assert (await world.send("strict", {"game_date": "d", "v": "A"}, message_id="a2")).decision is Decision.FAILED
    again = await world.send("strict", {"game_date": "d", "v": "A"}, message_id="a2")
    assert (again.decision, again.reason) == (
        Decision.FORWARDED,
        "what the destination holds is unknown: a forward may have landed unrecorded",
    )
    assert _published(world) == ["A", "B", "A"]


class DiesBeforePublishing:
    """A publisher whose process dies as it starts the publish: no release, no record."""

    async def publish(self, destination: str, data: bytes, attributes: Any, ordering_key: str | None = None) -> str:
        raise Killed

    async def close(self) -> None:
        pass


class Killed(BaseException):
    pass


async def test_a_forward_that_dies_over_a_lapsed_forward_of_other_content_keeps_the_next_message_forwarded(
    world: World,
) -> None:
    # Its own lease (content A, equal to the state) then lapses too: only the claim's
    # "unknown downstream" remembers that B may be what the destination holds.
    store = await _lapsed_forward_of_b_over_a(world)
    dying = Engine(world.config, store, DiesBeforePublishing(), world.recorder, world.clock, "dying")  # type: ignore[arg-type]
    with pytest.raises(Killed):
        await dying.handle("strict", world.message({"game_date": "d", "v": "A"}, message_id="a2"))
    world.clock.advance(world.config.lease.duration + 1)
    again = await world.send("strict", {"game_date": "d", "v": "A"}, message_id="a2")
    assert again.decision is Decision.FORWARDED
    assert _published(world) == ["A", "B", "A"]


async def test_an_older_message_on_unknown_downstream_content_is_still_stale(world: World) -> None:
    store = SwitchStore(SqliteStore(world.tmp_path / "state.db"))
    world.engine.store = store
    await world.send("strict", {"game_date": "d", "v": "A"}, publish_time=100.0)
    store.commit_fails = True
    await world.send("strict", {"game_date": "d", "v": "B"}, publish_time=110.0)
    store.commit_fails = False
    world.clock.advance(world.config.lease.duration + 1)
    world.publisher.fail_next = 1
    await world.send("strict", {"game_date": "d", "v": "A"}, publish_time=120.0)
    older = await world.send("strict", {"game_date": "d", "v": "C"}, publish_time=50.0)
    assert older.decision is Decision.STALE


async def test_content_equal_to_the_state_after_a_fail_open_forward_of_other_content_is_forwarded(
    world: World,
) -> None:
    store = world.engine.store
    assert (await world.send("reports", report("out"))).decision is Decision.FORWARDED
    world.engine.store = DownStore()  # type: ignore[assignment]
    assert (await world.send("reports", report("in"))).decision is Decision.FAIL_OPEN  # downstream: "in"
    world.engine.store = store
    rec = await world.send("reports", report("out"))  # newer, and equal to what the state holds
    assert (rec.decision, rec.reason) == (
        Decision.FORWARDED,
        "what the destination holds is unknown: a forward may have landed unrecorded",
    )


async def test_after_the_forward_that_follows_a_fail_open_equal_content_is_suppressed_again(world: World) -> None:
    store = world.engine.store
    await world.send("reports", report("out"))
    world.engine.store = DownStore()  # type: ignore[assignment]
    await world.send("reports", report("in"))
    world.engine.store = store
    await world.send("reports", report("out"))
    assert (await world.send("reports", report("out"))).decision is Decision.SUPPRESSED
    assert len(world.engine.failed_open) == 0


async def test_a_fail_open_forward_of_the_stored_content_changes_nothing(world: World) -> None:
    store = world.engine.store
    await world.send("reports", report("out"))
    world.engine.store = DownStore()  # type: ignore[assignment]
    await world.send("reports", report("out"))
    world.engine.store = store
    assert (await world.send("reports", report("out"))).decision is Decision.SUPPRESSED


async def test_a_fail_open_forward_that_failed_to_publish_is_not_remembered(world: World) -> None:
    store = world.engine.store
    await world.send("reports", report("out"))
    world.engine.store = DownStore()  # type: ignore[assignment]
    world.publisher.fail_next = 1
    assert (await world.send("reports", report("in"))).decision is Decision.FAILED
    world.engine.store = store
    assert (await world.send("reports", report("out"))).decision is Decision.SUPPRESSED


async def test_an_older_message_redelivered_after_a_newer_fail_open_forward_is_stale(world: World) -> None:
    # Found by the engine model test: the fail-open memory made the older message a forward,
    # and the destination ended on it instead of the newer content forwarded fail-open.
    store = world.engine.store
    await world.send("live", {"game_id": "g", "v": "A"}, publish_time=100.0)
    world.engine.store = DownStore()  # type: ignore[assignment]
    await world.send("live", {"game_id": "g", "v": "A"}, message_id="a2", publish_time=110.0)
    await world.send("live", {"game_id": "g", "v": "B"}, publish_time=120.0)
    world.engine.store = store
    again = await world.send("live", {"game_id": "g", "v": "A"}, message_id="a2", publish_time=110.0)
    assert again.decision is Decision.STALE
    assert _published(world) == ["A", "A", "B"]


async def test_another_instance_does_not_know_of_a_fail_open_forward(world: World) -> None:
    # README "Fail-open": the memory is the failing-open instance's own.
    await world.send("reports", report("out"))
    world.engine.store = DownStore()  # type: ignore[assignment]
    await world.send("reports", report("in"))
    other = world.make_engine("two")
    assert (await world.send("reports", report("out"), engine=other)).decision is Decision.SUPPRESSED


async def test_another_instance_forwards_an_older_message_redelivered_after_a_fail_open_of_newer_content(
    world: World,
) -> None:
    # README "Fail-open": the other instance decides on the stored state alone, so it knows
    # neither that C went out nor when C was published; B, older than C, ends last.
    store = world.engine.store
    await world.send("live", {"game_id": "g", "v": "A"}, publish_time=100.0)
    world.engine.store = DownStore()  # type: ignore[assignment]
    await world.send("live", {"game_id": "g", "v": "B"}, message_id="b", publish_time=110.0)
    await world.send("live", {"game_id": "g", "v": "C"}, publish_time=120.0)
    world.engine.store = store
    other = world.make_engine("two")
    again = await world.send("live", {"game_id": "g", "v": "B"}, engine=other, message_id="b", publish_time=110.0)
    assert again.decision is Decision.FORWARDED
    assert _published(world) == ["A", "B", "C", "B"]
