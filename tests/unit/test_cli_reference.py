"""The command reference page (docs/cli.md) stays complete and exact: every subcommand and every option
the parser knows is in it with the metavar --help prints, and every option says what it is for in
--help."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pubsub_filter.cli import build_parser
from pubsub_filter.tools.skiprows import DECIDED, SKIPPED

ROOT = Path(__file__).resolve().parents[2]


def commands_section() -> str:
    return (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


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


def test_every_subcommand_is_in_the_command_reference() -> None:
    section = commands_section()
    missing = [name for name in subcommands() if f"`pubsub-filter {name}" not in section]
    assert not missing, f"docs/cli.md lacks: {missing}"


def test_every_option_string_is_in_the_command_reference() -> None:
    section = commands_section()
    missing = sorted(
        {
            f"{command} {flag}"
            for command, action in options()
            for flag in action.option_strings
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", section)
        }
    )
    assert not missing, f"docs/cli.md lacks: {missing}"


@pytest.mark.parametrize(("command", "action"), list(options()), ids=lambda v: v if isinstance(v, str) else v.dest)
def test_every_argument_has_help_text(command: str, action: argparse.Action) -> None:
    assert action.help and action.help.strip(), f"pubsub-filter {command} {action.dest}: no help text"


def test_the_infra_readme_skip_rate_formula_names_every_skipped_and_decided_decision() -> None:
    text = (ROOT / "infra" / "README.md").read_text(encoding="utf-8")
    formula = text[text.index("Skip rate = ") :].split("\n\n")[0]
    skipped, decided = formula.split("decided =", 1)
    assert all(d in skipped for d in SKIPPED), skipped
    assert all(d in decided for d in DECIDED), decided


# --- the command reference's table against the parser -------------------------------------------


def synopses() -> dict[str, str]:
    """Each command's synopsis in the reference's table (markdown's `\\|` read as `|`), by command."""
    found = {}
    for line in commands_section().splitlines():
        m = re.match(r"\| `pubsub-filter ([a-z-]+)([^`]*)` \|", line)
        if m:
            found[m.group(1)] = m.group(2).replace("\\|", "|")
    return found


def metavar(action: argparse.Action) -> str | None:
    """What --help prints after the flag (None for a flag that takes no value)."""
    if action.nargs == 0:
        return None
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices:
        return "|".join(map(str, action.choices))
    return action.dest.upper() if action.option_strings else action.dest


def written(synopsis: str, action: argparse.Action) -> tuple[str, str | None] | None:
    """(what precedes the flag, the metavar written after it) for the first of its flags in the synopsis."""
    for flag in action.option_strings:
        m = re.search(rf"(?<![\w-])({re.escape(flag)})(?![\w-])(?: ([^\s\[\]()|]+(?:\|[^\s\[\]()|]+)*))?", synopsis)
        if m:
            return synopsis[: m.start(1)].rstrip()[-1:], m.group(2)
    return None


def table_mismatches() -> list[str]:
    table = synopses()
    found = []
    for name, parser in subcommands().items():
        synopsis = table.get(name)
        if synopsis is None:
            found.append(f"{name}: no row in docs/cli.md's table")
            continue
        known = set()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            known.update(action.option_strings)
            expected = metavar(action)
            if not action.option_strings:  # a positional: its metavar as a word, in brackets if optional
                shown = f"[{expected}]" if action.nargs == "?" else expected
                if not re.search(rf"(?<![\w-]){re.escape(shown)}(?![\w-])", synopsis):
                    found.append(f"{name}: positional {shown} (docs/cli.md: {synopsis.strip()})")
                continue
            seen = written(synopsis, action)
            flag = action.option_strings[0]
            if seen is None:
                found.append(f"{name}: {flag} missing")
                continue
            before, meta = seen
            if meta != expected:
                found.append(f"{name}: {flag} {meta or '-'} in docs/cli.md, {expected or '-'} in --help")
            if action.required and before in ("[", "|"):
                found.append(f"{name}: {flag} is required but shown in brackets")
            if not action.required and before not in ("[", "(", "|"):
                found.append(f"{name}: {flag} is optional but shown without brackets")
        for flag in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", synopsis):
            if flag not in known:
                found.append(f"{name}: {flag} is in docs/cli.md but not in the parser")
    return found


def test_the_command_reference_table_matches_the_parser_option_for_option() -> None:
    mismatches = table_mismatches()
    assert not mismatches, "\n".join(mismatches)


def test_every_command_keeps_its_help_when_python_strips_docstrings() -> None:
    """`python -OO` (PYTHONOPTIMIZE=2, which some images set) drops docstrings: the help must not
    come from them."""
    shown = {}
    for flag in ([], ["-OO"]):
        code = (
            "import argparse\n"
            "from pubsub_filter.cli import build_parser\n"
            "parser = build_parser()\n"
            "(sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]\n"
            "print(parser.format_help())\n"
            "for name, p in sub.choices.items():\n"
            "    print(name, p.format_help())\n"
        )
        done = subprocess.run(
            [sys.executable, *flag, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=60
        )
        shown[tuple(flag)] = done.stdout
    assert "validate a config file" in shown[()]
    assert shown[("-OO",)] == shown[()]
