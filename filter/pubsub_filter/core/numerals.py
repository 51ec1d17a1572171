"""Whole numbers written by someone outside (a header, an attribute), read without surprises.

`int()` of a string raises past 4,300 digits (CPython's guard against quadratic conversion),
accepts '٣' and ' 7 ', and '²'.isdigit() is True while int('²') raises: outside text is
checked for ASCII digits and bounded by length before it is converted.
"""

from __future__ import annotations


def bounded_int(text: str, max_digits: int) -> int | None:
    """The non-negative whole number `text` writes in ASCII digits, or None when it writes
    none or more than `max_digits` significant digits (leading zeros are not counted)."""
    if not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0")
    if len(significant) > max_digits:
        return None
    return int(significant) if significant else 0


def digits_of(limit: int) -> int:
    """How many digits `limit` has: any number with more is larger."""
    return len(str(limit))
