"""The decision, in one place: `decide` says what to do with one message given the stored state.

Pure: the same inputs (message, fingerprint, state, time, the audit's draw) always give the
same answer, and nothing here reads or writes a store, or writes the route's caches (it reads
them: each holds a function of the stored bytes alone). What a forward leaves for the route's
next decisions (its state decoded, the row memo, its rows) travels in `Decided.kept`, and the
engine hands it to `RouteRules.remember` once the commit landed; what a decision decoded of
the stored state, or a look at state another selection stored, travels in `Decided.read`, and
the engine hands it to `RouteRules.keep_read` once decided. The engine calls `decide` once per
look at the state, `explain` calls it to say why; read it top to bottom:

1. state past its expiry is forgotten (a late TTL never decides);
2. `judge`, the table: new, redelivered, in flight, bypassed, unchanged, stale, changed; a
   redelivery is the same message id with the same content: an id reused with other content
   is decided on that content, and its reason says the id was reused;
3. a suppression may be audited: unchanged in the selected fields but not in all of them
   is `noise_only`;
4. a forward learns what it sends and commits: the row digests, and on a `rows_mode:
   changed` route only the new and changed rows. Row mode only narrows what a forward
   carries; it never turns a change into a suppression. A whole-payload route's forward
   keeps a checksum per top-level field instead, and its details say which fields changed;
   a suppression's say which excluded fields changed (`pubsub-filter tune` reads both).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import msgspec

from pubsub_filter.core.attributes import CHANGED_PREFIX
from pubsub_filter.core.compare import fields, forwarded_rows, reselect, rows, tolerance_look
from pubsub_filter.core.compare.fingerprint import TypedRows
from pubsub_filter.core.compare.partial import partial
from pubsub_filter.core.compare.routes import Kept, Read, Reading, RouteRules
from pubsub_filter.core.compare.tolerance import WITHIN, largest
from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.model import UNKNOWN, Decision, KeyState, Message

#: The reason of a redelivery: this message id, last forwarded with this content.
REDELIVERED = "message already forwarded"

#: Added to the reason of a message whose id was forwarded recently with other content.
ID_REUSED = "the message id was reused with other content"

#: The reason of a change the destination is known not to hold: the only one a tolerance may suppress.
CHANGED = "content changed"

#: The reason a forward gives when a forward of other content may have landed unrecorded.
UNKNOWN_DOWNSTREAM = "what the destination holds is unknown: a forward may have landed unrecorded"


class Verdict(msgspec.Struct, frozen=True):
    decision: Decision
    reason: str
    #: this message id was forwarded with this content: the caller may be handed the result kept with it
    redelivery: bool = False


class Outgoing(msgspec.Struct, frozen=True):
    """What a forward publishes (the data, possibly only the changed rows) and then commits."""

    data: bytes
    attributes: Mapping[str, str]
    rows: bytes | None = None
    full_fingerprint: str | None = None
    selection: str | None = None  # what the route compares, stored with the forward (`core.compare.selection`)


class Decided(msgspec.Struct, frozen=True):
    """`decide`'s answer: the verdict, the state it was decided on, what a forward sends, and
    details for the record (which rows and fields changed). One per look at the state.

    `kept`: what a forward leaves for the route's next decisions, for the engine to hand to
    `RouteRules.remember` once the forward's commit landed (never before: `decide` writes nothing).
    `read`: what this decision decoded that the route's memo did not hold, for the engine to
    hand to `RouteRules.keep_read` (whatever was decided)."""

    verdict: Verdict
    state: KeyState | None
    out: Outgoing
    details: Mapping[str, Any] = msgspec.field(default_factory=dict)
    kept: Kept | None = None
    read: Read | None = None

    @property
    def previous_fingerprint(self) -> str | None:
        return self.state.fingerprint if self.state is not None else None


def decide(
    rules: RouteRules,
    msg: Message,
    fp: str,
    state: KeyState | None,
    now: float,
    bypass: bool,
    rng: random.Random,
    payload: Any,
    typed: TypedRows | None = None,
) -> Decided:
    """The whole decision for `msg` (payload fingerprint `fp`) against `state`, the stored state for its key.

    `payload`: what the fingerprint decoded from `msg.data` (`rules.scheme`): the field changes
    are read from it, never from a second decode. `typed`: the rows the fingerprint's fast path
    decoded (`RouteRules.extract`), digested on a forward rather than decoded again; None: the
    rows are decoded here if a forward digests them."""
    if state is not None and state.expired(now):
        state = state.forgotten()
    stored = Reading(rules, state.rows if state is not None else None)
    # the last forward was judged under another selection: compared field by field (`reselect`)
    again = None
    if state is not None and state.selection is not None and state.selection != rules.selection_text:
        again = _reselected(rules, msg, fp, state, stored, now, payload)
    verdict = judge(rules.route, msg, fp, state if again is None else again[1], now, bypass)
    taken = again[2] if again is not None else None
    details: dict[str, Any] = {}
    # the destination holds the last forward, and this is other content: a tolerance may
    # still call it unchanged, and a forward flags only the fields that changed
    known = verdict.reason == CHANGED and state is not None and _settled(state) and _in_window(rules.route, state, now)
    if again is not None:
        compared = again[0]
        known = known and compared.why is None and compared.change.fingerprints_comparable
        verdict = _reason_under(compared, verdict, rules.route.new_fields == "adopt")
        details.update(compared.details())
    look = _within_tolerance(rules, msg, state, stored, payload, typed) if known else None
    moves = look.moves if look is not None else None
    if moves is not None:
        verdict = Verdict(Decision.SUPPRESSED, WITHIN)
        details["within_tolerance"] = moves
    if state is not None and _id_reused(state, msg.message_id, fp):
        verdict = Verdict(verdict.decision, f"{verdict.reason}; {ID_REUSED}")
        details["id_reused"] = True
    if verdict.decision is Decision.SUPPRESSED and moves is None and _noise_only(rules, msg, state, rng):
        verdict = Verdict(Decision.NOISE_ONLY, "unchanged, but fields outside the selection changed")
    elif verdict.decision is Decision.FORWARDED:
        out, found, kept = _what_to_send(rules, msg, fp, state, stored, payload, known, look, typed)
        out = msgspec.structs.replace(out, selection=rules.selection_text)
        return Decided(verdict, state, out, {**details, **found}, kept, stored.taken(taken))
    if verdict.decision in _HELD_BACK and rules.tracks_fields and rules.selects is not None:
        _excluded_changed(rules, stored, details, payload)
    return Decided(verdict, state, Outgoing(msg.data, {}), details, read=stored.taken(taken))


def _reselected(
    rules: RouteRules, msg: Message, fp: str, state: KeyState, stored: Reading, now: float, payload: Any
) -> tuple[reselect.Look, KeyState, tuple[reselect.LookKey, reselect.Look] | None] | None:
    """The look at a last forward made under another selection, the state as the table judges
    it (`reselect.as_judged`), and the look with its memo key when it was taken anew (for
    `Decided.read`: the route's `looks` are the caller's to fill)."""
    change = reselect.change_of(state.selection or "", rules.selection)
    if change is None:
        return None
    if change.fingerprints_comparable:
        return reselect.Look(change), state, None  # a tolerance changes no fingerprint: compared as stored
    key = reselect.look_key(change, state, msg.data)
    look = rules.looks.get(key)
    taken = None
    if look is None:
        look = reselect.look(change, rules.tracks_rows, state, msg.data, payload, rules, stored.fields_state)
        taken = key, look
    adopt = rules.route.new_fields == "adopt"
    return look, reselect.as_judged(look, state, fp, now, _settled(state), adopt), taken


def _reason_under(look: reselect.Look, verdict: Verdict, adopt: bool) -> Verdict:
    """The verdict's reason, saying that the selection changed: never `content changed`."""
    reason = reselect.reason(look, verdict.decision, verdict.reason, verdict.reason == CHANGED, adopt)
    return verdict if reason == verdict.reason else Verdict(verdict.decision, reason)


