"""Row-level change detection: what `rows_mode: changed` costs and saves next to `rows_mode: whole`.

    .venv/bin/python bench/rows.py [--rows 450] [--changed 5] [--forwards 100] [--rounds 5] [--firestore]
    .venv/bin/python bench/rows.py --instructions [--forwards 20] [--warmup 2]
    .venv/bin/python bench/rows.py --profile [--forwards 100]

One key, an NBA.com injury report of `--rows` players (tests/support/payloads.py, ~290 KB
at 450 rows), through the real `Engine` over `GuardedStore` over the embedded SQLite store
(and with `--firestore` the Firestore emulator, started here and stopped at the end), with
the in-memory publisher and recorder of tests/support/fakes.py. Decision log lines are
filtered out (level error), so the figures are the engine, the fingerprint, the row work
and the store.

The stream per mode: one report (new key, not measured), then `--forwards` times:
* a forward: `--changed` rows get another injury status (different rows each time) and
  every row new scrape metadata, so the payload fingerprint changes;
* a suppress: the same statuses again under new scrape metadata (a rescrape).

Modes, each on fresh state, in rotated order every round:
* changed: `rows_mode: changed`: forwards publish only the added/changed rows;
* whole:   `rows_mode: whole`: forwards publish the whole report (row digests are still
           kept, for the decision record's which-rows-changed detail);
* no-rows (reference): the same route without `row_key`, so no row state is kept at all:
           what the row state itself costs on both paths.

Reported per mode (medians over rounds of per-round medians): µs per forwarded and per
suppressed decision (wall and process CPU), bytes published per forward, the stored row
state (bytes), and changed/whole ratios taken within each round. Row work happens on
forwards only, so the suppress path should cost the same in both modes.

`--instructions` counts CPU instructions instead of seconds (callgrind, `bench/callgrind.py`;
needs valgrind), which do not move with the machine's load. Per mode, one child process
after another, each under callgrind with PYTHONHASHSEED fixed, on the same stream (built
here once, pickled, loaded by every child, so building it costs every child the same):
the warm-up and the first report (`prime`); then `--forwards` forwards only (`forwards`);
then the forward/suppress pairs as above (`pairs`); then each pair followed by a second
rescrape of the same statuses (`triples`). Instructions per forward =
(forwards - prime) / K; per suppress = (pairs - forwards) / K, a suppress after a forward
as in the stream above; per suppress after a suppress = (triples - pairs) / K, the
check that the subtraction holds (a forward costs the same after a suppress as after a
forward, or the two suppress figures part). Every decision is checked in the child.

`--profile` runs `changed` and the route without row state in process (not under
callgrind) with cProfile on around each forward only and prints the top functions by own
time: where a row-tracked forward's extra work goes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import pickle
import pstats
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import callgrind
import harness  # bench/harness.py: this script's directory is on sys.path; puts the repository there too
import structlog
from harness import ROOT

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from tests.support.emulators import EmulatorError, FirestoreEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import STATUSES, injury_report

med = harness.median

ROUTE = "injury"
KEY = "2026-01-10"
T0 = 1_767_225_600.0
INCLUDE = ["player_lookup", "team", "game_date", "game_id", "injury_status", "reason", "reason_category"]
MODES = ("changed", "whole", "no-rows")


def config(mode: str) -> Config:
    route: dict[str, Any] = {
        "name": ROUTE,
        "destination": "phase3-injury-report",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "include": INCLUDE,
    }
    if mode != "no-rows":
        route |= {"row_key": ["player_lookup", "game_id"], "rows_mode": mode}
    return parse({"routes": [route], "store_errors": {"timeout": "10s", "budget": "20s"}})


# --- the stream ---------------------------------------------------------------------------


@dataclass
class Step:
    forward: Message
    suppress: Message


def messages(rows: int, changed: int, forwards: int, game_date: str = KEY) -> tuple[Message, list[Step]]:
    """The first report, then (changed report, rescrape of it) pairs. Built once, before timing."""
    statuses = [STATUSES[i % len(STATUSES)] for i in range(rows)]
    seq = iter(range(1, 10**9))

    def make(seed: int) -> Message:
        rep = injury_report(rows, seed=seed, game_date=game_date)  # new scrape metadata per seed
        for row, status in zip(rep["players"], statuses, strict=True):
            row["injury_status"] = status
        n = next(seq)
        return Message(json.dumps(rep).encode(), {}, f"m{n}", publish_time=T0 + n)

    first = make(0)
    steps = []
    cursor = 0
    for i in range(forwards):
        for _ in range(changed):  # different rows every time, walking through the report
            j = cursor % rows
            statuses[j] = STATUSES[(STATUSES.index(statuses[j]) + 1) % len(STATUSES)]  # always another
            cursor += 1
        steps.append(Step(make(2 * i + 1), make(2 * i + 2)))
    return first, steps


# --- one mode, one round ------------------------------------------------------------------


@dataclass
class Run:
    mode: str
    fwd_wall: list[float] = field(default_factory=list)  # µs per decision
    fwd_cpu: list[float] = field(default_factory=list)
    sup_wall: list[float] = field(default_factory=list)
    sup_cpu: list[float] = field(default_factory=list)
    published_bytes: list[int] = field(default_factory=list)
    published_rows: list[int] = field(default_factory=list)
    row_state: int = 0
    decisions: Counter[str] = field(default_factory=Counter)


async def timed(engine: Engine, msg: Message) -> tuple[Decision, float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    rec = (await engine.handle(ROUTE, msg)).record
    w1, c1 = time.perf_counter(), time.process_time()
    return rec.decision, (w1 - w0) * 1e6, (c1 - c0) * 1e6


async def run_mode(mode: str, store: Any, first: Message, steps: list[Step], warm: tuple[Message, list[Step]]) -> Run:
    cfg = config(mode)
    publisher = MemoryPublisher()
    engine = Engine(cfg, GuardedStore(store, cfg.store_errors), publisher, MemoryRecorder(), instance=mode)
    # warm up on another key: imports, caches, the store's first statements (not measured)
    await engine.handle(ROUTE, warm[0])
    for step in warm[1]:
        await engine.handle(ROUTE, step.forward)
        await engine.handle(ROUTE, step.suppress)
    run = Run(mode)
    await engine.handle(ROUTE, first)
    published_before = len(publisher.published)
    for step in steps:
        decision, wall, cpu = await timed(engine, step.forward)
        run.decisions[str(decision)] += 1
        if decision is Decision.FORWARDED:
            run.fwd_wall.append(wall)
            run.fwd_cpu.append(cpu)
        decision, wall, cpu = await timed(engine, step.suppress)
        run.decisions[str(decision)] += 1
        if decision is Decision.SUPPRESSED:
            run.sup_wall.append(wall)
            run.sup_cpu.append(cpu)
    for p in publisher.published[published_before:]:
        run.published_bytes.append(len(p.data) + sum(len(k) + len(v) for k, v in p.attributes.items()))
        run.published_rows.append(len(json.loads(p.data)["players"]))
    state = await store.read(ROUTE, KEY)
    run.row_state = len(state.rows) if state is not None and state.rows else 0
    return run


def check(run: Run, forwards: int, changed: int, rows: int) -> list[str]:
    """What each mode must have done; a bench that measured the wrong thing says so."""
    problems = []
    if run.decisions != Counter({"forwarded": forwards, "suppressed": forwards}):
        problems.append(f"{run.mode}: decisions {dict(run.decisions)}, expected {forwards} of each")
    # over the row-state cap (`pubsub_filter.core.compare.rows.MAX_STORED_BYTES`) nothing is stored: forwards are whole
    want = changed if run.mode == "changed" and run.row_state else rows
    if any(n != want for n in run.published_rows):
        problems.append(f"{run.mode}: forwards published {sorted(set(run.published_rows))} rows, expected {want}")
    return problems


# --- instructions (callgrind) and the forward's profile -----------------------------------


# The child: load the pickled stream, play one phase of it on fresh SQLite state, exit.
# Every child loads the same file and warms up the same way, so start-up, imports, the
# stream's bytes and the warm-up cancel out between two children's counts.
CHILD = r"""
import asyncio, pickle, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[4])
import rows
rows.quiet()
mode, phase = sys.argv[1], sys.argv[2]
with open(sys.argv[3], "rb") as f:
    stream = pickle.load(f)
