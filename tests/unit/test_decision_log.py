"""`counts_from_log`: decision counts from our JSON lines, gcloud's JSON array and kubectl/docker output."""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.records.log_lines import counts_from_log, rows_from_log
from pubsub_filter.core.times import parse_time

# 2026-01-01: 00:10 and 00:50 (hour 00), 01:05 (hour 01), and 2026-01-02 00:30 (next day)
T0, T1, T2, T3 = (
    "2026-01-01T00:10:00.000000Z",
    "2026-01-01T00:50:00.250000Z",
    "2026-01-01T01:05:00Z",
    "2026-01-02T00:30:00Z",
)

#: (route, decision, enforced, time) of the decision set every format below encodes
DECISIONS: list[tuple[str, str, bool, str]] = [
    ("injuries", "forwarded", True, T0),
    ("injuries", "suppressed", True, T1),
    ("injuries", "suppressed", True, T2),
    ("injuries", "duplicate", True, T3),
    ("props", "forwarded", False, T0),
    ("props", "suppressed", False, T2),
    ("props", "rejected", True, T2),
]


def ours(route: str, decision: str, enforced: bool, time: str, **extra: Any) -> dict[str, Any]:
    """A decision line as pubsub_filter.observability.logsetup writes it."""
    return {
        "route": route,
        "decision": decision,
        "enforced": enforced,
        "message_id": "1",
        "key": "2025-01-10",
        "fingerprint": "sha256:" + "a" * 64,
        "latency_ms": 0.4,
        "time": time,
        "severity": "INFO",
        "message": "decision",
        "logging.googleapis.com/labels": {"component": "pubsub-filter", "route": route, "decision": decision},
        **extra,
    }


def log_entry(route: str, decision: str, enforced: bool, time: str) -> dict[str, Any]:
    """The same line as Cloud Logging returns it (`gcloud logging read --format=json`)."""
    payload = ours(route, decision, enforced, time)
    for k in ("time", "severity", "logging.googleapis.com/labels"):
        del payload[k]
    return {
        "insertId": "abc",
        "jsonPayload": payload,
        "labels": {"component": "pubsub-filter", "route": route},
        "logName": "projects/p/logs/run.googleapis.com%2Fstdout",
        "receiveTimestamp": "2026-01-03T00:00:00.1Z",
        "resource": {"type": "cloud_run_revision", "labels": {"service_name": "pubsub-filter"}},
        "severity": "INFO",
        "timestamp": time.replace("Z", "123Z") if "." in time else time,  # nanosecond precision
    }


NOISE = [
    "",
    "INFO uvicorn.error: Started server process [1]",
    json.dumps({"message": "lease_taken_over", "route": "injuries", "severity": "WARNING", "time": T0}),
    json.dumps({"message": "serving", "routes": ["injuries"], "severity": "INFO", "time": T0}),
    "12:00:00 [info     ] decision   decision=forwarded route=injuries",  # console renderer: not JSON
]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str | None, str, bool], int]:
    return {(r["route"], r["bucket"], r["decision"], r["enforced"]): r["n"] for r in rows}


EXPECTED_BY_ROUTE = {
    ("injuries", None, "forwarded", True): 1,
    ("injuries", None, "suppressed", True): 2,
    ("injuries", None, "duplicate", True): 1,
    ("props", None, "forwarded", False): 1,
    ("props", None, "suppressed", False): 1,
    ("props", None, "rejected", True): 1,
}
EXPECTED_BY_HOUR = {
    ("injuries", "2026-01-01T00:00:00Z", "forwarded", True): 1,
    ("injuries", "2026-01-01T00:00:00Z", "suppressed", True): 1,
    ("injuries", "2026-01-01T01:00:00Z", "suppressed", True): 1,
    ("injuries", "2026-01-02T00:00:00Z", "duplicate", True): 1,
    ("props", "2026-01-01T00:00:00Z", "forwarded", False): 1,
    ("props", "2026-01-01T01:00:00Z", "suppressed", False): 1,
    ("props", "2026-01-01T01:00:00Z", "rejected", True): 1,
}
EXPECTED_BY_DAY = {
    ("injuries", "2026-01-01", "forwarded", True): 1,
    ("injuries", "2026-01-01", "suppressed", True): 2,
    ("injuries", "2026-01-02", "duplicate", True): 1,
    ("props", "2026-01-01", "forwarded", False): 1,
    ("props", "2026-01-01", "suppressed", False): 1,
    ("props", "2026-01-01", "rejected", True): 1,
}
EXPECTED = {"route": EXPECTED_BY_ROUTE, "hour": EXPECTED_BY_HOUR, "day": EXPECTED_BY_DAY}


