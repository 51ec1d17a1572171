"""The large-message process's side (`lane_process.ProcessLane` starts it): it compiles the
engine's routes once, then runs each step it is sent (extract, decide, keyless, remember,
forget) and sends its answer back, until the engine closes the socket.

What a message's steps keep between them (`offload.Held`: the decoded payload, its rows) stays
here, so it is decoded once and never crosses back. So do the route caches a large message's
decisions read and fill (`RouteRules`): the next large decision of the route reads them here.

    python -m pubsub_filter.core.engine.lane_worker FD

FD: this process's end of the socket pair. The process never prints nor logs, and ignores
SIGINT and SIGTERM (the engine's process decides when it stops, by closing the socket, or
kills it); it ends when the socket closes, or when the engine's process is gone (its end
closes with it)."""

from __future__ import annotations

import gc
import pickle
import random
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from pubsub_filter.core.compare.keyless import keyless
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.engine import lane_frames
from pubsub_filter.core.engine.offload import Extracted, Held, decide_step, extract_step, uncollected
from pubsub_filter.core.model import KeyState, Message

#: What the engine may ask for.
_STEPS = frozenset({"extract", "decide", "keyless", "remember", "forget", "holding"})


class Steps:
    """The steps, on this process's own compiled routes and what each message's steps keep."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.rules = {r.name: RouteRules(r) for r in routes}
        self.held: dict[int, Held] = {}

    def answer(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        """("ok", value) or ("raised", the exception, which pickles)."""
        op, *args = request
        try:
            if op not in _STEPS:
                raise LookupError(f"no step {op!r}")
            return "ok", uncollected(getattr(self, op), *args)
        except Exception as exc:
            return "raised", _portable(exc)

    def extract(self, ticket: int, route: str, msg: Message) -> Extracted:
        x, self.held[ticket] = extract_step(self.rules[route], msg, ticket)
        return x

    def decide(
        self, ticket: int, fp: str, state: KeyState | None, now: float, bypass: bool, seed: int
    ) -> tuple[Any, bool]:
        """The decision, less what stays here (`kept`, `read`), and whether what a forward sends is
        the message's own data (then not sent back: the engine holds it)."""
        held = self._held(ticket)
        decided = decide_step(held, fp, state, now, bypass, random.Random(seed))
        held.rules.keep_read(decided.read)
        held.kept = decided.kept
        own = decided.out.data is held.msg.data
        out = msgspec.structs.replace(decided.out, data=b"") if own else decided.out
        return msgspec.structs.replace(decided, out=out, kept=None, read=None), own

    def keyless(self, ticket: int) -> Any:
        held = self._held(ticket)
        assert held.missing is not None
        return keyless(held.rules, held.msg.data, held.missing)

    def remember(self, ticket: int) -> None:
        held = self.held.get(ticket)
        if held is not None:
            held.rules.remember(held.kept)

    def forget(self, ticket: int) -> None:
        self.held.pop(ticket, None)

    def holding(self) -> int:
        return len(self.held)

    def _held(self, ticket: int) -> Held:
        held = self.held.get(ticket)
        if held is None:
            # the process was started again between the message's steps (the last one ended)
            raise LookupError("the large-message process was restarted during this message's decision")
        return held


def _portable(exc: Exception) -> Exception:
    """`exc` if it pickles and comes back, else a `RuntimeError` that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def main(argv: Sequence[str]) -> int:
    # Ctrl-C in a terminal, or a stop sent to the whole process group (systemd, a supervisor),
    # reaches this process too: the engine's process acts on it and closes this socket once its
    # decisions are done; this one keeps answering until then (a step cut short fails its message)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[0]))
    try:
        steps = Steps(lane_frames.receive(sock))
        gc.freeze()  # the modules and compiled routes live as long as the process: never walked again
        while True:
            lane_frames.send(sock, steps.answer(lane_frames.receive(sock)))
    except (EOFError, OSError):
        return 0  # the engine closed its end, or its process is gone
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
