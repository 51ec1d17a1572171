"""Decisions under a changed selection in the records: counted apart by skip-rate's readers (the
SQLite table, decision log lines) as `selection_forwarded` and `selection_suppressed`."""

from __future__ import annotations

import json
from pathlib import Path

from pubsub_filter.backends.records.log_lines import LogLinesReader
from pubsub_filter.backends.records.sqlite import SqliteReader, SqliteSink
from pubsub_filter.core.model import Decision, DecisionRecord
from pubsub_filter.tools.skiprate import render, summarize

T = 1_767_225_600.0


def records() -> list[DecisionRecord]:
    def rec(decision: Decision, reason: str) -> DecisionRecord:
        return DecisionRecord(T, "odds", decision, True, "m", key="g1", reason=reason)

    return [
        rec(Decision.FORWARDED, "new key"),
        rec(Decision.SUPPRESSED, "selection changed (exclude +note): unchanged as the new selection compares it"),
        rec(Decision.SUPPRESSED, "selection changed (exclude +note): unchanged as the new selection compares it"),
        rec(Decision.FORWARDED, "selection changed (exclude +note): changed: v"),
        rec(Decision.SUPPRESSED, "unchanged since last forward"),
        rec(Decision.FORWARDED, "content changed"),
    ]


EXPECTED = [
    {"route": "odds", "bucket": None, "decision": "forwarded", "enforced": True, "n": 2},
    {"route": "odds", "bucket": None, "decision": "selection_forwarded", "enforced": True, "n": 1},
    {"route": "odds", "bucket": None, "decision": "selection_suppressed", "enforced": True, "n": 2},
    {"route": "odds", "bucket": None, "decision": "suppressed", "enforced": True, "n": 1},
]


def test_the_sqlite_reader_counts_decisions_under_a_changed_selection_apart(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "d.db")
    sink.insert(records())
    rows = SqliteReader(tmp_path / "d.db").decision_counts(None, "route")
    assert sorted(rows, key=lambda r: r["decision"]) == EXPECTED


def test_the_log_lines_reader_counts_decisions_under_a_changed_selection_apart(tmp_path: Path) -> None:
    log = tmp_path / "filter.log"
    lines = [{"message": "decision", "time": r.time, **r.line_fields()} for r in records()]
    log.write_text("\n".join(json.dumps(line) for line in lines))
    rows = LogLinesReader(str(log)).decision_counts(None, "route")
    assert sorted(rows, key=lambda r: r["decision"]) == EXPECTED


def test_skip_rate_shows_them_in_columns_of_their_own_and_skips_the_suppressions() -> None:
    row = summarize(EXPECTED)[0].as_dict()
    assert (row["selection_suppressed"], row["selection_forwarded"], row["skip_rate"]) == (2, 1, 50.0)
    header = render(summarize(EXPECTED), "table").splitlines()[0]
    assert "selection forwarded" in header and "selection suppressed" in header
    plain = [c for c in EXPECTED if not c["decision"].startswith("selection")]
    assert "selection" not in render(summarize(plain), "table").splitlines()[0]
