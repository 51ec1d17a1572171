"""Large push bodies are decoded one per turn of the event loop (`pubsub_filter.push.turns`): the
loop polls its sockets, the health probe's among them, between one decode and the next."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from pubsub_filter.push.turns import Turns


async def test_holders_never_overlap_and_the_loop_turns_between_any_two() -> None:
    turns, events, ticking = Turns(), [], True

    async def ticker() -> None:  # what the loop does between callbacks: another request's step
        while ticking:
            events.append("tick")
            await asyncio.sleep(0)

    async def decode(name: str) -> None:
        async with turns.turn():
            events.append(f"{name} in")
            events.append(f"{name} out")  # no await: a decode holds its turn to the end

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await asyncio.gather(*(decode(n) for n in "abcd"))  # all four bodies ended in one turn
    ticking = False
    await tick
    holders = [e for e in events if e != "tick"]
    assert holders == ["a in", "a out", "b in", "b out", "c in", "c out", "d in", "d out"]
    entries = [i for i, e in enumerate(events) if e.endswith(" in")]
    for before, after in itertools.pairwise(entries):
        assert "tick" in events[before:after], events


async def test_the_first_holder_yields_once_before_its_decode() -> None:
    turns, events = Turns(), []

    async def decode() -> None:
        async with turns.turn():
            events.append("decode")

    task = asyncio.create_task(decode())
    await asyncio.sleep(0)  # the task entered, and yielded
    events.append("polled")
    await task
    assert events == ["polled", "decode"]


@pytest.mark.parametrize("where", ["waiting for the turn", "yielding in it"])
async def test_a_cancel_leaves_the_turn_to_the_next(where: str) -> None:
    turns, entered = Turns(), []

    async def decode(name: str) -> None:
        async with turns.turn():
            entered.append(name)

    first = asyncio.create_task(decode("first"))
    second = asyncio.create_task(decode("second"))
    await asyncio.sleep(0)  # first holds the lock, yielding; second waits for it
    (second if where == "waiting for the turn" else first).cancel()
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) == 1
    assert len(entered) == 1
    await asyncio.wait_for(decode("third"), 5)  # the turn is free
    assert entered[-1] == "third"
