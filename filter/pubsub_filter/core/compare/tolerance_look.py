"""The tolerance's part of a decision (`pubsub_filter.core.engine.judge`): the second look that may suppress a
change, and what a forward stores as the next reference and flags as changed. Pure, no I/O.

Only a message the table calls a change ("content changed": the destination holds the last
forward, and this content is other) gets the second look; a forward that cannot know what the
destination holds flags every listed field, and stores its values as the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pubsub_filter.core.compare import fields, forwarded_rows, rows
from pubsub_filter.core.compare.fingerprint import NOT_JSON, TypedRows
from pubsub_filter.core.compare.routes import Reading, RouteRules
from pubsub_filter.core.compare.tolerance import Entry, Reference, Tolerance, attach, largest
from pubsub_filter.core.model import KeyState

Moves = dict[str, int | float]

_TOO_LARGE = rows.TOLERANCE_UNKEPT
_UNMATCHED = "rows not matched by key: a row is not an object, or rows share a key"
_NO_ROW_STATE = "not kept: no reference without the row state (rows_state)"
#: A state with no field checksums (`fields.decode` reads none), for a reference alone: the
#: whole payload's field state did not fit (`fields.Now.blob`), its tolerance reference may.
_NO_FIELDS = b"[[],{},{}]"


@dataclass(frozen=True)
class Look:
    """The second look: the moves, when they are all within tolerance (else None), and on a rows
    route the row digests it computed (a forward then stores them rather than digest again)."""

    moves: Moves | None
    digests: rows.RowDigests | None = None
    typed: TypedRows | None = None  # the rows it read (the fingerprint's, or decoded once: `typed_rows`)


_NOTHING = Look(None)


def within(
    rules: RouteRules,
    tol: Tolerance,
    data: bytes,
    state: KeyState,
    reading: Reading,
    payload: Any,
    typed: TypedRows | None,
) -> Look:
    """The largest move per tolerance field when `data` differs from the last forward only by
    moves within tolerance; no moves when it differs otherwise, or there is no reference to tell.

    `reading`: `state`'s row or field state as the decision reads it; `typed`: the rows the
    fingerprint decoded (`Scheme.read`), None to decode them here when needed."""
    reference = reading.reference()
    if reference is None:
        return _NOTHING
    if not rules.tracks_rows:
        old = reference.rows.get(fields.PAYLOAD)
        if old is None or type(payload) is not dict:
            return _NOTHING
        compared = tol.compare(old, tol.entry(payload))
        return Look(compared.moves if compared.within else None)
    if typed is None:
        typed = rules.typed_rows(data)
    forwarded = rules.forwarded_rows(state.rows)
    if forwarded is not None and typed is not None:
        moved = forwarded_rows.moved(forwarded, typed)
        if moved is not None:
            # the rows that differ from the last forward's, found without digesting every row
            return Look(_moves(tol, reference, [(k, typed.as_dict(r)) for k, r in moved]), None, typed)
    before = rows.decode(state.rows)
    if before is None or fields.PAYLOAD in before.raw:
        return _NOTHING
    digests = rules.row_digests(data, before, typed)
    if digests is None:
        return _NOTHING
    look = Look(None, digests, typed)
    diff = rows.diff(before, digests)
    if diff.added or diff.removed or not diff.changed:
        return look  # a row came or went, or the change is outside the row digests
    found = rows_by_key(rules, tol, digests, typed, payload, diff.changed)
    if found is None:
        return look
    return Look(_moves(tol, reference, [(k, found[k]) for k in diff.changed]), digests, typed)


def _moves(tol: Tolerance, reference: Reference, changed: list[tuple[str, dict[str, Any]]]) -> Moves | None:
    """The largest move per field when every changed row moved only within tolerance of its
    reference; None when one did not, one has no reference, or no row changed."""
    moves: Moves = {}
    for key, row in changed:
        old = reference.rows.get(key)
        if old is None:
            return None
        compared = tol.compare(old, tol.entry(row))
        if not compared.within:
            return None
        largest(moves, compared.moves)
    return moves if changed else None


def rows_by_key(
    rules: RouteRules,
    tol: Tolerance,
    digests: rows.RowDigests,
    typed: TypedRows | None,
    payload: Any,
    wanted: list[str] | None = None,
) -> dict[str, dict[str, Any]] | None:
    """The rows `wanted` (all: None), by row key; None when a row is not
    an object or two rows share a key (then no row has a reference of its own)."""
    if typed is not None and type(digests) is rows.ComparedDigests and len(digests) == len(typed.rows):
        # the typed digests are keyed in row order, one per row (`rules.row_digests`)
        by_key = dict(zip(digests, typed.rows, strict=True))
        keys = wanted if wanted is not None else list(by_key)
        return {k: typed.as_dict(by_key[k]) for k in keys}
    route = rules.route
    if payload is NOT_JSON or route.rows is None:
        return None
    found = route.rows.resolve(payload, {})
    if not isinstance(found, list):
        return None
    out: dict[str, dict[str, Any]] = {}
    row_key = tuple(route.row_key)
    for row in found:
        if type(row) is not dict:
            return None
        key = rows.row_key_of(row, row_key)
        if key in out:
            return None
        out[key] = row
    return out


@dataclass(frozen=True)
class ForwardPlan:
    """What a forward on a tolerance route stores and flags."""

    blob: bytes | None  # the row state with the new reference after it
    flags: dict[str, str]
    within_rows: dict[str, Moves] = field(default_factory=dict)  # rows changed only within tolerance
    unkept: str | None = None  # why no reference was kept (the next change is then forwarded)
    reference: Reference | None = None  # the reference at the end of `blob` (`routes.Kept`)


def whole_forward(
    rules: RouteRules,
    tol: Tolerance,
    blob: bytes | None,
    elements: int,
    payload: dict[str, Any],
    stored: Reading | None,
    known: bool,
    changed_all: list[str] | None,
) -> ForwardPlan:
    """A whole-payload forward: the payload's reference, and the flags (all, unless `known`).
    `stored`: the key's stored state as the decision reads it, None for a new key."""
    entry = tol.entry(payload)
    kept = Reference({fields.PAYLOAD: entry})
    # no field state (past the state limit): the reference alone, which is small, so that the
    # tolerance still applies to the next change
    new_blob = attach(blob or _NO_FIELDS, kept, elements if blob else 3, rows.MAX_STORED_BYTES)
    reference = kept if new_blob is not None else None  # the next decision for the key reads it back
    unkept = None if new_blob is not None else _TOO_LARGE
    # kept or not, the state is stored: without a reference, the next change is forwarded
    new_blob = new_blob or blob
    if not known or stored is None:
        return ForwardPlan(new_blob, dict(tol.every_flag), unkept=unkept, reference=reference)
    before = stored.reference()
    old = before.rows.get(fields.PAYLOAD) if before is not None else None
    if changed_all is None:
        # no field checksums to say what changed: the reference still says whether anything but
        # the tolerance fields did (its rest digest), and which of those moved beyond tolerance
        if old is None:
            return ForwardPlan(new_blob, dict(tol.every_flag), unkept=unkept, reference=reference)
        compared = tol.compare(old, entry)
        rest = set() if compared.same_rest else {f for f in tol.listed if f not in tol.names}
        return ForwardPlan(new_blob, tol.flags(rest | compared.beyond), unkept=unkept, reference=reference)
    changed = set(changed_all)
    if old is not None:
        beyond = tol.compare(old, entry).beyond
        changed = {f for f in changed if f not in tol.names} | beyond
    return ForwardPlan(new_blob, tol.flags(changed), unkept=unkept, reference=reference)


