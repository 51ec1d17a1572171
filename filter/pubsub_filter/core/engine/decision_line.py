"""Which level a decision's log line is written at.

Every decision line goes through structlog at its decision's level. The config's
`decision_logs` may quiet the lines of some decisions: log them at a lower level, or only a
share of them at their level and the rest at debug. Only the line is quieted: the decision is
recorded and counted before its line is written, whatever the line. Each engine holds its own
config's quieting: nothing here is process-wide.

A line goes through structlog as its fields (`DecisionRecord.line_fields`), or, to a chain that
takes it so (`WholeRecord`), as the record itself: a dozen keyword arguments copied three times
on their way through structlog were a fifth of the line's cost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from pubsub_filter.core.config.sections import Quieting
from pubsub_filter.core.model import DecisionRecord

#: The event key a `WholeRecord` chain finds the decision's record under.
RECORD = "decision_record"


def line_level(decision: str, own: str, message_id: str, quieting: Mapping[str, Quieting] | None) -> str:
    """The level of `decision`'s line for `message_id`: `own` unless `quieting` says otherwise."""
    q = quieting.get(decision) if quieting else None
    return own if q is None else level_of(q, own, message_id)


def level_of(q: Quieting, level: str, message_id: str) -> str:
    """The level one line is logged at: the decision's own (`level`) unless `q` lowers it, and
    debug when the message falls outside the sample. The sample is drawn from the message id,
    so every delivery of one message (a redelivery, a replay) is logged alike, on every instance."""
    if q.sample < 1.0 and not in_sample(message_id, q.sample):
        return "debug"
    return q.level or level


def in_sample(message_id: str, share: float) -> bool:
    """Whether `message_id` falls in the first `share` of the id space (a stable hash: the
    same answer in every process, unlike `hash()`)."""
    digest = hashlib.blake2b(message_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < share * 2**64


class WholeRecord:
    """A structlog processor that takes a decision line as its record (under `RECORD`), not as its
    fields: `write_line` passes the record to a chain that starts with one, the fields to any other
    (an application's own, structlog's capture in tests)."""

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        raise NotImplementedError


def write_line(log: Any, level: str, rec: DecisionRecord) -> None:
    """Log `rec`'s line at `level` through `log`, a structlog logger."""
    bound = log.bind()  # the bound logger itself, not found through proxies' failed attribute lookups
    chain = structlog.get_config()["processors"]
    if chain and isinstance(chain[0], WholeRecord):
        getattr(bound, level)("decision", decision_record=rec)
    else:
        getattr(bound, level)("decision", **rec.line_fields())
