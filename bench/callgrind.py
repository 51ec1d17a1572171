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
from collections.abc import Callable, Iterable
from pathlib import Path

from harness import ROOT, smoking


def instructions(
    code: str, args: list[str], pythonpath: Path | str, cwd: Path | str | None = None, only: str | None = None
) -> int:
    """Run `python -c code *args` under callgrind (hash seed fixed) and return the instruction count.
    `only`: count only inside that function (callgrind's name for it, `--toggle-collect`).

    `python -c` puts its working directory first on `sys.path`, before PYTHONPATH: run from a
    checkout, it would import that checkout's `filter` whatever `pythonpath` says. So the child
    runs in `cwd`, or else in `pythonpath` itself."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{Path(pythonpath) / 'filter'}{os.pathsep}{pythonpath}"}
    cwd = pythonpath if cwd is None else cwd
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


#: The phases a forward-and-suppress child counts: each one decides what the one before did, then more.
PHASES = ("prime", "forwards", "pairs", "triples")


def per_decision(
    child: str,
    modes: Iterable[str],
    argv: Callable[[str, str], list[str]],
    k: int,
    tmp: str,
    only: str | None = None,
) -> dict[str, dict[str, float]]:
    """Instructions per forward, per suppression after a forward and per suppression after a
    suppression, by mode: `child` run once per mode and phase (`argv(mode, phase)`), one at a
    time (the machine is shared), each phase's count less the one before, over `k` cycles
    (`only`: counted inside that function alone, as `instructions` counts)."""
    per: dict[str, dict[str, float]] = {}
    for mode in modes:
        count: dict[str, int] = {}
        for phase in PHASES:
            count[phase] = instructions(child, argv(mode, phase), ROOT, tmp, only=only)
            print(f"  {mode:<9} {phase:<8} {count[phase]:>15,} instructions", file=sys.stderr, flush=True)
        per[mode] = {
            "forward": (count["forwards"] - count["prime"]) / k,
            "suppress": (count["pairs"] - count["forwards"]) / k,
            "again": (count["triples"] - count["pairs"]) / k,
        }
    print()
    print("| mode | instructions / forward | / suppression after a forward | / suppression after a suppression |")
    print("| --- | ---: | ---: | ---: |")
    for mode, p in per.items():
        print(f"| {mode} | {p['forward']:,.0f} | {p['suppress']:,.0f} | {p['again']:,.0f} |")
    return per
