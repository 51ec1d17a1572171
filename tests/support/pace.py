"""How much slower this machine runs Python than the machines the suite's time limits were set on:
the factor the loop watch's 100 ms (and a test's own bound on one step) grows by here.

A limit on how long one step may hold a loop is a figure measured on some machine. The same step
on a CPU half as fast takes twice as long without holding the loop any worse, and the schedstat
correction (`tests.support.loopclock`) does not see it: the thread was on a CPU the whole time.
(CI machines ran the whole suite in 1,989-2,132 s against 1,040 s on others, with no CPU steal;
five to seven steps of 0.105-0.173 s, each on a CPU throughout, failed the 0.1 s watch there.) So
the suite measures the machine it runs on with a fixed piece of the kind of work the watched
steps do (JSON, dicts, strings: pure interpreter work), the best of several rounds of its CPU time,
and divides by what the same work takes where the limits were set (`REFERENCE`): once as it starts
(`pace`), and again right after a test whose loop was held past the limit, since the same machine
moves from one minute to the next (`tests.support.loopwatch`). A machine faster than the reference
keeps the limits as they are (the factor is never below 1). The blocking the watch is for, a lock
or a file waited out on the loop, a purge of everything at once, is seconds long and no factor
here hides it; time asleep in a call is never scaled.
"""

from __future__ import annotations

import functools
import json
import time

#: CPU seconds the best round of `work` takes on the 2-vCPU machines the suite's limits were set on,
#: at their fastest: 19.5-21.5 ms over a dozen runs on 2026-12-02 (the same machine's best rounds
#: ranged up to 32 ms from one run to the next, the others busy or not, and to 41 ms beside a suite).
REFERENCE = 0.020

#: Rounds of `work` timed; the best is this machine's pace (the others met a neighbour's burst).
ROUNDS = 7


def work() -> int:
    """A fixed piece of interpreter work: a 2,000-entry dict of lists, strings and floats, to JSON
    and back five times."""
    table = {f"k{i}": [i, str(i), {"x": i * 1.5}] for i in range(2000)}
    for _ in range(5):
        json.loads(json.dumps(table))
    return len(table)


def best_round(rounds: int = ROUNDS) -> float:
    """CPU seconds the fastest of `rounds` runs of `work` took this thread here (its own time on a
    CPU: a round that waited for one, on a busy machine, is not slower for it)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time()
        work()
        best = min(best, time.thread_time() - started)
    return best


def factor(best: float) -> float:
    """The pace of a machine whose best round of `work` took `best` seconds: how many times
    `REFERENCE` that is, at least 1."""
    return max(1.0, best / REFERENCE)


@functools.cache
def measured() -> float:
    """This machine's `best_round`, measured once, the first time it is asked (about 0.2-0.4 s; the
    suite asks as it starts, `pytest_configure` in tests/conftest.py, before the first test)."""
    return best_round()


def pace() -> float:
    """This machine's `factor`, from what was `measured` as the suite began."""
    return factor(measured())


def pace_now() -> float:
    """The larger of the suite's `pace` and the machine's pace measured now (another `best_round`):
    for a figure just taken, on a machine that moves from one minute to the next."""
    return max(pace(), factor(best_round()))
