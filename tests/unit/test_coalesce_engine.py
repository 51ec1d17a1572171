"""Coalescing through the engine: a burst of one key forwards once, its newest content, and
every older message is answered `superseded` while that newest is still held (never acked)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.model import Decision, Message
from tests.support.coalesce_world import CoalesceWorld


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[CoalesceWorld]:
    w = CoalesceWorld(tmp_path)
    yield w
    await w.engine.close()


async def test_a_burst_forwards_once_with_its_newest_content(world: CoalesceWorld) -> None:
    held = [await world.arrive(world.message(f"m{i}", 1.0 + i / 10, 100.0 + i)) for i in range(5)]
    # every older message is answered as soon as a newer one is held; the newest waits
    assert [t.done() for t in held] == [True, True, True, True, False]
    for i, task in enumerate(held[:-1]):
        rec = world.record_of(task)
        assert rec.decision is Decision.SUPERSEDED and rec.acked
        assert rec.details["superseded_by"] == f"m{i + 1}"
        assert rec.key == "L1"
    assert world.publisher.published == []
    await world.advance(1.0)  # the key was quiet for `quiet`
    assert world.record_of(held[-1]).decision is Decision.FORWARDED
    assert world.forwarded_prices() == [1.4]


async def test_an_older_message_arriving_late_is_superseded_by_the_held_newer_one(world: CoalesceWorld) -> None:
    newest = await world.arrive(world.message("new", 2.0, 200.0))
    late = await world.arrive(world.message("old", 1.0, 100.0))
    assert world.record_of(late).decision is Decision.SUPERSEDED
    assert world.record_of(late).details["superseded_by"] == "new"
    await world.advance(1.0)
    assert world.record_of(newest).decision is Decision.FORWARDED
    assert world.forwarded_prices() == [2.0]


async def test_a_key_that_never_goes_quiet_forwards_once_per_max_wait(world: CoalesceWorld) -> None:
    for i in range(40):  # 20 a second for 2 s, then on for 2 s more
        await world.arrive(world.message(f"m{i}", 1.0 + i, 100.0 + i / 20))
        await world.advance(0.05)
        if i == 79:
            break
    await world.advance(5.0)
    # the first burst ended at max_wait (4 s after its first message); the rest formed a second one
    assert len(world.forwarded_prices()) <= 2
    assert world.forwarded_prices()[-1] == 40.0


async def test_each_burst_is_decided_as_usual_unchanged_content_is_suppressed(world: CoalesceWorld) -> None:
    first = await world.arrive(world.message("a", 1.0, 100.0))
    await world.advance(1.0)
    assert world.record_of(first).decision is Decision.FORWARDED
    again = [await world.arrive(world.message(f"b{i}", 1.0, 110.0 + i)) for i in range(3)]
    await world.advance(1.0)
    assert [world.record_of(t).decision for t in again] == [Decision.SUPERSEDED] * 2 + [Decision.SUPPRESSED]
    assert world.forwarded_prices() == [1.0]


async def test_a_redelivery_of_a_decided_message_is_answered_at_once_and_supersedes_nothing(
    world: CoalesceWorld,
) -> None:
    first = await world.arrive(world.message("a", 1.0, 100.0))
    await world.advance(1.0)
    held = await world.arrive(world.message("b", 2.0, 90.0))  # older than a: stale, answered at once
    assert world.record_of(held).decision is Decision.STALE
    newer = await world.arrive(world.message("c", 3.0, 120.0))
    redelivered = await world.arrive(world.message("a", 1.0, 100.0))
    assert world.record_of(redelivered).decision is Decision.DUPLICATE
    assert not newer.done()  # the redelivery superseded nothing
    await world.advance(1.0)
    assert world.record_of(newer).decision is Decision.FORWARDED
    assert world.record_of(first).decision is Decision.FORWARDED


async def test_undecidable_messages_are_answered_at_once(world: CoalesceWorld) -> None:
    held = await world.arrive(world.message("a", 1.0, 100.0))
    bad = await world.arrive(Message(b"{not json", {}, "bad", 101.0))
    keyless = await world.arrive(Message(json.dumps({"price": 2}).encode(), {}, "nokey", 102.0))
    assert world.record_of(bad).decision is Decision.FAIL_OPEN  # as without coalesce: forwarded, not held
    assert world.record_of(keyless).decision is Decision.FAIL_OPEN
    assert not held.done()
    await world.advance(1.0)
    assert world.record_of(held).decision is Decision.FORWARDED


async def test_a_redelivery_of_the_held_message_takes_its_place_and_the_older_delivery_is_nacked(
    world: CoalesceWorld,
) -> None:
    first = await world.arrive(world.message("a", 1.0, 100.0))
    again = await world.arrive(world.message("a", 1.0, 100.0))
    rec = world.record_of(first)
    assert rec.decision is Decision.CONTENDED and not answer_for(rec).ack
    await world.advance(1.0)
    assert world.record_of(again).decision is Decision.FORWARDED


async def test_a_message_with_an_ordering_key_is_never_held(world: CoalesceWorld) -> None:
    msg = world.message("a", 1.0, 100.0)
    ordered = Message(msg.data, {}, "a", 100.0, ordering_key="L1")
    task = await world.arrive(ordered)
    assert world.record_of(task).decision is Decision.FORWARDED
    assert world.engine.holding.counts["ordered"] == 1


async def test_a_bypassed_message_is_decided_at_once(world: CoalesceWorld) -> None:
    task = await world.arrive(world.message("a", 1.0, 100.0, state="live"), route="live")
    assert world.record_of(task).decision is Decision.FORWARDED


async def test_a_route_without_coalesce_decides_at_once(world: CoalesceWorld) -> None:
    task = await world.arrive(world.message("a", 1.0, 100.0), route="plain")
    assert world.record_of(task).decision is Decision.FORWARDED


async def test_past_the_bound_a_message_is_decided_at_once_and_counted(world: CoalesceWorld) -> None:
    world.engine.holding.coalescer.max_held = 1
    held = await world.arrive(world.message("a", 1.0, 100.0, line="L1"))
    other = await world.arrive(world.message("b", 1.0, 100.0, line="L2"))
    assert world.record_of(other).decision is Decision.FORWARDED
    assert world.engine.holding.counts["full"] == 1
    await world.advance(1.0)
    assert world.record_of(held).decision is Decision.FORWARDED


async def test_a_stop_decides_what_is_held_at_once(world: CoalesceWorld) -> None:
    tasks = [await world.arrive(world.message(f"m{i}", 1.0 + i, 100.0 + i)) for i in range(3)]
    await world.engine.close()
    assert [world.record_of(t).decision for t in tasks] == [Decision.SUPERSEDED] * 2 + [Decision.FORWARDED]
    assert world.forwarded_prices() == [3.0]


async def test_a_cancelled_held_message_is_nacked_never_acked(world: CoalesceWorld) -> None:
    older = await world.arrive(world.message("a", 1.0, 100.0))
    newest = await world.arrive(world.message("b", 2.0, 101.0))
    newest.cancel()
    await world.settled()
    assert newest.cancelled()
    assert world.record_of(older).decision is Decision.SUPERSEDED
    assert world.recorder.records[-1].decision is Decision.FAILED  # recorded: cancelled, nacked
    # Pub/Sub redelivers the newest; it is decided as a burst of its own
    again = await world.arrive(world.message("b", 2.0, 101.0))
    await world.advance(1.0)
    assert world.record_of(again).decision is Decision.FORWARDED
    assert world.forwarded_prices() == [2.0]


async def test_a_shadow_route_forwards_what_it_would_supersede_and_records_it(tmp_path: Path) -> None:
    world = CoalesceWorld(tmp_path, mode="shadow")
    try:
        older = await world.arrive(world.message("a", 1.0, 100.0))
        newest = await world.arrive(world.message("b", 2.0, 101.0))
        rec = world.record_of(older)
        assert rec.decision is Decision.SUPERSEDED and rec.acked and rec.published_id is not None
        await world.advance(1.0)
        assert world.record_of(newest).decision is Decision.FORWARDED
        assert world.forwarded_prices() == [1.0, 2.0]
    finally:
        await world.engine.close()


async def test_two_instances_each_forward_their_newest_and_the_stale_guard_keeps_the_order(tmp_path: Path) -> None:
    world = CoalesceWorld(tmp_path)
    other = world.make_engine("two")
    try:
        a = [await world.arrive(world.message(f"a{i}", 1.0 + i, 100.0 + 2 * i)) for i in range(3)]  # 100, 102, 104
        b = [await world.arrive(world.message(f"b{i}", 10.0 + i, 101.0 + 2 * i), engine=other) for i in range(2)]
        await world.advance(1.0)
        # each instance forwards at most once for its part of the burst; the older one ends stale
        decisions = sorted(str(world.record_of(t).decision) for t in (a[-1], b[-1]))
        assert decisions in (["forwarded", "stale"], ["forwarded", "forwarded"])
        assert world.forwarded_prices()[-1] == 3.0  # a2, published at 104, is the newest
    finally:
        await other.close()


@pytest.mark.loop_may_block(
    "tracemalloc slows every allocation while it traces, and its snapshots walk every traced block on the loop:"
    " the measurement's cost"
)
async def test_memory_per_held_message_through_the_engine_is_measured(world: CoalesceWorld) -> None:
    """All a held message costs while its `handle` call waits (its task and frames, the message,
    the delivery, the coalescer's slot), besides a push request's own body: measured, and said in
    docs/configuration.md."""
    import tracemalloc

    msgs = [world.message(f"m{i}", 1.0, 100.0, line=f"L{i}") for i in range(200)]
    for msg in msgs[:20]:  # warm: the first calls fill the route's and the store's caches
        await world.arrive(msg)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for msg in msgs[20:]:
        await world.arrive(msg)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    # the suite's own: asyncio's debug mode keeps a creation traceback per task, the loop watch
    # and this world their records; none of it is the held message's in production
    ours = ("traceback.py", "loopclock.py", "loopwatch.py", "/tests/", "logging")
    held = [s for s in after.compare_to(before, "filename") if not any(o in str(s.traceback) for o in ours)]
    per_message = sum(s.size_diff for s in held) / 180
    assert len(world.engine.holding) == 200
    print(f"memory per held message through the engine: {per_message:.0f} B")
    assert per_message < 8 * 1024
    await world.engine.close()
