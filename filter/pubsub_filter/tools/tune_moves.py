"""`tune` on numbers: how far a field moves between forwards, and what a tolerance would have held back.

What it reads: a whole-payload forward whose content changed records `fields_moved`, the
numbers that changed, as [value at the last forward, value now] (`pubsub_filter.core.engine.judge`). Row
routes record no values (a row's fields are kept as checksums): for them `tune` says so
and gives no distribution and no what-if.

The what-if (`--tolerance FIELD=AMOUNT`), per key in time order, as the filter would decide:
the reference is the value of the last forward the what-if keeps (at first, the value the
first recorded move starts from); a forward whose content changed, and whose counted changes
are all tolerance fields that moved within their amount of the reference, would have been
suppressed, and the reference stays; any other forward moves the reference to its values. A
change the record has no values for (a number that became a string, a field past the listed
32) is a change. Decisions that were not forwards stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pubsub_filter.core.config.amounts import Amount, parse_amount
from pubsub_filter.core.ports import DecisionRow


@dataclass(frozen=True)
class MoveStats:
    """How far one field moved, over the forwards in which it changed with numbers both times."""

    name: str
    forwards: int
    alone: int  # of those, forwards in which it was the only change
    p50: float
    p90: float
    max: float
    p50_relative: float | None  # percent of the value it moved from (None: it moved from 0)


def parse_tolerances(given: Iterable[str]) -> dict[str, Amount]:
    """`FIELD=AMOUNT` each (AMOUNT a number or `N%`); ValueError in the user's words."""
    out: dict[str, Amount] = {}
    for item in given:
        name, sep, amount = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{item!r} is not FIELD=AMOUNT (e.g. price=12 or total=3%)")
        out[name] = parse_amount(_number(amount))
    return out


def _number(text: str) -> Any:
    try:
        value = float(text)
    except ValueError:
        return text  # a percentage, or not an amount: `parse_amount` says which
    return int(value) if value.is_integer() else value


def moved(row: DecisionRow) -> Mapping[str, Any]:
    found = row["extra"].get("fields_moved")
    return found if isinstance(found, dict) else {}


def move_stats(rows: Iterable[DecisionRow], content_changed: str) -> tuple[MoveStats, ...]:
    """Per numeric field, the distribution of its moves between forwards (largest share first)."""
    moves: dict[str, list[tuple[float, float]]] = {}
    alone: dict[str, int] = {}
    for row in rows:
        if row["decision"] != "forwarded" or row["reason"] != content_changed:
            continue
        found = moved(row)
        changed = row["extra"].get("fields_changed")
        for name, pair in found.items():
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, (int, float)) for v in pair)):
                continue
            moves.setdefault(name, []).append((abs(pair[1] - pair[0]), abs(pair[0])))
            if changed == [name]:
                alone[name] = alone.get(name, 0) + 1
    out = []
    for name, pairs in moves.items():
        sizes = sorted(m for m, _ in pairs)
        relative = sorted(100.0 * m / base for m, base in pairs if base)
        out.append(
            MoveStats(
                name=name,
                forwards=len(sizes),
                alone=alone.get(name, 0),
                p50=_at(sizes, 0.5),
                p90=_at(sizes, 0.9),
                max=sizes[-1],
                p50_relative=round(_at(relative, 0.5), 2) if relative else None,
            )
        )
    return tuple(sorted(out, key=lambda s: (-s.forwards, s.name)))


def _at(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values`: the nearest rank."""
    return values[min(len(values) - 1, max(0, round(q * len(values) + 0.5) - 1))]


class ToleranceWhatIf:
    """The references a tolerance would have kept, key by key, over the records in time order."""

    def __init__(self, amounts: Mapping[str, Amount]):
        self.amounts = amounts
        self.current: dict[tuple[str | None, str], float] = {}  # the value at the last actual forward
        self.reference: dict[tuple[str | None, str], float] = {}  # the value at the last forward kept

    def observe(self, row: DecisionRow) -> None:
        """An actual forward: its numbers are the key's current values."""
        for name, pair in moved(row).items():
            if name in self.amounts and isinstance(pair, list) and len(pair) == 2:
                self.current[(row["key"], name)] = pair[1]

    def holds_back(self, row: DecisionRow, changes: set[str]) -> bool:
        """Whether a forward whose counted changes are `changes` moved only within tolerance."""
        if not changes or not changes <= self.amounts.keys():
            return False
        found = moved(row)
        for name in changes:
            pair = found.get(name)
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, (int, float)) for v in pair)):
                return False
            reference = self.reference.get((row["key"], name))
            if reference is None:
                reference = pair[0]
            if not self.amounts[name].allows(abs(pair[1] - reference), reference):
                return False
        return True

    def forwarded(self, row: DecisionRow, content_changed: bool) -> None:
        """The what-if forwards this one: the destination then holds its values. After any other
        forward (a new key, a window, ...) the values are not known: the next move starts from
        the value it records."""
        key = row["key"]
        for name in self.amounts:
            if not content_changed:
                self.current.pop((key, name), None)
                self.reference.pop((key, name), None)
            elif (key, name) in self.current:
                self.reference[(key, name)] = self.current[(key, name)]


def values_recorded(rows: Iterable[DecisionRow]) -> bool:
    """False for a row route's records (`rows_total` in them): those record no values."""
    return not any("rows_total" in row["extra"] for row in rows)
