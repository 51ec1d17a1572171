"""The coalescer on its own (`pubsub_filter.core.engine.coalesce`): which message of a burst is held, which
are superseded, when a burst ends, and the bounds. Pure: the time is passed in."""

from __future__ import annotations

import sys
import tracemalloc

from pubsub_filter.core.engine.coalesce import Arrival, Coalescer, Offered, Outcome


def _arrival(token: int, publish_time: float | None, message_id: str | None = None, size: int = 10) -> Arrival:
    return Arrival(token, message_id or f"m{token}", publish_time, size)


def test_the_first_message_of_a_key_is_held() -> None:
    c = Coalescer(10, 1000)
    assert c.offer("r", "k", 1.0, 5.0, _arrival(1, 100.0), now=0.0) == Offered(Outcome.HELD)
    assert c.due_at(1) == 1.0


def test_a_newer_message_displaces_the_held_one_which_is_superseded_by_it() -> None:
    c = Coalescer(10, 1000)
    c.offer("r", "k", 1.0, 5.0, _arrival(1, 100.0), now=0.0)
    assert c.offer("r", "k", 1.0, 5.0, _arrival(2, 101.0), now=0.5) == Offered(Outcome.HELD, displaced=1)
    assert c.due_at(1) is None
    assert c.due_at(2) == 1.5  # quiet counts from the last arrival


def test_an_older_message_is_superseded_at_once_by_the_held_one_and_keeps_the_key_busy() -> None:
    c = Coalescer(10, 1000)
    c.offer("r", "k", 1.0, 5.0, _arrival(1, 100.0), now=0.0)
    assert c.offer("r", "k", 1.0, 5.0, _arrival(2, 99.0), now=0.5) == Offered(Outcome.SUPERSEDED, by="m1")
    assert c.due_at(1) == 1.5


def test_equal_or_unknown_publish_times_order_by_arrival() -> None:
    c = Coalescer(10, 1000)
    c.offer("r", "k", 1.0, 5.0, _arrival(1, 100.0), now=0.0)
    assert c.offer("r", "k", 1.0, 5.0, _arrival(2, 100.0), now=0.1).displaced == 1
    assert c.offer("r", "k", 1.0, 5.0, _arrival(3, None), now=0.2).displaced == 2


def test_a_burst_that_never_goes_quiet_ends_at_max_wait_after_its_first_message() -> None:
    c = Coalescer(10, 1000)
    token = 0
    for step in range(10):
        token += 1
        c.offer("r", "k", 1.0, 3.0, _arrival(token, 100.0 + step), now=step * 0.5)
    assert c.due_at(token) == 3.0
    assert not c.take(token, 2.9)
    assert c.take(token, 3.0)
    assert len(c) == 0
    # what comes next is a new burst
    assert c.offer("r", "k", 1.0, 3.0, _arrival(99, 200.0), now=3.1) == Offered(Outcome.HELD)
    assert c.due_at(99) == 4.1


def test_keys_and_routes_are_bursts_of_their_own() -> None:
    c = Coalescer(10, 1000)
    assert c.offer("r", "a", 1.0, 5.0, _arrival(1, 100.0), now=0.0).outcome is Outcome.HELD
    assert c.offer("r", "b", 1.0, 5.0, _arrival(2, 100.0), now=0.0).outcome is Outcome.HELD
    assert c.offer("s", "a", 1.0, 5.0, _arrival(3, 100.0), now=0.0).outcome is Outcome.HELD
    assert len(c) == 3


def test_a_redelivery_of_the_held_message_is_held_in_its_place_and_the_earlier_delivery_nacked() -> None:
    c = Coalescer(10, 1000)
    c.offer("r", "k", 1.0, 5.0, _arrival(1, 100.0, "m"), now=0.0)
    assert c.offer("r", "k", 1.0, 5.0, _arrival(2, 100.0, "m"), now=0.5) == Offered(Outcome.HELD, replaced=1)
    assert c.due_at(2) == 1.5


def test_past_the_count_bound_a_new_key_is_not_held() -> None:
    c = Coalescer(2, 1000)
    c.offer("r", "a", 1.0, 5.0, _arrival(1, 100.0), now=0.0)
    c.offer("r", "b", 1.0, 5.0, _arrival(2, 100.0), now=0.0)
    assert c.offer("r", "c", 1.0, 5.0, _arrival(3, 100.0), now=0.0).outcome is Outcome.FULL
    # a key already held still coalesces: one slot per key
    assert c.offer("r", "a", 1.0, 5.0, _arrival(4, 101.0), now=0.1).displaced == 1


def test_past_the_byte_bound_a_message_is_not_held() -> None:
    c = Coalescer(10, 100)
    c.offer("r", "a", 1.0, 5.0, _arrival(1, 100.0, size=60), now=0.0)
    assert c.offer("r", "b", 1.0, 5.0, _arrival(2, 100.0, size=50), now=0.0).outcome is Outcome.FULL
    # a newer, larger message for a held key that would cross the bound is decided at once; the held one stays
    assert c.offer("r", "a", 1.0, 5.0, _arrival(3, 101.0, size=101), now=0.1).outcome is Outcome.FULL
    assert c.due_at(1) == 1.1
    assert c.held_bytes == 60


def test_a_withdrawn_or_released_message_is_no_longer_held() -> None:
    c = Coalescer(10, 1000)
    c.offer("r", "a", 1.0, 5.0, _arrival(1, 100.0), now=0.0)
    c.offer("r", "b", 1.0, 5.0, _arrival(2, 100.0), now=0.0)
    c.withdraw(1)
    assert c.due_at(1) is None
    assert c.release_all() == [2]
    assert (len(c), c.held_bytes) == (0, 0)


def test_memory_per_held_message_is_under_half_a_kilobyte_besides_the_message() -> None:
    """The coalescer's own cost per held key (the message itself, its data and attributes, is
    what the byte bound counts): measured, and said in docs/configuration.md."""
    c = Coalescer(100_000, 10**12)
    keys = [f"key-{i:06d}" for i in range(20_000)]
    ids = [f"{i:016d}" for i in range(20_000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, key in enumerate(keys):
        c.offer("odds", key, 1.0, 5.0, Arrival(i, ids[i], 1.7e9 + i, 100), now=0.0)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_message = (after - before) / len(keys)
    print(f"coalescer bookkeeping per held message: {per_message:.0f} B (python {sys.version_info[:2]})")
    assert per_message < 512
