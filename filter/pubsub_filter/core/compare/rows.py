"""Row-level state: what changed inside a payload, row by row and field by field. Pure, no I/O.

For a route with `rows` and `row_key`, every forward stores one short digest per row: a
64-bit content fingerprint (to decide which rows changed) and a 32-bit checksum per
field (to say *which fields* changed, for `explain` and the decision record). The
stored form is one compact JSON blob, so it costs one field in the commit that the
forward path writes anyway, and nothing on the suppress path.

Size: a row costs its key (as JSON) plus ~24 bytes plus 8 per field; 450 injury rows
with 7 included fields take ~54 KB, so Firestore's 1 MiB document limit is reached near
8,000 rows of that shape. Above `MAX_STORED_BYTES` the row state is not stored (the route falls back
to whole-payload decisions for that key, and the record says so: `ROWS_UNKEPT`).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from operator import methodcaller
from typing import Any, cast

import msgspec

from pubsub_filter.core.compare.canonical import encode_sorted
from pubsub_filter.core.compare.fingerprint import TypedRows
from pubsub_filter.core.config.schema import Route

#: Keep well under Firestore's 1 MiB document limit, leaving room for the rest of the state.
MAX_STORED_BYTES = 900_000
#: How many changed rows a decision record names (the counts are always complete).
EXPLAIN_ROWS = 10

#: What a record says when a forward's state passes `MAX_STORED_BYTES` (as the record's
#: `rows_state`, `fields_state` or `tolerance_state`): the limit, and what the key's next
#: decision falls back to. One limit, on the whole state blob, for every kind of state.
STATE_LIMIT = f"past the state limit of {MAX_STORED_BYTES:,} bytes"
ROWS_UNKEPT = (
    f"too large to keep ({STATE_LIMIT}): the next message of this key is compared as a whole "
    "payload (no row diff, every changed_attributes field flagged, no tolerance)"
)
FIELDS_UNKEPT = (
    f"too large to keep ({STATE_LIMIT}): the next forward of this key cannot say which fields "
    "changed (fields_changed: null; changed_attributes flagged unless the tolerance reference says)"
)
TOLERANCE_UNKEPT = (
    f"too large to keep ({STATE_LIMIT}): the next change of this key is forwarded, not compared within tolerance"
)

_encode = msgspec.json.Encoder(order="sorted", decimal_format="number").encode  # `canonical.sorted_encoder`
_MISSING_FIELD = "-" * 8
_hexdigest = methodcaller("hexdigest")


class _StoredRowState(msgspec.Struct, array_like=True):
    """Columnar on disk: field names once, then per row its fingerprint and fixed-width checksums."""

    fields: list[str]
    rows: dict[str, tuple[str, str]]


_decode_blob = msgspec.json.Decoder(_StoredRowState).decode


class Packed(Mapping[str, str]):
    """One stored row's field checksums, unpacked only when read.

    A forward reads the whole stored state but looks inside a row only when the row
    changed; unchanged rows are written back as they were read (see `encode`).
    """

    __slots__ = ("_unpacked", "names", "packed")

    def __init__(self, names: tuple[str, ...], packed: str):
        self.names = names
        self.packed = packed
        self._unpacked: dict[str, str] | None = None

    def _fields(self) -> dict[str, str]:
        if self._unpacked is None:
            p = self.packed
            checksums = (p[i * 8 : i * 8 + 8] for i in range(len(self.names)))
            self._unpacked = {n: c for n, c in zip(self.names, checksums, strict=True) if c != _MISSING_FIELD}
        return self._unpacked

    def __getitem__(self, name: str) -> str:
        return self._fields()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields())

    def __len__(self) -> int:
        return len(self._fields())

    def __repr__(self) -> str:
        return repr(self._fields())


RowDigests = Mapping[str, tuple[str, Mapping[str, str]]]  # row key → (row fingerprint, {field: checksum})
Before = Mapping[str, tuple[str, Mapping[str, str]]]  # the previous forward's digests, usually `Stored`


def row_key_of(row: Mapping[str, Any], row_key: tuple[str, ...]) -> str:
    """The row's identity as a JSON list of its key values: readable, typed, reversible (for tombstones)."""
    return _encode([row.get(k) for k in row_key]).decode()


