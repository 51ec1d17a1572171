"""What the in-process API takes as a message: whatever the caller holds, made a `Message`.

- a `Message` as it is;
- a raw payload (bytes, text, or a dict or list, JSON-encoded), with optional `message_id`,
  `attributes` and `publish_time`; without an id each call is a new delivery (a fresh id),
  so the content decides;
- a google-cloud-pubsub received message (`pubsub_v1.subscriber.message.Message`) or a
  `PubsubMessage`: anything with `data`, `attributes` and `message_id` (and `publish_time`);
- a push envelope, as the push endpoint receives it: a dict `{"message": {...},
  "subscription": ...}` (and only those keys, with `deliveryAttempt`): a payload dict of
  that exact shape must be given as bytes, or through `payload_message`.

Anything else is a `FilterTypeError` (a `TypeError`), before any decision.
"""

from __future__ import annotations

import calendar
import datetime
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from filter.core.envelope import effective_publish_time, parse_envelope
from filter.core.errors import FilterTypeError
from filter.core.model import Message

_ENVELOPE_KEYS = frozenset({"message", "subscription", "deliveryAttempt"})
_RAW = (bytes, bytearray, memoryview, str, Mapping, list, tuple)


def payload_message(
    payload: Any,
    attributes: Mapping[str, str] | None = None,
    message_id: str | None = None,
    publish_time: float | None = None,
) -> Message:
    """A plain payload (bytes, text, or anything JSON-encodable) as a message.

    Without a message id each call is a new delivery (a fresh id): the content decides.
    """
    if isinstance(payload, str):
        data = payload.encode()
    elif isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
    else:
        try:
            data = msgspec.json.encode(payload)
        except (msgspec.EncodeError, TypeError) as exc:
            raise FilterTypeError(f"the payload is not bytes, text or JSON-encodable: {exc}") from exc
    return Message(data, dict(attributes or {}), message_id or uuid.uuid4().hex, publish_time)


def push_message(envelope: bytes | str | Mapping[str, Any]) -> Message:
    """A push body (as received, or already decoded) → its message; `EnvelopeError` says what is wrong."""
    if isinstance(envelope, Mapping):
        envelope = msgspec.json.encode(envelope)
    return parse_envelope(envelope.encode() if isinstance(envelope, str) else envelope)


def is_envelope(value: object) -> bool:
    """A push envelope dict: a `message` object, and no key a push body does not have."""
    return isinstance(value, Mapping) and isinstance(value.get("message"), Mapping) and value.keys() <= _ENVELOPE_KEYS


def is_received(value: object) -> bool:
    """A google-cloud-pubsub message, received or built: duck-typed on the fields both carry."""
    return all(hasattr(value, name) for name in ("data", "attributes", "message_id"))


def received_message(received: Any) -> Message:
    """A google-cloud-pubsub message (subscriber's or `PubsubMessage`) → `Message`, as pull builds it."""
    attributes = {str(k): str(v) for k, v in dict(received.attributes).items()}
    return Message(
        data=bytes(received.data),
        attributes=attributes,
        message_id=str(received.message_id),
        publish_time=effective_publish_time(attributes, _epoch(getattr(received, "publish_time", None))),
        ordering_key=getattr(received, "ordering_key", None) or None,
        delivery_attempt=getattr(received, "delivery_attempt", None),
    )


def _epoch(value: Any) -> float | None:
    """A publish time as a client gives it (a datetime, nanoseconds kept; a protobuf Timestamp) → epoch seconds,
    computed as pull computes it (`filter.backends.gcp.timestamp`): the same message, the same float."""
    if value is None or isinstance(value, float | int):
        return None if value is None else float(value)
    if isinstance(value, datetime.datetime):
        seconds = calendar.timegm(value.utctimetuple())
        nanos = getattr(value, "nanosecond", None)
        if nanos is None:
            nanos = value.microsecond * 1000
        return float(seconds + nanos / 1e9) if nanos else float(seconds)
    if hasattr(value, "seconds") and hasattr(value, "nanos"):
        if not value.seconds and not value.nanos:
            return None  # an unset protobuf Timestamp
        return float(value.seconds + value.nanos / 1e9) if value.nanos else float(value.seconds)
    raise FilterTypeError(f"publish_time {type(value).__name__} is not a datetime, a Timestamp or epoch seconds")


def to_message(
    message: object,
    *,
    message_id: str | None = None,
    attributes: Mapping[str, str] | None = None,
    publish_time: float | None = None,
) -> Message:
    """`message`, whatever the caller holds (see the module's doc), as a `Message`."""
    raw_only = message_id is not None or attributes is not None or publish_time is not None
    if isinstance(message, Message):
        made = message
    elif is_envelope(message):
        assert isinstance(message, Mapping)
        made = push_message(message)
    elif isinstance(message, _RAW):
        return payload_message(message, attributes, message_id, publish_time)
    elif is_received(message):
        made = received_message(message)
    else:
        raise FilterTypeError(
            f"cannot read a {type(message).__module__}.{type(message).__qualname__} as a message: give a "
            "filter.Message, a payload (bytes, str, dict or list), a google-cloud-pubsub message or a push envelope"
        )
    if raw_only:
        raise FilterTypeError(
            "message_id=, attributes= and publish_time= go with a raw payload; "
            f"this {type(message).__name__} carries its own"
        )
    return made
