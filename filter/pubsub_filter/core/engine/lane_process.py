"""Large messages decided in a process of their own (`serve`, `pull`): the lane that frees the
event loop's process of their CPU work altogether.

A thread (`offload.ThreadLane`) keeps a large decision off the event loop, but not off the
loop's interpreter: both threads share one GIL, and during a burst of 68,000-row pushes the
lane's thread ran 56-82 % of a core, so the loop waited for the GIL on every ready socket and
`/healthz` took 64-139 ms at its worst on a quiet machine (and 170-261 ms inside CI), whatever
the switch interval. Here the same steps run in a child process: the loop's process keeps its
GIL, and sharing the CPUs is the kernel's scheduler's, which wakes a waiting loop at once.

What crosses (`lane_frames`): the message once (its bytes, copied once), and small answers
back: the fingerprints, key and bypass of `Extracted`, and a `Decided` without what the child
keeps (the decoded payload, `Decided.read` and `Decided.kept`; a forward's data when it is the
message's own). The route caches a large decision reads live in the child, which compiles the
routes itself: a message's decision is a function of the stored bytes, wherever it runs.

The child is started at the first large message (not every process gets one), by this
interpreter (`sys.executable -m pubsub_filter.core.engine.lane_worker`), and stopped at
`close`. If it ends mid-step (killed: out of memory), that step raises `LaneLost`, so the
message is answered `failed` and redelivered, and the next step starts a new child. If no child
can be started at all (the interpreter cannot be run), one `large_message_process_unavailable`
line says so and large messages are decided on a thread (`offload.ThreadLane`) from then on. The pipe is
driven from one thread of this process, so the loop never waits on it, and one step runs at a
time, as on the thread lane."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import socket
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from pubsub_filter.core.compare.keyless import Keyless
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.engine import lane_frames
from pubsub_filter.core.engine.judge import Decided
from pubsub_filter.core.engine.offload import Extracted, LaneLost, ThreadLane
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.model import KeyState, Message

log = get_logger("pubsub_filter.engine")

#: Where this process imports `pubsub_filter` from (this file is pubsub_filter/core/engine/...):
#: the child imports the same copy.
_SOURCE = str(Path(__file__).resolve().parents[3])


class _CannotStart(Exception):
    """The interpreter to start the child with cannot be run (`ProcessLane` falls back to a thread)."""


class _Child:
    """One started large-message process and this side's end of its socket."""

    def __init__(self, routes: Sequence[Route], python: str) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE, env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "pubsub_filter.core.engine.lane_worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except OSError as exc:
            ours.close()
            raise _CannotStart(f"cannot start {python}: {exc.strerror or exc}") from exc
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        lane_frames.send(ours, list(routes))

    def exchange(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        lane_frames.send(self.sock, request)
        return lane_frames.receive(self.sock)  # type: ignore[no-any-return]

    def stop(self) -> int:
        """Close the socket, end the process (a step it is in the middle of is nobody's now), and
        wait for it: its exit status."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()


class ProcessLane:
    """The lane in a child process (the module's docstring says why), and the slot."""

    def __init__(self, routes: Sequence[Route], python: str | None = None) -> None:
        self.slot = asyncio.Semaphore(1)
        self._routes = tuple(routes)
        self._python = python or sys.executable
        self._pipe: ThreadPoolExecutor | None = None
        self._child: _Child | None = None  # touched on the pipe's thread only
        self._tickets = itertools.count()
        self.closed = False
        #: Where large messages go once no child can be started (an interpreter that cannot be
        #: run, as an embedding program's may be): a thread, as the in-process API's, rather
        #: than every large message failing
        self.fallback: ThreadLane | None = None

    def ticket(self) -> int:
        return next(self._tickets)

    async def extract(self, rules: RouteRules, msg: Message, ticket: int) -> Extracted:
        if self.fallback is None:
            try:
                x: Extracted = await self._call(("extract", ticket, rules.route.name, msg))
                return x
            except _CannotStart as exc:
                log.warning("large_message_process_unavailable", reason=str(exc), instead="a thread")
                self.fallback = ThreadLane()
        return await self.fallback.extract(rules, msg, ticket)

    async def decide(
        self, x: Extracted, msg: Message, state: KeyState | None, now: float, bypass: bool, rng: random.Random
    ) -> Decided:
        if self.fallback is not None:
            return await self.fallback.decide(x, msg, state, now, bypass, rng)
        decided, own = await self._call(("decide", x.ticket, x.fp, state, now, bypass, rng.getrandbits(64)))
        if own:  # a forward of the message's own data: not sent back
            decided = msgspec.structs.replace(decided, out=msgspec.structs.replace(decided.out, data=msg.data))
        return decided  # type: ignore[no-any-return]

    async def keyless(self, x: Extracted, msg: Message) -> Keyless:
        if self.fallback is not None:
            return await self.fallback.keyless(x, msg)
        k: Keyless = await self._call(("keyless", x.ticket))
        return k

    def remember(self, x: Extracted, decided: Decided) -> None:
        if self.fallback is None:
            self._post(("remember", x.ticket))

    def forget(self, ticket: int) -> None:
        if self.fallback is not None:
            self.fallback.forget(ticket)
        self._post(("forget", ticket))  # after the extract: one thread drives the pipe, in order

    async def holding(self) -> int:
        if self.fallback is not None:
            return await self.fallback.holding()
        held: int | None = await self._call(("holding",), start=False)
        return held or 0  # None: no child runs, so none holds anything

    @property
    def pid(self) -> int | None:
        """The large-message process's, while it runs (it starts at the first large message)."""
        child = self._child
        return child.proc.pid if child is not None else None

    async def _call(self, request: tuple[Any, ...], start: bool = True) -> Any:
        if self.closed:
            raise LaneLost("the large-message process is stopped: the engine is closing")
        if self._pipe is None:
            self._pipe = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pubsub-filter-large")
        status, value = await asyncio.get_running_loop().run_in_executor(self._pipe, self._exchange, request, start)
        if status == "raised":
            raise value
        return value

    def _post(self, request: tuple[Any, ...]) -> None:
        """A step nobody waits for (to the child there is, if any): nothing to start one for."""
        if self._pipe is not None and not self.closed:
            self._pipe.submit(self._exchange, request, False)

    def _exchange(self, request: tuple[Any, ...], start: bool) -> tuple[str, Any]:
        """One request and its answer, on the pipe's thread."""
        child = self._child
        if child is None:
            if not start:
                return "ok", None
            child = self._child = _Child(self._routes, self._python)
        try:
            return child.exchange(request)
        except (EOFError, OSError) as exc:
            self._child = None
            status = child.stop()
            how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
            raise LaneLost(f"the large-message process ended during a step ({how})") from exc

    def close(self) -> None:
        """Stop the child (a step it runs is nobody's now) and the pipe's thread."""
        self.closed = True
        if self.fallback is not None:
            self.fallback.close()
        child = self._child
        if child is not None:
            child.proc.kill()  # a step under way is nobody's now: it need not end first
        if self._pipe is not None:
            self._pipe.submit(self._stop_child)
            self._pipe.shutdown(wait=False, cancel_futures=False)
            self._pipe = None

    def _stop_child(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None
