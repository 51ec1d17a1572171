"""The last resort of a stop: once its whole budget has passed, the process ends, whatever still runs.

Every step of a stop is bounded by its share of `server.shutdown_budget`, but a thread can
outlive the step that started it (a store or BigQuery call inside a client library), and
`asyncio.run` and the interpreter wait for such threads before the process exits. Cloud Run
would SIGKILL it 10 s after SIGTERM; this ends it first, at the budget, with one line that says
what was still running, and exit status 1 (a stop that did not fit).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from pubsub_filter.core.engine.stopping import Stop
from pubsub_filter.core.logs import get_logger

log = get_logger("pubsub_filter")

#: The exit status of a stop that ran past its budget.
OVERRUN = 1


def arm(stop: Stop) -> threading.Timer:
    """End the process when `stop`'s budget has passed, unless it exited before (a daemon timer)."""
    timer = threading.Timer(stop.left(), _overrun, args=(stop,))
    timer.daemon = True
    timer.name = "stop-backstop"
    timer.start()
    return timer


def _overrun(stop: Stop) -> None:
    current = threading.current_thread()
    running = sorted(t.name for t in threading.enumerate() if t is not current and not t.daemon)
    log.error("stop_budget_exceeded", budget_s=stop.budget, threads=running)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing more to say
            stream.flush()
    os._exit(OVERRUN)
