"""The push handler's throughput on the suppress path, next to a bare Starlette app, with wrk.

    .venv/bin/python bench/push.py [--duration 10] [--connections 16,32] [--rounds 3] [--variants ...] [--json]

Servers, each a subprocess on a free port, same uvicorn settings (loop and http "auto",
which pick uvloop and httptools; access log off; uvicorn log level warning):

* bare:   a Starlette app whose one POST endpoint parses the push envelope with the
          product's own `pubsub_filter.core.envelope.parse_envelope` (msgspec decode, base64 decode of
          `data`, publish time) and answers 200 with a small JSON body;
* filter: `pubsub-filter serve` on the embedded default (SQLite store, outbox, SQLite
          decision records) in a temp dir, one route (the injury-report route of
          examples/filter.yaml), default logging: one JSON decision line per request at
          info, written to stdout, which is /dev/null here (the formatting and the write
          are product cost, so they are measured);
* filter-warn: the same with LOG_LEVEL=warning (no decision lines), reported alongside,
          never instead;
* filter-no-telemetry, filter-traced, filter-sampled: telemetry's cost. The filter with
          OTEL_SDK_DISABLED=true (the baseline); with every span recorded and exported over
          OTLP/HTTP to a sink in this process; the same exporter with 1 % of root decisions
          sampled (`parentbased_traceidratio`, 0.01). Their CPU µs per request over the
          baseline's is paired by round. `--aa` adds a second baseline server, identical to
          the first: its ratio to the first is what the machine's noise alone shows.
          `--only NAME,...` runs only the filter servers named (and the baseline).

The measured path is `suppressed`: each filter is primed with one message (forwarded),
then wrk (bench/wrk_push.lua) posts the same 1-row injury report under a new message id
per request. Before and after the runs the bench checks one request's decision, and at
the end reads the decision records: every benched request must be `suppressed` and the
outbox must hold the one primed message only.

Per connection count and round, wrk (-t1) runs against each server in turn, the order
rotated each round; req/s is the median over rounds, and filter/bare is the median of the
per-round ratios. Each run also reads the server's own CPU time (/proc/PID/stat, all its
threads) and divides it by the requests served: on a shared 2-core machine, where wrk
and other people's jobs take CPU too, CPU µs per request is the steadier figure of cost.
Every server started here is stopped at the end (SIGTERM, then SIGKILL).

`--variants no-store-timeout,no-records,records-on-loop,writer-without-sqlite,no-commit-delay,
no-body-timeout,no-line` adds what-if filter servers with one cost removed, monkeypatched in the
server process and never a product mode, to measure what that cost is: the answer to "where does
the time go" at the server level. Several joined by `+` are removed in one server
(`no-records+no-line+no-body-timeout`: the suppress path's floor, bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import harness  # bench/harness.py: this script's directory is on sys.path; puts the repository there too
import msgspec
from harness import free_port

from pubsub_filter.core.envelope import make_envelope
from tests.support.payloads import injury_report

GOAL = 0.6  # filter/bare on the suppress path
ROUTE = "injury-report"
LUA = Path(__file__).with_name("wrk_push.lua")
CONFIG = """\
store: {{backend: sqlite, path: {dir}/filter-state.db}}
publisher: {{backend: outbox, path: {dir}/outbox.jsonl}}
records: {{backend: sqlite, path: {dir}/filter-decisions.db}}
routes:
  - name: injury-report
    destination: phase3-injury-report
    key: [payload.game_date]
    rows: payload.players
    row_key: [player_lookup, game_id]
    include: [player_lookup, team, game_date, game_id, injury_status, reason, reason_category]
    window: 24h
"""


# --- the bare server (run as `bench/push.py serve-bare --port N`) --------------------------


def bare_app() -> Any:
    """The baseline: Starlette, the product's envelope parse, a small JSON answer."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from pubsub_filter.core.envelope import EnvelopeError, parse_envelope

    async def push(request: Request) -> Response:
        try:
            msg = parse_envelope(await request.body())
        except EnvelopeError as exc:
            return Response(msgspec.json.encode({"error": str(exc)}), 400, media_type="application/json")
        body = {"decision": "ok", "message_id": msg.message_id, "bytes": len(msg.data)}
        return Response(msgspec.json.encode(body), 200, media_type="application/json")

    async def healthz(_: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route("/push/{route}", push, methods=["POST"]), Route("/healthz", healthz)])


def serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.Server(
        uvicorn.Config(
            bare_app(),
            host="127.0.0.1",
            port=port,
            loop="auto",
            http="auto",
            access_log=False,
            log_level="warning",
        )
    ).run()


# --- servers -----------------------------------------------------------------------


class Server:
    def __init__(self, name: str, argv: list[str], cwd: Path, env: dict[str, str]):
        self.name = name
        self.port = free_port()
        self.cwd = cwd
        self.stderr_path = cwd / f"{name}.stderr"
        argv = [*argv, "--port", str(self.port)]
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # decision logs go here: written, then discarded
                stderr=err,
                start_new_session=True,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {self.stderr()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout:g}s: {self.stderr()}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stderr(self) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_text()[-2000:]
        return ""

    def stop(self) -> None:
        """SIGTERM (graceful: the filter flushes its records), SIGKILL after 15 s."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


# --- wrk ---------------------------------------------------------------------------


def run_wrk(server: Server, body_file: Path, connections: int, duration: float) -> dict[str, Any]:
    url = server.url
    env = dict(os.environ, WRK_BODY_FILE=str(body_file), WRK_PATH=f"/push/{ROUTE}", WRK_RUN=uuid.uuid4().hex[:10])
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--timeout", "10s", "-s", str(LUA), url]
    cpu0 = server.cpu_seconds()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=duration + 60)
    if done.returncode != 0:
        alive = "running" if server.proc.poll() is None else f"exited {server.proc.returncode}"
        raise RuntimeError(
            f"wrk against {server.name} ({alive}) failed ({done.returncode}):\n{done.stdout}{done.stderr}\n"
            f"server stderr: {server.stderr()}"
        )
    out = done.stdout
    cpu = server.cpu_seconds() - cpu0
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no WRK_JSON line:\n{out}")
    res: dict[str, Any] = json.loads(line.removeprefix("WRK_JSON "))
    res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
    res["server_cpu_us_per_request"] = cpu / max(1, res["requests"]) * 1e6
    res["errors"] = sum(res[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts", "non_2xx"))
    return res


# --- the bench ---------------------------------------------------------------------


def decisions(db: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return dict(conn.execute("SELECT decision, count(*) FROM decisions GROUP BY decision").fetchall())


def machine() -> dict[str, Any]:
    wrk = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.splitlines()
    return harness.machine(wrk=(wrk or ["?"])[0])


def filters_to_run(
    variants: list[str],
    aa: bool = False,
    only: list[str] | None = None,
    telemetry: bool = True,
    baseline: Path | None = None,
) -> list[tuple[str, str | None, dict[str, str]]]:
    """(server name, what-if variant or None, extra env) for each filter server of the run."""
    sink = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{OTLP_SINK}/v1/traces"}
    traced = {**sink, "OTEL_TRACES_SAMPLER": "parentbased_always_on"}
    ratio = {**sink, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}
    out: list[tuple[str, str | None, dict[str, str]]] = [
        ("filter", None, {}),
        ("filter-warn", None, {"LOG_LEVEL": "warning"}),
    ]
    if telemetry:
        out += [
            # telemetry's cost: the same filter with the OpenTelemetry SDK off (the baseline), and
            # with every span recorded and exported over OTLP/HTTP (to a sink in this process)
            ("filter-no-telemetry", None, {"OTEL_SDK_DISABLED": "true"}),
            ("filter-traced", None, traced),
            # the same exporter, 1 % of root decisions sampled (and every one whose parent is)
            ("filter-sampled", None, ratio),
        ]
        if aa:  # a second baseline, identical to the first: its ratio to it is the noise floor
            out.append(("filter-no-telemetry-aa", None, {"OTEL_SDK_DISABLED": "true"}))
    if baseline is not None:  # another version of the code, same run: before / after
        tree = baseline.resolve()
        out.append(("filter-baseline", None, {"PYTHONPATH": f"{tree / 'filter'}{os.pathsep}{tree}"}))
    if only:
        out = [f for f in out if f[0] in only or f[0].startswith("filter-no-telemetry")]
    out += [(f"filter[{v}]", v, {}) for v in variants]
    return out


# the traced filter's collector: accepts every OTLP/HTTP export, keeps nothing
_SINK, OTLP_SINK = harness.otlp_sink()


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import httptools  # noqa: F401  (uvicorn's "auto" picks these when importable: make sure both are)
    import uvloop  # noqa: F401

    payload = json.dumps(injury_report(1)).encode()
    body_file = tmp / "envelope.json"
    body_file.write_bytes(make_envelope(payload, "@@ID@@"))
    python = sys.executable
    here = str(Path(__file__).resolve())
    cli = str(Path(python).with_name("pubsub-filter"))
    base_env = {k: v for k, v in os.environ.items() if k not in ("LOG_LEVEL", "LOG_FORMAT")}
    filters = filters_to_run(args.variants, args.aa, args.only, not args.no_telemetry_servers, args.baseline)

    servers: dict[str, Server] = {}
    try:
        bare_dir = tmp / "bare"
        bare_dir.mkdir()
        servers["bare"] = Server("bare", [python, here, "serve-bare"], bare_dir, base_env)
        for i, (name, variant, extra_env) in enumerate(filters):
            d = tmp / f"filter{i}"
            d.mkdir()
            (d / "filter.yaml").write_text(CONFIG.format(dir=d))
            serve = ["serve", "--config", "filter.yaml", "--host", "127.0.0.1"]
            argv = [cli, *serve] if variant is None else [python, here, "serve-variant", variant, *serve]
            servers[name] = Server(name, argv, d, {**base_env, **extra_env})
        for s in servers.values():
            s.wait_ready()

        # Prime each filter (one forward), then check the measured path is the suppress path.
        for name, _, _ in filters:
            url = f"{servers[name].url}/push/{ROUTE}"
            status, out = post(url, make_envelope(payload, f"prime-{uuid.uuid4().hex[:8]}"))
            assert status == 200 and out["decision"] == "forwarded", (name, status, out)
            status, out = post(url, make_envelope(payload, f"check-{uuid.uuid4().hex[:8]}"))
            assert status == 200 and out["decision"] == "suppressed", (name, status, out)

        order = list(servers)
        for name in order:  # warm-up, not measured
            run_wrk(servers[name], body_file, max(args.connections), min(3.0, args.duration))

        runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for c in args.connections:
            runs[c] = {name: [] for name in order}
            for r in range(args.rounds):
                for name in order[r % len(order) :] + order[: r % len(order)]:
                    try:
                        res = run_wrk(servers[name], body_file, c, args.duration)
                    except RuntimeError as exc:  # one retry: a shared machine has its moments
                        print(f"retrying once: {exc}", file=sys.stderr, flush=True)
                        res = run_wrk(servers[name], body_file, c, args.duration)
                    runs[c][name].append(res)
                    if not args.json:
                        print(
                            f"  c={c:<3} round {r + 1}  {name:<28} {res['rps']:8.0f} req/s"
                            f"  p50 {res['latency_p50_us'] / 1000:6.2f} ms  p99 {res['latency_p99_us'] / 1000:6.2f} ms"
                            f"  server CPU {res['server_cpu_us_per_request']:5.0f} µs/req  errors {res['errors']}",
                            flush=True,
                        )

        for name, _, _ in filters:
            status, out = post(f"{servers[name].url}/push/{ROUTE}", make_envelope(payload, f"after-{uuid.uuid4()}"))
            assert status == 200 and out["decision"] == "suppressed", (name, status, out)
    finally:
        for s in servers.values():
            s.stop()

    checks = {}
    for i, (name, variant, _) in enumerate(filters):
        if variant is not None and {"no-records", "writer-without-sqlite"} & set(variant.split("+")):  # nothing written
            continue
        d = tmp / f"filter{i}"
        counts = decisions(d / "filter-decisions.db")
        outbox = (d / "outbox.jsonl").read_bytes().count(b"\n") if (d / "outbox.jsonl").exists() else 0
        checks[name] = {"decisions": counts, "outbox_messages": outbox}

    summary: dict[str, Any] = {}
    for c, by_name in runs.items():
        row: dict[str, Any] = {}
        for name, rs in by_name.items():
            pairs = list(zip(rs, by_name["bare"], strict=True))
            row[name] = {
                "rps": statistics.median(x["rps"] for x in rs),
                "over_bare": statistics.median(x["rps"] / b["rps"] for x, b in pairs),
                "cpu_us_per_request": statistics.median(x["server_cpu_us_per_request"] for x in rs),
                "cpu_over_bare": statistics.median(
                    x["server_cpu_us_per_request"] / b["server_cpu_us_per_request"] for x, b in pairs
                ),
                "p50_ms": statistics.median(x["latency_p50_us"] for x in rs) / 1000,
                "p99_ms": statistics.median(x["latency_p99_us"] for x in rs) / 1000,
                "errors": sum(x["errors"] for x in rs),
                "rounds_rps": [round(x["rps"], 1) for x in rs],
            }
            if "filter-no-telemetry" in by_name:  # telemetry's cost, paired by round like /bare
                base = by_name["filter-no-telemetry"]
                row[name]["cpu_over_no_telemetry"] = statistics.median(
                    x["server_cpu_us_per_request"] / b["server_cpu_us_per_request"]
                    for x, b in zip(rs, base, strict=True)
                )
            if "filter-baseline" in by_name:  # before / after, paired by round like /bare
                base = by_name["filter-baseline"]
                row[name]["cpu_over_baseline"] = statistics.median(
                    x["server_cpu_us_per_request"] / b["server_cpu_us_per_request"]
                    for x, b in zip(rs, base, strict=True)
                )
        summary[str(c)] = row
    return {"summary": summary, "checks": checks, "runs": {str(c): v for c, v in runs.items()}}


def table(summary: dict[str, Any]) -> str:
    head = (
        f"{'conns':>5}  {'server':<28} {'req/s':>7} {'/bare':>7}   {'CPU µs/req':>10} {'/bare':>6}"
        f"   {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}"
    )
    lines = [head, "-" * len(head)]
    for c, row in summary.items():
        for name, x in row.items():
            lines.append(
                f"{c:>5}  {name:<28} {x['rps']:>7.0f} {x['over_bare']:>6.2f}x   {x['cpu_us_per_request']:>10.0f}"
                f" {x['cpu_over_bare']:>5.2f}x   {x['p50_ms']:>7.2f} {x['p99_ms']:>7.2f} {x['errors']:>6}"
            )
    for c, row in summary.items():
        for name, x in row.items():
            if name.startswith("filter") and "cpu_over_no_telemetry" in x:
                lines.append(
                    f"{c:>5}  {name:<28} CPU µs/req over filter-no-telemetry: {x['cpu_over_no_telemetry']:.3f}x"
                )
    for c, row in summary.items():
        for name, x in row.items():
            if name.startswith("filter") and name != "filter-baseline" and "cpu_over_baseline" in x:
                lines.append(f"{c:>5}  {name:<28} CPU µs/req over filter-baseline: {x['cpu_over_baseline']:.3f}x")
    return "\n".join(lines)


# --- what-if servers (run as `bench/push.py serve-variant NAME <pubsub-filter args>`) ---------

VARIANTS = {
    "no-store-timeout": "GuardedStore calls the store directly, without asyncio.timeout (SQLite never suspends)",
    "no-records": "decision records are not kept (a recorder whose record() does nothing)",
    "records-on-loop": "the inline recorder commits a step's records on the event loop, not on its writer thread",
    "writer-without-sqlite": (
        "the inline recorder's writer thread reports each commit without writing it: the hand-off alone"
    ),
    "no-commit-delay": "the inline recorder's writer commits at once, even when commits are shared (COMMIT_WINDOW)",
    "no-body-timeout": "the push handler reads the body without its asyncio.timeout (server.body_timeout)",
    "no-line": "no decision line is written (as filter-warn, but combinable)",
}


def serve_variant(variant: str, argv: list[str]) -> int:
    """`pubsub-filter` with one cost removed, or several joined by `+` (`no-records+no-line`), to
    measure what they cost. Never a product mode."""
    for part in variant.split("+"):
        _remove(part)
    from pubsub_filter.cli import main as filter_main

    return filter_main(argv)


def _remove(variant: str) -> None:
    """Monkeypatch one cost out of this process's filter."""
    if variant == "no-store-timeout":
        from collections.abc import Awaitable, Callable

        from pubsub_filter.backends.stores.guard import GuardedStore

        async def direct(self: GuardedStore, op: Callable[[], Awaitable[Any]]) -> Any:
            return await op()

        GuardedStore._call = direct  # type: ignore[method-assign]
    elif variant == "no-records":
        import pubsub_filter.runtime.wiring

        class NullRecorder:
            def record(self, record: Any) -> None:
                pass

            def committing(self) -> None:
                return None

            def outcomes(self) -> dict[str, int]:
                return {"written": 0, "retried": 0, "dropped": 0}

            async def flush(self) -> None:
                pass

            async def close(self, deadline: float | None = None) -> None:
                pass

        pubsub_filter.runtime.wiring.make_recorder = lambda cfg: NullRecorder()  # type: ignore[assignment,return-value]
    elif variant == "records-on-loop":
        from pubsub_filter.backends.records.inline import InlineSqliteRecorder
        from pubsub_filter.backends.records.sqlite import prepared

        def hand_over(self: InlineSqliteRecorder) -> None:
            rows, self._step = self._step, []
            if rows:
                self._committed(self._recorded, len(rows), self.sink.insert_apart([prepared(r) for r in rows]))

        InlineSqliteRecorder._hand_over = hand_over  # type: ignore[method-assign]
    elif variant == "no-commit-delay":
        from pubsub_filter.backends.records import inline

        inline._pause = lambda seconds: None
    elif variant == "writer-without-sqlite":
        from pubsub_filter.backends.records.sqlite import SqliteSink

        SqliteSink.insert_apart = lambda self, rows: []  # type: ignore[method-assign,assignment]
    elif variant == "no-body-timeout":
        import pubsub_filter.push.app

        async def body(receive: Any, limit: int, declared: str | None, within: float) -> bytes:
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    return b"".join(chunks)

        pubsub_filter.push.app._body = body
    elif variant == "no-line":
        import pubsub_filter.core.engine.engine

        pubsub_filter.core.engine.engine.log_decision = lambda rec, quieting=None: None
    else:
        raise SystemExit(f"unknown variant {variant!r}: {', '.join(VARIANTS)}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve-variant"]:
        return serve_variant(argv[1], argv[2:])
    if argv[:1] == ["serve-bare"]:
        p = argparse.ArgumentParser(prog="bench/push.py serve-bare")
        p.add_argument("--port", type=int, required=True)
        serve_bare(p.parse_args(argv[1:]).port)
        return 0

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run (default 10)")
    p.add_argument("--connections", default="16,32", help="comma-separated wrk -c values (default 16,32)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per connection count, ≥ 3 (default 3)")
    p.add_argument(
        "--variants",
        default="",
        help="also run what-if filters with one cost removed, comma-separated (several in one filter joined"
        f" by +): {', '.join(VARIANTS)}",
    )
    p.add_argument(
        "--aa",
        action="store_true",
        help="also run a second filter-no-telemetry server (an A/A check: its ratio to the first is the noise)",
    )
    p.add_argument("--only", default="", help="filter servers to run, comma-separated (the baselines always)")
    p.add_argument(
        "--baseline",
        type=Path,
        help="also run `filter-baseline`: the filter package found in this dir (e.g. an earlier commit's,"
        " from `git archive COMMIT filter | tar -x -C DIR`)",
    )
    p.add_argument(
        "--no-telemetry-servers", action="store_true", help="skip filter-no-telemetry and filter-traced (faster)"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (configs, databases, stderr)")
    harness.add_smoke(p)
    args = p.parse_args(argv)
    harness.smoke(args, duration=1.0, connections="2", rounds=3, no_telemetry_servers=True)
    args.connections = [int(x) for x in args.connections.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    args.only = [v for v in args.only.split(",") if v]
    for v in (part for joined in args.variants for part in joined.split("+")):
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    if args.rounds < 3:
        p.error("--rounds must be at least 3")
    if shutil.which("wrk") is None:
        p.error("wrk is not on PATH")

    tmp = Path(tempfile.mkdtemp(prefix="bench-push-"))
    try:
        res = bench(args, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "duration_s": args.duration,
        "rounds": args.rounds,
        "goal": GOAL,
        **res,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        m = out["machine"]
        print(f"\n{m['cpu']}, {m['nproc']} cores, Python {m['python']}, {m['wrk']}, {m['utc']} UTC, load {m['load']}")
        print(f"wrk -t1 -d{args.duration:g}s, {args.rounds} rounds, medians; suppress path, 1-row injury report\n")
        print(table(out["summary"]))
        for name, chk in out["checks"].items():
            print(f"{name}: decisions recorded {chk['decisions']}, outbox messages {chk['outbox_messages']}")
        for c, row in out["summary"].items():
            if "filter" not in row:
                continue
            v = row["filter"]["over_bare"]
            print(f"goal filter/bare ≥ {GOAL} at c={c}: {v:.2f} → {'met' if v >= GOAL else 'MISSED'}")
    for name, chk in out["checks"].items():
        if set(chk["decisions"]) - {"forwarded", "suppressed"} or chk["decisions"].get("forwarded") != 1:
            print(f"WARNING: {name} recorded decisions other than one forward and suppressions", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