def field_checksums(selected: Mapping[str, Any]) -> dict[str, str]:
    """A row's checksum per selected field: what says which fields of a changed row changed."""
    return {k: f"{zlib.crc32(_encode(v)):08x}" for k, v in selected.items()}


def digest_rows(route: Route, rows: list[Any], before: Before | None = None) -> RowDigests:
    """Digest every row that is an object: the selected fields only (include minus exclude).

    Rows that share a key are digested together, in canonical order, so a change to any of
    them changes that key's digest (keeping only the last would hide a change in the others).

    `before`, the previous forward's digests: a row whose fingerprint is the one stored
    keeps its stored field checksums (the same selected content gives the same checksums),
    so only new and changed rows pay a checksum per field. Same result as without it.
    """
    exclude = frozenset(route.exclude)
    include = tuple(k for k in route.include if k not in exclude)
    keys = tuple(route.row_key)
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if not isinstance(row, dict):
            continue
        selected = (
            {k: row[k] for k in include if k in row} if include else {k: v for k, v in row.items() if k not in exclude}
        )
        groups.setdefault(row_key_of(row, keys), []).append(selected)
    old = before or {}
    out: dict[str, tuple[str, Mapping[str, str]]] = {}
    for key, group in groups.items():
        if len(group) == 1:
            (selected,) = group
            fp = hashlib.sha256(_encode(selected)).hexdigest()[:16]
            stored = old.get(key)
            out[key] = (fp, stored[1] if stored is not None and stored[0] == fp else field_checksums(selected))
            continue
        group.sort(key=_encode)
        names = sorted({k for selected in group for k in selected})
        fields = {n: f"{zlib.crc32(_encode([s.get(n, _MISSING_FIELD) for s in group])):08x}" for n in names}
        out[key] = (hashlib.sha256(_encode(group)).hexdigest()[:16], fields)
    return out


class Memo:
    """The last forwarded document's rows, by their canonical content: (row key, fingerprint).

    Both are functions of the content alone (the key fields are among the selected ones on
    the fast path), so a row seen in the previous document is looked up by its bytes
    instead of paying a key encoding and a SHA-256 for it: a rescrape changes a few rows
    and repeats the rest. A lookup compares the whole content, so no producer can make a
    row borrow another row's digest. One document's rows are kept, replaced as a whole by
    the next forward's commit (`RouteRules.remember`; safe across threads); a miss costs what
    the digest always cost.
    """

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: dict[bytes, tuple[str, str]] = {}


def _key_and_fingerprint(typed: TypedRows, row: Any, content: bytes) -> tuple[str, str]:
    return typed.key_json(row).decode(), hashlib.sha256(content).hexdigest()[:16]


def digest_typed(typed: TypedRows, before: Before | None = None, memo: Memo | None = None) -> RowDigests | None:
    """`digest_rows` for rows the fingerprint's fast path decoded: the same digests, without
    building a dict per row (only new and changed rows are read field by field), and with
    `memo`, without a SHA-256 for rows the previous document had (read only: the digests carry
    the memo of these rows, `ComparedDigests.seen`, for the forward's commit to keep).

    None when two rows share a key: `digest_rows` digests those together.

    With no `before` (a new key, or a state whose rows were too many to keep), rows whose
    state is certainly over `MAX_STORED_BYTES` are not digested at all (`Unkept`): nothing
    would read the digests, as there is nothing to compare them with and they are not stored.
    """
    found = typed.rows
    if before is None and stored_size_at_least(typed) > MAX_STORED_BYTES:
        return Unkept()
    contents = list(map(typed.content_json, found))
    known = list(map(memo.seen.get, contents)) if memo is not None else [None] * len(found)
    pairs = (
        [k or _key_and_fingerprint(typed, r, c) for k, r, c in zip(known, found, contents, strict=True)]
        if None in known
        else cast(list[tuple[str, str]], known)
    )
    stored: Mapping[str, tuple[str, Any]] = before.raw if type(before) is Stored else (before or {})
    out = ComparedDigests(before)
    out.seen = dict(zip(contents, pairs, strict=True))
    raw, added, changed = out.raw, out.added, out.changed
    for (key, fp), row in zip(pairs, found, strict=True):
        was = stored.get(key)
        if was is not None and was[0] == fp:
            raw[key] = was  # as stored: (fingerprint, packed checksums, or a mapping of them)
        else:
            (added if was is None else changed).append(key)
            raw[key] = (fp, field_checksums(typed.as_dict(row)))
    return out if len(raw) == len(found) else None


