"""The pull worker's probes, its stall report and its logs; trace context on forwarded messages.

Workers run as real subprocesses (the console script) against the Pub/Sub emulator.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.cloud.pubsub_v1.open_telemetry.context_propagation import OpenTelemetryContextGetter
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.parser import text_string_to_metric_families

from pubsub_filter.backends.publishers.pubsub import PubsubPublisher
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Message
from pubsub_filter.observability.instrumented import InstrumentedPublisher
from pubsub_filter.observability.telemetry import Telemetry
from pubsub_filter.pull.worker import PullWorker
from pubsub_filter.runtime.wiring import make_store
from tests.support.dlq import DeadLetterRig, PullProcess
from tests.support.emulators import PubsubEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.net import free_port
from tests.support.pubsub_helpers import PubsubAdmin
from tests.support.serve import records, write_config

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(180)]

LEASE = {"duration": "20s", "ack_deadline": "10s", "heartbeat": "2s"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Rig:
    def __init__(self, emu: PubsubEmulator, tmp_path: Path) -> None:
        self.emu = emu
        self.tmp_path = tmp_path
        self.admin = PubsubAdmin(emu)
        self.dlq = DeadLetterRig.create(self.admin, retain_acked=True)
        self.dest = self.admin.topic("dest")
        self.dest_sub = self.dlq.subscription(self.dest, "downstream")
        self.procs: list[PullProcess] = []

    def config(self, name: str, **pull: Any) -> dict[str, Any]:
        return {
            "project": self.emu.project,
            "store": {"backend": "sqlite", "path": str(self.tmp_path / f"{name}-state.db")},
            "publisher": {"backend": "pubsub", "timeout": "20s"},
            "records": {"backend": "sqlite", "path": str(self.tmp_path / f"{name}-decisions.db")},
            "lease": dict(LEASE),
            "pull": pull,
            "routes": [
                {"name": "r", "subscription": self.dlq.sub, "destination": self.dest, "key": ["payload.k"]},
            ],
        }

    def start(self, name: str, pubsub_host: str | None = None, **pull: Any) -> PullProcess:
        path = write_config(self.tmp_path / f"{name}.yaml", self.config(name, **pull))
        env = {"PUBSUB_EMULATOR_HOST": pubsub_host or self.emu.host, "GOOGLE_CLOUD_PROJECT": self.emu.project}
        proc = PullProcess(path, self.tmp_path / f"{name}.log", env=env, name=name)
        self.procs.append(proc)
        return proc.start()

    def close(self) -> None:
        for proc in self.procs:
            if proc.proc is not None:
                try:
                    proc.stop()
                except BaseException:
                    proc.kill()
                    raise
        self.dlq.cleanup()
        self.admin.cleanup()


@pytest.fixture
def rig(pubsub_emulator: PubsubEmulator, tmp_path: Path) -> Iterator[Rig]:
    with closing(Rig(pubsub_emulator, tmp_path)) as r:
        yield r


def log_lines(proc: PullProcess) -> list[str]:
    return [line for line in proc.log_path.read_text().splitlines() if line.strip()]


def test_health_port_answers_probes_and_metrics_match_the_records(rig: Rig) -> None:
    port = free_port()
    proc = rig.start("health", health_port=port)
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/healthz").status_code == 200
    assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
    for k in ("a", "a", "b"):
        rig.admin.publish(rig.dlq.source, json.dumps({"k": k}).encode())
    proc.wait_events(lambda es: sum(e.get("message") == "decision" for e in es) >= 3)
    text = httpx.get(f"{base}/metrics").text
    proc.stop()
    counted = {
        s.labels["decision"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "pubsub_filter_decisions"
        for s in f.samples
        if s.name == "pubsub_filter_decisions_total"
    }
    recorded: dict[str, float] = {}
    for row in records(rig.tmp_path / "health-decisions.db"):
        recorded[row["decision"]] = recorded.get(row["decision"], 0) + 1
    assert counted == recorded
    assert sum(recorded.values()) == 3 and recorded["forwarded"] == 2


async def test_a_stream_whose_consumer_thread_dies_stops_the_worker_with_the_reason(rig: Rig) -> None:
    rig.admin.publish(rig.dlq.source, json.dumps({"k": "a"}).encode())
    cfg = parse(rig.config("dead"))
    engine = Engine(cfg, make_store(cfg), MemoryPublisher(), MemoryRecorder())
    # A flow-control limit `check` refuses (max_bytes 0): the client's consumer thread dies on the
    # first response, and the library never completes the stream's future.
    settings = cfg.pull.model_copy(update={"max_bytes": 0})
    with rig.emu.env():
        worker = PullWorker(engine, cfg.routes, rig.emu.project, settings=settings)
    assert await asyncio.wait_for(worker.run(), 30) == 1
    assert "consumer thread died: ZeroDivisionError" in str(worker.failure)


def test_unreachable_pubsub_is_one_error_line_within_the_ack_deadline(rig: Rig) -> None:
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    proc = rig.start("stalled", pubsub_host=closed, health_port=free_port())
    [stalled] = [
        e
        for e in proc.wait_events(lambda es: any(e.get("message") == "pull_stalled" for e in es), timeout=10)
        if e.get("message") == "pull_stalled"
    ]
    assert time.monotonic() - started < 10  # lease.ack_deadline
    assert stalled["severity"] == "ERROR" and stalled["route"] == "r"
    assert stalled["subscription"].endswith(rig.dlq.sub)
    # while it stays unreachable, the watchdog keeps probing but says so only once
    proc.wait_events(lambda es: time.monotonic() - started > 8)
    assert sum(e.get("message") == "pull_stalled" for e in proc.events()) == 1
    proc.stop()


def test_every_line_the_worker_writes_is_json_shutdown_included(rig: Rig) -> None:
    proc = rig.start("json", pubsub_host=f"127.0.0.1:{free_port()}")
    proc.wait_events(lambda es: any(e.get("message") == "pull_stalled" for e in es), timeout=10)
    proc.stop()
    lines = log_lines(proc)
    assert any('"stopped"' in line for line in lines)
    not_json = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not_json == []
    # the stream, reopened until its channel closes, makes the library log errors about it
    assert not [line for line in lines if "Channel closed" in line or "did not exit" in line]
    assert '"stopped"' in lines[-1]


async def test_the_forwarded_message_carries_trace_context_a_pubsub_client_continues(
    pubsub_emulator: PubsubEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    admin = PubsubAdmin(pubsub_emulator)
    dlq = DeadLetterRig.create(admin)
    try:
        dest = admin.topic("traced")
        sub = dlq.subscription(dest, "traced-downstream")
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        telemetry = Telemetry(tracer_provider=provider)
        cfg = parse(
            {
                "project": pubsub_emulator.project,
                "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
                "routes": [{"name": "r", "destination": dest, "key": ["payload.k"]}],
            }
        )
        publisher = InstrumentedPublisher(PubsubPublisher(project=pubsub_emulator.project), telemetry)
        engine = Engine(cfg, make_store(cfg), publisher, MemoryRecorder(), telemetry=telemetry)
        parent = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
        msg = Message(data=b'{"k": 1}', attributes={"googclient_traceparent": parent}, message_id="m1")
        rec = (await engine.handle("r", msg)).record
        assert str(rec.decision) == "forwarded"
        await engine.publisher.close()
        await engine.store.close()

        [received] = admin.pull(sub, 1, timeout=20)
        # the client library's own getter and the W3C propagator, as its subscriber uses them
        ctx = TraceContextTextMapPropagator().extract(carrier=received, getter=OpenTelemetryContextGetter())
        continued = trace.get_current_span(ctx).get_span_context()
        [send] = [s for s in spans.get_finished_spans() if s.name == f"{dest} send"]
        assert (continued.trace_id, continued.span_id) == (int(TRACE_ID, 16), send.context.span_id)
    finally:
        dlq.cleanup()
        admin.cleanup()
