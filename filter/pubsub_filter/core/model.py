"""The nouns of the filter: messages, stored key state, leases and decisions.

Times are float seconds since the epoch throughout: cheap to compare on the hot path;
backends convert at their edges.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import msgspec


@dataclass(frozen=True, slots=True)
class Message:
    """One Pub/Sub message as the filter sees it, whichever surface delivered it."""

    data: bytes
    attributes: Mapping[str, str]
    message_id: str
    publish_time: float | None = None
    ordering_key: str | None = None
    delivery_attempt: int | None = None
    subscription: str | None = None
    #: False for a push without Pub/Sub's metadata (payload unwrapping without write metadata):
    #: `message_id` is then made from the data, so it cannot tell a redelivery from a new
    #: message with the same content, and the decision goes by the content alone (`judge`).
    has_id: bool = True


class Decision(enum.StrEnum):
    FORWARDED = "forwarded"  # new or changed content: published downstream
    SUPPRESSED = "suppressed"  # unchanged since the last forward, within the window
    DUPLICATE = "duplicate"  # this message was already decided, or its content is in flight
    CONTENDED = "contended"  # other content for this key is in flight: retry later
    STALE = "stale"  # older than what was last forwarded for the key
    NOISE_ONLY = "noise_only"  # suppressed, but fields outside the selection changed (audit sample)
    FAIL_OPEN = "fail_open"  # the store was unreachable, or the key could not be read: forwarded anyway
    REJECTED = "rejected"  # malformed, unknown route, wrong subscription
    FAILED = "failed"  # could not be decided or published now: nacked, will be redelivered
    SUPERSEDED = "superseded"  # a newer message of its burst is held, not yet acked (`coalesce`)


class Cause(enum.StrEnum):
    """Why a message was not acted on as decided: the surfaces answer from it (`core.engine.answer`)."""

    UNKNOWN_ROUTE = "unknown_route"  # rejected: no such route (push answers 404, not 400)
    STORE = "store"  # the store could not decide, `on_store_error: retry` (503)
    PUBLISH = "publish"  # the publish failed: the lease released, the message nacked
    WORK = "work"  # the in-process caller's work raised in place of the publish
    CANCELLED = "cancelled"  # abandoned to a cancel (a shutdown past its budget, or the caller)
    INTERNAL = "internal"  # the filter itself raised on this message (a bug): recorded, answered 500, retried
    OVERLOADED = "overloaded"  # turned away unread: the push endpoint's bytes in flight were at their bound (429)


#: Decisions after which the source message is acked (push answers 2xx).
ACKED = frozenset(
    {
        Decision.FORWARDED,
        Decision.SUPPRESSED,
        Decision.DUPLICATE,
        Decision.STALE,
        Decision.FAIL_OPEN,
        Decision.NOISE_ONLY,
        Decision.SUPERSEDED,
    }
)


class Unknown(enum.Enum):
    UNKNOWN = "unknown"


#: What `KeyState.downstream` says when a forward may have landed unrecorded.
UNKNOWN = Unknown.UNKNOWN


@dataclass(frozen=True, slots=True)
class Lease:
    """Who is publishing for a key right now, and until when that claim holds."""

    holder: str
    fence: int
    expires_at: float
    fingerprint: str
    message_id: str

    def live(self, now: float) -> bool:
        return self.expires_at > now


@dataclass(frozen=True, slots=True)
class KeyState:
    """Everything stored for one (route, key): the last forward, recent ids, the lease.

    `version` is the store's compare-and-set token for the document (opaque to the
    engine); `fence` is the last fencing token ever issued for the key and only grows.
    """

    fingerprint: str | None = None
    forwarded_at: float | None = None
    message_id: str | None = None
    publish_time: float | None = None
    recent: tuple[tuple[str, str], ...] = ()  # (message id, fingerprint), oldest first
    fence: int = 0
    lease: Lease | None = None
    expires_at: float | None = None  # for the store's TTL: when the whole document may go
    rows: bytes | None = (
        None  # per-row digests of the last forward (see pubsub_filter.core.compare.rows), routes with row_key
    )
    full_fingerprint: str | None = None  # the last forward over all fields, for the noise audit
    # (message id, fingerprint, JSON text): the in-process body's result kept with recent forwards
    # (`cache_result`), oldest first, within `RESULTS_MAX_BYTES` (`pubsub_filter.core.engine.transitions`).
    results: tuple[tuple[str, str, str], ...] = ()
    version: Any = field(default=None, compare=False)
    #: what the route compared when this forward was made (`pubsub_filter.core.compare.selection`: its canonical
    #: text); None for state written before selections were stored, read as the route's own
    selection: str | None = None

    def decided(self, message_id: str) -> str | None:
        """The fingerprint this message id was forwarded with, if it is a recent one."""
        for mid, fp in self.recent:
            if mid == message_id:
                return fp
        return None

    def with_lease(self, lease: Lease | None) -> KeyState:
        return replace(self, lease=lease, fence=lease.fence if lease else self.fence)

    @property
    def downstream(self) -> str | Unknown | None:
        """What the destination holds, as far as this state knows: the content last forwarded
        (its fingerprint), None when nothing was (a new key, or state forgotten), or `UNKNOWN`:
        a forward may have landed unrecorded.

        Derived from what is stored, so no stored format carries a new field: `UNKNOWN` is no
        fingerprint after a forward, the marker `unknown_downstream` writes for every producer
        (a claim over a lapsed forward of other content, this instance's fail-open memory)."""
        if self.fingerprint is None and self.forwarded_at is not None:
            return UNKNOWN
        return self.fingerprint

    def unknown_downstream(self) -> KeyState:
        """This state, with what the destination holds marked as unknown (`downstream`)."""
        return replace(self, fingerprint=None)

    def expired(self, now: float) -> bool:
        """Past `expires_at`: the state a TTL would have deleted (Firestore's TTL deletes a day or more late)."""
        return self.expires_at is not None and self.expires_at <= now

    def holds_commit_of(self, new: KeyState) -> bool:
        """This stored state is `new` committed: a retried commit that already landed counts as done."""
        return (
            self.lease is None
            and self.message_id == new.message_id
            and self.fingerprint == new.fingerprint
            and self.fence == new.fence
        )

    def forgotten(self) -> KeyState:
        """What the decision sees of expired state: nothing, except the lease (a live one still counts)
        and what keeps writes safe (the fence only grows; the version is the compare-and-set token)."""
        return KeyState(fence=self.fence, lease=self.lease, version=self.version)


class DecisionRecord(msgspec.Struct, frozen=True):
    """One decision, as logged and as written to the decisions table: built once, at its end.

    A frozen msgspec Struct: every message builds one, and a frozen dataclass of these 21 fields
    costs ~5 µs to build (each field set through `object.__setattr__`), this a tenth of it.

    `details` say what was decided on (rows and fields changed, the payload kind); `cause`,
    `committed` and `heartbeats` what acting came to. The stored and logged `extra` is all of
    them in one mapping (`extra`), in the order the fields are listed here.
    """

    time: float
    route: str
    decision: Decision
    enforced: bool
    message_id: str
    key: str | None = None
    reason: str | None = None
    fingerprint: str | None = None
    message_fingerprint: str | None = None
    previous_fingerprint: str | None = None
    destination: str | None = None
    published_id: str | None = None
    fence: int | None = None
    publish_time: float | None = None
    delivery_attempt: int | None = None
    latency_ms: float | None = None
    trace: str | None = None
    details: Mapping[str, Any] = msgspec.field(default_factory=dict)
    heartbeats: int = 0  # lease extensions while a forward published
    committed: bool = True  # False: forwarded, but the new state could not be committed
    cause: Cause | None = None

    @property
    def extra(self) -> Mapping[str, Any]:
        """The `extra` column and the log line's extra fields: the details, then what acting came to."""
        if self.cause is None and self.committed and not self.heartbeats:
            return self.details
        out = dict(self.details)
        if self.heartbeats:
            out["heartbeats"] = self.heartbeats
        if not self.committed:
            out["committed"] = False
        if self.cause is not None:
            out["cause"] = self.cause.value
        return out

    @property
    def acked(self) -> bool:
        """Whether the source message is acked: every surface answers from this, and only this.

        A shadow route acks whatever it published (it publishes once per delivery, whatever
        enforce mode would have done); an unpublished shadow decision is answered as enforce
        mode would answer it.
        """
        return self.decision in ACKED or (not self.enforced and self.published_id is not None)

    def values(self) -> tuple[Any, ...]:
        """The record in `DECISION_COLUMNS` order, the decision as its string; backends
        convert the `time`, `bool` and `json` kinds at their edge."""
        out = _column_values(self)
        return (*out[:_DECISION_AT], str(self.decision), *out[_DECISION_AT + 1 :])

    def line_fields(self) -> dict[str, Any]:
        """The decision log line's fields, in line order: the columns but `extra`, whose keys are
        spread in before `trace` (the JSON set-up names it under Cloud Logging's trace field);
        an empty value (None, no trace) is left out."""
        # one comprehension over one C attribute fetch: the line is written for every decision
        out = {name: value for name, value in zip(_LINE_FIELDS, _line_values(self), strict=True) if value is not None}
        out["decision"] = str(self.decision)
        extra = self.extra
        if extra:
            out.update((k, v) for k, v in extra.items() if v is not None)
        if self.trace:
            out["trace"] = self.trace
        return out


ColumnKind = Literal["time", "text", "bool", "int", "float", "json"]


class Column(NamedTuple):
    """One column of the decisions table: its name, what it holds, and whether it may be empty.

    `time` is epoch seconds; `json` is the `extra` mapping, stored as JSON text (empty: NULL).
    """

    name: str
    kind: ColumnKind
    nullable: bool = True


#: The decision columns, once: the SQLite table, the BigQuery schema and rows, and the log
#: line's fields are all derived from this, in this order (the order of `DecisionRecord`).
DECISION_COLUMNS: tuple[Column, ...] = (
    Column("time", "time", nullable=False),
    Column("route", "text", nullable=False),
    Column("decision", "text", nullable=False),
    Column("enforced", "bool", nullable=False),
    Column("message_id", "text"),
    Column("key", "text"),
    Column("reason", "text"),
    Column("fingerprint", "text"),
    Column("message_fingerprint", "text"),
    Column("previous_fingerprint", "text"),
    Column("destination", "text"),
    Column("published_id", "text"),
    Column("fence", "int"),
    Column("publish_time", "time"),
    Column("delivery_attempt", "int"),
    Column("latency_ms", "float"),
    Column("trace", "text"),
    Column("extra", "json"),
)
COLUMN_NAMES = tuple(c.name for c in DECISION_COLUMNS)
_DECISION_AT = COLUMN_NAMES.index("decision")
_column_values = operator.attrgetter(*COLUMN_NAMES)
_LINE_FIELDS = tuple(n for n in COLUMN_NAMES if n not in ("trace", "extra"))
_line_values = operator.attrgetter(*_LINE_FIELDS)
