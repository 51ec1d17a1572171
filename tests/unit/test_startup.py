"""The one start-up of `serve` and `pull`: logging first, then the engine, then one line that
says what runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.google.shared import detect_project
from pubsub_filter.runtime import startup

ROUTES = [{"name": name, "destination": "phase3", "key": ["payload.k"]} for name in ("a", "b")]


def embedded(tmp_path: Path) -> Config:
    files = {k: {"path": str(tmp_path / f"{k}.db")} for k in ("store", "records")}
    return parse(
        {
            **files,
            "project": "proj",
            "publisher": {"path": str(tmp_path / "out.jsonl")},
            "telemetry": {"metrics": False, "traces": False},
            "routes": ROUTES,
        }
    )


async def test_logging_is_set_up_for_the_project_before_the_line_that_names_what_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured: list[Any] = []
    # the process's logging is left as the suite set it: the call is recorded, not made
    monkeypatch.setattr(startup, "configure", lambda **how: configured.append(how))
    cfg = embedded(tmp_path)
    with capture_logs() as logs:
        engine = startup.start(cfg, cfg.routes[1:], surface="pull")
    try:
        # the config's project, else the environment's or the metadata server's (Cloud Run sets no variable)
        assert configured == [{"project": "proj", "find_project": detect_project}]
        lines = [line for line in logs if line["event"] == "config_loaded"]
        assert lines == [
            {
                "event": "config_loaded",
                "log_level": "info",
                "routes": ["b"],
                "store": cfg.store.backend,
                "publisher": cfg.publisher.backend,
                "records": cfg.records.backend,
                "surface": "pull",
            }
        ]
        assert engine.config is cfg
    finally:
        await engine.close()


async def test_without_routes_the_line_names_every_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup, "configure", lambda **_: None)
    with capture_logs() as logs:
        engine = startup.start(embedded(tmp_path), auth=False, port=8080)
    try:
        line = next(line for line in logs if line["event"] == "config_loaded")
        assert (line["routes"], line["auth"], line["port"]) == (["a", "b"], False, 8080)
    finally:
        await engine.close()
