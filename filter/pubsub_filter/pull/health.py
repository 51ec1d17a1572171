"""The pull worker's probes and its watchdog.

- `HealthServer`: `/healthz` (the worker's loop answers, no stream failed and no stream's
  consumer thread died: see `ConsumerDeaths`), `/readyz`
  (every stream open, none stalled, store and publisher answer) and `/metrics`, on a small
  uvicorn server inside the worker's own event loop (for GKE probes, Cloud Run worker pools
  and Prometheus scrapes).
- `Watchdog`: when a route has had no message for a quarter of its ack deadline, ask Pub/Sub
  about its subscription (a unary `GetSubscription`, bounded in time). A failure (Pub/Sub
  unreachable, the subscription deleted or detached, permission lost) is one `pull_stalled`
  error line, well within the ack deadline; `pull_recovered` when it answers again. An idle
  subscription that Pub/Sub confirms is healthy is not an error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import uvicorn
from starlette.applications import Starlette

from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.ports import Failure
from pubsub_filter.runtime.probes import probe_routes
from pubsub_filter.runtime.server import Server

log = get_logger("pubsub_filter.pull")


def stream_failures(streams: Mapping[str, concurrent.futures.Future[Any]]) -> dict[str, str]:
    """Route → why its streaming pull ended, for each stream whose future is done.

    A streaming pull's future completes only when the stream is cancelled or has failed for
    good, so a done future before shutdown is a route that pulls nothing any more.
    """
    failures: dict[str, str] = {}
    for route, future in streams.items():
        if not future.done():
            continue
        if future.cancelled():
            failures[route] = "the streaming pull was cancelled"
        elif (exc := future.exception()) is not None:
            failures[route] = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
        else:
            failures[route] = "the streaming pull ended by itself"
    return failures


#: google-api-core's streaming consumer (the thread reading a streaming pull) logs its one ERROR
#: record on this logger when it dies on an exception it did not expect (e.g. a flow-control
#: limit of 0: a division by zero). google-cloud-pubsub 2.44 does not wire its own fatal-error
#: hook there, so the stream's future then never completes and the stream pulls nothing.
CONSUMER_LOGGER = "google.api_core.bidi"


class ConsumerDeaths(logging.Handler):
    """Calls `died(reason)` for each streaming consumer thread the client library reports dead,
    between `attach()` and `detach()`. The logger is the library's, shared by the process: any
    such death counts (a worker cannot tell whose consumer thread it was).

    Why a log handler: google-api-core's `BackgroundConsumer` thread ends on an unexpected error
    with only an `exception` log record; the streaming-pull future is not resolved by it, and no
    public callback reports it. The record is the one signal the library gives."""

    def __init__(self, died: Callable[[str], None]) -> None:
        super().__init__(logging.ERROR)
        self.died = died

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.died(f"{type(exc).__name__}: {exc}" if exc is not None else record.getMessage())

    def attach(self) -> None:
        logging.getLogger(CONSUMER_LOGGER).addHandler(self)

    def detach(self) -> None:
        logging.getLogger(CONSUMER_LOGGER).removeHandler(self)


class Watchdog:
    """Per route: when did a message last arrive, and is the subscription answering?"""

    def __init__(self, paths: dict[str, str], ack_deadline: float, probe: Callable[[str, float], None]) -> None:
        self.paths = paths
        self.quiet_after = max(ack_deadline / 4, 0.05)
        self.probe = probe  # (subscription path, timeout): raises when Pub/Sub cannot confirm it
        now = time.monotonic()
        self.last_message = dict.fromkeys(paths, now)
        self.stalled: dict[str, str] = {}

    def saw_message(self, route: str) -> None:
        self.last_message[route] = time.monotonic()
        if route in self.stalled:
            self._recovered(route)

    async def check(self) -> None:
        """One round: probe every route that has been quiet for a quarter of the ack deadline."""
        for route, path in self.paths.items():
            quiet = time.monotonic() - self.last_message[route]
            if quiet < self.quiet_after:
                continue
            try:
                await asyncio.to_thread(self.probe, path, self.quiet_after)
            except Exception as exc:
                error = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
                if route not in self.stalled:
                    log.error(
                        "pull_stalled",
                        route=route,
                        subscription=path,
                        quiet_s=round(quiet, 1),
                        error=error,
                        hint="no message arrives and Pub/Sub does not confirm the subscription: "
                        "check the network to Pub/Sub, that the subscription exists and is not detached, "
                        "and the worker's roles/pubsub.subscriber",
                    )
                self.stalled[route] = error
            else:
                if route in self.stalled:
                    self._recovered(route)

    def _recovered(self, route: str) -> None:
        del self.stalled[route]
        log.info("pull_recovered", route=route, subscription=self.paths[route])

    async def run(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            await self.check()


class HealthServer:
    def __init__(self, app: Starlette, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise Failure(f"cannot listen on {host}:{port} for health checks: {exc.strerror or exc}") from None
        self.port = self.sock.getsockname()[1]
        # the worker owns SIGTERM/SIGINT, not this server
        # no websocket implementation: a health port takes none (uvicorn would import one as it starts)
        self.server = Server(
            uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning", ws="none"), budget=None
        )
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 5.0)
        self.sock.close()


def health_app(worker: Any) -> Starlette:
    """Probes over a `PullWorker` (its engine, streams and watchdog)."""

    def failure() -> dict[str, Any] | None:
        # The streams are looked at here too: a stream's end reaches `worker.failure` from a
        # client thread, and this answer must not wait for that.
        streams = worker.stream_failures()
        if worker.failure is None and not streams:
            return None
        error = str(worker.failure) if worker.failure is not None else next(iter(streams.values()))
        return {"error": error, "streams": streams}

    def not_ready() -> dict[str, str]:
        problems: dict[str, str] = {}
        if not worker.ready.is_set():
            problems["streams"] = "not open yet"
        for route, error in worker.watchdog.stalled.items():
            problems[f"route {route}"] = error
        return problems

    def fields() -> dict[str, Any]:
        return {"handled": worker.handled}

    return Starlette(routes=probe_routes(worker.engine, fields=fields, failure=failure, not_ready=not_ready))
