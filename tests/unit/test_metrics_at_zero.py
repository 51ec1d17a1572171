"""Every documented per-route counter is on `/metrics` from the start, at zero, for every
configured route: an alert or a `rate()` over a series that appears only at its first event
sees nothing, then a jump."""

from __future__ import annotations

from pathlib import Path

from pubsub_filter.core.config.schema import load
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.otel import from_config
from pubsub_filter.runtime.wiring import make_engine
from tests.support.asgi import call

COUNTERS = (
    "pubsub_filter_lease_takeovers_total",
    "pubsub_filter_heartbeat_failures_total",
    "pubsub_filter_commit_refusals_total",
    "pubsub_filter_fail_open_total",
    "pubsub_filter_ids_reused_total",
    "pubsub_filter_selection_changed_total",
)


async def test_every_routes_counters_are_exported_at_zero_before_any_message(quick_start: Path) -> None:
    cfg = load(str(quick_start))
    engine = make_engine(cfg, from_config(metrics=True, traces=False, env={}))
    try:
        status, body = await call(create_app(engine), "GET", "/metrics")
    finally:
        await engine.close()
    assert status == 200
    samples = {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in body.decode().splitlines() if line[:1] != "#"}
    for counter in COUNTERS:
        for route in cfg.routes:
            assert samples.get(f'{counter}{{route="{route.name}"}}') == "0.0", (counter, route.name)
