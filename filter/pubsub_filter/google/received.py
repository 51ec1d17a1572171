"""A Pub/Sub message, as a Google client gives it, made the `Message` the engine takes.

One place for every surface that holds a client's message (pull, replay, the in-process
API), so the same message has the same attributes, publish time and ordering key whichever
surface delivered it, and no surface imports another to reuse it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from pubsub_filter.core.envelope import effective_publish_time
from pubsub_filter.core.errors import FilterTypeError
from pubsub_filter.core.model import Message
from pubsub_filter.google.shared import timestamp


def received_message(
    received: Any, subscription: str | None = None, *, attributes: Mapping[str, str] | None = None
) -> Message:
    """A Pub/Sub message → `Message`: anything with `data`, `attributes` and `message_id` (and,
    when it has them, `publish_time`, `ordering_key`, `delivery_attempt`).

    That is a subscriber's message, a `PubsubMessage`, or a value holding their fields (replay's
    dead letter). `attributes`, when given, are the ones the message is decided with instead of
    its own (replay drops what describes the dead-lettering).
    """
    given = received.attributes if attributes is None else attributes
    # str(): a `PubsubMessage` or a caller's value may hold other than text; the engine keys on str.
    attrs = {str(k): str(v) for k, v in dict(given).items()}
    return Message(
        data=bytes(received.data),
        attributes=attrs,
        message_id=str(received.message_id),
        publish_time=effective_publish_time(attrs, epoch(getattr(received, "publish_time", None))),
        ordering_key=getattr(received, "ordering_key", None) or None,
        delivery_attempt=getattr(received, "delivery_attempt", None),
        subscription=subscription,
    )


def epoch(value: Any) -> float | None:
    """A publish time as a client gives it (a datetime, nanoseconds kept; a protobuf Timestamp;
    epoch seconds) → epoch seconds, as `pubsub_filter.google.shared.timestamp` computes them: the same
    message, the same float. None, or an unset Timestamp, is no publish time."""
    if value is None or isinstance(value, float | int):
        return None if value is None else float(value)
    if isinstance(value, datetime.datetime):
        return timestamp(value)
    if hasattr(value, "seconds") and hasattr(value, "nanos"):
        if not value.seconds and not value.nanos:
            return None  # an unset protobuf Timestamp
        return float(value.seconds + value.nanos / 1e9) if value.nanos else float(value.seconds)
    raise FilterTypeError(f"publish_time {type(value).__name__} is not a datetime, a Timestamp or epoch seconds")
