"""How the engine writes its decision line: through structlog, as every other line.

`install` swaps the writer (a test's capture); the core imports nothing from the layers
above it, so the engine knows only this hook.

The config's `decision_logs` may quiet the lines of some decisions (`quiet`): log them at a
lower level, or only a share of them at their level and the rest at debug. Only the line is
quieted: the decision is recorded and counted before its line is written, whatever the line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

#: (logger, level method, event, fields) → None. `fields` belongs to the call: a writer may change it.
LineWriter = Callable[[Any, str, str, dict[str, Any]], None]


class Quieting(NamedTuple):
    """How one decision's lines are logged: at `level` (None: the decision's own level) for the
    share `sample` of its messages (by message id), at debug for the others."""

    level: str | None = None
    sample: float = 1.0


def dispatch(logger: Any, method: str, event: str, fields: dict[str, Any]) -> None:
    getattr(logger, method)(event, **fields)


_writer: LineWriter = dispatch
_quieted: Mapping[str, Quieting] = {}

#: What the engine calls: the writer itself, or the writer behind `_quietly` when a decision is quieted.
write: LineWriter = dispatch


def install(writer: LineWriter | None) -> None:
    """Use `writer` for every decision line from now on (None: structlog's dispatch again)."""
    global _writer
    _writer = writer or dispatch
    _rewire()


def quiet(decisions: Mapping[str, Quieting]) -> None:
    """Quiet the lines of these decisions (by name) from now on; `{}`: every line at its own level."""
    global _quieted
    _quieted = {name: q for name, q in decisions.items() if q != Quieting()}
    _rewire()


def _rewire() -> None:
    # Nothing quieted (the default) costs nothing: the engine calls the writer directly.
    global write
    write = _quietly if _quieted else _writer


def _quietly(logger: Any, method: str, event: str, fields: dict[str, Any]) -> None:
    q = _quieted.get(fields.get("decision", ""))
    _writer(logger, level_of(q, method, str(fields.get("message_id", ""))) if q else method, event, fields)


def level_of(q: Quieting, level: str, message_id: str) -> str:
    """The level one line is logged at: the decision's own (`level`) unless `q` lowers it, and
    debug when the message falls outside the sample. The sample is drawn from the message id,
    so every delivery of one message (a redelivery, a replay) is logged alike, on every instance."""
    if q.sample < 1.0 and not in_sample(message_id, q.sample):
        return "debug"
    return q.level or level


def in_sample(message_id: str, share: float) -> bool:
    """Whether `message_id` falls in the first `share` of the id space (a stable hash: the
    same answer in every process, unlike `hash()`)."""
    digest = hashlib.blake2b(message_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < share * 2**64
