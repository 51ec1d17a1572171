"""The small interfaces the engine talks to. Each backend is one module behind one of these."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.model import Cause, DecisionRecord, KeyState, Message


class Failure(FilterError):
    """An operational failure already worded for the user: printed as is, exit 1 (any layer may
    raise it; `runtime.operational` prints it)."""


class StoreUnavailable(FilterError):
    """The state store could not answer in time. The route's `on_store_error` decides."""


class PublishFailed(FilterError):
    """The destination did not confirm the publish. The source message must be nacked."""


class Unpublishable(PublishFailed):
    """Pub/Sub would refuse this publish whatever the retries: the message itself is over one of
    its limits (`pubsub_filter.core.pubsub_limits`). Nothing was sent; the source message is rejected
    (4xx, the same on every delivery, until the dead-letter policy takes it), never failed into a
    5xx that is retried for good."""


@runtime_checkable
class Suspends(Protocol):
    """A store that says whether its calls suspend: one that never does (`suspends = False`,
    SQLite: each call runs to its end on the loop) cannot be timed out, so `GuardedStore` sets
    no timeout around it. A store that does not say is taken to suspend."""

    suspends: bool


class StateStore(Protocol):
    """Per-(route, key) state with compare-and-set writes.

    Every write is conditional, so two processes sharing a store can never both win:
    `claim` succeeds only if the document is unchanged since `seen` was read; `extend`,
    `commit` and `release` only while the stored lease still carries `held`'s fence.
    Implementations raise `StoreUnavailable` when they cannot reach their backend.
    """

    async def read(self, route: str, key: str) -> KeyState | None: ...

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        """Write `new` (which carries a lease) if nothing changed since `seen`; None if beaten."""

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        """Push the lease expiry out; None if the lease is no longer ours (a newer fence)."""

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        """Replace the state with `new` (no lease) if `held`'s fence still owns the lease."""

    async def release(self, route: str, key: str, held: KeyState) -> None:
        """Drop the lease if it is still ours, leaving the last forward untouched."""

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


class Publisher(Protocol):
    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        """Publish and wait for confirmation; return the destination's message id.

        Raises `PublishFailed` when the publish is not confirmed.
        """

    async def ping(self) -> None:
        """Cheap readiness check for `/readyz`: raise when every publish would certainly fail now."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Worked:
    """What the caller's work sends back (in-process): the id the record shows, the result to
    keep with the forward (`cache_result`), and what the work returned, which the engine hands
    back untouched in `Handled.sent`."""

    published_id: str
    result: str | None = None  # JSON text, committed with the forward (`KeyState.results`); None: none kept
    returned: Any = None  # what the caller's work returned
    unkept: str | None = None  # why a result to keep was committed without it (not JSON, too large)


class Sender(Protocol):
    """The one port a forward sends through: the destination's publisher (`sending.Publishing`)
    or, in-process, the caller's body in its place (`pubsub_filter.inprocess`)."""

    #: What the record names a failed send: `Cause.PUBLISH`, `Cause.WORK`.
    cause: Cause
    #: Once begun, the send may land whatever the caller does (a publish handed to Pub/Sub): a
    #: cancel then waits for it and its commit. Otherwise the caller's cancel reaches the send
    #: and fails the forward; only the commit past a send that returned is waited for.
    lands_despite_cancel: bool
    #: Bound by Pub/Sub's limits on attributes (a publish is; the caller's body is not).
    attribute_limits: bool

    async def send(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None, traced: Traced
    ) -> str | Worked:
        """Send what a forward sends; the id the record shows as `published_id` (with the result
        to keep with the forward, a `Worked`). `traced`: the decision's, for a span of the send.

        Raises `PublishFailed` when it did not go out (the lease is released, the message nacked)."""


