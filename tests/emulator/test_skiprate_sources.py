"""Skip rate from anywhere: the SQLite records, the BigQuery table (bqemulator) and the log lines agree.

One fixed script of 60 messages over 3 routes (one in shadow mode) and two hours (an
injected clock) runs through a real `Engine`. Its recorder writes every decision to a
SQLite table and to a BigQuery table; `pubsub_filter.observability.logsetup` writes the log lines to a file.
The three `RecordsReader`s (SQLite, BigQuery, log lines) run one contract below: each must
give the counts worked out by hand, by route, hour and day, in the same rows as the others.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from google.cloud import bigquery

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.bigquery import EMULATOR_ENV, BigQueryReader, BigQuerySink
from pubsub_filter.backends.records.log_lines import LogLinesReader
from pubsub_filter.backends.records.sqlite import SqliteReader, SqliteSink
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import DecisionRecord, KeyState, Lease, Message
from pubsub_filter.core.ports import RecordsReader, StoreUnavailable
from pubsub_filter.observability import logsetup
from pubsub_filter.tools.skiprate import render, summarize
from tests.support.bqemu import BqEmulator
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher

pytestmark = pytest.mark.emulator

PROJECT = "test-project"
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
H0, H1, DAY = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", "2026-01-01"
ROUTES: list[dict[str, Any]] = [
    {"name": "injuries", "destination": "phase3-injuries", "key": ["payload.game_date"], "exclude": ["scraped"]},
    {
        "name": "props",
        "destination": "phase3-props",
        "key": ["payload.game_id"],
        "exclude": ["scraped"],
        "on_store_error": "retry",
        "on_missing_key": "reject",
    },
    {
        "name": "lines",
        "destination": "phase3-lines",
        "key": ["payload.game_id"],
        "exclude": ["scraped"],
        "mode": "shadow",
    },
]

# --- the script -----------------------------------------------------------------------
# (minute from 00:00, route, key, version, expected decision, options)
# options: "id" reuses a message id (a redelivery), "old" publishes before the last forward,
# "down" takes the store down for this message, "nokey" drops the key field (fail-open but on props),
# "raw" sends bytes that are not JSON, "lease" has another instance hold the key first,
# "pubfail" makes the publish fail.
SCRIPT: list[tuple[float, str, str, int, str, dict[str, Any]]] = [
    # injuries, hour 0
    (1, "injuries", "d1", 1, "forwarded", {"id": "inj-1"}),
    (2, "injuries", "d1", 1, "suppressed", {}),
    (3, "injuries", "d1", 1, "suppressed", {}),
    (4, "injuries", "d1", 1, "duplicate", {"id": "inj-1"}),
    (5, "injuries", "d2", 1, "forwarded", {}),
    (6, "injuries", "d2", 1, "suppressed", {}),
    (7, "injuries", "d1", 2, "forwarded", {}),
    (8, "injuries", "d1", 2, "suppressed", {}),
    (9, "injuries", "d1", 1, "stale", {"old": True}),
    (10, "injuries", "d3", 1, "forwarded", {}),
    (11, "injuries", "d3", 1, "suppressed", {}),
    (12, "injuries", "d3", 1, "fail_open", {"nokey": True}),
    (13, "injuries", "d4", 1, "fail_open", {"down": True}),
    (14, "injuries", "d3", 1, "suppressed", {}),
    (15, "injuries", "d2", 1, "suppressed", {}),
    # props (on_store_error: retry), hour 0
    (20, "props", "g1", 1, "forwarded", {}),
    (21, "props", "g1", 1, "suppressed", {}),
    (22, "props", "g1", 1, "suppressed", {}),
    (23, "props", "g2", 1, "forwarded", {}),
    (24, "props", "g2", 2, "forwarded", {}),
    (25, "props", "g2", 2, "suppressed", {}),
    (26, "props", "g3", 1, "failed", {"down": True, "id": "prop-g3"}),
    (27, "props", "g3", 1, "forwarded", {"id": "prop-g3"}),
    (28, "props", "g3", 1, "duplicate", {"id": "prop-g3"}),
    (29, "props", "g3", 1, "rejected", {"raw": True}),
    # lines (shadow), hour 0
    (40, "lines", "L1", 1, "forwarded", {"id": "line-1"}),
    (41, "lines", "L1", 1, "suppressed", {}),
    (42, "lines", "L1", 1, "suppressed", {}),
    (43, "lines", "L1", 1, "duplicate", {"id": "line-1"}),
    (44, "lines", "L2", 1, "forwarded", {}),
    (45, "lines", "L2", 1, "suppressed", {}),
    (46, "lines", "L2", 2, "forwarded", {}),
    (47, "lines", "L3", 1, "fail_open", {"down": True}),
    # injuries, hour 1 (the first one exactly on the hour)
    (60, "injuries", "d1", 2, "suppressed", {}),
    (61, "injuries", "d4", 1, "forwarded", {"id": "inj-d4"}),
    (62, "injuries", "d4", 1, "suppressed", {}),
    (63, "injuries", "d4", 1, "duplicate", {"id": "inj-d4"}),
    (64, "injuries", "d5", 1, "forwarded", {}),
    (65, "injuries", "d5", 1, "suppressed", {}),
    (66, "injuries", "d6", 1, "contended", {"lease": True}),
    (68.5, "injuries", "d6", 1, "forwarded", {}),  # the other instance's lease expired at 68: taken over
    (69, "injuries", "d6", 1, "suppressed", {}),
    (70, "injuries", "d7", 1, "failed", {"pubfail": True, "id": "inj-d7"}),
    (71, "injuries", "d7", 1, "forwarded", {"id": "inj-d7"}),
    # props, hour 1
    (80, "props", "g1", 1, "suppressed", {}),
    (81, "props", "g1", 1, "suppressed", {}),
    (82, "props", "g2", 2, "suppressed", {}),
    (83, "props", "g1", 2, "forwarded", {}),
    (84, "props", "g1", 1, "stale", {"old": True}),
    (85, "props", "g4", 1, "forwarded", {}),
    (86, "props", "g4", 1, "suppressed", {}),
    # lines, hour 1
    (100, "lines", "L1", 1, "suppressed", {}),
    (101, "lines", "L2", 2, "suppressed", {}),
    (102, "lines", "L2", 1, "stale", {"old": True}),
    (103, "lines", "L1", 2, "forwarded", {}),
    (104, "lines", "L1", 2, "suppressed", {}),
    (105, "lines", "L3", 1, "forwarded", {}),
    (106, "lines", "L3", 1, "suppressed", {}),
    (107, "lines", "L3", 1, "fail_open", {"nokey": True}),
    (108, "lines", "L3", 1, "suppressed", {}),
]

# --- the answer, by hand ----------------------------------------------------------------
# injuries H0: forwarded 1,5,7,10 | suppressed 2,3,6,8,11,14,15 | duplicate 4 | stale 9 | fail_open 12,13
# injuries H1: suppressed 60,62,65,69 | forwarded 61,64,68.5,71 | duplicate 63 | contended 66 | failed 70
# props    H0: forwarded 20,23,24,27 | suppressed 21,22,25 | failed 26 | duplicate 28 | rejected 29
# props    H1: suppressed 80,81,82,86 | forwarded 83,85 | stale 84
# lines    H0: forwarded 40,44,46 | suppressed 41,42,45 | duplicate 43 | fail_open 47        (all enforced = false)
# lines    H1: suppressed 100,101,104,106,108 | stale 102 | forwarded 103,105 | fail_open 107
EXPECTED_BY_HOUR: dict[tuple[str, str], dict[str, int]] = {
    ("injuries", H0): {"forwarded": 4, "suppressed": 7, "duplicate": 1, "stale": 1, "fail_open": 2},
    ("injuries", H1): {"forwarded": 4, "suppressed": 4, "duplicate": 1, "contended": 1, "failed": 1},
    ("props", H0): {"forwarded": 4, "suppressed": 3, "duplicate": 1, "failed": 1, "rejected": 1},
    ("props", H1): {"forwarded": 2, "suppressed": 4, "stale": 1},
    ("lines", H0): {"forwarded": 3, "suppressed": 3, "duplicate": 1, "fail_open": 1},
    ("lines", H1): {"forwarded": 2, "suppressed": 5, "stale": 1, "fail_open": 1},
}
EXPECTED_BY_ROUTE: dict[str, dict[str, int]] = {
    "injuries": {
        "forwarded": 8,
        "suppressed": 11,
        "duplicate": 2,
        "stale": 1,
        "fail_open": 2,
        "contended": 1,
        "failed": 1,
    },
    "props": {"forwarded": 6, "suppressed": 7, "duplicate": 1, "stale": 1, "failed": 1, "rejected": 1},
    "lines": {"forwarded": 5, "suppressed": 8, "duplicate": 1, "stale": 1, "fail_open": 2},
}
# skip rate = (suppressed + duplicate + stale) / (forwarded + suppressed + duplicate + stale + fail_open)
EXPECTED_RATES_BY_HOUR: dict[tuple[str, str], tuple[float, float | None]] = {  # (skip_rate, would_skip)
    ("injuries", H0): (60.0, None),  # 9 / 15
    ("injuries", H1): (55.56, None),  # 5 / 9
    ("props", H0): (50.0, None),  # 4 / 8
    ("props", H1): (71.43, None),  # 5 / 7
    ("lines", H0): (0.0, 50.0),  # shadow: 4 / 8 would have been skipped
    ("lines", H1): (0.0, 66.67),  # 6 / 9
}
EXPECTED_RATES_BY_ROUTE: dict[str, tuple[float, float | None]] = {
    "injuries": (58.33, None),  # 14 / 24
    "props": (60.0, None),  # 9 / 15
    "lines": (0.0, 58.82),  # 10 / 17
}
TOTALS = {"injuries": 26, "props": 17, "lines": 17}


def test_the_script_is_what_the_hand_counts_say() -> None:
    assert len(SCRIPT) == 60 == sum(TOTALS.values())
    for route, total in TOTALS.items():
        assert sum(EXPECTED_BY_ROUTE[route].values()) == total
        assert sum(sum(v.values()) for (r, _), v in EXPECTED_BY_HOUR.items() if r == route) == total


# --- running it -------------------------------------------------------------------------


class SwitchStore:
    """The SQLite store, with a switch that makes every call fail as an unreachable store does."""

    def __init__(self, path: Path) -> None:
        self.inner = SqliteStore(path)
        self.down = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any) -> Any:
            if self.down:
                raise StoreUnavailable("connection refused")
            return await method(*args)

        return call


class FanOut:
    """A DecisionRecorder that hands every record to several batching recorders."""

    def __init__(self, *recorders: BatchingRecorder) -> None:
        self.recorders = recorders

    def record(self, record: DecisionRecord) -> None:
        for r in self.recorders:
            r.record(record)

    def committing(self) -> None:
        return None

    async def flush(self) -> None:
        for r in self.recorders:
            await r.flush()

    async def close(self, deadline: float | None = None) -> None:
        for r in self.recorders:
            await r.close(deadline)


@dataclass
class Run:
    decisions: list[str]
    sqlite_path: Path
    bq_client: bigquery.Client  # for reading back (the sink's own client is closed with it)
    bq_table: str
    log_path: Path
    sqlite_written: int
    bq_written: int


async def play(tmp: Path, bq_sink: BigQuerySink, reader: bigquery.Client, log_path: Path) -> Run:
    config = parse({"routes": ROUTES})
    clock = ManualClock(START)
    store = SwitchStore(tmp / "state.db")
    publisher = MemoryPublisher()
    sqlite_rec = BatchingRecorder(SqliteSink(tmp / "decisions.db"), batch_size=25, flush_interval=0.2)
    bq_rec = BatchingRecorder(bq_sink, batch_size=25, flush_interval=0.2)
    engine = Engine(config, store, publisher, FanOut(sqlite_rec, bq_rec), clock, "emu")
    decisions: list[str] = []
    with log_path.open("w") as log_file:
        logsetup.configure(fmt="json", project=PROJECT, stream=log_file, clock=clock.now, cache=False)
        for n, (minute, route, key, version, _, opt) in enumerate(SCRIPT):
            clock.t = START + minute * 60
            field = "game_date" if route == "injuries" else "game_id"
            payload: dict[str, Any] = {field: key, "v": version, "scraped": f"{minute}"}
            if opt.get("nokey"):
                del payload[field]
            data = b"\x00 not json" if opt.get("raw") else json.dumps(payload).encode()
            publish_time = START if opt.get("old") else clock.t
            if opt.get("lease"):
                lease = Lease("other/1", 1, clock.t + 120, "sha256:" + "0" * 64, "other-msg")
                assert await store.inner.claim(route, key, None, KeyState(fence=1, lease=lease)) is not None
            store.down = bool(opt.get("down"))
            publisher.fail_next = 1 if opt.get("pubfail") else 0
            msg = Message(data=data, attributes={}, message_id=opt.get("id", f"msg-{n}"), publish_time=publish_time)
            rec = (await engine.handle(route, msg, trace=uuid.uuid4().hex)).record
            store.down = False
            decisions.append(str(rec.decision))
        await engine.recorder.close()
    return Run(decisions, tmp / "decisions.db", reader, bq_sink.table, log_path, sqlite_rec.written, bq_rec.written)


@pytest.fixture(scope="module")
def run(bq_emulator: BqEmulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("skiprate-sources")
    dataset = f"t_{uuid.uuid4().hex[:12]}"
    client = bq_emulator.client()
    # long partition expiry: the script's day is in the past
    sink = BigQuerySink(
        bq_emulator.client(), f"{PROJECT}.{dataset}.decisions", partition_expiration_days=3650, deadline=30
    )
    saved = structlog.get_config()
    try:
        yield asyncio.run(play(tmp, sink, client, tmp / "filter.log"))
    finally:
        structlog.configure(**saved)
        client.delete_dataset(f"{PROJECT}.{dataset}", delete_contents=True, not_found_ok=True)
        client.close()


def test_every_message_was_decided_as_scripted(run: Run) -> None:
    assert run.decisions == [step[4] for step in SCRIPT]
    assert run.sqlite_written == run.bq_written == 60


# --- the three readers agree --------------------------------------------------------------

READERS = ("sqlite", "bigquery", "log")


def reader_of(run: Run, name: str) -> RecordsReader:
    if name == "sqlite":
        return SqliteReader(run.sqlite_path)
    if name == "bigquery":
        return BigQueryReader(run.bq_client, run.bq_table)  # the client is the run's: closed with it
    return LogLinesReader(str(run.log_path))


def norm(rows: list[Any]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["route"], r["bucket"] or "", r["decision"], r["enforced"]))


def sources(run: Run, by: str, since: float | None = None) -> dict[str, list[dict[str, Any]]]:
    return {name: norm(reader_of(run, name).decision_counts(since, by)) for name in READERS}  # type: ignore[arg-type]


def folded(rows: list[dict[str, Any]]) -> dict[tuple[str, str | None], dict[str, int]]:
    out: dict[tuple[str, str | None], dict[str, int]] = {}
    for r in rows:
        assert r["enforced"] is (r["route"] != "lines"), r
        out.setdefault((r["route"], r["bucket"]), {})[r["decision"]] = r["n"]
    return out


def expected_counts(by: str) -> dict[tuple[str, str | None], dict[str, int]]:
    if by == "hour":
        return dict(EXPECTED_BY_HOUR)
    bucket = DAY if by == "day" else None
    return {(route, bucket): counts for route, counts in EXPECTED_BY_ROUTE.items()}


@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize("by", ["route", "hour", "day"])
def test_reader_counts_every_decision_by_route_and_bucket(run: Run, name: str, by: str) -> None:
    assert folded(reader_of(run, name).decision_counts(None, by)) == expected_counts(by)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", READERS)
def test_reader_rows_have_the_one_shape(run: Run, name: str) -> None:
    for row in reader_of(run, name).decision_counts(None, "hour"):
        assert set(row) == {"route", "bucket", "decision", "enforced", "n"}
        assert isinstance(row["route"], str) and isinstance(row["bucket"], str) and isinstance(row["decision"], str)
        assert type(row["enforced"]) is bool and type(row["n"]) is int


@pytest.mark.parametrize("name", READERS)
def test_reader_keeps_decisions_made_at_since_and_after(run: Run, name: str) -> None:
    since = START + 3600  # 01:00:00 exactly: the 01:00 decision is kept
    rows = reader_of(run, name).decision_counts(since, "route")
    assert {r.route: r.total for r in summarize(rows)} == {"injuries": 11, "props": 7, "lines": 9}


@pytest.mark.parametrize("name", READERS)
def test_reader_refuses_an_unknown_bucket(run: Run, name: str) -> None:
    with pytest.raises(ValueError):
        reader_of(run, name).decision_counts(None, "week")  # type: ignore[arg-type]


@pytest.mark.parametrize("by", ["route", "hour", "day"])
def test_sqlite_bigquery_and_logs_give_identical_rows(run: Run, by: str) -> None:
    got = sources(run, by)
    assert got["sqlite"] == got["bigquery"] == got["log"]
    assert {k: [r.as_dict() for r in summarize(v)] for k, v in got.items()} == {
        k: [r.as_dict() for r in summarize(got["sqlite"])] for k in got
    }
    assert folded(got["sqlite"]) == expected_counts(by)


def test_skip_rates_are_the_hand_computed_ones(run: Run) -> None:
    for source, rows in sources(run, "hour").items():
        got = {(r.route, r.bucket): (r.as_dict()["skip_rate"], r.as_dict()["would_skip"]) for r in summarize(rows)}
        assert got == EXPECTED_RATES_BY_HOUR, source
    for source, rows in sources(run, "route").items():
        got_route = {r.route: (r.as_dict()["skip_rate"], r.as_dict()["would_skip"]) for r in summarize(rows)}
        assert got_route == EXPECTED_RATES_BY_ROUTE, source
        assert {r.route: r.total for r in summarize(rows)} == TOTALS


def test_since_cuts_at_the_same_place_in_every_source(run: Run) -> None:
    since = START + 3600  # 01:00:00 exactly: the 01:00 decision is kept
    got = sources(run, "route", since)
    assert got["sqlite"] == got["bigquery"] == got["log"]
    assert {r.route: r.total for r in summarize(got["log"])} == {"injuries": 11, "props": 7, "lines": 9}


# --- the command ---------------------------------------------------------------------------


def test_cli_skip_rate_from_the_log_file(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["skip-rate", "--log", str(run.log_path), "--since", "2025-12-31", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == [r.as_dict() for r in summarize(sources(run, "route")["bigquery"])]
    assert {d["route"]: (d["skip_rate"], d["would_skip"]) for d in out} == EXPECTED_RATES_BY_ROUTE
    assert {d["route"]: d["mode"] for d in out} == {"injuries": "enforce", "props": "enforce", "lines": "shadow"}

    assert main([*argv[:-2], "--by", "hour", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    got = {(r["route"], r["bucket"]): (float(r["skip_rate"]), r["would_skip"]) for r in rows}
    assert got == {k: (v[0], "" if v[1] is None else str(v[1])) for k, v in EXPECTED_RATES_BY_HOUR.items()}


def test_cli_skip_rate_from_the_configured_backends(
    run: Run,
    tmp_path: Path,
    bq_emulator: BqEmulator,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project, dataset, table = run.bq_table.split(".")
    configs = {
        "sqlite": {"records": {"backend": "sqlite", "path": str(run.sqlite_path)}},
        "bigquery": {"records": {"backend": "bigquery", "project": project, "dataset": dataset, "table": table}},
    }
    monkeypatch.setenv(EMULATOR_ENV, bq_emulator.host)
    outputs = {}
    for name, records in configs.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps({**records, "routes": ROUTES}))  # JSON is YAML
        assert main(["skip-rate", "-c", str(path), "--since", "2025-12-31", "--by", "day", "--format", "json"]) == 0
        outputs[name] = capsys.readouterr().out
    assert (
        main(["skip-rate", "--log", str(run.log_path), "--since", "2025-12-31", "--by", "day", "--format", "json"]) == 0
    )
    outputs["log"] = capsys.readouterr().out
    assert outputs["sqlite"] == outputs["bigquery"] == outputs["log"]
    assert {d["route"]: d["total"] for d in json.loads(outputs["log"])} == TOTALS
    table_text = render(summarize(sources(run, "day")["log"]), "table")
    assert "58.8%" in table_text and "58.3%" in table_text


# --- the queries in docs/operations.md run, and say the same ----------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
NOW = "TIMESTAMP('2026-01-01 03:00:00+00')"  # the docs query the last hours/days before now


def doc_queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOCS.read_text(), flags=re.S)


def query(run: Run, sql: str) -> list[dict[str, Any]]:
    sql = sql.replace("PROJECT.pubsub_filter.decisions", run.bq_table).replace("CURRENT_TIMESTAMP()", NOW)
    return [dict(row.items()) for row in run.bq_client.query(sql).result()]


def day_of(value: Any) -> str:
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def test_docs_queries_run_on_the_decisions_table(run: Run) -> None:
    contended, fail_open, skip_rate, shadow = doc_queries()

    assert query(run, contended) == []  # one contended decision: under the threshold of 10
    rows = query(run, contended.replace("HAVING contended > 10", "HAVING contended > 0"))
    assert [(r["route"], r["hour"], r["contended"]) for r in rows] == [
        ("injuries", dt.datetime(2026, 1, 1, 1, tzinfo=dt.UTC), 1)
    ]

    rows = query(run, fail_open)
    assert sorted((r["route"], r["hour"].hour, r["fail_open"]) for r in rows) == [
        ("injuries", 0, 2),  # the store down, and a message without its key
        ("lines", 0, 1),
        ("lines", 1, 1),
    ]

    by_route = {r.route: r for r in summarize(sources(run, "day")["bigquery"])}
    rows = query(run, skip_rate)
    assert {r["route"]: (day_of(r["day"]), r["total"], r["decided"], r["skip_rate"]) for r in rows} == {
        name: (DAY, row.total, row.decided, row.as_dict()["skip_rate"]) for name, row in by_route.items()
    }
    rows = query(run, shadow)
    assert [(r["route"], day_of(r["day"]), r["decided"], r["would_skip_n"], r["would_skip"]) for r in rows] == [
        ("lines", DAY, 17, 10, 58.82)
    ]


# --- tune reads the same decisions from every source --------------------------------------


@pytest.mark.parametrize("route", ["injuries", "props", "lines"])
def test_tune_reads_the_same_field_changes_from_every_source(run: Run, route: str) -> None:
    from pubsub_filter.tools.tune import analyse

    found = {}
    for name in READERS:
        rows = reader_of(run, name).decision_rows(route, None)  # type: ignore[attr-defined]
        found[name] = analyse(rows, include=["v", "scraped"]).as_dict()
    assert found["sqlite"] == found["bigquery"] == found["log"]
    assert [f["name"] for f in found["sqlite"]["fields"]] == ["v"]  # the script changes only v between forwards
    assert "scraped" in found["sqlite"]["excluded_fields"]  # rescrapes: changed outside the selection
