"""Field-level state of a whole-payload route: which top-level fields changed. Pure, no I/O.

A route without `rows` decides on the payload as a whole, so its fingerprint says *that* the
content changed, not *where*. For `pubsub-filter tune` (`filter.tools.tune`) a forward also
stores, in the state's `rows` blob, the payload as one row keyed by nothing (the key `""`,
which no row key can be: those are JSON lists): one 32-bit checksum per top-level field,
selected or not, in the row state's columnar layout (`filter.core.rows`), plus the values of
the selected fields that read as a clock (numbers, ISO 8601 timestamps). The next decision
for the key compares against it:

* a forward records `fields_changed` (the selected fields that changed) and
  `fields_increased` (those whose clock value grew);
* a suppression, on a route that leaves fields out, records `excluded_changed` (the fields
  outside the selection that changed).

Each list holds at most `MAX_NAMED` names, sorted; `*_more` counts the rest. A state written
before this feature (or too large to keep) has no field checksums: the forward then records
`fields_changed: null`, "unknown", and tune counts it as not evaluable.

Cost: the payload is the one the fingerprint decoded (`RouteRules.payload_of`); a forward
pays a checksum per top-level field, a suppression one per field outside the selection.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from itertools import compress, repeat
from operator import and_ as _and
from operator import eq as _eq
from operator import is_ as _is
from operator import not_ as _not
from typing import Any

import msgspec

from filter.core.config import Route

#: How many field names a decision record lists (the count of the rest is always there).
MAX_NAMED = 32
#: A payload with more top-level fields than this is not tracked field by field.
MAX_FIELDS = 512
#: The payload's row key in the stored blob: never a row key (those are JSON lists).
PAYLOAD = ""

_encode = msgspec.json.Encoder(order="sorted").encode
_encode_stored = msgspec.json.Encoder().encode
_crc32 = zlib.crc32
_MISSING = "-" * 8


class _Stored(msgspec.Struct, array_like=True, omit_defaults=True):
    """The row state's layout (`filter.core.rows._Stored`), with the clock values after it:
    a reader of the row layout reads this too (trailing elements are ignored)."""

    fields: list[str]
    rows: dict[str, tuple[str, str]]
    clocks: dict[str, float | str] = {}


_decode = msgspec.json.Decoder(_Stored).decode


class Before:
    """The last forward's field checksums (packed, in the order of `names`) and clock values, as stored."""

    __slots__ = ("_by_name", "clocks", "crcs", "names", "names_json", "order", "packed", "values")

    def __init__(
        self,
        names: list[str],
        packed: str,
        clocks: dict[str, float | str],
        crcs: tuple[int, ...] | None = None,
        kept: Kept | None = None,
    ):
        self.names = names
        self.packed = packed
        self.clocks = clocks
        # What only the process that forwarded knows (the blob holds checksums): the payload's
        # values by name (a small payload's), its own key order, and `names` as JSON.
        self.values, self.order, self.names_json = kept if kept is not None else (None, None, None)
        #: the checksums as numbers in the order of `names` (None: the packed text is not one
        #: checksum per name: a field marked missing, or not ours)
        self.crcs = crcs if crcs is not None else _unpack(packed, len(names))
        self._by_name: dict[str, int] | None = None

    def by_name(self) -> dict[str, int]:
        """The checksums by name (what a suppression looks its excluded fields up in): built on
        the first suppression that asks, then kept with this state (a route keeps each stored
        state decoded, `RouteRules.fields_before`)."""
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

    __slots__ = ("_names_json", "changed_all", "clocks", "crcs", "names", "order", "packed", "values")

    def __init__(self, payload: Mapping[str, Any], counts: Callable[[str], bool] | None, before: Before | None):
        self.order = order = list(payload)
        # the same fields in the same order as the last forward (one producer): sorted as then
        same_names = before is not None and before.order == order
        self.names = names = before.names if same_names and before is not None else sorted(order)
        self.values = values = list(map(payload.__getitem__, names))
        self._names_json = before.names_json if same_names and before is not None else None
        self.changed_all: list[str] | None  # every field that changed, selected or not (None: nothing to compare)
        if before is not None and same_names and before.values is not None and before.crcs is not None:
            self.crcs, self.changed_all = _by_value(names, values, before.values, before.crcs)
            self.packed = before.packed if not self.changed_all else _packed(self.crcs)
        else:
            self.crcs = crcs = list(map(_crc32, map(_encode, values)))
            self.packed = packed = _packed(crcs)
            self.changed_all = None if before is None else _changed(names, crcs, packed, before)
        # Clock values: those of the last forward carry over (a field that did not change has
        # the same value); only the fields that changed are looked at, usually one or two.
        looked_at: Iterable[str]
        if before is None or self.changed_all is None:
            looked_at, self.clocks = names, {}
        else:
            looked_at = self.changed_all
            self.clocks = {k: v for k, v in before.clocks.items() if k in payload}  # a copy: `before` is shared
        clocks = self.clocks
        for n in looked_at:
            c = clock_value(payload.get(n)) if counts is None or counts(n) else None
            if c is None:
                clocks.pop(n, None)
            else:
                clocks[n] = c

    def blob(self, fingerprint: str) -> bytes | None:
        """What a forward stores; None when the payload has too many fields to keep. Written as
        msgspec writes `_Stored` (the test suite holds them to it), the names' JSON reused."""
        if len(self.names) > MAX_FIELDS:
            return None
        if self._names_json is None:
            self._names_json = _encode_stored(self.names)
        clocks = b"," + _encode_stored(self.clocks) if self.clocks else b""
        ids = f',{{"":["{fingerprint[-16:]}","{self.packed}"]}}'.encode()  # hex digits: nothing to escape
        return b"".join((b"[", self._names_json, ids, clocks, b"]"))

    def stored(self, data_size: int | None = None) -> Before:
        """What `decode` gives for `blob()`, without decoding it: the next decision for the key
        reads that blob back (`RouteRules.keep_fields_state`). With the payload's values when it
        came in `data_size` bytes up to `MAX_KEPT_BYTES` (what a route keeps stays small)."""
        values = (
            dict(zip(self.names, self.values, strict=True))
            if data_size is not None and data_size <= MAX_KEPT_BYTES
            else None
        )
        return Before(self.names, self.packed, self.clocks, tuple(self.crcs), (values, self.order, self._names_json))


