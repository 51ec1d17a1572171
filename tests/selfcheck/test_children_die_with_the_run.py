"""A process the test run starts through `tests.support.children` ends when the run is killed,
teardown or not (the emulators' JVMs used to outlive a killed run, ports and memory held)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.children import alive

ROOT = Path(__file__).resolve().parents[2]

PARENT = """
import subprocess, sys
from tests.support.children import dying_with_parent
child = subprocess.Popen(dying_with_parent([sys.executable, "-c", "import time; time.sleep(120)"]))
print(child.pid, flush=True)
sys.stdin.read()
"""


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_started_by_the_run_ends_when_the_run_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        # The signal is asked for by `setpriv` before it becomes the command: wait until it has
        # (a kill before that is a race no emulator runs: each lives for minutes)
        deadline = time.monotonic() + 10
        while _name(child) == "setpriv" and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the kernel's process table: nothing to wait on
        assert alive(child) and _name(child) != "setpriv"
        parent.send_signal(signal.SIGKILL)  # no teardown runs
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the kernel's process table: nothing to wait on
        assert not alive(child), f"pid {child} outlived the killed run"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
        if parent.stdin is not None:
            parent.stdin.close()
        if parent.stdout is not None:
            parent.stdout.close()
