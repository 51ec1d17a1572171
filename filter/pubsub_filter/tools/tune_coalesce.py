"""`tune --coalesce QUIET/MAX_WAIT`: how many forwards a `coalesce` would have saved on a route.

From the recorded decisions, per key in time order: the messages that arrived within QUIET of
each other (a burst ends at MAX_WAIT after its first message all the same) form a burst, as the
coalescer forms them (`pubsub_filter.core.engine.coalesce`). A burst that forwarded at least once would have
forwarded once, its newest; a burst that forwarded nothing would still forward nothing. So the
forwards it would have made are the bursts with a forward in them, and the rest are saved.

An estimate: a record's time is when its decision ended, not when its message arrived (they
differ by the decision's latency), and two instances would each forward their part of a burst
(at most one forward per instance per burst). Fail-open forwards are left as they are (no key
state: never coalesced), and so are the decisions of messages the coalescer never holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from pubsub_filter.core.ports import DecisionRow
from pubsub_filter.core.times import parse_duration

#: Decisions of messages a coalescer holds (what the stored state already answers is never held).
_HELD = ("forwarded", "suppressed", "noise_only", "superseded")


def parse_coalesce(text: str) -> tuple[float, float]:
    """`500ms/2s` → (quiet, max_wait) in seconds."""
    quiet, sep, max_wait = text.partition("/")
    if not sep:
        raise ValueError(f"{text!r}: write QUIET/MAX_WAIT, e.g. 500ms/2s")
    q, w = parse_duration(quiet), parse_duration(max_wait)
    if q > w:
        raise ValueError(f"{text!r}: quiet is longer than max_wait")
    return q, w


def saved(rows: Iterable[DecisionRow], quiet: float, max_wait: float) -> dict[str, Any]:
    """Forwards had, forwards a `coalesce` of (quiet, max_wait) would have made, and bursts."""
    by_key: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for row in rows:
        if row["key"] is not None and row["decision"] in _HELD:
            by_key[row["key"]].append((row["time"], row["decision"] == "forwarded"))
    had = would = bursts = 0
    for arrivals in by_key.values():
        arrivals.sort()
        first = last = None
        forwarded = False
        for at, fwd in arrivals:
            had += fwd
            if first is None or last is None or at - last >= quiet or at - first >= max_wait:
                would += forwarded
                bursts += first is not None
                first, forwarded = at, False
            last = at
            forwarded = forwarded or fwd
        if first is not None:
            would += forwarded
            bursts += 1
    return {
        "quiet_s": quiet,
        "max_wait_s": max_wait,
        "forwards": had,
        "would_forward": would,
        "saved": had - would,
        "bursts": bursts,
    }


def line(result: dict[str, Any]) -> str:
    return (
        f"coalesce {result['quiet_s']:g}s/{result['max_wait_s']:g}s: {result['forwards']} forwards would have been "
        f"{result['would_forward']} ({result['saved']} saved) over {result['bursts']} bursts (an estimate: "
        "decision times stand for arrivals; each extra instance may forward its part of a burst)"
    )
