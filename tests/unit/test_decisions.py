"""The decision table, as a specification: one behaviour per test, on the embedded SQLite store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Cause, Decision, KeyState
from pubsub_filter.core.ports import Traced
from tests.support.decision_world import DownStore, World, game, report
from tests.support.fakes import MemoryPublisher


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield World(tmp_path)


# --- forwarded / suppressed ---------------------------------------------------------


async def test_first_message_for_a_key_is_forwarded(world: World) -> None:
    rec = await world.send("reports", report("out", "in"))
    assert (rec.decision, rec.reason) == (Decision.FORWARDED, "new key")
    assert len(world.publisher.published) == 1


async def test_unchanged_content_is_suppressed(world: World) -> None:
    await world.send("reports", report("out", "in", scraped="09:00"))
    rec = await world.send("reports", report("out", "in", scraped="13:00"))
    assert rec.decision is Decision.SUPPRESSED
    assert len(world.publisher.published) == 1


async def test_suppress_path_writes_nothing(world: World) -> None:
    await world.send("reports", report("out", "in"))
    before = await world.state("reports", "2025-01-10")
    await world.send("reports", report("out", "in", scraped="13:00"))
    after = await world.state("reports", "2025-01-10")
    assert before is not None and after is not None and after.version == before.version


async def test_changed_content_is_forwarded(world: World) -> None:
    await world.send("reports", report("out", "in"))
    rec = await world.send("reports", report("out", "out"))
    assert (rec.decision, rec.reason) == (Decision.FORWARDED, "content changed")
    assert len(world.publisher.published) == 2


async def test_shuffled_rows_and_keys_are_unchanged(world: World) -> None:
    await world.send("reports", report("out", "in", "questionable"))
    shuffled = report("out", "in", "questionable", order=[2, 0, 1])
    shuffled = {k: shuffled[k] for k in reversed(list(shuffled))}
    assert (await world.send("reports", shuffled)).decision is Decision.SUPPRESSED


async def test_a_change_in_an_excluded_field_is_suppressed(world: World) -> None:
    await world.send("live", game("final", 101, scraped="1"))
    assert (await world.send("live", game("final", 101, scraped="2"))).decision is Decision.SUPPRESSED


async def test_a_to_b_to_a_forwards_all_three(world: World) -> None:
    decisions = [(await world.send("reports", report(s))).decision for s in ("out", "in", "out")]
    assert decisions == [Decision.FORWARDED] * 3
    assert len(world.publisher.published) == 3


async def test_window_expiry_forwards_unchanged_content_again(world: World) -> None:
    await world.send("reports", report("out"))
    world.clock.advance(59 * 60)
    assert (await world.send("reports", report("out"))).decision is Decision.SUPPRESSED
    world.clock.advance(2 * 60)
    rec = await world.send("reports", report("out"))
    assert (rec.decision, rec.reason) == (Decision.FORWARDED, "unchanged, but the window expired")


async def test_forwarded_message_keeps_attributes_and_gains_provenance(world: World) -> None:
    rec = await world.send(
        "reports", report("out"), attributes={"source": "nbac"}, ordering_key="2025-01-10", publish_time=1.5
    )
    dest, data, attrs, ordering_key = world.publisher.published[0]
    assert dest == "phase3" and ordering_key == "2025-01-10"
    assert json.loads(data) == report("out")
    assert attrs["source"] == "nbac"
    assert attrs["filter_fingerprint"] == rec.fingerprint
    assert attrs["filter_source_message_id"] == rec.message_id
    assert attrs["filter_route"] == "reports"
    assert attrs["filter_source_publish_time"] == "1970-01-01T00:00:01.500000Z"


# --- duplicates and redelivery ------------------------------------------------------


async def test_redelivery_of_a_forwarded_message_is_a_duplicate(world: World) -> None:
    first = await world.send("reports", report("out"), message_id="42")
    again = await world.send("reports", report("out"), message_id="42")
    assert (first.decision, again.decision) == (Decision.FORWARDED, Decision.DUPLICATE)
    assert len(world.publisher.published) == 1


async def test_redelivery_after_an_intervening_change_is_still_a_duplicate(world: World) -> None:
    await world.send("reports", report("out"), message_id="42")
    await world.send("reports", report("in"), message_id="43")
    again = await world.send("reports", report("out"), message_id="42")
    assert again.decision is Decision.DUPLICATE
    assert len(world.publisher.published) == 2


async def test_redelivery_of_a_suppressed_message_after_a_change_is_not_forwarded(world: World) -> None:
    await world.send("reports", report("out"), message_id="41", publish_time=100.0)
    assert (
        await world.send("reports", report("out"), message_id="42", publish_time=200.0)
    ).decision is Decision.SUPPRESSED
    await world.send("reports", report("in"), message_id="43", publish_time=300.0)
    again = await world.send("reports", report("out"), message_id="42", publish_time=200.0)
    assert again.decision is Decision.STALE  # acked, nothing published: the same outcome as the first time
    assert len(world.publisher.published) == 2


async def test_same_content_in_flight_under_another_id_is_a_duplicate(world: World) -> None:
    world.publisher.gate = asyncio.Event()
    first = asyncio.create_task(world.send("reports", report("out")))
    await world.publisher.started.wait()
    second = await world.send("reports", report("out"))
    world.publisher.gate.set()
    assert (second.decision, second.reason) == (Decision.DUPLICATE, "same content in flight")
    assert (await first).decision is Decision.FORWARDED
    assert len(world.publisher.published) == 1


async def test_different_content_in_flight_is_contended(world: World) -> None:
    world.publisher.gate = asyncio.Event()
    first = asyncio.create_task(world.send("reports", report("out")))
    await world.publisher.started.wait()
    second = await world.send("reports", report("in"))
    world.publisher.gate.set()
    await first
    assert (second.decision, second.reason) == (Decision.CONTENDED, "other content for this key is in flight")
    assert (await world.send("reports", report("in"))).decision is Decision.FORWARDED  # the retry goes through


async def test_redelivery_of_the_message_in_flight_is_contended_not_acked(world: World) -> None:
    world.publisher.gate = asyncio.Event()
    first = asyncio.create_task(world.send("reports", report("out"), message_id="7"))
    await world.publisher.started.wait()
    again = await world.send("reports", report("out"), message_id="7")
    world.publisher.gate.set()
    await first
    assert (again.decision, again.reason) == (Decision.CONTENDED, "this message is already in flight")
    assert (await world.send("reports", report("out"), message_id="7")).decision is Decision.DUPLICATE


async def test_a_claim_lost_to_the_same_change_is_suppressed_without_the_lost_attempts_row_details(
    world: World,
) -> None:
    # Two instances read the same state and both decide to forward the same change; the other
    # one's forward commits before our claim, so ours loses the race and decides again on what
    # it committed: suppressed, and its record says nothing of the rows the lost attempt saw.
    await world.send("reports", report("out", "out"))
    changed = report("in", "out", scraped="10:00")
    other = world.make_engine("two")

    class ClaimsAfterTheOther(SqliteStore):
        async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
            assert (await world.send("reports", changed, engine=other)).decision is Decision.FORWARDED
            return await super().claim(route, key, seen, new)

    store = ClaimsAfterTheOther(world.tmp_path / "state.db")
    late = Engine(world.config, store, world.publisher, world.recorder, world.clock, "three")
    rec = await world.send("reports", changed, engine=late)
    assert (rec.decision, rec.reason) == (Decision.SUPPRESSED, "unchanged since last forward")
    assert dict(rec.extra) == {}, rec.extra
    assert len(world.publisher.published) == 2
    await store.close()


# --- stale --------------------------------------------------------------------------


async def test_older_message_with_different_content_is_stale(world: World) -> None:
    await world.send("reports", report("in"), publish_time=500.0)
    rec = await world.send("reports", report("out"), publish_time=400.0)
    assert rec.decision is Decision.STALE
    assert len(world.publisher.published) == 1


async def test_stale_forward_route_forwards_older_messages(world: World) -> None:
    await world.send("replays", {"game_date": "d", "v": 2}, publish_time=500.0)
    assert (await world.send("replays", {"game_date": "d", "v": 1}, publish_time=400.0)).decision is Decision.FORWARDED


# --- shadow and bypass --------------------------------------------------------------


async def test_shadow_mode_forwards_everything_and_records_what_it_would_do(world: World) -> None:
    first = await world.send("shadow", {"game_date": "d", "v": 1, "scraped": "a"})
    second = await world.send("shadow", {"game_date": "d", "v": 1, "scraped": "b"})
    assert (first.decision, first.enforced) == (Decision.FORWARDED, False)
    assert (second.decision, second.enforced) == (Decision.SUPPRESSED, False)
    assert len(world.publisher.published) == 2


async def test_bypass_rule_forwards_unchanged_content(world: World) -> None:
    await world.send("live", game("live", 50, scraped="1"))
    rec = await world.send("live", game("live", 50, scraped="2"))
    assert (rec.decision, rec.reason) == (Decision.FORWARDED, "bypass rule")


async def test_bypass_still_answers_redeliveries_as_duplicates(world: World) -> None:
    await world.send("live", game("live", 50), message_id="9")
    assert (await world.send("live", game("live", 50), message_id="9")).decision is Decision.DUPLICATE


async def test_after_bypass_ends_unchanged_content_is_suppressed_again(world: World) -> None:
    await world.send("live", game("live", 101))
    await world.send("live", game("final", 101))
    assert (await world.send("live", game("final", 101, scraped="9"))).decision is Decision.SUPPRESSED


# --- leases -------------------------------------------------------------------------


async def test_expired_lease_of_a_dead_holder_is_taken_over(world: World) -> None:
    dead = world.make_engine("dead", MemoryPublisher())
    dead.publisher.gate = asyncio.Event()  # type: ignore[attr-defined]
    stuck = asyncio.create_task(world.send("reports", report("out"), engine=dead))
    await dead.publisher.started.wait()  # type: ignore[attr-defined]
    world.clock.advance(world.config.lease.duration + 1)
    rec = await world.send("reports", report("in"))
    assert (rec.decision, rec.fence) == (Decision.FORWARDED, 2)
    dead.publisher.gate.set()  # type: ignore[attr-defined]
    await stuck


async def test_late_holder_with_an_old_fence_cannot_overwrite(world: World) -> None:
    late_pub = MemoryPublisher()
    late_pub.gate = asyncio.Event()
    late = world.make_engine("late", late_pub)
    slow = asyncio.create_task(world.send("reports", report("out"), engine=late))
    await late_pub.started.wait()
    world.clock.advance(world.config.lease.duration + 1)  # no heartbeat ran: the lease lapsed
    newer = await world.send("reports", report("in"))
    late_pub.gate.set()
    stale = await slow
    assert newer.fence == 2 and stale.fence == 1
    assert stale.decision is Decision.FORWARDED and stale.extra.get("committed") is False
    state = await world.state("reports", "2025-01-10")
    assert state is not None and state.fingerprint == newer.fingerprint and state.fence == 2


async def test_heartbeat_keeps_the_lease_while_a_publish_is_slow(tmp_path: Path) -> None:
    world = World(
        tmp_path,
        lease={"duration": "3s", "ack_deadline": "2s", "heartbeat": "1s"},
        store_errors={"timeout": "0.5s", "budget": "1s"},  # inside the ack deadline, as `check` requires
    )
    world.publisher.gate = asyncio.Event()
    slow = asyncio.create_task(world.send("reports", report("out")))
    await world.publisher.started.wait()
    claimed = await world.state("reports", "2025-01-10")
    assert claimed is not None
    for _ in range(2):  # two beats, each a second of the injected clock
        assert await world.sleep.asleep() == 1.0
        await world.sleep.wake()
    await world.sleep.asleep()  # sleeping again: the second extension is written
    state = await world.state("reports", "2025-01-10")
    assert state is not None and state.lease is not None
    assert state.version == claimed.version + 2 and state.lease.expires_at == world.clock.now() + 3
    world.publisher.gate.set()
    rec = await slow
    assert rec.decision is Decision.FORWARDED and rec.extra.get("heartbeats") == 2
    assert rec.extra.get("committed", True) is True


async def test_failed_publish_releases_the_lease_and_fails(world: World) -> None:
    world.publisher.fail = True
    rec = await world.send("reports", report("out"))
    assert (rec.decision, rec.extra["cause"]) == (Decision.FAILED, "publish")
    state = await world.state("reports", "2025-01-10")
    assert state is not None and state.lease is None and state.fingerprint is None
    world.publisher.fail = False
    assert (await world.send("reports", report("out"))).decision is Decision.FORWARDED  # the redelivery goes through


# --- the store unreachable ----------------------------------------------------------


async def test_store_down_fails_open_by_default(world: World) -> None:
    world.engine.store = DownStore()  # type: ignore[assignment]
    rec = await world.send("reports", report("out"))
    assert rec.decision is Decision.FAIL_OPEN
    assert len(world.publisher.published) == 1


async def test_store_down_on_a_retry_route_fails_without_publishing(world: World) -> None:
    world.engine.store = DownStore()  # type: ignore[assignment]
    rec = await world.send("strict", {"game_date": "d"})
    assert (rec.decision, rec.extra["cause"]) == (Decision.FAILED, "store")
    assert world.publisher.published == []


# --- rejected -----------------------------------------------------------------------


async def test_unknown_route_is_rejected(world: World) -> None:
    rec = await world.send("nope", {"game_date": "d"})
    assert (rec.decision, rec.extra["cause"]) == (Decision.REJECTED, "unknown_route")


async def test_missing_key_field_is_forwarded_fail_open(world: World) -> None:
    rec = await world.send("reports", {"players": []})
    assert (rec.decision, rec.extra["missing_field"]) == (Decision.FAIL_OPEN, "payload.game_date")
    assert (rec.reason or "").startswith("key field payload.game_date is missing")


async def test_missing_key_field_is_rejected_where_the_route_says_reject(world: World) -> None:
    rec = await world.send("keyed", {"players": []})
    assert (rec.decision, rec.reason) == (Decision.REJECTED, "key field payload.game_date is missing")


async def test_rows_that_are_not_a_list_are_forwarded_fail_open(world: World) -> None:
    rec = await world.send("reports", {"game_date": "d", "players": "none"})
    assert rec.decision is Decision.FAIL_OPEN and "not a list" in (rec.reason or "")


async def test_rows_that_are_not_a_list_are_rejected_where_the_route_says_reject(world: World) -> None:
    rec = await world.send("keyed", {"game_date": "d", "players": "none"})
    assert rec.decision is Decision.REJECTED and "not a list" in (rec.reason or "")


async def test_message_from_another_subscription_is_rejected(world: World) -> None:
    ok = await world.send("subscribed", {"game_date": "d"}, subscription="projects/p/subscriptions/raw-reports")
    wrong = await world.send("subscribed", {"game_date": "e"}, subscription="projects/p/subscriptions/other")
    assert ok.decision is Decision.FORWARDED
    assert wrong.decision is Decision.REJECTED and "other" in (wrong.reason or "")


async def test_non_json_payload_is_decided_on_its_raw_bytes(world: World) -> None:
    first = await world.send("raw", b"\x00binary", attributes={"id": "a"})
    second = await world.send("raw", b"\x00binary", attributes={"id": "a"})
    assert (first.decision, second.decision) == (Decision.FORWARDED, Decision.SUPPRESSED)
    assert first.extra["payload_kind"] == "raw"


async def test_non_json_payload_with_a_payload_key_is_forwarded_fail_open(world: World) -> None:
    rec = await world.send("reports", b"not json")
    assert rec.decision is Decision.FAIL_OPEN and "not JSON" in (rec.reason or "")


async def test_non_json_payload_with_a_payload_key_is_rejected_where_the_route_says_reject(world: World) -> None:
    rec = await world.send("keyed", b"not json")
    assert rec.decision is Decision.REJECTED and "not JSON" in (rec.reason or "")


async def test_every_decision_is_recorded_once(world: World) -> None:
    await world.send("reports", report("out"))
    await world.send("reports", report("out"))
    await world.send("nope", {})
    assert [r.decision for r in world.recorder.records] == [Decision.FORWARDED, Decision.SUPPRESSED, Decision.REJECTED]


async def test_forwarded_source_publish_time_keeps_its_milliseconds(world: World) -> None:
    # 1736528405.123 is stored as 1736528405.1229999...: truncating would write .122999
    await world.send("reports", report("out"), publish_time=1736528405.123)
    assert world.publisher.published[0][2]["filter_source_publish_time"] == "2025-01-10T17:00:05.123000Z"


async def test_a_failure_while_building_the_publish_releases_the_lease(world: World) -> None:
    # no surface produces an infinite publish time; it stands for any bug before the publish call
    rec = await world.send("reports", report("out"), publish_time=float("inf"))
    assert (rec.decision, rec.extra["cause"]) == (Decision.FAILED, "publish")
    state = await world.state("reports", "2025-01-10")
    assert state is not None and state.lease is None  # the redelivery is not made to wait out a lease
    assert (await world.send("reports", report("out"))).decision is Decision.FORWARDED


async def test_an_act_runs_in_place_of_its_own_calls_publish_only(tmp_path: Path) -> None:
    world = World(tmp_path)
    gate = asyncio.Event()
    publisher = MemoryPublisher(gate=gate)
    engine = world.make_engine("one", publisher)
    publishing = asyncio.create_task(engine.handle("reports", world.message({"game_date": "d1", "players": []})))
    await publisher.started.wait()  # the publishing call is in flight while the act's call runs
    acted: list[bytes] = []

    class Body:
        cause, lands_despite_cancel, attribute_limits = Cause.WORK, False, False

        async def send(
            self, destination: str, data: bytes, attributes: Mapping[str, str], key: str | None, traced: Traced
        ) -> str:
            acted.append(data)
            return "in-process"

    rec = (await engine.handle("reports", world.message({"game_date": "d2", "players": []}), via=Body())).record
    gate.set()
    published = (await publishing).record
    assert (rec.published_id, [json.loads(d)["game_date"] for d in acted]) == ("in-process", ["d2"])
    assert (published.published_id, [json.loads(d)["game_date"] for d in publisher.data]) == ("1", ["d1"])
