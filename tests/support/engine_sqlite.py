"""The engine model's machine on the embedded SQLite store (`test_engine_model.py` runs it; its
regressions, `test_engine_model_regressions.py`, replay histories on it)."""

from __future__ import annotations

from pathlib import Path

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, StoreErrors
from pubsub_filter.core.ports import StateStore
from tests.support.clock import ManualClock
from tests.support.engine_model import EngineMachine
from tests.support.fakes import SwitchStore


def sqlite_store(cfg: Config, clock: ManualClock, scratch: Path) -> tuple[StateStore, SwitchStore]:
    # Purging on the model's clock, every simulated minute: expired keys really disappear mid-history.
    faults = SwitchStore(SqliteStore(scratch / "state.db", purge_every=60, clock=clock.now), raw=True)
    # Faults beneath the guard, as a real backend's are; a budget of 1 ms so an outage costs no wall time.
    return GuardedStore(faults, StoreErrors(timeout=0.001, budget=0.001), inline=True), faults


class SqliteMachine(EngineMachine):
    backend = "sqlite"
    make_store = staticmethod(sqlite_store)
