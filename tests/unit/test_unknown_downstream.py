"""What downstream holds, as the state says it: the content, nothing yet, or unknown — one marker
(`KeyState.downstream`), written the same way by every producer, derived from what is stored."""

from __future__ import annotations

from pubsub_filter.core.engine.failed_open import FailedOpen
from pubsub_filter.core.engine.transitions import claimed
from pubsub_filter.core.model import UNKNOWN, KeyState, Lease

FORWARDED = KeyState(fingerprint="A", forwarded_at=10.0, message_id="m1", publish_time=5.0, fence=1, expires_at=99.0)


def lease(fingerprint: str, fence: int = 2, expires_at: float = 20.0) -> Lease:
    return Lease(holder="h", fence=fence, expires_at=expires_at, fingerprint=fingerprint, message_id="m2")


def test_a_forwarded_state_holds_its_content_and_a_new_or_forgotten_one_nothing() -> None:
    assert FORWARDED.downstream == "A"
    assert (KeyState().downstream, FORWARDED.forgotten().downstream) == (None, None)


def test_every_producer_of_unknown_writes_the_one_marker() -> None:
    marked = FORWARDED.unknown_downstream()
    assert marked.downstream is UNKNOWN
    # a claim over a lapsed forward of other content
    lapsed = FORWARDED.with_lease(lease("B"))
    taken = claimed(lapsed, lease("C", fence=3, expires_at=40.0), keep_until=50.0)
    assert (taken.downstream, taken.fingerprint, taken.forwarded_at) == (UNKNOWN, None, 10.0)
    # this instance's fail-open of other content, remembered by key and past the memory's limit
    memory = FailedOpen(limit=1)
    memory.remember("r", "k", "B", None, now=20.0)
    assert memory.view("r", "k", FORWARDED) == marked
    memory.remember("r", "other", "B", None, now=21.0)  # "k" is dropped: its route's horizon is now 20
    assert memory.view("r", "k", FORWARDED) == marked


def test_a_claim_over_a_lapsed_lease_of_the_recorded_content_or_on_a_new_key_marks_nothing_unknown() -> None:
    same = claimed(FORWARDED.with_lease(lease("A")), lease("C", fence=3), keep_until=50.0)
    assert same.downstream == "A"
    new = claimed(KeyState(fence=1, lease=lease("B", fence=1)), lease("C", fence=2), keep_until=50.0)
    assert new.downstream is None  # nothing was ever forwarded and recorded: a new key, still
