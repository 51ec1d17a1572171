"""The typed fast path and the generic path are one function: same fingerprint, same error.

`Scheme.fast` (filter/pubsub_filter/core/compare/fingerprint.py, `_typed_canonical`) decodes only what a route counts.
It may decline (None), and then the generic path answers; when it answers, it must give
the generic path's fingerprint and the top-level fields the key and bypass rules read.
Routes and payloads are generated: include/exclude/rows/row_key, key and bypass paths;
rows with missing fields, repeated names, non-object rows, shared row keys; numbers in
many spellings, strings with escapes, NFC/NFD and astral characters, invalid UTF-8.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pubsub_filter.core.compare.fingerprint import NOT_JSON, PayloadError, compile_scheme
from pubsub_filter.core.config.schema import Route
from tests.support.json_text import NAMES, NUMBERS, SCALARS, VALUES, arr, obj, strings

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True)
SORTED = msgspec.json.Encoder(order="sorted").encode  # compares values exactly: True is not 1 here

#: Row-key values drawn from a small pool, so rows often share a key (and `1`, `1.0`, `true` meet).
KEY_VALUES = st.sampled_from(["1", "1.0", "2", "true", "null", '"x"', '"é"', '"e\\u0301"', "[1]", '{"a":1}'])
FIELD_VALUES = st.one_of(KEY_VALUES, VALUES)


KEYS = [["payload.k"], ["payload.meta.id"], ["payload.k", "payload.meta.id"], ["attributes.id"]]


@st.composite
def routes(draw: st.DrawFn, fast: bool = False) -> Route:
    """A canonical route with one top-level rows field: mostly (with `fast`: only) shapes the fast path takes."""
    row_key = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=2))
    include = draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1 if fast else 0, max_size=4))
    if fast or draw(st.integers(0, 4)):  # usually cover the row key, as the fast path needs
        include += [k for k in row_key if k not in include]
    rest = [n for n in NAMES if n not in include]
    exclude = draw(st.lists(st.sampled_from(rest), unique=True, max_size=2)) if rest else []
    return Route.model_validate(
        {
            "name": "r",
            "destination": "phase3",
            "key": draw(st.sampled_from(KEYS)),
            "rows": "payload." + draw(st.sampled_from(["rows", "players"])),
            "row_key": row_key,
            "include": include,
            "exclude": exclude,
            "bypass": draw(st.sampled_from([[], [{"field": "payload.live", "equals": True}]])),
        }
    )


@st.composite
def rows(draw: st.DrawFn, unique_names: bool = False) -> list[list[tuple[str, str]] | str]:
    """Rows as (name, value text) pairs; some are not objects at all."""
    out: list[list[tuple[str, str]] | str] = []
    for _ in range(draw(st.integers(0, 6))):
        if not unique_names and draw(st.integers(0, 19)) == 0:
            out.append(draw(VALUES))  # a row that may not be an object
            continue
        names = draw(st.lists(st.sampled_from(NAMES), unique=unique_names, max_size=5))
        out.append([(n, draw(FIELD_VALUES)) for n in names])
    return out


def rows_text(items: list[list[tuple[str, str]] | str], space: str = "") -> str:
    return arr([r if isinstance(r, str) else obj(r, space) for r in items], space)


@st.composite
def payloads(draw: st.DrawFn, route: Route) -> bytes:
    """A payload as bytes: the rows field (or something else in its place), key, bypass and noise fields."""
    assert route.rows is not None
    rows_name = route.rows.parts[0]
    space = draw(st.sampled_from(["", " ", "\n  "]))
    items = draw(rows())
    for row in items:
        if isinstance(row, list) and draw(st.integers(0, 9)):  # mostly, rows carry their key
            row += [(k, draw(KEY_VALUES)) for k in route.row_key if k not in {n for n, _ in row}]
    rows_value = rows_text(items, space) if draw(st.integers(0, 9)) else draw(SCALARS)  # or not a list at all
    pairs = [
        (rows_name, rows_value),
        ("k", draw(st.one_of(KEY_VALUES, SCALARS))),
        ("meta", obj([("id", draw(SCALARS)), ("n", draw(NUMBERS))])),
        ("live", draw(st.sampled_from(["true", "false", "1", "null"]))),
        ("noise", draw(VALUES)),
        ("when", draw(strings())),
    ]
    pairs = draw(st.permutations(pairs))
    pairs = [p for p in pairs if draw(st.integers(0, 9))]  # now and then a field is missing
    if draw(st.integers(0, 9)) == 0:  # a repeated top-level name: the last one counts
        pairs.append((draw(st.sampled_from([rows_name, "k", "meta", "live"])), draw(VALUES)))
    data = obj(pairs, space).encode()
    if draw(st.integers(0, 19)) == 0:  # invalid UTF-8 inside a string no route reads
        data = data[:-1] + (b"," if pairs else b"") + b'"z":"\xff"}'
    if draw(st.integers(0, 29)) == 0:  # not an object at all
        data = b"[" + data + b"]"
    return data


def generic_answer(route: Route, data: bytes) -> tuple[str, Any]:
    generic = dataclasses.replace(compile_scheme(route), fast=None)
    try:
        payload, value = generic(data)
    except PayloadError as exc:
        return "error", str(exc)
    return value, payload


def assert_paths_agree(route: Route, data: bytes) -> None:
    scheme = compile_scheme(route)
    expected, generic_payload = generic_answer(route, data)
    fast = scheme.fast(data) if scheme.fast is not None else None
    event("fast path taken" if fast is not None else "fast path declined or absent")
    if fast is not None:
        payload, value, _ = fast
        assert value == expected, "the fast path's fingerprint is not the generic path's"
        assert generic_payload is not NOT_JSON
        read = {p.parts[0] for p in (*route.key, *(b.field for b in route.bypass)) if p.root == "payload"}
        wanted = {n: v for n, v in generic_payload.items() if n in read}
        assert SORTED(payload) == SORTED(wanted), "the fast path's payload differs"
    try:
        value = scheme(data)[1]
    except PayloadError as exc:
        value = "error"
        assert str(exc) == generic_payload
    assert value == expected


@SETTINGS
@given(st.data())
def test_the_fast_path_gives_the_generic_fingerprint(data: st.DataObject) -> None:
    route = data.draw(routes())
    assert route.rows is not None
    assert_paths_agree(route, data.draw(payloads(route)))


@st.composite
def rows_the_fast_path_takes(draw: st.DrawFn) -> tuple[Route, bytes]:
    """A route the fast path serves and a well-formed payload for it: every row an object with its key."""
    route = draw(routes(fast=True))
    assert route.rows is not None
    items: list[list[tuple[str, str]] | str] = []
    for row in draw(rows()):
        pairs = row if isinstance(row, list) else []
        items.append(pairs + [(k, draw(KEY_VALUES)) for k in route.row_key if k not in {n for n, _ in pairs}])
    space = draw(st.sampled_from(["", " "]))
    data = obj([(route.rows.parts[0], rows_text(items, space)), ("k", draw(KEY_VALUES))], space).encode()
    return route, data


@SETTINGS
@given(rows_the_fast_path_takes())
def test_the_fast_path_answers_well_formed_payloads_with_the_generic_fingerprint(case: tuple[Route, bytes]) -> None:
    route, data = case
    fast = compile_scheme(route).fast
    assert fast is not None and fast(data) is not None, "the fast path declined a payload it is built for"
    assert_paths_agree(route, data)


@st.composite
def reorderings(draw: st.DrawFn) -> tuple[Route, bytes, bytes]:
    """A route and one payload written twice: rows, row fields and top-level fields in other orders."""
    route = draw(routes())
    assert route.rows is not None
    items = draw(rows(unique_names=True))
    for row in items:  # rows that carry their key, often the same key as another row
        if isinstance(row, list):
            row += [(k, draw(st.sampled_from(["1", "1.0", '"x"']))) for k in route.row_key if k not in dict(row)]
    counted = [n for n in (route.include or NAMES) if n not in route.row_key and n not in route.exclude]
    objects = [r for r in items if isinstance(r, list)]
    if counted and objects and draw(st.booleans()):  # a twin: same row key, other content
        name, row = draw(st.sampled_from(counted)), draw(st.sampled_from(objects))
        items.append([(n, v) for n, v in row if n != name] + [(name, '"twin"')])
    top = [("k", draw(KEY_VALUES)), ("meta", obj([("id", draw(SCALARS))])), ("live", "false"), ("noise", draw(VALUES))]

    def written(items: list[Any], top: list[tuple[str, str]], space: str) -> bytes:
        return obj([(route.rows.parts[0], rows_text(items, space)), *top], space).encode()  # type: ignore[union-attr]

    shuffled = [draw(st.permutations(r)) if isinstance(r, list) else r for r in draw(st.permutations(items))]
    return route, written(items, top, ""), written(shuffled, draw(st.permutations(top)), " ")


@SETTINGS
@given(reorderings())
def test_key_order_and_row_order_never_change_the_fingerprint(case: tuple[Route, bytes, bytes]) -> None:
    route, data, reordered = case
    scheme = compile_scheme(route)
    generic = dataclasses.replace(scheme, fast=None)
    assert scheme(data)[1] == scheme(reordered)[1]
    assert generic(data)[1] == generic(reordered)[1]


# --- the one divergence the fast path keeps on purpose (README, "Fingerprints") -------

ROWS_ROUTE = Route.model_validate(
    {"name": "r", "destination": "phase3", "key": ["payload.k"], "rows": "payload.rows", "include": ["id"]}
)


def test_a_number_beyond_double_range_in_a_field_the_fast_path_skips_is_not_read() -> None:
    data = b'{"k": 1, "rows": [{"id": 1, "note": 1e400}]}'
    scheme = compile_scheme(ROWS_ROUTE)
    payload, value = scheme(data)
    assert payload == {"k": 1}
    assert value == compile_scheme(ROWS_ROUTE)(b'{"k": 1, "rows": [{"id": 1}]}')[1]
    # the generic path reads it, and it does not count there either: the same fingerprint, by value
    generic = dataclasses.replace(scheme, fast=None)(data)
    assert generic[0] is not NOT_JSON and generic[1] == value


def test_a_number_beyond_double_range_in_a_counted_field_makes_both_paths_raw() -> None:
    data = b'{"k": 1, "rows": [{"id": 1e400}]}'
    scheme = compile_scheme(ROWS_ROUTE)
    assert scheme(data)[0] is NOT_JSON
    assert scheme(data) == dataclasses.replace(scheme, fast=None)(data)
