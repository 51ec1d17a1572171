"""What field tracking (`pubsub_filter.core.compare.fields`, for `pubsub-filter tune`) costs a whole-payload route.

    .venv/bin/python bench/fields.py [--messages 600] [--skip 4] [--rounds 5]
    .venv/bin/python bench/fields.py --instructions [--cycles 40] [--warmup 10]

One key, a 13-field payload, `exclude: [scrape_time]`, through the real `Engine` over
`GuardedStore` over the embedded SQLite store, with the in-memory publisher and recorder of
tests/support/fakes.py; decision log lines filtered out (level error). The stream repeats a
forward (a status changes) then `--skip` suppressions (a rescrape: only scrape_time changes).

Two modes, each on fresh state: **tracked**, the route as it runs; **untracked**, the same
engine with the route's field tracking switched off (`untracked`: no field state stored,
the fingerprint's own decode: the route as it was before this feature). Per round both run,
in rotated order; per mode the median process CPU µs per forward and per suppression; the
ratios tracked ÷ untracked are taken within each round, then the median and range over rounds.

`--instructions`: the same stream under callgrind, per mode four children (`prime`: the
warm-up cycles; then + K forwards; + K (forward, suppression); + K (forward, suppression,
suppression)); per forward = (forwards - prime) ÷ K, per suppression after a forward =
(pairs - forwards) ÷ K, after a suppression = (triples - pairs) ÷ K. Instruction counts do
not move with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import callgrind  # bench/callgrind.py
import harness  # bench/harness.py: the shared --smoke

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.compare.fingerprint import compile_scheme
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTE = "r"
MODES = ("tracked", "untracked")

BASE = {
    "id": 7,
    "status": "active",
    "team": "BOS",
    "player": "Jane Roe",
    "position": "G",
    "injury": "ankle",
    "note": "x" * 80,
    "game_date": "2026-11-25",
    "opponent": "NYK",
    "minutes": 31.5,
    "points": 22,
    "updated_by": "scraper-3",
    "scrape_time": "2026-11-25T10:00:00Z",
}


def untracked(rules: RouteRules) -> None:
    """Switch the route's field tracking off: no field state, the fingerprint's own decode."""
    rules.tracks_fields = False
    rules.scheme = compile_scheme(rules.route)


def engine_for(mode: str, store: SqliteStore) -> Engine:
    cfg = parse(
        {"routes": [{"name": ROUTE, "destination": "downstream", "key": ["payload.id"], "exclude": ["scrape_time"]}]}
    )
    engine = Engine(cfg, GuardedStore(store, cfg.store_errors), MemoryPublisher(), MemoryRecorder())
    if mode == "untracked":
        untracked(engine.rules[ROUTE])
    return engine


def message(cycle: int, step: int, skip: int) -> Message:
    """Step `step` of cycle `cycle`: 0 a forward (a new status), then rescrapes of it (a new scrape_time)."""
    n = cycle * (skip + 1) + step + 1
    scraped = f"2026-11-25T{10 + n // 3600 % 10:02}:{n // 60 % 60:02}:{n % 60:02}Z"
    payload = {**BASE, "status": f"s{cycle}", "scrape_time": scraped}
    return Message(json.dumps(payload).encode(), {}, f"m{n}", publish_time=float(n))


async def decide(engine: Engine, msg: Message, forward: bool) -> float:
    """The process CPU µs of one decision, checked to be the one the stream is built for."""
    started = time.process_time_ns()
    rec = (await engine.handle(ROUTE, msg)).record
    spent = (time.process_time_ns() - started) / 1000
    want = Decision.FORWARDED if forward else Decision.SUPPRESSED
    if rec.decision is not want:
        raise SystemExit(f"{msg.message_id} was {rec.decision}, expected {want}")
    return spent


async def timed(mode: str, cycles: int, skip: int, warmup: int) -> tuple[float, float]:
    """One mode on fresh state: median CPU µs per forward and per suppression after `warmup` cycles."""
    fwd: list[float] = []
    sup: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-fields-") as tmp:
        store = SqliteStore(Path(tmp) / "state.db")
        try:
            engine = engine_for(mode, store)
            for cycle in range(warmup + cycles):
                for step in range(skip + 1):
                    spent = await decide(engine, message(cycle, step, skip), step == 0)
                    if cycle >= warmup:
                        (fwd if step == 0 else sup).append(spent)
        finally:
            await store.close()
    return statistics.median(fwd), statistics.median(sup)


async def play(mode: str, phase: str, db: Path, cycles: int, warmup: int) -> None:
    """One callgrind child's stream: `warmup` cycles of (forward, 2 suppressions), then `phase`'s part."""
    store = SqliteStore(db)
    try:
        engine = engine_for(mode, store)
        for cycle in range(warmup):
            for step in range(3):
                await decide(engine, message(cycle, step, 2), step == 0)
        if phase == "prime":
            return
        steps = {"forwards": 1, "pairs": 2, "triples": 3}[phase]
        for cycle in range(warmup, warmup + cycles):
            for step in range(steps):
                await decide(engine, message(cycle, step, 2), step == 0)
    finally:
        await store.close()


CHILD = r"""
import asyncio, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[5])
import fields
fields.quiet()
with tempfile.TemporaryDirectory(prefix="bench-fields-i-") as tmp:
    asyncio.run(fields.play(sys.argv[1], sys.argv[2], Path(tmp) / "state.db", int(sys.argv[3]), int(sys.argv[4])))
