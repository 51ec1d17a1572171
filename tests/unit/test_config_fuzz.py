"""Generated configs: `check` rejects one naming every offending key, or accepts it, and then
no message of any shape makes the push endpoint answer 5xx.

Configs mix values that fit with junk at every key (paths, durations, sizes, backends,
bypass conditions, rows, row_key, include/exclude, schemes, modes, ids, auth); an accepted
one runs on the embedded SQLite store, outbox and SQLite records in a fresh directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsub_filter.core.config.schema import (
    Config,
    ConfigError,
    OutboxConfig,
    SqliteRecordsConfig,
    SqliteStoreConfig,
    load,
)
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.app import create_app, engine_lifespan
from pubsub_filter.runtime import preflight
from pubsub_filter.runtime.wiring import make_engine

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same cases on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Field names the payloads and the configs share, so paths sometimes resolve.
NAMES = ["game_date", "id", "status", "players", "0", "1", "²", "k"]
JUNK = st.sampled_from([None, 0, -1, 2**70, 1.5, float("nan"), True, "", "x", [], {}, ["a"], {"a": 1}])


GOOD_PATHS = st.one_of(
    st.lists(st.sampled_from(NAMES), max_size=3).map(lambda s: ".".join(["payload", *s])),
    st.sampled_from(NAMES).map(lambda n: f"attributes.{n}"),
)
BAD_PATHS = st.sampled_from(
    ["payload.players.-1.id", "payload.players[0]", "payload..x", "body.x", "attributes.a.b", ""]
)
BAD_DURATIONS = st.one_of(
    st.sampled_from(["0s", "-1s", "soon", "\u0661\u0662s", "1y"]),
    st.integers(-5, 10**7),
    st.floats(allow_nan=True, allow_infinity=True),
)
LEASES = st.sampled_from(
    [{}, {"duration": "120s"}, {"duration": "15m", "ack_deadline": "300s", "heartbeat": "60s"}, {"heartbeat": "5s"}]
)


def configs(good: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Configs whose every value fits its key (`good`: cross-key rules may still refuse them), or any at all."""

    def v(fits: st.SearchStrategy[Any], bad: st.SearchStrategy[Any] = JUNK) -> st.SearchStrategy[Any]:
        return fits if good else st.one_of(fits, fits, bad, JUNK)

    def one(*values: Any) -> st.SearchStrategy[Any]:
        return st.sampled_from(values)

    paths = v(GOOD_PATHS, BAD_PATHS)
    fields = v(st.lists(st.sampled_from(NAMES), max_size=3))
    durations = v(one("500ms", "2s", "90s", "15m", "1h", "24h"), BAD_DURATIONS)
    ids = v(
        one("phase3", "raw-reports", "projects/p/topics/phase3"),
        st.one_of(one("projects/p/subscriptions/raw", "goog-x", "ab"), st.text(max_size=6)),
    )
    files = v(one("state.db", "a.db", "outbox.jsonl"), one("dir", "missing/x.db", ""))
    condition = st.fixed_dictionaries(
        {"field": paths},
        optional={} if good else {"equals": st.sampled_from(NAMES), "in": fields, "exists": v(st.booleans())},
    )
    if good:
        condition = st.tuples(condition, st.sampled_from(["equals", "in", "exists"]), st.sampled_from(NAMES)).map(
            lambda c: {**c[0], c[1]: {"equals": c[2], "in": [c[2]], "exists": True}[c[1]]}
        )
    extra: dict[str, st.SearchStrategy[Any]] = {} if good else {"typo": st.just(1)}

    def route(i: int) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries(
            {
                "name": v(st.just(f"r{i}"), one("r0", "-bad", 5)),
                "destination": ids,
                "key": v(st.lists(paths, min_size=1, max_size=2)),
            },
            optional={
                "subscription": ids,
                "rows": paths,
                "row_key": fields,
                "include": fields,
                "exclude": fields,
                "window": durations,
                "mode": v(one("enforce", "shadow"), one("off")),
                "scheme": v(one("canonical", "data_hash", "event"), one("md5")),
                "on_store_error": v(one("forward", "retry"), one("drop")),
                "on_missing_key": v(one("forward", "reject"), one("retry")),
                "stale": v(one("suppress", "forward")),
                "bypass": v(st.one_of(condition, st.lists(condition, max_size=2))),
                "rows_mode": v(one("whole", "changed")),
                "removed_rows": v(one("attribute", "tombstone", "ignore")),
                "audit_sample": v(one(0, 0.5, 1), one(2, -1)),
                "push_format": v(one("wrapped", "unwrapped", "unwrapped_no_metadata"), one("none", "bare")),
                **extra,
            },
        )

    def section(**keys: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return v(st.fixed_dictionaries({}, optional=keys))

    return st.fixed_dictionaries(
        {"routes": st.integers(1, 3).flatmap(lambda n: st.tuples(*(route(i) for i in range(n))).map(list))},
        optional={
            "store": section(backend=v(one("sqlite", "firestore"), one("redis")), path=files),
            "publisher": section(backend=v(one("outbox", "pubsub"), one("kafka")), path=files, timeout=durations),
            "records": section(
                backend=v(one("sqlite", "bigquery"), one("csv")), path=files, batch_size=v(one(1, 500), one(0, -1))
            ),
            "lease": LEASES if good else section(duration=durations, ack_deadline=durations, heartbeat=durations),
            "store_errors": section(
                timeout=v(one("1s", "2s"), BAD_DURATIONS), budget=v(one("3s", "5s"), BAD_DURATIONS)
            ),
            "server": section(
                max_body=v(one("10MiB", "512KiB", 4096), st.integers(-1, 2**40)),
                shutdown_budget=durations,
                admission_wait=v(one(0, "0s", "500ms", "2s", 60), one(-1, "61s", "2 s later", True)),
            ),
            "auth": section(
                audience=v(one("https://f.run.app"), one("")),
                service_account=v(one("push@p.iam.gserviceaccount.com"), one("push")),
                any_service_account=v(st.booleans()),
            ),
            "pull": section(max_messages=v(one(1, 100), one(0, -1)), max_bytes=v(one("10MiB"), one("-1"))),
            "state_ttl": v(one("30d", "7d"), BAD_DURATIONS),
            "project": v(one("my-project")),
            **({} if good else {"extra_section": st.just(1)}),
        },
    )


CONFIGS = st.one_of(configs(good=True), configs(good=False))

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.sampled_from(NAMES)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(NAMES), inner, max_size=4)),
    max_leaves=12,
)
DATA = st.one_of(
    st.dictionaries(st.sampled_from(NAMES), JSON_VALUES, max_size=5).map(lambda d: json.dumps(d).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
)
ENVELOPES = st.builds(
    make_envelope,
    data=DATA,
    message_id=st.sampled_from(["1", "2", "3"]),
    attributes=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(NAMES), max_size=3),
    subscription=st.sampled_from(["projects/p/subscriptions/raw-reports", "projects/p/subscriptions/raw", "x"]),
    publish_time=st.sampled_from(["2026-01-01T00:00:00Z", "2025-12-31T23:59:59.5Z", "9999-12-31T23:59:59Z", "x"]),
)
BODIES = st.one_of(ENVELOPES, ENVELOPES, ENVELOPES, st.binary(max_size=60))