def judge(
    route: Route, msg: Message, fingerprint: str, state: KeyState | None, now: float, bypass: bool = False
) -> Verdict:
    """The decision table. Pure: the same inputs always give the same verdict."""
    if state is None:
        return Verdict(Decision.FORWARDED, "new key")
    # A redelivery: this id, forwarded with this content. Without an id of its own (made from
    # the data), the same content again may be a new message: decided on its content below.
    if msg.has_id and (msg.message_id, fingerprint) in state.recent:
        return Verdict(Decision.DUPLICATE, REDELIVERED, redelivery=True)
    lease = state.lease
    if lease is not None and lease.live(now):
        if lease.message_id == msg.message_id:
            # Acking a redelivery acks the message itself: if the in-flight publish then
            # failed, the content would be lost. Ask again after it settles.
            return Verdict(Decision.CONTENDED, "this message is already in flight")
        if lease.fingerprint == fingerprint:
            return Verdict(Decision.DUPLICATE, "same content in flight")
        return Verdict(Decision.CONTENDED, "other content for this key is in flight")
    if bypass:
        return Verdict(Decision.FORWARDED, "bypass rule")
    downstream = state.downstream
    if lease is not None and lease.fingerprint != state.fingerprint and downstream == fingerprint:
        # A holder's lease lapsed mid-forward (it died, or its commit never landed): its publish
        # may have reached the destination, which then no longer holds what the state says. (The
        # claim that takes the lease over writes this down as `UNKNOWN`: `transitions.claimed`.)
        return Verdict(Decision.FORWARDED, "a lapsed forward of other content may be downstream")
    if downstream == fingerprint:
        if route.window is None or state.forwarded_at is None or now - state.forwarded_at < route.window:
            return Verdict(Decision.SUPPRESSED, "unchanged since last forward")
        if not _older(msg, state):
            return Verdict(Decision.FORWARDED, "unchanged, but the window expired")
    elif downstream is None:
        return Verdict(Decision.FORWARDED, "new key")
    if _older(msg, state) and route.stale == "suppress":
        return Verdict(Decision.STALE, "published before the last forwarded message")
    if downstream is UNKNOWN:
        return Verdict(Decision.FORWARDED, UNKNOWN_DOWNSTREAM)
    return Verdict(Decision.FORWARDED, CHANGED)


