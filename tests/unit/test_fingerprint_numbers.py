"""Canonical numbers: a JSON number counts by its value, never by its spelling, on both paths.

The rule (README, "Fingerprints"; filter/pubsub_filter/core/compare/fingerprint.py): an integral value is that exact
integer, written in plain digits, whatever its size or spelling; any other value is
rounded to the nearest IEEE double, written as that double's shortest text, or as an
integer when the double is integral. A number written with a fraction or exponent whose
nearest double is infinite (`1e400`) makes the payload raw bytes.

Every check runs twice: through a route the typed fast path takes (rows + include) and
through a route only the generic path serves (no rows), each against canonical text
written out here by hand, so a test cannot pass by both paths agreeing on a wrong value.
"""

from __future__ import annotations

import dataclasses
import hashlib
from decimal import Decimal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.core.compare.fingerprint import NOT_JSON, compile_scheme
from pubsub_filter.core.config.schema import Route
from tests.support.json_text import FRACTIONAL, INTEGERS, spellings

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)

#: The generic path: no rows, so there is no fast path.
GENERIC = Route.model_validate({"name": "g", "destination": "phase3", "key": ["payload.k"]})
#: The typed fast path: one rows field, include covering the row key.
FAST = Route.model_validate(
    {"name": "f", "destination": "phase3", "key": ["payload.k"], "rows": "payload.rows", "include": ["id", "v"]}
)


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def generic_fp(number: str) -> str:
    payload, value = compile_scheme(GENERIC)(f'{{"k": 1, "v": {number}}}'.encode())
    assert payload is not NOT_JSON, f"{number} was read as raw bytes"
    return value


def fast_fp(number: str) -> str:
    scheme = compile_scheme(FAST)
    data = f'{{"k": 1, "rows": [{{"id": 1, "v": {number}, "skipped": 2.5}}]}}'.encode()
    assert scheme.fast is not None
    taken = scheme.fast(data)
    assert taken is not None, "the fast path declined"
    assert taken[1] == dataclasses.replace(scheme, fast=None)(data)[1], "fast and generic paths differ"
    return taken[1]


def assert_canonical(number: str, canonical: str) -> None:
    """`number`, however spelled, is written `canonical` on both paths."""
    assert generic_fp(number) == sha(f'{{"k":1,"v":{canonical}}}'), number
    assert fast_fp(number) == sha(f'[{{"id":1,"v":{canonical}}}]'), number


def expected_text(number: str) -> str:
    """The rule, computed independently of core/compare/fingerprint.py: exact integers, else the nearest double."""
    exact = Decimal(number)
    if exact == exact.to_integral_value():
        return str(int(exact))
    nearest = float(number)
    return str(int(nearest)) if nearest.is_integer() else msgspec.json.encode(nearest).decode()


# --- examples ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "canonical"),
    [
        ("1", "1"),
        ("1.0", "1"),
        ("1e0", "1"),
        ("10e-1", "1"),
        ("-0.0", "0"),
        ("-0", "0"),
        ("0e999999999", "0"),
        ("1e20", "100000000000000000000"),
        ("1E+20", "100000000000000000000"),
        ("100000000000000000000.000", "100000000000000000000"),
        ("-1e20", "-100000000000000000000"),
        ("9.223372036854775808e18", "9223372036854775808"),  # 2**63
        ("9223372036854775808.0", "9223372036854775808"),
        ("1.8446744073709551616e19", "18446744073709551616"),  # 2**64
        ("1e23", "1" + "0" * 23),  # no double holds 10**23
        ("1e300", "1" + "0" * 300),
        ("9007199254740993.0", "9007199254740993"),  # 2**53 + 1: no double holds it
        ("90071992547409930e-1", "9007199254740993"),
    ],
)
def test_an_integral_number_is_its_exact_integer_in_digits(number: str, canonical: str) -> None:
    assert_canonical(number, canonical)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("1e20", "100000000000000000000"),
        ("9.223372036854775808e18", "9223372036854775808"),
        ("1e300", "1" + "0" * 300),
        ("9007199254740993.0", "9007199254740993"),
        ("1.8446744073709551617e19", "18446744073709551617"),
    ],
)
def test_spellings_of_one_integer_share_a_fingerprint(left: str, right: str) -> None:
    assert generic_fp(left) == generic_fp(right)
    assert fast_fp(left) == fast_fp(right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("9007199254740993", "9007199254740992"),
        ("9007199254740993.0", "9007199254740992.0"),
        ("9007199254740993", "9007199254740992.0"),
        ("18446744073709551617", "1.8446744073709551616e19"),
        ("1e23", "99999999999999991611392"),  # the double nearest 10**23 is not 10**23
    ],
)
def test_integers_a_double_cannot_tell_apart_stay_apart(left: str, right: str) -> None:
    assert generic_fp(left) != generic_fp(right)
    assert fast_fp(left) != fast_fp(right)


@pytest.mark.parametrize(
    ("number", "canonical"),
    [
        ("25.50", "25.5"),
        ("0.1", "0.1"),
        ("1.5e-7", "1.5e-7"),
        ("0.99999999999999999999", "1"),  # the nearest double is 1.0
        ("9007199254740993.5", "9007199254740994"),  # the nearest double is 2**53 + 2
        ("1e-400", "0"),  # the nearest double is 0.0
    ],
)
def test_a_fractional_number_is_its_nearest_double(number: str, canonical: str) -> None:
    assert_canonical(number, canonical)


def test_an_integer_in_digits_beyond_double_range_is_exact() -> None:
    assert_canonical("1" + "0" * 400, "1" + "0" * 400)


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1.8e308", "1" + "0" * 400 + ".0"])
def test_a_fraction_or_exponent_beyond_double_range_makes_the_payload_raw(number: str) -> None:
    for route in (GENERIC, FAST):
        data = f'{{"k": 1, "rows": [{{"id": 1, "v": {number}}}], "v": {number}}}'.encode()
        payload, value = compile_scheme(route)(data)
        assert payload is NOT_JSON
        assert value == "sha256:" + hashlib.sha256(data).hexdigest()


# --- properties over magnitudes and spellings ----------------------------------------


def integer_and_spelling() -> st.SearchStrategy[tuple[int, str]]:
    return INTEGERS.flatmap(lambda n: st.tuples(st.just(n), spellings(n)))


@SETTINGS
@given(integer_and_spelling())
def test_every_spelling_of_an_integer_is_written_as_its_digits(case: tuple[int, str]) -> None:
    n, spelled = case
    assert Decimal(spelled) == n  # the strategy spells n, nothing else
    assert_canonical(spelled, str(n))


@SETTINGS
@given(INTEGERS.flatmap(lambda n: st.tuples(spellings(n), spellings(n + 1))))
def test_neighbouring_integers_never_share_a_fingerprint(pair: tuple[str, str]) -> None:
    left, right = pair
    assert generic_fp(left) != generic_fp(right)
    assert fast_fp(left) != fast_fp(right)


@SETTINGS
@given(st.one_of(FRACTIONAL, st.floats(allow_nan=False, allow_infinity=False).map(repr)))
def test_any_number_is_written_as_the_rule_says(number: str) -> None:
    assert_canonical(number, expected_text(number))
