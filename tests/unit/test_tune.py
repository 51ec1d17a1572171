"""`pubsub-filter tune` on a stream with a forgotten scrape timestamp: it names the timestamp as
churn and the status as signal, and its what-if skip rate for excluding the timestamp is the
one a route that excludes it actually has over the same stream."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pytest
import structlog

from pubsub_filter.backends.records.sqlite import SqliteReader
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Message
from pubsub_filter.runtime.wiring import make_recorder
from pubsub_filter.tools.tune import analyse
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher

KEYS = 4
PER_KEY = 60


def stream() -> list[dict[str, Any]]:
    """Per key, a status that changes now and then, and a scrape time that always does."""
    rng = random.Random(7)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    status = {k: "active" for k in range(KEYS)}
    out = []
    for i in range(PER_KEY):
        for k in range(KEYS):
            if rng.random() < 0.3:
                status[k] = rng.choice([s for s in ("active", "questionable", "out") if s != status[k]])
            scraped = (start + dt.timedelta(minutes=5 * i, seconds=k)).isoformat().replace("+00:00", "Z")
            out.append({"game_id": f"g{k}", "status": status[k], "team": "BOS", "scrape_time": scraped})
    return out


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    route = {"destination": "phase3", "key": ["payload.game_id"]}
    cfg = {
        "routes": [{"name": "scraped", **route}, {"name": "fixed", **route, "exclude": ["scrape_time"]}],
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
    }
    path = tmp_path / "filter.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


async def run_stream(config_path: Path, log: Path) -> None:
    """The same stream through both routes, the decision lines also written to `log`."""
    cfg = load(str(config_path))
    clock = ManualClock()
    store = SqliteStore(config_path.parent / "state.db")
    recorder = make_recorder(cfg)
    engine = Engine(cfg, store, MemoryPublisher(), recorder, clock)
    try:
        with structlog.testing.capture_logs() as captured:
            for n, payload in enumerate(stream()):
                clock.advance(1.0)
                for route in ("scraped", "fixed"):
                    msg = Message(json.dumps(payload).encode(), {}, f"{route}-{n}", publish_time=clock.now())
                    await engine.handle(route, msg)
    finally:
        await recorder.close()
        await store.close()
    with log.open("w", encoding="utf-8") as out:
        for e in captured:
            if e["event"] == "decision":
                fields = {k: v for k, v in e.items() if k not in ("event", "log_level")}
                out.write(json.dumps({"message": "decision", **fields}) + "\n")


def skip_rate(config_path: Path, route: str) -> float:
    rows = SqliteReader(config_path.parent / "decisions.db").decision_rows(route, None)
    held = sum(r["decision"] in ("suppressed", "duplicate", "stale", "noise_only") for r in rows)
    return 100.0 * held / len(rows)


async def test_tune_names_the_timestamp_as_churn_and_predicts_the_skip_rate_excluding_it_would_give(
    config_path: Path, tmp_path: Path
) -> None:
    await run_stream(config_path, tmp_path / "decisions.log")
    rows = SqliteReader(tmp_path / "decisions.db").decision_rows("scraped", None)
    a = analyse(rows, exclude=["scrape_time"])
    verdicts = {f.name: f.verdict for f in a.fields}
    assert verdicts == {"scrape_time": "churn", "status": "signal"}
    assert a.had_rate == 0.0  # every message looked changed
    assert a.coverage == 100.0
    measured = skip_rate(config_path, "fixed")
    assert measured > 40  # the stream is mostly rescrapes: the exclude matters
    assert a.would_rate is not None and abs(a.would_rate - measured) <= 1.0
    assert any(s.startswith("exclude scrape_time: changed alone in") for s in analyse(rows).suggestions)


async def test_tune_from_the_records_backend_and_from_log_lines_agree(
    config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "decisions.log"
    await run_stream(config_path, log)
    capsys.readouterr()  # the engine's own log lines
    measured = skip_rate(config_path, "fixed")
    common = ["--route", "scraped", "--since", "2025-12-01", "--exclude", "scrape_time", "--format", "json"]
    assert main(["tune", "--config", str(config_path), *common]) == 0
    from_table = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert main(["tune", "--log", str(log), *common]) == 0
    from_log = json.loads(capsys.readouterr().out.splitlines()[-1])
    for got in (from_table, from_log):
        assert abs(got["would_skip_rate"] - measured) <= 1.0
        assert {f["name"]: f["verdict"] for f in got["fields"]} == {"scrape_time": "churn", "status": "signal"}
    assert from_table["fields"] == from_log["fields"]


async def test_the_table_says_what_it_could_evaluate_and_why_it_suggests(
    config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await run_stream(config_path, tmp_path / "decisions.log")
    capsys.readouterr()  # the engine's own log lines
    assert main(["tune", "--config", str(config_path), "--route", "scraped", "--since", "2025-12-01"]) == 0
    out = capsys.readouterr().out
    assert f"route scraped: {KEYS * PER_KEY} decisions, {KEYS * PER_KEY} evaluable (100.0 %)" in out
    assert "looks like a scrape timestamp" in out


def test_forwards_without_their_changed_fields_are_counted_as_not_evaluable() -> None:
    base: dict[str, Any] = {"enforced": True, "key": "k", "fingerprint": "b", "previous_fingerprint": "a"}
    rows: list[Any] = [
        {**base, "time": 1.0, "decision": "forwarded", "reason": "new key", "previous_fingerprint": None, "extra": {}},
        {**base, "time": 2.0, "decision": "forwarded", "reason": "content changed", "extra": {}},  # before tune
        {**base, "time": 3.0, "decision": "forwarded", "reason": "content changed", "extra": {"fields_changed": ["t"]}},
        {**base, "time": 4.0, "decision": "suppressed", "reason": "unchanged", "extra": {}},
    ]
    a = analyse(rows, exclude=["t"])
    assert (a.decided, a.evaluable) == (4, 3)
    assert a.would_skip == 2  # the suppression, and the forward that changed only t


def test_the_docs_worked_example_prints_what_the_page_shows(capsys: pytest.CaptureFixture[str]) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "tune.md").read_text(encoding="utf-8")
    section = page[page.index("# Tuning the selection") :]
    block = section[section.index("```sh\n") + 6 : section.index("\n```", section.index("```sh\n"))]
    shown: dict[str, list[str]] = {}
    for line in block.splitlines():
        if line.startswith("$ "):
            command = line[2:]
            shown[command] = []
        else:
            shown[command].append(line)
    for command, lines in shown.items():
        argv, _, tail = command.partition(" | tail -")
        assert main(argv.split()[1:]) == 0
        out = capsys.readouterr().out.splitlines()
        assert (out[-int(tail) :] if tail else out) == lines, command


def test_gcloud_entries_and_docker_lines_read_as_our_own_lines(tmp_path: Path) -> None:
    from pubsub_filter.backends.records.log_lines import rows_from_log

    ours = Path(__file__).resolve().parents[2] / "examples" / "scores-decisions.jsonl"
    lines = [json.loads(line) for line in ours.read_text(encoding="utf-8").splitlines()]
    stamp = lambda t: dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")  # noqa: E731
    gcloud = tmp_path / "gcloud.json"
    gcloud.write_text(json.dumps([{"jsonPayload": line, "timestamp": stamp(line["time"])} for line in lines]))
    docker = tmp_path / "docker.log"
    docker.write_text(
        "".join(json.dumps({"log": json.dumps(line) + "\n", "stream": "stdout"}) + "\n" for line in lines)
    )
    expected = analyse(rows_from_log(str(ours), "scores", None)).as_dict()
    for source in (gcloud, docker):
        assert analyse(rows_from_log(str(source), "scores", None)).as_dict() == expected, source


SCORES_LOG = Path(__file__).resolve().parents[2] / "examples" / "scores-decisions.jsonl"


def test_a_period_with_no_decisions_says_when_the_routes_decisions_were_and_what_since_to_use(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the shipped example log is from 2026-01-10, long before the default `--since 7d`
    assert main(["tune", "--log", str(SCORES_LOG), "--route", "scores"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "no decisions recorded for route 'scores' in the last 7d" in err
    assert "120 decisions from 2026-01-10T18:00:40Z to 2026-01-10T19:20:00Z" in err
    assert "--since 2026-01-10" in err


def test_a_route_with_no_decisions_at_all_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--log", str(SCORES_LOG), "--route", "nope", "--since", "2026-01-01"]) == 1
    err = capsys.readouterr().err
    assert "no decisions recorded for route 'nope' since 2026-01-01" in err
    assert "none at all" in err


async def test_tune_says_how_many_forwards_a_coalesce_would_have_saved(
    config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await run_stream(config_path, tmp_path / "decisions.log")
    capsys.readouterr()
    args = ["tune", "--config", str(config_path), "--route", "scraped", "--since", "2025-12-01", "--coalesce", "1h/1d"]
    assert main([*args, "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out.splitlines()[-1])["coalesce"]
    assert got["forwards"] > got["would_forward"] >= 1 and got["saved"] == got["forwards"] - got["would_forward"]
    assert main(args) == 0
    assert "coalesce 3600s/86400s:" in capsys.readouterr().out
    assert main([*args[:-1], "soon"]) == 2