class DecisionRecorder(Protocol):
    def record(self, record: DecisionRecord) -> None:
        """Accept a record without blocking the request; writing happens elsewhere."""

    def committing(self) -> Awaitable[None] | None:
        """What to await before answering for the records recorded so far: None when the
        recorder promises no more than that they will be written (batches, later), else the
        commit that will hold them (`InlineSqliteRecorder`: one per event-loop step)."""

    async def flush(self) -> None: ...

    async def close(self, deadline: float | None = None) -> None:
        """Write what is waiting (giving up after `deadline` seconds), then release resources."""

    def outcomes(self) -> Mapping[str, int]:
        """How many records so far were `written`, `retried` (rows of a batch written again) and
        `dropped`, with those of the recorder it hands records on to (`pubsub_filter_records`)."""


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    """The clock of an engine built without one: the wall clock."""

    def now(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()


class Traced(Protocol):
    """One decision as its observer traces it, what `DecisionObserver.decision` yields: the
    engine hands it to the forward's send and to the lease's heartbeat (they run in two tasks),
    so that the heartbeat's events land on the publish's span."""

    def sending(self, destination: str, data: bytes, ordering_key: str | None) -> AbstractContextManager[object]:
        """Context around one publish: its span, current while it runs."""

    def heartbeat(self, event: str, **attributes: str) -> None:
        """Note a heartbeat (`lease extended`, `lease lost`, `heartbeat failed`) on the publish under way."""


class Untraced:
    """A decision no span is recorded for: its publish and heartbeats leave no trace."""

    def sending(self, destination: str, data: bytes, ordering_key: str | None) -> AbstractContextManager[object]:
        return nullcontext()

    def heartbeat(self, event: str, **attributes: str) -> None:
        pass


UNTRACED = Untraced()


class DecisionObserver(Protocol):
    """Metrics and the decision's span. The engine calls it at three marked places; the
    OpenTelemetry implementation is `pubsub_filter.observability.telemetry.Telemetry`."""

    def decision(self, route: str, msg: Message, parent: object | None = None) -> AbstractContextManager[Traced]:
        """Context around one decision (its span, current while the decision runs). `parent`: the
        trace context of the request the message came in, as the surface read it (opaque here)."""

    def decided(self, rec: DecisionRecord) -> None: ...

    def lease_taken_over(self, route: str) -> None: ...

    def shutdown(self) -> None:
        """Send what is still buffered (the last OTLP batches); called once, at close."""


class Unobserved:
    """The observer of an engine built without telemetry (tests, `explain`): does nothing."""

    def decision(self, route: str, msg: Message, parent: object | None = None) -> AbstractContextManager[Traced]:
        return _UNTRACED_DECISION

    def decided(self, rec: DecisionRecord) -> None:
        pass

    def lease_taken_over(self, route: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


UNOBSERVED = Unobserved()
_UNTRACED_DECISION = nullcontext(UNTRACED)


# --- reading decision records back (skip-rate) -------------------------------------------

#: How counts are grouped in time: not at all (one bucket per route), by UTC hour, by UTC day.
Bucket = Literal["route", "hour", "day"]


class DecisionCount(TypedDict):
    """How many decisions one (route, bucket, decision, enforced) had.

    `bucket` is the UTC hour as `2026-01-01T13:00:00Z`, the UTC day as `2026-01-01`, or
    None when counting by route: the same strings from every reader, so counts compare.
    """

    route: str
    bucket: str | None
    decision: str
    enforced: bool
    n: int


class RecordsReader(Protocol):
    """Decision records read back: one implementation per place they are kept (the SQLite
    table, the BigQuery table, decision log lines), all answering with the same rows."""

    def decision_counts(self, since: float | None, by: Bucket) -> list[DecisionCount]:
        """Counts of the decisions made at or after `since` (epoch seconds; None: all).

        Raises ValueError for an unknown `by` and OSError for a file that cannot be read;
        a remote backend's own errors pass through."""

    def close(self) -> None:
        """Release the connection or client, if any."""


class DecisionRow(TypedDict):
    """One recorded decision as `tune` reads it back: the columns it needs, `extra` decoded
    (for a log line: the whole line, whose keys include the record's `extra`)."""

    time: float
    decision: str
    enforced: bool
    key: str | None
    reason: str | None
    fingerprint: str | None
    previous_fingerprint: str | None
    extra: dict[str, Any]


class RecordsLister(Protocol):
    """A `RecordsReader` that also lists one route's decisions, oldest first (`pubsub-filter tune`)."""

    def decision_rows(self, route: str, since: float | None) -> list[DecisionRow]:
        """The route's decisions at or after `since` (epoch seconds; None: all), in time order."""
