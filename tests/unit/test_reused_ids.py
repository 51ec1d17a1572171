"""A message id reused with other content: decided as that content, recorded as a reused id, counted."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client.parser import text_string_to_metric_families

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from pubsub_filter.observability.telemetry import PrometheusText, Telemetry
from tests.support.fakes import MemoryPublisher, MemoryRecorder

CONFIG = {"routes": [{"name": "reports", "destination": "phase3", "key": ["payload.game"]}]}


def message(status: str, message_id: str) -> Message:
    return Message(json.dumps({"game": "g1", "status": status}).encode(), {}, message_id)


async def test_a_reused_id_is_counted_by_route_beside_its_decision(tmp_path: Path) -> None:
    prometheus = PrometheusText()
    telemetry = Telemetry(MeterProvider(metric_readers=[prometheus.reader]), None, prometheus)
    recorder = MemoryRecorder()
    engine = Engine(parse(CONFIG), SqliteStore(tmp_path / "s.db"), MemoryPublisher(), recorder, telemetry=telemetry)
    try:
        await engine.handle("reports", message("out", "req-1"))
        await engine.handle("reports", message("in", "req-1"))  # reused, forwarded
        await engine.handle("reports", message("in", "req-1"))  # a redelivery of that: duplicate
        await engine.handle("reports", message("out", "req-2"))
    finally:
        await engine.store.close()
    assert [(str(r.decision), r.extra.get("id_reused")) for r in recorder.records] == [
        ("forwarded", None),
        ("forwarded", True),
        ("duplicate", None),
        ("forwarded", None),
    ]
    families = {f.name: f for f in text_string_to_metric_families(prometheus.render().decode())}
    [sample] = [s for s in families["pubsub_filter_ids_reused"].samples if s.name.endswith("_total")]
    assert (sample.labels, sample.value) == ({"route": "reports"}, 1)
    assert recorder.records[1].decision is Decision.FORWARDED
