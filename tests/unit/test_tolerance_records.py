"""A suppression within tolerance in the records: counted under its own name by skip-rate's readers
(the SQLite table, decision log lines), its moves in `extra`."""

from __future__ import annotations

import json
from pathlib import Path

from pubsub_filter.backends.records.log_lines import LogLinesReader
from pubsub_filter.backends.records.sqlite import SqliteReader, SqliteSink
from pubsub_filter.core.model import Decision, DecisionRecord
from pubsub_filter.tools.skiprate import render, summarize

T = 1_767_225_600.0


def records() -> list[DecisionRecord]:
    def rec(decision: Decision, reason: str, **details: object) -> DecisionRecord:
        return DecisionRecord(T, "odds", decision, True, "m", key="g1", reason=reason, details=details)

    return [
        rec(Decision.FORWARDED, "new key"),
        rec(Decision.SUPPRESSED, "moved within tolerance", within_tolerance={"price": 4}),
        rec(Decision.SUPPRESSED, "moved within tolerance; the message id was reused with other content"),
        rec(Decision.SUPPRESSED, "unchanged since last forward"),
        rec(Decision.FORWARDED, "content changed"),
    ]


EXPECTED = [
    {"route": "odds", "bucket": None, "decision": "forwarded", "enforced": True, "n": 2},
    {"route": "odds", "bucket": None, "decision": "suppressed", "enforced": True, "n": 1},
    {"route": "odds", "bucket": None, "decision": "within_tolerance", "enforced": True, "n": 2},
]


def test_the_sqlite_reader_counts_suppressions_within_tolerance_by_name(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "d.db")
    sink.insert(records())
    rows = SqliteReader(tmp_path / "d.db").decision_counts(None, "route")
    assert sorted(rows, key=lambda r: r["decision"]) == EXPECTED


def test_the_log_lines_reader_counts_suppressions_within_tolerance_by_name(tmp_path: Path) -> None:
    log = tmp_path / "filter.log"
    lines = [{"message": "decision", "time": r.time, **r.line_fields()} for r in records()]
    log.write_text("\n".join(json.dumps(line) for line in lines))
    rows = LogLinesReader(str(log)).decision_counts(None, "route")
    assert sorted(rows, key=lambda r: r["decision"]) == EXPECTED


def test_skip_rate_shows_them_in_their_own_column_and_skips_them() -> None:
    row = summarize(EXPECTED)[0].as_dict()
    assert (row["within_tolerance"], row["suppressed"], row["skip_rate"]) == (2, 1, 60.0)
    header = render(summarize(EXPECTED), "table").splitlines()[0]
    assert "within tolerance" in header
    plain = [{**c, "decision": "suppressed"} if c["decision"] == "within_tolerance" else c for c in EXPECTED]
    assert "within tolerance" not in render(summarize(plain), "table").splitlines()[0]


def test_the_record_carries_the_moves_in_extra() -> None:
    line = records()[1].line_fields()
    assert line["within_tolerance"] == {"price": 4} and line["reason"] == "moved within tolerance"
