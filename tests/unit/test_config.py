"""The config file: validated on load, every problem named by file, route and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import ConfigError, load, parse
from pubsub_filter.core.times import parse_duration

EXAMPLE = Path(__file__).parents[2] / "examples" / "filter.yaml"


def write(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "filter.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def a_route(**kw: Any) -> dict[str, Any]:
    return {"name": "injury-report", "destination": "phase3", "key": ["payload.game_date"], **kw}


def problems(tmp_path: Path, data: Any) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load(write(tmp_path, data))
    return exc.value.problems


def test_example_config_loads() -> None:
    cfg = load(EXAMPLE)
    assert [r.name for r in cfg.routes] == ["injury-report", "odds-props", "scoreboard"]


def test_defaults_are_all_embedded_in_the_working_directory(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, {"routes": [a_route()]}))
    assert (cfg.store.backend, cfg.publisher.backend, cfg.records.backend) == ("sqlite", "outbox", "sqlite")
    assert cfg.publisher.path == "outbox.jsonl"  # type: ignore[union-attr]
    route = cfg.routes[0]
    assert (route.mode, route.scheme, route.on_store_error, route.stale) == (
        "enforce",
        "canonical",
        "forward",
        "suppress",
    )


def test_config_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_FILTER_CONFIG", str(write(tmp_path, {"routes": [a_route()]})))
    assert load().routes[0].name == "injury-report"


def test_error_names_the_file_route_and_key(tmp_path: Path) -> None:
    found = problems(tmp_path, {"routes": [a_route(key=["body.game_date"])]})
    assert len(found) == 1
    assert "route 'injury-report': key[0]" in found[0]
    assert "must start with 'payload.' or 'attributes.'" in found[0]
    with pytest.raises(ConfigError) as exc:
        load(write(tmp_path, {"routes": [a_route(key=["body.x"])]}))
    assert str(tmp_path / "filter.yaml") in str(exc.value)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    found = problems(tmp_path, {"routes": [a_route(mode="loud", window="soon"), {"name": "b"}]})
    text = "\n".join(found)
    assert "route 'injury-report': mode" in text
    assert "route 'injury-report': window" in text
    assert "route 'b': destination" in text and "route 'b': key" in text


def test_unknown_key_is_an_error_not_ignored(tmp_path: Path) -> None:
    found = problems(tmp_path, {"routes": [a_route(exlude=["processed_at"])]})
    assert found == ["route 'injury-report': exlude: unknown key; did you mean 'exclude'?"]


def test_unknown_backend_is_named(tmp_path: Path) -> None:
    found = problems(tmp_path, {"store": {"backend": "redis"}, "routes": [a_route()]})
    assert "store" in found[0] and "redis" in found[0]


def test_route_names_are_unique(tmp_path: Path) -> None:
    found = problems(tmp_path, {"routes": [a_route(), a_route()]})
    assert "used twice" in found[0]


def test_lease_timings_must_be_ordered(tmp_path: Path) -> None:
    found = problems(
        tmp_path, {"lease": {"duration": "30s", "ack_deadline": "60s", "heartbeat": "10s"}, "routes": [a_route()]}
    )
    assert "need duration > ack_deadline > heartbeat" in found[0]


def test_field_both_included_and_excluded_is_an_error(tmp_path: Path) -> None:
    found = problems(tmp_path, {"routes": [a_route(include=["a", "b"], exclude=["b"])]})
    assert "both included and excluded" in found[0]


def test_rows_must_be_a_payload_path(tmp_path: Path) -> None:
    found = problems(tmp_path, {"routes": [a_route(rows="attributes.rows")]})
    assert "rows must be a payload path" in found[0]


def test_event_scheme_needs_rows(tmp_path: Path) -> None:
    assert "needs rows" in problems(tmp_path, {"routes": [a_route(scheme="event")]})[0]


def test_bypass_condition_needs_exactly_one_test(tmp_path: Path) -> None:
    found = problems(tmp_path, {"routes": [a_route(bypass={"field": "payload.status"})]})
    assert "exactly one of equals, in, exists" in found[0]


def test_empty_file_is_a_clear_error(tmp_path: Path) -> None:
    assert "empty" in problems(tmp_path, "")[0]


def test_invalid_yaml_names_the_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "routes:\n\t- name: x\n")
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert str(exc.value).startswith(f"{path}:2:1: not valid YAML: ")


def test_missing_file_says_how_to_point_at_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), (90, 90), ("90s", 90), ("15m", 900), ("24h", 86400), ("7d", 604800), ("500ms", 0.5)],
)
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5s", "0", "1w", True])
def test_bad_durations(text: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_config_is_plain_yaml_terraform_can_decode() -> None:
    # yamldecode accepts only plain YAML: no tags, so safe_load must read it and so must the schema.
    raw = yaml.safe_load(EXAMPLE.read_text())
    assert parse(raw).routes[0].name == "injury-report"


def test_check_command_prints_problems_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {"routes": [a_route(mode="loud")]})
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:5:9: route 'injury-report': mode" in err


def test_a_route_forwards_a_message_without_its_key_unless_it_says_reject(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, {"routes": [a_route(), a_route(name="strict", on_missing_key="reject")]}))
    assert [r.on_missing_key for r in cfg.routes] == ["forward", "reject"]


def test_check_command_accepts_on_missing_key_and_refuses_a_value_it_does_not_know(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, {"routes": [a_route(on_missing_key="reject")]})
    assert main(["check", str(good)]) == 0
    bad = write(tmp_path, {"routes": [a_route(on_missing_key="retry")]})
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:6:19: route 'injury-report': on_missing_key: 'retry' is not one of forward, reject" in err


def test_check_command_accepts_a_good_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLE)]) == 0
    assert "ok (3 routes" in capsys.readouterr().out