def _settled(state: KeyState) -> bool:
    """No lapsed lease of other content: its holder may have published it, so the destination
    may hold that and not the last forward (the table forwards it, `judge`)."""
    lease = state.lease
    return lease is None or lease.fingerprint == state.fingerprint


def _in_window(route: Route, state: KeyState, now: float) -> bool:
    """Within the route's window of the last forward. Past it, a move within tolerance is
    forwarded, as unchanged content is, and whole: nothing is held back or left unflagged."""
    window = route.window
    return window is None or state.forwarded_at is None or now - state.forwarded_at < window


def _within_tolerance(
    rules: RouteRules, msg: Message, state: KeyState | None, stored: Reading, payload: Any, typed: TypedRows | None
) -> tolerance_look.Look | None:
    """The moves, when the change is only moves within the route's tolerance (`core.compare.tolerance`)."""
    tol = rules.tolerance
    if tol is None or not tol.amounts or state is None:
        return None
    return tolerance_look.within(rules, tol, msg.data, state, stored, payload, typed)


def _id_reused(state: KeyState, message_id: str, fp: str) -> bool:
    """`message_id` was forwarded recently, but never with this content: a caller's id (a request
    id) reused for other content, or a producer's bug. Decided as the content it carries.

    A redelivery is the pair: the id with content it was forwarded with is one, even after the
    id was reused for other content (an id reused for B, then for A again, is A's redelivery).
    """
    seen = [f for mid, f in state.recent if mid == message_id]
    return bool(seen) and fp not in seen


def _older(msg: Message, state: KeyState) -> bool:
    return msg.publish_time is not None and state.publish_time is not None and (msg.publish_time < state.publish_time)


def _noise_only(rules: RouteRules, msg: Message, state: KeyState | None, rng: random.Random) -> bool:
    """A sampled suppression whose content over all fields differs from the last forward's."""
    return (
        rules.full_scheme is not None
        and state is not None
        and state.full_fingerprint is not None
        and rng.random() < rules.route.audit_sample
        and rules.full_scheme(msg.data)[1] != state.full_fingerprint
    )


