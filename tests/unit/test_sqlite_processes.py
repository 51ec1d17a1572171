"""Two processes on one SQLite file: the embedded default must stay correct across processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pubsub_filter.backends.publishers.outbox import read_outbox
from pubsub_filter.backends.stores.sqlite import SqliteStore

ROOT = Path(__file__).parents[2]
MESSAGES = 150


def test_two_processes_racing_one_key_never_publish_concurrently(tmp_path: Path) -> None:
    # Output goes to files, not pipes: a worker blocked on a full pipe while holding the lease
    # would stall the other one for the whole lease.
    logs = {name: (tmp_path / f"{name}.out").open("w+") for name in ("p1", "p2")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.race_worker", str(tmp_path), name, str(MESSAGES)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, log in logs.items()
    ]
    outputs = []
    for p, log in zip(procs, logs.values(), strict=True):
        try:
            p.wait(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
        log.seek(0)
        out = log.read()
        assert p.returncode == 0, out[-2000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))

    # every message was acked with a decision
    assert sum(len(o) for o in outputs) == 2 * MESSAGES

    # publishes for the key never overlapped, across both processes
    in_flight = 0
    for line in (tmp_path / "trace").read_text().splitlines():
        in_flight += 1 if line.startswith("B ") else -1
        assert in_flight in (0, 1), "two publishes for one key were in flight at once"

    # each forwarded message was published exactly once, and the stored state is the last forward
    read = read_outbox(tmp_path / "outbox.jsonl")
    assert read.bad == []
    outbox = read.messages
    forwarded = [m for o in outputs for m, d in o.items() if d == "forwarded"]
    published = [m["attributes"]["filter_source_message_id"] for m in outbox]  # type: ignore[index]
    assert sorted(published) == sorted(forwarded)
    assert len(forwarded) >= 2
    import asyncio

    state = asyncio.run(SqliteStore(tmp_path / "state.db").read("hot", "hot"))
    assert state is not None and state.lease is None
    assert state.fingerprint == outbox[-1]["attributes"]["filter_fingerprint"]  # type: ignore[index]
    assert state.fence == len(outbox)  # one fence per claim, each claim published once
