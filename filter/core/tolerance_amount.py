"""A tolerance's amount, as a route writes it: a non-negative number, or a percentage ("3%") of
the magnitude of the value last forwarded. Its own module so the config validates it with
the very rule the decision applies (`filter.core.tolerance`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*$")


@dataclass(frozen=True, slots=True)
class Amount:
    """How far a number may move from the value last forwarded and still count as unchanged."""

    value: int | float
    relative: bool  # a percentage of |last|, else an absolute amount

    def allows(self, move: int | float, last: int | float) -> bool:
        """`move` (|new - last|, never negative) is within this amount of `last`."""
        if self.relative:
            # no division: exact in integers, and a percentage of 0 allows no move at all
            try:
                return move * 100 <= self.value * abs(last)
            except OverflowError:  # an integer past a double's range, times a fractional percentage
                return move * 100 <= Fraction(self.value) * abs(last)
        return move <= self.value

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.relative else f"{self.value:g}"


def parse_amount(raw: Any) -> Amount:
    """The amount `raw` names; ValueError, worded for the user, when it names none."""
    if type(raw) in (int, float):
        if not math.isfinite(raw) or raw < 0:
            raise ValueError(f"a tolerance must be a non-negative number or a percentage such as '3%', not {raw!r}")
        return Amount(raw, False)
    if isinstance(raw, str) and (m := _PERCENT.match(raw)):
        number = float(m.group(1))
        return Amount(int(number) if number.is_integer() else number, True)
    raise ValueError(f"a tolerance must be a non-negative number or a percentage such as '3%', not {raw!r}")
