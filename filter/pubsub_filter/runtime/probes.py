"""What every long-running surface answers on its probe port (`probe_routes`): `/healthz`,
`/readyz` over the engine's backends, and Prometheus text for `/metrics`. Shared by push and
the pull worker's health port, so neither surface imports the other."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pubsub_filter.observability.telemetry import PrometheusText, Telemetry

if TYPE_CHECKING:
    from pubsub_filter.core.engine.engine import Engine


def _nothing() -> Mapping[str, Any]:
    return {}


def _alive() -> Mapping[str, Any] | None:
    return None


def probe_routes(
    engine: Engine,
    *,
    fields: Callable[[], Mapping[str, Any]] = _nothing,
    failure: Callable[[], Mapping[str, Any] | None] = _alive,
    not_ready: Callable[[], Mapping[str, str]] = _nothing,
) -> list[Route]:
    """`GET /healthz`, `GET /readyz` and (when the engine's metrics are on) `GET /metrics`, for
    `serve` and the pull worker's health port alike. What a surface knows beyond its engine is
    asked for on each probe; the push endpoint gives none of it, the pull worker all three:

    - `fields`: what `/healthz`'s body adds after the engine's (pull: `handled`);
    - `failure`: why the surface is no longer alive, or None: then `/healthz` is 503 with
      status `failed` and these fields after `fields` (pull: the `error`, and the `streams`
      that ended). The push endpoint is alive while it answers, so its `/healthz` is always 200;
    - `not_ready`: why the surface cannot take messages now, listed before its backends'
      problems (pull: streams not open yet, stalled routes); any problem makes `/readyz` 503.
    """

    async def healthz(_: Request) -> Response:
        failed = failure()
        if failed is not None:
            return _json(health(engine, "failed", **fields(), **failed), 503)
        return _json(health(engine, **fields()))

    async def readyz(_: Request) -> Response:
        problems = dict(not_ready())
        problems.update(await backend_problems(engine))
        if problems:
            return _json({"status": "unavailable", **problems}, 503)
        return _json({"status": "ready"})

    routes = [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]
    return routes + metrics_routes(engine)


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status, media_type="application/json")


def health(engine: Engine, status: str = "ok", **more: Any) -> dict[str, Any]:
    """`/healthz`'s body, the same shape for `serve` and `pull`: status, then the engine's
    `health()` (messages being decided, the counts), then what the surface adds (pull:
    `handled`; on failure, `error` and the failed `streams`)."""
    return {"status": status, **engine.health(), **more}


def telemetry_of(engine: Engine) -> Telemetry | None:
    """The engine's OpenTelemetry instruments, if it was built with them (`runtime.wiring`)."""
    return engine.telemetry if isinstance(engine.telemetry, Telemetry) else None


def metrics_routes(engine: Engine) -> list[Route]:
    """`GET /metrics` when the engine's metrics are on, else nothing."""
    tel = telemetry_of(engine)
    return [] if tel is None or tel.prometheus is None else [metrics_route(tel.prometheus)]


async def backend_problems(engine: Engine) -> dict[str, str]:
    """Why every forward would fail now, by backend (`Engine.problems`). Empty: ready."""
    return await engine.problems()


def metrics_route(prometheus: PrometheusText) -> Route:
    """`GET /metrics`: Prometheus text, for a Managed Prometheus sidecar or any scraper."""
    from prometheus_client import CONTENT_TYPE_LATEST

    async def metrics(_: Request) -> Response:
        return Response(prometheus.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return Route("/metrics", metrics, methods=["GET"])
