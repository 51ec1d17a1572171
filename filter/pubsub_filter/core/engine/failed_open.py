"""Keys this instance forwarded fail-open: the destination may hold content the state does not record.

A fail-open forward publishes while the store is down, so it takes no lease and commits
nothing: the state keeps the content before it. A later message equal to that stored content
would then be suppressed, and the destination would stay on the fail-open content. So until a
claim of ours on the key lands (the claim writes the content downstream as unknown:
`transitions.claimed`), this instance decides the key as if what the destination holds were
unknown, and forwards its next message; and it holds that message's publish time as the
newest forwarded, so a redelivered older message is still stale.

This is one process's memory: another instance, or this one after a restart, does not know
(docs/decisions.md: "Ordering", fail-open). It is bounded: past `limit` keys the oldest entry is dropped, and its
route then treats every key whose last forward is no newer than that fail-open as unknown, so
a flood of keys costs extra forwards, never a lost change.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.model import KeyState

log = get_logger("pubsub_filter.engine")

#: Keys remembered at most: one long outage on a wide key space should not grow without bound.
LIMIT = 100_000


class FailedOpen:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._keys: OrderedDict[tuple[str, str], tuple[str, float | None, float]] = OrderedDict()
        self._horizon: dict[str, float] = {}  # route -> the newest fail-open dropped from memory

    def __len__(self) -> int:
        return len(self._keys)

    def remember(self, route: str, key: str, fingerprint: str, published: float | None, now: float) -> None:
        """A fail-open forward of content `fingerprint` (a message published at `published`)
        went out for (route, key) at `now`."""
        known = self._keys.get((route, key))
        if known is not None and _newer(known[1], published):
            published = known[1]  # an older message failed open after a newer one: keep the newer time
        self._keys[(route, key)] = (fingerprint, published, now)
        self._keys.move_to_end((route, key))
        if len(self._keys) > self.limit:
            (old_route, old_key), (_, _, at) = self._keys.popitem(last=False)
            if at > self._horizon.get(old_route, float("-inf")):
                self._horizon[old_route] = at
            log.warning("fail_open_memory_full", route=old_route, key=old_key, limit=self.limit)

    def view(self, route: str, key: str, state: KeyState | None) -> KeyState | None:
        """`state` as this instance must decide on it: unknown downstream after a fail-open of other content."""
        if state is None or not (self._keys or self._horizon):
            return state
        sent = self._keys.get((route, key))
        if sent is not None:
            fingerprint, published, _ = sent
            if _newer(published, state.publish_time):
                state = replace(state, publish_time=published)
            if not isinstance(state.downstream, str) or fingerprint == state.downstream:
                return state  # nothing known to contradict, or the very content that failed open
            return state.unknown_downstream()
        if not isinstance(state.downstream, str):
            return state
        horizon = self._horizon.get(route)
        if horizon is not None and state.forwarded_at is not None and state.forwarded_at <= horizon:
            return state.unknown_downstream()
        return state

    def claimed(self, route: str, key: str) -> None:
        """A claim of ours on the key landed: the store now carries what this memory held."""
        if self._keys:
            self._keys.pop((route, key), None)


def _newer(a: float | None, b: float | None) -> bool:
    return a is not None and (b is None or a > b)
