"""A route compiled once: how to key, fingerprint and bypass its messages (step 1 of the decision, extract)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pubsub_filter.core.attributes import own_attribute_count, unforwardable
from pubsub_filter.core.compare import fields, forwarded_rows, reselect, rows
from pubsub_filter.core.compare.canonical import MissingField
from pubsub_filter.core.compare.conditions import holds
from pubsub_filter.core.compare.fingerprint import NOT_JSON, Scheme, TypedRows, compile_scheme, message_fingerprint
from pubsub_filter.core.compare.selection import of_route
from pubsub_filter.core.compare.tolerance import Reference, Tolerance, read
from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.model import Message
from pubsub_filter.core.paths import MISSING

#: How many stored states a route keeps decoded, and how many bytes of stored state at most: a
#: state is a few hundred bytes on a whole-payload route, but a rows route's can near the row
#: state's cap (~900 KB), and its decoded form is larger still.
_KEPT_STATES = 1024
_KEPT_BYTES = 8 * 1024 * 1024


class _Decoded(dict[bytes, Any]):
    """Stored states decoded, by their bytes, oldest out first past `_KEPT_STATES` entries or
    `_KEPT_BYTES` of keys: a route's many keys never hold more than that. A large message's
    decision keeps from its own thread (`pubsub_filter.core.engine.offload`): the eviction takes a lock."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0
        self.lock = threading.Lock()

    def keep(self, blob: bytes, decoded: Any) -> None:
        if blob in self:
            return
        with self.lock:
            if blob in self:
                return
            self.size += len(blob)
            while self and (len(self) >= _KEPT_STATES or self.size > _KEPT_BYTES):
                self.size -= len(oldest := next(iter(self)))
                del self[oldest]
            self[blob] = decoded


@dataclass(frozen=True, slots=True)
class Kept:
    """What a forward's decision leaves for its route's next decisions, taken in by
    `RouteRules.remember` once its commit landed (never by `decide`, which is pure): what the
    state it stores (`blob`) decodes to, so that reading that state back decodes nothing, and
    what lets the next decisions of the route do less work."""

    blob: bytes | None = None  # the row or field state the forward stores
    reference: Reference | None = None  # the tolerance reference at the end of `blob`
    fields_state: fields.Before | None = None  # `blob` decoded, on a whole-payload route
    seen: dict[bytes, tuple[str, str]] | None = None  # the row memo of the forward's rows (`rows.Memo.seen`)
    forwarded: forwarded_rows.ForwardedRows | None = None  # the forward's rows, for the second look


_UNREAD: Any = object()


@dataclass(frozen=True, slots=True)
class Read:
    """What one decision decoded that its route's memo did not hold, for the caller to keep
    once it is decided (`RouteRules.keep_read`): `decide` is pure, and writes no cache."""

    blob: bytes | None = None  # the stored row or field state (`KeyState.rows`) it decoded
    fields_state: fields.Before | None = None  # `blob` decoded as a whole payload's field state
    reference: Reference | None = None  # the tolerance reference at the end of `blob` (None: it holds none)
    reference_read: bool = False  # `reference` was decoded
    look: tuple[reselect.LookKey, reselect.Look] | None = None  # a look at state another selection stored


class Reading:
    """The stored row or field state (`KeyState.rows`) as one decision reads it: each part
    decoded at most once, found in the route's memo when it holds it (every decision of the
    route reads the memo; none writes it). What was decoded anew leaves with the decision
    (`taken`), for the caller to keep: a key's messages between two forwards all read the same
    bytes, and across processes (another instance wrote the state) decoding it is the cost.

    Local to one decision (`judge.decide` makes one), so its own memo is never shared."""

    __slots__ = ("_fields", "_reference", "_rules", "blob")

    def __init__(self, rules: RouteRules, blob: bytes | None):
        self.blob = blob
        self._rules = rules
        self._fields: Any = _UNREAD
        self._reference: Any = _UNREAD

    def fields_state(self) -> fields.Before | None:
        """The stored field state (a whole-payload route's checksums per field)."""
        found = self._fields
        if found is _UNREAD:
            blob = self.blob
            if not blob:
                return None
            found = self._rules._befores.get(blob)
            self._fields = found = _Fresh(fields.decode(blob)) if found is None else found
        return found.value if type(found) is _Fresh else found  # type: ignore[no-any-return]

    def reference(self) -> Reference | None:
        """The tolerance reference the last forward stored after its row or field state."""
        found = self._reference
        if found is _UNREAD:
            blob = self.blob
            if not blob:
                return None
            found = self._rules._references.get(blob, _UNREAD)
            self._reference = found = _Fresh(read(blob)) if found is _UNREAD else found
        return found.value if type(found) is _Fresh else found  # type: ignore[no-any-return]

    def taken(self, look: tuple[reselect.LookKey, reselect.Look] | None = None) -> Read | None:
        """What this reading decoded anew (and `look`, a look taken anew), or None: nothing to keep."""
        befores, reference = self._fields, self._reference
        if befores is _UNREAD and reference is _UNREAD and look is None:
            return None  # the usual decision: neither part read
        fresh_fields = type(befores) is _Fresh and befores.value is not None
        fresh_reference = type(reference) is _Fresh
        if not (fresh_fields or fresh_reference or look is not None):
            return None
        return Read(
            self.blob,
            befores.value if fresh_fields else None,
            reference.value if fresh_reference else None,
            fresh_reference,
            look,
        )


