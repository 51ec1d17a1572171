"""A decision's record, built once from how it ended (`handled.Done`), and its log line."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pubsub_filter.core.config.sections import Quieting
from pubsub_filter.core.engine.decision_line import line_level, write_line
from pubsub_filter.core.engine.handled import Delivery, Done
from pubsub_filter.core.engine.judge import Decided
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.model import Decision, DecisionRecord, Message

log = get_logger("pubsub_filter.engine")  # the decision lines' logger, as the engine's own lines


def record_of(
    route_name: str,
    msg: Message | None,
    done: Done,
    started: float,
    trace: str | None,
    message_id: str | None,
    enforced: bool,
    now: float,
) -> DecisionRecord:
    """The record of `done`, a decision on `route_name` that began at `started` (`perf_counter`)."""
    d, decided, acted = done.delivery, done.decided, done.acted
    return DecisionRecord(
        time=now,
        route=route_name,
        decision=done.decision,
        enforced=enforced,
        message_id=msg.message_id if msg is not None else (message_id or ""),
        key=d.key if d and d.missing is None else None,
        reason=done.reason,
        fingerprint=d.fp if d else None,
        message_fingerprint=d.message_fp if d else None,
        previous_fingerprint=decided.previous_fingerprint if decided else None,
        destination=d.route.destination if d else None,
        published_id=acted.published_id,
        fence=acted.fence,
        # a message not understood is recorded without the time it was published
        publish_time=msg.publish_time if msg is not None and done.decision is not Decision.REJECTED else None,
        delivery_attempt=msg.delivery_attempt if msg is not None else None,
        latency_ms=round((time.perf_counter() - started) * 1000, 3),
        trace=trace,
        details=details(d, decided),
        heartbeats=acted.heartbeats,
        committed=acted.committed,
        cause=done.cause or acted.cause,
    )


def details(d: Delivery | None, decided: Decided | None) -> Mapping[str, Any]:
    """The record's details: the payload's kind, then what the last look at the state found."""
    found = decided.details if decided is not None else {}
    if d is not None and d.missing is not None:
        found = {"missing_field": d.missing, **found}
    if d is None or not d.raw:
        return found
    return {"payload_kind": "raw", **found}


#: Each decision's log level (`decision_logs` may quiet a line below it: `decision_line`).
LEVELS = {
    Decision.FORWARDED: "info",
    Decision.SUPPRESSED: "info",
    Decision.DUPLICATE: "info",
    Decision.CONTENDED: "info",
    Decision.STALE: "warning",
    Decision.NOISE_ONLY: "info",
    Decision.FAIL_OPEN: "error",
    Decision.REJECTED: "warning",
    Decision.FAILED: "error",
    Decision.SUPERSEDED: "info",
}


def log_decision(rec: DecisionRecord, quieting: Mapping[str, Quieting] | None = None) -> None:
    """The decision's one log line: the record's fields that are set (`decision_line.write_line`)."""
    level = line_level(str(rec.decision), LEVELS[rec.decision], rec.message_id, quieting)
    write_line(log, level, rec)
