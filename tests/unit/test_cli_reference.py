"""The README's command reference stays complete: every subcommand and every option the
parser knows is in its Commands section, and every option says what it is for in --help."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from filter.cli import build_parser
from filter.tools.skiprows import DECIDED, SKIPPED

ROOT = Path(__file__).resolve().parents[2]


def commands_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Commands\n") : text.index("## Decisions\n")]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def options() -> Iterator[tuple[str, argparse.Action]]:
    """(command, action) for every argument of every command, --help aside."""
    top = build_parser()
    for action in top._actions:
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            yield "", action
    for name, parser in subcommands().items():
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction):
                yield name, action


def test_every_subcommand_is_in_the_readme() -> None:
    section = commands_section()
    missing = [name for name in subcommands() if f"`pubsub-filter {name}" not in section]
    assert not missing, f"README Commands lacks: {missing}"


def test_every_option_string_is_in_the_readme() -> None:
    section = commands_section()
    missing = sorted(
        {
            f"{command} {flag}"
            for command, action in options()
            for flag in action.option_strings
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", section)
        }
    )
    assert not missing, f"README Commands lacks: {missing}"


@pytest.mark.parametrize(("command", "action"), list(options()), ids=lambda v: v if isinstance(v, str) else v.dest)
def test_every_argument_has_help_text(command: str, action: argparse.Action) -> None:
    assert action.help and action.help.strip(), f"pubsub-filter {command} {action.dest}: no help text"


def test_the_infra_readme_skip_rate_formula_names_every_skipped_and_decided_decision() -> None:
    text = (ROOT / "infra" / "README.md").read_text(encoding="utf-8")
    formula = text[text.index("Skip rate = ") :].split("\n\n")[0]
    skipped, decided = formula.split("decided =", 1)
    assert all(d in skipped for d in SKIPPED), skipped
    assert all(d in decided for d in DECIDED), decided
