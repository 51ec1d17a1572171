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

from filter.observability import logsetup


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
def production_logs(level: str = "info") -> Iterator[JsonLines]:
    saved, stream, processors = structlog.get_config(), logsetup._OUT.stream, list(logsetup._PROCESSORS)
    handler = logsetup._STDLIB_HANDLER
    formatter = handler.formatter if handler is not None else None
    sink = JsonLines()
    logsetup.configure(level=level, fmt="json", project="p", stream=sink, cache=False)  # type: ignore[arg-type]
    try:
        yield sink
    finally:
        logsetup._PROCESSORS[:] = processors
        structlog.configure(**saved)
        logsetup._OUT.stream = stream
        if handler is not None:
            handler.setFormatter(formatter)
