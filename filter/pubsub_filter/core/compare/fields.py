"""Field-level state of a whole-payload route: which top-level fields changed. Pure, no I/O.

A route without `rows` decides on the payload as a whole, so its fingerprint says *that* the
content changed, not *where*. For `pubsub-filter tune` (`pubsub_filter.tools.tune`) a forward also
stores, in the state's `rows` blob, the payload as one row keyed by nothing (the key `""`,
which no row key can be: those are JSON lists): one 32-bit checksum per top-level field,
selected or not, in the row state's columnar layout (`pubsub_filter.core.compare.rows`), plus the values of
the selected fields that read as a clock (numbers, ISO 8601 timestamps). The next decision
for the key compares against it:

* a forward records `fields_changed` (the selected fields that changed) and
  `fields_increased` (those whose clock value grew);
* a suppression, on a route that leaves fields out, records `excluded_changed` (the fields
  outside the selection that changed).

Each list holds at most `MAX_NAMED` names, sorted; `*_more` counts the rest. A state written
before this feature (or too large to keep: `rows.MAX_STORED_BYTES`) has no field checksums: the forward then records
`fields_changed: null`, "unknown", and tune counts it as not evaluable.

Cost: the payload is the one the fingerprint decoded (the engine hands it to `judge.decide`),
never decoded again. A forward pays a checksum per top-level field, and keeps the state it
stores decoded (`Now.stored`, `RouteRules.keep_fields_state`) with the scalar values of the
fields outside the selection: the suppressions after it decode nothing and compare those
fields by value (a checksum each only where no value was kept: state another process stored).
`bench/fields.py` measures it against the same route with tracking off.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from itertools import compress
from operator import ne as _ne
from typing import Any

import msgspec

from pubsub_filter.core.compare import rows
from pubsub_filter.core.config.schema import Route

#: How many field names a decision record lists (the count of the rest is always there).
MAX_NAMED = 32
#: The payload's row key in the stored blob: never a row key (those are JSON lists).
PAYLOAD = ""

_encode = msgspec.json.Encoder(order="sorted", decimal_format="number").encode  # `canonical.sorted_encoder`
_encode_stored = msgspec.json.Encoder().encode
_crc32 = zlib.crc32
_MISSING = "-" * 8


class _StoredFieldState(msgspec.Struct, array_like=True, omit_defaults=True):
    """The row state's layout (`pubsub_filter.core.compare.rows._StoredRowState`), with the clock values after it:
    a reader of the row layout reads this too (trailing elements are ignored)."""

    fields: list[str]
    rows: dict[str, tuple[str, str]]
    clocks: dict[str, float | str] = {}


_decode = msgspec.json.Decoder(_StoredFieldState).decode


class Before:
    """The last forward's field checksums (packed, in the order of `names`) and clock values, as stored."""

    __slots__ = ("_by_name", "clocks", "crcs", "names", "packed", "values")

    def __init__(
        self,
        names: list[str],
        packed: str,
        clocks: dict[str, float | str],
        crcs: tuple[int, ...] | None = None,
        values: dict[str, Any] | None = None,
    ):
        self.names = names
        self.packed = packed
        self.clocks = clocks
        #: values of the fields outside the selection, as the forward had them (`kept_values`):
        #: only in the process that forwarded (the blob holds checksums)
        self.values = values
        #: the checksums as numbers in the order of `names` (None: the packed text is not one
        #: checksum per name: a field marked missing, or not ours)
        self.crcs = crcs if crcs is not None else _unpack(packed, len(names))
        self._by_name: dict[str, int] | None = None

    def by_name(self) -> dict[str, int]:
        """The checksums by name (what a suppression looks its excluded fields up in): built on
        the first suppression that asks, then kept with this state (a route keeps each stored
        state decoded, `routes.Reading.fields_state`)."""
        if self._by_name is None:
            crcs = self.crcs
            if crcs is not None:
                self._by_name = dict(zip(self.names, crcs, strict=True))
            else:
                self._by_name = {n: int(c, 16) for n, c in self.as_dict().items() if _is_hex(c)}
        return self._by_name

    def as_dict(self) -> dict[str, str]:
        p = self.packed
        return {n: p[i * 8 : i * 8 + 8] for i, n in enumerate(self.names) if p[i * 8 : i * 8 + 8] != _MISSING}


def _unpack(packed: str, n: int) -> tuple[int, ...] | None:
    if len(packed) != 8 * n:
        return None
    try:
        return _struct(n).unpack(bytes.fromhex(packed))
    except ValueError:  # not hex: a field marked missing (row state's layout)
        return None


def _is_hex(c: str) -> bool:
    try:
        int(c, 16)
    except ValueError:
        return False
    return len(c) == 8


_structs: dict[int, struct.Struct] = {}


def _struct(n: int) -> struct.Struct:
    """n big-endian 32-bit numbers: the packed checksums' layout (`f"{crc:08x}"` each, as bytes)."""
    s = _structs.get(n)
    if s is None:
        s = _structs[n] = struct.Struct(f">{n}I")
    return s


