"""What a route's `tolerance` (and `changed_attributes`) costs: its forward and its suppression,
next to the same route without them (issue 30).

    .venv/bin/python bench/tolerance.py [--shape payload|rows] [--rows 450] [--messages 600] [--skip 4] [--rounds 5]
    .venv/bin/python bench/tolerance.py --instructions [--shape payload|rows] [--cycles 10] [--warmup 4] [--modes M,...]

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

`--instructions`: the same streams under callgrind (`bench/callgrind.py`), per mode four
children (`prime`: the warm-up cycles; then + K forwards; + K (forward, suppression); + K
(forward, suppression, suppression)); per forward = (forwards - prime) / K, per suppression
after a forward = (pairs - forwards) / K, after a suppression = (triples - pairs) / K.
Instruction counts do not move with the load. SHA-256 is counted as valgrind runs it (no
SHA extensions), the same in every mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import callgrind  # bench/callgrind.py
import harness  # bench/harness.py: the shared --smoke

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
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


async def play(mode: str, shape: str, rows: int, phase: str, db: Path, cycles: int, warmup: int) -> None:
    """One callgrind child's stream: `warmup` cycles of (forward, 2 suppressions), then `phase`'s part.
    Every message of every phase is built first, whatever the phase: building them (a JSON
    encode of the whole document) then cancels out between two children's counts."""
    stream = "plain" if mode == "unchanged" else mode
    built = [[message(stream, shape, rows, c, step, 2) for step in range(3)] for c in range(warmup + cycles)]
    store = SqliteStore(db)
    try:
        engine = engine_for(mode, shape, store)
        for cycle in range(warmup):
            for step in range(3):
                await decide(engine, built[cycle][step], step == 0, stream)
        if phase == "prime":
            return
        steps = PHASES.index(phase)
        for cycle in range(warmup, warmup + cycles):
            for step in range(steps):
                await decide(engine, built[cycle][step], step == 0, stream)
    finally:
        await store.close()


PHASES = callgrind.PHASES

CHILD = r"""
import asyncio, logging, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[7])
import structlog
import tolerance
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
mode, shape, rows, phase, cycles, warmup = sys.argv[1:7]
with tempfile.TemporaryDirectory(prefix="bench-tolerance-i-") as tmp:
    db = Path(tmp) / "state.db"
    asyncio.run(tolerance.play(mode, shape, int(rows), phase, db, int(cycles), int(warmup)))
"""


def instructions_main(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None and not harness.smoking():
        print("--instructions needs valgrind (Debian's package)", file=sys.stderr)
        return 2
    k = args.cycles
    print(harness.machine_line())
    rows = f", {args.rows} rows" if args.shape == "rows" else ""
    print(f"shape {args.shape}{rows}, K = {k}, warm-up {args.warmup} cycles; instructions under callgrind")
    with tempfile.TemporaryDirectory(prefix="bench-tolerance-i-") as tmp:

        def argv(mode: str, phase: str) -> list[str]:
            return [mode, args.shape, str(args.rows), phase, str(k), str(args.warmup), str(harness.ROOT / "bench")]

        per = callgrind.per_decision(CHILD, args.modes.split(","), argv, k, tmp)
    t, pl = per["tolerance"], per["plain"]
    u = per.get("unchanged", {"suppress": math.nan, "again": math.nan})
    print(
        f"\ntolerance / plain: forward {t['forward'] / pl['forward']:.3f}x (goal <= 1.2), suppression within "
        f"tolerance {t['suppress'] / pl['suppress']:.3f}x after a forward, {t['again'] / pl['again']:.3f}x after a "
        f"suppression (goal <= 1.2); as unchanged {u['suppress'] / pl['suppress']:.3f}x, "
        f"{u['again'] / pl['again']:.3f}x"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=("payload", "rows"), default="payload")
    ap.add_argument("--rows", type=int, default=450, help="rows per message with --shape rows")
    ap.add_argument("--messages", type=int, default=600, help="messages measured per mode and round")
    ap.add_argument("--skip", type=int, default=4, help="suppressions after each forward")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20, help="cycles (a forward and its suppressions) before measuring")
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    ap.add_argument("--cycles", type=int, default=10, help="K, cycles counted per phase under --instructions")
    ap.add_argument("--modes", default=",".join(MODES), help="--instructions: modes counted")
    harness.add_smoke(ap)
    args = ap.parse_args()
    harness.smoke(args, messages=20, skip=1, rounds=1, warmup=2, rows=20, cycles=2)
    # Decisions are logged at info; keep the bench about the engine and the store.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    if args.instructions:
        return instructions_main(args)
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
