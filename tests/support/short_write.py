"""Run in a child process: the outbox under a file size limit (RLIMIT_FSIZE), so a write is really cut short.

    python -m tests.support.short_write publisher WORKDIR
    python -m tests.support.short_write push WORKDIR

The limit is set on this process only (the test runner's own files are not affected) and
SIGXFSZ is ignored, so `write()` returns a short count, then fails with EFBIG, instead of
the process being killed. Prints one JSON object with what happened; the test judges it.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import httpx

from pubsub_filter.backends.publishers.outbox import OutboxPublisher, read_outbox
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.ports import PublishFailed
from pubsub_filter.push.app import create_app
from tests.support.fakes import MemoryRecorder

#: A message this large cannot fit under the limit; small ones can.
BIG = 256 * 1024
LIMIT = 64 * 1024


def limit_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))


def lift_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))


def contents(path: Path) -> dict[str, Any]:
    read = read_outbox(path)
    return {
        "messages": [m["attributes"] for m in read.messages],
        "bad": [str(b) for b in read.bad],
        "size": path.stat().st_size,
    }


async def publisher(workdir: Path) -> dict[str, Any]:
    path = workdir / "outbox.jsonl"
    outbox = OutboxPublisher(path)
    result: dict[str, Any] = {}
    limit_file_size(LIMIT)
    await outbox.publish("t", b"small", {"n": "1"})
    result["size_before"] = path.stat().st_size
    try:
        await outbox.publish("t", os.urandom(BIG), {"n": "2"})
        result["big"] = "confirmed"
    except PublishFailed as exc:
        result["big"] = f"PublishFailed: {exc}"
    result["size_after"] = path.stat().st_size
    lift_limit()
    await outbox.publish("t", b"small again", {"n": "3"})
    await outbox.close()
    result["outbox"] = contents(path)
    return result


async def push(workdir: Path) -> dict[str, Any]:
    cfg = parse({"routes": [{"name": "big", "destination": "out", "key": ["attributes.k"]}]})
    store = GuardedStore(SqliteStore(workdir / "state.db"), cfg.store_errors)
    path = workdir / "outbox.jsonl"
    engine = Engine(cfg, store, OutboxPublisher(path), MemoryRecorder())
    body = make_envelope(os.urandom(BIG), "m1", {"k": "key"}, subscription="projects/p/subscriptions/s")
    result: dict[str, Any] = {}
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://filter") as client:
        # The state file is created before the limit, so only the outbox meets it.
        await store.ping()
        limit_file_size(LIMIT)
        first = await client.post("/push/big", content=body)
        result["first"] = {"status": first.status_code, **first.json()}
        state = await store.read("big", "key")
        result["state_after_failure"] = None if state is None else {"fp": state.fingerprint, "lease": bool(state.lease)}
        result["outbox_after_failure"] = contents(path) if path.exists() else None
        lift_limit()
        again = await client.post("/push/big", content=body)
        result["redelivery"] = {"status": again.status_code, **again.json()}
    await engine.publisher.close()
    await store.close()
    result["outbox"] = contents(path)
    return result


def main() -> None:
    mode, workdir = sys.argv[1], Path(sys.argv[2])
    run = {"publisher": publisher, "push": push}[mode]
    print(json.dumps(asyncio.run(run(workdir))))


if __name__ == "__main__":
    main()