@dataclass(frozen=True, slots=True)
class _Fresh:
    """A part `Reading` decoded itself (not found in the route's memo)."""

    value: Any


class RouteRules:
    """A route compiled once: how to key, fingerprint and bypass its messages."""

    def __init__(self, route: Route):
        self.route = route
        self.scheme: Scheme = compile_scheme(route)
        # what the route compares, stored with each forward: a later decision tells a changed
        # selection from changed content (`pubsub_filter.core.compare.reselect`)
        self.selection = of_route(route)
        self.selection_text = self.selection.text
        self.looks = reselect.Looks()  # the looks at state another selection stored (`reselect.look`)
        # the same content with nothing left out: what the noise audit compares
        self.full_scheme: Scheme | None = (
            compile_scheme(route.model_copy(update={"include": [], "exclude": [], "scheme": "canonical"}))
            if route.audit_sample > 0
            else None
        )
        self.tracks_rows = route.rows is not None and bool(route.row_key) and route.scheme == "canonical"
        self.row_memo = rows.Memo()  # the last forward's rows: most of the next forward's are the same
        self.own_attributes_at_most = own_attribute_count(route.rows_mode == "changed", len(route.changed_attributes))
        # whole-payload routes keep a checksum per top-level field (`pubsub_filter.core.compare.fields`)
        # (from the payload the fingerprint decoded: whole, as no fast path decodes such a route)
        self.tracks_fields = route.rows is None and route.scheme == "canonical" and self.scheme.fast is None
        self.selects: Callable[[str], bool] | None = fields.selector(route)
        # the fields a suppression looks at: the excluded ones (all but the included, with `include`)
        self.unselected: tuple[str, ...] | None = None if route.include else tuple(route.exclude)
        self._befores = _Decoded()  # fields.Before by the stored bytes
        # `tolerance` and `changed_attributes` (`pubsub_filter.core.compare.tolerance`), and the references read
        self.tolerance = Tolerance(route) if route.tolerance or route.changed_attributes else None
        self._references = _Decoded()  # Reference | None by the stored bytes
        self._forwarded: dict[bytes, forwarded_rows.ForwardedRows] = {}
        self._forwarded_count = 0  # rows held in `_forwarded`, at most `forwarded_rows.MAX_KEPT_ROWS`

    def remember(self, kept: Kept | None) -> None:
        """Take in what a forward left (`Kept`), once its commit landed: the next decisions read
        its state back decoded. Each cache is keyed by the stored bytes (or, the row memo, by
        each row's content), so a state another process wrote is decoded, never mistaken."""
        if kept is None:
            return
        if kept.seen is not None:
            self.row_memo.seen = kept.seen
        blob = kept.blob
        if not blob:
            return
        if kept.reference is not None:
            self.keep_reference(blob, kept.reference)
        if kept.fields_state is not None:
            self.keep_fields_state(blob, kept.fields_state)
        if kept.forwarded is not None and blob not in self._forwarded:
            held = self._forwarded
            self._forwarded_count += len(kept.forwarded.rows)
            while held and self._forwarded_count > forwarded_rows.MAX_KEPT_ROWS:
                self._forwarded_count -= len(held.pop(next(iter(held))).rows)
            held[blob] = kept.forwarded

    def forwarded_rows(self, blob: bytes | None) -> forwarded_rows.ForwardedRows | None:
        """The rows of the forward that stored `blob`, when this process committed it (`remember`)."""
        return self._forwarded.get(blob) if blob else None

    def keep_read(self, read: Read | None) -> None:
        """Keep what a decision decoded (`Decided.read`), after it: the next decisions of the
        route that read the same stored bytes (a key's messages between two forwards, or a
        repeat against the state another selection stored) decode nothing."""
        if read is None:
            return
        if read.blob:
            if read.fields_state is not None:
                self.keep_fields_state(read.blob, read.fields_state)
            if read.reference_read:
                self.keep_reference(read.blob, read.reference)
        if read.look is not None:
            self.looks.keep(*read.look)

    def keep_reference(self, blob: bytes, reference: Reference | None) -> None:
        """Keep `reference` as what `blob` holds: a forward keeps what it stores (`keep_fields_state`)."""
        self._references.keep(blob, reference)

    def keep_fields_state(self, blob: bytes, before: fields.Before) -> None:
        """Keep `before` as what `blob` decodes to. A forward keeps the state it stores: the
        next decision for its key reads that blob back and finds it decoded (in this process;
        another decodes it once)."""
        self._befores.keep(blob, before)

    def typed_rows(self, data: bytes) -> TypedRows | None:
        """The rows as the fingerprint's fast path decodes them (included fields only), if it
        vouches for them: decoded again, for a caller that does not hold `extract`'s."""
        if not self.tracks_rows or self.scheme.typed_rows is None:
            return None
        return self.scheme.typed_rows(data)

    def row_digests(
        self, data: bytes, before: rows.Before | None = None, typed: TypedRows | None = None
    ) -> rows.RowDigests | None:
        """Per-row digests of the whole document (the scheme's fast path may not have decoded all of it)."""
        if not self.tracks_rows or self.route.rows is None:
            return None
        typed = typed or self.typed_rows(data)
        if typed is not None:
            digests = rows.digest_typed(typed, before, self.row_memo)
            if digests is not None:
                return digests
        payload = self.scheme.decode(data)
        if payload is NOT_JSON:
            payload = self.scheme.readable(data)  # a number beyond double range: its rows still have digests
        if payload is NOT_JSON:
            return None
        found = self.route.rows.resolve(payload, {})
        return rows.digest_rows(self.route, found, before) if isinstance(found, list) else None

    def extract(self, msg: Message) -> tuple[Any, str, str, bool, TypedRows | None]:
        """Step 1 of a decision (the engine's, `explain`'s): the payload as the route reads it, its
        fingerprint, the message's, whether the payload was fingerprinted over its bytes (raw),
        and the rows the fingerprint decoded (`Scheme.with_rows`: `judge.decide` digests them on
        a forward). A raw payload is still read when it is JSON (a number beyond double range),
        so its key, rows and fields count."""
        payload, fp, typed = self.scheme.with_rows(msg.data)
        raw = payload is NOT_JSON
        if raw:
            payload = self.scheme.readable(msg.data)
        return payload, fp, message_fingerprint(msg.data, msg.attributes), raw, typed

    def key_of(self, payload: Any, attributes: Mapping[str, str]) -> str:
        parts = []
        for path in self.route.key:
            if path.root == "payload" and payload is NOT_JSON:
                raise MissingField(str(path), f"key field {path} needs a JSON payload, and this payload is not JSON")
            value = path.resolve(payload, attributes)
            if value is MISSING:
                raise MissingField(str(path), f"key field {path} is missing")
            if value is None:
                raise MissingField(str(path), f"key field {path} is null")
            if isinstance(value, (dict, list)):
                raise MissingField(str(path), f"key field {path} is an object or list, not a value")
            parts.append(str(value).replace("\\", "\\\\").replace("|", "\\|"))
        return "|".join(parts)

    def unforwardable(self, attributes: Mapping[str, str]) -> str | None:
        """Why a forward of a message with these attributes could not be published (`pubsub_filter.core.attributes`)."""
        return unforwardable(attributes, self.own_attributes_at_most)

    def bypassed(self, payload: Any, attributes: Mapping[str, str]) -> bool:
        return any(holds(c, payload, attributes) for c in self.route.bypass)

    def accepts_subscription(self, subscription: str | None) -> bool:
        expected = self.route.subscription
        if not expected or not subscription:
            return True
        if "/" in expected:
            return subscription == expected
        return subscription.rsplit("/", 1)[-1] == expected
