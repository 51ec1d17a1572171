"""Telemetry's cost per decision on the suppress path, in CPU instructions (callgrind), not seconds.

Wall and CPU time on a shared 2-core machine move by more than the 5 % this measures;
callgrind counts the instructions the interpreter executes, which repeat to within a
fraction of a per cent with a fixed PYTHONHASHSEED whatever else the machine is doing.

Each run is a child process that builds the engine from examples/filter.yaml (embedded
SQLite store, outbox, SQLite records; decision lines written as JSON to /dev/null) with
telemetry off (`OTEL_SDK_DISABLED` semantics: `NO_TELEMETRY`) or as `serve` builds it by
default (metrics on, no OTLP endpoint so no spans), primes one forward, then decides N
copies of the same report under new message ids: every one `suppressed`. Instructions
per decision = (count with N messages - count with 0) / N, so start-up cancels out. Two
paths: `engine` calls `Engine.handle` directly; `request` calls the push app as uvicorn
would (an ASGI request with the push envelope, answered 200), so the envelope parse and
Starlette are in it; `server` runs `pubsub-filter serve` itself under callgrind (uvicorn,
httptools, the socket, the log line and every thread of the process: the SDK's, the records
flush) and posts the requests over one keep-alive connection, one at a time, counting
instructions between `callgrind_control --zero` and `--dump` around the measured requests,
so start-up, priming and warm-up are left out. The warm-up ends with one request under a
sampled `traceparent`, so that a sampled decision and its export (a lazily built exporter,
its connection) have run once before the window in every mode. Before each of the two, the process idles
`--settle` seconds so that work a timer defers (a span batch's export) falls inside the
window it belongs to. Modes: `off` (`OTEL_SDK_DISABLED=true`), `on` (the default: metrics, no
spans) and, on the server path, `traced` (`OTEL_TRACES_SAMPLER=parentbased_always_on`: every span
recorded and exported over OTLP/HTTP to a sink in this process) and `sampled`
(`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.01`, the same
exporter: the default when an endpoint is set) and `always_off` (the same exporter, every
decision dropped: what a decision the sampler drops costs). A server mode with `+parent`
(`off+parent`, `sampled+parent`...) sends every request with an unsampled parent, as Cloud
Run's front end does (`X-Cloud-Trace-Context: TRACE/SPAN;o=0`, a trace of its own per
request); its ratio is to `off+parent`, the same requests with telemetry off. When `off`,
`always_off` and `traced` are all run, the expected cost of `sampled` is printed beside it
(`always_off` + 0.01 * (`traced` - `always_off`)): the mean that `sampled`'s own count, ~3
traced decisions in 300, only estimates.

    .venv/bin/python bench/telemetry_cost.py [--messages 500] [--paths engine,request,server]

Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import http.server
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import callgrind  # bench/callgrind.py: this script's directory is on sys.path
import harness
from harness import ROOT

CHILD = r"""
import asyncio, base64, json, os, sys, tempfile
from pubsub_filter.observability import logsetup
from pubsub_filter.observability import telemetry
from pubsub_filter.runtime import otel
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.envelope import make_envelope, parse_envelope
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.wiring import make_engine

mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[4]
logsetup.configure(fmt="json", stream=open(os.devnull, "w"))
cfg = load(os.path.join(sys.argv[3], "examples/filter.yaml"))
push = json.load(open(os.path.join(sys.argv[3], "examples/push-injury.json")))["message"]
data = base64.b64decode(push["data"])

async def main():
    os.chdir(tempfile.mkdtemp())
    tel = telemetry.NO_TELEMETRY if mode == "off" else otel.from_config(True, False, {})
    engine = make_engine(cfg, tel)
    envelopes = [make_envelope(data, f"n{i}", push.get("attributes")) for i in range(n + 1)]
    if path == "engine":
        for msg in [parse_envelope(e) for e in envelopes]:
            await engine.handle("injury-report", msg)
        return
    app = create_app(engine, None)
    for body in envelopes:
        sent = []

        async def receive(body=body):
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            sent.append(message)

        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/push/injury-report", "raw_path": b"/push/injury-report",
                 "query_string": b"", "root_path": "", "headers": headers,
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080)}
        await app(scope, receive, send)
        assert sent[0]["status"] == 200, sent

