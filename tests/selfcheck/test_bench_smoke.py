"""Every bench still runs: each script in bench/ with `--smoke` (one tiny round), in a subprocess.

A bench nobody runs rots with the code it measures; this keeps `make test` running them
(and `make bench-smoke` runs only these). The figures of a smoke run mean nothing; what
is checked is that the script gets from its arguments to its table and exits 0. The
callgrind benches run their children without valgrind under `--smoke` (bench/callgrind.py).
A bench that needs a tool from outside the project (wrk, the Cloud SDK's emulators) is
smoked where the tool is installed and skipped, saying which, where it is not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.emulators import EmulatorMissing, FirestoreEmulator, PubsubEmulator

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: bench/ modules that are shared code, not benches
SHARED = {"harness.py", "callgrind.py"}


def _wrk() -> str | None:
    return None if shutil.which("wrk") else "bench/push.py drives the server with wrk, which is not installed"


def _pubsub_emulator() -> str | None:
    try:
        PubsubEmulator(log_dir=Path(os.devnull)).command()  # resolves the SDK, the emulator's jar and java
    except EmulatorMissing as exc:
        return f"needs the Pub/Sub emulator: {exc}"
    return None


def _always() -> str | None:
    return None


def _firestore_emulator() -> str | None:
    try:
        FirestoreEmulator(log_dir=Path(os.devnull)).command()
    except EmulatorMissing as exc:
        return f"needs the Firestore emulator: {exc}"
    return None


#: bench script → what it needs from outside the project (None: nothing missing, else why it is skipped)
BENCHES: dict[str, Callable[[], str | None]] = {
    "fingerprint.py": _always,
    "rows.py": _always,
    "fields.py": _always,
    "tolerance.py": _always,
    "selection.py": _always,
    "store.py": _always,
    "telemetry_cost.py": _always,
    "push_instructions.py": _always,
    "large_push.py": _always,
    "decision_line.py": _always,
    "push.py": _wrk,
    "publish.py": _pubsub_emulator,
    "e2e.py": _pubsub_emulator,  # --smoke runs ours on SQLite only: the Pub/Sub emulator alone
    "hot_key.py": _firestore_emulator,
}
#: extra arguments under --smoke (store.py's Firestore half needs its emulator and a JVM start: SQLite only)
EXTRA = {
    "store.py": ["--skip-firestore"],
    # the what-if monkeypatches still fit the code they patch: the floor of all three at once
    "push.py": ["--only", "filter", "--variants", "no-records+no-line+no-body-timeout"],
}


def test_every_bench_script_is_smoked() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")} - SHARED
    assert scripts == set(BENCHES), "add the new bench to BENCHES (and give it --smoke)"


@pytest.mark.parametrize("script", sorted(BENCHES))
def test_the_bench_runs_one_tiny_round(script: str) -> None:
    missing = BENCHES[script]()
    if missing is not None:
        pytest.skip(missing)
    env = {k: v for k, v in os.environ.items() if k != "BENCH_SMOKE"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", *EXTRA.get(script, [])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{output}"
    assert proc.stdout.strip(), f"{script} --smoke printed nothing"
