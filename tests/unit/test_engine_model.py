"""The engine against a reference model of the README's decision table, on the embedded SQLite store.

Random histories of deliveries, redeliveries, in-flight forwards, kills, outages, failing
publishes and clock jumps (see tests/support/engine_model.py for the invariants checked
after every step). Failures found here stay as named tests in test_engine_model_regressions.py.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from filter.config import Config
from filter.ports import StateStore
from filter.stores.guard import GuardedStore
from filter.stores.sqlite import SqliteStore
from tests.support.clock import ManualClock
from tests.support.engine_model import STEPS, EngineMachine

#: ~22,000 steps a run (the issue asks for at least 20,000 on SQLite): about 70 s here.
EXAMPLES = 500
STEPS_PER_EXAMPLE = 60


def sqlite_store(cfg: Config, clock: ManualClock, scratch: Path) -> StateStore:
    # Purging on the model's clock, every simulated minute: expired keys really disappear mid-history.
    store = SqliteStore(scratch / "state.db", purge_every=60, clock=clock.now)
    return GuardedStore(store, cfg.store_errors, inline=True)


class SqliteMachine(EngineMachine):
    backend = "sqlite"
    make_store = staticmethod(sqlite_store)


def test_engine_agrees_with_the_reference_model_on_sqlite() -> None:
    before = STEPS["sqlite"]
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
