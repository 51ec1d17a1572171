"""The publisher's ordering keys (`Turns`): a key's publishes one at a time, in the order asked,
a failed or abandoned one never letting a later one overtake, and nothing kept for idle keys."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pubsub_filter.backends.publishers.turns import Turns


class Sends:
    """What each fake send saw: a log of (event, name), and a gate per name to end its send."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}

    def prepare(self, *names: str) -> None:
        for name in names:
            self.gates[name] = asyncio.Event()
            self.started[name] = asyncio.Event()

    async def send(self, turns: Turns, key: str, name: str, fail: bool = False) -> str:
        async with turns.turn(key):
            self.log.append(("start", name))
            self.started[name].set()
            await self.gates[name].wait()
            self.log.append(("end", name))
            if fail:
                raise RuntimeError(f"{name} failed")
            return name


async def settle() -> None:
    for _ in range(5):  # the turn hand-offs run as loop callbacks: let them all run
        await asyncio.sleep(0)


async def test_a_keys_publishes_run_one_at_a_time_in_the_order_asked() -> None:
    turns, sends = Turns(), Sends()
    sends.prepare("a", "b", "c")
    tasks = [asyncio.create_task(sends.send(turns, "k", n)) for n in ("a", "b", "c")]
    await sends.started["a"].wait()
    await settle()
    assert sends.log == [("start", "a")], "b and c wait for a"
    for name in ("c", "b", "a"):  # released last to first: each still waits for the one before
        sends.gates[name].set()
    assert await asyncio.gather(*tasks) == ["a", "b", "c"]
    assert sends.log == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b"), ("start", "c"), ("end", "c")]
    await settle()
    assert len(turns) == 0, "an idle key keeps no entry"


async def test_other_keys_do_not_wait() -> None:
    turns, sends = Turns(), Sends()
    sends.prepare("a", "b")
    first = asyncio.create_task(sends.send(turns, "k1", "a"))
    second = asyncio.create_task(sends.send(turns, "k2", "b"))
    await sends.started["a"].wait()
    await sends.started["b"].wait()
    assert len(turns) == 2
    sends.gates["a"].set()
    sends.gates["b"].set()
    assert await asyncio.gather(first, second) == ["a", "b"]


async def test_a_failed_publish_hands_its_turn_on() -> None:
    turns, sends = Turns(), Sends()
    sends.prepare("a", "b")
    first = asyncio.create_task(sends.send(turns, "k", "a", fail=True))
    second = asyncio.create_task(sends.send(turns, "k", "b"))
    await sends.started["a"].wait()
    sends.gates["b"].set()
    sends.gates["a"].set()
    with pytest.raises(RuntimeError, match="a failed"):
        await first
    assert await second == "b"
    assert sends.log == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]


async def test_one_given_up_while_waiting_does_not_let_the_next_overtake_the_one_before_it() -> None:
    turns, sends = Turns(), Sends()
    sends.prepare("a", "b", "c")
    first = asyncio.create_task(sends.send(turns, "k", "a"))
    await sends.started["a"].wait()
    waiting = asyncio.create_task(sends.send(turns, "k", "b"))
    await settle()
    waiting.cancel()  # its deadline, or its caller's cancel, while a is still being sent
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    assert not first.done(), "a cancel of the one waiting never reaches the one under way"
    third = asyncio.create_task(sends.send(turns, "k", "c"))
    sends.gates["c"].set()
    await settle()
    assert ("start", "c") not in sends.log, "c went out while a, asked before it, was still being sent"
    sends.gates["a"].set()
    assert (await first, await third) == ("a", "c")
    assert sends.log == [("start", "a"), ("end", "a"), ("start", "c"), ("end", "c")]
    await settle()
    assert len(turns) == 0
