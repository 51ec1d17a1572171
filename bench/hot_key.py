"""A hot key on the Firestore emulator: forwards, store writes, contention and lost updates,
with and without `coalesce`.

    .venv/bin/python bench/hot_key.py [--rate 20] [--seconds 30] [--quiet 0.5] [--max-wait 2]

One key's price moves `--rate` times a second for `--seconds` (every update new content), each
handed to the real `Engine` as its own delivery, as push requests arrive (concurrently: one does
not wait for the one before). The state is Firestore (the emulator, started and stopped here,
through `GuardedStore`), the publisher and recorder the in-memory fakes, the clock and sleeps
real. A delivery answered with a nack (`contended`, `failed`) is delivered again a second later,
as Pub/Sub's retry would. Two runs on fresh state: the route without `coalesce`, then with it.

Reported: deliveries (with redeliveries), forwards, Firestore writes (commits of claims and
forwards), contended answers, and lost: 1 when the destination's last message is not the newest
update once every delivery is acked. The goal with coalesce: forwards <= one per max_wait,
0 contended, 0 lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import harness  # bench/harness.py: puts the repository on sys.path
import structlog

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from tests.support.emulators import EmulatorError, FirestoreEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTE = "odds"
RETRY_AFTER = 1.0


async def run(
    emu: FirestoreEmulator, tag: str, coalesce: dict[str, str] | None, rate: float, seconds: float
) -> list[str]:
    from pubsub_filter.backends.stores.firestore import FirestoreStore

    route: dict[str, Any] = {"name": ROUTE, "destination": "odds-out", "key": ["payload.line"]}
    if coalesce:
        route["coalesce"] = coalesce
    cfg = parse({"routes": [route]})
    with emu.env():
        inner = FirestoreStore(project=emu.project, collection=f"hot-{tag}-{int(time.time())}")
    publisher, recorder = MemoryPublisher(), MemoryRecorder()
    engine = Engine(cfg, GuardedStore(inner, cfg.store_errors), publisher, recorder)
    decisions: Counter[Decision] = Counter()
    deliveries = 0
    pending: set[asyncio.Task[None]] = set()

    async def deliver(msg: Message) -> None:
        nonlocal deliveries
        while True:
            deliveries += 1
            rec = (await engine.handle(ROUTE, msg)).record
            decisions[rec.decision] += 1
            if rec.acked:
                return
            await asyncio.sleep(RETRY_AFTER)  # Pub/Sub's retry

    count = int(rate * seconds)
    start = time.time()
    for i in range(count):
        due = start + i / rate
        if (wait := due - time.time()) > 0:
            await asyncio.sleep(wait)
        data = json.dumps({"line": "L1", "price": 100 + i}).encode()
        msg = Message(data=data, attributes={}, message_id=f"{tag}-{i}", publish_time=time.time())
        task = asyncio.ensure_future(deliver(msg))
        pending.add(task)
        task.add_done_callback(pending.discard)
    while pending:
        await asyncio.gather(*list(pending))
    elapsed = time.time() - start
    last = json.loads(publisher.published[-1].data)["price"] if publisher.published else None
    lost = int(last != 100 + count - 1)
    writes = inner.ops["write"]  # every write: claims, commits, releases
    await engine.close()
    label = "without coalesce" if not coalesce else f"coalesce {coalesce['quiet']}/{coalesce['max_wait']}"
    return [
        label,
        str(count),
        str(deliveries),
        str(len(publisher.published)),
        str(writes),
        str(decisions[Decision.CONTENDED]),
        str(decisions[Decision.SUPERSEDED]),
        str(lost),
        f"{elapsed:.1f}",
    ]


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-hot-") as tmp:
        emu = FirestoreEmulator(log_dir=Path(tmp) / "firestore")
        try:
            await asyncio.get_running_loop().run_in_executor(None, emu.start)
        except EmulatorError as exc:
            print(f"firestore: cannot start the emulator: {exc}", file=sys.stderr)
            return 2
        try:
            coalesce = {"quiet": f"{args.quiet:g}s", "max_wait": f"{args.max_wait:g}s"}
            rows = [
                await run(emu, "plain", None, args.rate, args.seconds),
                await run(emu, "coalesce", coalesce, args.rate, args.seconds),
            ]
        finally:
            emu.stop()
    print(harness.machine_line())
    print(f"one key, {args.rate:g} updates/s for {args.seconds:g}s, each new content; Firestore emulator")
    head = ["route", "updates", "deliveries", "forwards", "writes", "contended", "superseded", "lost", "s"]
    print(harness.markdown_table(head, rows))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--quiet", type=float, default=0.5)
    ap.add_argument("--max-wait", type=float, default=2.0)
    harness.add_smoke(ap)
    args = ap.parse_args()
    harness.smoke(args, rate=10.0, seconds=1.0, quiet=0.2, max_wait=0.5)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