_HELD_BACK = (Decision.SUPPRESSED, Decision.NOISE_ONLY)


def _excluded_changed(rules: RouteRules, stored: Reading, details: dict[str, Any], payload: Any) -> None:
    """Which fields outside the selection changed since the last forward, for `tune`."""
    before = stored.fields_state()
    if before is None or rules.selects is None:
        return
    if type(payload) is dict:
        changed = fields.excluded_changed(payload, before, rules.unselected, rules.selects)
        fields.named("excluded_changed", changed, details)


def _fields_forwarded(
    rules: RouteRules,
    msg: Message,
    fp: str,
    state: KeyState | None,
    stored: Reading,
    full: str | None,
    payload: Any,
    known: bool,
) -> tuple[Outgoing, dict[str, Any], Kept | None]:
    """A whole-payload forward stores its field checksums and records which selected fields changed."""
    details: dict[str, Any] = {}
    if type(payload) is not dict:
        return Outgoing(msg.data, _every_flag(rules), None, full), details, None
    selects = rules.selects
    new_key = state is None or (state.fingerprint is None and state.forwarded_at is None)
    before = stored.fields_state()
    now = fields.Now(payload, selects, before)
    field_state = now.blob(fp)
    out = Outgoing(msg.data, {}, field_state, full)
    reference = None
    if (tol := rules.tolerance) is not None:
        sent = tolerance_look.whole_forward(
            rules,
            tol,
            field_state,
            3 if now.clocks else 2,
            payload,
            None if state is None else stored,
            known and not new_key,
            now.changed_all,
        )
        out, reference = Outgoing(msg.data, sent.flags, sent.blob, full), sent.reference
        _tolerance_details(tol.listed, sent, details)
    kept = None
    if field_state is None:
        details["fields_state"] = rows.FIELDS_UNKEPT
        if out.rows is not None:  # the tolerance reference alone (`tolerance_look.whole_forward`)
            kept = Kept(out.rows, reference)
    else:
        kept = Kept(out.rows, reference, fields_state=now.stored(_unselected_values(rules, payload)))
    if new_key:
        return out, details, kept  # nothing to compare with
    if before is None or now.changed_all is None:
        details["fields_changed"] = None  # unknown: the last forward stored no field checksums
        return out, details, kept
    changed = now.changed_all if selects is None else [n for n in now.changed_all if selects(n)]
    fields.named("fields_changed", changed, details)
    clocks, old = now.clocks, before.clocks
    increased = [k for k in changed if k in clocks and k in old and _grew(old[k], clocks[k])]
    if increased:
        fields.named("fields_increased", increased, details)
    # the numbers that moved, from the last forward's value to this one's: `tune` shows how far
    # they move, and what a tolerance would have held back (the values are the clocks': no decode)
    moved = {k: [old[k], clocks[k]] for k in changed if type(clocks.get(k)) is float and type(old.get(k)) is float}
    if moved:
        details["fields_moved"] = dict(list(moved.items())[: fields.MAX_NAMED])
    return out, details, kept


