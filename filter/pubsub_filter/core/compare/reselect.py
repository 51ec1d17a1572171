"""A message judged against a last forward that another selection compared. Pure, no I/O.

The stored fingerprint covers what the old selection compared, so it says nothing of the new
one. The field checksums stored with that forward do: a whole-payload route's forward keeps a
32-bit checksum of every top-level field, compared or not (`pubsub_filter.core.compare.fields`), and a rows
route's keeps one per compared field of every row (`pubsub_filter.core.compare.rows`). So the message is
compared with the last forward field by field, on the fields the new selection compares:

* a field both selections compare that differs is a change: forwarded;
* a field only the new selection compares (a widening) is the operator's choice, the route's
  `new_fields`: `forward` (the default) forwards once, naming the field, since what the
  destination last saw of it is not known for a row (the row state keeps checksums of the
  compared fields only) and is not what it compared on a whole payload; `adopt` judges on the
  fields both compare and takes the new fields' values as they come with the next forward;
* nothing else differs: unchanged as the new selection sees it, so suppressed (narrowing:
  a field excluded, fewer included, fewer row fields).

What cannot be compared field by field is forwarded, its reason saying why: another scheme
than `canonical`, rows or row_key changed, a payload that is not an object, rows that share a
key or are not objects, a last forward whose field state was too large to keep. A changed key
is a new keyspace (`Change.key_changed`): decided as a new key.

Cost: nothing on the paths whose state was written under the route's selection (one string
comparison in `judge.decide`). Under another selection, until the key's next forward writes
the new one, each message pays a checksum per compared field (per row, on a rows route): what
a forward's field and row digests cost.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from pubsub_filter.core.compare import fields, rows
from pubsub_filter.core.compare.fingerprint import NOT_JSON, selector
from pubsub_filter.core.compare.selection import SELECTION_CHANGED, Change, Selection, parse
from pubsub_filter.core.model import Decision, KeyState

_encode = msgspec.json.Encoder(order="sorted").encode  # as `fields` checksums a field


@dataclass(frozen=True, slots=True)
class Look:
    """The message against the last forward, as the new selection compares it."""

    change: Change
    changed: list[str] = field(default_factory=list)  # fields both selections compare that changed
    new_fields: list[str] = field(default_factory=list)  # fields only the new selection compares, present
    rows_differ: bool = False  # rows added or removed
    why: str | None = None  # why it could not be compared field by field (then it is forwarded)

    def same(self, adopt: bool) -> bool:
        """Unchanged as the new selection sees it (under `adopt`: in the fields both compare)."""
        if self.why is not None or self.change.key_changed or self.changed or self.rows_differ:
            return False
        return adopt or not self.new_fields

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "selection": self.change.new.id,
            "selection_before": self.change.old.id,
            "selection_change": self.change.kind(),
        }
        if self.new_fields:
            fields.named("newly_compared", self.new_fields, out)
        if self.why is not None:
            out["selection_unjudged"] = self.why
        return out


def change_of(stored: str, now: Selection) -> Change | None:
    """The change from the selection stored with a forward to the route's, or None when it is
    the same one, or unreadable (a later version's): then judged as the route's, as state
    without one is."""
    if stored == now.text:
        return None
    old = parse(stored)
    return None if old is None or old.text == now.text else Change(old, now)


#: A look's memo key: (the old selection, the stored state, the message data).
LookKey = tuple[str, bytes, bytes]


class Looks(dict[LookKey, Look]):
    """Looks already taken, by (old selection, stored state, message data): a function of those
    alone, so a repeat of the same content against the same state (the usual message between a
    deploy and the key's next forward) costs two hashes, not a checksum per field and row. At
    most `MAX_LOOKS` entries or `MAX_LOOKS_BYTES` of keys, oldest out first. Filled after a
    decision, from the look it took (`RouteRules.keep_read`), never by `judge.decide`."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def keep(self, key: LookKey, look: Look) -> None:
        if key in self:
            return
        self.size += len(key[1]) + len(key[2])
        while self and (len(self) >= MAX_LOOKS or self.size > MAX_LOOKS_BYTES):
            old = next(iter(self))
            self.size -= len(old[1]) + len(old[2])
            del self[old]
        self[key] = look


MAX_LOOKS = 256
MAX_LOOKS_BYTES = 8 * 1024 * 1024


def look_key(change: Change, state: KeyState, data: bytes) -> LookKey:
    """The memo key of the look at `state` for `data` (`Looks`)."""
    return (change.old.text, state.rows or b"", data)


def look(
    change: Change,
    route_rows: bool,
    state: KeyState,
    data: bytes,
    payload: Any,
    rules: Any,
    fields_state: Callable[[], fields.Before | None],
) -> Look:
    """Compare the message (`data`, `payload` as the fingerprint decoded it) with the forward
    that stored `state`, on the fields the new selection compares. `rules`: the route's
    `RouteRules`; `fields_state`: the stored field state, decoded (`routes.Reading`). The
    caller looks in the route's `Looks` first (`look_key`), and keeps what this returns."""
    if change.key_changed:
        return Look(change)
    if change.scheme_changed or change.new.scheme != "canonical":
        return Look(change, why=f"scheme {change.new.scheme}: no field checksums to compare")
    if change.rows_changed:
        return Look(change, why="rows or row_key changed: the stored rows are other rows")
    if route_rows:
        return _rows(change, state, data, rules)
    return _whole(change, payload, fields_state)


def _whole(change: Change, payload: Any, fields_state: Callable[[], fields.Before | None]) -> Look:
    if type(payload) is not dict:
        return Look(change, why="the payload is not a JSON object")
    before = fields_state()
    if before is None:
        return Look(change, why="the last forward kept no field checksums")
    was_by_name = before.by_name()
    was, now = change.old.counts(), change.new.counts()
    changed, new = [], []
    for n in sorted(payload.keys() | set(before.names)):
        if not now(n):
            continue
        v = payload.get(n, _ABSENT)
        crc = None if v is _ABSENT else zlib.crc32(_encode(v))
        if was(n):
            if crc != was_by_name.get(n):
                changed.append(n)
        else:
            new.append(n)
    return Look(change, changed, new)


def _rows(change: Change, state: KeyState, data: bytes, rules: Any) -> Look:
    stored = rows.decode(state.rows) if state.rows else None
    if stored is None or fields.PAYLOAD in stored.raw:
        return Look(change, why="the last forward kept no row state")
    payload = rules.scheme.decode(data)  # whole: the fingerprint's fast path may have skipped fields
    found = rules.route.rows.resolve(payload, {}) if payload is not NOT_JSON else None
    if not isinstance(found, list):
        return Look(change, why="the rows cannot be read")
    select, keys = selector(rules.route), tuple(rules.route.row_key)
    was, now = change.old.counts(), change.new.counts()
    # a narrowing compares nothing the old selection did not: a row whose fingerprint under the
    # old selection is the stored one is unchanged in every field compared now (one digest a row)
    before = _selector_of(change.old) if change.widens() is False else None
    seen: set[str] = set()
    changed: set[str] = set()
    new: set[str] = set()
    for row in found:
        if type(row) is not dict:
            return Look(change, why="rows that are not objects")
        k = rows.row_key_of(row, keys)
        if k in seen:
            return Look(change, why="rows that share a key")
        seen.add(k)
        was_fp = stored.raw.get(k)
        if was_fp is None:
            continue  # an added row: `rows_differ`
        if before is not None and hashlib.sha256(_encode(before(row))).hexdigest()[:16] == was_fp[0]:
            continue
        old = stored[k]
        crcs = rows.field_checksums(select(row))
        kept = old[1]
        for f in crcs.keys() | kept.keys():
            if not now(f):
                continue
            if was(f):
                if crcs.get(f) != kept.get(f):
                    changed.add(f)
            elif f in crcs:
                new.add(f)
    differ = len(seen) != len(stored) or any(k not in stored for k in seen)
    return Look(change, sorted(changed), sorted(new), differ)


def _selector_of(s: Selection) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A row's fields as `s` compares them, as the row state digested them (`rows.digest_rows`)."""
    exclude = frozenset(s.exclude)
    include = tuple(k for k in s.include if k not in exclude)
    if include:
        return lambda row: {k: row[k] for k in include if k in row}
    return lambda row: {k: v for k, v in row.items() if k not in exclude}


def as_judged(look: Look, state: KeyState, fp: str, now: float, settled: bool, adopt: bool) -> KeyState:
    """The state as the decision table judges it (`judge.judge`), so that redeliveries, leases,
    bypass rules, the window and the stale guard apply as always: its fingerprint this message's
    when the new selection sees no change; no last forward at all for a new keyspace (a changed
    key); as stored otherwise (a change: forwarded). Only the verdict reads it: the claim is
    made on `state` as stored."""
    if look.change.key_changed:
        return replace(state, fingerprint=None, forwarded_at=None, publish_time=None)
    if state.fingerprint is None or not settled or not look.same(adopt):
        return state
    lease = state.lease
    if lease is not None and not lease.live(now):
        lease = replace(lease, fingerprint=fp)  # the lapsed lease held the last forward's content
    return replace(state, fingerprint=fp, lease=lease)


def reason(look: Look, decision: Decision, said: str, changed: bool, adopt: bool) -> str:
    """The reason of a decision the table took on `as_judged`'s state (`said`; `changed`: it is
    the table's `content changed`), saying what changed in the selection."""
    change = look.change
    if change.key_changed:
        if said == "new key":
            was, now = ", ".join(change.old.key), ", ".join(change.new.key)
            return f"new key: the route's key changed ({was} -> {now}): a new keyspace, not a selection change"
        return said
    head = f"{SELECTION_CHANGED} ({change.summary()})"
    if decision is Decision.FORWARDED and changed:
        if look.why is not None:
            return f"{head}: not comparable field by field ({look.why}), forwarded"
        what = [*look.changed, *(["rows added or removed"] if look.rows_differ else [])]
        if what:
            return f"{head}: changed: {', '.join(what[: fields.MAX_NAMED])}"
        if look.new_fields and not adopt:
            return f"{head}: newly compared {', '.join(look.new_fields[: fields.MAX_NAMED])}, forwarded once " + (
                "(new_fields: forward)"
            )
        return f"{head}: changed"
    if decision is Decision.SUPPRESSED and said == "unchanged since last forward":
        if look.new_fields and adopt:
            return (
                f"{head}: unchanged in the fields both selections compare; newly compared "
                f"{', '.join(look.new_fields[: fields.MAX_NAMED])} adopted with the next forward (new_fields: adopt)"
            )
        return f"{head}: unchanged as the new selection compares it"
    return said


_ABSENT = object()