with tempfile.TemporaryDirectory(prefix="bench-rows-i-") as tmp:
    asyncio.run(rows.play(mode, phase, Path(tmp) / "state.db", *stream))
"""


def rescrapes(steps: list[Step], rows: int, game_date: str = KEY) -> list[Message]:
    """Per step, a second rescrape of its suppress: the same statuses under other scrape metadata.
    Seeds and ids of their own, so the stream rows.py times is untouched."""
    out = []
    for i, step in enumerate(steps):
        statuses = [r["injury_status"] for r in json.loads(step.suppress.data)["players"]]
        rep = injury_report(rows, seed=1_000_001 + i, game_date=game_date)
        for row, status in zip(rep["players"], statuses, strict=True):
            row["injury_status"] = status
        t = step.suppress.publish_time
        out.append(Message(json.dumps(rep).encode(), {}, f"again{i}", publish_time=None if t is None else t + 0.5))
    return out


async def play(
    mode: str,
    phase: str,
    db: Path,
    first: Message,
    pairs: list[tuple[Message, Message]],
    again: list[Message],
    warm: list[Message],
) -> None:
    """One child's stream: warm-up on another key, the first report, then `phase`'s part of the
    (forward, suppress) pairs. Raises if any decision is not the one the stream is built for.
    Plain tuples, not `Step`s: the child unpickles them without this script as `__main__`."""
    from pubsub_filter.backends.stores.sqlite import SqliteStore

    async def expect(msg: Message, want: Decision) -> None:
        got = (await engine.handle(ROUTE, msg)).record.decision
        if got is not want:
            raise SystemExit(f"{mode} {phase}: {msg.message_id} was {got}, expected {want}")

    cfg = config(mode)
    store = SqliteStore(db)
    try:
        engine = Engine(cfg, GuardedStore(store, cfg.store_errors), MemoryPublisher(), MemoryRecorder(), instance=mode)
        for i, msg in enumerate(warm):  # the first report, then forward/suppress pairs
            await expect(msg, Decision.SUPPRESSED if i and i % 2 == 0 else Decision.FORWARDED)
        await expect(first, Decision.FORWARDED)
        if phase == "prime":
            return
        for (forward, suppress), extra in zip(pairs, again, strict=True):
            await expect(forward, Decision.FORWARDED)
            if phase == "forwards":
                continue
            await expect(suppress, Decision.SUPPRESSED)
            if phase == "triples":
                await expect(extra, Decision.SUPPRESSED)
    finally:
        await store.close()


def quiet() -> None:
    # Decisions are logged at info; keep the bench about the engine and the store.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def instructions_main(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None:
        print("--instructions needs valgrind (Debian's package)", file=sys.stderr)
        return 2
    k = args.forwards
    first, steps = messages(args.rows, args.changed, k)
    warm_first, warm_steps = messages(args.rows, args.changed, args.warmup, "2025-12-31")
    stream = (
        first,
        [(s.forward, s.suppress) for s in steps],
        rescrapes(steps, args.rows),
        [warm_first, *(m for s in warm_steps for m in (s.forward, s.suppress))],
    )
    print(machine())
    print(
        f"{args.rows}-row injury report, {args.changed} rows changed per forward, K = {k}, warm-up {args.warmup} "
        "pairs; instructions per decision under callgrind, PYTHONHASHSEED=0, SQLite store"
        + (f"; only inside {args.only}" if args.only else "")
    )
    with tempfile.TemporaryDirectory(prefix="bench-rows-i-") as tmp:
        path = Path(tmp) / "stream.pickle"
        path.write_bytes(pickle.dumps(stream))
        per = callgrind.per_decision(
            CHILD, MODES, lambda mode, phase: [mode, phase, str(path), str(ROOT / "bench")], k, tmp, args.only
        )
    print()
    ref = per["no-rows"]
    for mode in ("changed", "whole"):
        p = per[mode]
        p5, p5b, again = p["forward"] / ref["forward"], p["suppress"] / ref["suppress"], p["again"] / ref["again"]
        print(f"P5 {mode}: {p5:.3f}x (goal <= 2)   P5b {mode}: {p5b:.3f}x (goal <= 1.1, after a suppress {again:.3f}x)")
    return 0


def profile_main(args: argparse.Namespace) -> int:
    """In process, `changed` then the route without row state: first a plain pass with
    getrusage around each forward (user and system CPU, minor page faults: what an
    instruction count leaves out shows up here), then a pass with cProfile on around
    each forward only (top functions by own time)."""
    import resource

    first, steps = messages(args.rows, args.changed, args.forwards)
    warm = messages(args.rows, args.changed, args.warmup, game_date="2025-12-31")
    print(machine())

    async def one(mode: str, db: Path, prof: cProfile.Profile | None) -> list[tuple[float, float, int]]:
        from pubsub_filter.backends.stores.sqlite import SqliteStore

        cfg = config(mode)
        store = SqliteStore(db)
        usage: list[tuple[float, float, int]] = []  # user µs, system µs, minor faults per forward
        try:
            engine = Engine(
                cfg, GuardedStore(store, cfg.store_errors), MemoryPublisher(), MemoryRecorder(), instance=mode
            )
            for msg in [warm[0], *(m for s in warm[1] for m in (s.forward, s.suppress)), first]:
                await engine.handle(ROUTE, msg)
            for step in steps:
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                if prof is not None:
                    prof.enable()
                rec = (await engine.handle(ROUTE, step.forward)).record
                if prof is not None:
                    prof.disable()
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                usage.append(
                    ((r1.ru_utime - r0.ru_utime) * 1e6, (r1.ru_stime - r0.ru_stime) * 1e6, r1.ru_minflt - r0.ru_minflt)
                )
                assert rec.decision is Decision.FORWARDED, rec.decision
                await engine.handle(ROUTE, step.suppress)
        finally:
            await store.close()
        return usage

    with tempfile.TemporaryDirectory(prefix="bench-rows-p-") as tmp:
        for mode in ("changed", "no-rows"):
            usage = asyncio.run(one(mode, Path(tmp) / f"{mode}-plain.db", None))
            user, system, faults = (med([float(u[i]) for u in usage]) for i in range(3))
            print(
                f"\n{mode}: {args.forwards} forwards, no profiler, median per forward: user {user:,.0f} µs, "
                f"system {system:,.0f} µs, {faults:,.0f} minor page faults"
            )
        for mode in ("changed", "no-rows"):
            prof = cProfile.Profile()
            asyncio.run(one(mode, Path(tmp) / f"{mode}-prof.db", prof))
            stats = pstats.Stats(prof)
            total = stats.total_tt  # type: ignore[attr-defined]
            n = args.forwards
            print(f"\n{mode}: {n} forwards, {total / n * 1e6:,.0f} µs per forward under cProfile")
            print(f"{'own µs/fwd':>10} {'share':>6} {'calls/fwd':>9}  function")
            rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])  # type: ignore[attr-defined]
            for (file, line, name), (_cc, nc, tt, _ct, _callers) in rows[: args.top]:
                where = f"{Path(file).name}:{line}({name})" if line else name
                print(f"{tt / n * 1e6:10,.0f} {tt / total:6.1%} {nc / n:9,.1f}  {where}")
    return 0


# --- the run ------------------------------------------------------------------------------


def summarize(runs: list[list[Run]]) -> dict[str, dict[str, float]]:
    """Per mode: medians over rounds of per-round medians; ratios to `whole` per round, then median."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        per = [r for rnd in runs for r in rnd if r.mode == mode]
        if not per:
            continue
        s = {
            "fwd_us": med([med(r.fwd_wall) for r in per]),
            "fwd_cpu_us": med([med(r.fwd_cpu) for r in per]),
            "sup_us": med([med(r.sup_wall) for r in per]),
            "sup_cpu_us": med([med(r.sup_cpu) for r in per]),
            "bytes": med([med([float(b) for b in r.published_bytes]) for r in per]),
            "row_state": med([float(r.row_state) for r in per]),
        }
        # vs whole: what the rows mode costs; vs no-rows: what keeping row state costs (goals P5, P5b)
        for ref, suffix in (("whole", "vs_whole"), ("no-rows", "vs_norows")):
            for k in ("fwd_us", "sup_us", "bytes", "fwd_cpu_us", "sup_cpu_us"):
                pairs = []
                for rnd in runs:
                    this = next((r for r in rnd if r.mode == mode), None)
                    base = next((r for r in rnd if r.mode == ref), None)
                    if this is None or base is None:
                        continue
                    pick: Callable[[Run], float] = {
                        "fwd_us": lambda r: med(r.fwd_wall),
                        "sup_us": lambda r: med(r.sup_wall),
                        "fwd_cpu_us": lambda r: med(r.fwd_cpu),
                        "sup_cpu_us": lambda r: med(r.sup_cpu),
                        "bytes": lambda r: med([float(b) for b in r.published_bytes]),
                    }[k]
                    pairs.append(pick(this) / pick(base))
                s[f"{k}_{suffix}"] = med(pairs)
        out[mode] = s
    return out


