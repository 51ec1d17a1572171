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
Starlette are in it. Uvicorn's HTTP parsing and the socket are the same either way and are
left out, so both ratios are upper bounds on the ratio per push request.

    .venv/bin/python bench/telemetry_cost.py [--messages 500]

Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, base64, json, os, sys, tempfile
from filter.observability import logsetup
from filter.observability import telemetry
from filter.core.config import load
from filter.core.envelope import make_envelope, parse_envelope
from filter.push.app import create_app
from filter.runtime.wiring import make_engine

mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[4]
logsetup.configure(fmt="json", stream=open(os.devnull, "w"))
cfg = load(os.path.join(sys.argv[3], "examples/filter.yaml"))
push = json.load(open(os.path.join(sys.argv[3], "examples/push-injury.json")))["message"]
data = base64.b64decode(push["data"])

async def main():
    os.chdir(tempfile.mkdtemp())
    tel = telemetry.NO_TELEMETRY if mode == "off" else telemetry.from_config(True, False, {})
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
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            CHILD,
            mode,
            str(messages),
            str(ROOT),
            path,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if m is None:
        raise SystemExit(f"no instruction count from callgrind:\n{proc.stderr[-2000:]}")
    return int(m.group(1))


def per_decision(mode: str, messages: int, path: str) -> float:
    return (instructions(mode, messages, path) - instructions(mode, 0, path)) / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=500, help="suppressed decisions per run (default 500)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind: apt-get install valgrind")
    print(f"instructions per suppressed message, {args.messages} messages, PYTHONHASHSEED=0")
    for path in ("engine", "request"):
        off = per_decision("off", args.messages, path)
        on = per_decision("on", args.messages, path)
        print(
            f"  {path:8} telemetry off {off:11,.0f}   metrics on {on:11,.0f}   on / off {on / off:.3f}x (goal <= 1.05x)"
        )


if __name__ == "__main__":
    main()
