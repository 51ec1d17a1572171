"""`pubsub-filter serve`: the push endpoint under uvicorn, stopped on SIGTERM within one budget."""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

from pubsub_filter.core.config.schema import Config
from pubsub_filter.core.engine.stopping import DRAIN
from pubsub_filter.core.ports import Failure
from pubsub_filter.push.app import create_app, engine_lifespan
from pubsub_filter.runtime.server import Server
from pubsub_filter.runtime.startup import start


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
        ws="none",  # a push endpoint takes no websocket: uvicorn need not import one (25 ms at start)
        # the requests' share of the stop; uvicorn waits on it with asyncio.wait_for, which takes a
        # float: `int()` made 0.5s none at all
        timeout_graceful_shutdown=cfg.server.shutdown_budget * DRAIN,  # type: ignore[arg-type]
    )


def _serve(cfg: Config, sock: socket.socket, host: str, port: int) -> int:
    authenticator = None
    if cfg.auth.audience:
        from pubsub_filter.push.auth import PushAuthenticator

        authenticator = PushAuthenticator(
            audience=cfg.auth.audience,
            service_account=cfg.auth.service_account,
            issuers=tuple(cfg.auth.issuers),
            certs_url=cfg.auth.certs_url,
        )
    engine = start(cfg, auth=authenticator is not None, port=port)
    # the lifespan asks the server for the stop its signal began: `server` is read when the
    # lifespan ends, long after it is assigned below (a closure reads the name when called)
    app = create_app(engine, authenticator, lifespan=lambda _app: engine_lifespan(engine, lambda: server.stop))
    # held requests (`coalesce`) are decided as the stop begins, not when their burst would end
    server = Server(server_config(app, cfg, host, port), budget=cfg.server.shutdown_budget, on_stop=engine.decide_held)
    server.run(sockets=[sock])
    return 0
