"""What `serve` hands uvicorn."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from filter.core.config import parse
from filter.push.serve import _GracefulServer, server_config

ROUTES = [{"name": "reports", "destination": "phase3", "key": ["payload.k"]}]


def config(**server: Any) -> Any:
    return parse({"routes": ROUTES, "server": server})


def test_a_sub_second_shutdown_grace_reaches_uvicorn_as_written() -> None:
    assert server_config(object(), config(shutdown_grace="0.5s"), "127.0.0.1", 8080).timeout_graceful_shutdown == 0.5


def test_the_default_shutdown_grace_is_ten_seconds() -> None:
    assert server_config(object(), config(), "127.0.0.1", 8080).timeout_graceful_shutdown == 10.0


def graceful_server() -> _GracefulServer:
    return _GracefulServer(server_config(object(), config(), "127.0.0.1", 8080))


def test_a_sigterm_drains_the_server_and_is_not_raised_again_so_the_process_exits_0() -> None:
    raised_again: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, _frame: raised_again.append(sig))
    try:
        server = graceful_server()
        with server.capture_signals():
            signal.raise_signal(signal.SIGTERM)
            assert server.should_exit
        assert raised_again == []
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_ctrl_c_drains_the_server_and_still_ends_the_process_as_a_ctrl_c() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server = graceful_server()
        with pytest.raises(KeyboardInterrupt), server.capture_signals():
            signal.raise_signal(signal.SIGINT)
            assert server.should_exit
    finally:
        signal.signal(signal.SIGINT, previous)
