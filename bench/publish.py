"""The publisher's batch window (`MAX_LATENCY`) against the Pub/Sub emulator: forwards/s, time
per forward and CPU per forward, one forward at a time and many at once.

    .venv/bin/python bench/publish.py [--windows 0,1,5,10] [--messages 400] [--concurrency 1,64] \
        [--keys 50] [--rounds 3] [--size 26000]

Each forward is `PubsubPublisher.publish` (the product's, one client per window, the window
set on the module before the client is built), awaited as the engine awaits it: the source
message waits for the confirmation. `--concurrency N`: N forwards in flight at once, over
`--keys` ordering keys round robin (a key's messages go out one batch at a time, so only
forwards of the same key in the same window share an RPC: what the batch window can save).
Per round and window, in rotated order: forwards/s, p50 / p95 ms from publish to
confirmation, and CPU ms per forward of this process (the client's threads) and of the
emulator. Medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # bench/harness.py: this script's directory is on sys.path; puts the repository there too
from harness import cpu_seconds, quantile

import filter.backends.publishers.pubsub as pubsub_module
from filter.backends.publishers.pubsub import PubsubPublisher
from tests.support.emulators import EmulatorError, PubsubEmulator
from tests.support.pubsub_helpers import PubsubAdmin


async def forwards(
    publisher: PubsubPublisher, topic: str, n: int, concurrency: int, keys: int, data: bytes
) -> list[float]:
    """Publish n messages, `concurrency` in flight; the ms each waited for its confirmation."""
    waited: list[float] = []
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            t = time.perf_counter()
            await publisher.publish(topic, data, {"n": str(i)}, ordering_key=f"key-{i % keys}")
            waited.append((time.perf_counter() - t) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return waited


async def measure(
    window_ms: float, topic: str, args: argparse.Namespace, concurrency: int, emulator_pid: int | None
) -> dict[str, float]:
    pubsub_module.MAX_LATENCY = window_ms / 1000  # read when the client is built
    publisher = PubsubPublisher(project=args.project, timeout=30)
    data = os.urandom(args.size // 2).hex().encode()
    try:
        await forwards(publisher, topic, 20, concurrency, args.keys, data)  # warm-up: channel, threads
        me0, emu0, t0 = cpu_seconds(os.getpid()), cpu_seconds(emulator_pid), time.perf_counter()
        waited = await forwards(publisher, topic, args.messages, concurrency, args.keys, data)
        elapsed = time.perf_counter() - t0
        me1, emu1 = cpu_seconds(os.getpid()), cpu_seconds(emulator_pid)
    finally:
        await publisher.close()
    n = args.messages
    return {
        "per_s": n / elapsed,
        "p50": quantile(waited, 0.5),
        "p95": quantile(waited, 0.95),
        "cpu_ms": (me1 - me0) / n * 1000,
        "emu_cpu_ms": (emu1 - emu0) / n * 1000,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", default="0,1,5,10", help="MAX_LATENCY values in ms, comma-separated")
    p.add_argument("--messages", type=int, default=400)
    p.add_argument("--concurrency", default="1,64", help="forwards in flight, comma-separated")
    p.add_argument("--keys", type=int, default=50, help="ordering keys, round robin")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=26_000, help="bytes per message")
    harness.add_smoke(p)
    args = p.parse_args()
    harness.smoke(args, windows="0", messages=5, concurrency="1", keys=1, rounds=1, size=100)
    windows = [float(w) for w in args.windows.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as work:
        emulator = PubsubEmulator(log_dir=Path(work))
        try:
            emulator.start()
        except EmulatorError as exc:
            print(f"cannot start the Pub/Sub emulator: {exc}", file=sys.stderr)
            return 2
        try:
            os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
            args.project = emulator.project
            admin = PubsubAdmin(emulator)
            try:
                topic = admin.topic("publish-bench")
                results: dict[tuple[int, float], list[dict[str, float]]] = {}
                print(harness.machine_line())
                print(f"load average {os.getloadavg()[0]:.1f} at start; {args.messages} forwards of {args.size} B")
                for rnd in range(args.rounds):
                    for c in levels:
                        order = windows[rnd % len(windows) :] + windows[: rnd % len(windows)]
                        for w in order:
                            r = asyncio.run(measure(w, topic, args, c, emulator.pid))
                            results.setdefault((c, w), []).append(r)
                print(f"load average {os.getloadavg()[0]:.1f} at end; medians over {args.rounds} rounds")
                print("| in flight | window ms | forwards/s | p50 ms | p95 ms | CPU ms/fwd: publisher | emulator |")
                print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
                for (c, w), rs in sorted(results.items()):
                    med: dict[str, Any] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                    print(
                        f"| {c} | {w:g} | {med['per_s']:.0f} | {med['p50']:.1f} | {med['p95']:.1f} | "
                        f"{med['cpu_ms']:.2f} | {med['emu_cpu_ms']:.2f} |"
                    )
            finally:
                with contextlib.suppress(Exception):
                    admin.cleanup()
        finally:
            emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
