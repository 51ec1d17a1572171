"""Past its whole budget a stop ends the process, whatever thread still holds it: a store or
BigQuery call stuck inside a client library would otherwise keep it alive until Cloud Run's
SIGKILL, with nothing said about why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

HELD = textwrap.dedent(
    """
    import threading

    from pubsub_filter.core.engine.stopping import Stop
    from pubsub_filter.observability.logsetup import configure
    from pubsub_filter.runtime import backstop

    configure()
    held = threading.Event()
    threading.Thread(target=held.wait, name="stuck-in-a-client").start()  # never set: the exit waits on it
    backstop.arm(Stop.begin(0.3))
    """
)


def test_a_thread_that_holds_the_process_past_the_budget_is_ended_with_it_and_exit_status_1() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", HELD],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "LOG_FORMAT": "json"},
    )
    took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert '"stop_budget_exceeded"' in done.stdout and "stuck-in-a-client" in done.stdout, done.stdout
    assert took < 10, f"the process lived {took:.1f}s"