def our_lines() -> str:
    lines = [json.dumps(ours(*d)) for d in DECISIONS]
    return "\n".join([NOISE[1], lines[0], NOISE[2], *lines[1:4], NOISE[0], NOISE[3], *lines[4:], NOISE[4]]) + "\n"


def gcloud_array() -> str:
    entries = [log_entry(*d) for d in DECISIONS]
    entries.insert(2, {"textPayload": "INFO uvicorn: started", "timestamp": T0, "severity": "INFO"})
    entries.insert(3, {"jsonPayload": {"message": "heartbeat_failed", "route": "injuries"}, "timestamp": T0})
    return json.dumps(entries, indent=2)  # gcloud pretty-prints


def kubectl_lines() -> str:
    prefixes = ["2026-01-01T00:10:00.123456789Z ", "[pod/filter-7d9/filter] ", "filter-1  | ", ""]
    lines = [prefixes[i % len(prefixes)] + json.dumps(ours(*d)) for i, d in enumerate(DECISIONS)]
    return "\n".join([f"{prefixes[1]}{NOISE[1]}", *lines[:3], prefixes[0] + NOISE[2], *lines[3:]]) + "\n"


FORMATS = {"ours": our_lines, "gcloud": gcloud_array, "kubectl": kubectl_lines}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("by", ["route", "hour", "day"])
def test_every_format_gives_the_same_counts(
    tmp_path: Path, fmt: str, by: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, f"{fmt}.log", FORMATS[fmt]())
    rows = counts_from_log(path, None, by)
    assert by_key(rows) == EXPECTED[by]
    assert all(set(r) == {"route", "bucket", "decision", "enforced", "n"} for r in rows)
    assert capsys.readouterr().err == ""  # noise is skipped silently


def test_rows_are_sorted_like_the_backends(tmp_path: Path) -> None:
    rows = counts_from_log(write(tmp_path, "a.log", our_lines()), None, "hour")
    keys = [(r["route"], r["bucket"]) for r in rows]
    assert keys == sorted(keys)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_since_keeps_decisions_at_or_after_it(tmp_path: Path, fmt: str) -> None:
    path = write(tmp_path, "a.log", FORMATS[fmt]())
    rows = counts_from_log(path, parse_time(T2), "route")  # T2 itself is kept, as in the backends
    assert by_key(rows) == {
        ("injuries", None, "suppressed", True): 1,
        ("injuries", None, "duplicate", True): 1,
        ("props", None, "suppressed", False): 1,
        ("props", None, "rejected", True): 1,
    }
    assert counts_from_log(path, parse_time(T3) + 1, "route") == []


def test_log_sink_export_one_log_entry_per_line(tmp_path: Path) -> None:
    text = "\n".join(json.dumps(log_entry(*d)) for d in DECISIONS) + "\n"
    assert by_key(counts_from_log(write(tmp_path, "export.json", text), None, "day")) == EXPECTED_BY_DAY


def test_docker_json_file_lines(tmp_path: Path) -> None:
    text = "\n".join(
        json.dumps({"log": json.dumps(ours(*d)) + "\n", "stream": "stdout", "time": "2026-11-01T00:00:00.1Z"})
        for d in DECISIONS
    )
    assert by_key(counts_from_log(write(tmp_path, "c-json.log", text), None, "hour")) == EXPECTED_BY_HOUR


def test_gzipped_file(tmp_path: Path) -> None:
    path = tmp_path / "a.log.gz"
    path.write_bytes(gzip.compress(our_lines().encode()))
    assert by_key(counts_from_log(str(path), None, "route")) == EXPECTED_BY_ROUTE


