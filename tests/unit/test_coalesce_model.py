"""Coalescing against a reference model (tests/support/coalesce_model.py): random arrivals,
redeliveries, crashes, SIGTERMs and clock steps on two engines sharing one SQLite store. Nothing
is acked that is not forwarded, suppressed against what was forwarded, stale or superseded by a
message still held unacked; no key is forwarded twice for one burst by one process; after the
drain the destination holds every key's newest content."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.support.coalesce_model import STEPS, CoalesceMachine


def test_coalescing_agrees_with_the_reference_model() -> None:
    before = STEPS["coalesce"]
    run_state_machine_as_test(
        CoalesceMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    ran = STEPS["coalesce"] - before
    print(f"coalesce model: {ran} publishes")
    assert ran > 0
