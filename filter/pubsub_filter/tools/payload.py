"""The message `fingerprint` and `explain` read: a payload file, or a Pub/Sub push envelope.

The quick start's own files (`examples/push-*.json`) are push envelopes, the body Pub/Sub
POSTs; fingerprinting the envelope itself would fail on `payload.players is missing`
without saying why. An envelope is recognised by its shape and its `message.data` decoded,
with its attributes, message id and publish time, so the answer is the server's.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace

import msgspec

from pubsub_filter.core.envelope import EnvelopeError, parse_envelope
from pubsub_filter.core.model import Message

#: the message id when the file is a bare payload (nothing to compare with recent ids)
BARE_MESSAGE_ID = "explain"
_ENVELOPE_KEYS = frozenset({"message", "subscription", "deliveryAttempt"})


@dataclass(frozen=True)
class Input:
    message: Message
    #: what was done to the file, for stderr; None for a bare payload
    note: str | None


def _looks_like_envelope(data: bytes) -> bool:
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    if not isinstance(doc, dict) or "message" not in doc or not set(doc) <= _ENVELOPE_KEYS:
        return False
    message = doc["message"]
    return isinstance(message, dict) and isinstance(message.get("data"), str)


def read_message(path: str, attributes: Mapping[str, str]) -> Input:
    """The file (`-`: stdin) as a message; `attributes` given on the command line win."""
    data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()  # noqa: SIM115
    name = "stdin" if path == "-" else path
    if _looks_like_envelope(data):
        try:
            msg = parse_envelope(data)
        except EnvelopeError:
            pass  # shaped like one but not valid: a payload that happens to look so
        else:
            merged = {**msg.attributes, **attributes}
            note = (
                f"{name} is a Pub/Sub push envelope: using its message.data "
                f"(message {msg.message_id}, {len(merged)} attribute{'s' if len(merged) != 1 else ''})"
            )
            return Input(replace(msg, attributes=merged), note)
    return Input(Message(data=data, attributes=dict(attributes), message_id=BARE_MESSAGE_ID), None)