def table(backend: str, summary: dict[str, dict[str, float]]) -> str:
    head = [
        "backend", "rows_mode", "µs/fwd wall / CPU", "vs whole", "µs/supp wall / CPU", "vs whole",
        "bytes published/fwd", "vs whole", "row state stored", "fwd CPU vs no row state (P5)",
        "supp CPU vs no row state (P5b)",
    ]  # fmt: skip
    rows = []
    for mode, s in summary.items():
        rows.append(
            [
                backend,
                mode if mode != "no-rows" else "whole, no row_key (ref)",
                f"{s['fwd_us']:,.0f} / {s['fwd_cpu_us']:,.0f}",
                f"{s['fwd_us_vs_whole']:.2f}x / {s['fwd_cpu_us_vs_whole']:.2f}x",
                f"{s['sup_us']:,.0f} / {s['sup_cpu_us']:,.0f}",
                f"{s['sup_us_vs_whole']:.2f}x / {s['sup_cpu_us_vs_whole']:.2f}x",
                f"{s['bytes']:,.0f}",
                f"{s['bytes_vs_whole']:.3f}x",
                f"{s['row_state']:,.0f} B",
                f"{s['fwd_cpu_us_vs_norows']:.2f}x",
                f"{s['sup_cpu_us_vs_norows']:.2f}x",
            ]
        )
    return harness.markdown_table(head, rows)