def along(parts: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """A value shaped like a path: at each segment an object with that key, or a list (indexed or not)."""
    if not parts:
        return JSON_VALUES
    inner = along(parts[1:])
    return st.one_of(
        st.fixed_dictionaries({parts[0]: inner}),
        st.lists(inner, min_size=1, max_size=3),
        st.lists(st.fixed_dictionaries({parts[0]: inner}), min_size=1, max_size=2),
    )


def shaped_bodies(cfg: Config) -> st.SearchStrategy[bytes]:
    """Envelopes whose payload follows the config's own payload paths, so that they resolve (or nearly)."""
    paths = [
        p.parts
        for r in cfg.routes
        for p in (*r.key, *([r.rows] if r.rows else []), *(c.field for c in r.bypass))
        if p.root == "payload" and p.parts
    ]
    if not paths:
        return ENVELOPES
    payloads = st.lists(st.sampled_from(paths).flatmap(along), min_size=1, max_size=3).map(
        lambda parts: json.dumps({k: v for d in parts if isinstance(d, dict) for k, v in d.items()} or parts[0])
    )
    return st.builds(
        make_envelope,
        data=payloads.map(str.encode),
        message_id=st.sampled_from(["1", "2", "3"]),
        attributes=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(NAMES), max_size=3),
    )


