"""`BytesInFlight`, against a reference model over random histories: pushes arriving, waiting
for room, released, and cancelled (also between being given room and waking), with the loop
let run or not between steps. At every quiet point: what is held is exactly the admitted
pushes' sizes, it is within the bound unless one push alone is in flight, no waiting push would
fit, and a cancelled or refused wait holds nothing."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.push.admission import BytesInFlight

BOUND = 100
#: A wait no history outlasts: every wait here ends by room or by a cancel.
FOREVER = 3600.0

steps = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 2 * BOUND)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("settle"), st.just(0)),
    ),
    max_size=40,
)


async def settle() -> None:
    for _ in range(5):  # each woken wait resumes, and its task ends
        await asyncio.sleep(0)


async def run(history: list[tuple[str, int]]) -> None:
    flight = BytesInFlight(BOUND)
    tasks: list[tuple[int, asyncio.Task[bool]]] = []
    released: set[int] = set()

    def admitted() -> list[int]:
        return [
            i for i, (_, t) in enumerate(tasks) if t.done() and not t.cancelled() and t.result() and i not in released
        ]

    def check() -> None:
        held = [tasks[i][0] for i in admitted()]
        assert flight.held == sum(held)
        assert flight.held <= BOUND or len(held) == 1
        pending = [size for size, t in tasks if not t.done()]
        assert sorted(size for size, _ in flight.waiting) == sorted(pending)
        for size, _ in flight.waiting:
            assert flight.held and flight.held + size > BOUND  # no push waits that would fit

    for op, n in history:
        if op == "arrive":
            tasks.append((n, asyncio.create_task(flight.admit_within(n, FOREVER))))
        elif op == "release":
            ready = admitted()
            if ready:
                i = ready[n % len(ready)]
                released.add(i)
                flight.release(tasks[i][0])
        elif op == "cancel":
            waiting = [t for _, t in tasks if not t.done()]
            if waiting:
                waiting[n % len(waiting)].cancel()
        else:
            await settle()
            check()
    await settle()
    check()
    for i in admitted():  # every push answered: nothing is left held, and nobody waits
        released.add(i)
        flight.release(tasks[i][0])
        await settle()
    for _, t in tasks:
        if not t.done():
            t.cancel()
    await settle()
    assert flight.held == sum(tasks[i][0] for i in admitted())
    assert not flight.waiting


@settings(max_examples=300, deadline=None)
@given(steps)
def test_room_given_and_taken_back_matches_the_model_over_any_history(history: list[tuple[str, int]]) -> None:
    asyncio.run(run(history))


async def test_a_wait_that_outlasts_its_seconds_is_refused_and_holds_nothing() -> None:
    flight = BytesInFlight(BOUND)
    assert flight.admit(80)
    assert not await flight.admit_within(80, 0.01)  # nothing releases meanwhile
    assert flight.held == 80 and not flight.waiting
    assert not await flight.admit_within(80, 0)  # no wait at all
    flight.release(80)
    assert await flight.admit_within(80, 0)
    assert flight.held == 80


async def test_room_given_in_the_step_a_wait_times_out_is_kept() -> None:
    flight = BytesInFlight(BOUND)
    assert flight.admit(80)
    wait = asyncio.create_task(flight.admit_within(80, 0.01))
    await asyncio.sleep(0)
    assert flight.waiting
    loop = asyncio.get_running_loop()
    # the release lands as the timeout's cancel is delivered: the room was given, so it is taken
    loop.call_later(0.01, flight.release, 80)
    admitted = await wait
    assert flight.held == (80 if admitted else 0)
    assert not flight.waiting
