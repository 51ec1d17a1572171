"""What the payload fingerprint costs per message, next to SHA-256 over the same bytes.

    .venv/bin/python bench/fingerprint.py [--rounds 7] [--target 0.2] [--rows 1,10,450] [--json] [--profile]

On realistic injury reports (tests/support/payloads.py) with the `injury-report` route of
examples/filter.yaml (rows payload.players, row_key [player_lookup, game_id], 7 included
fields), per message:

* raw:   `hashlib.sha256` over the base64 text of `message.data` as it arrives in the push
         envelope (the floor: hashing the bytes we were given, nothing understood);
* ref:   the seeds' approach: base64 decode, `json.loads`, select, `json.dumps(sort_keys=True)`,
         SHA-256 (`tests.support.seeds.reference_canonical`);
* ours:  `parse_envelope` of the push body (filter/pubsub_filter/core/envelope.py: base64 decoded by pybase64
         straight from the body), then `compile_scheme(route)(data)`: what the push
         endpoint runs per message, from the request body to the fingerprint.

Three more columns say where the gap is:

* generic: ours without the typed fast path (`Scheme.fast=None`): the general decode +
           select path, i.e. what every route shape without a fast path pays;
* ours+mb64: ours with envelope.py's pybase64 path switched off (a copy of the module
           whose `_fast_decode` always declines): msgspec decodes the base64 while it parses
           the envelope, as the product did before pybase64;
* ours+binascii: the standard library's `b64decode(str, validate=True)` of the field's
           text (what envelope.py did before msgspec), then the scheme: no envelope parse.

Timing (`--timer cpu`, the default: the process's CPU time, so that other people's jobs
on a shared machine are not counted as our cost; `--timer wall` for wall time): per
round, each function runs in a batch of `number` calls (calibrated once so one batch
takes about `--target` seconds), the functions interleaved and their order rotated from
round to round; µs/msg is the median over rounds, and each ratio is the median of the
per-round ratios (a ratio compares batches run within a second of each other, so slow
drifts in machine load cancel). The best-of-rounds ratios (min over min) are printed too:
on a shared machine they are the least disturbed estimate. The garbage collector stays
on: its cost is part of each pipeline's cost. `--profile` adds cProfile's split of `ours`
on the largest payload.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import dataclasses
import hashlib
import importlib.util
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness  # bench/harness.py: this script's directory is on sys.path; puts the repository there too
import msgspec
from harness import ROOT

from pubsub_filter.core import envelope
from pubsub_filter.core.compare.fingerprint import compile_scheme
from pubsub_filter.core.config.schema import load
from tests.support.payloads import injury_report
from tests.support.seeds import reference_canonical

GOAL_RAW = 3.0  # ours ≤ 3.0 x raw SHA-256
GOAL_REF = 5.0  # ours ≥ 5 x faster than the reference, on 450 rows


def envelope_b64(data: str) -> bytes:
    """The standard library's base64 decode (the reference's, and envelope.py's two versions ago)."""
    return base64.b64decode(data, validate=True)