def names_a_key(problem: str, raw: dict[str, Any]) -> bool:
    where = problem.split(": ", 1)[0]
    if where.startswith(("route '", "routes[", "line ")):
        return True
    head = where.split(".")[0].split("[")[0]
    return head in raw or head in Config.model_fields


async def answers(cfg: Config, workdir: Path, messages: list[tuple[int, bytes]]) -> list[int]:
    embedded = cfg.model_copy(
        update={
            "store": SqliteStoreConfig(path=str(workdir / "run-state.db")),
            "publisher": OutboxConfig(path=str(workdir / "run-outbox.jsonl")),
            "records": SqliteRecordsConfig(path=str(workdir / "run-decisions.db")),
        }
    )
    engine = make_engine(embedded)
    names = [r.name for r in cfg.routes]
    statuses = []
    transport = httpx.ASGITransport(app=create_app(engine), raise_app_exceptions=False)
    async with engine_lifespan(engine), httpx.AsyncClient(transport=transport, base_url="http://filter") as client:
        for pick, body in messages:
            name = names[pick % len(names)] if pick < 10 else "no-such-route"
            statuses.append((await client.post(f"/push/{name}", content=body)).status_code)
    return statuses


def outcome(raw: dict[str, Any], duplicate: bool, messages: list[tuple[int, bytes]], data: st.DataObject) -> str:
    """'rejected' or 'accepted'; asserts what each must satisfy."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        workdir = Path(tmp)
        (workdir / "dir").mkdir()
        text = yaml.safe_dump(raw) + ("routes: []\n" if duplicate else "")
        (workdir / "filter.yaml").write_text(text)
        try:
            cfg = load(workdir / "filter.yaml")
            preflight.check(cfg, "filter.yaml")
        except ConfigError as exc:
            assert exc.problems, raw
            unnamed = [p for p in exc.problems if not names_a_key(p, raw)]
            assert not unnamed, (unnamed, raw)
            return "rejected"
        assert not duplicate, "a duplicate routes key was accepted"
        messages += data.draw(st.lists(st.tuples(st.integers(0, 9), shaped_bodies(cfg)), max_size=6))
        statuses = asyncio.run(answers(cfg, workdir, messages))
        assert all(s < 500 for s in statuses), (statuses, raw)
        return "accepted"


def test_a_generated_config_is_rejected_naming_its_keys_or_never_answers_5xx() -> None:
    seen = {"accepted": 0, "rejected": 0}

    @SETTINGS
    @given(
        raw=CONFIGS,
        duplicate=st.sampled_from([False, False, False, True]),
        messages=st.lists(st.tuples(st.integers(0, 11), BODIES), min_size=1, max_size=6),
        data=st.data(),
    )
    def case(raw: dict[str, Any], duplicate: bool, messages: list[tuple[int, bytes]], data: st.DataObject) -> None:
        seen[outcome(raw, duplicate, messages, data)] += 1

    case()
    # a generator that never builds a valid config, or never an invalid one, tests nothing
    assert seen["accepted"] >= 15 and seen["rejected"] >= 15, seen
