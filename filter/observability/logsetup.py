"""structlog set-up: Cloud Logging's structured JSON on a pipe, readable lines on a terminal.

Cloud Run forwards stdout lines to Cloud Logging, which lifts `severity`, `time`,
`logging.googleapis.com/trace`, `logging.googleapis.com/spanId` and
`logging.googleapis.com/labels` out of the JSON into the LogEntry; the rest, `message`
included, stays in `jsonPayload`. One decision is one line (`message` "decision"); lifecycle
events are lines of the same shape whose `message` is the event name (`skip-rate --log`
reads them back: `filter.backends.records.log_lines`). `_scrub` keeps payloads and
credentials off every line. `configure` may be called again: it edits the processor list in
place and cached loggers write through `_OUT`, so they follow (all but their level).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import msgspec
import structlog
from opentelemetry.trace import get_current_span

from filter.core import decision_line
from filter.core.times import format_time

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
SPAN_FIELD = "logging.googleapis.com/spanId"
LABELS_FIELD = "logging.googleapis.com/labels"
COMPONENT = "pubsub-filter"
_FORBIDDEN = ("authorization", "token", "payload", "data", "body")
_PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "GCP_PROJECT", "CLOUDSDK_CORE_PROJECT")
_METADATA_PROJECT = "http://metadata.google.internal/computeMetadata/v1/project/project-id"


# --- output -------------------------------------------------------------------------


class _Output:
    """The one stream every logger writes to; `configure` points it somewhere else."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()  # a pipe is block-buffered: Cloud Run must see each line now


_OUT = _Output(sys.stdout)


