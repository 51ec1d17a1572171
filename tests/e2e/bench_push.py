"""Throughput of the push endpoint on the emulators: `python -m tests.e2e.bench_push [--messages 1000]`.

One `pubsub-filter serve` (Firestore emulator state, Pub/Sub emulator publisher, SQLite
records) behind one push subscription. The stream: `--messages` injury reports over
`--keys` game dates, round robin; each key's content changes every fifth message, so
80% are unchanged reruns (new scrape metadata, same statuses). Measured: from the first
source publish to the last decision recorded (the records SQLite file, read after a
SIGTERM flushed it), plus the decision mix and per-decision latency.

Not collected by pytest (no test_ prefix); starts and stops its own emulators.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.emulators import FirestoreEmulator, PubsubEmulator
from tests.support.payloads import STATUSES, injury_report
from tests.support.pubsub_helpers import PubsubAdmin
from tests.support.serve import records

from .conftest import ROUTE, Pipeline
from .test_push_e2e import FINAL


def stream(messages: int, keys: int, change_every: int) -> tuple[list[tuple[bytes, dict[str, str]]], list[str]]:
    """The messages and their ordering keys (the game date: each key's reports stay in order)."""
    out, ordering = [], []
    for i in range(messages):
        k, j = i % keys, i // keys
        day = f"2026-{1 + k // 28:02d}-{1 + k % 28:02d}"
        rep = injury_report(3, seed=i, game_date=day)
        rep["players"][0]["injury_status"] = STATUSES[(j // change_every) % len(STATUSES)]
        out.append((json.dumps(rep).encode(), {"n": str(i)}))
        ordering.append(day)
    return out, ordering


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-push-"))
    pubsub = PubsubEmulator(log_dir=work)
    firestore = FirestoreEmulator(log_dir=work)
    pubsub.start()
    firestore.start()
    pipeline = Pipeline(PubsubAdmin(pubsub), pubsub, firestore, work)
    try:
        extra: dict[str, Any] = {}
        if args.store == "sqlite":
            extra["store"] = {"backend": "sqlite", "path": str(work / "state.db")}
        proc = pipeline.start_filter("serve", **extra)
        pipeline.subscribe(proc.url(f"/push/{ROUTE}"), max_delivery_attempts=100)
        items, ordering = stream(args.messages, args.keys, args.change_every)
        t0 = time.time()
        ids = pipeline.admin.publish_many(pipeline.source, items, ordering if args.ordered else None)
        published = time.time() - t0
        wanted = set(ids)
        proc.wait_decisions(lambda ds: wanted <= {d["message_id"] for d in ds if d["decision"] in FINAL}, 600)
        pipeline.admin.delete_subscription(pipeline.push_subs.pop())
        proc.stop()
        rows = records(pipeline.records_path("serve"))
        downstream = pipeline.admin.drain(pipeline.dest_sub, 3.0)
    finally:
        pipeline.teardown()
        pubsub.stop()
        firestore.stop()
    final = {r["message_id"]: r for r in rows if r["decision"] in FINAL}
    last = max(r["time"] for r in final.values())
    lat: dict[str, list[float]] = {}
    for r in rows:
        lat.setdefault(r["decision"], []).append(r["latency_ms"])
    return {
        "store": args.store,
        "messages": len(ids),
        "keys": args.keys,
        "ordered_publish": args.ordered,
        "expected_forwards": args.keys * -(-args.messages // args.keys // args.change_every),
        "publish_s": round(published, 2),
        "first_publish_to_last_decision_s": round(last - t0, 2),
        "messages_per_s": round(len(ids) / (last - t0), 1),
        "final_decisions": dict(Counter(r["decision"] for r in final.values())),
        "all_decisions": dict(Counter(r["decision"] for r in rows)),
        "downstream_messages": len(downstream),
        "latency_ms": {
            d: {"p50": round(statistics.median(v), 1), "p95": round(pct(v, 0.95), 1), "n": len(v)}
            for d, v in lat.items()
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1000)
    p.add_argument("--keys", type=int, default=50)
    p.add_argument("--change-every", type=int, default=5, help="each key's content changes every N of its messages")
    p.add_argument(
        "--unordered", dest="ordered", action="store_false", help="publish without ordering keys (batches reorder)"
    )
    p.add_argument("--store", choices=["firestore", "sqlite"], default="firestore")
    print(json.dumps(run(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