def machine() -> str:
    return harness.machine_line()


async def bench_backend(
    name: str, open_store: Callable[[str], Any], args: argparse.Namespace
) -> tuple[dict[str, dict[str, float]], list[str]]:
    first, steps = messages(args.rows, args.changed, args.forwards)
    warm = messages(args.rows, args.changed, args.warmup, game_date="2025-12-31")
    runs: list[list[Run]] = []
    problems: list[str] = []
    for rnd in range(args.rounds):
        order = MODES[rnd % len(MODES) :] + MODES[: rnd % len(MODES)]
        this: list[Run] = []
        for mode in order:
            store = open_store(f"r{rnd}-{mode}")
            try:
                run = await run_mode(mode, store, first, steps, warm)
            finally:
                await store.close()
            problems += check(run, args.forwards, args.changed, args.rows)
            this.append(run)
            print(
                f"{name} round {rnd + 1} {mode:<8} fwd {med(run.fwd_wall):8.0f} µs  supp {med(run.sup_wall):6.0f} µs  "
                f"bytes/fwd {med([float(b) for b in run.published_bytes]):9,.0f}  row state {run.row_state:,} B",
                file=sys.stderr,
                flush=True,
            )
        runs.append(this)
    return summarize(runs), problems


async def main_async(args: argparse.Namespace) -> int:
    size = len(messages(args.rows, args.changed, 1)[0].data)
    print(machine())
    print(
        f"{args.rows}-row injury report (~{size / 1024:.0f} KiB), {args.changed} rows changed per forward, "
        f"{args.forwards} forwards + {args.forwards} suppressions per mode and round, {args.rounds} rounds; "
        "engine + GuardedStore + store, in-memory publisher and recorder"
    )
    tables: list[str] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-rows-") as tmp:
        from pubsub_filter.backends.stores.sqlite import SqliteStore

        summary, found = await bench_backend("sqlite", lambda tag: SqliteStore(Path(tmp) / f"{tag}.db"), args)
        tables.append(table("sqlite", summary))
        problems += found
        if args.firestore:
            from pubsub_filter.backends.stores.firestore import FirestoreStore

            emu = FirestoreEmulator(log_dir=Path(tmp) / "firestore")
            try:
                await asyncio.get_running_loop().run_in_executor(None, emu.start)
            except EmulatorError as exc:
                print(f"firestore: cannot start the emulator: {exc}", file=sys.stderr)
                return 2
            try:

                def open_fs(tag: str) -> FirestoreStore:
                    with emu.env():
                        return FirestoreStore(project=emu.project, collection=f"bench-rows-{tag}")

                summary, found = await bench_backend("firestore-emu", open_fs, args)
                tables.append(table("firestore-emu", summary))
                problems += found
            finally:
                emu.stop()
    print()
    for t in tables:
        print(t)
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=450, help="players per injury report")
    ap.add_argument("--changed", type=int, default=5, help="rows whose status changes per forward")
    ap.add_argument("--forwards", type=int, default=100, help="forwards (and as many suppressions) per mode and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10, help="forward+suppress pairs on another key first, per run")
    ap.add_argument(
        "--firestore", action="store_true", help="also on the Firestore emulator (started and stopped here)"
    )
    ap.add_argument(
        "--instructions", action="store_true", help="count instructions per decision under callgrind (SQLite)"
    )
    ap.add_argument(
        "--only",
        metavar="FUNCTION",
        help="--instructions: count only inside this function (callgrind's name, e.g. the SHA-256 block of a stripped "
        "libcrypto, 0x000000000029ad80 in Debian 12's libssl3 3.0.19; see bench/README.md)",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile of the forwards, changed and no row state")
    ap.add_argument("--top", type=int, default=25, help="--profile: functions shown per mode")
    harness.add_smoke(ap)
    args = ap.parse_args()
    harness.smoke(args, rows=20, changed=2, forwards=2, rounds=1, warmup=1)
    if not 0 < args.changed <= args.rows:
        ap.error("--changed must be between 1 and --rows")
    quiet()
    if args.instructions:
        return instructions_main(args)
    if args.profile:
        return profile_main(args)
    try:
        return asyncio.run(main_async(args))
    except KeyboardInterrupt:  # the emulator, if any, was stopped by the finally above
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