class Now:
    """A forward's payload, field by field: names sorted, checksums packed in that order, clock values."""

    __slots__ = ("changed_all", "clocks", "crcs", "names", "packed")

    def __init__(self, payload: Mapping[str, Any], counts: Callable[[str], bool] | None, before: Before | None):
        self.names = names = sorted(payload)
        self.crcs = crcs = list(map(_crc32, map(_encode, map(payload.__getitem__, names))))
        self.packed = packed = _struct(len(crcs)).pack(*crcs).hex()  # what f"{crc:08x}" each gives, in one call
        # Clock values: those of the last forward carry over (a field that did not change has
        # the same value); only the fields that changed are looked at, usually one or two.
        self.changed_all: list[str] | None  # every field that changed, selected or not (None: nothing to compare)
        if before is None:
            self.changed_all, looked_at, self.clocks = None, names, {}
        else:
            self.changed_all = looked_at = _changed(names, crcs, packed, before)
            self.clocks = {k: v for k, v in before.clocks.items() if k in payload}  # a copy: `before` is shared
        clocks = self.clocks
        for n in looked_at:
            c = clock_value(payload.get(n)) if counts is None or counts(n) else None
            if c is None:
                clocks.pop(n, None)
            else:
                clocks[n] = c

    def blob(self, fingerprint: str) -> bytes | None:
        """What a forward stores; None past the state limit (`rows.MAX_STORED_BYTES`, the row
        state's: one limit on the stored state, whatever it holds; ~60,000 fields of 6 characters)."""
        blob = _encode_stored(_StoredFieldState(self.names, {PAYLOAD: (fingerprint[-16:], self.packed)}, self.clocks))
        return blob if len(blob) <= rows.MAX_STORED_BYTES else None

    def stored(self, values: dict[str, Any] | None = None) -> Before:
        """What `decode` gives for `blob()`, without decoding it, and `values` (`kept_values`):
        the next decision for the key reads that blob back (`RouteRules.keep_fields_state`)."""
        return Before(self.names, self.packed, self.clocks, tuple(self.crcs), values)


def _changed(names: list[str], crcs: list[int], packed: str, before: Before) -> list[str]:
    """The fields whose checksum differs from the last forward's, or that came or went (sorted)."""
    if before.names == names:
        if before.packed == packed:
            return []
        old = before.crcs
        if old is not None:
            return list(compress(names, map(_ne, crcs, old)))  # in C: these are most of a forward's fields
    was = before.by_name()
    now = dict(zip(names, crcs, strict=True))
    return sorted(k for k in now.keys() | before.names if now.get(k) != was.get(k))


def selector(route: Route) -> Callable[[str], bool] | None:
    """Whether a top-level field counts for the route; None when every field does."""
    exclude = frozenset(route.exclude)
    include = frozenset(k for k in route.include if k not in exclude)
    if include:
        return include.__contains__
    if exclude:
        return lambda name: name not in exclude
    return None


def clock_value(value: Any) -> float | str | None:
    """The value as a point on a line, if it reads as one: a number, or a string shaped like an
    ISO 8601 date or time (kept as the string: one producer writes them one way, and then they
    compare as text as they compare as times; no parse on the forward path)."""
    t = type(value)
    if t is float:
        return value if math.isfinite(value) else None
    if t is int:
        return float(value) if -_FLOAT_INT <= value <= _FLOAT_INT else None  # beyond: no float to compare
    if t is str and 10 <= len(value) <= 40 and value[4:5] == "-" and value[7:8] == "-" and value[:4].isdigit():
        return str(value)
    return None


_CLOCKISH = frozenset({int, float, str})
_FLOAT_INT = 2**1023


def decode(blob: bytes | None) -> Before | None:
    """The stored field state, or None when the blob holds none (no blob, rows, or unreadable)."""
    if not blob:
        return None
    try:
        stored = _decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    row = stored.rows.get(PAYLOAD)
    if row is None or len(stored.rows) != 1:
        return None
    return Before(stored.fields, row[1], stored.clocks)


def named(key: str, names: list[str], into: dict[str, Any]) -> None:
    """`names` under `key`, at most `MAX_NAMED` of them, the count of the rest under `key_more`."""
    into[key] = names[:MAX_NAMED]
    if len(names) > MAX_NAMED:
        into[f"{key}_more"] = len(names) - MAX_NAMED


def excluded_changed(
    payload: Mapping[str, Any], before: Before, unselected: tuple[str, ...] | None, counts: Callable[[str], bool]
) -> list[str]:
    """The fields outside the selection that changed. `unselected`, the route's `exclude` when
    it has no `include`: only those are looked at, not every field. A field whose value the
    last forward kept (`Before.values`: this process forwarded it) is compared by value, else
    by checksum."""
    if unselected is not None:
        names: Iterable[str] = unselected
    else:
        names = {k for k in payload if not counts(k)} | {k for k in before.names if not counts(k)}
    kept = before.values
    was: dict[str, int] | None = None
    out = []
    for n in names:
        v = payload.get(n, _ABSENT)
        t = type(v)
        if kept is not None and t in _SCALARS and type(k := kept.get(n, _ABSENT)) is t:
            if v != k:  # same scalar type: equal values ⇔ equal canonical text (integral floats are ints)
                out.append(n)
            continue
        if was is None:
            was = before.by_name()
        if (None if v is _ABSENT else _crc32(_encode(v))) != was.get(n):
            out.append(n)
    if len(out) > 1:
        out.sort()
    return out


def kept_values(payload: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The values of `names` a suppression can compare as they are: scalars (strings up to
    `MAX_KEPT_STR` characters), at most `MAX_KEPT` of them."""
    out: dict[str, Any] = {}
    for n in names:
        v = payload.get(n, _ABSENT)
        t = type(v)
        if t in _SCALARS and (t is not str or len(v) <= MAX_KEPT_STR):
            out[n] = v
            if len(out) >= MAX_KEPT:
                break
    return out


#: Kept values (`kept_values`): how many a forward keeps, and the longest string kept.
MAX_KEPT = 32
MAX_KEPT_STR = 256
_SCALARS = frozenset({str, int, float, bool, type(None)})
_ABSENT = object()
