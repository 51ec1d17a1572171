"""How the engine writes its decision line: one line per message, so its cost matters.

By default, structlog's own dispatch. `observability.logsetup.configure` installs a writer
that renders the very same bytes in one pass; the engine only knows this hook, because the
core imports nothing from the layers above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: (logger, level method, event, fields) → None. `fields` belongs to the call: a writer may change it.
LineWriter = Callable[[Any, str, str, dict[str, Any]], None]


def dispatch(logger: Any, method: str, event: str, fields: dict[str, Any]) -> None:
    getattr(logger, method)(event, **fields)


write: LineWriter = dispatch


def install(writer: LineWriter | None) -> None:
    """Use `writer` for every decision line from now on (None: structlog's dispatch again)."""
    global write
    write = writer or dispatch