class _LineLogger:
    """What structlog wraps: every level writes the rendered line to `_OUT`."""

    def msg(self, message: str) -> None:
        _OUT.line(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


_LINE_LOGGER = _LineLogger()


def _line_logger(*_: Any) -> _LineLogger:
    return _LINE_LOGGER


class _StdlibStream:
    """A file-like view of `_OUT` for the stdlib handler (uvicorn, Google libraries)."""

    def write(self, text: str) -> int:
        _OUT.line(text.rstrip("\n"))
        return len(text)

    def flush(self) -> None:
        pass


# --- processors -------------------------------------------------------------------


def _scrub(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Never let a payload or a credential reach a log line, whoever logged it."""
    for k in _FORBIDDEN:
        if k in event:
            del event[k]
    return event


def _timestamp(clock: Callable[[], float]) -> structlog.types.Processor:
    """`time` in RFC 3339 UTC with microseconds, rounded as everywhere else (`format_time`): a
    numeric `time` given by the caller (the decision time), else `clock()`."""

    def processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        t = event.get("time")
        if t is None or t.__class__ not in (float, int):
            t = clock()
        event["time"] = format_time(t)
        return event

    return processor


def _console_time(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """On a terminal a caller's numeric `time` (the decision time) is the line's readable
    timestamp; left as a field, it would print as a raw epoch beside it."""
    t = event.get("time")
    if t.__class__ in (float, int):
        event["timestamp"] = time.strftime("%H:%M:%S", time.localtime(event.pop("time")))
    return event


def _span_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A line written inside a recorded span names it (and its trace, when the surface named
    none), so Cloud Logging joins the line to the span in Cloud Trace."""
    span = get_current_span()
    if span.is_recording():
        ctx = span.get_span_context()
        event.setdefault("span_id", format(ctx.span_id, "016x"))
        event.setdefault("trace", format(ctx.trace_id, "032x"))
    return event


def _cloud_fields(project: str | None) -> structlog.types.Processor:
    trace_prefix = f"projects/{project}/traces/" if project else ""

    def processor(_: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event["severity"] = _SEVERITY.get(method, "DEFAULT")
        event["message"] = event.pop("event", "")
        trace = event.pop("trace", None)
        if trace:
            event[TRACE_FIELD] = trace_prefix + str(trace)
        span = event.pop("span_id", None)
        if span:
            event[SPAN_FIELD] = str(span)
        route = event.get("route")
        if route is not None:
            labels = {"component": COMPONENT, "route": str(route)}
            decision = event.get("decision")
            if decision is not None:
                labels["decision"] = str(decision)
            event[LABELS_FIELD] = labels
        return event

    return processor


def _json(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    return msgspec.json.encode(event, enc_hook=str).decode()


_LEVEL_NUMBERS = {name: getattr(logging, name.upper(), logging.ERROR) for name in _SEVERITY}
_LEVEL_NUMBERS["warn"] = logging.WARNING


def log_line(logger: Any, method: str, event: str, fields: dict[str, Any]) -> None:
    """`getattr(logger, method)(event, **fields)`: the same line, rendered in one pass when it can be.

    Every message logs a decision line, and structlog's dispatch (bind, the bound method,
    the event dict copied and updated, then a call per processor) cost more than the line
    itself. When structlog is configured with our JSON chain into `_OUT` (read through its
    public `get_config`) and the logger has no bound context, the chain's own processors
    run here directly on `fields` (which this call owns) and the line is written once:
    the same processors, in the same order, on the same dict, so the same bytes. Anything
    else (console format, a test's capture, a bound context) goes through structlog.
    """
    bound = logger.bind()
    config = structlog.get_config()
    if (
        config["processors"] is not _PROCESSORS
        or config["logger_factory"] is not _line_logger
        or not _PROCESSORS
        or _PROCESSORS[-1] is not _json
        or structlog.get_context(bound)
        or "event" in fields  # structlog would refuse it (two values for `event`): let it
    ):
        getattr(bound, method)(event, **fields)
        return
    if not bound.is_enabled_for(_LEVEL_NUMBERS[method]):
        return
    fields["event"] = event
    rendered: Any = fields
    for proc in _PROCESSORS:
        if proc is structlog.processors.format_exc_info and "exc_info" not in rendered:
            continue  # a no-op without `exc_info`, and the most expensive one to call
        rendered = proc(_LINE_LOGGER, method, rendered)
    _OUT.line(rendered)


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
        return msgspec.json.encode(event, enc_hook=str).decode()


# --- configuration ------------------------------------------------------------------

#: The processor list structlog holds; edited in place so cached loggers follow `configure`.
_PROCESSORS: list[structlog.types.Processor] = []
_STDLIB_HANDLER: logging.Handler | None = None


def detect_project() -> str | None:
    """The project for trace names: the usual env vars, else (on Cloud Run, which sets
    none of them) the metadata server, asked once with a short timeout."""
    for name in _PROJECT_ENVS:
        if os.environ.get(name):
            return os.environ[name]
    if os.environ.get("K_SERVICE"):
        req = urllib.request.Request(_METADATA_PROJECT, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(req, timeout=1.0) as resp:
                return resp.read().decode().strip() or None
        except OSError:
            return None
    return None


def configure(
    level: str | None = None,
    fmt: str | None = None,
    project: str | None = None,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.time,
    cache: bool = True,
) -> None:
    """`fmt`: json | console | auto (console on a terminal). Env: LOG_LEVEL, LOG_FORMAT.

    `project` names traces `projects/PROJECT/traces/ID` (default: `detect_project()`);
    `clock` stamps lines that carry no numeric `time` of their own. `cache=False` keeps
    structlog from caching loggers, so that a test can put the previous set-up back.
    """
    global _STDLIB_HANDLER
    level = (level or os.environ.get("LOG_LEVEL") or "info").lower()
    fmt = (fmt or os.environ.get("LOG_FORMAT") or "auto").lower()
    if fmt not in ("json", "console", "auto"):
        raise ValueError(f"log format must be json, console or auto, not {fmt!r}")
    out = stream or sys.stdout
    if fmt == "auto":
        isatty = getattr(out, "isatty", None)
        fmt = "console" if isatty is not None and isatty() else "json"
    if fmt == "json":
        project = project or detect_project()
        processors: list[structlog.types.Processor] = [
            structlog.contextvars.merge_contextvars,
            _scrub,
            _span_ids,
            structlog.processors.format_exc_info,
            _timestamp(clock),
            _cloud_fields(project),
            _json,
        ]
    else:
        colors = bool(getattr(out, "isatty", lambda: False)())
        processors = [
            structlog.contextvars.merge_contextvars,
            _scrub,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            _console_time,
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=colors),
        ]
    _OUT.stream = out
    _PROCESSORS[:] = processors
    structlog.configure(
        processors=_PROCESSORS,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_line_logger,
        cache_logger_on_first_use=cache,
    )
    decision_line.install(log_line)  # the engine's decision line, rendered in one pass
    # uvicorn and Google libraries use stdlib logging: keep their warnings, in the same stream and format.
    root = logging.getLogger()
    if _STDLIB_HANDLER is None and not root.handlers:
        _STDLIB_HANDLER = logging.StreamHandler(_StdlibStream())
        root.addHandler(_STDLIB_HANDLER)
        root.setLevel(logging.WARNING)
    if _STDLIB_HANDLER is not None:
        _STDLIB_HANDLER.setFormatter(
            _StdlibJson() if fmt == "json" else logging.Formatter("%(levelname)s %(name)s: %(message)s")
        )
    # google-api-core cuts the "google" logger off from the root (propagate=False) unless it
    # was configured first, and Python then prints its records as bare text (logging's
    # last resort): the client library's "Background thread did not exit." at shutdown.
    # A level of its own counts as configured, so it keeps propagating to our JSON handler.
    google = logging.getLogger("google")
    if google.level == logging.NOTSET:
        google.setLevel(logging.WARNING)
    google.propagate = True
    # What else writes text: an exception that ends a thread (the Pub/Sub client's stream
    # and dispatcher threads at shutdown) and warnings. Both go through logging instead.
    logging.captureWarnings(True)
    threading.excepthook = _thread_died


def _thread_died(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "unknown"
    logging.getLogger("pubsub_filter.threads").error(
        "thread %s ended with an uncaught exception", name, exc_info=args.exc_value
    )
