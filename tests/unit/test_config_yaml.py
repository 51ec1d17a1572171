"""The config file as YAML: a key written twice in one mapping is an error with its line, never a silent override."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsub_filter.core.config.schema import ConfigError, load

ROUTE = """\
routes:
  - name: injury-report
    destination: phase3
    key: [payload.game_date]
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    """What `check` says of each problem after the file's name: `LINE:COLUMN: text`."""
    path = tmp_path / "filter.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(path)
    return [line.removeprefix(f"{path}:") for line in exc.value.said()]


def test_a_second_routes_list_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    found = problems(tmp_path, ROUTE + "routes:\n  - name: other\n    destination: phase4\n    key: [payload.id]\n")
    assert found == ["5:1: routes: the same key is already on line 1 (YAML keeps only the last one)"]


def test_a_key_twice_inside_a_route_is_an_error(tmp_path: Path) -> None:
    found = problems(tmp_path, ROUTE + "    destination: phase4\n")
    assert found == ["5:5: destination: the same key is already on line 3 (YAML keeps only the last one)"]


def test_a_key_twice_in_a_nested_bypass_condition_is_an_error(tmp_path: Path) -> None:
    text = ROUTE + "    bypass:\n      - field: payload.status\n        equals: live\n        equals: final\n"
    assert problems(tmp_path, text) == ["8:9: equals: the same key is already on line 7 (YAML keeps only the last one)"]


def test_every_duplicate_is_reported_at_once_in_line_order(tmp_path: Path) -> None:
    text = "lease:\n  duration: 120s\n  duration: 90s\n" + ROUTE + "    key: [payload.id]\n"
    found = problems(tmp_path, text)
    assert [p.split(":")[0] for p in found] == ["3", "8"]


def test_a_merge_may_override_what_it_brings_in(tmp_path: Path) -> None:
    text = """\
x-defaults: &defaults
  destination: phase3
  key: [payload.game_date]
routes:
  - <<: *defaults
    name: injury-report
    destination: phase4
"""
    path = tmp_path / "filter.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:  # x-defaults is an unknown key, but no duplicate is claimed
        load(path)
    assert exc.value.problems == [
        "x-defaults: unknown key; the keys here are auth, decision_logs, lease, project, publisher, pull, records, "
        "routes, server, state_ttl, store, store_errors, telemetry"
    ]
