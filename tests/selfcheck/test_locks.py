"""What `make serve`, `make test` and so CI install is pinned by the locks, and the locks are whole.

requirements.lock pins the runtime (the image installs it: test_image_install.py), and
requirements-test.lock pins the test extra with everything it pulls in; the Makefile passes
both to pip as constraints, so a package released overnight changes nothing until `make lock`.
"""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name

from tests.selfcheck.test_image_install import ROOT, extra, locked, runtime_dependencies

TEST_LOCK = ROOT / "requirements-test.lock"
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")


def test_the_test_lock_pins_the_runtime_and_the_test_and_chart_extras_within_their_specifiers() -> None:
    pins = locked(TEST_LOCK)
    wanted = [*runtime_dependencies(), *extra("test"), *extra("chart")]
    missing = sorted({r.name for r in wanted if canonicalize_name(r.name) not in pins})
    outside = [
        f"{r.name}=={pins[canonicalize_name(r.name)]} is outside {r.specifier}"
        for r in wanted
        if canonicalize_name(r.name) in pins
        and not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    ]
    assert not missing, f"requirements-test.lock lacks {missing}: run `make lock`"
    assert not outside, "requirements-test.lock: " + "; ".join(outside) + " (run `make lock`)"


def test_the_linters_are_pinned_so_a_new_rule_cannot_turn_lint_red_overnight() -> None:
    pins = locked(TEST_LOCK)
    assert {"ruff", "mypy", "import-linter", "pytest", "hypothesis"} <= set(pins)


def test_every_install_the_makefile_runs_passes_a_lock_as_constraints() -> None:
    assert re.search(r"^LOCK\s*\?=\s*-c requirements\.lock$", MAKEFILE, re.M)
    assert re.search(r"^TEST_LOCK\s*\?=\s*-c requirements-test\.lock$", MAKEFILE, re.M)
    installs = [ln.strip() for ln in MAKEFILE.splitlines() if re.search(r"pip install .*-e ", ln)]
    assert installs, "the Makefile installs the project"
    for line in installs:
        pinned = "$(LOCK)" in line or "$(TEST_LOCK)" in line
        assert pinned or "--upgrade" in line, f"an install outside the locks: {line}"
    (upgrade,) = [ln for ln in installs if "--upgrade" in ln]
    unpinned = MAKEFILE[MAKEFILE.index("test-unpinned:") :]
    assert "TEST_LOCK= LOCK=" in unpinned.splitlines()[1], "test-unpinned empties the locks"
    assert upgrade in unpinned, "only the unpinned run upgrades past the locks"


def test_a_lock_change_reinstalls_what_it_pins() -> None:
    assert re.search(r"^\$\(VENV\)/\.installed: .*requirements\.lock", MAKEFILE, re.M)
    assert re.search(r"^\$\(VENV\)/\.installed-test: .*requirements-test\.lock", MAKEFILE, re.M)
