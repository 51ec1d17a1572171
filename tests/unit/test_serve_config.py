"""What `serve` hands uvicorn."""

from __future__ import annotations

from typing import Any

from filter.core.config import parse
from filter.push.serve import server_config

ROUTES = [{"name": "reports", "destination": "phase3", "key": ["payload.k"]}]


def config(**server: Any) -> Any:
    return parse({"routes": ROUTES, "server": server})


def test_a_sub_second_shutdown_grace_reaches_uvicorn_as_written() -> None:
    assert server_config(object(), config(shutdown_grace="0.5s"), "127.0.0.1", 8080).timeout_graceful_shutdown == 0.5


def test_the_default_shutdown_grace_is_ten_seconds() -> None:
    assert server_config(object(), config(), "127.0.0.1", 8080).timeout_graceful_shutdown == 10.0
