"""What a request can name has a bounded footprint: a made-up route in `POST /push/<name>` (no
`auth` section, so anyone may send one) adds no metric series, no span name and no memory per
name. Every such name shares one label, `route="(unknown)"`; its record and decision line keep
the name as sent, cut to a bounded length."""

from __future__ import annotations

import gc
import json
import logging
import sqlite3
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.observability.telemetry import UNKNOWN_ROUTE
from pubsub_filter.push.app import MAX_ROUTE_NAME, create_app
from pubsub_filter.runtime.otel import from_config
from pubsub_filter.runtime.wiring import make_engine
from tests.support.asgi import call

WARM = 1_000
#: Made-up names pushed (50,000 took 136 s of a slow CI run, with tracemalloc on; 15,000 finds the
#: same: 256 KiB over 14,000 names is 19 bytes a name)
MANY = 15_000


def served(config: Path) -> tuple[Engine, Any]:
    engine = make_engine(load(str(config)), from_config(metrics=True, traces=False, env={}))
    return engine, create_app(engine)


async def scrape(app: Any) -> tuple[int, int]:
    """(bytes, samples) of one `/metrics` scrape."""
    status, body = await call(app, "GET", "/metrics")
    assert status == 200
    return len(body), sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


async def push_made_up(app: Any, start: int, stop: int) -> None:
    for i in range(start, stop):
        status, _ = await call(app, "POST", f"/push/made-up-{i:06d}", b"{}")
        assert status == 404


@pytest.mark.loop_may_block("15,000 requests: debug mode would make it 10x slower; gc and tracemalloc in its body")
async def test_fifteen_thousand_made_up_route_names_leave_metrics_and_memory_flat(
    quick_start: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # pytest keeps every log record it captures: 15,000 decision lines would be its memory, not ours
    caplog.set_level(logging.ERROR, logger="pubsub_filter")
    engine, app = served(quick_start)
    try:
        started = time.perf_counter()
        await push_made_up(app, 0, WARM)
        warm_bytes, warm_samples = await scrape(app)
        gc.collect()
        tracemalloc.start()
        try:
            warm_memory = tracemalloc.get_traced_memory()[0]
            await push_made_up(app, WARM, MANY)
            many_bytes, many_samples = await scrape(app)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - warm_memory
        finally:
            tracemalloc.stop()
        took = time.perf_counter() - started
        assert many_samples == warm_samples
        assert many_bytes - warm_bytes < 200  # only the counts' digits grow
        # 14,000 names: a name kept anywhere (its string alone is 49 bytes and more) is past 256 KiB;
        # three runs measured retained 17-21 KB
        assert grown < 1 << 18, f"{grown} bytes retained by {MANY - WARM} made-up route names"
        print(f"{MANY} made-up routes in {took:.1f}s: /metrics {many_bytes} bytes, {many_samples} samples, +{grown} B")
    finally:
        await engine.close()


async def test_made_up_route_names_are_counted_under_one_unknown_route_label(quick_start: Path) -> None:
    engine, app = served(quick_start)
    try:
        for name in ("nope", "typo-injury-report", "x" * 5000):
            assert (await call(app, "POST", f"/push/{name}", b"{}"))[0] == 404
        _, body = await call(app, "GET", "/metrics")
        decided = [line for line in body.decode().splitlines() if line.startswith("pubsub_filter_decisions_total{")]
        assert decided == [
            f'pubsub_filter_decisions_total{{decision="rejected",enforced="true",route="{UNKNOWN_ROUTE}"}} 3.0'
        ]
    finally:
        await engine.close()


async def test_a_made_up_route_name_is_recorded_as_sent_cut_to_a_bounded_length(quick_start: Path) -> None:
    engine, app = served(quick_start)
    long_name = "y" * 20_000
    try:
        status, body = await call(app, "POST", f"/push/{long_name}", b"{}")
        assert status == 404
        assert len(json.loads(body)["reason"]) < MAX_ROUTE_NAME + 100
        assert (await call(app, "POST", "/push/short-typo", b"{}"))[0] == 404
    finally:
        await engine.close()
    db = sqlite3.connect(quick_start.parent / "filter-decisions.db")
    try:
        rows = db.execute("SELECT route, decision FROM decisions ORDER BY rowid").fetchall()
    finally:
        db.close()
    assert rows == [(long_name[:MAX_ROUTE_NAME] + "…", "rejected"), ("short-typo", "rejected")]
