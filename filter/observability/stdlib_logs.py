"""What writes text outside structlog, routed into the filter's one log stream: stdlib
logging (uvicorn, the Google client libraries), warnings, and exceptions that end a thread.

`filter.observability.logsetup.configure` calls `route_stdlib` with its stream and the format of
its lines, so every line a process writes is in one format (Cloud Logging JSON on a pipe).
"""

from __future__ import annotations

import logging
import threading
from typing import TextIO

_HANDLER: logging.Handler | None = None


def route_stdlib(stream: TextIO, formatter: logging.Formatter) -> None:
    """Stdlib records of WARNING and above, warnings and uncaught thread exceptions to `stream`,
    formatted by `formatter`. Called again, it changes the format (a root logger that has
    handlers of its own, a test's or an embedding program's, is left as it is)."""
    global _HANDLER
    root = logging.getLogger()
    if _HANDLER is None and not root.handlers:
        _HANDLER = logging.StreamHandler(stream)
        root.addHandler(_HANDLER)
        root.setLevel(logging.WARNING)
    if _HANDLER is not None:
        _HANDLER.setFormatter(formatter)
    # google-api-core cuts the "google" logger off from the root (propagate=False) unless it
    # was configured first, and Python then prints its records as bare text (logging's
    # last resort): the client library's "Background thread did not exit." at shutdown.
    # A level of its own counts as configured, so it keeps propagating to our handler.
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
