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

import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from pubsub_filter.core.envelope import parse_envelope
from pubsub_filter.core.errors import FilterTypeError
from pubsub_filter.core.model import Message
from pubsub_filter.google.received import received_message

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
            "pubsub_filter.Message, a payload (bytes, str, dict or list), a google-cloud-pubsub message "
            "or a push envelope"
        )
    if raw_only:
        raise FilterTypeError(
            "message_id=, attributes= and publish_time= go with a raw payload; "
            f"this {type(message).__name__} carries its own"
        )
    return made
