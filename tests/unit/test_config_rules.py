"""Rules across keys: what `check` accepts cannot lead to a 5xx or to auth that only looks on.

Every problem names its key, and all of them are reported together, whatever else is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import ConfigError, parse


def a_route(**kw: Any) -> dict[str, Any]:
    return {"name": "r", "destination": "phase3", "key": ["payload.game_date"], **kw}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(raw)
    return exc.value.problems


def only(raw: dict[str, Any]) -> str:
    found = problems(raw)
    assert len(found) == 1, found
    return found[0]


# --- a section without `backend` is the embedded default -----------------------------


@pytest.mark.parametrize(("section", "backend"), [("store", "sqlite"), ("publisher", "outbox"), ("records", "sqlite")])
def test_a_section_without_backend_is_the_embedded_default(section: str, backend: str) -> None:
    cfg = parse({section: {"path": "elsewhere.db"}, "routes": [a_route()]})
    part = getattr(cfg, section)
    assert (part.backend, part.path) == (backend, "elsewhere.db")


def test_an_empty_section_is_its_defaults() -> None:
    cfg = parse({"store": None, "lease": None, "routes": [a_route()]})
    assert (cfg.store.backend, cfg.lease.duration) == ("sqlite", 120.0)


def test_a_key_of_another_backend_says_which_backend_was_assumed() -> None:
    assert only({"store": {"collection": "c"}, "routes": [a_route()]}) == (
        "store.collection: unknown key for backend sqlite (the default when backend is not set); "
        "collection belongs to backend firestore: write backend: firestore"
    )


def test_an_empty_file_path_is_an_error() -> None:
    assert only({"store": {"path": ""}, "routes": [a_route()]}).startswith("store.path: ")


def test_the_outbox_cannot_share_a_file_with_the_sqlite_store() -> None:
    found = only({"store": {"path": "x.db"}, "publisher": {"path": "./x.db"}, "routes": [a_route()]})
    assert found == "publisher.path: './x.db' is also store.path: give the outbox its own file"


# --- Pub/Sub names ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["phase3", "projects/my-project/topics/phase3", "a.b~c+d%e_f-g", "p" * 255, "projects/example.com:p/topics/t0t"],
)
def test_a_valid_destination_is_accepted(value: str) -> None:
    assert parse({"routes": [a_route(destination=value)]}).routes[0].destination == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "ab",
        "3phase",
        "goog-topic",
        "p" * 256,
        "phase 3",
        "projects/p/subscriptions/s",
        "projects//topics/t",
        "é-topic",
    ],
)
def test_an_invalid_destination_is_a_config_error_naming_the_key(value: str) -> None:
    assert only({"routes": [a_route(destination=value)]}).startswith("route 'r': destination: ")


@pytest.mark.parametrize("value", ["", "x", "projects/p/topics/raw", "raw/sub"])
def test_an_invalid_subscription_is_a_config_error_naming_the_key(value: str) -> None:
    assert only({"routes": [a_route(subscription=value)]}).startswith("route 'r': subscription: ")


def test_a_subscription_path_is_accepted() -> None:
    cfg = parse({"routes": [a_route(subscription="projects/p/subscriptions/raw-reports")]})
    assert cfg.routes[0].subscription == "projects/p/subscriptions/raw-reports"


# --- timings that must nest -----------------------------------------------------------


@pytest.mark.parametrize("budget", ["60s", "90s"])
def test_a_store_budget_not_shorter_than_the_ack_deadline_is_an_error(budget: str) -> None:
    found = only({"store_errors": {"budget": budget, "timeout": "1s"}, "routes": [a_route()]})
    assert found.startswith("store_errors.budget: ") and "lease.ack_deadline (60s)" in found


def test_a_store_timeout_longer_than_the_budget_is_an_error() -> None:
    found = only({"store_errors": {"timeout": "6s"}, "routes": [a_route()]})
    assert found.startswith("store_errors.timeout: 6s is longer than store_errors.budget (5s)")


def test_a_state_ttl_shorter_than_the_lease_is_an_error() -> None:
    assert only({"state_ttl": "5s", "routes": [a_route()]}).startswith("state_ttl: 5s is shorter than lease.duration")


def test_a_window_longer_than_the_state_ttl_is_an_error() -> None:
    found = only({"state_ttl": "1h", "routes": [a_route(window="24h")]})
    assert found.startswith("route 'r': window: 86400s is longer than state_ttl (3600s)")


# --- auth that looks on is on -----------------------------------------------------------

PUSHER = "push@p.iam.gserviceaccount.com"


def test_a_service_account_without_an_audience_is_an_error() -> None:
    assert only({"auth": {"service_account": PUSHER}, "routes": [a_route()]}).startswith("auth.audience: is not set")


def test_an_audience_without_a_service_account_is_an_error() -> None:
    found = only({"auth": {"audience": "https://f"}, "routes": [a_route()]})
    assert found.startswith("auth.service_account: is not set") and "any_service_account: true" in found


def test_any_service_account_must_be_said_explicitly() -> None:
    cfg = parse({"auth": {"audience": "https://f", "any_service_account": True}, "routes": [a_route()]})
    assert (cfg.auth.audience, cfg.auth.service_account, cfg.auth.any_service_account) == ("https://f", None, True)


def test_any_service_account_contradicts_a_named_one() -> None:
    raw = {"auth": {"audience": "https://f", "service_account": PUSHER, "any_service_account": True}}
    assert only({**raw, "routes": [a_route()]}).startswith("auth.any_service_account: contradicts service_account")


def test_any_service_account_without_an_audience_is_an_error() -> None:
    assert only({"auth": {"any_service_account": True}, "routes": [a_route()]}).startswith("auth.audience: ")


def test_an_empty_audience_is_an_error_not_auth_off() -> None:
    found = problems({"auth": {"audience": "", "service_account": PUSHER}, "routes": [a_route()]})
    assert [p.split(":")[0] for p in found] == ["auth.audience", "auth.audience"]


def test_a_service_account_that_is_not_an_email_is_an_error() -> None:
    found = problems({"auth": {"audience": "https://f", "service_account": "pusher"}, "routes": [a_route()]})
    assert found[0].startswith("auth.service_account: ")


def test_no_auth_section_is_verification_off_by_choice() -> None:
    assert parse({"routes": [a_route()]}).auth.audience is None


# --- everything at once ----------------------------------------------------------------------


def test_rules_across_keys_are_reported_together_with_field_errors() -> None:
    found = problems(
        {
            "store_errors": {"budget": "2m"},
            "routes": [
                a_route(mode="loud", include=["a"], exclude=["a"], row_key=["id"]),
                a_route(window="soon"),
            ],
        }
    )
    assert sorted(found) == sorted(
        [
            "route 'r': mode: 'loud' is not one of enforce, shadow",
            "route 'r': window: 'soon' is not a duration: write e.g. 90s, 15m, 24h or 7d",
            "route 'r': exclude: fields both included and excluded: ['a']",
            "route 'r': row_key: row_key is set but rows is not: row_key only orders rows",
            "route 'r': name: route name 'r' is used twice (routes[0])",
            "store_errors.budget: 120s must be shorter than lease.ack_deadline (60s): after the budget the "
            "route's on_store_error still has to publish and answer before Pub/Sub redelivers",
        ]
    )


# --- regressions found by tests/unit/test_config_fuzz.py ------------------------------------


def test_a_route_whose_name_is_not_a_string_is_named_by_its_position() -> None:
    found = problems({"routes": [{"name": 5, "destination": "phase3", "key": None}]})
    assert found == ["routes[0]: name: 5 is not text", "routes[0]: key: must be a list, e.g. key: [a, b]"]


# --- the outbox's file is compared with the SQLite files by identity, not by spelling ----


SHARED = "publisher.path: {outbox!r} is also {section}.path: give the outbox its own file"


def outbox_on(section: str, db: str, outbox: str) -> dict[str, Any]:
    return {section: {"path": db}, "publisher": {"path": outbox}, "routes": [a_route()]}


@pytest.mark.parametrize("section", ["store", "records"])
@pytest.mark.parametrize("exists", [True, False], ids=["existing", "not-yet-created"])
def test_the_outbox_on_a_sqlite_file_spelled_absolute_or_relative_is_refused(
    section: str, exists: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if exists:
        (tmp_path / "x.db").touch()
    for db, outbox in [("x.db", str(tmp_path / "x.db")), (str(tmp_path / "x.db"), "x.db"), ("./x.db", "x.db")]:
        assert only(outbox_on(section, db, outbox)) == SHARED.format(outbox=outbox, section=section)


@pytest.mark.parametrize("section", ["store", "records"])
@pytest.mark.parametrize("exists", [True, False], ids=["existing", "not-yet-created"])
def test_the_outbox_on_a_symlink_to_a_sqlite_file_is_refused(
    section: str, exists: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if exists:
        (tmp_path / "x.db").touch()
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "x.db")
    (tmp_path / "dir").symlink_to(tmp_path, target_is_directory=True)
    for outbox in ["link.jsonl", "dir/x.db", str(tmp_path / "dir" / "link.jsonl")]:
        assert only(outbox_on(section, "x.db", outbox)) == SHARED.format(outbox=outbox, section=section)


@pytest.mark.parametrize("section", ["store", "records"])
def test_the_outbox_on_a_hard_link_to_a_sqlite_file_is_refused(
    section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.db").touch()
    os.link(tmp_path / "x.db", tmp_path / "out.jsonl")
    assert only(outbox_on(section, "x.db", "out.jsonl")) == SHARED.format(outbox="out.jsonl", section=section)


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_the_outbox_on_a_sqlite_side_file_is_refused(
    suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    found = only(outbox_on("store", "x.db", f"./x.db{suffix}"))
    assert found == f"publisher.path: './x.db{suffix}' is also store.path's x.db{suffix}: give the outbox its own file"


def test_the_outbox_beside_the_sqlite_files_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.db").touch()
    (tmp_path / "out.jsonl").touch()
    (tmp_path / "link.db").symlink_to(tmp_path / "x.db")
    cfg = parse(
        {"store": {"path": "link.db"}, "publisher": {"path": str(tmp_path / "out.jsonl")}, "routes": [a_route()]}
    )
    assert cfg.publisher.path == str(tmp_path / "out.jsonl")


# --- pull flow control: only values the Pub/Sub client can run ------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_bytes", 0), ("max_bytes", "0MiB"), ("max_bytes", 2**63), ("max_messages", 0), ("max_messages", 2**63)],
)
def test_a_pull_flow_control_value_the_client_cannot_run_is_refused_by_name(key: str, value: Any) -> None:
    found = only({"pull": {key: value}, "routes": [a_route()]})
    assert found.startswith(f"pull.{key}: "), found
    assert "from 1 to 9223372036854775807" in found, found


@pytest.mark.parametrize(("key", "value"), [("max_bytes", 1), ("max_bytes", "1MiB"), ("max_messages", 2**63 - 1)])
def test_a_pull_flow_control_value_from_one_up_is_accepted(key: str, value: Any) -> None:
    assert getattr(parse({"pull": {key: value}, "routes": [a_route()]}).pull, key) >= 1
