"""What a decision answers the source: ack or nack, and the status the push endpoint sends.

One function for every surface: push answers the status, pull and replay ack or nack, the
in-process `Nack` carries the status the sidecar would have answered.
"""

from __future__ import annotations

from dataclasses import dataclass

from pubsub_filter.core.model import Cause, Decision, DecisionRecord


@dataclass(frozen=True, slots=True)
class Answer:
    ack: bool
    status: int  # the push endpoint's: Pub/Sub acks a push on 2xx and redelivers on anything else
    retry_after: bool  # a 503 or 429: ask again shortly (push sends `Retry-After: 1`)


ACK = Answer(ack=True, status=200, retry_after=False)  # the emulator does not take 202 as an ack
UNKNOWN_ROUTE = Answer(ack=False, status=404, retry_after=False)
NOT_UNDERSTOOD = Answer(ack=False, status=400, retry_after=False)
RETRY = Answer(ack=False, status=503, retry_after=True)  # contended, or the store could not decide
FAILED = Answer(ack=False, status=500, retry_after=False)
BUSY = Answer(ack=False, status=429, retry_after=True)  # turned away unread, at the bound on bytes in flight


def answer_for(rec: DecisionRecord) -> Answer:
    if rec.acked:
        return ACK
    if rec.decision is Decision.REJECTED:
        return UNKNOWN_ROUTE if rec.cause is Cause.UNKNOWN_ROUTE else NOT_UNDERSTOOD
    if rec.decision is Decision.CONTENDED or rec.cause is Cause.STORE:
        return RETRY
    if rec.cause is Cause.OVERLOADED:
        return BUSY
    return FAILED
