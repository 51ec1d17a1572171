"""The second look on a rows route compares with the last forward's rows kept in process
(`pubsub_filter.core.compare.forwarded_rows`): it must answer exactly as digesting every row does."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.compare import forwarded_rows
from pubsub_filter.core.compare.routes import Kept, RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.judge import Decided, decide
from pubsub_filter.core.model import Decision, KeyState, Message
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTE: dict[str, Any] = {
    "name": "props",
    "destination": "phase3",
    "key": ["payload.game_id"],
    "rows": "payload.props",
    "row_key": ["player"],
    "include": ["player", "price", "flag", "note"],
    "tolerance": {"price": 12},
    "changed_attributes": ["price", "flag"],
}


def doc(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps({"game_id": "g1", "props": rows}).encode()


async def forwarded_state(tmp_path: Path, rows: list[dict[str, Any]]) -> tuple[Engine, KeyState]:
    """An engine that forwarded `rows` (and so keeps them), and the state its commit stored."""
    config = parse({"routes": [ROUTE]})
    store = SqliteStore(tmp_path / "state.db")
    engine = Engine(config, store, MemoryPublisher(), MemoryRecorder())
    rec = (await engine.handle("props", Message(doc(rows), {}, "m1"))).record
    assert rec.decision is Decision.FORWARDED
    state = await store.read("props", "g1")
    await store.close()
    assert state is not None
    return engine, state


def decided(rules: RouteRules, state: KeyState, data: bytes) -> Decided:
    payload, fp, typed = rules.scheme.with_rows(data)  # as the engine does: the fingerprint first, then the decision
    return decide(rules, Message(data, {}, "m2"), fp, state, 1.0, False, random.Random(0), payload, typed)


@pytest.mark.parametrize(
    ("was", "now"),
    [(1, True), (0, False), (True, 1), (False, 0), ([1], [True]), ({"a": 0}, {"a": False})],
)
async def test_a_boolean_in_place_of_an_equal_integer_beside_a_move_within_tolerance_forwards(
    tmp_path: Path, was: Any, now: Any
) -> None:
    """`true == 1` in Python, where their canonical JSON differs: the comparison of kept rows must not hide it."""
    engine, state = await forwarded_state(tmp_path, [{"player": "p0", "price": 100}, {"player": "p1", "flag": was}])
    moved = doc([{"player": "p0", "price": 105}, {"player": "p1", "flag": now}])
    got = decided(engine.rules["props"], state, moved)
    assert got.verdict.decision is Decision.FORWARDED
    assert got.out.attributes.get("filter_changed_flag") == "true"


async def test_a_move_within_tolerance_is_suppressed_by_the_process_that_forwarded_and_by_any_other(
    tmp_path: Path,
) -> None:
    engine, state = await forwarded_state(tmp_path, [{"player": f"p{i}", "price": 100 + i} for i in range(5)])
    moved = doc([{"player": f"p{i}", "price": 100 + i + (7 if i == 3 else 0)} for i in range(5)])
    kept, fresh = engine.rules["props"], RouteRules(engine.rules["props"].route)
    assert kept.forwarded_rows(state.rows) is not None and fresh.forwarded_rows(state.rows) is None
    for rules in (kept, fresh):
        got = decided(rules, state, moved)
        assert (got.verdict.reason, dict(got.details)["within_tolerance"]) == ("moved within tolerance", {"price": 7})


VALUES = st.one_of(
    st.integers(-3, 3),
    st.booleans(),
    st.none(),
    st.sampled_from([0.5, 2.5, "a", "true", "false", [], [1], [True], {"a": 1}, {"a": True}]),
)
PRICES = st.one_of(st.integers(80, 120), st.sampled_from([100.5, "100", None, True]))


def _row(i: int, price: Any, flag: Any, note: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"player": f"p{i}"}
    for name, value in (("price", price), ("flag", flag), ("note", note)):
        if value != "absent":
            row[name] = value
    return row


ROWS = st.lists(
    st.tuples(PRICES, st.one_of(VALUES, st.just("absent")), st.one_of(VALUES, st.just("absent"))),
    min_size=1,
    max_size=6,
)
EDITS = st.lists(
    st.tuples(
        st.integers(0, 7),
        st.sampled_from(["price", "flag", "note", "player", "drop", "swap"]),
        st.one_of(VALUES, PRICES),
    ),
    max_size=3,
)


def _edited(rows: list[dict[str, Any]], edits: list[tuple[int, str, Any]]) -> list[dict[str, Any]]:
    out = [dict(r) for r in rows]
    for i, what, value in edits:
        at = i % len(out) if out else 0
        if not out:
            break
        if what == "drop":
            out.pop(at)
        elif what == "swap":
            out[0], out[at] = out[at], out[0]
        elif what == "player":
            out[at]["player"] = f"q{i}"
        else:
            out[at][what] = value
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ROWS, EDITS)
def test_the_kept_rows_give_the_answer_digesting_every_row_gives(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[Any, Any, Any]], edits: list[tuple[int, str, Any]]
) -> None:
    first = [_row(i, *r) for i, r in enumerate(rows)]
    engine, state = asyncio.run(forwarded_state(tmp_path_factory.mktemp("kept"), first))
    data = doc(_edited(first, edits))
    kept, fresh = engine.rules["props"], RouteRules(engine.rules["props"].route)
    a, b = decided(kept, state, data), decided(fresh, state, data)
    assert (a.verdict, dict(a.details), a.out) == (b.verdict, dict(b.details), b.out)


async def test_deciding_a_forward_writes_nothing_and_its_commit_keeps_what_it_stored(tmp_path: Path) -> None:
    engine, state = await forwarded_state(tmp_path, [{"player": "p0", "price": 100}, {"player": "p1", "price": 200}])
    rules = RouteRules(engine.rules["props"].route)  # another process: nothing kept yet
    got = decided(rules, state, doc([{"player": "p0", "price": 100}, {"player": "p1", "price": 250}]))
    assert got.verdict.decision is Decision.FORWARDED and got.out.rows is not None and got.kept is not None
    assert (rules.row_memo.seen, rules.forwarded_rows(got.out.rows)) == ({}, None)
    rules.remember(got.kept)  # what the engine does once the forward's commit landed
    assert rules.forwarded_rows(got.out.rows) is not None and rules.row_memo.seen


def test_a_route_keeps_at_most_its_cap_of_forwarded_rows_oldest_first_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forwarded_rows, "MAX_KEPT_ROWS", 4)
    rules = RouteRules(parse({"routes": [ROUTE]}).routes[0])
    for blob in (b"a", b"b", b"c"):
        rules.remember(Kept(blob, forwarded=forwarded_rows.ForwardedRows([object(), object()], 10)))
    assert [rules.forwarded_rows(b) is not None for b in (b"a", b"b", b"c")] == [False, True, True]
