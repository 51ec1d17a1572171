"""What writes text outside structlog, routed into the filter's one log stream and format
(`logsetup.configure` calls `route_stdlib`): stdlib logging (uvicorn, the Google client
libraries), warnings, and exceptions that end a thread."""

from __future__ import annotations

import logging
import threading
from typing import TextIO

_HANDLER: logging.Handler | None = None


def route_stdlib(stream: TextIO, formatter: logging.Formatter) -> None:
    """Records of WARNING and above, warnings and uncaught thread exceptions to `stream`. Called
    again, it changes the format; a root logger with handlers of its own (a test's, an embedding
    program's) is left as it is."""
    global _HANDLER
    root = logging.getLogger()
    if _HANDLER is None and not root.handlers:
        _HANDLER = logging.StreamHandler(stream)
        root.addHandler(_HANDLER)
        root.setLevel(logging.WARNING)
    if _HANDLER is not None:
        _HANDLER.setFormatter(formatter)
    # google-api-core cuts the "google" logger off from the root (propagate=False) unless it was
    # configured first, and its records (the client's "Background thread did not exit." at
    # shutdown) then print as bare text: a level of its own counts as configured.
    google = logging.getLogger("google")
    if google.level == logging.NOTSET:
        google.setLevel(logging.WARNING)
    google.propagate = True
    logging.captureWarnings(True)
    threading.excepthook = _thread_died  # the Pub/Sub client's threads at shutdown


def _thread_died(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "unknown"
    logging.getLogger("pubsub_filter.threads").error(
        "thread %s ended with an uncaught exception", name, exc_info=args.exc_value
    )
