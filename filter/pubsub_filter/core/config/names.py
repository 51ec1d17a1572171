"""Pub/Sub's rules for topic and subscription names, checked in one place.

The config checks a route's `subscription` and `destination` with them when it loads, and
`pubsub_filter.google.shared.pubsub_path` with them when a command line or an attribute names a
resource, so a name is either refused by both with the same words or accepted by both.
"""

from __future__ import annotations

import re
from typing import Literal

from pubsub_filter.core.errors import FilterError

Kind = Literal["topic", "subscription"]

# Pub/Sub's resource ids: 3-255 characters, starting with a letter, not starting with `goog`.
PUBSUB_ID = r"(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}"
PROJECT_ID = r"[a-z][a-z0-9.:\-]{0,62}"

_SHORT = re.compile(PUBSUB_ID, re.ASCII)
_FULL = {
    kind: re.compile(rf"projects/{PROJECT_ID}/{kind}s/{PUBSUB_ID}", re.ASCII) for kind in ("topic", "subscription")
}


class PubsubNameError(FilterError, ValueError):
    """A topic or subscription name Pub/Sub would refuse; the message states the rule."""


def is_full(value: str, kind: Kind) -> bool:
    """`projects/PROJECT/{kind}s/ID`, every part valid."""
    return _FULL[kind].fullmatch(value) is not None


def check_name(value: str, kind: Kind) -> str:
    """`value` when it is a valid id or full path of a `kind`; PubsubNameError saying the rule otherwise."""
    if not (_SHORT.fullmatch(value) or is_full(value, kind)):
        raise PubsubNameError(
            f"{value!r} is not a {kind} id (3-255 characters: a letter, then letters, digits, - _ . ~ + %; "
            f"not starting with goog) or projects/PROJECT/{kind}s/ID"
        )
    return value