asyncio.run(main())
"""


def instructions(mode: str, messages: int, path: str) -> int:
    return callgrind.instructions(CHILD, [mode, str(messages), str(ROOT), path], ROOT)


def per_decision(mode: str, messages: int, path: str) -> float:
    return (instructions(mode, messages, path) - instructions(mode, 0, path)) / messages


# --- the whole server ------------------------------------------------------------------

SERVER_MODES = {
    "off": {"OTEL_SDK_DISABLED": "true"},
    "on": {},
    "traced": {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "@SINK@/v1/traces",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    },
    "sampled": {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "@SINK@/v1/traces",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    },
    "always_off": {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "@SINK@/v1/traces",
        "OTEL_TRACES_SAMPLER": "always_off",
    },
}
RATIO = float(SERVER_MODES["sampled"]["OTEL_TRACES_SAMPLER_ARG"])
SERVE = "import sys; from pubsub_filter.cli import main; sys.exit(main(sys.argv[1:]))"


def _parent(i: int) -> dict[str, str]:
    """Cloud Run's header for request `i`: a trace of its own, not sampled (the common case)."""
    ids = random.Random(i)  # the same ids every run: the parse costs the same
    return {"X-Cloud-Trace-Context": f"{ids.getrandbits(128):032x}/{ids.getrandbits(63) + 1};o=0"}


def _sampled_parent() -> dict[str, str]:
    """A sampled W3C parent: the warm-up's one decision that every sampler records and exports,
    so a lazily built exporter, its connection and the span code's first run are out of the window."""
    ids = random.Random(-1)
    return {"traceparent": f"00-{ids.getrandbits(128) | 1:032x}-{ids.getrandbits(64) | 1:016x}-01"}


def _envelope(data: bytes, message_id: str, attributes: dict[str, str]) -> bytes:
    msg = {"data": base64.b64encode(data).decode(), "attributes": attributes, "messageId": message_id}
    return json.dumps({"message": msg, "subscription": "projects/local/subscriptions/local"}).encode()