def msgspec_envelope() -> Any:
    """A copy of filter/envelope.py whose pybase64 path always declines: msgspec decodes `data`."""
    spec = importlib.util.find_spec(envelope.__name__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._fast_decode = lambda body: None
    return module


parse_envelope = envelope.parse_envelope
parse_envelope_mb64 = msgspec_envelope().parse_envelope


def pipelines(rows: int) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    route = load(ROOT / "examples" / "filter.yaml").route("injury-report")
    assert route is not None, "examples/filter.yaml has no injury-report route"
    scheme = compile_scheme(route)
    generic = dataclasses.replace(scheme, fast=None)
    rows_field = route.rows.parts[0] if route.rows else ""
    include = list(route.include)

    raw_json = json.dumps(injury_report(rows)).encode()  # as the raw processor publishes it
    body = envelope.make_envelope(raw_json, "1")  # the push request's body
    data = base64.b64encode(raw_json).decode()  # message.data in the push envelope
    data_bytes = data.encode()

    # Same answer from every path of ours, and the fast paths really taken: else the figures lie.
    decoded = envelope_b64(data)
    assert envelope._fast_decode(body) is not None, "envelope.py's pybase64 path did not apply"
    assert scheme.fast is not None and scheme.fast(decoded) is not None, "the typed fast path did not apply"
    assert parse_envelope(body) == parse_envelope_mb64(body)
    assert scheme(decoded)[1] == generic(decoded)[1] == scheme(parse_envelope(body).data)[1]

    fns: dict[str, Callable[[], Any]] = {
        "raw": lambda: hashlib.sha256(data_bytes).hexdigest(),
        "ref": lambda: reference_canonical(json.loads(envelope_b64(data)), rows_field, include),
        "ours": lambda: scheme(parse_envelope(body).data),
        "generic": lambda: generic(parse_envelope(body).data),
        "ours+mb64": lambda: scheme(parse_envelope_mb64(body).data),
        "ours+binascii": lambda: scheme(envelope_b64(data)),
    }
    info = {"rows": rows, "json_bytes": len(raw_json), "b64_bytes": len(data_bytes)}
    return fns, info


#: The clock batches are timed with: the process's CPU time by default (other people's jobs on a
#: shared machine take the CPU away from us, which wall time would count as our cost).
TIMERS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
clock = TIMERS["cpu"]


def calibrate(fn: Callable[[], Any], target: float) -> int:
    number = 1
    while True:
        t0 = clock()
        for _ in range(number):
            fn()
        if clock() - t0 >= target / 5:
            return max(1, int(number * target / (clock() - t0)))
        number *= 4


def measure(fns: dict[str, Callable[[], Any]], rounds: int, target: float) -> dict[str, list[float]]:
    numbers = {name: calibrate(fn, target) for name, fn in fns.items()}
    names = list(fns)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, n = fns[name], numbers[name]
            t0 = clock()
            for _ in range(n):
                fn()
            out[name].append((clock() - t0) / n * 1e6)
    return out


def summarise(info: dict[str, Any], times: dict[str, list[float]]) -> dict[str, Any]:
    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    def best(a: str, b: str) -> float:
        return min(times[a]) / min(times[b])

    return {
        **info,
        "us": {name: statistics.median(v) for name, v in times.items()},
        "us_best": {name: min(v) for name, v in times.items()},
        "best_ours_over_raw": best("ours", "raw"),
        "best_ref_over_ours": best("ref", "ours"),
        "us_rounds": times,
        "ours_over_raw": ratio("ours", "raw"),
        "ref_over_ours": ratio("ref", "ours"),
        "generic_over_raw": ratio("generic", "raw"),
        "ref_over_generic": ratio("ref", "generic"),
        "ours_mb64_over_raw": ratio("ours+mb64", "raw"),
        "ours_binascii_over_raw": ratio("ours+binascii", "raw"),
    }


def profile(rows: int, seconds: float = 2.0) -> list[tuple[str, float]]:
    """cProfile's own-time split of `ours` (builtins included), as shares of the total."""
    fns, _ = pipelines(rows)
    fn = fns["ours"]
    number = calibrate(fn, seconds)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(number):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    rows_out = []
    for (file, line, func), v in stats.items():
        where = func if file == "~" else f"{Path(file).name}:{line}({func})"
        rows_out.append((where, v[2] / total))
    rows_out.sort(key=lambda x: -x[1])
    return rows_out


def machine() -> dict[str, Any]:
    return harness.machine(msgspec=msgspec.__version__)


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'rows':>5} {'b64 bytes':>10} {'raw µs':>9} {'ref µs':>9} {'ours µs':>9} {'ours/raw':>9} {'ref/ours':>9}"
        f"   {'generic µs':>10} {'gen/raw':>8} {'mb64 µs':>9} {'/raw':>6} {'binascii µs':>12} {'/raw':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        us = r["us"]
        lines.append(
            f"{r['rows']:>5} {r['b64_bytes']:>10} {us['raw']:>9.1f} {us['ref']:>9.1f} {us['ours']:>9.1f}"
            f" {r['ours_over_raw']:>8.2f}x {r['ref_over_ours']:>8.2f}x"
            f"   {us['generic']:>10.1f} {r['generic_over_raw']:>7.2f}x {us['ours+mb64']:>9.1f}"
            f" {r['ours_mb64_over_raw']:>5.2f}x {us['ours+binascii']:>12.1f} {r['ours_binascii_over_raw']:>5.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,10,450", help="comma-separated row counts (default 1,10,450)")
    p.add_argument("--rounds", type=int, default=11, help="interleaved rounds, ≥ 5 (default 11)")
    p.add_argument("--target", type=float, default=0.1, help="seconds per batch (default 0.1)")
    p.add_argument("--timer", choices=sorted(TIMERS), default="cpu", help="cpu (process time, default) or wall")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--profile", action="store_true", help="also split `ours` by function (cProfile) on the largest")
    harness.add_smoke(p)
    args = p.parse_args(argv)
    harness.smoke(args, rows="1,10", rounds=5, target=0.002)
    if args.rounds < 5:
        p.error("--rounds must be at least 5")
    sizes = [int(x) for x in args.rows.split(",")]
    global clock
    clock = TIMERS[args.timer]

    results = []
    for rows in sizes:
        fns, info = pipelines(rows)
        results.append(summarise(info, measure(fns, args.rounds, args.target)))
    largest = max(results, key=lambda r: r["rows"])
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "rounds": args.rounds,
        "timer": args.timer,
        "results": results,
        "goals": {
            "ours_over_raw": {"goal": GOAL_RAW, "rows": largest["rows"], "value": largest["ours_over_raw"]},
            "ref_over_ours": {"goal": GOAL_REF, "rows": largest["rows"], "value": largest["ref_over_ours"]},
        },
    }
    if args.profile:
        out["profile"] = {"rows": largest["rows"], "shares": profile(largest["rows"])[:15]}

    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    m = out["machine"]
    print(
        f"{m['cpu']}, {m['nproc']} cores, Python {m['python']}, msgspec {m['msgspec']}, {m['utc']} UTC, "
        f"load {m['load']}; "
        f"{args.rounds} rounds, {args.timer} time"
    )
    print(table(results))
    g = out["goals"]
    for key, cmp, label in (("ours_over_raw", "≤", "ours/raw"), ("ref_over_ours", "≥", "ref/ours")):
        v, goal = g[key]["value"], g[key]["goal"]
        met = v <= goal if cmp == "≤" else v >= goal
        print(f"goal {label} {cmp} {goal:g} on {g[key]['rows']} rows: {v:.2f} → {'met' if met else 'MISSED'}")
    print(
        f"best-of-rounds on {largest['rows']} rows (least disturbed by other load): "
        f"ours/raw {largest['best_ours_over_raw']:.2f}, ref/ours {largest['best_ref_over_ours']:.2f}"
    )
    if args.profile:
        print(f"\nwhere `ours` goes, {out['profile']['rows']} rows (cProfile own time, share of total):")
        for where, share in out["profile"]["shares"]:
            print(f"  {share * 100:5.1f}%  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
