"""One deadline for a whole stop (SIGTERM to exit), and where inside it each step must end.

Cloud Run sends SIGKILL 10 s after SIGTERM, and Kubernetes after `terminationGracePeriodSeconds`.
What a stop does takes turns: the requests (or pulled messages) under way finish by themselves,
the publisher flushes what it holds, what is still running is cancelled (its lease released, its
decision recorded, its message nacked), the records still batched are written, then the store and
telemetry close. Each turn ends at a fixed share of the one budget, `server.shutdown_budget`,
counted from the signal, so a step that hangs costs only its own share and the ones after it still
run. Past the whole budget nothing is waited for any more (`serve` and `pull` exit).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

#: The share of the budget, from the signal, by which each step has ended.
DRAIN = 0.5  # requests and messages in flight finish by themselves
PUBLISHER = 0.6  # the publisher's flush: what it holds lands or fails
#: a claim on its way when its decision was cancelled is waited for until then (its answer says
#: whether it took the lease); one still unanswered is cut short, and the release gets the rest
CLAIMS = 0.7
RELEASE = 0.75  # what still runs is cancelled: leases released, decisions recorded, messages nacked
RECORDS = 0.9  # the decision records still batched are written
CLOSE = 0.95  # the store and telemetry close; the rest is the process's own exit


class Stop(msgspec.Struct, frozen=True):
    """A stop under way: it began at `started` (on `clock`, seconds) and has `budget` seconds."""

    started: float
    budget: float

    @classmethod
    def begin(cls, budget: float, clock: Callable[[], float] = time.monotonic) -> Stop:
        return cls(clock(), budget)

    def until(self, share: float) -> float:
        """The time (on the clock the stop began on) by which the step ending at `share` has ended."""
        return self.started + self.budget * share

    def left(self, share: float = 1.0, clock: Callable[[], float] = time.monotonic) -> float:
        """Seconds left, from now, for the step ending at `share` (never negative)."""
        return max(0.0, self.until(share) - clock())
