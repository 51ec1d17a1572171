"""The engine against a reference model of the README's decision table, on the embedded SQLite store.

Random histories of deliveries, redeliveries, in-flight forwards, kills, outages, failing
publishes and clock jumps (see tests/support/engine_model.py for the invariants checked
after every step). Failures found here stay as named tests in test_engine_model_regressions.py.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from filter.backends.stores.guard import GuardedStore
from filter.backends.stores.sqlite import SqliteStore
from filter.core.config import Config, StoreErrors
from filter.core.ports import StateStore
from tests.support.clock import ManualClock
from tests.support.engine_model import STEPS, TOLERATED, EngineMachine
from tests.support.fakes import SwitchStore

#: ~22,000 steps a run (the issue asks for at least 20,000 on SQLite): about 70 s here.
EXAMPLES = 400
STEPS_PER_EXAMPLE = 60


def sqlite_store(cfg: Config, clock: ManualClock, scratch: Path) -> tuple[StateStore, SwitchStore]:
    # Purging on the model's clock, every simulated minute: expired keys really disappear mid-history.
    faults = SwitchStore(SqliteStore(scratch / "state.db", purge_every=60, clock=clock.now), raw=True)
    # Faults beneath the guard, as a real backend's are; a budget of 1 ms so an outage costs no wall time.
    return GuardedStore(faults, StoreErrors(timeout=0.001, budget=0.001), inline=True), faults


class SqliteMachine(EngineMachine):
    backend = "sqlite"
    make_store = staticmethod(sqlite_store)


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
