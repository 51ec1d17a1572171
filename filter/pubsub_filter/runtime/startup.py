"""A long-running surface's start: logging, telemetry, the engine, and the `config_loaded` line.

One function for `serve` and `pull`, so both set up in the same order and say the same thing
about what they run. What only one surface needs (the push endpoint's authenticator, the pull
worker's routes, project and subscriber) it makes itself and passes in."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

from pubsub_filter.core.config.schema import Config, Route
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.lane_process import ProcessLane
from pubsub_filter.core.logs import get_logger
from pubsub_filter.google.shared import detect_project
from pubsub_filter.observability.logsetup import configure
from pubsub_filter.runtime import durability
from pubsub_filter.runtime.wiring import make_engine, make_telemetry


def start(cfg: Config, routes: Sequence[Route] | None = None, **line: Any) -> Engine:
    """Logging (JSON lines naming `cfg.project`'s traces), then the engine with its telemetry,
    then one `config_loaded` line: the routes run (`routes`, by default all of them), the
    backends, and `line`, what the surface adds (serve: `auth`, `port`; pull: `surface`).

    The engine's errors (no credentials, a backend that cannot be built) are the caller's to say."""
    configure(project=cfg.project, find_project=detect_project)
    log = get_logger("pubsub_filter")
    # Embedded files on Cloud Run: the commands refuse them unless the experiment's variable says
    # otherwise; whoever starts anyway is told at ERROR what is being lost, before anything runs.
    loss = durability.loss_line(cfg)
    if loss is not None:
        log.error("embedded_backends_on_cloud_run", **loss)
    # large messages decided in a process of their own: the loop's process keeps its GIL for the
    # requests, the health probe and the bodies still arriving (`core.engine.lane_process`)
    engine = make_engine(cfg, make_telemetry(cfg), ProcessLane(cfg.routes))
    # What is alive now (the modules, the clients, the compiled routes) lives as long as the
    # process: out of the collector's sight, a full collection walks only what requests made
    # since (65 ms for this process's ~116,000 objects with the Google clients imported, the
    # event loop held all that time; 0.01 ms once frozen)
    gc.freeze()
    log.info(
        "config_loaded",
        routes=[r.name for r in (cfg.routes if routes is None else routes)],
        store=cfg.store.backend,
        publisher=cfg.publisher.backend,
        records=cfg.records.backend,
        **line,
    )
    return engine
