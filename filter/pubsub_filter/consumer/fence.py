"""Destination-side fencing: a consumer drops a forwarded message older than one it already took for its key.

Fencing in the filter guards its own store: a holder whose lease lapsed mid-publish has its
commit refused, but its publish may still land downstream after the newer holder's. Every
fenced forward carries `filter_fence` (the lease's token, which only grows per route and
key), `filter_route` and `filter_key` (or `filter_key_sha256` for a key past 1,024 bytes).
`Fences.admit` keeps, in the consumer's own store, the highest fence taken per route and
key, and refuses a lower one, with a compare-and-set write so two consumer processes cannot
both take an older fence after a newer one.

An equal fence is taken again: it is the same forward redelivered (a nacked first attempt).
A message with no fence (shadow mode, fail-open, or not from the filter) is taken: there is
nothing to compare it with. A key's entry is forgotten `forget_after` seconds after its last
newer fence (default one day): the filter's own fence for a key starts again at 1 only after
its state expired (`state_ttl`, 30 days by default), so keep `forget_after` well below it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pubsub_filter.core.attributes import ATTR_FENCE, ATTR_KEY, ATTR_KEY_SHA256, ATTR_ROUTE
from pubsub_filter.core.errors import FilterError

DEFAULT_FORGET_AFTER = 86400.0
#: The highest fence: a lease token is a signed 64-bit integer in every store.
FENCE_MAX = 2**63 - 1
_FENCE_DIGITS = len(str(FENCE_MAX))
#: A lost compare-and-set means another consumer took a fence for the key just now: look again.
ATTEMPTS = 16


class FenceError(FilterError, ValueError):
    """The attributes carry a fence that is not the filter's (malformed, or without its route or key)."""


class FenceContended(FilterError):
    """Other consumers kept winning the compare-and-set for this key: nack and let it come again."""


@dataclass(frozen=True, slots=True)
class Seen:
    """The highest fence taken for one (route, key), and the store's compare-and-set token."""

    fence: int
    expires_at: float
    version: Any = None


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether to process the message (`accepted`), and why."""

    accepted: bool
    reason: str
    fence: int | None = None
    highest: int | None = None  # the highest fence taken for the key before this one


class FenceStore(Protocol):
    """The consumer's own store of highest fences, one entry per identity (route and key)."""

    async def read(self, identity: str) -> Seen | None: ...

    async def write(self, identity: str, seen: Seen | None, new: Seen) -> bool:
        """Store `new` if the entry is still `seen` (None: absent); False if another write came first."""

    async def close(self) -> None: ...


def parse_fence(raw: str) -> int:
    """The fence in `raw`, written as the filter writes it (1..2^63-1, no sign, no leading zero), or FenceError."""
    # The length is bounded before int(): outside input, and CPython refuses 4,300+ digits with a ValueError.
    if 0 < len(raw) <= _FENCE_DIGITS and raw.isascii() and raw.isdigit() and raw[0] != "0":
        fence = int(raw)
        if fence <= FENCE_MAX:
            return fence
    shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
    raise FenceError(f"{ATTR_FENCE}={shown!r} is not a fence the filter writes (an integer from 1 to {FENCE_MAX})")


def identity_of(attributes: Mapping[str, str]) -> tuple[str, int] | None:
    """(route and key as one string, fence) from a forward's attributes; None when it carries no fence."""
    raw = attributes.get(ATTR_FENCE)
    if raw is None:
        return None
    fence = parse_fence(raw)
    route = attributes.get(ATTR_ROUTE)
    if route is None:
        raise FenceError(f"{ATTR_FENCE} without {ATTR_ROUTE}: not a forward from the filter")
    # A short key and a long key's digest are kept apart by their prefix: no key can pose as another's digest.
    if (key := attributes.get(ATTR_KEY)) is not None:
        return f"{route}\x00k:{key}", fence
    if (digest := attributes.get(ATTR_KEY_SHA256)) is not None:
        return f"{route}\x00h:{digest}", fence
    raise FenceError(f"{ATTR_FENCE} without {ATTR_KEY} or {ATTR_KEY_SHA256}: not a forward from the filter")


class Fences:
    """`await fences.admit(message.attributes)` before processing a forwarded message; skip it unless accepted."""

    def __init__(
        self,
        store: FenceStore,
        forget_after: float = DEFAULT_FORGET_AFTER,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.forget_after = forget_after
        self.clock = clock

    async def admit(self, attributes: Mapping[str, str]) -> Admission:
        found = identity_of(attributes)
        if found is None:
            return Admission(True, "no fence: a forward without a lease (shadow mode, fail-open) or not the filter's")
        identity, fence = found
        for _ in range(ATTEMPTS):
            seen = await self.store.read(identity)
            now = self.clock()
            live = seen if seen is not None and seen.expires_at > now else None
            if live is not None and fence < live.fence:
                return Admission(False, f"older than fence {live.fence}, already taken for this key", fence, live.fence)
            if live is not None and fence == live.fence:
                return Admission(True, "the fence taken last for this key (a redelivery)", fence, live.fence)
            if await self.store.write(identity, seen, Seen(fence, now + self.forget_after)):
                return Admission(True, "newer than any fence taken for this key", fence, live.fence if live else None)
        raise FenceContended(f"lost the compare-and-set for {identity!r} {ATTEMPTS} times")

    async def close(self) -> None:
        await self.store.close()
