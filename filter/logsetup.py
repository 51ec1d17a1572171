"""structlog set-up: Cloud Logging's structured JSON on a pipe, readable lines on a terminal.

Cloud Run forwards stdout lines to Cloud Logging, which lifts `severity`, `message`,
`logging.googleapis.com/trace` and `logging.googleapis.com/labels` out of the JSON.
Every processor here is a small callable, as structlog intends.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import MutableMapping
from typing import Any, TextIO

import msgspec
import structlog

_SEVERITY = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "warn": "WARNING",
    "error": "ERROR",
    "critical": "CRITICAL",
    "exception": "ERROR",
}
TRACE_FIELD = "logging.googleapis.com/trace"
LABELS_FIELD = "logging.googleapis.com/labels"
_FORBIDDEN = ("authorization", "token", "payload", "data")


def _cloud_fields(project: str | None) -> structlog.types.Processor:
    def processor(_: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event["severity"] = _SEVERITY.get(method, "DEFAULT")
        event["message"] = event.pop("event", "")
        trace = event.pop("trace", None)
        if trace:
            event[TRACE_FIELD] = f"projects/{project}/traces/{trace}" if project else trace
        route = event.get("route")
        if route is not None:
            event[LABELS_FIELD] = {"route": str(route), "component": "pubsub-filter"}
        return event

    return processor


def _timestamp(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    now = time.time()
    event["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    return event


def _scrub(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Never let a payload or a credential reach a log line, whoever logged it."""
    for k in _FORBIDDEN:
        event.pop(k, None)
    return event


def _json(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    return msgspec.json.encode(event, enc_hook=str).decode()


def configure(
    level: str | None = None, fmt: str | None = None, project: str | None = None, stream: TextIO | None = None
) -> None:
    """`fmt`: json | console | auto (console on a terminal). Env: LOG_LEVEL, LOG_FORMAT."""
    level = (level or os.environ.get("LOG_LEVEL") or "info").lower()
    fmt = (fmt or os.environ.get("LOG_FORMAT") or "auto").lower()
    out = stream or sys.stdout
    project = project or os.environ.get("GOOGLE_CLOUD_PROJECT")
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    shared: list[structlog.types.Processor] = [structlog.contextvars.merge_contextvars, _scrub]
    if fmt == "json":
        processors = [*shared, _timestamp, _cloud_fields(project), _json]
    else:
        processors = [
            *shared,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=out.isatty()),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=True,
    )
    # uvicorn and Google libraries use stdlib logging: keep their warnings, in the same stream.
    logging.basicConfig(level=logging.WARNING, stream=out, format="%(levelname)s %(name)s: %(message)s")
