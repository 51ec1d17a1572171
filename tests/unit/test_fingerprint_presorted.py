"""Rows that arrive in key order skip the sort, and give the bytes the sort-first ordering gave."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from operator import eq, itemgetter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.core.compare.canonical import encode_sorted as _encode
from pubsub_filter.core.compare.canonical import ordered_rows as _ordered


def sort_first(
    by_key: Callable[[Any], Any], key_values: Callable[[Any], Any], encode: Callable[[Any], bytes]
) -> Callable[[list[Any]], bytes]:
    """The ordering as it was before the shortcut: always sort, then check for equal keys."""

    def ordered(rows: list[Any]) -> bytes:
        try:
            rows.sort(key=by_key)
            keys = list(map(by_key, rows))
            if not any(map(eq, keys, islice(keys, 1, None))):
                return encode(rows)
        except (TypeError, KeyError):
            pass
        encoded = sorted((encode(key_values(r)), encode(r)) for r in rows)
        return b"[" + b",".join(e for _, e in encoded) + b"]"

    return ordered


FIELDS = ("a", "b")
# JSON values of every type a row key can hold, including ones that do not compare.
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 1.0, 2.5]), st.sampled_from(["x", "y", ""])
)
_VALUES = st.one_of(
    _SCALARS, st.lists(_SCALARS, max_size=2), st.dictionaries(st.sampled_from("pq"), _SCALARS, max_size=1)
)
_ROWS = st.lists(st.dictionaries(st.sampled_from(FIELDS), _VALUES, min_size=1), max_size=8)


def orderings(fields: tuple[str, ...]) -> tuple[Callable[[list[Any]], bytes], Callable[[list[Any]], bytes]]:
    by_key = itemgetter(*fields)
    key_values = lambda r: [r.get(k) for k in fields]  # noqa: E731
    return _ordered(by_key, key_values, _encode), sort_first(by_key, key_values, _encode)


def presorted(rows: list[Any], by_key: Callable[[Any], Any]) -> list[Any]:
    """The rows in key order where they have one, else as they came."""
    try:
        return sorted(rows, key=by_key)
    except (TypeError, KeyError):
        return rows


@settings(max_examples=1500, deadline=None)
@given(_ROWS, st.sampled_from([("a",), ("a", "b")]))
def test_rows_in_any_order_give_the_sort_first_bytes(rows: list[Any], fields: tuple[str, ...]) -> None:
    ours, reference = orderings(fields)
    for arrival in (rows, presorted(rows, itemgetter(*fields)), list(reversed(rows))):
        assert ours(list(arrival)) == reference(list(arrival))


def test_rows_in_key_order_give_the_sort_first_bytes() -> None:
    ours, reference = orderings(("a", "b"))
    rows = [{"a": 1, "b": "x", "v": 1}, {"a": 1, "b": "y", "v": 2}, {"a": 2.5, "b": "x", "v": 3}]
    assert ours(list(rows)) == reference(list(rows)) == _encode(rows)


def test_rows_with_keys_that_do_not_compare_take_the_total_order() -> None:
    ours, reference = orderings(("a",))
    rows = [{"a": 1}, {"a": "x"}, {"a": None}]
    assert ours(list(rows)) == reference(list(rows)) != _encode(rows)


def test_rows_with_equal_keys_in_key_order_take_the_total_order() -> None:
    ours, reference = orderings(("a",))
    rows = [{"a": 1, "v": 2}, {"a": 1, "v": 1}]
    assert ours(list(rows)) == reference(list(rows)) == _encode(list(reversed(rows)))