def _post(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> str:
    conn.request("POST", "/push/injury-report", body, {"Content-Type": "application/json", **headers})
    resp = conn.getresponse()
    out = json.loads(resp.read())
    if resp.status != 200:
        raise SystemExit(f"the server answered {resp.status}: {out}")
    return str(out["decision"])


def _callgrind(command: str, pid: int) -> None:
    subprocess.run(["callgrind_control", command, str(pid)], check=True, capture_output=True, timeout=120)


def server_per_request(
    mode: str, messages: int, warmup: int, settle: float, sink: str, keep: Path | None = None
) -> float:
    """Instructions per suppressed push request, the whole `serve` process (all threads). With
    `keep`, the measured window's callgrind dump is copied there as `MODE.callgrind` (for
    `callgrind_annotate`: where each mode's instructions go, function by function)."""
    push = json.loads((ROOT / "examples/push-injury.json").read_text())["message"]
    data, attributes = base64.b64decode(push["data"]), push.get("attributes") or {}
    port = harness.free_port()
    base, _, parented = mode.partition("+")
    if parented not in ("", "parent"):
        raise SystemExit(f"unknown mode {mode!r}: MODE or MODE+parent")

    def headers(i: int) -> dict[str, str]:
        return _parent(i) if parented else {}

    extra = {k: v.replace("@SINK@", sink) for k, v in SERVER_MODES[base].items()}
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}", **extra}
    with tempfile.TemporaryDirectory(prefix="telemetry-cost-") as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}"]
        argv += [sys.executable, "-c", SERVE]
        argv += ["serve", "--config", str(ROOT / "examples/filter.yaml"), "--host", "127.0.0.1", "--port", str(port)]
        with open(Path(tmp) / "stderr", "wb") as err:
            proc = subprocess.Popen(
                argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
            )
        try:
            conn = _ready(port, proc, Path(tmp) / "stderr")
            assert _post(conn, _envelope(data, "prime", attributes), headers(-1)) == "forwarded"
            for i in range(warmup):
                assert _post(conn, _envelope(data, f"w{i}", attributes), headers(-2 - i)) == "suppressed"
            assert _post(conn, _envelope(data, "w-sampled", attributes), _sampled_parent()) == "suppressed"
            conn.close()
            time.sleep(settle)
            _callgrind("--zero", proc.pid)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)  # uvicorn closes idle ones after 5 s
            for i in range(messages):
                assert _post(conn, _envelope(data, f"n{i}", attributes), headers(i)) == "suppressed"
            conn.close()
            time.sleep(settle)
            _callgrind("--dump", proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        [dump] = [p for p in Path(tmp).glob("callgrind.out.*") if p.suffix == ".1"]
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            name, n = mode, 1
            while (keep / f"{name}.callgrind").exists():  # a mode named twice (the A/A): keep both
                n += 1
                name = f"{mode}#{n}"
            shutil.copy(dump, keep / f"{name}.callgrind")
        m = re.search(r"^totals: (\d+)", dump.read_text(), re.M)
        if m is None:
            raise SystemExit(f"no totals in {dump}")
        return int(m.group(1)) / messages


def _ready(port: int, proc: subprocess.Popen[bytes], stderr: Path) -> http.client.HTTPConnection:
    deadline = time.monotonic() + 600  # imports under valgrind take a while
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}): {stderr.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                return conn
        time.sleep(0.5)
    raise SystemExit("the server was not ready after 600 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=500, help="suppressed decisions per run (default 500)")
    parser.add_argument("--paths", default="engine,request,server", help="engine, request, server (default all)")
    parser.add_argument(
        "--modes",
        default="off,on,traced,sampled,always_off",
        help="server path modes, each MODE or MODE+parent (default: off,on,traced,sampled,always_off)",
    )
    parser.add_argument("--warmup", type=int, default=50, help="server path: suppressions before counting")
    parser.add_argument("--settle", type=float, default=7.0, help="server path: idle seconds before zero and dump")
    parser.add_argument("--keep", type=Path, help="server path: copy each mode's callgrind dump into this directory")
    harness.add_smoke(parser)
    args = parser.parse_args()
    # the server path is counted with callgrind_control around a running server: not smoked
    harness.smoke(args, messages=2, paths="engine,request")
    if shutil.which("valgrind") is None and not harness.smoking():
        raise SystemExit("needs valgrind: apt-get install valgrind")
    paths = args.paths.split(",")
    print(harness.machine_line())
    print(f"instructions per suppressed message, {args.messages} messages, PYTHONHASHSEED=0")
    for path in (p for p in paths if p in ("engine", "request")):
        off = per_decision("off", args.messages, path)
        on = per_decision("on", args.messages, path)
        print(
            f"  {path:8} telemetry off {off:11,.0f}   metrics on {on:11,.0f}   on / off {on / off:.3f}x (goal <= 1.05x)"
        )
    if "server" in paths:
        sink, url = harness.otlp_sink()
        try:
            counts: dict[str, float] = {}
            for mode in args.modes.split(","):  # a mode named twice is an A/A check: the second is "mode#2"
                label = mode if mode not in counts else f"{mode}#{sum(k.split('#')[0] == mode for k in counts) + 1}"
                counts[label] = server_per_request(mode, args.messages, args.warmup, args.settle, url, args.keep)
        finally:
            sink.shutdown()
            sink.server_close()
        for mode, count in counts.items():
            baseline = "off+parent" if "+parent" in mode else "off"  # the same requests, telemetry off
            base = counts.get(baseline)
            ratio = f"   / {baseline} {count / base:.3f}x" if base else ""
            print(f"  server   {mode:18} {count:11,.0f}{ratio}", flush=True)
        expected = expected_at_ratio(counts)
        if expected is not None:
            print(
                f"  server   {'sampled, expected':18} {expected:11,.0f}   / off {expected / counts['off']:.3f}x"
                f"   (always_off + {RATIO} x (traced - always_off))",
                flush=True,
            )


def expected_at_ratio(counts: dict[str, float]) -> float | None:
    """What `sampled` costs on average: with 300 requests at 1 % its own count rests on ~3
    traced decisions (Poisson, ±1.7), so the mean comes from the dropped and the always-traced
    costs, each measured on every request. None unless off, always_off and traced were run."""
    if not all(m in counts for m in ("off", "always_off", "traced")):
        return None
    return counts["always_off"] + RATIO * (counts["traced"] - counts["always_off"])


if __name__ == "__main__":
    main()
