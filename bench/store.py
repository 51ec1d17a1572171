"""What a decision costs on each state store: reads and writes per decision, and decisions/s.

    .venv/bin/python bench/store.py [--messages 500] [--keys 50] [--unchanged 0.8] [--concurrency 16]

A deterministic stream of messages over a set of keys, `--unchanged` of them carrying the
content last forwarded for their key (only a noise field moves), goes through the real
`Engine` over `GuardedStore` over each backend: a SQLite file, and the Firestore emulator
(started here via tests/support/emulators.py, stopped at the end). Publisher and
recorder are the in-memory fakes, so the numbers are the engine plus the store.

After a warm-up on throwaway state (`--warmup`), two passes per backend, each on fresh state:
- sequential: one message at a time; the store's `ops` counter is read around every
  decision, giving reads and writes per suppressed and per forwarded decision;
- concurrent: `--concurrency` messages in flight (as push deliveries would be); a
  message answered `contended` is redelivered (re-handled) until it is acked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import harness  # bench/harness.py: this script's directory is on sys.path; puts the repository there too
import structlog

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import ACKED, Decision, Message
from tests.support.emulators import EmulatorError, FirestoreEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTE = "bench"
T0 = 1_767_225_600.0


def stream(messages: int, keys: int, unchanged: float, seed: int = 7) -> list[Message]:
    """`messages` messages; the first of each key is new, then exactly enough changes that
    `unchanged` of the whole stream repeats its key's last content."""
    rng = random.Random(seed)
    order = list(range(keys)) + [rng.randrange(keys) for _ in range(messages - keys)]
    changes_wanted = max(0, round(messages * (1 - unchanged)) - keys)
    changes = set(rng.sample(range(keys, messages), min(changes_wanted, messages - keys)))
    version = Counter[int]()
    out = []
    for i, k in enumerate(order):
        if i in changes:
            version[k] += 1
        body = {"key": f"k{k:03d}", "rows": [{"id": j, "v": version[k] * 10 + j} for j in range(5)], "scraped": i}
        out.append(
            Message(
                data=json.dumps(body).encode(),
                attributes={"key": f"k{k:03d}"},
                message_id=str(i + 1),
                publish_time=T0 + i * 0.001,
            )
        )
    return out


def config() -> Config:
    return parse({"routes": [{"name": ROUTE, "destination": "out", "key": ["attributes.key"], "exclude": ["scraped"]}]})


async def sequential(store: Any, msgs: list[Message]) -> dict[str, Any]:
    cfg = config()
    engine = Engine(cfg, GuardedStore(store, cfg.store_errors), MemoryPublisher(), MemoryRecorder(), instance="seq")
    per: dict[Decision, Counter[str]] = defaultdict(Counter)
    latency: Counter[Decision] = Counter()  # total ms
    decisions = Counter[Decision]()
    started = time.perf_counter()
    for msg in msgs:
        before = Counter(store.ops)
        rec = (await engine.handle(ROUTE, msg)).record
        delta = Counter(store.ops)
        delta.subtract(before)
        per[rec.decision].update(delta)
        latency[rec.decision] += round((rec.latency_ms or 0.0) * 1000)  # in microseconds
        decisions[rec.decision] += 1
    elapsed = time.perf_counter() - started
    for d, us in latency.items():
        per[d]["ms"] = us // 1000
    return {"decisions": decisions, "per": per, "rate": len(msgs) / elapsed, "elapsed": elapsed}


async def concurrent(store: Any, msgs: list[Message], concurrency: int) -> dict[str, Any]:
    cfg = config()
    engine = Engine(cfg, GuardedStore(store, cfg.store_errors), MemoryPublisher(), MemoryRecorder(), instance="con")
    queue: asyncio.Queue[Message] = asyncio.Queue()
    for m in msgs:
        queue.put_nowait(m)
    decisions = Counter[Decision]()
    handled = 0

    async def worker() -> None:
        nonlocal handled
        while True:
            try:
                msg = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            rec = (await engine.handle(ROUTE, msg)).record
            handled += 1
            if rec.decision in ACKED:
                decisions[rec.decision] += 1
            else:  # contended / failed: Pub/Sub would redeliver it
                await asyncio.sleep(0.005)
                queue.put_nowait(msg)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"decisions": decisions, "handled": handled, "rate": len(msgs) / elapsed, "elapsed": elapsed}


def _per(result: dict[str, Any], decision: Decision, kind: str, fmt: str = ".2f") -> str:
    n = result["decisions"][decision]
    return f"{result['per'][decision][kind] / n:{fmt}}" if n else "-"


