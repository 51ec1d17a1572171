"""structlog set-up: Cloud Logging's structured JSON on a pipe, readable lines on a terminal.

Cloud Logging lifts `severity`, `time` and the `logging.googleapis.com/*` fields out of a
stdout JSON line into the LogEntry; the rest stays in `jsonPayload`. A decision is one line
(`message` "decision"), a lifecycle event one line named by its `message` (`skip-rate --log`
reads both back). `configure` may be called again: cached loggers follow (all but their
level), because the processor list is edited in place and every line goes through `_OUT`.

A line holds what its caller passed: the request's trace is a parameter of the lines that tell
of a request (`pubsub_filter.core.logs.trace_field`), never ambient context. The one thing read
from the context is OpenTelemetry's current span, so that a line joins its span in Cloud Trace.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TextIO, cast

import msgspec
import structlog
from opentelemetry.trace import get_current_span
from structlog.processors import format_exc_info

from pubsub_filter.core.engine.decision_line import RECORD, WholeRecord
from pubsub_filter.core.escaped import escaped
from pubsub_filter.core.times import format_time
from pubsub_filter.observability.stdlib_logs import route_stdlib

#: structlog's method names as Cloud Logging's severities
_SEVERITY = {m: m.upper() for m in ("debug", "info", "warning", "error", "critical")}
_SEVERITY.update(warn="WARNING", exception="ERROR")
TRACE_FIELD = "logging.googleapis.com/trace"
SPAN_FIELD = "logging.googleapis.com/spanId"
LABELS_FIELD = "logging.googleapis.com/labels"
COMPONENT = "pubsub-filter"
_FORBIDDEN = frozenset(("authorization", "token", "payload", "data", "body"))
_ENCODER = msgspec.json.Encoder(enc_hook=str)  # what JSON cannot encode, as its `str`


def _encoded(event: Mapping[str, Any]) -> str:
    """The line's JSON; text UTF-8 cannot write (a lone surrogate) escaped, never the line lost
    (nor the request that logged it failed)."""
    try:
        return _ENCODER.encode(event).decode()
    except UnicodeEncodeError:
        return _ENCODER.encode(escaped(event)).decode()


class _Output:
    """The one stream structlog's and the stdlib's lines go to; `configure` points it elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.stream.write(text)
            self.stream.flush()  # a pipe is block-buffered: Cloud Run must see each line now
        return len(text)

    def flush(self) -> None:
        pass


_OUT = _Output(sys.stdout)


def _scrub(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Never let a payload or a credential reach a log line, whoever logged it."""
    if not _FORBIDDEN.isdisjoint(event):
        for k in _FORBIDDEN:
            event.pop(k, None)
    return event


def _console_time(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A caller's numeric `time` (the decision time) as the readable timestamp, not a raw epoch."""
    if event.get("time").__class__ in (float, int):
        event["timestamp"] = time.strftime("%H:%M:%S", time.localtime(event.pop("time")))
    return event


class _CloudJson(WholeRecord):
    """The whole JSON chain in one processor (each is a call on every line). A decision line
    comes as its record (`WholeRecord`)."""

    def __init__(self, project: str | None, clock: Callable[[], float]) -> None:
        self.trace_prefix = f"projects/{project}/traces/" if project else ""
        self.clock = clock

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        if (rec := event.pop(RECORD, None)) is not None:
            event = {**rec.line_fields(), **event}
        event = _scrub(logger, method, event)
        span = get_current_span()
        if span.is_recording():
            # so that Cloud Logging joins the line to its span in Cloud Trace
            ctx = span.get_span_context()
            event.setdefault("span_id", format(ctx.span_id, "016x"))
            event.setdefault("trace", format(ctx.trace_id, "032x"))
        if "exc_info" in event:
            event = format_exc_info(logger, method, event)
        # a numeric `time` is the caller's (the decision time)
        t = event.get("time")
        event["time"] = format_time(t if t.__class__ in (float, int) else self.clock())
        event["severity"] = _SEVERITY.get(method, "DEFAULT")
        event["message"] = event.pop("event", "")
        if trace := event.pop("trace", None):
            event[TRACE_FIELD] = self.trace_prefix + str(trace)
        if span_id := event.pop("span_id", None):
            event[SPAN_FIELD] = str(span_id)
        if (route := event.get("route")) is not None:
            labels = {"component": COMPONENT, "route": str(route)}
            if (decision := event.get("decision")) is not None:
                labels["decision"] = str(decision)
            event[LABELS_FIELD] = labels
        return _encoded(event)


class _StdlibJson(logging.Formatter):
    """Stdlib records (uvicorn, Google libraries) as Cloud Logging JSON too."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "severity": record.levelname if record.levelname in _SEVERITY.values() else "DEFAULT",
            "message": record.getMessage(),
            "logger": record.name,
            "time": format_time(record.created),
            LABELS_FIELD: {"component": COMPONENT},
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return _encoded(event)


#: The processor list structlog holds: edited in place, so that cached loggers follow `configure`.
_PROCESSORS: list[structlog.types.Processor] = []


def configure(
    level: str | None = None,
    fmt: str | None = None,
    project: str | None = None,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.time,
    cache: bool = True,
    find_project: Callable[[], str | None] = lambda: None,
) -> None:
    """`fmt`: json | console | auto (console on a terminal); env LOG_LEVEL, LOG_FORMAT. `project`
    names traces `projects/PROJECT/traces/ID` (default: `find_project()`, asked only for JSON
    lines); `clock` stamps lines without a numeric `time`. `cache=False`: structlog caches no
    logger, so that a test can put the previous set-up back."""
    level = (level or os.environ.get("LOG_LEVEL") or "info").lower()
    fmt = (fmt or os.environ.get("LOG_FORMAT") or "auto").lower()
    if fmt not in ("json", "console", "auto"):
        raise ValueError(f"log format must be json, console or auto, not {fmt!r}")
    out = stream or sys.stdout
    tty = bool(getattr(out, "isatty", lambda: False)())
    if fmt == "auto":
        fmt = "console" if tty else "json"
    if fmt == "json":
        project = project or find_project()
        processors: list[structlog.types.Processor] = [_CloudJson(project, clock)]
    else:
        processors = [
            _scrub,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            _console_time,
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=tty),
        ]
    _OUT.stream = out
    _PROCESSORS[:] = processors
    structlog.configure(
        processors=_PROCESSORS,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(cast(TextIO, _OUT)),  # it only writes and flushes
        cache_logger_on_first_use=cache,
    )
    # uvicorn, Google libraries, warnings and dying threads: the same stream, the same format
    plain = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    route_stdlib(cast(TextIO, _OUT), _StdlibJson() if fmt == "json" else plain)
