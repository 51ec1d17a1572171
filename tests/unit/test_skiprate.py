"""Skip rate: the definition, the three output formats, --watch, --chart, and the command end to end on a log file."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from pubsub_filter.backends.records.log_lines import LogLinesReader
from pubsub_filter.backends.records.sqlite import SqliteReader
from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import parse
from pubsub_filter.runtime.wiring import make_reader
from pubsub_filter.tools import skiprate, skiprate_chart
from pubsub_filter.tools.skiprate import render, summarize
from pubsub_filter.tools.skiprate_chart import CHART_EXTRA, CHART_HINT, chart
from pubsub_filter.tools.skiprows import SkipRow

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def c(route: str, decision: str, n: int, enforced: bool = True, bucket: str | None = None) -> dict[str, Any]:
    return {"route": route, "bucket": bucket, "decision": decision, "enforced": enforced, "n": n}


#: every decision kind on one enforced route: decided = 2+3+1+1+1 = 8, skipped = 3+1+1 = 5
MIXED_BAG = [
    c("r", "forwarded", 2),
    c("r", "suppressed", 3),
    c("r", "duplicate", 1),
    c("r", "stale", 1),
    c("r", "fail_open", 1),
    c("r", "contended", 5),
    c("r", "failed", 2),
    c("r", "rejected", 4),
]


# --- the definition -----------------------------------------------------------------


def test_a_superseded_message_of_a_burst_counts_as_held_back() -> None:
    (row,) = summarize([c("odds", "forwarded", 1), c("odds", "superseded", 3)])
    assert row.counts["superseded"] == 3
    assert row.decided == 4 and row.skip_rate == 75.0


def test_skip_rate_is_skipped_over_decided() -> None:
    (row,) = summarize(MIXED_BAG)
    assert row.total == 19
    assert row.decided == 8
    assert row.skip_rate == pytest.approx(62.5)  # 5 / 8: contended, failed, rejected are not in the denominator
    assert row.would_skip is None and row.mode == "enforce"
    d = row.as_dict()
    assert (d["skip_rate"], d["would_skip"], d["total"], d["contended"], d["rejected"]) == (62.5, None, 19, 5, 4)


def test_contended_failed_and_rejected_alone_have_no_rate() -> None:
    (row,) = summarize([c("r", "contended", 3), c("r", "failed", 1), c("r", "rejected", 2)])
    assert row.decided == 0 and row.skip_rate is None
    assert row.as_dict()["skip_rate"] is None


def test_noise_only_is_a_suppression_the_audit_looked_into() -> None:
    (row,) = summarize([c("r", "forwarded", 1), c("r", "suppressed", 2), c("r", "noise_only", 1)])
    assert row.decided == 4 and row.skip_rate == 75.0


def test_forwarded_and_fail_open_count_as_decided_not_skipped() -> None:
    (row,) = summarize([c("r", "forwarded", 3), c("r", "fail_open", 1)])
    assert row.skip_rate == 0.0


def test_shadow_route_skips_nothing_and_shows_what_it_would_have_skipped() -> None:
    (row,) = summarize([{**x, "enforced": False} for x in MIXED_BAG])
    assert row.mode == "shadow"
    assert row.skip_rate == 0.0
    assert row.would_skip == pytest.approx(62.5)


def test_a_route_switched_from_shadow_to_enforce_shows_both() -> None:
    counts = [
        c("r", "forwarded", 2, enforced=False),
        c("r", "suppressed", 2, enforced=False),  # would have skipped these
        c("r", "forwarded", 1),
        c("r", "suppressed", 3),  # skipped these
    ]
    (row,) = summarize(counts)
    assert row.mode == "mixed"
    assert row.skip_rate == pytest.approx(3 / 8 * 100)
    assert row.would_skip == pytest.approx(5 / 8 * 100)


def test_rejections_say_nothing_about_the_mode() -> None:
    (row,) = summarize([c("r", "forwarded", 1), c("r", "rejected", 1, enforced=False)])
    assert row.mode == "enforce" and row.would_skip is None


def test_summarize_folds_per_route_and_bucket_and_sorts() -> None:
    counts = [
        c("b", "forwarded", 1, bucket="2026-01-01T01:00:00Z"),
        c("a", "suppressed", 2, bucket="2026-01-01T01:00:00Z"),
        c("a", "forwarded", 1, bucket="2026-01-01T00:00:00Z"),
        c("a", "suppressed", 1, bucket="2026-01-01T00:00:00Z"),
        c("a", "suppressed", 4, bucket="2026-01-01T00:00:00Z"),  # the same key twice: added up
    ]
    rows = summarize(counts)
    assert [(r.route, r.bucket, r.total) for r in rows] == [
        ("a", "2026-01-01T00:00:00Z", 6),
        ("a", "2026-01-01T01:00:00Z", 2),
        ("b", "2026-01-01T01:00:00Z", 1),
    ]
    assert rows[0].counts["suppressed"] == 5


# --- rendering ----------------------------------------------------------------------


def rows_for_render() -> list[SkipRow]:
    return summarize(
        [
            *MIXED_BAG,
            c("shadowed", "forwarded", 1, enforced=False),
            c("shadowed", "suppressed", 3, enforced=False),
            c("quiet", "contended", 1),
        ]
    )


def test_table() -> None:
    text = render(rows_for_render(), "table")
    lines = text.splitlines()
    assert lines[0].split() == [
        "route",
        "mode",
        "total",
        "forwarded",
        "suppressed",
        "duplicate",
        "contended",
        "stale",
        "noise",
        "only",
        "fail",
        "open",
        "rejected",
        "failed",
        "superseded",
        "skip",
        "rate",
        "would",
        "skip",
    ]
    assert set(lines[1]) <= {"-", " "}
    body = {line.split()[0]: line.split() for line in lines[2:]}
    assert body["r"][1:3] == ["enforce", "19"] and body["r"][-2:] == ["62.5%", "-"]
    assert body["shadowed"][1] == "shadow" and body["shadowed"][-2:] == ["0.0%", "75.0%"]
    assert body["quiet"][-2:] == ["-", "-"]  # nothing decided: no rate
    assert "bucket" not in lines[0]  # by route: no bucket column


def test_table_hides_mode_and_would_skip_when_all_enforced_and_shows_buckets() -> None:
    text = render(
        summarize([c("r", "forwarded", 1, bucket="2026-01-01"), c("r", "suppressed", 1, bucket="2026-01-01")]), "table"
    )
    header = text.splitlines()[0].split()
    assert header[:2] == ["route", "bucket"] and "mode" not in header and "would" not in header
    assert text.splitlines()[2].split()[:3] == ["r", "2026-01-01", "2"]
    assert text.splitlines()[2].endswith("50.0%")


def test_json() -> None:
    out = json.loads(render(rows_for_render(), "json"))
    by_route = {d["route"]: d for d in out}
    assert by_route["r"] == {
        "route": "r",
        "bucket": None,
        "mode": "enforce",
        "total": 19,
        "forwarded": 2,
        "selection_forwarded": 0,
        "suppressed": 3,
        "within_tolerance": 0,
        "selection_suppressed": 0,
        "duplicate": 1,
        "contended": 5,
        "stale": 1,
        "noise_only": 0,
        "fail_open": 1,
        "rejected": 4,
        "failed": 2,
        "superseded": 0,
        "skip_rate": 62.5,
        "would_skip": None,
    }
    assert (by_route["shadowed"]["skip_rate"], by_route["shadowed"]["would_skip"]) == (0.0, 75.0)
    assert by_route["quiet"]["skip_rate"] is None


def test_csv() -> None:
    text = render(rows_for_render(), "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == [
        "route",
        "bucket",
        "mode",
        "total",
        "forwarded",
        "selection_forwarded",
        "suppressed",
        "within_tolerance",
        "selection_suppressed",
        "duplicate",
        "contended",
        "stale",
        "noise_only",
        "fail_open",
        "rejected",
        "failed",
        "superseded",
        "skip_rate",
        "would_skip",
    ]
    by_route = {r["route"]: r for r in rows}
    assert (by_route["r"]["total"], by_route["r"]["skip_rate"], by_route["r"]["would_skip"]) == ("19", "62.5", "")
    assert by_route["shadowed"]["would_skip"] == "75.0"


def test_empty() -> None:
    assert render([], "table") == "no decisions recorded in this period"
    assert render([], "json") == "[]"
    header = (
        "route,bucket,mode,total,forwarded,selection_forwarded,suppressed,within_tolerance,selection_suppressed,"
        "duplicate,contended,stale,noise_only,"
        "fail_open,rejected,failed,superseded"
    )
    assert render([], "csv").strip() == header + ",skip_rate,would_skip"


# --- the command, on a log file -----------------------------------------------------

HOUR0, HOUR1 = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"


def line(route: str, decision: str, time: str, enforced: bool = True) -> str:
    return json.dumps(
        {
            "route": route,
            "decision": decision,
            "enforced": enforced,
            "time": time,
            "severity": "INFO",
            "message": "decision",
        }
    )


@pytest.fixture
def logfile(tmp_path: Path) -> str:
    lines = [
        line("injuries", "forwarded", "2026-01-01T00:05:00Z"),
        line("injuries", "suppressed", "2026-01-01T00:15:00Z"),
        line("injuries", "suppressed", "2026-01-01T00:25:00Z"),
        line("injuries", "duplicate", "2026-01-01T01:05:00Z"),
        line("injuries", "forwarded", "2026-01-01T01:15:00Z"),
        line("props", "forwarded", "2026-01-01T00:30:00Z", enforced=False),
        line("props", "suppressed", "2026-01-01T01:30:00Z", enforced=False),
        line("props", "suppressed", "2026-01-01T01:40:00Z", enforced=False),
        line("props", "contended", "2026-01-01T01:41:00Z", enforced=False),
    ]
    path = tmp_path / "decisions.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_cli_json_by_route(logfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skip-rate", "--log", logfile, "--since", "2025-12-31", "--format", "json"]) == 0
    out = {d["route"]: d for d in json.loads(capsys.readouterr().out)}
    assert (out["injuries"]["total"], out["injuries"]["skip_rate"], out["injuries"]["would_skip"]) == (5, 60.0, None)
    assert (out["props"]["total"], out["props"]["skip_rate"], out["props"]["would_skip"]) == (4, 0.0, 66.67)
    assert out["props"]["mode"] == "shadow"


def test_cli_csv_by_hour(logfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["skip-rate", "--log", logfile, "--since", "2025-12-31T00:00:00Z", "--by", "hour", "--format", "csv"]) == 0
    )
    rows = [
        (r["route"], r["bucket"], r["total"], r["skip_rate"])
        for r in csv.DictReader(io.StringIO(capsys.readouterr().out))
    ]
    assert rows == [
        ("injuries", HOUR0, "3", "66.67"),
        ("injuries", HOUR1, "2", "50.0"),
        ("props", HOUR0, "1", "0.0"),
        ("props", HOUR1, "3", "0.0"),
    ]


def test_cli_since_filters(logfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skip-rate", "--log", logfile, "--since", "2026-01-01T01:00:00Z", "--format", "json"]) == 0
    out = {d["route"]: d["total"] for d in json.loads(capsys.readouterr().out)}
    assert out == {"injuries": 2, "props": 3}
    assert main(["skip-rate", "--log", logfile]) == 0  # default: the last 24h, long after these
    assert capsys.readouterr().out.strip() == "no decisions recorded in this period"


def test_cli_bad_since_and_watch(logfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skip-rate", "--log", logfile, "--since", "soon"]) == 2
    assert "--since" in capsys.readouterr().err
    assert main(["skip-rate", "--log", logfile, "--watch", "0"]) == 2
    assert "--watch" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("since", "says"),
    [
        ("2026-01-45", "day is out of range for month"),
        ("2026-02-29", "day is out of range for month"),
        ("2026-01-10T24:00:00Z", "hour must be in 0..23"),
        ("2026-01-10T17:61:00Z", "minute must be in 0..59"),
    ],
)
def test_a_since_that_names_no_real_day_or_time_is_a_usage_error_saying_which_part(
    logfile: str, capsys: pytest.CaptureFixture[str], since: str, says: str
) -> None:
    assert main(["skip-rate", "--log", logfile, "--since", since]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{since}'" in err and says in err, err


def test_cli_missing_log_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skip-rate", "--log", str(tmp_path / "nope.log")]) == 1
    assert "nope.log" in capsys.readouterr().err


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_watch_redraws_until_ctrl_c_then_exits_0(logfile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    screen = TTY()
    monkeypatch.setattr(sys, "stdout", screen)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(skiprate.time, "sleep", sleep)
    assert main(["skip-rate", "--log", logfile, "--since", "2025-12-31", "--watch", "2"]) == 0
    frames = screen.getvalue().split("\033[H\033[2J")
    assert frames[0] == "" and len(frames) == 4  # cleared before each of the 3 frames
    assert all("every 2s, Ctrl-C to stop" in f and "injuries" in f for f in frames[1:])
    assert sleeps == [2.0, 2.0, 2.0]


class InterruptedReader:
    """A records reader whose read is cut short by Ctrl-C."""

    closed = False

    def decision_counts(self, since: float | None, by: str) -> list[dict[str, Any]]:
        raise KeyboardInterrupt

    def close(self) -> None:
        self.closed = True


def test_watch_ctrl_c_while_querying_exits_0(logfile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skiprate, "reader_for", lambda _: InterruptedReader())
    assert main(["skip-rate", "--log", logfile, "--watch", "5"]) == 0


def test_the_reader_is_closed_after_ctrl_c(logfile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = InterruptedReader()
    monkeypatch.setattr(skiprate, "reader_for", lambda _: reader)
    assert main(["skip-rate", "--log", logfile, "--watch", "5"]) == 0
    assert reader.closed


def test_watch_into_a_pipe_does_not_clear_the_screen(
    logfile: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = iter([None])

    def sleep(_: float) -> None:
        if next(calls, "stop") == "stop":
            raise KeyboardInterrupt

    monkeypatch.setattr(skiprate.time, "sleep", sleep)
    assert main(["skip-rate", "--log", logfile, "--since", "2025-12-31", "--format", "json", "--watch", "1"]) == 0
    out = capsys.readouterr().out
    assert "\033[" not in out and out.count("Ctrl-C to stop") == 2


def test_ctrl_c_without_watch_is_not_a_success(logfile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skiprate, "reader_for", lambda _: InterruptedReader())
    assert main(["skip-rate", "--log", logfile]) == 130


# --- the chart ----------------------------------------------------------------------


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is the optional `chart` extra")
def test_chart_is_a_png_by_hour_by_default(logfile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "skip.png"
    assert main(["skip-rate", "--log", logfile, "--since", "2025-12-31", "--format", "json", "--chart", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    captured = capsys.readouterr()
    buckets = {d["bucket"] for d in json.loads(captured.out)}
    assert buckets == {HOUR0, HOUR1}  # a chart needs time: --by route became by hour
    assert f"chart written to {png}" in captured.err


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is the optional `chart` extra")
def test_chart_by_day_and_empty(tmp_path: Path) -> None:
    rows = summarize(
        [
            c("a", "forwarded", 1, bucket="2026-01-01"),
            c("a", "suppressed", 3, bucket="2026-01-02"),
            c("s", "suppressed", 1, enforced=False, bucket="2026-01-01"),
        ]
    )
    chart(rows, str(tmp_path / "day.png"), "day")
    chart([], str(tmp_path / "empty.png"), "hour")
    for name in ("day.png", "empty.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_chart_without_matplotlib_says_what_to_install(
    logfile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    png = tmp_path / "skip.png"
    assert main(["skip-rate", "--log", logfile, "--chart", str(png)]) == 2
    captured = capsys.readouterr()
    assert CHART_HINT in captured.err and captured.err.count("\n") == 1
    assert captured.out == "" and not png.exists()


def test_the_chart_install_hint_names_an_extra_the_package_declares_with_matplotlib_in_it() -> None:
    with (Path(__file__).resolve().parents[2] / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert f"pubsub-filter[{CHART_EXTRA}]" in CHART_HINT
    assert any(Requirement(r).name == "matplotlib" for r in extras[CHART_EXTRA])
    assert "pip install matplotlib" in CHART_HINT


def test_csv_output_ends_with_one_newline_not_a_blank_line(logfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skip-rate", "--log", logfile, "--since", "2025-12-31", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and not out.endswith("\n\n")


def test_watch_refuses_to_follow_stdin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skip-rate", "--log", "-", "--watch", "5"]) == 2
    err = capsys.readouterr().err
    assert "--watch" in err and "stdin" in err and err.count("\n") == 1


# --- requests to paths that are not routes ------------------------------------------

ONE_ROUTE = {"name": "injuries", "destination": "phase3", "key": ["payload.game_date"]}
ONE_ROUTE_CONFIG = """\
routes:
  - name: injuries
    destination: phase3
    key: [payload.game_date]
