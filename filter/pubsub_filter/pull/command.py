"""`pubsub-filter pull` as a command: pick the routes, build the engine and client, run the worker."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence

import google.cloud.pubsub_v1 as pubsub_v1
from google.auth.exceptions import DefaultCredentialsError

from pubsub_filter.core.config.schema import Config, Route
from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.logs import get_logger
from pubsub_filter.google.shared import NO_CREDENTIALS, resolve_project
from pubsub_filter.pull.worker import PullWorker
from pubsub_filter.runtime.startup import start
from pubsub_filter.runtime.wiring import project_of

log = get_logger("pubsub_filter.pull")


class PullSetupError(FilterError):
    """The config cannot be pulled as asked (no subscription for a route, unknown route...)."""


def select_routes(cfg: Config, names: Sequence[str] | None) -> list[Route]:
    """The routes to pull (all of them by default); each must name its subscription."""
    if names:
        unknown = [n for n in names if cfg.route(n) is None]
        if unknown:
            known = ", ".join(r.name for r in cfg.routes)
            raise PullSetupError(f"no route {', '.join(map(repr, unknown))} in the config (routes: {known})")
        routes = [r for r in cfg.routes if r.name in set(names)]
    else:
        routes = list(cfg.routes)
    missing = [r.name for r in routes if not r.subscription]
    if missing:
        raise PullSetupError(
            f"route(s) {', '.join(map(repr, missing))} have no `subscription`: the pull worker needs one per "
            "route to know what to pull (set it in the config, or pick other routes with --route)"
        )
    return routes


def run(cfg: Config, route_names: Sequence[str] | None = None, health_port: int | None = None) -> int:
    """`pubsub-filter pull`: pull the routes' subscriptions until SIGTERM/SIGINT."""
    try:
        routes = select_routes(cfg, route_names)
    except PullSetupError as exc:
        print(f"pubsub-filter pull: {exc}", file=sys.stderr)
        return 2
    project = resolve_project(project_of(cfg))
    try:
        subscriber = pubsub_v1.SubscriberClient()
    except DefaultCredentialsError as exc:
        print(f"pubsub-filter pull: {NO_CREDENTIALS} ({exc})", file=sys.stderr)
        return 1
    try:
        engine = start(cfg, routes, surface="pull")
    except DefaultCredentialsError as exc:
        subscriber.close()
        print(f"pubsub-filter pull: {NO_CREDENTIALS} ({exc})", file=sys.stderr)
        return 1
    started = time.monotonic()

    async def main() -> int:
        worker = PullWorker(
            engine,
            routes,
            project,
            subscriber=subscriber,
            health_port=health_port or cfg.pull.health_port,
            health_host=cfg.pull.health_host,
            close_subscriber=True,  # before `stopped`, once the library's threads have ended
        )
        return await worker.run(install_signals=True)

    try:
        code = asyncio.run(main())
    finally:
        subscriber.close()  # already closed by the worker, unless it never got that far
    log.debug("pull_exit", code=code, ran_s=round(time.monotonic() - started, 3))
    return code
