"""Instructions a Python snippet executes, counted by callgrind: a measure that does not move
with the load on a shared machine (ratios of these are what the benches report).

Under a bench's `--smoke` (`harness.SMOKE_ENV` set) the snippet runs without valgrind and
the "count" is its wall time in nanoseconds: the child's code still runs end to end, in a
fraction of callgrind's time, and the figures mean nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness import smoking


def instructions(
    code: str, args: list[str], pythonpath: Path | str, cwd: Path | str | None = None, only: str | None = None
) -> int:
    """Run `python -c code *args` under callgrind (hash seed fixed) and return the instruction count.
    `only`: count only inside that function (callgrind's name for it, `--toggle-collect`)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(pythonpath)}
    if smoking():
        t0 = time.perf_counter_ns()
        subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, check=True)
        return time.perf_counter_ns() - t0
    toggle = [f"--toggle-collect={only}"] if only else []
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *toggle, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{args[:1]} ({pythonpath}) failed under callgrind:\n{proc.stderr[-3000:]}")
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if m is None:
        raise SystemExit(f"no instruction count from callgrind:\n{proc.stderr[-2000:]}")
    return int(m.group(1))
