"""A route's `coalesce` key: its durations, and what `check` refuses about it."""

from __future__ import annotations

from typing import Any

import pytest

from pubsub_filter.core.config.schema import ConfigError, parse


def _config(coalesce: Any, **top: Any) -> dict[str, Any]:
    route = {"name": "odds", "destination": "odds-out", "key": ["payload.id"], "coalesce": coalesce}
    return {"routes": [route], **top}


def test_coalesce_durations_are_read_as_every_duration_of_the_config() -> None:
    route = parse(_config({"quiet": "500ms", "max_wait": "2s"})).routes[0]
    assert route.coalesce is not None
    assert (route.coalesce.quiet, route.coalesce.max_wait) == (0.5, 2.0)


def test_a_route_without_coalesce_has_none() -> None:
    raw = _config(None)
    del raw["routes"][0]["coalesce"]
    assert parse(raw).routes[0].coalesce is None


@pytest.mark.parametrize(
    ("coalesce", "said"),
    [
        ({"quiet": "1s"}, "max_wait"),
        ({"max_wait": "1s"}, "quiet"),
        ({"quiet": "soon", "max_wait": "1s"}, "not a duration"),
        ({"quiet": "3s", "max_wait": "1s"}, "quiet (3s) is longer than max_wait (1s)"),
        ({"quiet": "1s", "max_wait": "1s", "every": "1s"}, "every"),
    ],
)
def test_a_bad_coalesce_is_refused_with_what_is_wrong(coalesce: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(_config(coalesce))
    assert said in str(err.value)
    assert "coalesce" in str(err.value)


def test_a_max_wait_with_no_margin_inside_the_ack_deadline_is_refused() -> None:
    # 56 s held + 5 s of store budget: past the 60 s ack deadline, Pub/Sub redelivers what is held
    with pytest.raises(ConfigError) as err:
        parse(_config({"quiet": "1s", "max_wait": "56s"}))
    text = str(err.value)
    assert "routes[0].coalesce.max_wait" in text or "coalesce" in text
    assert "lease.ack_deadline (60s)" in text
    assert "lower max_wait below 55s" in text


def test_the_pubsub_publish_timeout_counts_against_the_ack_deadline_too() -> None:
    raw = _config({"quiet": "1s", "max_wait": "30s"}, publisher={"backend": "pubsub", "timeout": "30s"})
    with pytest.raises(ConfigError) as err:
        parse(raw)
    assert "publisher.timeout 30s" in str(err.value)
    raw["lease"] = {"ack_deadline": "120s", "duration": "180s"}
    assert parse(raw).routes[0].coalesce is not None


def test_check_says_what_held_requests_take_from_cloud_runs_concurrency(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from pubsub_filter.cli import main

    path = tmp_path / "filter.yaml"
    raw = _config({"quiet": "500ms", "max_wait": "2s"})
    raw["routes"][0]["destination"] = "odds-out"
    raw["store"] = {"path": str(tmp_path / "state.db")}
    raw["records"] = {"path": str(tmp_path / "decisions.db")}
    path.write_text(yaml.safe_dump(raw))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert ": ok (1 route: odds)" in out
    assert "coalesce holds the newest push request of each hot key open for up to 2s" in out
    assert "concurrency" in out
