"""What `serve` hands uvicorn."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from pubsub_filter.core.config.schema import ConfigError, parse
from pubsub_filter.core.engine.stopping import DRAIN
from pubsub_filter.push.serve import server_config
from pubsub_filter.runtime.server import Server

ROUTES = [{"name": "reports", "destination": "phase3", "key": ["payload.k"]}]


def config(**server: Any) -> Any:
    return parse({"routes": ROUTES, "server": server})


def test_uvicorn_waits_for_the_requests_the_drains_share_of_a_sub_second_budget_as_written() -> None:
    drain = server_config(object(), config(shutdown_budget="0.5s"), "127.0.0.1", 8080).timeout_graceful_shutdown
    assert drain == 0.5 * DRAIN


def test_the_default_stop_ends_well_inside_cloud_runs_ten_seconds() -> None:
    """Cloud Run sends SIGKILL 10 s after SIGTERM: the whole stop, not only the requests' wait,
    must end before (room is left for the runtime's own exit). uvicorn's wait used to be 10 s."""
    cfg = config()
    assert cfg.server.shutdown_budget <= 8.0
    assert server_config(object(), cfg, "127.0.0.1", 8080).timeout_graceful_shutdown < cfg.server.shutdown_budget


def test_shutdown_grace_is_refused_with_the_name_of_the_one_budget_that_replaces_it() -> None:
    with pytest.raises(ConfigError, match=r"shutdown_grace is gone: .*server\.shutdown_budget"):
        config(shutdown_grace="10s")


def graceful_server() -> Server:
    # no backstop: it would end the test process once the budget has passed
    return Server(server_config(object(), config(), "127.0.0.1", 8080), budget=8.0, backstop=lambda _stop: None)


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


def test_a_server_without_a_budget_leaves_the_signals_to_its_caller() -> None:
    """The pull worker's probes: the worker's handlers stay, and a SIGTERM does not stop the server."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, _frame: seen.append(sig))
    try:
        server = Server(server_config(object(), config(), "127.0.0.1", 8080), budget=None)
        with server.capture_signals():
            signal.raise_signal(signal.SIGTERM)
            assert not server.should_exit
        assert seen == [signal.SIGTERM]
        assert server.stop is None
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(("written", "seconds"), [(0, 0.0), ("0s", 0.0), ("0ms", 0.0), ("500ms", 0.5), ("60s", 60.0)])
def test_the_admission_wait_may_be_none_or_up_to_a_minute(written: Any, seconds: float) -> None:
    assert config(admission_wait=written).server.admission_wait == seconds


def test_the_admission_wait_by_default_is_two_seconds_well_inside_a_push_deadline() -> None:
    assert config().server.admission_wait == 2.0


@pytest.mark.parametrize("written", [-1, "-1s", "61s", "soon", True])
def test_an_admission_wait_that_is_not_a_duration_of_at_most_a_minute_is_refused(written: Any) -> None:
    with pytest.raises(ConfigError, match=r"server\.admission_wait"):
        config(admission_wait=written)


def test_serve_hands_uvicorn_no_websocket_implementation() -> None:
    assert server_config(object(), config(), "127.0.0.1", 8080).ws == "none"