def _other(decisions: Counter[Decision]) -> str:
    rest = {k: v for k, v in decisions.items() if k not in (Decision.FORWARDED, Decision.SUPPRESSED) and v}
    return ", ".join(f"{k} {v}" for k, v in sorted(rest.items())) or "0"


async def run_backend(
    name: str, open_store: Any, msgs: list[Message], concurrency: int, warmup: int
) -> list[list[str]]:
    if warmup:  # a cold JVM (or cold caches) is not what a service sees after a minute
        store = open_store("warmup")
        try:
            await sequential(store, msgs[:warmup])
        finally:
            await store.close()
    store = open_store("seq")
    try:
        seq = await sequential(store, msgs)
    finally:
        await store.close()
    store = open_store("con")
    try:
        con = await concurrent(store, msgs, concurrency)
    finally:
        await store.close()
    d = seq["decisions"]
    rows = [
        [
            name,
            "sequential",
            str(sum(d.values())),
            str(d[Decision.FORWARDED]),
            str(d[Decision.SUPPRESSED]),
            _other(d),
            _per(seq, Decision.SUPPRESSED, "read"),
            _per(seq, Decision.SUPPRESSED, "write"),
            _per(seq, Decision.FORWARDED, "read"),
            _per(seq, Decision.FORWARDED, "write"),
            _per(seq, Decision.SUPPRESSED, "ms", ".1f"),
            _per(seq, Decision.FORWARDED, "ms", ".1f"),
            f"{seq['rate']:.0f}",
        ]
    ]
    c = con["decisions"]
    rows.append(
        [
            name,
            f"{concurrency} in flight",
            f"{sum(c.values())} ({con['handled'] - len(msgs)} redelivered)",
            str(c[Decision.FORWARDED]),
            str(c[Decision.SUPPRESSED]),
            _other(c),
            "",
            "",
            "",
            "",
            "",
            "",
            f"{con['rate']:.0f}",
        ]
    )
    return rows


def table(rows: list[list[str]]) -> str:
    head = [
        "backend", "mode", "decisions", "fwd", "supp", "other",
        "reads/supp", "writes/supp", "reads/fwd", "writes/fwd", "ms/supp", "ms/fwd", "decisions/s",
    ]  # fmt: skip
    return harness.markdown_table(head, rows)


async def main_async(args: argparse.Namespace) -> int:
    msgs = stream(args.messages, args.keys, args.unchanged)
    rows: list[list[str]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        from pubsub_filter.backends.stores.sqlite import SqliteStore

        def open_sqlite(tag: str) -> SqliteStore:
            return SqliteStore(Path(tmp) / f"{tag}.db")

        rows += await run_backend("sqlite", open_sqlite, msgs, args.concurrency, args.warmup)
        if not args.skip_firestore:
            from pubsub_filter.backends.stores.firestore import FirestoreStore

            emu = FirestoreEmulator(log_dir=Path(tmp) / "firestore")
            try:
                await asyncio.get_running_loop().run_in_executor(None, emu.start)
            except EmulatorError as exc:
                print(f"firestore: cannot start the emulator: {exc}", file=sys.stderr)
                return 2
            notes.append(f"Firestore emulator ready in {emu.started_in:.2f}s (pid {emu.pid}, {emu.host})")
            try:

                def open_fs(tag: str) -> FirestoreStore:
                    with emu.env():
                        return FirestoreStore(project=emu.project, collection=f"bench-{tag}")

                rows += await run_backend("firestore-emulator", open_fs, msgs, args.concurrency, args.warmup)
            finally:
                emu.stop()
                assert not emu.running
    print(harness.machine_line())
    print(
        f"{args.messages} messages over {args.keys} keys, {args.unchanged:.0%} unchanged; "
        f"engine + GuardedStore + store, in-memory publisher and recorder"
    )
    print(table(rows))
    for n in notes:
        print(n)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=500)
    ap.add_argument("--keys", type=int, default=50)
    ap.add_argument("--unchanged", type=float, default=0.8)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=200, help="messages run first on throwaway state, not reported")
    ap.add_argument("--skip-firestore", action="store_true", help="SQLite only (no Firestore emulator)")
    harness.add_smoke(ap)
    args = ap.parse_args()
    harness.smoke(args, messages=20, keys=4, concurrency=4, warmup=4)
    # Decisions are logged at info; keep the bench about the store, not the terminal.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
