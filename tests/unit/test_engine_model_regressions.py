"""Histories the engine model test (test_engine_model.py) failed on, replayed step by step.

Each replays the rules of `tests.support.engine_model.EngineMachine` in a fixed order on the
SQLite store, checking the same invariants after every step, so a failure found by hypothesis
stays found whatever its example database holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.engine_model import WINDOW
from tests.support.engine_sqlite import SqliteMachine


@pytest.fixture
def machine() -> Iterator[SqliteMachine]:
    m = SqliteMachine()
    yield m
    m.teardown()


def step(machine: SqliteMachine, rule: Callable[[], object]) -> None:
    rule()
    machine.no_message_is_published_twice()
    machine.engine_holds_nothing_for_settled_work()


def test_an_older_message_another_instance_forwards_after_a_fail_open_outage_may_end_last(
    machine: SqliteMachine,
) -> None:
    # README "Fail-open": only the instance that failed open knows the newer content went out
    # and when it was published. The other instance, deciding on the stored state, forwards an
    # older message redelivered after the outage (its window expired, nothing newer is stored),
    # and the destination ends on that older content. The model had counted the other
    # instance's committed forward as putting the key right again.
    step(machine, lambda: machine.new_message("enforce", "a", 0, engine=0))  # m1
    step(machine, lambda: machine.new_message("enforce", "a", 1, engine=0))  # m2
    step(machine, lambda: machine.store_outage(down=True))
    step(machine, lambda: machine.new_message("enforce", "a", 1, engine=0))  # m3: fail-open
    step(machine, lambda: machine.new_message("enforce", "a", 0, engine=0))  # m4: fail-open, the newest
    step(machine, lambda: machine.store_outage(down=False))
    step(machine, lambda: machine.clock_moves(WINDOW + 1))
    m3 = machine.sent[2]
    rec = machine._deliver(m3, 1)  # redelivered to the other instance: forwarded, window expired
    assert rec.decision.value == "forwarded" and rec.reason == "unchanged, but the window expired"
    step(machine, machine.drain)
    by_id = {s.id: s for s in machine.sent}
    last = [by_id[mid] for route, mid, _ in machine.publisher.published if route == "enforce"][-1]
    assert (last.id, last.content) == ("m3", 1)  # older content last: what the README allows here
