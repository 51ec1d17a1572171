"""What a route's `tolerance` (and `changed_attributes`) costs: its forward and its suppression,
next to the same route without them (issue 30).

    .venv/bin/python bench/tolerance.py [--shape payload|rows] [--rows 450] [--messages 600] [--skip 4] [--rounds 5]

One key through the real `Engine` over `GuardedStore` over the embedded SQLite store, the
in-memory publisher and recorder of tests/support/fakes.py; decision log lines filtered out.
`--shape payload`: a 14-field payload, `exclude: [scrape_time]`; `--shape rows`: `--rows`
prop rows under `payload.props` keyed by `player` (the odds-props shape), one row's price
moving. The stream repeats a forward (a status changes) then `--skip` more messages.

Three modes, each on fresh state, in rotated order per round:

* **plain**: the route without a tolerance; the messages after each forward are rescrapes
  (only scrape_time changes): suppressed as unchanged. The baseline of both paths.
* **tolerance**: the route with `tolerance: {price: 12}` and `changed_attributes: [price,
  status]`; the messages after each forward move the price by 1 to 5: suppressed as moved
  within tolerance (the second look: the reference read, the moved rows compared).
* **unchanged**: the tolerance route, fed the plain stream: its suppressions as unchanged
  (the path every route's rescrapes take: the tolerance must cost it nothing).

Per mode, the median process CPU µs per forward and per suppression; the ratios to plain are
taken within each round, then the median and range over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import harness  # bench/harness.py: the shared --smoke

from filter.backends.stores.guard import GuardedStore
from filter.backends.stores.sqlite import SqliteStore
from filter.core.config import parse
from filter.core.engine import Engine
from filter.core.model import Decision, Message
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTE = "r"
MODES = ("plain", "tolerance", "unchanged")

BASE: dict[str, Any] = {
    "id": 7,
    "status": "active",
    "team": "BOS",
    "player": "Jane Roe",
    "position": "G",
    "market": "points",
    "note": "x" * 80,
    "game_date": "2026-11-25",
    "opponent": "NYK",
    "line": 22.5,
    "price": 100,
    "bookmaker": "book-3",
    "updated_by": "scraper-3",
    "scrape_time": "2026-11-25T10:00:00Z",
}


def route_of(mode: str, shape: str) -> dict[str, Any]:
    route: dict[str, Any] = {"name": ROUTE, "destination": "downstream", "key": ["payload.id"]}
    if shape == "rows":
        route.update(rows="payload.props", row_key=["player"], include=["player", "line", "price", "status"])
    else:
        route.update(exclude=["scrape_time"])
    if mode != "plain":
        route.update(tolerance={"price": 12}, changed_attributes=["price", "status"])
    return route


def engine_for(mode: str, shape: str, store: SqliteStore) -> Engine:
    cfg = parse({"routes": [route_of(mode, shape)]})
    return Engine(cfg, GuardedStore(store, cfg.store_errors), MemoryPublisher(), MemoryRecorder())


def message(mode: str, shape: str, rows: int, cycle: int, step: int, skip: int) -> Message:
    """Step `step` of cycle `cycle`: 0 a forward (a new status); then, in `tolerance` mode, a
    price moved within tolerance of the forward's, else a rescrape (a new scrape_time)."""
    n = cycle * (skip + 1) + step + 1
    scraped = f"2026-11-25T{10 + n // 3600 % 10:02}:{n // 60 % 60:02}:{n % 60:02}Z"
    price = 100 + (step if mode == "tolerance" else 0)
    status = f"s{cycle}"
    if shape == "rows":
        props = [{**BASE, "player": f"p{i:04d}", "price": 100 + i % 7, "scrape_time": scraped} for i in range(rows)]
        props[0] = {**props[0], "price": price, "status": status}
        payload: dict[str, Any] = {"id": 7, "props": props}
    else:
        payload = {**BASE, "status": status, "price": price, "scrape_time": scraped}
    return Message(json.dumps(payload).encode(), {}, f"m{n}", publish_time=float(n))