"""


def quiet() -> None:
    # Decisions are logged at info; keep the bench about the engine and the store.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def instructions_main(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None and not harness.smoking():
        print("--instructions needs valgrind (Debian's package)", file=sys.stderr)
        return 2
    k = args.cycles
    print(harness.machine_line())
    print(f"K = {k}, warm-up {args.warmup} cycles; instructions per decision under callgrind, PYTHONHASHSEED=0")
    with tempfile.TemporaryDirectory(prefix="bench-fields-i-") as tmp:

        def argv(mode: str, phase: str) -> list[str]:
            return [mode, phase, str(k), str(args.warmup), str(harness.ROOT / "bench")]

        per = callgrind.per_decision(CHILD, MODES, argv, k, tmp)
    t, u = per["tracked"], per["untracked"]
    print(
        f"\ntracked / untracked: forward {t['forward'] / u['forward']:.3f}x (goal <= 1.10), "
        f"suppression {t['suppress'] / u['suppress']:.3f}x after a forward, "
        f"{t['again'] / u['again']:.3f}x after a suppression"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=600, help="messages measured per mode and round")
    ap.add_argument("--skip", type=int, default=4, help="suppressions after each forward")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20, help="cycles (a forward and its suppressions) before measuring")
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    ap.add_argument("--cycles", type=int, default=40, help="K, cycles counted per phase under --instructions")
    harness.add_smoke(ap)
    args = ap.parse_args()
    harness.smoke(args, messages=20, skip=1, rounds=1, warmup=2, cycles=2)
    quiet()
    if args.instructions:
        return instructions_main(args)
    cycles = max(1, args.messages // (args.skip + 1))
    print(harness.machine_line())
    print(f"{cycles} cycles of a forward and {args.skip} suppressions per mode and round, warm-up {args.warmup}")
    ratios: dict[str, list[float]] = {"forward": [], "suppress": []}
    for rnd in range(args.rounds):
        got: dict[str, tuple[float, float]] = {}
        for mode in MODES[rnd % 2 :] + MODES[: rnd % 2]:  # rotated
            got[mode] = asyncio.run(timed(mode, cycles, args.skip, args.warmup))
        (tf, ts), (uf, us) = got["tracked"], got["untracked"]
        ratios["forward"].append(tf / uf)
        ratios["suppress"].append(ts / us)
        print(
            f"round {rnd + 1}: forward {tf:.0f} / {uf:.0f} µs = {tf / uf:.3f}x   "
            f"suppress {ts:.0f} / {us:.0f} µs = {ts / us:.3f}x   (tracked / untracked, load {os.getloadavg()[0]:.2f})"
        )
    for what, xs in ratios.items():
        spread = f"range {min(xs):.3f} to {max(xs):.3f}x"
        print(f"{what}: tracked / untracked median {statistics.median(xs):.3f}x ({spread})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