class ComparedDigests(Mapping[str, tuple[str, Mapping[str, str]]]):
    """Digests that were compared with `against` as they were computed, row by row: the rows
    found `added` and `changed`, in order, so that `diff` against the same state need not
    look every row up again. An unchanged row is held as it was read (`raw`: its stored
    fingerprint and packed checksums), and `encode` writes it back as it was read. `seen`:
    these rows by their content, the `Memo.seen` a forward of them leaves."""

    __slots__ = ("added", "against", "changed", "names", "raw", "seen")

    def __init__(self, against: Before | None):
        self.against = against
        self.names: tuple[str, ...] = against.names if type(against) is Stored else ()
        self.raw: dict[str, tuple[str, Any]] = {}  # checksums packed in the layout `names`, or a mapping of them
        self.added: list[str] = []
        self.changed: list[str] = []
        self.seen: dict[bytes, tuple[str, str]] = {}

    def __getitem__(self, key: str) -> tuple[str, Mapping[str, str]]:
        fp, fields = self.raw[key]
        return (fp, Packed(self.names, fields)) if type(fields) is str else (fp, fields)

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def as_stored(self) -> _StoredRowState | None:
        """What `encode` writes, when the stored layout holds: the rows read as they were
        stored, only the added and changed ones packed. None when the layout changes (a row
        brings a field the layout lacks, or no kept row shows that every field is present)."""
        layout, fresh = self.names, [*self.added, *self.changed]
        if type(self.against) is not Stored or len(fresh) == len(self.raw) or list(layout) != sorted(set(layout)):
            return None
        columns = frozenset(layout)
        if not all(columns.issuperset(self.raw[k][1]) for k in fresh):
            return None
        # a kept row with every field present: the layout is exactly the fields present
        if next((p for _, p in self.raw.values() if type(p) is str and "-" not in p), None) is None:
            return None
        kept = dict(self.raw)
        for k in fresh:
            fp, fields = kept[k]
            kept[k] = (fp, "".join(fields.get(n, _MISSING_FIELD) for n in layout))
        return _StoredRowState(list(layout), kept)


class Unkept(dict[str, tuple[str, Mapping[str, str]]]):
    """The digests of rows whose state is over `MAX_STORED_BYTES`, left uncomputed: `encode` gives None."""


def stored_size_at_least(typed: TypedRows) -> int:
    """A lower bound on the bytes `encode` writes for these rows' digests, from their keys alone
    (no fingerprint, no checksum): exact when every row has every field. 0 when rows may share
    a key (those are digested together, and fewer rows are stored)."""
    found = typed.rows
    if not found:
        return 0
    keys = typed.keys(found)
    try:
        if len(set(keys)) != len(keys):
            return 0
    except TypeError:  # a key value that is a list or an object
        return 0
    n = len(keys)
    # `[` + every row's key JSON joined by `,` + `]`; stored as a JSON string, each key gains a
    # backslash per `"` and `\` in it (anything else msgspec escapes would only add bytes)
    every_key = encode_sorted(keys)
    key_bytes = len(every_key) - 2 - (n - 1) + every_key.count(b'"') + every_key.count(b"\\")
    names = sorted(typed.as_dict(found[0]))  # the stored field names include at least the first row's
    # [names,{"key":["<16>","<8 per field>"],...}]
    return len(_encode(names)) + 5 + key_bytes + n * (26 + 8 * len(names)) + n - 1


