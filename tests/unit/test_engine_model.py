"""The engine against a reference model of the README's decision table, on the embedded SQLite store.

Random histories of deliveries, redeliveries, in-flight forwards, kills, outages, failing
publishes and clock jumps (see tests/support/engine_model.py for the invariants checked
after every step). Failures found here stay as named tests in test_engine_model_regressions.py.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.support.engine_model import STEPS, TOLERATED
from tests.support.engine_sqlite import SqliteMachine

#: ~22,000 steps a run (the issue asks for at least 20,000 on SQLite): about 70 s here.
EXAMPLES = 400
STEPS_PER_EXAMPLE = 60


def test_engine_agrees_with_the_reference_model_on_sqlite() -> None:
    before, tolerated = STEPS["sqlite"], TOLERATED["sqlite"]
    run_state_machine_as_test(
        SqliteMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS_PER_EXAMPLE,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    ran = STEPS["sqlite"] - before
    assert ran > 0
    assert TOLERATED["sqlite"] > tolerated, "no message was suppressed as moved within tolerance"
