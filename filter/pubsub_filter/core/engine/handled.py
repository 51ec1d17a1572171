"""What one decision comes to: the values its steps pass on, and `Handled`, the one it returns.

Frozen msgspec Structs: as immutable as a frozen dataclass, and built in a tenth of the time
(a frozen dataclass sets each field through `object.__setattr__`, ~0.25 µs a field; every
message builds a `Delivery` and a `Done`).
"""

from __future__ import annotations

import msgspec

from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.engine.judge import Decided
from pubsub_filter.core.model import Cause, Decision, DecisionRecord, KeyState, Message
from pubsub_filter.core.ports import UNTRACED, PublishFailed, Sender, Traced, Unpublishable, Worked


class Delivery(msgspec.Struct, frozen=True):
    """One message on one route once its key and fingerprint are known: what each step of acting needs."""

    route: Route
    msg: Message
    key: str
    fp: str
    message_fp: str
    raw: bool  # the payload is not JSON
    missing: str | None = None  # the path that could not be read: no key, nothing stored (`keyless`)
    traced: Traced = UNTRACED  # the decision's trace: the send's span, the heartbeat's events on it
    trace: str | None = None  # the request's trace name (`Engine.handle`'s): its lifecycle lines carry it


class Acted(msgspec.Struct, frozen=True):
    """What acting on a decision came to: what went out, and whether its state was committed,
    or why it did not go out (`cause`, and `failure` in words)."""

    published_id: str | None = None
    fence: int | None = None  # the lease's, when one was claimed
    committed: bool = True
    heartbeats: int = 0
    cause: Cause | None = None
    failure: str | None = None
    error: PublishFailed | None = None  # what the send raised: the caller's to raise, for its own sender
    sent: str | Worked | None = None  # what the send returned, as it returned it


NOT_ACTED = Acted()


class Done(msgspec.Struct, frozen=True):
    """How one message's decision ended, everything its record says but the timing."""

    decision: Decision
    reason: str
    delivery: Delivery | None = None  # the key and fingerprints, once extracted
    decided: Decided | None = None  # the look at the state the decision was taken on
    acted: Acted = NOT_ACTED
    cause: Cause | None = None


class Handled(msgspec.Struct, frozen=True):
    """What `Engine.handle` returns, the one value every surface reads: the decision's record,
    what the forward's send returned, and for a redelivery the result kept with its forward."""

    record: DecisionRecord
    #: what the send returned (the published id; the caller's `Worked`), None when nothing was sent
    sent: str | Worked | None = None
    #: a redelivery that was not sent again: the result (JSON text) kept with the forward of
    #: this message id and content (`cache_result`), from the state the decision was taken on
    kept: str | None = None


class Claimed(msgspec.Struct, frozen=True):
    """The lease is ours: `held` is the state the store wrote (the commit must present it)."""

    held: KeyState
    fence: int


class Beaten(msgspec.Struct, frozen=True):
    """Another writer changed the state between our read and our claim: `current` is what it wrote."""

    current: KeyState | None


#: A decision abandoned to a cancel: nothing acted on stays (a lease is released).
CANCELLED = Done(
    Decision.FAILED,
    "cancelled before the decision was carried out (a shutdown past its budget, or the caller): nack",
    cause=Cause.CANCELLED,
)


def sent_of(published: str | Worked) -> tuple[str, str | None]:
    """(the id the record shows, the result to keep with the forward)."""
    return (published.published_id, published.result) if isinstance(published, Worked) else (published, None)


def kept_result(done: Done) -> str | None:
    """For a redelivery that was not sent again: the result kept with its forward, if still kept."""
    decided, d = done.decided, done.delivery
    if decided is None or d is None or not decided.verdict.redelivery or decided.state is None:
        return None
    if done.acted is not NOT_ACTED:
        return None  # shadow mode sent it again: the caller has what this send returned
    wanted = (d.msg.message_id, d.fp)
    for message_id, fp, text in decided.state.results:
        if (message_id, fp) == wanted:
            return text
    return None


def send_failed(exc: PublishFailed, sender: Sender, fence: int | None = None) -> Acted:
    """A publish (or the caller's work) that failed: nack, saying which."""
    failure = f"cannot be forwarded: {exc}" if isinstance(exc, Unpublishable) else f"{sender.cause} failed: {exc}"
    return Acted(fence=fence, cause=sender.cause, failure=failure, error=exc)


def not_sent(acted: Acted) -> Decision:
    """A forward that did not go out: `rejected` when Pub/Sub could never take it (every delivery
    is answered the same, 4xx), else `failed` (5xx: retried)."""
    return Decision.REJECTED if isinstance(acted.error, Unpublishable) else Decision.FAILED