def rows_forward(
    rules: RouteRules,
    tol: Tolerance,
    blob: bytes | None,
    digests: rows.RowDigests,
    typed: TypedRows | None,
    payload: Any,
    stored: Reading | None,
    diff: rows.RowDiff | None,
    known: bool,
    partial: bool = False,
) -> ForwardPlan:
    """A rows forward: each row's reference (a row changed only within tolerance keeps its own:
    on `rows_mode: changed` it is not sent), and the flags: a field changed in any row beyond
    its tolerance, every field when a row came or went (or nothing says what changed).

    `stored`: the key's stored state as the decision reads it, None for a new key.
    `partial`: only the rows that changed beyond tolerance are sent (`rows_mode: changed`)."""
    reference = stored.reference() if stored is not None and diff is not None else None
    if blob is None:
        # the row state passed the state limit (`rows.encode`): no reference can ride on it. With
        # no reference kept before either, nothing was held back from the last forward: the
        # digests (when compared with a stored state) say which fields changed; else every flag.
        flags = flags_of(tol, known, diff, _fields_of(diff)) if reference is None else dict(tol.every_flag)
        return ForwardPlan(None, flags, unkept=_NO_ROW_STATE if tol.amounts else None)
    fresh = None if reference is None or diff is None else [*diff.added, *diff.changed]
    found = rows_by_key(rules, tol, digests, typed, payload, fresh)
    if found is None:
        return ForwardPlan(blob, dict(tol.every_flag), unkept=_UNMATCHED)
    entries: dict[str, Entry] = {}
    changed: set[str] = set()
    within_rows: dict[str, Moves] = {}
    for key in digests:
        old = reference.rows.get(key) if reference is not None else None
        if key not in found:  # unchanged since the last forward
            if old is None:
                return rows_forward(rules, tol, blob, digests, typed, payload, None, None, False)
            entries[key] = old
            continue
        entries[key] = new = tol.entry(found[key])
        if old is not None and diff is not None and key in diff.fields:
            compared = tol.compare(old, new)
            changed |= {f for f in diff.fields[key] if f not in tol.names} | compared.beyond
            if compared.within and known and partial:
                within_rows[key] = compared.moves
                entries[key] = old  # kept, if the row is not sent (`rows_mode: changed`; see `judge`)
    if reference is None:
        # no reference was kept with the last forward: nothing was held back from it, so the row
        # digests alone say which fields changed since (a tolerance field that moved at all too)
        changed = _fields_of(diff)
    kept = Reference(entries)
    new_blob = attach(blob, kept, 2, rows.MAX_STORED_BYTES)
    if new_blob is None:
        # no reference kept: the next change is forwarded, so no row is held back
        return ForwardPlan(blob, flags_of(tol, known, diff, changed), unkept=_TOO_LARGE)
    return ForwardPlan(new_blob, flags_of(tol, known, diff, changed), within_rows, reference=kept)


def _fields_of(diff: rows.RowDiff | None) -> set[str]:
    """Every field the row digests found changed, in any row."""
    return {f for names in diff.fields.values() for f in names} if diff is not None else set()


def flags_of(tol: Tolerance, known: bool, diff: rows.RowDiff | None, changed: set[str]) -> dict[str, str]:
    """The flags of `changed`; every flag when what changed is not known field by field (the
    destination's content unknown, no row diff, a row added or removed, or no row digest changed)."""
    whole = not known or diff is None or bool(diff.added or diff.removed) or not diff.changed
    return dict(tol.every_flag) if whole else tol.flags(changed)


def sent_diff(diff: rows.RowDiff, within_rows: Mapping[str, Moves]) -> rows.RowDiff:
    """`diff` less the rows changed only within tolerance: what a `rows_mode: changed` forward sends."""
    return rows.RowDiff(
        added=diff.added,
        changed=[k for k in diff.changed if k not in within_rows],
        removed=diff.removed,
        fields=diff.fields,
        total=diff.total,
    )
