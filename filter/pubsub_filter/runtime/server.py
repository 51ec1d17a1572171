"""uvicorn's server as the filter runs it: whose signals SIGTERM and SIGINT are, and how a
SIGTERM ends the process. One class for the push endpoint and the pull worker's probes."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn

from pubsub_filter.core.engine.stopping import Stop
from pubsub_filter.runtime import backstop as backstops


class Server(uvicorn.Server):
    """uvicorn's server, with the filter's handling of SIGTERM and SIGINT.

    uvicorn has no public hook for either thing the filter needs: its `capture_signals` sends
    SIGINT and SIGTERM to `handle_exit` and, once drained, raises each caught signal again so
    the process dies of it. So this overrides `capture_signals` (a method uvicorn does not
    document; tests/unit/test_serve_config.py holds it to what is said here):

    - `budget` given (the push endpoint, which owns the process): the same signals go through
      the public `handle_exit` and drain as uvicorn does; the first begins the stop (`stop`: its
      one budget counted from there) and arms `backstop`, which ends the process once it has
      passed. Only the signals other than SIGTERM are raised again: a SIGTERM is how Cloud Run
      stops every instance, not a failure, so the process exits 0; Ctrl-C still ends as one.
    - `budget=None` (the pull worker's probes, inside the worker's loop): no handler at all;
      the caller owns the signals and stops the server with `should_exit`.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        budget: float | None,
        backstop: Callable[[Stop], object] = backstops.arm,
        on_stop: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(config)
        self.budget = budget
        self.backstop = backstop
        self.on_stop = on_stop  # run on the loop as the stop begins (the engine decides what it holds)
        self.stop: Stop | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # signals reach the main thread only
        if self.budget is None or threading.current_thread() is not threading.main_thread():
            yield
            return
        budget = self.budget
        caught: list[int] = []

        def handle(sig: int, frame: FrameType | None) -> None:
            caught.append(sig)
            if self.stop is None:
                self.stop = Stop.begin(budget)
                self.backstop(self.stop)
                if self.on_stop is not None:
                    with contextlib.suppress(RuntimeError):  # no loop running: nothing is held
                        asyncio.get_running_loop().call_soon_threadsafe(self.on_stop)
            self.handle_exit(sig, frame)

        original = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        for again in reversed(caught):
            if again != signal.SIGTERM:
                signal.raise_signal(again)