async def decide(engine: Engine, msg: Message, forward: bool, mode: str) -> float:
    """The process CPU µs of one decision, checked to be the one the stream is built for."""
    started = time.process_time_ns()
    rec = (await engine.handle(ROUTE, msg)).record
    spent = (time.process_time_ns() - started) / 1000
    want = Decision.FORWARDED if forward else Decision.SUPPRESSED
    reason = "moved within tolerance" if mode == "tolerance" else "unchanged since last forward"
    if rec.decision is not want or (not forward and rec.reason != reason):
        raise SystemExit(f"{mode}: {msg.message_id} was {rec.decision} ({rec.reason}), expected {want}")
    return spent


async def timed(mode: str, shape: str, rows: int, cycles: int, skip: int, warmup: int) -> tuple[float, float]:
    """One mode on fresh state: median CPU µs per forward and per suppression after `warmup` cycles."""
    fwd: list[float] = []
    sup: list[float] = []
    stream = "plain" if mode == "unchanged" else mode
    with tempfile.TemporaryDirectory(prefix="bench-tolerance-") as tmp:
        store = SqliteStore(Path(tmp) / "state.db")
        try:
            engine = engine_for(mode, shape, store)
            for cycle in range(warmup + cycles):
                for step in range(skip + 1):
                    msg = message(stream, shape, rows, cycle, step, skip)
                    spent = await decide(engine, msg, step == 0, stream)
                    if cycle >= warmup:
                        (fwd if step == 0 else sup).append(spent)
        finally:
            await store.close()
    return statistics.median(fwd), statistics.median(sup)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=("payload", "rows"), default="payload")
    ap.add_argument("--rows", type=int, default=450, help="rows per message with --shape rows")
    ap.add_argument("--messages", type=int, default=600, help="messages measured per mode and round")
    ap.add_argument("--skip", type=int, default=4, help="suppressions after each forward")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20, help="cycles (a forward and its suppressions) before measuring")
    harness.add_smoke(ap)
    args = ap.parse_args()
    harness.smoke(args, messages=20, skip=1, rounds=1, warmup=2, rows=20)
    # Decisions are logged at info; keep the bench about the engine and the store.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    cycles = max(1, args.messages // (args.skip + 1))
    print(harness.machine_line())
    rows = f", {args.rows} rows" if args.shape == "rows" else ""
    print(f"shape {args.shape}{rows}: {cycles} cycles of a forward and {args.skip} more, per mode and round")
    ratios: dict[str, list[float]] = {"forward": [], "within": [], "unchanged": []}
    for rnd in range(args.rounds):
        got: dict[str, tuple[float, float]] = {}
        for mode in MODES[rnd % 3 :] + MODES[: rnd % 3]:  # rotated
            got[mode] = asyncio.run(timed(mode, args.shape, args.rows, cycles, args.skip, args.warmup))
        (pf, ps), (tf, ts), (_, us) = got["plain"], got["tolerance"], got["unchanged"]
        ratios["forward"].append(tf / pf)
        ratios["within"].append(ts / ps)
        ratios["unchanged"].append(us / ps)
        print(
            f"round {rnd + 1}: forward {tf:.0f} / {pf:.0f} µs = {tf / pf:.3f}x   "
            f"suppress within tolerance {ts:.0f} / {ps:.0f} µs = {ts / ps:.3f}x   "
            f"suppress unchanged {us:.0f} / {ps:.0f} µs = {us / ps:.3f}x   (load {os.getloadavg()[0]:.2f})"
        )
    goals = {"forward": "<= 1.2", "within": "<= 1.2", "unchanged": "~ 1.0"}
    for what, xs in ratios.items():
        spread = f"range {min(xs):.3f} to {max(xs):.3f}x"
        print(f"{what}: tolerance / plain median {statistics.median(xs):.3f}x ({spread}; goal {goals[what]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
