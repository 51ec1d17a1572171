"""examples/inprocess.py runs as a user would run it (no services) and tells the README's story."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_inprocess_example_runs_and_skips_rebuilds_for_unchanged_reports(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "inprocess.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = {line[:28].strip(): line[28:].split() for line in done.stdout.splitlines()}
    assert lines["09:00 scrape"][:2] == ["forwarded", "ran:"]
    assert lines["13:00 scrape, same statuses"][:2] == ["suppressed", "skipped"]
    assert lines["17:00 scrape, one changed"][:2] == ["forwarded", "ran:"]
    assert lines["21:00 scrape, warehouse down"][:2] == ["body", "raised"]
    assert lines["redelivery of the 21:00 one"][:2] == ["forwarded", "ran:"]
    assert lines["redelivered once more"][:2] == ["duplicate", "skipped"]
    assert lines["consumer, fence 2"][0] == "take" and lines["consumer, fence 1"][0] == "drop"
