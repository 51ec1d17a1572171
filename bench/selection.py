"""A decision against a last forward made under another selection ÷ one under the route's own
(`pubsub_filter.core.compare.reselect`), CPU µs per `judge.decide`, in process: the look at the state alone.

Two shapes: a whole-payload route (14 top-level fields) and a 450-row route (the injury report
of tests/support/payloads.py, 7 fields a row compared). For each, the state of a forward made
under the route's selection (`same`), and of one made under the selection before an `exclude`
was added (`narrowed`: the message is suppressed as unchanged either way). Until a key's next
forward stores the new selection, each of its messages pays `narrowed`'s cost.

    .venv/bin/python bench/selection.py [--messages 2000] [--rounds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.judge import decide
from pubsub_filter.core.engine.transitions import forwarded
from pubsub_filter.core.model import Decision, KeyState, Message
from tests.support.payloads import injury_report

#: the injury row's compared fields (7): the narrowed route leaves `reason_category` out
ROW_FIELDS = ["player_lookup", "team", "game_id", "injury_status", "reason", "reason_category", "game_time"]


def route(shape: str, exclude: list[str]) -> RouteRules:
    r: dict[str, Any] = {"name": "r", "destination": "out", "key": ["payload.k"], "exclude": exclude}
    if shape == "rows":
        r = {
            **r,
            "key": ["payload.game_date"],
            "rows": "payload.players",
            "row_key": ["player_lookup"],
            "include": [f for f in ROW_FIELDS if f not in exclude],
            "exclude": [],
        }
    return RouteRules(parse({"routes": [r]}).routes[0])


def body(shape: str) -> bytes:
    if shape == "rows":
        return json.dumps(injury_report(450)).encode()
    return json.dumps({"k": "a", **{f"f{i}": i * 1.5 for i in range(12)}, "scraped_at": 1}).encode()


def stored(rules: RouteRules, data: bytes) -> KeyState:
    """The state a forward of `data` under `rules` commits."""
    payload, fp = rules.scheme(data)
    d = decide(rules, Message(data, {}, "m0"), fp, None, 0.0, False, random.Random(0), payload)
    return forwarded(None, Message(data, {}, "m0"), fp, 1, d.out, 0.0, 1e12)


def per_decision(rules: RouteRules, state: KeyState, data: bytes, n: int, cold: bool = False) -> float:
    """µs a decision; each on a fresh copy of the data and of the stored state (as a read gives
    them: their hashes not yet computed), and with `cold`, none of the looks already taken."""
    payload, fp = rules.scheme(data)
    rng = random.Random(0)
    msg = Message(data, {}, "m1")
    first = decide(rules, msg, fp, state, 1.0, False, rng, payload)
    assert first.verdict.decision is Decision.SUPPRESSED
    rules.keep_read(first.read)
    copies = [
        (Message(bytes(bytearray(data)), {}, "m1"), replace(state, rows=bytes(bytearray(state.rows or b""))))
        for _ in range(n)
    ]
    spent = 0.0
    for m, s in copies:
        if cold:
            rules.looks.clear()
        start = time.process_time()
        rules.keep_read(decide(rules, m, fp, s, 1.0, False, rng, payload).read)  # as the engine does
        spent += time.process_time() - start
    return spent / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="one tiny round: does it still run")
    args = ap.parse_args()
    if args.smoke:
        args.messages, args.rounds = 20, 1
    for shape, n in (("payload", args.messages), ("rows", max(args.messages // 20, 10))):
        base = ["scraped_at"] if shape == "payload" else []
        old, new = route(shape, base), route(shape, [*base, "f3" if shape == "payload" else "reason_category"])
        data = body(shape)
        same, narrowed = stored(new, data), stored(old, data)
        a = [per_decision(new, same, data, n) for _ in range(args.rounds)]
        b = [per_decision(new, narrowed, data, n, cold=True) for _ in range(args.rounds)]
        c = [per_decision(new, narrowed, data, n) for _ in range(args.rounds)]
        ma, mb, mc = statistics.median(a), statistics.median(b), statistics.median(c)
        start = time.process_time()
        for _ in range(n):
            new.scheme(bytes(bytearray(data)))
        fingerprint = (time.process_time() - start) / n * 1e6
        print(
            f"{shape:8} same selection {ma:8.1f} µs; another selection: first look {mb:8.1f} µs ({mb / ma:.1f}x), "
            f"the same content again {mc:8.1f} µs ({mc / ma:.1f}x); "
            f"selection stored: {len(same.selection or '')} bytes; "
            f"the message's fingerprint alone {fingerprint:.1f} µs"
        )


if __name__ == "__main__":
    main()
