"""`check` reports every problem of a config file in one run, each at its line and column
(`filter.yaml:14:11: route 'r': mode: ...`), in line order; a config built in code reports the
same problems with no place. No problem hides another: a key written twice, a misspelt key
beside a rule across keys, a broken key beside a route's or a section's own check."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsub_filter.cli import main
from pubsub_filter.core.config.lines import Position
from pubsub_filter.core.config.schema import ConfigError, load, parse


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "filter.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def said(path: Path) -> list[str]:
    """Each problem as `check` says it, the file's name left out: `LINE:COLUMN: text`."""
    with pytest.raises(ConfigError) as exc:
        load(path)
    return [line.removeprefix(f"{path}:") for line in exc.value.said()]


def test_problems_of_every_kind_are_reported_in_one_run_each_on_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        lease:
          duration: 30s
          ack_deadline: 60s
        decision_logs:
          contended: {level: debug}
          suppresed: {level: debug}
        routes:
          - name: scores
            destination: phase3
            key: [payload.id]
            stale: supress
          - name: scores
            destination: phase4
            push_format: unwrapped
            key: [attributes.Team]
            mode: enforsce
            exlude: [ts]
            window: 1h
            window: 2h
        """,
    )
    assert said(path) == [
        "1:1: lease: need duration > ack_deadline > heartbeat, got duration=30s, ack_deadline=60s, heartbeat=20s",
        "4:1: decision_logs: the lines of contended cannot be quieted: alerts and runbooks follow them "
        "(quiet any of forwarded, suppressed, duplicate, stale, noise_only, superseded)",
        "6:3: decision_logs.suppresed: unknown key; did you mean 'suppressed'?",
        "11:12: route 'scores': stale: 'supress' is not one of suppress, forward; did you mean 'suppress'?",
        "12:5: route 'scores': push_format unwrapped: attribute names arrive as HTTP headers, in lower case; "
        "write attributes.team (not attributes.Team)",
        "12:11: route 'scores': name: route name 'scores' is used twice (routes[0])",
        "16:11: route 'scores': mode: 'enforsce' is not one of enforce, shadow; did you mean 'enforce'?",
        "17:5: route 'scores': exlude: unknown key; did you mean 'exclude'?",
        "19:5: window: the same key is already on line 18 (YAML keeps only the last one)",
    ]


def test_check_prints_every_problem_with_its_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """\
        routes:
          - name: r
            destination: phase3
            key: [payload.id]
            on_missing_key: rejected
            scheme: data-hash
        """,
    )
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: 2 problems",
        f"  {path}:5:21: route 'r': on_missing_key: 'rejected' is not one of forward, reject; did you mean 'reject'?",
        f"  {path}:6:13: route 'r': scheme: 'data-hash' is not one of canonical, data_hash, event; "
        "did you mean 'data_hash'?",
    ]


def test_a_quieted_alerting_decision_does_not_hide_a_misspelt_one(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        routes: [{name: r, destination: phase3, key: [payload.id]}]
        decision_logs:
          contended:
            level: debug
          suppresed:
            level: debug
        """,
    )
    assert [p.split(": ")[:2] for p in said(path)] == [["2:1", "decision_logs"], ["5:3", "decision_logs.suppresed"]]


def test_a_duplicate_route_does_not_hide_an_upper_case_attribute(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        routes:
          - name: r
            destination: phase3
            key: [payload.id]
          - name: r
            destination: phase4
            push_format: unwrapped
            key: [attributes.EntityId]
        """,
    )
    found = said(path)
    assert [p.split(": ")[0] for p in found] == ["5:5", "5:11"]
    assert "write attributes.entityid (not attributes.EntityId)" in found[0]
    assert "route name 'r' is used twice" in found[1]


def test_a_routes_list_written_twice_does_not_hide_the_problems_of_the_one_kept(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        routes:
          - {name: a, destination: phase3, key: [payload.id]}
        routes:
          - name: b
            destination: phase3
            push_format: unwrapped
            key: [attributes.Team]
        """,
    )
    found = said(path)
    assert [p.split(": ")[0] for p in found] == ["3:1", "4:5"]
    assert found[0].endswith("routes: the same key is already on line 1 (YAML keeps only the last one)")
    assert "route 'b': push_format unwrapped" in found[1]


def test_a_broken_key_of_a_route_does_not_hide_the_route_s_own_check() -> None:
    route = {"name": "r", "destination": "phase3", "key": ["attributes.Team"], "push_format": "unwrapped"}
    with pytest.raises(ConfigError) as exc:
        parse({"routes": [{**route, "mode": "enforsce"}]})
    assert exc.value.problems == [
        "route 'r': mode: 'enforsce' is not one of enforce, shadow; did you mean 'enforce'?",
        "route 'r': push_format unwrapped: attribute names arrive as HTTP headers, in lower case; "
        "write attributes.team (not attributes.Team)",
    ]


def test_a_misspelt_lease_key_does_not_hide_the_lease_s_order() -> None:
    with pytest.raises(ConfigError) as exc:
        parse(
            {"lease": {"duration": "30s", "heartbat": "5s"}, "routes": [{"name": "r", "destination": "t-1", "key": []}]}
        )
    assert exc.value.problems == [
        "lease.heartbat: unknown key; did you mean 'heartbeat'?",
        "route 'r': key: must not be empty",
        "lease: need duration > ack_deadline > heartbeat, got duration=30s, ack_deadline=60s, heartbeat=20s",
    ]


