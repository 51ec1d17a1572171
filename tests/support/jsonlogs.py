"""The app's logs as production writes them (JSON lines, level info), kept for a test to check.

    with production_logs() as logs:
        ...
    assert not logs.tracebacks

The set-up before is put back after, so the other tests' log capture is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgspec
import structlog

from pubsub_filter.observability import logsetup, stdlib_logs


class JsonLines:
    """A log stream: every line must be one JSON object; lines with a traceback are kept apart."""

    def __init__(self) -> None:
        self.lines = 0
        self.bad: list[str] = []
        self.tracebacks: list[str] = []

    def write(self, text: str) -> int:
        for line in text.split("\n"):
            if not line:
                continue
            self.lines += 1
            try:
                event: Any = msgspec.json.decode(line)
            except msgspec.DecodeError:
                self.bad.append(line[:300])
                continue
            if not isinstance(event, dict):
                self.bad.append(line[:300])
            elif "exception" in event or "exc_info" in event or "Traceback (most recent call last)" in line:
                self.tracebacks.append(line[:2000])
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def logs_into(stream: Any, level: str = "info", fmt: str = "json", reset: bool = False) -> Iterator[None]:
    """`logsetup` configured as the CLI configures it, writing into `stream`; the structlog set-up,
    the stream and the stdlib formatter before are put back after. `reset`: from structlog's
    defaults (loggers logsetup cached stay cached: they write through `_OUT` and `_PROCESSORS`)."""
    saved, before, processors = structlog.get_config(), logsetup._OUT.stream, list(logsetup._PROCESSORS)
    handler = stdlib_logs._HANDLER
    formatter = handler.formatter if handler is not None else None
    if reset:
        structlog.reset_defaults()
    logsetup.configure(level=level, fmt=fmt, project="p", stream=stream, cache=False)
    try:
        yield
    finally:
        logsetup._PROCESSORS[:] = processors
        structlog.configure(**saved)
        logsetup._OUT.stream = before
        if handler is not None:
            handler.setFormatter(formatter)


@contextlib.contextmanager
def production_logs(level: str = "info") -> Iterator[JsonLines]:
    sink = JsonLines()
    with logs_into(sink, level):
        yield sink
