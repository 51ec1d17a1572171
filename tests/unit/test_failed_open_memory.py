"""The fail-open memory (`core.engine.failed_open.FailedOpen`): which states one instance decides as unknown."""

from __future__ import annotations

from pubsub_filter.core.engine.failed_open import FailedOpen
from pubsub_filter.core.model import UNKNOWN, KeyState


def stored(fingerprint: str | None = "A", forwarded_at: float | None = 10.0) -> KeyState:
    return KeyState(fingerprint=fingerprint, forwarded_at=forwarded_at, fence=3, version=7)


def test_a_key_forwarded_fail_open_with_other_content_is_decided_as_unknown() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "C", None, now=20.0)
    seen = memory.view("r", "k", stored("A"))
    assert seen is not None and seen.downstream is UNKNOWN and seen.fingerprint is None


def test_the_unknown_view_keeps_the_version_so_the_claim_still_compares_and_sets() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "C", None, now=20.0)
    seen = memory.view("r", "k", stored("A"))
    assert seen is not None and seen.version == 7 and seen.fence == 3


def test_a_fail_open_of_the_stored_content_leaves_the_state_as_it_is() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "A", None, now=20.0)
    assert memory.view("r", "k", stored("A")) == stored("A")


def test_other_keys_and_other_routes_are_not_affected() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "C", None, now=20.0)
    assert memory.view("r", "other", stored("A")) == stored("A")
    assert memory.view("s", "k", stored("A")) == stored("A")


def test_a_claim_that_landed_ends_the_memory_of_the_key() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "C", None, now=20.0)
    memory.claimed("r", "k")
    assert memory.view("r", "k", stored("A")) == stored("A") and len(memory) == 0


def test_past_its_limit_the_oldest_key_is_dropped_and_its_route_decides_older_forwards_as_unknown() -> None:
    memory = FailedOpen(limit=2)
    memory.remember("r", "k1", "C", None, now=20.0)
    memory.remember("r", "k2", "C", None, now=21.0)
    memory.remember("r", "k3", "C", None, now=22.0)
    assert len(memory) == 2
    # k1 is forgotten, so every key on route r last forwarded at or before 20.0 counts as unknown
    forgotten = memory.view("r", "k1", stored("A", forwarded_at=19.0))
    assert forgotten is not None and forgotten.downstream is UNKNOWN
    later = stored("A", forwarded_at=20.5)
    assert memory.view("r", "k1", later) == later
    assert memory.view("s", "k1", stored("A", forwarded_at=19.0)) == stored("A", forwarded_at=19.0)


def test_no_state_is_a_new_key_whatever_was_forwarded_fail_open() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "C", None, now=20.0)
    assert memory.view("r", "k", None) is None


def test_the_fail_open_publish_time_counts_as_the_newest_forwarded() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "C", 30.0, now=40.0)
    seen = memory.view("r", "k", KeyState(fingerprint="A", forwarded_at=10.0, publish_time=5.0))
    assert seen is not None and seen.publish_time == 30.0


def test_an_older_message_failing_open_after_a_newer_one_keeps_the_newer_publish_time() -> None:
    memory = FailedOpen()
    memory.remember("r", "k", "C", 30.0, now=40.0)
    memory.remember("r", "k", "A", 20.0, now=41.0)
    seen = memory.view("r", "k", KeyState(fingerprint="A", forwarded_at=10.0, publish_time=5.0))
    assert seen is not None and seen.publish_time == 30.0 and seen.fingerprint == "A"
