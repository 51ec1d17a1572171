"""The Pub/Sub publisher against the Pub/Sub emulator: forwards/s, time per forward, CPU per forward.

    .venv/bin/python bench/publish.py [--baseline DIR] [--messages 400] [--concurrency 1,64] \
        [--keys 50] [--rounds 3] [--size 26000]

Each forward is `PubsubPublisher.publish` (the product's), awaited as the engine awaits it:
the source message waits for the confirmation. `--concurrency N`: N forwards in flight at
once, over `--keys` ordering keys round robin. Per round, tree and concurrency, in rotated
order, each in a process of its own (after 20 forwards of warm-up: the channel, lazy
imports): forwards/s, p50 / p95 ms from publish to confirmation, CPU ms per forward of the
event loop's thread (what a forward takes from every other request the loop serves), of
the whole process (the client's threads too) and of the emulator. Medians over rounds.

`--baseline DIR` runs another tree's publisher in the same rounds (`git archive COMMIT | tar
-x -C DIR`): the before and after of a change to the publisher, at the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # bench/harness.py: this script's directory is on sys.path; puts the repository there too
from harness import cpu_seconds, quantile

from tests.support.emulators import EmulatorError, PubsubEmulator
from tests.support.pubsub_helpers import PubsubAdmin


async def forwards(publisher: Any, topic: str, n: int, concurrency: int, keys: int, data: bytes) -> list[float]:
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


async def measure(args: argparse.Namespace) -> dict[str, float]:
    """In the child: the tree's publisher, warmed up, then `--messages` forwards."""
    from pubsub_filter.backends.publishers.pubsub import PubsubPublisher  # the tree's, first on sys.path

    publisher = PubsubPublisher(project=args.project, timeout=30)
    data = os.urandom(args.size // 2).hex().encode()
    try:
        await forwards(publisher, args.topic, 20, args.concurrency, args.keys, data)
        loop0, me0, emu0 = time.thread_time(), cpu_seconds(os.getpid()), cpu_seconds(args.emulator_pid)
        t0 = time.perf_counter()
        waited = await forwards(publisher, args.topic, args.messages, args.concurrency, args.keys, data)
        elapsed = time.perf_counter() - t0
        loop1, me1, emu1 = time.thread_time(), cpu_seconds(os.getpid()), cpu_seconds(args.emulator_pid)
    finally:
        await publisher.close()
    n = args.messages
    return {
        "per_s": n / elapsed,
        "p50": quantile(waited, 0.5),
        "p95": quantile(waited, 0.95),
        "loop_cpu_ms": (loop1 - loop0) / n * 1000,
        "cpu_ms": (me1 - me0) / n * 1000,
        "emu_cpu_ms": (emu1 - emu0) / n * 1000,
    }


def child(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    for name in ("--tree", "--topic", "--project"):
        p.add_argument(name, required=True)
    for name in ("--emulator-pid", "--messages", "--concurrency", "--keys", "--size"):
        p.add_argument(name, type=int, required=True)
    args = p.parse_args(argv)
    sys.path.insert(0, args.tree)
    print(json.dumps(asyncio.run(measure(args))))
    return 0


def run_child(tree: Path, concurrency: int, args: argparse.Namespace, emulator: PubsubEmulator, topic: str) -> Any:
    cmd = [sys.executable, str(Path(__file__).resolve()), "child", "--tree", str(tree), "--topic", topic]
    cmd += ["--project", emulator.project, "--emulator-pid", str(emulator.pid or 0), "--messages", str(args.messages)]
    cmd += ["--concurrency", str(concurrency), "--keys", str(args.keys), "--size", str(args.size)]
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": emulator.host}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    if sys.argv[1:2] == ["child"]:
        return child(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, help="another tree whose publisher runs in the same rounds")
    p.add_argument("--messages", type=int, default=400)
    p.add_argument("--concurrency", default="1,64", help="forwards in flight, comma-separated")
    p.add_argument("--keys", type=int, default=50, help="ordering keys, round robin")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=26_000, help="bytes per message")
    harness.add_smoke(p)
    args = p.parse_args()
    harness.smoke(args, messages=5, concurrency="1", keys=1, rounds=1, size=100)
    trees = {"this tree": harness.ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as work:
        emulator = PubsubEmulator(log_dir=Path(work))
        try:
            emulator.start()
        except EmulatorError as exc:
            print(f"cannot start the Pub/Sub emulator: {exc}", file=sys.stderr)
            return 2
        try:
            admin = PubsubAdmin(emulator)
            try:
                topic = admin.topic("publish-bench")
                results: dict[tuple[int, str], list[dict[str, float]]] = {}
                print(harness.machine_line())
                print(f"load average {os.getloadavg()[0]:.1f} at start; {args.messages} forwards of {args.size} B")
                names = list(trees)
                for rnd in range(args.rounds):
                    for c in levels:
                        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                            results.setdefault((c, name), []).append(run_child(trees[name], c, args, emulator, topic))
                print(f"load average {os.getloadavg()[0]:.1f} at end; medians over {args.rounds} rounds")
                print("| in flight | tree | forwards/s | p50 ms | p95 ms | CPU ms/fwd: loop | process | emulator |")
                print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
                for (c, name), rs in sorted(results.items()):
                    med: dict[str, Any] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                    print(
                        f"| {c} | {name} | {med['per_s']:.0f} | {med['p50']:.1f} | {med['p95']:.1f} | "
                        f"{med['loop_cpu_ms']:.2f} | {med['cpu_ms']:.2f} | {med['emu_cpu_ms']:.2f} |"
                    )
            finally:
                with contextlib.suppress(Exception):
                    admin.cleanup()
        finally:
            emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