def encode(digests: RowDigests) -> bytes | None:
    """The row state to store, None over `MAX_STORED_BYTES`."""
    if type(digests) is Unkept:
        return None
    if type(digests) is ComparedDigests:
        stored = digests.as_stored()
        if stored is None:  # the layout changes: every row is packed again
            names = digests.names
            stored = _packed({k: (fp, Packed(names, f) if type(f) is str else f) for k, (fp, f) in digests.raw.items()})
    else:
        stored = _packed(digests)
    blob = msgspec.json.encode(stored)
    return blob if len(blob) <= MAX_STORED_BYTES else None


def _packed(digests: RowDigests) -> _StoredRowState:
    present: set[str] = set()
    complete: list[tuple[str, ...]] = []  # layouts of stored rows that have every field (no `-`): one, usually
    for _, fields in digests.values():
        if type(fields) is Packed and "-" not in fields.packed:
            if fields.names not in complete:  # the rows of one stored state share one tuple: an identity check
                complete.append(fields.names)
                present.update(fields.names)
        else:
            present.update(fields)
    names = sorted(present)
    columns = tuple(names)

    def pack(fields: Mapping[str, str]) -> str:
        return "".join(fields.get(n, _MISSING_FIELD) for n in names)

    packed = Packed
    return _StoredRowState(
        names,
        {
            # read in this very layout: written back unchanged
            k: (fp, f.packed if type(f) is packed and f.names == columns else pack(f))
            for k, (fp, f) in digests.items()
        },
    )


class Stored(Mapping[str, tuple[str, Mapping[str, str]]]):
    """The stored row state as read: one C-level decode, no Python object per row.

    A row reads as (fingerprint, its `Packed` checksums); `raw` holds them as stored
    (fingerprint, packed checksums in the layout `names`), for the loops that only compare
    fingerprints (`digest_typed`, `diff`).
    """

    __slots__ = ("names", "raw")

    def __init__(self, names: tuple[str, ...], raw: dict[str, tuple[str, str]]):
        self.names = names
        self.raw = raw

    def __getitem__(self, key: str) -> tuple[str, Mapping[str, str]]:
        fp, packed = self.raw[key]
        return fp, Packed(self.names, packed)

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def decode(blob: bytes | str | None) -> Stored | None:
    if not blob:
        return None
    stored = _decode_blob(blob)
    return Stored(tuple(stored.fields), stored.rows)


@dataclass
class RowDiff:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)  # changed row → the fields that changed
    total: int = 0

    @property
    def any(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def summary(self, limit: int = EXPLAIN_ROWS) -> dict[str, Any]:
        """What a decision record carries: complete counts, a bounded sample of which rows and fields."""
        out: dict[str, Any] = {
            "rows_total": self.total,
            "rows_added": len(self.added),
            "rows_changed": len(self.changed),
            "rows_removed": len(self.removed),
        }
        sample: list[dict[str, Any]] = [{"row": k, "fields": self.fields[k]} for k in self.changed[:limit]]
        sample += [{"row": k, "added": True} for k in self.added[: max(0, limit - len(sample))]]
        sample += [{"row": k, "removed": True} for k in self.removed[: max(0, limit - len(sample))]]
        if sample:
            out["changes"] = sample
        return out


def diff(old: Before, new: RowDigests) -> RowDiff:
    d = RowDiff(total=len(new))
    fingerprints = old.raw if type(old) is Stored else old  # read the stored rows only where they changed
    if type(new) is ComparedDigests and new.against is old:
        d.added, d.changed = list(new.added), list(new.changed)
    else:
        for key, (fp, _) in new.items():
            before = fingerprints.get(key)
            if before is None:
                d.added.append(key)
            elif before[0] != fp:
                d.changed.append(key)
    for key in d.changed:
        fields, old_fields = new[key][1], old[key][1]
        d.fields[key] = sorted({f for f in fields.keys() | old_fields.keys() if fields.get(f) != old_fields.get(f)})
    # every row not added was stored: as many as were stored means none was removed
    if len(new) - len(d.added) != len(fingerprints):
        d.removed = [k for k in fingerprints if k not in new]
    return d
