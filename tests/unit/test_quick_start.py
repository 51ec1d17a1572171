"""The README's quick start prints what it says it prints: its curls run, as written, against
`serve` on `examples/filter.yaml`, and each answer matches the line shown under it; run again,
they answer as the README says a re-run does."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.serve import ServeProcess

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="the quick start uses curl")


def quick_start() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("In another terminal:")
    return text[start : text.index("`make test` needs", start)]


def curls() -> list[tuple[str, str]]:
    """(command, the output shown under it) for each curl of the quick start."""
    lines = quick_start().splitlines()
    return [(line, lines[i + 1]) for i, line in enumerate(lines) if line.startswith("curl ")]


def matches(output: str, shown: str) -> bool:
    """`shown` is `# OUTPUT   (a note)`, where `...` in OUTPUT stands for any text."""
    expected = re.sub(r"\s{2,}\(.*\)$", "", shown.removeprefix("# "))
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, output) is not None


def run(command: str, port: int) -> str:
    args = [a.replace("localhost:${PORT:-8080}", f"127.0.0.1:{port}") for a in shlex.split(command)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def test_the_quick_starts_curls_print_what_the_readme_shows_and_a_rerun_answers_as_it_says(tmp_path: Path) -> None:
    config = tmp_path / "filter.yaml"
    shutil.copy(ROOT / "examples" / "filter.yaml", config)  # its state lands beside it, not in the repo
    steps = curls()
    assert len(steps) == 4
    with ServeProcess(config, tmp_path / "serve.log") as proc:
        for command, shown in steps:
            output = run(command, proc.port)
            assert output.endswith("\n") and matches(output.rstrip("\n"), shown), (command, output, shown)
        rerun = [json.loads(run(command, proc.port).rsplit(" → ", 1)[0])["decision"] for command, _ in steps]
    said = quick_start()[quick_start().index("run the curls again") :].split("because")[0]
    assert rerun == re.findall(r"`(\w+)`", said)
