"""What every long-running surface answers on its probe port: readiness of the engine's
backends, and Prometheus text for `/metrics`. Shared by push and the pull worker's health
port, so neither surface imports the other."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from filter.core.counters import counts
from filter.observability.telemetry import PrometheusText, Telemetry

if TYPE_CHECKING:
    from filter.core.engine import Engine


def health(engine: Engine, status: str = "ok", **more: Any) -> dict[str, Any]:
    """`/healthz`'s body, the same shape for `serve` and `pull`: status, messages being decided,
    the process's counters, then what the surface adds (pull: `handled`; on failure, `error`
    and the failed `streams`)."""
    return {"status": status, "in_flight": engine.in_flight, "counts": dict(counts), **more}


def telemetry_of(engine: Engine) -> Telemetry | None:
    """The engine's OpenTelemetry instruments, if it was built with them (`runtime.wiring`)."""
    return engine.telemetry if isinstance(engine.telemetry, Telemetry) else None


def metrics_routes(engine: Engine) -> list[Route]:
    """`GET /metrics` when the engine's metrics are on, else nothing."""
    tel = telemetry_of(engine)
    return [] if tel is None or tel.prometheus is None else [metrics_route(tel.prometheus)]


async def backend_problems(engine: Engine) -> dict[str, str]:
    """Why every forward would fail now, by backend: the store cannot answer, or the publisher
    cannot take a message (an outbox whose directory vanished, a full disk). Empty: ready."""
    budget = engine.config.store_errors.budget
    problems: dict[str, str] = {}
    backends = {"store": engine.store.ping}
    if engine.publisher is not None:  # an in-process engine has none: its callers' bodies send
        backends["publisher"] = engine.publisher.ping
    for name, ping in backends.items():
        try:
            await asyncio.wait_for(ping(), budget)
        except Exception as exc:
            problems[name] = str(exc) or type(exc).__name__
    return problems


def metrics_route(prometheus: PrometheusText) -> Route:
    """`GET /metrics`: Prometheus text, for a Managed Prometheus sidecar or any scraper."""
    from prometheus_client import CONTENT_TYPE_LATEST

    async def metrics(_: Request) -> Response:
        return Response(prometheus.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return Route("/metrics", metrics, methods=["GET"])
