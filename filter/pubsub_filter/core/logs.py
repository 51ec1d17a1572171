"""The library's loggers: structlog's API, logged through the standard `logging` machinery
unless the application set structlog up.

A library configures no logging and writes nothing to stdout or stderr by itself. Every
logger of the filter's is `get_logger("pubsub_filter.<part>")`, which logs:

- through the application's structlog set-up once there is one (`structlog.is_configured()`):
  that is how the `pubsub-filter` commands (`pubsub_filter.observability.logsetup.configure`)
  write their JSON or console lines, exactly as they always did;
- otherwise through `logging.getLogger("pubsub_filter.<part>")`: silent until the
  application configures logging (`pubsub_filter` has a `NullHandler`, so not even
  Python's last resort prints its warnings). The record's
  message is `event key=value ...`; the fields are also in `record.pubsub_filter`.

Neither way lets a payload or a credential into a line (the keys in `FORBIDDEN`).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

# A library stays silent until the application configures logging: without a handler of its own,
# Python's last resort would print the library's warnings to stderr. Set here, where every
# module that logs gets its logger (the modules' own `logging.getLogger(__name__)` are under it too).
logging.getLogger("pubsub_filter").addHandler(logging.NullHandler())

#: Keys dropped from every line, whoever logged them: payloads and credentials.
FORBIDDEN = ("authorization", "token", "payload", "data", "body")


def _to_stdlib(_: Any, __: str, event: MutableMapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The event as one stdlib record: a readable message, the fields kept beside it."""
    exc_info = event.pop("exc_info", None)
    text = str(event.pop("event", ""))
    for key in FORBIDDEN:
        event.pop(key, None)
    if event:
        text = " ".join([text, *(f"{k}={v}" for k, v in event.items())])
    kwargs: dict[str, Any] = {"extra": {"pubsub_filter": dict(event)}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (text,), kwargs


class Logger:
    """A structlog logger that picks its way on each call: the application's structlog set-up
    if there is one, else the standard library's logger of the same name."""

    __slots__ = ("_stdlib", "_structlog")

    def __init__(self, name: str):
        self._structlog = structlog.get_logger(name)
        self._stdlib = structlog.wrap_logger(
            logging.getLogger(name),
            processors=[structlog.stdlib.filter_by_level, _to_stdlib],
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=True,
        )

    def _target(self) -> Any:
        return self._structlog if structlog.is_configured() else self._stdlib

    def bind(self, **values: Any) -> Any:
        return self._target().bind(**values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


def trace_field(trace: str | None) -> dict[str, str]:
    """The request's trace as a line's field (`trace=...`), none without one: a line about a
    decision (a lease taken over, a heartbeat that failed) gets its trace passed, as its
    decision line does, never from ambient context."""
    return {"trace": trace} if trace else {}


def get_logger(name: str) -> Any:
    """The logger for `name` (a `pubsub_filter.` name); see the module's doc for where it writes."""
    return Logger(name)
