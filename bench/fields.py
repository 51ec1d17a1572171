"""What field tracking (`filter.core.fields`, for `pubsub-filter tune`) costs a whole-payload route.

    .venv/bin/python bench/fields.py [--messages 600] [--skip 4]

One key, a 13-field payload, `exclude: [scrape_time]`, through the real `Engine` over
`GuardedStore` over the embedded SQLite store, with the in-memory publisher and recorder of
tests/support/fakes.py; decision log lines filtered out (level error). The stream repeats a
forward (a status changes) then `--skip` suppressions (a rescrape: only scrape_time changes).
Prints the median process CPU µs per forward and per suppression. To compare with the code
before a change, run it from a checkout of that code (`git worktree add`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import harness  # bench/harness.py: the shared --smoke

from filter.backends.stores.guard import GuardedStore
from filter.backends.stores.sqlite import SqliteStore
from filter.core.config import parse
from filter.core.engine import Engine
from filter.core.model import Message
from tests.support.fakes import MemoryPublisher, MemoryRecorder

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


async def run(messages: int, skip: int) -> tuple[float, float]:
    cfg = parse(
        {"routes": [{"name": "r", "destination": "downstream", "key": ["payload.id"], "exclude": ["scrape_time"]}]}
    )
    fwd: list[float] = []
    sup: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "state.db")
        engine = Engine(cfg, GuardedStore(store, cfg.store_errors), MemoryPublisher(), MemoryRecorder())
        n = 0
        for i in range(messages // (skip + 1) + 20):
            for step in range(skip + 1):
                n += 1
                scraped = f"2026-11-25T{10 + n // 3600 % 10:02}:{n // 60 % 60:02}:{n % 60:02}Z"
                payload = {**BASE, "status": f"s{i}", "scrape_time": scraped}
                msg = Message(json.dumps(payload).encode(), {}, f"m{n}", publish_time=float(n))
                started = time.process_time_ns()
                rec = await engine.handle("r", msg)
                spent = (time.process_time_ns() - started) / 1000
                assert str(rec.decision) == ("forwarded" if step == 0 else "suppressed"), rec
                if i >= 20:  # warmed up
                    (fwd if step == 0 else sup).append(spent)
        await store.close()
    return sorted(fwd)[len(fwd) // 2], sorted(sup)[len(sup) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=600, help="messages measured")
    ap.add_argument("--skip", type=int, default=4, help="suppressions after each forward")
    harness.add_smoke(ap)
    args = ap.parse_args()
    harness.smoke(args, messages=20, skip=1)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    forward, suppress = asyncio.run(run(args.messages, args.skip))
    print(f"forward {forward:.0f} µs  suppress {suppress:.0f} µs (process CPU, medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
