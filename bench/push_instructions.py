"""CPU instructions per push request on the suppress path, filter next to bare (callgrind), in process.

`bench/push.py` measures the goal (filter / bare by CPU time through uvicorn and wrk), but
on a shared 2-core machine its CPU times move by more than most single changes save.
callgrind counts the instructions the interpreter executes, which repeat to within a
fraction of a per cent whatever else the machine runs: this is the bench to tell whether a
change to the suppress path helped, and by how much.

Each count is a child process that builds one app the way bench/push.py's servers are
built (`filter`: `pubsub-filter serve`'s app on SQLite state, outbox and SQLite records,
telemetry as `serve` sets it up, JSON decision lines at info to /dev/null; `filter-warn`:
the same at warning; `bare`: bench/push.py's bare Starlette app), primes it with one
forward, then calls the ASGI app as uvicorn would with N push requests of the 1-row report
under new message ids, every one answered 200 (`suppressed` for the filter). Instructions
per request = (count with N requests - count with 0) / N, so start-up cancels out. Uvicorn's
HTTP parsing and the socket are not in it (both apps pay them alike), so filter / bare here
is larger than through uvicorn; compare it between versions, not with the goal.

    .venv/bin/python bench/push_instructions.py [--requests 300] [--apps bare,filter,filter-warn] [--tree DIR]
        [--together 16]

`--apps` also takes bench/push.py's what-if variants as `filter[VARIANT]`, several joined by `+`
(`filter[no-records+no-line+no-body-timeout]`): the instructions a cost takes, in process.

`--record` writes the filter's instructions per request, as a multiple of bare's, to
`bench/instructions.json`; `--check` counts again and exits 1 when that multiple grew more
than 10 % over the recorded one (`tests/selfcheck/test_suppress_path_instructions.py` runs it in
`make test`, so a change that makes the suppress path 20 % dearer is seen the day it lands).
The multiple, not the count, is what is kept: bare's count moves with the interpreter and
Starlette as the filter's does, so a new release of either does not read as our regression.

`--tree DIR` also counts the filter apps with the `filter` package found in DIR (for
instance an earlier commit's, from `git archive COMMIT filter | tar -x -C DIR`): before and
after in one run. `--together N` starts N requests at once (`asyncio.gather`), so their
tasks run in one event-loop step as those of N connections read in one poll do: what the
records' shared commit saves at c=16. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import callgrind  # bench/callgrind.py: this script's directory is on sys.path
import harness
from harness import ROOT

CHILD = r"""
import asyncio, json, os, sys, tempfile
import pubsub_filter  # from PYTHONPATH first: the tree being measured
assert os.path.dirname(os.path.dirname(pubsub_filter.__file__)) == os.environ["PYTHONPATH"].split(os.pathsep)[0], (
    pubsub_filter.__file__
)
sys.path.append(sys.argv[4])
sys.path.append(os.path.join(sys.argv[4], "bench"))
from pubsub_filter.observability import logsetup
from pubsub_filter.core.envelope import make_envelope
from tests.support.payloads import injury_report

app_name, n, tmp, together = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[5])
payload = json.dumps(injury_report(1)).encode()
import push as bench_push
if app_name == "bare":
    app = bench_push.bare_app()
    route = "any"
else:
    from pubsub_filter.core.config.schema import load
    from pubsub_filter.push.app import create_app
    from pubsub_filter.runtime.wiring import make_engine
    from pubsub_filter.runtime.wiring import make_telemetry
    level = "warning" if app_name == "filter-warn" else "info"
    if app_name.startswith("filter["):  # a what-if of bench/push.py's: filter[no-records+no-line]
        for part in app_name[len("filter["):-1].split("+"):
            bench_push._remove(part)
    logsetup.configure(fmt="json", level=level, stream=open(os.devnull, "w"))
    os.chdir(tmp)
    with open("filter.yaml", "w") as f:
        f.write(bench_push.CONFIG.format(dir=tmp))
    cfg = load("filter.yaml")
    app = create_app(make_engine(cfg, make_telemetry(cfg)), None)
    route = bench_push.ROUTE


