"""`pubsub-filter serve`: the push endpoint under uvicorn, stopped on SIGTERM within one budget."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import structlog
import uvicorn

from filter.core.config import Config
from filter.core.stopping import DRAIN, Stop
from filter.observability.logsetup import configure
from filter.push.app import create_app, engine_lifespan
from filter.runtime import backstop
from filter.runtime.operational import Failure
from filter.runtime.wiring import make_engine, make_telemetry


class _GracefulServer(uvicorn.Server):
    """Exit 0 after a SIGTERM shutdown: it is how Cloud Run stops every instance, not a failure.

    uvicorn's own `capture_signals` raises each captured signal again once drained (so the
    process dies of it). This one catches the same signals through the public `handle_exit`,
    drains as uvicorn does, and raises only the others again (Ctrl-C still ends as one).

    The first signal begins the stop: its one budget is counted from there (`stop`), and the
    backstop ends the process once it has passed.
    """

    def __init__(
        self, config: uvicorn.Config, budget: float, backstop: Callable[[Stop], object] = backstop.arm
    ) -> None:
        super().__init__(config)
        self.budget = budget
        self.backstop = backstop
        self.stop: Stop | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        caught: list[int] = []

        def handle(sig: int, frame: FrameType | None) -> None:
            caught.append(sig)
            if self.stop is None:
                self.stop = Stop.begin(self.budget)
                self.backstop(self.stop)
            self.handle_exit(sig, frame)

        original = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        for again in reversed(caught):
            if again != signal.SIGTERM:
                signal.raise_signal(again)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts, so a port in use is one
    clear line (`Failure`) rather than a server that starts, logs and stops."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise Failure(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve(cfg: Config, host: str, port: int) -> int:
    sock = listen(host, port)
    try:
        return _serve(cfg, sock, host, port)
    finally:
        sock.close()


def server_config(app: Any, cfg: Config, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        access_log=False,
        log_level="warning",
        # the requests' share of the stop; uvicorn waits on it with asyncio.wait_for, which takes a
        # float: `int()` made 0.5s none at all
        timeout_graceful_shutdown=cfg.server.shutdown_budget * DRAIN,  # type: ignore[arg-type]
    )


def _serve(cfg: Config, sock: socket.socket, host: str, port: int) -> int:
    configure(project=cfg.project)
    engine = make_engine(cfg, make_telemetry(cfg))
    authenticator = None
    if cfg.auth.audience:
        from filter.push.auth import PushAuthenticator

        authenticator = PushAuthenticator(
            audience=cfg.auth.audience,
            service_account=cfg.auth.service_account,
            issuers=tuple(cfg.auth.issuers),
            certs_url=cfg.auth.certs_url,
        )
    structlog.get_logger("pubsub_filter").info(
        "config_loaded",
        routes=[r.name for r in cfg.routes],
        store=cfg.store.backend,
        publisher=cfg.publisher.backend,
        records=cfg.records.backend,
        auth=authenticator is not None,
        port=port,
    )
    stopping: list[_GracefulServer] = []  # the server, once made: the app is made before it
    app = create_app(engine, authenticator, lifespan=lambda _app: engine_lifespan(engine, lambda: stopping[0].stop))
    server = _GracefulServer(server_config(app, cfg, host, port), cfg.server.shutdown_budget)
    stopping.append(server)
    server.run(sockets=[sock])
    return 0