def _unselected_values(rules: RouteRules, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The values a suppression compares its excluded fields with (none: it looks at none)."""
    selects = rules.selects
    if selects is None:
        return None
    names = rules.unselected if rules.unselected is not None else (n for n in payload if not selects(n))
    return fields.kept_values(payload, names)


def _grew(old: float | str, new: float | str) -> bool:
    return type(old) is type(new) and new > old  # type: ignore[operator]


def _every_flag(rules: RouteRules) -> Mapping[str, str]:
    """A forward with nothing to compare field by field (a payload that is not a JSON object,
    or not JSON) flags every `changed_attributes` field."""
    return rules.tolerance.every_flag if rules.tolerance is not None else {}


def _tolerance_details(listed: tuple[str, ...], sent: tolerance_look.ForwardPlan, details: dict[str, Any]) -> None:
    """For the record: the fields a forward flags as changed (`changed_attributes`), the rows
    it held back as moved within tolerance, and a reference it could not keep."""
    if listed:
        details["changed_flagged"] = sorted(k.removeprefix(CHANGED_PREFIX) for k in sent.flags)
    if sent.within_rows:
        moves: dict[str, int | float] = {}
        for m in sent.within_rows.values():
            largest(moves, m)
        details["rows_within_tolerance"] = len(sent.within_rows)
        details["within_tolerance"] = moves
    if sent.unkept is not None:
        details["tolerance_state"] = sent.unkept


def _what_to_send(
    rules: RouteRules,
    msg: Message,
    fp: str,
    state: KeyState | None,
    stored: Reading,
    payload: Any,
    known: bool = False,
    look: tolerance_look.Look | None = None,
    typed: TypedRows | None = None,
) -> tuple[Outgoing, dict[str, Any], Kept | None]:
    """What a forward commits (full fingerprint, row digests) and sends (all rows, or the changed
    ones), the details for its record, and what its commit leaves for the route's next decisions."""
    full = rules.full_scheme(msg.data)[1] if rules.full_scheme is not None else None
    if rules.tracks_fields:
        return _fields_forwarded(rules, msg, fp, state, stored, full, payload, known)
    before = rows.decode(state.rows) if state is not None and rules.tracks_rows else None
    if before is not None and fields.PAYLOAD in before.raw:
        before = None  # the field state of a whole-payload route (its config changed): no rows to compare
    # decoded once (usually kept from the fingerprint, or by the tolerance's second look) for both uses
    if look is not None and look.typed is not None:
        typed = look.typed
    elif typed is None:
        typed = rules.typed_rows(msg.data)
    digests: rows.RowDigests | None
    if look is not None and look.digests is not None and before is not None:
        digests = look.digests  # the tolerance's second look digested the rows against this very state: not again
    else:
        digests = rules.row_digests(msg.data, before, typed)
    details: dict[str, Any] = {}
    if digests is None:
        return Outgoing(msg.data, _every_flag(rules), None, full), details, None
    kept = rows.encode(digests)
    if kept is None:
        details["rows_state"] = rows.ROWS_UNKEPT
    content_changed = state is not None and state.fingerprint not in (None, fp)
    partial_send = rules.route.rows_mode == "changed" and content_changed
    diff = rows.diff(before, digests) if before is not None else None
    attributes: Mapping[str, str] = {}
    within_rows: Mapping[str, Any] = {}
    reference = forwarded = None
    if (tol := rules.tolerance) is not None:
        sent = tolerance_look.rows_forward(
            rules,
            tol,
            kept,
            digests,
            typed,
            payload,
            None if state is None else stored,
            diff,
            known and before is not None,
            partial_send,
        )
        kept, attributes, within_rows, reference = sent.blob, sent.flags, sent.within_rows, sent.reference
        _tolerance_details(tol.listed, sent, details)
        if reference is not None and tol.amounts and typed is not None:
            forwarded = forwarded_rows.kept(typed, len(digests) == len(typed.rows))
    seen = digests.seen if type(digests) is rows.ComparedDigests else None
    leaves = Kept(kept, reference, seen=seen, forwarded=forwarded)
    if diff is None:
        return Outgoing(msg.data, attributes, kept, full), details, leaves
    details.update(diff.summary())
    fields.named("fields_changed", sorted({f for names in diff.fields.values() for f in names}), details)
    data: bytes = msg.data
    if partial_send:
        if diff.any:
            # The typed path digests every row under its own key, in row order (the generic
            # path, taken on a shared key, digests fewer): then the digests' keys are the rows'.
            keys = list(digests) if typed is not None and len(digests) == len(typed.rows) else None
            sending = tolerance_look.sent_diff(diff, within_rows) if within_rows else diff
            data, rows_attributes = partial(rules, msg.data, sending, typed, keys)
            attributes = {**attributes, **rows_attributes}
        else:
            # The fingerprint says the content changed and no row digest does (rows that are
            # not objects, say): forward it whole.
            details["rows_forwarded"] = "whole payload: the change is outside the row digests"
    return Outgoing(data, attributes, kept, full), details, leaves
