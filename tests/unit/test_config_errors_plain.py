"""Config errors in plain words: each common mistake gets one line that says where it is, what
was written, what is allowed, and (for a misspelling) what was probably meant.

No line reads like pydantic (`Input should be`, `Field required`, `String should match
pattern`, `does not match any of the expected tags`).
"""

from __future__ import annotations

from typing import Any

import pytest

from pubsub_filter.core.config.schema import ConfigError, parse


def a_route(**kw: Any) -> dict[str, Any]:
    return {"name": "r", "destination": "phase3", "key": ["payload.game_date"], **kw}


def without(route: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in route.items() if k != key}


# (what the mistake is, the config, every problem `check` reports for it)
MISTAKES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "a misspelt required key is said once, with the correction",
        {"routes": [{**without(a_route(), "destination"), "destinaton": "phase3"}]},
        ["route 'r': destinaton: unknown key; did you mean 'destination'?"],
    ),
    (
        "a misspelt optional key",
        {"routes": [a_route(exlude=["processed_at"])]},
        ["route 'r': exlude: unknown key; did you mean 'exclude'?"],
    ),
    (
        "a misspelt route name key, the route named by its position",
        {"routes": [{**without(a_route(), "name"), "nmae": "r"}]},
        ["routes[0]: nmae: unknown key; did you mean 'name'?"],
    ),
    (
        "a misspelt section",
        {"stor": {"backend": "firestore"}, "routes": [a_route()]},
        ["stor: unknown key; did you mean 'store'?"],
    ),
    (
        "a misspelt key inside a section",
        {"lease": {"duraton": "5m"}, "routes": [a_route()]},
        ["lease.duraton: unknown key; did you mean 'duration'?"],
    ),
    (
        "a misspelt key of the chosen backend",
        {"store": {"backend": "firestore", "colection": "c"}, "routes": [a_route()]},
        ["store.colection: unknown key; did you mean 'collection'?"],
    ),
    (
        "a misspelt condition test",
        {"routes": [a_route(bypass={"field": "payload.status", "eqals": "live"})]},
        ["route 'r': bypass[0].eqals: unknown key; did you mean 'equals'?"],
    ),
    (
        "a key nothing resembles lists the keys allowed there",
        {"routes": [a_route(colour="red")]},
        [
            "route 'r': colour: unknown key; the keys here are audit_sample, bypass, cache_result, changed_attributes, "
            "coalesce, destination, exclude, include, key, mode, name, new_fields, on_missing_key, on_store_error, "
            "push_format, removed_rows, row_key, rows, rows_mode, scheme, stale, subscription, tolerance, window"
        ],
    ),
    (
        "a section's key written in a route says where it belongs",
        {"routes": [a_route(max_body="1MiB")]},
        ["route 'r': max_body: unknown key here; max_body belongs in section server"],
    ),
    (
        "a section's key written at the top level says where it belongs",
        {"health_port": 8081, "routes": [a_route()]},
        ["health_port: unknown key here; health_port belongs in section pull"],
    ),
    (
        "a top-level key written in a route says so",
        {"routes": [a_route(project="my-project")]},
        ["route 'r': project: unknown key here; project belongs at the top level"],
    ),
    (
        "a key of several sections is not sent to one of them",
        {"server": {"backend": "x"}, "routes": [a_route()]},
        [
            "server.backend: unknown key; the keys here are admission_wait, body_timeout, max_body, "
            "max_bytes_in_flight, shutdown_budget"
        ],
    ),
    (
        "a key of another backend names the backend it belongs to",
        {"store": {"collection": "c"}, "routes": [a_route()]},
        [
            "store.collection: unknown key for backend sqlite (the default when backend is not set); "
            "collection belongs to backend firestore: write backend: firestore"
        ],
    ),
    (
        "a misspelt enum value",
        {"routes": [a_route(mode="enforsce")]},
        ["route 'r': mode: 'enforsce' is not one of enforce, shadow; did you mean 'enforce'?"],
    ),
    (
        "a scheme written with a dash",
        {"routes": [a_route(scheme="data-hash")]},
        ["route 'r': scheme: 'data-hash' is not one of canonical, data_hash, event; did you mean 'data_hash'?"],
    ),
    (
        "an enum value nothing resembles lists the values",
        {"routes": [a_route(on_store_error="fail")]},
        ["route 'r': on_store_error: 'fail' is not one of forward, retry"],
    ),
    (
        "a missing-key policy nothing resembles lists the values",
        {"routes": [a_route(on_missing_key="skip")]},
        ["route 'r': on_missing_key: 'skip' is not one of forward, reject"],
    ),
    (
        "a missing-key policy written as the decision",
        {"routes": [a_route(on_missing_key="rejected")]},
        ["route 'r': on_missing_key: 'rejected' is not one of forward, reject; did you mean 'reject'?"],
    ),
    (
        "an unknown backend",
        {"store": {"backend": "redis"}, "routes": [a_route()]},
        ["store.backend: 'redis' is not one of sqlite, firestore"],
    ),
    (
        "a misspelt backend",
        {"publisher": {"backend": "pubusb"}, "routes": [a_route()]},
        ["publisher.backend: 'pubusb' is not one of outbox, pubsub; did you mean 'pubsub'?"],
    ),
    (
        "a backend section written as its backend's name",
        {"records": "bigquery", "routes": [a_route()]},
        ["records: must be a mapping of keys to values, e.g. records: {backend: bigquery}"],
    ),
    (
        "a single key path where a list is needed shows the fix",
        {"routes": [a_route(key="payload.id")]},
        ["route 'r': key: must be a list, even of one item: write key: [payload.id]"],
    ),
    (
        "a single field where a list is needed shows the fix",
        {"routes": [a_route(exclude="processed_at")]},
        ["route 'r': exclude: must be a list, even of one item: write exclude: [processed_at]"],
    ),
    (
        "a condition that is not a mapping",
        {"routes": [a_route(bypass="payload.live")]},
        ["route 'r': bypass: must be a list of mappings, each with keys among equals, exists, field, in, not_equals"],
    ),
    (
        "an empty key list",
        {"routes": [a_route(key=[])]},
        ["route 'r': key: must not be empty"],
    ),
    (
        "routes as one mapping",
        {"routes": a_route()},
        ["routes: must be a list of routes, each starting with '- name: ...'"],
    ),
    (
        "no routes",
        {"store": {"path": "s.db"}},
        ["routes: is required but missing: the config needs at least one route"],
    ),
    (
        "a route without a destination",
        {"routes": [without(a_route(), "destination")]},
        ["route 'r': destination: is required but missing"],
    ),
    (
        "a route name with a space",
        {"routes": [a_route(name="injury report")]},
        [
            "route 'injury report': name: 'injury report' is not a valid route name: use 1-63 letters, digits, "
            "'_', '.' or '-', starting with a letter or digit"
        ],
    ),
    (
        "a service account that is not an email",
        {"auth": {"audience": "https://x.run.app", "service_account": "pubsub-push"}, "routes": [a_route()]},
        [
            "auth.service_account: 'pubsub-push' is not a service account: write its email, "
            "e.g. pubsub-push@PROJECT.iam.gserviceaccount.com"
        ],
    ),
    (
        "a number out of range",
        {"routes": [a_route(audit_sample=5)]},
        ["route 'r': audit_sample: 5 is out of range: it must be at most 1"],
    ),
    (
        "a body limit too small",
        {"server": {"max_body": 100}, "routes": [a_route()]},
        ["server.max_body: 100 is out of range: it must be at least 1024"],
    ),
    (
        "text where a whole number is needed",
        {"pull": {"max_messages": "many"}, "routes": [a_route()]},
        ["pull.max_messages: 'many' is not a whole number"],
    ),
    (
        "a yes/no that is neither",
        {"telemetry": {"metrics": "maybe"}, "routes": [a_route()]},
        ["telemetry.metrics: 'maybe' is not true or false"],
    ),
    (
        "a misspelt decision in decision_logs",
        {"decision_logs": {"supressed": {"level": "debug"}}, "routes": [a_route()]},
        ["decision_logs.supressed: unknown key; did you mean 'suppressed'?"],
    ),
    (
        "a decision line level that is not a level",
        {"decision_logs": {"suppressed": {"level": "verbose"}}, "routes": [a_route()]},
        ["decision_logs.suppressed.level: 'verbose' is not one of debug, info, warning, error"],
    ),
    (
        "a decision line sample that is not a share",
        {"decision_logs": {"duplicate": {"sample": 10}}, "routes": [a_route()]},
        ["decision_logs.duplicate.sample: 10 is out of range: it must be at most 1"],
    ),
    (
        "quieting a decision the alerts follow beside a misspelt decision",
        {"decision_logs": {"contended": {"level": "debug"}, "suppresed": {"level": "debug"}}, "routes": [a_route()]},
        [
            "decision_logs.suppresed: unknown key; did you mean 'suppressed'?",
            "decision_logs: the lines of contended cannot be quieted: alerts and runbooks follow them "
            "(quiet any of forwarded, suppressed, duplicate, stale, noise_only, superseded)",
        ],
    ),
    (
        "quieting a decision the alerts follow",
        {"decision_logs": {"fail_open": {"sample": 0.1}, "suppressed": {"level": "debug"}}, "routes": [a_route()]},
        [
            "decision_logs: the lines of fail_open cannot be quieted: alerts and runbooks follow them "
            "(quiet any of forwarded, suppressed, duplicate, stale, noise_only, superseded)"
        ],
    ),
]


@pytest.mark.parametrize(("config", "expected"), [(c, e) for _, c, e in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_a_common_mistake_is_reported_in_plain_words(config: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        parse(config)
    assert exc.value.problems == expected


PYDANTIC_WORDS = ("Input should", "Field required", "String should", "expected tags", "Extra inputs", "List should")


@pytest.mark.parametrize("config", [c for _, c, _ in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_no_problem_reads_like_pydantic(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as exc:
        parse(config)
    assert not [p for p in exc.value.problems if any(w in p for w in PYDANTIC_WORDS)]
