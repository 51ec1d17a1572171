"""Large messages decided off the event loop, one at a time (`Engine.handle`).

Decoding and fingerprinting a large payload, and digesting its rows on a forward, is pure CPU:
about a second for 68,000 rows of 8 MB. On the event loop that second is a second in which
no other request is answered, no health probe, no other body read (whose `server.body_timeout`
then fires on the server's own delay). So a message whose data is at least `OFF_LOOP_BYTES`
runs those steps on a lane (`Lane`): `extract_step` (decode, fingerprint, key, bypass) and
`decide_step` (`judge.decide`), the payload they decode kept where they ran (`Held`) under the
message's ticket, and only small values crossing back to the loop (`Extracted`, `Decided`).

Two lanes. `serve` and `pull` decide in a process of their own
(`pubsub_filter.core.engine.lane_process`): a thread of the server's process still shares its
GIL with the loop, and during a burst of 68,000-row pushes that alone kept `/healthz` at 64-139
ms (below). The in-process API decides on a thread (`ThreadLane`): it runs inside a user's
program, which should not find a process of ours beside it. The rest of this docstring is the
thread lane's.

Why one thread does: the work is Python-level loops over rows, which CPython interrupts every
`sys.getswitchinterval()` (5 ms) to let the loop's thread take the GIL. A single C call does not
give it back: msgspec's decode of a whole 8 MB document was one of 43 ms, so a large document is
decoded in pieces (`pubsub_filter.core.compare.piecewise`); the longest calls left are the canonical text's
encode and the row state's (10-35 ms for 68,000 rows), under the 100 ms a callback may hold
the loop (`tests/support/loopwatch.py`). More worker threads would
not decide faster (they share the GIL) and would hand the loop the GIL less often.

Why the garbage collector is off while a step runs: a collection is one C call that walks
every container alive, and a step makes hundreds of thousands (a dict per row, its digests),
so a full collection inside one held the GIL, and the loop, for 110-140 ms. What a step makes
holds no reference cycle (decoded JSON, digests), so nothing waits for a collection to be
freed; the collector runs again as the step ends.

Why the interpreter switches threads more often while a step runs: the loop's thread gives the
GIL up on every wait for the network and must take it back for each socket that is ready. A
thread that wants the GIL back from a busy one waits `sys.getswitchinterval()` (5 ms) for it,
so with 16 bodies arriving the loop waited 5 ms a socket, every turn, and `/healthz` took
515-545 ms during a burst of 68,000-row pushes though no single call held the loop or the GIL
for more than 50 ms (measured from a thread inside the process). At `STEP_SWITCH_INTERVAL`
(0.5 ms) the same bursts answered `/healthz` within 64-139 ms on a quiet machine. The
interval is the interpreter's, so a step sets it and puts back what it found when it ends,
as it does with the collector: between large messages everything runs as before.

Why one at a time (`Lane.slot`, held for the whole decision of such a message): a decoded
payload and its row digests are many times its bytes (+190 MiB for 68,000 rows), so two
decoded at once is twice the peak. Held one after another, a burst costs its bodies while they
wait, and one decision's peak. How many may wait is the push endpoint's bound on bytes in
flight (`server.max_bytes_in_flight`). The in-process API's caller does its own work in place of
the publish (`Engine.handle(via=...)`), for as long as it takes: its decisions use the lane's
thread but not the slot, so one caller's long work never holds back another's.

Below `OFF_LOOP_BYTES` nothing changes: a small message is decided on the loop, as before,
for the one comparison of its length."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import itertools
import random
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pubsub_filter.core.compare.canonical import MissingField
from pubsub_filter.core.compare.fingerprint import TypedRows
from pubsub_filter.core.compare.keyless import Keyless, keyless
from pubsub_filter.core.compare.routes import Kept, RouteRules
from pubsub_filter.core.engine.judge import Decided, decide
from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.model import KeyState, Message

T = TypeVar("T")

#: Data from this size on is decided on the lane. 256 KiB of rows of ~120 bytes (2,000 rows) take
#: about 30 ms to decide on the loop; the thread's hand-over costs about 0.1 ms a step.
OFF_LOOP_BYTES = 256 * 1024
#: The interpreter's thread switch interval while a step runs (the module's docstring says why).
STEP_SWITCH_INTERVAL = 0.0005


class LaneLost(FilterError, RuntimeError):
    """A lane could not finish a step: its process ended during it (killed, or out of memory): the message
    is answered `failed` and redelivered, and the next step starts a new process."""


@dataclass(frozen=True, slots=True)
class Extracted:
    """What the loop learns of a large message's first step (extract): small, whichever lane ran
    it. The payload and its rows stay where the step ran, under `ticket`, for its next steps."""

    ticket: int
    fp: str
    message_fp: str
    raw: bool
    key: str | None  # None: `missing` says why it cannot be read
    missing: MissingField | None
    bypass: bool


@dataclass(slots=True)
class Held:
    """What one large message's steps keep between them, where they run: the decoded payload
    (many times the message's bytes) never crosses to the loop."""

    rules: RouteRules
    msg: Message
    payload: Any
    typed: TypedRows | None
    missing: MissingField | None
    kept: Kept | None = None  # the last decision's, for `remember` once its commit landed


def extract_step(rules: RouteRules, msg: Message, ticket: int) -> tuple[Extracted, Held]:
    """Step 1 of a decision (`RouteRules.extract`, the key, the bypass rules), for a lane."""
    payload, fp, message_fp, raw, typed = rules.extract(msg)
    try:
        key: str | None = rules.key_of(payload, msg.attributes)
        missing = None
    except MissingField as exc:
        key, missing = None, exc
    bypass = key is not None and rules.bypassed(payload, msg.attributes)
    return Extracted(ticket, fp, message_fp, raw, key, missing, bypass), Held(rules, msg, payload, typed, missing)


def decide_step(held: Held, fp: str, state: KeyState | None, now: float, bypass: bool, rng: random.Random) -> Decided:
    """Step 3 (`judge.decide`) on what step 1 kept."""
    return decide(held.rules, held.msg, fp, state, now, bypass, rng, held.payload, held.typed)


class Lane(Protocol):
    """Where a large message's CPU steps run (`Engine.handle`), and the slot that makes such
    decisions take turns. `ThreadLane`: a thread of this process (the in-process API's);
    `pubsub_filter.core.engine.lane_process.ProcessLane`: a process of its own (`serve`, `pull`)."""

    slot: asyncio.Semaphore

    def ticket(self) -> int:
        """A new message's ticket, taken before its `extract`: `forget(ticket)` frees what the
        extract kept, even when its caller was cancelled while the step ran."""
        ...

    async def extract(self, rules: RouteRules, msg: Message, ticket: int) -> Extracted: ...

    async def decide(
        self, x: Extracted, msg: Message, state: KeyState | None, now: float, bypass: bool, rng: random.Random
    ) -> Decided:
        """`judge.decide` on what `extract` kept; what it decoded is kept by the lane (`Decided.read`)."""
        ...

    async def keyless(self, x: Extracted, msg: Message) -> Keyless:
        """`keyless.keyless` for a message `extract` found no key in (raises `x.missing` on a reject)."""
        ...

    def remember(self, x: Extracted, decided: Decided) -> None:
        """The forward `decided` committed: its route's next decisions start from what it stored."""
        ...

    def forget(self, ticket: int) -> None:
        """Free what `extract` kept (the decision let go of it, or was cancelled before it ended)."""
        ...

    async def holding(self) -> int:
        """How many messages' payloads the lane keeps: one a decision under way, none once all are done."""
        ...

    def close(self) -> None: ...


class ThreadLane:
    """One worker thread for the CPU steps of large decisions, and the slot that makes them take turns.

    What a step keeps (`Held`) is touched on the thread only, and freed there (`forget`): the
    decoded payload is then freed there, not on the loop (68,000 rows: 25-40 ms of deallocation).
    So is every step's result, kept until the next `forget`."""

    __slots__ = ("_executor", "_held", "_kept", "_tickets", "slot")

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._held: dict[int, Held] = {}  # touched on the lane's thread only
        self._kept: list[Any] = []  # touched on the lane's thread only
        self._tickets = itertools.count()
        self.slot = asyncio.Semaphore(1)

    def ticket(self) -> int:
        return next(self._tickets)

    async def extract(self, rules: RouteRules, msg: Message, ticket: int) -> Extracted:
        return await self.run(self._extract, rules, msg, ticket)

    def _extract(self, rules: RouteRules, msg: Message, ticket: int) -> Extracted:
        x, self._held[ticket] = extract_step(rules, msg, ticket)
        return x

    async def decide(
        self, x: Extracted, msg: Message, state: KeyState | None, now: float, bypass: bool, rng: random.Random
    ) -> Decided:
        # what it decoded (`Decided.read`) is kept by the engine, on the loop: the thread reads the same `RouteRules`
        return await self.run(self._decide, x, state, now, bypass, rng)

    def _decide(self, x: Extracted, state: KeyState | None, now: float, bypass: bool, rng: random.Random) -> Decided:
        return decide_step(self._held[x.ticket], x.fp, state, now, bypass, rng)

    async def keyless(self, x: Extracted, msg: Message) -> Keyless:
        return await self.run(self._keyless, x)

    def _keyless(self, x: Extracted) -> Keyless:
        held = self._held[x.ticket]
        assert held.missing is not None
        return keyless(held.rules, held.msg.data, held.missing)

    def remember(self, x: Extracted, decided: Decided) -> None:
        """Nothing: the engine hands `decided.kept` to the loop's `RouteRules`, which this thread reads."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the lane's thread, in the caller's context (its OpenTelemetry span stays the current one)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pubsub-filter-large")
        call = functools.partial(contextvars.copy_context().run, self._step, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _step(self, fn: Callable[..., T], *args: Any) -> T:
        result = uncollected(fn, *args)
        self._kept.append(result)
        return result

    def forget(self, ticket: int) -> None:
        if self._executor is not None:
            self._executor.submit(self._drop, ticket)  # after the extract: one thread, steps in order

    async def holding(self) -> int:
        return await self.run(len, self._held)

    def _drop(self, ticket: int) -> None:
        self._held.pop(ticket, None)
        self._kept.clear()

    def close(self) -> None:
        """Stop the thread once its current step ends (nothing waits for a step whose caller is gone)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class _StepSettings:
    """The collector off and the short switch interval while any lane's step runs, put back as
    the last one ends. Both are the interpreter's, not a lane's: two engines in one process
    (the in-process API, tests) have two lanes whose steps overlap, and each putting back what
    it found would leave the collector off or the interval short for good. Hence one count for
    the process, under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._found: tuple[bool, float] = (True, 0.005)

    def __enter__(self) -> None:
        with self._lock:
            if self._running == 0:
                self._found = (gc.isenabled(), sys.getswitchinterval())
                gc.disable()
                sys.setswitchinterval(min(self._found[1], STEP_SWITCH_INTERVAL))
            self._running += 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                enabled, interval = self._found
                sys.setswitchinterval(interval)
                if enabled:
                    gc.enable()


#: The interpreter's settings are one per process, so is what keeps them (`_StepSettings`).
_STEP_SETTINGS = _StepSettings()


def uncollected(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` with the garbage collector off and the GIL handed over every
    `STEP_SWITCH_INTERVAL` (the module's docstring says why), both put back as the last step ends."""
    with _STEP_SETTINGS:
        return fn(*args)
