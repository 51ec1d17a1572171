"""Hypothesis strategies for JSON *text* as producers write it: one value, many spellings.

Payloads are built as bytes, not as Python values passed through `json.dumps`, so that what
is generated is what a producer may really send: numbers as `1e20`, `100.000` or `1E+2`,
strings with or without `\\u` escapes, astral characters as surrogate-pair escapes, NFC and
NFD forms, whitespace, objects with repeated keys, in any key order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from hypothesis import strategies as st

#: Integers of every size that matters: small, around 2**53 and 2**63/2**64, up to 10**308.
INTEGERS = st.one_of(
    st.integers(-(2**64), 2**64),
    st.integers(2**53 - 4, 2**53 + 4),
    st.integers(2**63 - 4, 2**64 + 4),
    st.builds(lambda m, e: m * 10**e, st.integers(-(10**17), 10**17), st.integers(0, 290)),
    st.integers(-(10**308), 10**308),
)


@st.composite
def spellings(draw: st.DrawFn, n: int) -> str:
    """One JSON spelling of the integer n: digits, a fraction, an exponent, or both."""
    sign = "-" if n < 0 else draw(st.sampled_from(["", "-"])) if n == 0 else ""
    digits = str(abs(n))
    # Trailing zeros may move into the exponent; extra zeros may move out of it into a fraction.
    stripped = digits.rstrip("0") or "0"
    shift = draw(st.integers(0, len(digits) - len(stripped)))
    mantissa = digits[: len(digits) - shift] if shift else digits
    extra = draw(st.integers(0, 3))
    mantissa += "0" * extra
    exponent = shift - extra
    # Digits before the decimal point: one, when more would be leading zeros (JSON allows none).
    point = draw(st.integers(1, len(mantissa))) if mantissa[0] != "0" else 1
    exponent += len(mantissa) - point
    frac = mantissa[point:]
    text = mantissa[:point] + ("." + frac if frac else draw(st.sampled_from(["", ".0", ".000"])))
    if exponent or draw(st.booleans()):
        e = draw(st.sampled_from(["e", "E"]))
        plus = draw(st.sampled_from(["", "+"])) if exponent >= 0 else "-"
        text += f"{e}{plus}{abs(exponent):0{draw(st.integers(1, 3))}d}"
    return sign + text


#: Integers, each in one of its spellings.
SPELLED_INTEGERS = INTEGERS.flatmap(spellings)

#: Numbers with a fraction, from about 1e-330 (rounds to 0) to about 1e300 (inside the double range).
FRACTIONAL = st.builds(
    lambda digits, frac, exp: f"{digits}.{frac}e{exp}",
    st.integers(-(10**20), 10**20),
    st.from_regex(r"[0-9]{1,25}", fullmatch=True),
    st.integers(-330, 280),
)

#: Any number the canonical scheme can write (none beyond double range, none over 4300 digits).
NUMBERS = st.one_of(
    SPELLED_INTEGERS,
    FRACTIONAL,
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0", "-0", "-0.0", "1", "1.0", "1e0", "25.5", "25.50", "0.1"]),
)

#: Text a person might put in a field: accents in both normal forms, astral characters, controls.
_TEXT = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.sampled_from(["é", "e\u0301", "Å", "A\u030a", "😀", "𝄞", "\u2028", "\x00", '"', "\\", "/", "Dončić"]),
)


@st.composite
def strings(draw: st.DrawFn) -> str:
    """A JSON string: the same text written with escapes (ASCII only) or as raw UTF-8."""
    return json.dumps(draw(_TEXT), ensure_ascii=draw(st.booleans()))


SCALARS = st.one_of(st.sampled_from(["null", "true", "false"]), NUMBERS, strings())

#: Field names rows and payloads are made of (NFC and NFD "é" are two different names).
NAMES = ("a", "b", "id", "v", "é", "e\u0301")


def obj(pairs: Sequence[tuple[str, str]], space: str = "") -> str:
    """An object from (name, value text) pairs, in the order given, repeated names kept."""
    return "{" + ("," + space).join(f"{json.dumps(k)}:{space}{v}" for k, v in pairs) + "}"


def arr(items: Sequence[str], space: str = "") -> str:
    return "[" + ("," + space).join(items) + "]"


VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(arr),
        st.lists(st.tuples(st.sampled_from(NAMES), inner), max_size=3).map(obj),
    ),
    max_leaves=6,
)