@pytest.mark.parametrize("fmt", ["ours", "gcloud"])
def test_stdin(monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(FORMATS[fmt]().encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert by_key(counts_from_log("-", None, "day")) == EXPECTED_BY_DAY


def test_empty_inputs(tmp_path: Path) -> None:
    assert counts_from_log(write(tmp_path, "empty.log", ""), None, "route") == []
    assert counts_from_log(write(tmp_path, "blank.log", "\n\n  \n"), None, "route") == []
    assert counts_from_log(write(tmp_path, "none.json", "[]\n"), None, "route") == []


def test_epoch_and_offset_times_are_accepted(tmp_path: Path) -> None:
    lines = [
        json.dumps(ours("r", "forwarded", True, "x") | {"time": 1767225600.5}),  # 2026-01-01T00:00:00.5Z
        json.dumps(ours("r", "forwarded", True, "2026-01-01T02:30:00+02:00")),  # 00:30Z
    ]
    rows = counts_from_log(write(tmp_path, "a.log", "\n".join(lines)), None, "hour")
    assert by_key(rows) == {("r", "2026-01-01T00:00:00Z", "forwarded", True): 2}


def test_unparseable_decision_lines_are_counted_and_reported_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [json.dumps(ours(*d)) for d in DECISIONS]
    broken = [
        good[0][: len(good[0]) // 2],  # truncated (log rotation)
        json.dumps(ours("r", "forwarded", True, T0) | {"route": None}),  # no route
        json.dumps({k: v for k, v in ours("r", "forwarded", True, T0).items() if k != "time"}),  # no time
        json.dumps(ours("r", "forwarded", True, "yesterday")),  # not a time
    ]
    text = "\n".join([good[0], broken[0], *good[1:3], *broken[1:], *good[3:]]) + "\n"
    rows = counts_from_log(write(tmp_path, "a.log", text), None, "route")
    assert by_key(rows) == EXPECTED_BY_ROUTE
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("warning: 4 lines in ") and "a.log" in err and "(first: line 2)" in err


def test_a_broken_gcloud_array_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = gcloud_array()
    assert counts_from_log(write(tmp_path, "a.json", text[: len(text) // 2]), None, "route") == []
    assert "JSON array" in capsys.readouterr().err


def test_kubectl_prefix_in_brackets_is_not_mistaken_for_an_array(tmp_path: Path) -> None:
    text = "\n".join(f"[pod/filter-1/filter] {json.dumps(ours(*d))}" for d in DECISIONS)
    assert by_key(counts_from_log(write(tmp_path, "k.log", text), None, "route")) == EXPECTED_BY_ROUTE


def test_unknown_by_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="route, hour or day"):
        counts_from_log(write(tmp_path, "a.log", our_lines()), None, "week")


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        counts_from_log(str(tmp_path / "nope.log"), None, "route")


def test_a_docker_line_wrapping_a_broken_decision_is_counted_as_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inner = '{"message": "decision", "route": "r\\ud800", "decision": "forwarded", "time": 1.0}\n'
    good = json.dumps({"log": inner.replace("\\ud800", ""), "stream": "stdout"})
    bad = json.dumps({"log": inner, "stream": "stdout"})  # a lone surrogate escape: refused by the decoder
    truncated = json.dumps({"log": inner[:30], "stream": "stdout"})
    rows = counts_from_log(write(tmp_path, "c.log", "\n".join([good, bad, truncated])), None, "route")
    assert [(r["route"], r["n"]) for r in rows] == [("r", 1)]
    assert "2 lines in" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_rows_read_from_a_log_are_the_decisions_counted_from_it(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune` (rows) and `skip-rate` (counts) read one log alike: a line one of them cannot
    read (here `enforced` that is not a boolean, a time that is not one) the other skips too."""
    unreadable = [
        ours("injuries", "forwarded", "yes", T0),  # type: ignore[arg-type]
        ours("injuries", "forwarded", True, "yesterday"),
    ]
    text = FORMATS[fmt]()
    if fmt == "gcloud":
        text = json.dumps([*json.loads(text), *({"jsonPayload": line, "timestamp": T0} for line in unreadable)])
    else:
        text += "\n".join(json.dumps(line) for line in unreadable) + "\n"
    path = write(tmp_path, f"{fmt}.log", text)
    counted = by_key(counts_from_log(path, None, "route"))
    assert counted == EXPECTED_BY_ROUTE
    for route in ("injuries", "props"):
        rows = Counter((r["decision"], r["enforced"]) for r in rows_from_log(path, route, None))
        assert rows == Counter({(d, e): n for (r, _, d, e), n in counted.items() if r == route})
    assert "2 " in capsys.readouterr().err  # the two are reported as unreadable
