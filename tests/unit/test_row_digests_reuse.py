"""Row digests computed against the stored state are the digests computed from scratch.

A forward passes the previous forward's stored digests to `rows.digest_rows`, which keeps
the stored field checksums of rows whose fingerprint did not change, and `rows.encode`
writes stored rows back as they were read. Neither may change a single stored byte or a
single reported field: these compare both against the from-scratch computation.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.core.compare import rows
from pubsub_filter.core.compare.partial import partial
from pubsub_filter.core.compare.routes import Kept, RouteRules
from pubsub_filter.core.config.schema import Route, parse
from pubsub_filter.core.engine.judge import decide
from pubsub_filter.core.model import Decision, Message

FIELDS = ["id", "a", "b", "c"]
VALUES = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.sampled_from(["x", "y", ""]),
    st.floats(allow_nan=False),
    st.dictionaries(st.sampled_from(["z", "y"]), st.integers(0, 2), max_size=2),  # nested: key order matters
)
ROW = st.one_of(
    st.fixed_dictionaries({"id": st.integers(0, 6)}, optional={f: VALUES for f in FIELDS[1:]}),
    st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4),  # the key may be missing
    st.integers(),  # not an object: never digested
)
REPORTS = st.lists(ROW, max_size=12)


def route(**extra: Any) -> Route:
    base = {
        "name": "rows",
        "destination": "downstream",
        "key": ["payload.k"],
        "rows": "payload.rows",
        "row_key": ["id"],
    }
    return parse({"routes": [base | extra]}).routes[0]


ROUTES = st.sampled_from([route(), route(include=["id", "a", "b"]), route(exclude=["c"])])


def stored(r: Route, report: list[Any]) -> rows.Stored | None:
    return rows.decode(rows.encode(rows.digest_rows(r, report)))


@settings(max_examples=400, deadline=None)
@given(ROUTES, REPORTS, REPORTS)
def test_digests_against_stored_state_equal_digests_from_scratch(r: Route, old: list[Any], new: list[Any]) -> None:
    before = stored(r, old)
    assert rows.digest_rows(r, new, before) == rows.digest_rows(r, new)


@settings(max_examples=400, deadline=None)
@given(ROUTES, REPORTS, REPORTS)
def test_stored_state_written_back_is_byte_identical(r: Route, old: list[Any], new: list[Any]) -> None:
    before = stored(r, old)
    assert rows.encode(rows.digest_rows(r, new, before)) == rows.encode(rows.digest_rows(r, new))


@settings(max_examples=400, deadline=None)
@given(ROUTES, REPORTS, REPORTS)
def test_diff_against_lazily_decoded_state_equals_diff_against_unpacked_state(
    r: Route, old: list[Any], new: list[Any]
) -> None:
    before = stored(r, old)
    unpacked = {k: (fp, dict(fields)) for k, (fp, fields) in before.items()} if before else {}
    digests = rows.digest_rows(r, new, before)
    assert rows.diff(before or {}, digests).summary(limit=100) == rows.diff(unpacked, digests).summary(limit=100)


def test_an_unchanged_row_keeps_its_stored_checksums_unread() -> None:
    r = route()
    before = stored(r, [{"id": 1, "a": 1}, {"id": 2, "a": 2}])
    assert before is not None
    after = rows.digest_rows(r, [{"id": 1, "a": 1}, {"id": 2, "a": 3}], before)
    kept = after["[1]"][1]
    assert isinstance(kept, rows.Packed), "an unchanged row is not digested field by field again"
    assert kept.packed is before.raw["[1]"][1], "its checksums are the stored ones, as read"
    assert dict(after["[2]"][1]) != dict(before["[2]"][1])


FAST_ROUTES = st.sampled_from(
    [
        route(include=["id", "a", "b"]),
        route(include=["id", "a", "b", "c"]),
        route(include=["id", "a", "c"], row_key=["id", "a"]),
    ]
)


def rules_pair(r: Route) -> tuple[RouteRules, RouteRules]:
    fast = RouteRules(r)
    assert fast.scheme.typed_rows is not None, "the route shape the fast path takes"
    generic = RouteRules(r)
    generic.scheme = dataclasses.replace(generic.scheme, fast=None, typed_rows=None)
    return fast, generic


@settings(max_examples=400, deadline=None)
@given(FAST_ROUTES, REPORTS, REPORTS)
def test_digests_of_fast_path_rows_equal_digests_of_generic_rows(r: Route, old: list[Any], new: list[Any]) -> None:
    fast, generic = rules_pair(r)
    data = json.dumps({"k": 1, "rows": new}).encode()
    before = rows.decode(rows.encode(generic.row_digests(json.dumps({"k": 1, "rows": old}).encode()) or {}))
    assert fast.row_digests(data, before) == generic.row_digests(data, before)
    assert fast.row_digests(data) == generic.row_digests(data)


@settings(max_examples=300, deadline=None)
@given(FAST_ROUTES, REPORTS, REPORTS)
def test_the_diff_the_fast_path_found_while_digesting_is_the_diff_compared_afresh(
    r: Route, old: list[Any], new: list[Any]
) -> None:
    fast, generic = rules_pair(r)
    before = rows.decode(rows.encode(generic.row_digests(json.dumps({"k": 1, "rows": old}).encode()) or {}))
    digests = fast.row_digests(json.dumps({"k": 1, "rows": new}).encode(), before)
    if before is None or digests is None:
        return
    assert rows.diff(before, digests) == rows.diff(before, dict(digests))


@pytest.mark.parametrize(
    "report",
    [
        [{"id": 1, "a": 1.0, "b": {"z": 1, "y": [2.0, None]}}, {"id": 2, "a": "é\u2028"}],
        [{"id": 1, "a": 1}, {"id": 1, "a": 2}],  # a shared key: digested together
        [{"id": 1, "a": 1}, {"a": 2}],  # a row without its key
        [{"id": 1, "a": 1}, 7],  # a row that is not an object
    ],
)
def test_fast_path_row_digests_match_the_generic_ones_on_the_edge_cases(report: list[Any]) -> None:
    fast, generic = rules_pair(route(include=["id", "a", "b"]))
    data = json.dumps({"k": 1, "rows": report}, ensure_ascii=False).encode()
    assert fast.row_digests(data) == generic.row_digests(data)


@settings(max_examples=300, deadline=None)
@given(FAST_ROUTES, REPORTS, REPORTS)
def test_rows_kept_from_the_fingerprint_digest_as_a_fresh_decode_does(
    r: Route, one: list[Any], other: list[Any]
) -> None:
    fast, generic = rules_pair(r)
    data, other_data = (json.dumps({"k": 1, "rows": report}).encode() for report in (one, other))
    _, _, typed = fast.scheme.with_rows(data)  # the fingerprint decodes (and sorts) the rows first, as a forward does
    assert fast.row_digests(data, None, typed) == generic.row_digests(data)
    assert fast.row_digests(other_data) == generic.row_digests(other_data)


def test_a_forward_digests_the_rows_its_fingerprint_decoded_and_decodes_none_again() -> None:
    fast, generic = rules_pair(route(include=["id", "a"]))
    decodes: list[bytes] = []
    typed_rows = fast.scheme.typed_rows
    assert typed_rows is not None
    fast.scheme = dataclasses.replace(fast.scheme, typed_rows=lambda data: decodes.append(data) or typed_rows(data))
    msg = Message(json.dumps({"k": 1, "rows": [{"id": 2, "a": 1}, {"id": 1, "a": 2}]}).encode(), {}, "m1")
    payload, fp, _, _, typed = fast.extract(msg)  # the engine's step 1: the rows come with the fingerprint
    assert typed is not None
    decided = decide(fast, msg, fp, None, 0.0, False, random.Random(0), payload, typed)
    assert decided.verdict.decision is Decision.FORWARDED and decodes == []
    again = decide(fast, msg, fp, None, 0.0, False, random.Random(0), payload)  # without them: decoded here
    assert decodes == [msg.data] and again.out == decided.out
    assert decided.out.rows == rows.encode(generic.row_digests(msg.data) or {})


def test_rows_kept_from_the_fingerprint_keep_their_arrival_order() -> None:
    fast, _ = rules_pair(route(include=["id", "a"]))
    data = json.dumps({"k": 1, "rows": [{"id": 3}, {"id": 1}, {"id": 2}]}).encode()
    _, _, typed = fast.scheme.with_rows(data)
    assert typed is not None and list(fast.row_digests(data, None, typed) or {}) == ["[3]", "[1]", "[2]"]


@settings(max_examples=300, deadline=None)
@given(FAST_ROUTES, REPORTS, REPORTS, st.booleans())
def test_a_partial_payload_cut_from_raw_rows_is_byte_identical(
    r: Route, old: list[Any], new: list[Any], seen: bool
) -> None:
    fast, generic = rules_pair(r)
    document = {
        "meta": {"z": 1.50, "a": [1.0, "\\u00e9"]},
        "k": 1,
        "also": [1.0, {"b": 2, "a": [3]}, "x", []],  # a top-level list other than the rows
        "rows": new,
        "big": 12345678901234567890123,
        "tail": None,
    }
    data = json.dumps(document).encode()
    typed = fast.scheme.with_rows(data)[2] if seen else None  # the rows the fingerprint decoded, as on a forward
    before = rows.decode(rows.encode(generic.row_digests(json.dumps({"k": 1, "rows": old}).encode()) or {}))
    digests = generic.row_digests(data)
    if before is None or digests is None:
        return
    diff = rows.diff(before, digests)
    assert partial(fast, data, diff, typed) == partial(generic, data, diff)


@settings(max_examples=300, deadline=None)
@given(FAST_ROUTES, REPORTS, REPORTS)
def test_a_partial_payload_cut_by_the_digests_keys_is_byte_identical(r: Route, old: list[Any], new: list[Any]) -> None:
    fast, generic = rules_pair(r)
    document = {"meta": {"z": 1.50}, "k": 1, "rows": new, "tail": None}
    data = json.dumps(document).encode()
    before = rows.decode(rows.encode(generic.row_digests(json.dumps({"k": 1, "rows": old}).encode()) or {}))
    typed = fast.typed_rows(data)
    digests = fast.row_digests(data, before, typed)
    if before is None or digests is None or typed is None:
        return
    keys = list(digests) if len(digests) == len(typed.rows) else None  # as `judge` passes them
    diff = rows.diff(before, digests)
    assert partial(fast, data, diff, typed, keys) == partial(generic, data, diff)


@settings(max_examples=300, deadline=None)
@given(FAST_ROUTES, REPORTS, REPORTS)
def test_digests_through_the_memo_of_another_document_equal_digests_without_it(
    r: Route, one: list[Any], other: list[Any]
) -> None:
    fast, generic = rules_pair(r)
    data, other_data = (json.dumps({"k": 1, "rows": report}).encode() for report in (one, other))
    fast.row_digests(data)  # the memo now holds the first document's rows
    assert fast.row_digests(other_data) == generic.row_digests(other_data)
    assert fast.row_digests(other_data) == generic.row_digests(other_data), "and through its own rows"


def _forwarded(rules: RouteRules, data: bytes) -> None:
    """Digest `data` and keep its rows' memo, as a forward's commit does (`RouteRules.remember`)."""
    digests = rules.row_digests(data)
    assert isinstance(digests, rows.ComparedDigests)
    rules.remember(Kept(seen=digests.seen))


def test_a_row_the_previous_document_had_is_not_hashed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, _ = rules_pair(route(include=["id", "a"]))
    _forwarded(fast, json.dumps({"k": 1, "rows": [{"id": 1, "a": 1}, {"id": 2, "a": 2}]}).encode())
    hashed: list[bytes] = []
    real = rows._key_and_fingerprint
    monkeypatch.setattr(rows, "_key_and_fingerprint", lambda t, r, c: hashed.append(c) or real(t, r, c))
    fast.row_digests(json.dumps({"k": 2, "rows": [{"id": 1, "a": 1}, {"id": 2, "a": 3}]}).encode())
    assert hashed == [b'{"a":3,"id":2}']


def test_the_memo_keeps_only_the_last_forwarded_documents_rows() -> None:
    fast, _ = rules_pair(route(include=["id", "a"]))
    _forwarded(fast, json.dumps({"k": 1, "rows": [{"id": 1, "a": 1}, {"id": 2, "a": 2}]}).encode())
    _forwarded(fast, json.dumps({"k": 1, "rows": [{"id": 3, "a": 3}]}).encode())
    assert list(fast.row_memo.seen) == [b'{"a":3,"id":3}']


def test_digesting_rows_leaves_the_memo_to_the_forwards_commit() -> None:
    fast, _ = rules_pair(route(include=["id", "a"]))
    _forwarded(fast, json.dumps({"k": 1, "rows": [{"id": 1, "a": 1}]}).encode())
    fast.row_digests(json.dumps({"k": 1, "rows": [{"id": 3, "a": 3}]}).encode())  # a look, not a forward
    assert list(fast.row_memo.seen) == [b'{"a":1,"id":1}']


def _edited(report: list[Any], edits: list[tuple[int, str, Any]]) -> list[Any]:
    """`report` with some fields of some rows set or removed (None removes): most rows unchanged."""
    out = [dict(r) if isinstance(r, dict) else r for r in report]
    for i, name, value in edits:
        row = out[i % len(out)] if out else None
        if isinstance(row, dict) and name != "id":
            if value is None:
                row.pop(name, None)
            else:
                row[name] = value
    return out


EDITS = st.lists(st.tuples(st.integers(0, 11), st.sampled_from(FIELDS), st.one_of(st.none(), VALUES)), max_size=3)


@settings(max_examples=400, deadline=None)
@given(FAST_ROUTES, REPORTS, EDITS, st.booleans())
def test_row_state_written_back_by_the_fast_path_is_byte_identical_to_the_state_from_scratch(
    r: Route, old: list[Any], edits: list[tuple[int, str, Any]], seen: bool
) -> None:
    fast, generic = rules_pair(r)
    new = _edited(old, edits)  # a few rows changed, gained or lost a field; the rest as stored
    before = rows.decode(rows.encode(generic.row_digests(json.dumps({"k": 1, "rows": old}).encode()) or {}))
    data = json.dumps({"k": 1, "rows": new}).encode()
    typed = fast.scheme.with_rows(data)[2] if seen else None  # the rows the fingerprint decoded, as on a forward
    assert rows.encode(fast.row_digests(data, before, typed) or {}) == rows.encode(generic.row_digests(data) or {})


@pytest.mark.parametrize(
    ("new", "same_layout"),
    [
        ([{"id": 1, "a": 1, "b": 2}, {"id": 2, "a": 3, "b": 2}, {"id": 3, "a": 1}], True),  # a row changed
        ([{"id": 1, "a": 1, "b": 2}, {"id": 2, "a": 2, "b": 2}, {"id": 3, "a": 1}, {"id": 4, "b": 1}], True),  # added
        ([{"id": 1, "a": 1, "b": 2}, {"id": 3, "a": 1}], True),  # removed
        ([{"id": 1, "a": 1, "b": 2}, {"id": 2, "a": 2, "b": 2}, {"id": 3, "a": 1, "c": 5}], False),  # a new field
        ([{"id": 1, "a": 1}, {"id": 2, "a": 2}, {"id": 3, "a": 2}], False),  # no kept row has every field
    ],
)
def test_kept_rows_are_written_back_as_read_while_the_stored_layout_holds(new: list[Any], same_layout: bool) -> None:
    fast, generic = rules_pair(route(include=["id", "a", "b", "c"]))
    old = [{"id": 1, "a": 1, "b": 2}, {"id": 2, "a": 2, "b": 2}, {"id": 3, "a": 1}]
    if not same_layout:
        old[0] = {"id": 1, "a": 1}  # so that the first row is no proof of the layout either
    before = rows.decode(rows.encode(generic.row_digests(json.dumps({"k": 1, "rows": old}).encode()) or {}))
    digests = fast.row_digests(json.dumps({"k": 1, "rows": new}).encode(), before)
    assert isinstance(digests, rows.ComparedDigests)
    assert (digests.as_stored() is not None) is same_layout
    assert rows.encode(digests) == rows.encode(generic.row_digests(json.dumps({"k": 1, "rows": new}).encode()) or {})
