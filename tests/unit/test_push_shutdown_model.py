"""The push app as served against SIGTERM at random points (tests/support/push_model.py for the
rules and the invariants checked after every shutdown). Failures found here stay as named tests
in test_push_shutdown.py."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.support.push_model import STEPS, PushShutdownMachine

#: At least 1,000 push-with-shutdown steps a run (~3,100-3,500 in 45-75 s on this 2-core machine under load).
EXAMPLES = 120
STEPS_PER_EXAMPLE = 30
AT_LEAST = 1_000


def test_the_served_push_app_answers_records_and_frees_every_message_through_random_shutdowns() -> None:
    before = STEPS["push-shutdown"]
    run_state_machine_as_test(
        PushShutdownMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS_PER_EXAMPLE,
            deadline=None,
            # No shrinking here: a history that fails on a wait (a watchdog of 10-30 s) would be
            # replayed hundreds of times. The printed history reproduces it; shrink it by hand
            # with `phases` left at hypothesis's default.
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    ran = STEPS["push-shutdown"] - before
    print(f"push model: {ran} steps, {STEPS['shutdowns']} shutdowns")
    assert ran >= AT_LEAST
