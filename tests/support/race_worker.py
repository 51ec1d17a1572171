"""One 'process' of a two-process race on one SQLite file (run by tests/unit/test_sqlite_processes.py).

Usage: python -m tests.support.race_worker WORKDIR WORKER_ID MESSAGES

Handles MESSAGES messages for a single hot key with content cycling through three values,
four at a time, retrying contended ones the way Pub/Sub redelivers. Around every publish
it appends `B <id>` / `E <id>` to WORKDIR/trace so the test can prove no two publishes
for the key ever overlapped, across both processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pubsub_filter.backends.publishers.outbox import OutboxPublisher
from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.sqlite import SqliteSink
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import ACKED, Decision, Message


class TracedPublisher(OutboxPublisher):
    def __init__(self, path: Path, trace: Path):
        super().__init__(path)
        self.trace = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        os.write(self.trace, f"B {attributes['filter_source_message_id']}\n".encode())
        await asyncio.sleep(0.002)  # a publish takes time: widen the window a race would need
        try:
            return await super().publish(destination, data, attributes, ordering_key)
        finally:
            os.write(self.trace, f"E {attributes['filter_source_message_id']}\n".encode())


async def run(workdir: Path, worker: str, count: int) -> None:
    cfg = parse({"routes": [{"name": "hot", "destination": "out", "key": ["payload.k"]}]})
    engine = Engine(
        cfg,
        GuardedStore(SqliteStore(workdir / "state.db"), cfg.store_errors),
        TracedPublisher(workdir / "outbox.jsonl", workdir / "trace"),
        BatchingRecorder(SqliteSink(workdir / "decisions.db"), flush_interval=0.2),
        instance=worker,
    )
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    decisions: dict[str, str] = {}

    async def consume() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            data = json.dumps({"k": "hot", "v": ["A", "B", "C"][i % 3], "worker": worker}).encode()
            msg = Message(data=data, attributes={}, message_id=f"{worker}-{i}", publish_time=None)
            while True:
                rec = (await engine.handle("hot", msg)).record
                if rec.decision in ACKED:
                    decisions[msg.message_id] = str(rec.decision)
                    break
                assert rec.decision in (Decision.CONTENDED,), rec
                await asyncio.sleep(0.001)  # Pub/Sub's redelivery backoff, shortened

    await asyncio.gather(*(consume() for _ in range(4)))
    await engine.recorder.close()
    await engine.publisher.close()
    print(json.dumps(decisions))


if __name__ == "__main__":
    asyncio.run(run(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
