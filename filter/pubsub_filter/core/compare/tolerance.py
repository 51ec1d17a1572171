"""Tolerance (a deadband per numeric field) and the changed-field flags: what is compared, and how.

A route's `tolerance` lets a number move a little without counting as a change. What it is
compared with is the value *last forwarded* (what the destination holds), never a suppressed
message's, so a slow drift gets through once it adds up.

The reference: each forward on such a route stores, per row (the payload itself is the row
`""` on a whole-payload route), a digest of the row's counted content *without* the tolerance
fields (`rest`: 64 bits of SHA-256 of its canonical JSON) and the tolerance fields' values: a
number as it is (JSON numbers are read by value, `25.50` is `25.5`; integers of any size,
exactly), anything else as a digest of its canonical JSON (`=` and 16 hex), a missing field
not at all. It rides at the end of the row state blob (`KeyState.rows`) as a trailing array
element that the readers of that blob skip, so it is written only with the commit of the
forward that carried it, after its publish was confirmed, and never by a claim.

A message is within tolerance of the reference when every row's `rest` is the one stored
(the same rows: none added or removed) and every tolerance field is either equal, or a number
both times with |new - last| <= its amount (for "N%": N/100 of |last|), computed exactly
(`pubsub_filter.core.config.amounts`): integers in integer arithmetic, a fraction as the decimal
its canonical text writes. JSON has no NaN or infinity; a number beyond double range (`1e400`,
which makes the fingerprint raw) is read as a decimal and compared exactly, as a string is.

Pure: no I/O. The decision reads it through `pubsub_filter.core.engine.judge`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, DecimalException
from typing import Any

import msgspec

from pubsub_filter.core.attributes import CHANGED_PREFIX
from pubsub_filter.core.compare.canonical import encode_sorted
from pubsub_filter.core.compare.fingerprint import selector
from pubsub_filter.core.config.amounts import EXACT, Amount, exact, parse_amount
from pubsub_filter.core.config.schema import Route

#: The reason of a suppression whose only changes are moves within tolerance.
WITHIN = "moved within tolerance"
#: What `skip-rate` counts those suppressions as (each records backend's reader labels them so).
WITHIN_TOLERANCE = "within_tolerance"

Value = int | float | str
Entry = tuple[str, dict[str, Value]]  # (rest digest, tolerance field values)


class Reference(msgspec.Struct, array_like=True, frozen=True):
    """The last forward's reference, by row key (`""`: the whole payload)."""

    rows: dict[str, Entry]


class _Tail(msgspec.Struct, array_like=True):
    """The row state blob (`rows._StoredRowState`, `fields._StoredFieldState`), read only for the reference after it."""

    fields: msgspec.Raw
    rows: msgspec.Raw
    clocks: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    reference: Reference | None = None


_read_tail = msgspec.json.Decoder(_Tail).decode
_encode = msgspec.json.encode


def read(blob: bytes | None) -> Reference | None:
    """The reference stored after the row state in `blob`, if any."""
    if not blob:
        return None
    try:
        return _read_tail(blob).reference
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def attach(blob: bytes, reference: Reference, elements: int, limit: int) -> bytes | None:
    """`blob` (a JSON array of `elements` elements: 2 or 3) with `reference` after it, or None
    over `limit` bytes. Spliced, not re-encoded: the row state is written as it was."""
    pad = b",{}" if elements == 2 else b""
    out = b"".join((blob[:-1], pad, b",", _encode(reference), b"]"))
    return out if len(out) <= limit else None


@dataclass(frozen=True, slots=True)
class ComparedToReference:
    """One row against its reference: whether everything but the tolerance fields is the same,
    the tolerance fields that moved within their amount (and by how much), and those that did not."""

    same_rest: bool
    moves: dict[str, int | float] = field(default_factory=dict)
    beyond: frozenset[str] = frozenset()

    @property
    def within(self) -> bool:
        return self.same_rest and not self.beyond


class Tolerance:
    """A route's tolerances and flags, compiled once."""

    def __init__(self, route: Route):
        self.amounts: dict[str, Amount] = {f: parse_amount(v) for f, v in route.tolerance.items()}
        self.names = frozenset(self.amounts)
        self.listed = tuple(route.changed_attributes)
        self.every_flag = {CHANGED_PREFIX + f: "true" for f in self.listed}
        # the counted fields but the tolerance fields, in one copy of the row
        self._rest = selector(route.model_copy(update={"exclude": [*route.exclude, *self.names]}))

    def entry(self, row: Mapping[str, Any]) -> Entry:
        """The reference of one row (as it comes, or selected): its rest digest and its tolerance
        fields' values (those always count: `check` refuses a tolerance on a field that does not)."""
        values = {f: _value(row[f]) for f in self.names if f in row}
        return hashlib.sha256(encode_sorted(self._rest(row))).hexdigest()[:16], values

    def compare(self, old: Entry, new: Entry) -> ComparedToReference:
        was, now = old[1], new[1]
        moves: dict[str, int | float] = {}
        beyond: list[str] = []
        for f, amount in self.amounts.items():
            a, b = was.get(f, _ABSENT), now.get(f, _ABSENT)
            if type(a) is type(b) and a == b:
                continue
            if type(a) is int and type(b) is int:  # the usual numbers: exact in integers
                move: int | Decimal | None = abs(b - a)
                last: Any = a
            else:
                last = exact(a) if type(a) in _NUMBERS else a  # type: ignore[arg-type]
                move = _move(last, b)
            if move is None or not amount.allows(move, last):
                beyond.append(f)
            else:
                moves[f] = move if isinstance(move, int) else _shown(move)
        return ComparedToReference(old[0] == new[0], moves, frozenset(beyond))

    def flags(self, changed: Iterable[str]) -> dict[str, str]:
        """The attributes a forward carries for the listed fields in `changed`."""
        wanted = set(changed)
        return {CHANGED_PREFIX + f: "true" for f in self.listed if f in wanted}


def largest(into: dict[str, int | float], moves: Mapping[str, int | float]) -> None:
    """Keep the largest move per field across rows."""
    for f, m in moves.items():
        if m > into.get(f, -1):
            into[f] = m


_ABSENT = object()
_NUMBERS = (int, float)


def _value(v: Any) -> Value:
    t = type(v)
    if t is int or t is float:
        return v  # type: ignore[no-any-return]
    # anything else (a number beyond double range too: a Decimal, written as a JSON number) by digest
    return "=" + hashlib.sha256(encode_sorted(v)).hexdigest()[:16]


def _move(last: object, b: object) -> Decimal | None:
    """|b - last| (`last` already a decimal, `exact`), exactly, when both are numbers (not
    booleans), else None: compared exactly. A fraction is the decimal its canonical text writes."""
    if type(last) is not Decimal or type(b) not in _NUMBERS:
        return None
    try:
        return EXACT.subtract(exact(b), last).copy_abs()  # type: ignore[arg-type]
    except DecimalException:  # pragma: no cover - exact operands never round
        return None


def _shown(move: Decimal) -> int | float:
    """A move as the record shows it: an integer when it is one, else the nearest double."""
    return int(move) if move == move.to_integral_value() else float(move)
