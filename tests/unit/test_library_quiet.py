"""A library that does not print: a plain script using the in-process API sees on its stdout
and stderr only what it printed itself, until it configures logging."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging
from pubsub_filter import SyncFilter

config = {
    "store": {"backend": "sqlite", "path": "state.db"},
    "records": {"backend": "sqlite", "path": "records.db"},
    "routes": [{"name": "reports", "destination": "phase3", "key": ["payload.game"]}],
}
import yaml
with open("filter.yaml", "w") as f:
    yaml.safe_dump(config, f)

def boom(forward):
    raise ConnectionError("the warehouse did not answer")

with SyncFilter("filter.yaml") as f:
    print("forward:", f.process("reports", {"game": "g1", "status": "out"}, lambda fwd: "done").decision)
    print("suppress:", f.process("reports", {"game": "g1", "status": "out"}, lambda fwd: "done").decision)
    try:
        f.process("reports", {"game": "g1", "status": "in"}, boom)
    except ConnectionError:
        print("failed: raised")
    print("rejected:", f.process("nowhere", {"game": "g1"}, lambda fwd: None).decision)
    if LOGGING:
        logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s")
        print("configured:", f.process("reports", {"game": "g2"}, lambda fwd: None).decision)
"""


def run(tmp_path: Path, logging_on: bool) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(f"LOGGING = {logging_on}\n" + textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k not in ("LOG_LEVEL", "LOG_FORMAT")}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_plain_script_using_the_library_prints_only_what_it_prints_itself(tmp_path: Path) -> None:
    done = run(tmp_path, logging_on=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "forward: forwarded",
        "suppress: suppressed",
        "failed: raised",
        "rejected: rejected",
    ]
    assert done.stderr == ""


def test_the_library_logs_through_the_standard_logging_once_the_application_configures_it(tmp_path: Path) -> None:
    done = run(tmp_path, logging_on=True)
    assert done.returncode == 0, done.stderr
    assert "configured: forwarded" in done.stdout
    decisions = [line for line in done.stderr.splitlines() if line.startswith("LOG pubsub_filter.engine decision")]
    assert len(decisions) == 1 and "decision=forwarded" in decisions[0] and "route=reports" in decisions[0]


def test_the_inprocess_example_prints_only_its_own_story(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "inprocess.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 9, lines
    story = ("09:00", "13:00", "17:00", "21:00", "redeliver", "consumer", "state and")
    assert all(line.startswith(story) for line in lines), lines