"""


@pytest.fixture
def probed_log(logfile: str) -> str:
    with open(logfile, "a") as fh:
        fh.write(line("wp-admin", "rejected", "2026-01-01T00:07:00Z") + "\n")
        fh.write(line("wp-admin", "rejected", "2026-01-01T00:08:00Z") + "\n")
        fh.write(line("props", "rejected", "2026-01-01T01:50:00Z", enforced=False) + "\n")
    return logfile


def test_unknown_route_probes_are_left_out_and_counted_apart(
    probed_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "filter.yaml"
    config.write_text(ONE_ROUTE_CONFIG)
    args = ["skip-rate", "--log", probed_log, "--config", str(config), "--since", "2025-12-31", "--format", "json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    routes = {d["route"] for d in json.loads(captured.out)}
    # props is gone from the config but has real decisions: its history stays
    assert routes == {"injuries", "props"}
    assert "left out: 2 requests to 1 path that is not a route in the config: /push/wp-admin (2)" in captured.err


def test_without_a_config_every_route_in_the_log_is_shown(
    probed_log: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./filter.yaml
    monkeypatch.delenv("PUBSUB_FILTER_CONFIG", raising=False)
    assert main(["skip-rate", "--log", probed_log, "--since", "2025-12-31", "--format", "json"]) == 0
    assert {d["route"] for d in json.loads(capsys.readouterr().out)} == {"injuries", "props", "wp-admin"}


# --- the chart's time axis ----------------------------------------------------------


def _x_span(rows: list[SkipRow], by: str) -> tuple[Any, Any]:
    from matplotlib.dates import num2date

    ax = skiprate_chart.figure(rows, by).axes[0]
    low, high = ax.get_xlim()
    return num2date(low), num2date(high)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is the optional `chart` extra")
def test_chart_of_one_hour_spans_that_hour_not_years() -> None:
    from datetime import UTC, datetime, timedelta

    low, high = _x_span(summarize([c("a", "forwarded", 1, bucket=HOUR0)]), "hour")
    hour = datetime(2026, 1, 1, tzinfo=UTC)
    assert low <= hour <= high and high - low <= timedelta(hours=1)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is the optional `chart` extra")
@pytest.mark.parametrize(
    ("by", "buckets", "width"),
    [
        ("hour", [HOUR0, HOUR1], 1),
        ("hour", [HOUR0, "2026-01-03T05:00:00Z"], 1),
        ("day", ["2026-01-01", "2026-03-15"], 24),
    ],
)
def test_chart_axis_reaches_half_a_bucket_beyond_the_first_and_last_point(
    by: str, buckets: list[str], width: int
) -> None:
    from datetime import timedelta

    low, high = _x_span(summarize([c("a", "suppressed", 1, bucket=b) for b in buckets]), by)
    first, last = skiprate_chart._bucket_time(buckets[0]), skiprate_chart._bucket_time(buckets[-1])
    half = timedelta(hours=width / 2)
    assert abs(low - (first - half)) < timedelta(seconds=1) and abs(high - (last + half)) < timedelta(seconds=1)


# --- where the counts come from ------------------------------------------------------


def test_the_reader_is_the_log_when_one_is_given(tmp_path: Path) -> None:
    config = parse({"records": {"path": str(tmp_path / "d.db")}, "routes": [ONE_ROUTE]})
    reader = make_reader(config, str(tmp_path / "filter.log"))
    assert isinstance(reader, LogLinesReader) and reader.source == str(tmp_path / "filter.log")


def test_the_reader_is_the_configured_sqlite_table(tmp_path: Path) -> None:
    reader = make_reader(parse({"records": {"path": str(tmp_path / "d.db")}, "routes": [ONE_ROUTE]}))
    assert isinstance(reader, SqliteReader) and reader.path == tmp_path / "d.db"


def test_reading_a_sqlite_table_not_yet_written_creates_no_file(tmp_path: Path) -> None:
    assert SqliteReader(tmp_path / "d.db").decision_counts(None, "route") == []
    assert not (tmp_path / "d.db").exists()


def test_a_reader_needs_a_config_or_a_log() -> None:
    with pytest.raises(ValueError, match="config or a log"):
        make_reader(None)