def test_a_problem_both_the_model_and_a_rule_find_is_said_once() -> None:
    with pytest.raises(ConfigError) as exc:
        parse({"lease": {"duration": "30s"}, "routes": [{"name": "r", "destination": "phase3", "key": ["payload.k"]}]})
    assert len(exc.value.problems) == 1


def test_a_config_built_in_code_reports_its_problems_without_lines() -> None:
    with pytest.raises(ConfigError) as exc:
        parse(
            {
                "lease": {"duration": "30s"},
                "routes": [{"name": "r", "destination": "phase3", "key": ["payload.k"], "mode": "loud"}],
            }
        )
    assert [p.position for p in exc.value.found] == [None, None]
    assert str(exc.value).splitlines() == [
        "<config>: lease: need duration > ack_deadline > heartbeat, got duration=30s, ack_deadline=60s, heartbeat=20s",
        "<config>: route 'r': mode: 'loud' is not one of enforce, shadow",
    ]


def test_a_missing_key_is_placed_at_what_should_hold_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        store:
          backend: firestore
        routes:
          - name: r
            key: [payload.id]
        """,
    )
    assert said(path) == ["4:5: route 'r': destination: is required but missing"]


def test_a_problem_brought_in_by_a_merge_is_placed_where_the_merged_value_is_written(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        x-route: &route
          destination: phase3
          key: [payload.id]
          mode: loud
        routes:
          - <<: *route
            name: a
          - <<: *route
            name: b
            mode: shadow
            scheme: fast
        """,
    )
    assert [p.split(": ")[:3] for p in said(path)] == [
        ["1:1", "x-route", "unknown key; did you mean 'routes'?"],
        ["4:9", "route 'a'", "mode"],
        ["11:13", "route 'b'", "scheme"],
    ]


def test_a_single_bypass_condition_s_problem_is_placed_inside_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        routes:
          - name: r
            destination: phase3
            key: [payload.id]
            bypass:
              field: payload.live
              eqals: true
        """,
    )
    assert said(path) == ["7:7: route 'r': bypass[0].eqals: unknown key; did you mean 'equals'?"]


def test_the_files_check_opens_are_placed_at_their_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing" / "state.db"
    path = write(
        tmp_path,
        f"""\
        routes: [{{name: r, destination: phase3, key: [payload.id]}}]
        publisher: {{path: {tmp_path / "outbox.jsonl"}}}
        records: {{path: {tmp_path / "decisions.db"}}}
        store:
          path: {missing}
        """,
    )
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"{path}:5:9: store.path: cannot create {str(missing)!r}")


def test_a_yaml_syntax_error_keeps_its_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "routes:\n  - name: r\n    key: [payload.id\n")
    (problem,) = said(path)
    assert problem.startswith("4:1: not valid YAML: ")


# --- the property: one bad value anywhere in a valid config is reported at its line ----------

#: (key, a value it refuses, written so that no other part of the file contains it)
BAD_VALUES = [("mode", "BAD-mode"), ("scheme", "BAD-scheme"), ("stale", "BAD-stale"), ("audit_sample", 7.25)]
BAD_VALUES += [("window", "BAD-window"), ("on_store_error", "BAD-retry")]
ROUTE_KEYS = {
    "subscription": st.sampled_from(["scores-sub", "odds-sub"]),
    "exclude": st.lists(st.sampled_from(["ts", "seq", "source"]), max_size=3, unique=True),
    "mode": st.sampled_from(["enforce", "shadow"]),
    "stale": st.sampled_from(["suppress", "forward"]),
    "window": st.sampled_from(["5m", "1h"]),
    "bypass": st.just([{"field": "payload.live", "equals": True}]),
}


@st.composite
def a_config_with_one_bad_value(draw: st.DrawFn) -> tuple[dict[str, Any], str, str, str]:
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), min_size=1, max_size=4, unique=True))
    routes = []
    for name in names:
        optional = draw(st.fixed_dictionaries({}, optional=ROUTE_KEYS))  # type: ignore[arg-type]
        routes.append({"name": name, "destination": f"t-{name}", "key": ["payload.id"], **optional})
    config: dict[str, Any] = {"routes": routes}
    if draw(st.booleans()):
        config["lease"] = {"duration": "120s", "ack_deadline": "60s"}
    route = draw(st.sampled_from(routes))
    key, bad = draw(st.sampled_from(BAD_VALUES))
    route[key] = bad
    return config, route["name"], key, str(bad)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=a_config_with_one_bad_value(), flow=st.booleans(), indent=st.sampled_from([2, 4]))
def test_one_bad_value_in_a_valid_config_is_reported_at_its_line_and_column(
    tmp_path: Path, case: tuple[dict[str, Any], str, str, str], flow: bool, indent: int
) -> None:
    config, name, key, bad = case
    text = yaml.safe_dump(config, default_flow_style=flow, indent=indent, width=10_000)
    path = tmp_path / "filter.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(path)
    (problem,) = exc.value.found
    assert problem.text.startswith(f"route {name!r}: {key}: ")
    (line,) = [n for n, written in enumerate(text.splitlines(), 1) if bad in written]
    assert problem.position == Position(line, text.splitlines()[line - 1].index(bad) + 1)


def test_the_configuration_page_shows_what_check_says_of_its_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    page = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    example = page.split("```yaml\n", 1)[1].split("```\n", 1)[0]
    shown = page.split("```console\n$ pubsub-filter check filter.yaml\n", 1)[1].split("```\n", 1)[0]
    (tmp_path / "filter.yaml").write_text(example)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "filter.yaml"]) == 1
    assert capsys.readouterr().err == shown