async def post(body, expect):
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    headers = [(b"host", b"127.0.0.1"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": f"/push/{route}", "raw_path": f"/push/{route}".encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080)}
    await app(scope, receive, send)
    assert sent[0]["status"] == 200, sent
    if expect:
        answer = json.loads(sent[1]["body"])
        assert answer["decision"] == expect, answer


async def main():
    first = "forwarded" if app_name != "bare" else None
    await post(make_envelope(payload, "prime"), first)
    then = "suppressed" if app_name != "bare" else None
    if together == 1:  # one after the other, in this task: the counts recorded before --together existed
        for i in range(n):
            await post(make_envelope(payload, f"m{i}"), then)
        return
    for start in range(0, n, together):  # `together` requests ready in one event-loop step, as c connections
        batch = range(start, min(n, start + together))
        await asyncio.gather(*(post(make_envelope(payload, f"m{i}"), then) for i in batch))

asyncio.run(main())
"""


def instructions(app: str, requests: int, tree: Path, together: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        # cwd not ROOT: `python -c` puts the working directory first on sys.path
        return callgrind.instructions(CHILD, [app, str(requests), tmp, str(ROOT), str(together)], tree, cwd=tmp)


def per_request(app: str, requests: int, tree: Path, together: int) -> float:
    with_requests, without = counted([(app, requests, tree, together), (app, 0, tree, together)])
    return (with_requests - without) / requests


def counted(runs: list[tuple[str, int, Path, int]]) -> list[int]:
    """`instructions` of each run, as many at once as there are CPUs: a count does not move with
    the load (each child is timed by nothing but its own instructions), so the runs need not
    take turns; under `--smoke` they do, since the figure is a wall time there."""
    if harness.smoking():
        return [instructions(*run) for run in runs]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(lambda run: instructions(*run), runs))


RECORD = ROOT / "bench" / "instructions.json"
#: how much dearer than the recorded figure the suppress path may get before `--check` fails
ALLOWED_GROWTH = 1.10


def suppress_multiple(requests: int) -> tuple[float, float, float]:
    """(bare, filter, filter ÷ bare): instructions per suppressed request, in process."""
    bare_n, bare_0, ours_n, ours_0 = counted([(app, n, ROOT, 1) for app in ("bare", "filter") for n in (requests, 0)])
    bare, ours = (bare_n - bare_0) / requests, (ours_n - ours_0) / requests
    return bare, ours, ours / bare


def record_or_check(args: argparse.Namespace) -> int:
    bare, ours, multiple = suppress_multiple(args.requests)
    print(f"  bare {bare:,.0f}   filter {ours:,.0f}   filter / bare {multiple:.3f}")
    if harness.smoking():
        return 0
    if args.record:
        RECORD.write_text(
            json.dumps(
                {
                    "suppress_path": {
                        "filter_per_bare": round(multiple, 4),
                        "bare": round(bare),
                        "filter": round(ours),
                        "requests": args.requests,
                        "machine": harness.machine_line(),
                    }
                },
                indent=2,
            )
            + "\n"
        )
        print(f"recorded in {RECORD.relative_to(ROOT)}")
        return 0
    recorded = json.loads(RECORD.read_text())["suppress_path"]["filter_per_bare"]
    growth = multiple / recorded
    print(f"  recorded filter / bare {recorded:.3f}: now {growth:.3f}x that (allowed {ALLOWED_GROWTH:.2f}x)")
    if growth > ALLOWED_GROWTH:
        print(
            f"the suppress path costs {100 * (growth - 1):.0f} % more instructions than recorded in "
            f"{RECORD.relative_to(ROOT)}: find what, or, if it is worth its cost, record the new figure "
            "(`bench/push_instructions.py --record`) with the reason in the commit"
        )
        return 1
    if growth < 1 / ALLOWED_GROWTH:
        print(f"cheaper than recorded by more than {100 * (1 - 1 / ALLOWED_GROWTH):.0f} %: record the new figure")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="suppressed requests per count (default 300)")
    parser.add_argument(
        "--apps",
        default="bare,filter,filter-warn",
        help="comma-separated: bare, filter, filter-warn, filter[V] (V: a what-if of push.py's, several joined by +)",
    )
    parser.add_argument("--tree", type=Path, help="also count the filter apps with the filter package in this dir")
    parser.add_argument(
        "--together",
        type=int,
        default=1,
        help="requests started at once, so they run in one event-loop step as c connections' do (default 1)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--record", action="store_true", help=f"write filter / bare to {RECORD.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if filter / bare grew > 10 %% over {RECORD.name}")
    harness.add_smoke(parser)
    args = parser.parse_args()
    harness.smoke(args, requests=2, apps="bare,filter")
    if shutil.which("valgrind") is None and not harness.smoking():
        raise SystemExit("needs valgrind: apt-get install valgrind")
    if args.record or args.check:
        print(harness.machine_line())
        raise SystemExit(record_or_check(args))
    apps = [a for a in args.apps.split(",") if a]
    print(harness.machine_line())
    print(
        f"instructions per request, in process, {args.requests} requests, {args.together} at a time, PYTHONHASHSEED=0"
    )
    counts: dict[str, float] = {}
    trees = [("", ROOT)] + ([(" (--tree)", args.tree.resolve())] if args.tree else [])
    for suffix, tree in trees:
        for app in apps:
            if app == "bare" and suffix:
                continue
            counts[app + suffix] = per_request(app, args.requests, tree, args.together)
            line = f"  {app + suffix:<22} {counts[app + suffix]:12,.0f}"
            if "bare" in counts and app != "bare":
                line += f"   bare / this {counts['bare'] / counts[app + suffix]:.3f}"
            if suffix and app in counts:
                line += f"   this / ours {counts[app + suffix] / counts[app]:.3f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
