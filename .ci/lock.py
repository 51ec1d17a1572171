"""Regenerate requirements.lock and requirements-test.lock (`make lock`) and say what moved.

Each lock is what pip resolves, in a throw-away venv with no constraints, for one install of
this project: the runtime dependencies with the gcp extra (requirements.lock, which the image
installs: Firestore and BigQuery clients included, so they are pinned too; a bare `pip install .`
is a subset of it), and the test extra with the chart extra (requirements-test.lock, which
`make test` installs as constraints). A lock's leading comment lines are kept as they are.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = {"requirements.lock": ".[gcp]", "requirements-test.lock": ".[test,chart]"}


def resolve(spec: str) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="pubsub-filter-lock-") as tmp:
        venv.create(tmp, with_pip=True)
        pip = [str(Path(tmp) / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "install", spec], cwd=ROOT, check=True)
        frozen = subprocess.run([*pip, "freeze", "--exclude-editable"], check=True, capture_output=True, text=True)
    return sorted(
        (line for line in frozen.stdout.splitlines() if line and not line.lower().startswith("pubsub")),
        key=str.lower,
    )


def pins(lines: list[str]) -> dict[str, str]:
    return {name.lower(): version for name, _, version in (ln.partition("==") for ln in lines if "==" in ln)}


def moved(old: dict[str, str], new: dict[str, str]) -> list[str]:
    said = []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name), new.get(name)
        if before != after:
            said.append(f"  {name}: {before or '(new)'} -> {after or '(gone)'}")
    return said


def main() -> int:
    for lock, spec in LOCKS.items():
        path = ROOT / lock
        text = path.read_text().splitlines() if path.exists() else []
        header = [ln for ln in text if ln.startswith("#")]
        old = pins([ln for ln in text if not ln.startswith("#")])
        lines = resolve(spec)
        path.write_text("\n".join([*header, *lines]) + "\n")
        changes = moved(old, pins(lines))
        print(f"{lock}: {len(changes)} moved" + ("" if changes else " (unchanged)"))
        for change in changes:
            print(change)
    return 0


if __name__ == "__main__":
    sys.exit(main())
