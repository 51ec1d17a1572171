"""A tolerance's amount, as a route writes it: a non-negative number, or a percentage ("3%") of
the magnitude of the value last forwarded. Its own module so the config validates it with
the very rule the decision applies (`pubsub_filter.core.compare.tolerance`).

Every comparison is exact. A number is the value its canonical text writes (`25.50` and a
double's `25.5` are 25.5, never the binary double nearest to it), an amount the value it was
written as (`2.5%` is 5/200, `0.1` is 1/10): integers against integers in integer arithmetic
(a percentage as a ratio of integers), anything else in decimal arithmetic with enough digits
that nothing rounds (`EXACT`). So 2.5% of 327057656882052036 is 8176441422051300.9, and a move
of 8176441422051301 is past it; 0.7 to 0.8 is a move of 0.1, within a tolerance of 0.1 (in
doubles it is 0.10000000000000009, past it).
"""

from __future__ import annotations

import decimal
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*$")

#: Decimal arithmetic that never rounds: subtraction and multiplication of exact operands are
#: exact at any size with the largest precision and exponents (the decimal module's own advice),
#: and cost what the operands' digits cost. `Inexact` is trapped all the same: a comparison that
#: could not be made exactly is a change (`Amount.allows` answers False), never a suppression.
EXACT = decimal.Context(
    prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[decimal.Inexact, decimal.Overflow]
)


_HUNDRED = Decimal(100)
_float_text = float.__repr__


def exact(value: int | float | Decimal) -> Decimal:
    """`value` as the decimal its canonical text writes: an int as it is, a double as its
    shortest round-trip text (the canonical JSON of it), a Decimal as it is."""
    t = type(value)
    if t is Decimal:
        return value  # type: ignore[return-value]
    return Decimal(_float_text(value) if t is float else value)


@dataclass(frozen=True, slots=True)
class Amount:
    """How far a number may move from the value last forwarded and still count as unchanged."""

    value: int | float  # as written: what records and messages show
    relative: bool  # a percentage of |last|, else an absolute amount
    #: the amount as a ratio of integers, exactly as written (`2.5` is 25/10, `0.1` is 1/10);
    #: by default the ratio `value`'s own text writes
    numerator: int = -1
    denominator: int = 1

    #: the same, as a decimal (exact: a power of ten divides it)
    decimal: Decimal = Decimal(0)

    def __post_init__(self) -> None:
        if self.numerator < 0:
            ratio = (self.value, 1) if type(self.value) is int else _ratio(repr(self.value))
            object.__setattr__(self, "numerator", ratio[0])
            object.__setattr__(self, "denominator", ratio[1])
        object.__setattr__(self, "decimal", EXACT.divide(Decimal(self.numerator), Decimal(self.denominator)))

    def allows(self, move: int | Decimal, last: int | float | Decimal) -> bool:
        """`move` (|new - last|, never negative, exact: `tolerance._move`) is within this amount
        of `last` (a decimal already, from `exact`, saves converting it again)."""
        if type(move) is int and type(last) is int:
            # integers: exact in integer arithmetic; a percentage of 0 allows no move at all
            if self.relative:
                return move * 100 * self.denominator <= self.numerator * abs(last)
            return move * self.denominator <= self.numerator
        try:
            if self.relative:
                return EXACT.multiply(Decimal(move), _HUNDRED) <= EXACT.multiply(self.decimal, exact(last).copy_abs())
            return move <= self.decimal
        except decimal.DecimalException:  # cannot be told exactly: a change, never held back
            return False

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.relative else f"{self.value:g}"


def _ratio(text: str) -> tuple[int, int]:
    """The exact ratio of integers a decimal numeral writes (`2.5` → 25/10)."""
    _, digits, exponent = Decimal(text).as_tuple()
    assert isinstance(exponent, int)  # a numeral: never NaN or infinite
    mantissa = int("".join(map(str, digits)) or "0")
    return (mantissa * 10**exponent, 1) if exponent >= 0 else (mantissa, 10**-exponent)


def parse_amount(raw: Any) -> Amount:
    """The amount `raw` names; ValueError, worded for the user, when it names none."""
    if type(raw) is int:
        if raw < 0:
            raise ValueError(f"a tolerance must be a non-negative number or a percentage such as '3%', not {raw!r}")
        return Amount(raw, False)
    if type(raw) is float:
        if not math.isfinite(raw) or raw < 0:
            raise ValueError(f"a tolerance must be a non-negative number or a percentage such as '3%', not {raw!r}")
        return Amount(raw, False)  # 0.1 as written: 1/10
    if isinstance(raw, str) and (m := _PERCENT.match(raw)):
        number = float(m.group(1))
        shown = int(number) if number.is_integer() else number
        return Amount(shown, True, *_ratio(m.group(1)))
    raise ValueError(f"a tolerance must be a non-negative number or a percentage such as '3%', not {raw!r}")