#: What `Now.stored` keeps beside the checksums: values by name, the payload's key order, the names' JSON.
Kept = tuple[dict[str, Any] | None, list[str] | None, bytes | None]

#: The largest payload (bytes of message data) whose values a forward keeps for the next decisions.
MAX_KEPT_BYTES = 2048


def _packed(crcs: list[int]) -> str:
    return _struct(len(crcs)).pack(*crcs).hex()  # what f"{crc:08x}" each gives, in one call


def _by_value(
    names: list[str], values: list[Any], kept: dict[str, Any], old: tuple[int, ...]
) -> tuple[list[int], list[str]]:
    """Checksums and changed fields against the last forward's values (same names, same order):
    a scalar of the same type and value has the same canonical text (integral floats are ints),
    so its checksum is the last one; only the others are encoded."""
    prev = list(map(kept.get, names, repeat(_ABSENT)))
    same = map(_and, map(_is, map(type, values), map(type, prev)), map(_in_scalars, map(type, values)))
    unchanged = map(_and, same, map(_eq, values, prev))
    crcs = list(old)
    changed = []
    for i in compress(range(len(names)), map(_not, unchanged)):
        c = _crc32(_encode(values[i]))
        if c != crcs[i]:
            crcs[i] = c
            changed.append(names[i])
    return crcs, changed


def _changed(names: list[str], crcs: list[int], packed: str, before: Before) -> list[str]:
    """The fields whose checksum differs from the last forward's, or that came or went (sorted)."""
    if before.names == names:
        if before.packed == packed:
            return []
        old = before.crcs
        if old is not None:
            return [n for n, c, was in zip(names, crcs, old, strict=True) if c != was]
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


_SCALARS = frozenset({str, int, float, bool, type(None)})
_in_scalars = _SCALARS.__contains__
_ABSENT = object()
