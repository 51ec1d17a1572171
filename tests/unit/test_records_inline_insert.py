"""The inline recorder's writes: one statement for a row alone and for a group binding the
same columns, NULLs left out, the rows stored in record order exactly as the batched path
stores them, and a row SQLite cannot bind costing only itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.backends.records.sqlite import Prepared, SqliteSink, prepared
from pubsub_filter.core.model import COLUMN_NAMES, Decision, DecisionRecord

SUPPRESSED = DecisionRecord(
    time=1_767_225_600.25,
    route="injuries",
    decision=Decision.SUPPRESSED,
    enforced=True,
    message_id="m1",
    key="2026-01-01",
    reason="unchanged",
    fingerprint="sha256:aa",
    message_fingerprint="sha256:bb",
    previous_fingerprint="sha256:aa",
    latency_ms=0.41,
)

_text = st.none() | st.text(max_size=8)
_number = st.none() | st.integers(-(2**40), 2**40)
_time = st.none() | st.floats(allow_nan=False, allow_infinity=False)
_extra = st.dictionaries(st.text(max_size=5), st.none() | st.integers() | st.text(max_size=5), max_size=3)

records = st.builds(
    DecisionRecord,
    time=st.floats(allow_nan=False, allow_infinity=False),
    route=st.text(min_size=1, max_size=8),
    decision=st.sampled_from(list(Decision)),
    enforced=st.booleans(),
    message_id=st.text(max_size=8),
    key=_text,
    reason=_text,
    fingerprint=_text,
    message_fingerprint=_text,
    previous_fingerprint=_text,
    destination=_text,
    published_id=_text,
    fence=_number,
    publish_time=_time,
    delivery_attempt=_number,
    latency_ms=_time,
    trace=_text,
    details=_extra,
)


def _stored(path: Path) -> list[tuple[object, ...]]:
    """Every row with each value's storage class: an INTEGER 1 and a REAL 1.0 differ here."""
    db = sqlite3.connect(path)
    try:
        columns = ", ".join(f"{c}, typeof({c})" for c in COLUMN_NAMES)
        return db.execute(f"SELECT {columns} FROM decisions ORDER BY rowid").fetchall()
    finally:
        db.close()


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SqliteSink]:
    sink = SqliteSink(tmp_path / "decisions.db")
    yield sink
    sink._db.close()


def test_a_record_alone_is_written_in_one_statement(sink: SqliteSink) -> None:
    statements: list[str] = []
    sink._db.set_trace_callback(statements.append)
    sink.insert([SUPPRESSED])
    assert len(statements) == 1 and statements[0].startswith("INSERT INTO decisions")


def test_a_record_alone_binds_no_null(sink: SqliteSink) -> None:
    statements: list[str] = []
    sink._db.set_trace_callback(statements.append)  # the statement with its values filled in
    sink.insert([SUPPRESSED])
    (insert,) = (s for s in statements if s.startswith("INSERT"))
    assert "NULL" not in insert and "destination" not in insert


def assert_stored_as_a_batch_stores(
    tmp_path_factory: pytest.TempPathFactory, rows: list[DecisionRecord], write: Callable[[SqliteSink], None]
) -> None:
    """`write` stores `rows` in one file, the batched path in another: the files hold the same rows."""
    where = tmp_path_factory.mktemp("records")
    written, batch = SqliteSink(where / "written.db"), SqliteSink(where / "batch.db")
    try:
        write(written)
        batch.insert(rows + rows[:1])  # two rows at least: the batched path
    finally:
        written._db.close()
        batch._db.close()
    assert _stored(where / "written.db") == _stored(where / "batch.db")[: len(rows)]


@settings(max_examples=30, deadline=None)
@given(st.lists(records, min_size=1, max_size=12))
def test_records_written_one_at_a_time_are_stored_as_a_batch_stores_them(
    tmp_path_factory: pytest.TempPathFactory, rows: list[DecisionRecord]
) -> None:
    def alone(sink: SqliteSink) -> None:
        for r in rows:
            sink.insert([r])

    assert_stored_as_a_batch_stores(tmp_path_factory, rows, alone)


def test_a_group_binding_the_same_columns_is_written_in_one_statement(sink: SqliteSink) -> None:
    """One call into SQLite for a commit's group: a writer thread takes the GIL back once, not once a row."""
    statements: list[str] = []
    sink._db.set_trace_callback(statements.append)
    rows = [SUPPRESSED, *(msgspec.structs.replace(SUPPRESSED, message_id=m) for m in ("m2", "m3"))]
    assert sink.insert_apart([prepared(r) for r in rows]) == []
    assert len(statements) == 1 and statements[0].startswith("INSERT INTO decisions")
    assert [m for (m,) in sink._db.execute("SELECT message_id FROM decisions ORDER BY rowid")] == ["m1", "m2", "m3"]


@settings(max_examples=30, deadline=None)
@given(st.lists(records, min_size=1, max_size=12))
def test_records_written_as_a_group_are_stored_in_order_as_a_batch_stores_them(
    tmp_path_factory: pytest.TempPathFactory, rows: list[DecisionRecord]
) -> None:
    def group(sink: SqliteSink) -> None:
        assert sink.insert_apart([prepared(r) for r in rows]) == []

    assert_stored_as_a_batch_stores(tmp_path_factory, rows, group)


def test_a_row_that_cannot_be_bound_costs_only_itself_whichever_statement_held_it(sink: SqliteSink) -> None:
    def suppressed(message_id: str, **fields: object) -> Prepared:
        return prepared(msgspec.structs.replace(SUPPRESSED, message_id=message_id, **fields))

    bad = suppressed("bad", reason=object())  # a value SQLite cannot bind
    # two statements (the last two rows bind a column more): the first holds the row that fails
    rows = [suppressed("a"), bad, suppressed("b"), suppressed("c", destination="d"), suppressed("d", destination="d")]
    refused = sink.insert_apart(rows)
    assert [(r.message_id, type(why)) for r, why in refused] == [("bad", sqlite3.ProgrammingError)]
    stored = [m for (m,) in sink._db.execute("SELECT message_id FROM decisions ORDER BY rowid")]
    assert stored == ["a", "b", "c", "d"]


def test_a_group_longer_than_one_statement_binds_is_written_whole_in_order(sink: SqliteSink) -> None:
    """SQLite before 3.32 binds 999 parameters a statement: a group past that is split, not failed."""
    sink._db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 2 * len(COLUMN_NAMES))  # two rows a statement
    statements: list[str] = []
    sink._db.set_trace_callback(statements.append)
    ids = [f"m{i}" for i in range(5)]
    assert sink.insert_apart([prepared(msgspec.structs.replace(SUPPRESSED, message_id=m)) for m in ids]) == []
    assert [s.split(" ", 1)[0] for s in statements] == ["BEGIN", "INSERT", "INSERT", "INSERT", "COMMIT"]
    assert [m for (m,) in sink._db.execute("SELECT message_id FROM decisions ORDER BY rowid")] == ids
