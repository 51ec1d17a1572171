"""The engine: for one message on one route, decide (forward, suppress, or say why not) and act on it.

Read `Engine._decide_and_act` top to bottom:

1. **extract** the entity key and the payload fingerprint (`pubsub_filter.core.compare.routes.RouteRules`);
2. **look** at the stored state for (route, key): one read, no write;
3. **decide** with `pubsub_filter.core.engine.judge.decide`, a pure function of its inputs;
4. **act**: a forward claims a fenced lease (one conditional write), publishes while a
   heartbeat keeps the lease, then commits the new fingerprint if the fence still holds
   (one conditional write); everything else acks or retries without writing;
5. **record** the decision (one log line, one row, off the request path).

The engine knows nothing of HTTP, Firestore or Pub/Sub: it talks to the interfaces in
`ports`. Push, pull and replay are thin surfaces that call `Engine.handle`. A forward sends
through one port, `ports.Sender`: the destination's publisher (`Publishing`), or the sender
the caller passes (the in-process API's: the caller's body in place of the publish).

A surface (push, pull, replay, in-process, the wiring and the probes) calls the engine only
through its face, `Engine.FACE`; everything else on it is the engine's own
(`tests/unit/test_engine_face.py` holds every module outside `core.engine` to that).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from msgspec.structs import replace

from pubsub_filter.core.attributes import fence_attributes
from pubsub_filter.core.compare.canonical import MissingField
from pubsub_filter.core.compare.fingerprint import PayloadError, message_fingerprint
from pubsub_filter.core.compare.keyless import Keyless, keyless
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.coalesce import Coalesce
from pubsub_filter.core.config.schema import Config, Route
from pubsub_filter.core.engine import closing
from pubsub_filter.core.engine.cancels import despite_one_cancel, to_the_end
from pubsub_filter.core.engine.coalescing import DECIDE, REPLACED, Holding, decided_already
from pubsub_filter.core.engine.facts import Facts
from pubsub_filter.core.engine.failed_open import FailedOpen
from pubsub_filter.core.engine.handled import (
    CANCELLED,
    Acted,
    Beaten,
    Claimed,
    Delivery,
    Done,
    Handled,
    kept_result,
    not_sent,
    send_failed,
    sent_of,
)
from pubsub_filter.core.engine.heartbeat import Heartbeat
from pubsub_filter.core.engine.judge import Decided, Outgoing, Verdict, decide
from pubsub_filter.core.engine.offload import OFF_LOOP_BYTES, Extracted, Lane, LaneLost, ThreadLane
from pubsub_filter.core.engine.record import log_decision, record_of
from pubsub_filter.core.engine.sending import Publishing, send
from pubsub_filter.core.engine.stopping import CLAIMS, Stop
from pubsub_filter.core.engine.transitions import claimed, forwarded
from pubsub_filter.core.errors import FilterUsageError
from pubsub_filter.core.logs import get_logger, trace_field
from pubsub_filter.core.model import Cause, Decision, DecisionRecord, KeyState, Lease, Message
from pubsub_filter.core.ports import (
    SYSTEM_CLOCK,
    UNOBSERVED,
    Clock,
    DecisionObserver,
    DecisionRecorder,
    Publisher,
    PublishFailed,
    Sender,
    StateStore,
    StoreUnavailable,
    Suspends,
    Traced,
    Worked,
)

log = get_logger("pubsub_filter.engine")

#: How often a lost compare-and-set on the claim is retried before answering `contended`.
CLAIM_ATTEMPTS = 3


class Engine:
    """Decides messages for the surfaces, through one small face (`FACE`):

    - `handle`: decide a message and act on it; `reject` and `turned_away`: record one the
      surface did not understand or did not take in; `recorded`: wait for the records made so far;
    - `health`, `problems`, `in_flight`: what the probes say of it; `under_way` and
      `deciding_here`: the decisions under way, which a surface's stop waits on;
    - `note`: count a surface's event (a push cancelled, refused, overloaded, a client gone);
    - `decide_held`: decide now what `coalesce` routes hold (a stop has begun); `close`: the stop;
    - `facts`: the read-only facts a surface needs (`facts.Facts`: the server's limits, the
      lease's ack deadline, the pull settings, the instance, the routes and their push formats);
    - `telemetry`: what it reports to, which the probes serve (`/metrics`) and push reads
      (whether spans are on).

    The rest (its config, rules, store, publisher, recorder, counters) is its own.
    """

    #: The names a module outside `core.engine` may use on an engine.
    FACE = frozenset(
        (
            "handle",
            "reject",
            "turned_away",
            "recorded",
            "health",
            "problems",
            "in_flight",
            "under_way",
            "deciding_here",
            "note",
            "decide_held",
            "close",
            "facts",
            "telemetry",
        )
    )

    def __init__(
        self,
        config: Config,
        store: StateStore,
        publisher: Publisher | None,  # None: every `handle` passes its own sender (in-process)
        recorder: DecisionRecorder,
        clock: Clock | None = None,
        instance: str | None = None,
        telemetry: DecisionObserver | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,  # the heartbeat's: a test's own clock
        lane: Lane | None = None,  # where large messages' CPU steps run: by default a thread (`offload`)
    ):
        self.config = config
        self.store = store
        self.publisher = publisher
        self.publishing = Publishing(publisher) if publisher is not None else None
        self.recorder = recorder
        self.clock = clock or SYSTEM_CLOCK
        self.quieting = config.decision_logs.quieting()  # `decision_logs`: this engine's lines only
        self.sleep = sleep
        self.instance = instance or uuid.uuid4().hex[:12]
        self.rules = {r.name: RouteRules(r) for r in config.routes}
        self.facts = Facts.of(config, self.instance)  # what a surface may know of this engine
        self.random = random.Random()
        self.in_flight = 0
        #: events for the health output (`/healthz`'s `counts`): the heartbeat's, the surface's
        self.counts: Counter[str] = Counter()
        #: the decisions made so far, by decision (`/healthz`'s `counts` too): one dict
        #: increment a decision, so a probe says what the process did without a records query
        self.decided: Counter[str] = Counter()
        self.failed_open = FailedOpen()  # keys whose destination a fail-open forward of ours moved
        # every decision under way (its `handle` call): the one registry of work in flight,
        # which `close` and the surfaces (`under_way`) wait on
        self.deciding = closing.Deciding()
        self.telemetry = telemetry or UNOBSERVED  # telemetry: metrics and the decision's span
        self.holding = Holding(self.clock, sleep)  # the bursts held on `coalesce` routes
        # large messages: decided on a thread or in a process of their own, one at a time
        # (`pubsub_filter.core.engine.offload`); the engine closes the lane it is given
        self.lane: Lane = lane if lane is not None else ThreadLane()
        self.off_loop_bytes = OFF_LOOP_BYTES
        # a store whose calls never suspend (SQLite) cannot be cancelled inside one: its claim
        # needs no task of its own (`_claim`)
        self._store_inline = isinstance(store, Suspends) and not store.suspends
        # set at the close's share for the claims' answers (`stopping.CLAIMS`): past it a claim
        # on its way at a cancel is no longer waited for
        self.claims_cut = asyncio.Event()

    async def close(self, stop: Stop | None = None) -> None:
        """The one close sequence, for every surface, inside one budget: `stop` (by default
        `server.shutdown_budget` from now), each step ending at its share of it
        (`pubsub_filter.core.engine.stopping`). Nothing is closed under a decision still using it while its
        step lasts: the decisions under way finish first; then the publisher closes (what it
        still holds lands or fails, and its decision finishes); the decisions still left are
        cancelled, and release their lease and record why; then the records still waiting, the
        store and the last telemetry batches. Each step runs even when one before it failed or
        ran out of time; a step past its share is given up (logged as `close_step_cut`)."""
        stop = stop or Stop.begin(self.config.server.shutdown_budget)
        self.decide_held()
        cut = asyncio.get_running_loop().call_later(stop.left(CLAIMS), self.claims_cut.set)
        try:
            await closing.close(self.deciding, self.publisher, self.recorder, self.store, self.telemetry, stop)
        finally:
            cut.cancel()
            self.lane.close()

    def decide_held(self) -> None:
        """Decide now every message `coalesce` routes hold, not when its burst would end: a stop
        has begun (the first signal, or `close`), so what is held is decided inside it."""
        self.holding.release_all()

    def note(self, event: str) -> None:
        """Count a surface's event for the health output (`/healthz`'s `counts`): a push cancelled,
        refused, overloaded, a client gone. The surfaces say so here; none touches the counters."""
        self.counts[event] += 1

    def health(self) -> dict[str, Any]:
        """What the health output says of this engine: messages being decided now, and the counts
        (the decisions made so far by decision, then the events `note` and the heartbeat counted)."""
        counts = {str(decision): n for decision, n in self.decided.items()} | dict(self.counts)
        return {"in_flight": self.in_flight, "counts": counts}

    async def problems(self) -> dict[str, str]:
        """Why every forward would fail now, by backend: the store cannot answer within the store's
        budget, or the publisher cannot take a message (an outbox whose directory vanished, a full
        disk). Empty: ready. An in-process engine has no publisher: its callers' bodies send."""
        budget = self.config.store_errors.budget
        backends = {"store": self.store.ping}
        if self.publisher is not None:
            backends["publisher"] = self.publisher.ping
        found: dict[str, str] = {}
        for name, ping in backends.items():
            try:
                await asyncio.wait_for(ping(), budget)
            except Exception as exc:
                found[name] = str(exc) or type(exc).__name__
        return found

    def under_way(self) -> set[asyncio.Future[None]]:
        """The decisions under way (`handle` calls) in tasks other than this one: a future for
        each, done as its decision ends. Every surface waits on these, not a registry of its own."""
        return self.deciding.under_way()

    def deciding_here(self) -> bool:
        """Whether this task is inside a `handle` call of this engine (a body calling back in)."""
        return self.deciding.here()

    async def handle(
        self,
        route_name: str,
        msg: Message,
        trace: str | None = None,
        via: Sender | None = None,
        parent: object | None = None,
    ) -> Handled:
        """Decide `msg` and act on it: a forward sends through `via`, by default the publisher.

        The request the message came in travels as parameters: `trace`, the log line's trace
        name, and `parent`, the trace context the decision's span continues (the telemetry's).

        The record is written (or on its way, as the recorder promises) when this returns. With
        `via`, the caller's own sender, a send that failed is recorded and then raised here."""
        sender = via or self.publishing
        if sender is None:
            raise FilterUsageError("this engine has no publisher: pass the sender a forward sends through")
        finished = asyncio.get_running_loop().create_future()
        self.deciding.calls[finished] = asyncio.current_task()
        try:
            with self.telemetry.decision(route_name, msg, parent) as traced:  # telemetry: the decision's span
                rec, done = await self._handle(route_name, msg, trace, sender, traced)
                await self.recorded()
        finally:
            del self.deciding.calls[finished]
            finished.set_result(None)
        if via is not None and done.acted.error is not None:
            raise done.acted.error
        return Handled(rec, done.acted.sent, kept_result(done))

    async def recorded(self) -> None:
        """Wait for the commit that holds the records made so far (`handle` and `reject` wait for
        their own; a surface answering a cancelled `handle` waits for the record it made). An
        answer goes out only once its decision is recorded.

        As `cancels.despite_one_cancel`, without its shield and the loop step it adds: the recorder gives
        each caller a wait of its own, so a cancel here ends only that wait, never the commit.
        The first cancel is taken back and the commit waited for again; a second goes through."""
        if (committing := self.recorder.committing()) is None:
            return
        try:
            await committing
        except asyncio.CancelledError:
            if (current := asyncio.current_task()) is None:
                raise
            current.uncancel()
            if (again := self.recorder.committing()) is not None:
                await again

    async def _handle(
        self, route_name: str, msg: Message, trace: str | None, sender: Sender, traced: Traced
    ) -> tuple[DecisionRecord, Done]:
        started = time.perf_counter()
        rules = self.rules.get(route_name)
        if rules is None:
            done = Done(Decision.REJECTED, f"unknown route {route_name!r}", cause=Cause.UNKNOWN_ROUTE)
            return self._finish(route_name, msg, done, started, trace), done
        self.in_flight += 1
        try:
            if len(msg.data) < self.off_loop_bytes:
                done = await self._decide_and_act(rules, msg, sender, traced, trace)
            else:
                done = await self._off_loop(rules, msg, sender, traced, trace)
        except PayloadError as exc:
            done = Done(Decision.REJECTED, str(exc))
        except asyncio.CancelledError:
            # Abandoned (a shutdown that could not wait): any lease is released by now; the
            # message is answered with no decision, so say so in its record and log line.
            self._finish(route_name, msg, CANCELLED, started, trace)
            raise
        except LaneLost as exc:
            # Foreseeable (the process killed: out of memory), not a bug: one line, no traceback
            log.error("large_message_process_lost", route=route_name, message_id=msg.message_id, reason=str(exc))
            done = Done(Decision.FAILED, f"{exc}: decided again when it is sent again", cause=Cause.INTERNAL)
        except Exception as exc:
            # A bug of ours (or of a library's) met on this message: a recorded `failed`, retried
            # and in time dead-lettered, never an answer nothing recorded or counted.
            log.exception("decision_raised", route=route_name, message_id=msg.message_id, **trace_field(trace))
            done = Done(Decision.FAILED, f"internal error: {type(exc).__name__}: {exc}", cause=Cause.INTERNAL)
        finally:
            self.in_flight -= 1
        return self._finish(route_name, msg, done, started, trace), done

    async def reject(
        self,
        route_name: str,
        msg: Message | None,
        reason: str,
        *,
        trace: str | None = None,
        message_id: str | None = None,
        cause: Cause | None = None,
    ) -> DecisionRecord:
        """Record a message that was not understood (the surface answers 4xx); returns once the
        record is written, as `handle` does."""
        rejected = Done(Decision.REJECTED, reason, cause=cause)
        rec = self._finish(route_name, msg, rejected, time.perf_counter(), trace, message_id)
        await self.recorded()
        return rec

    async def _off_loop(
        self, rules: RouteRules, msg: Message, sender: Sender, traced: Traced, trace: str | None
    ) -> Done:
        """A large message: its CPU steps on the lane (`pubsub_filter.core.engine.offload`), which
        keeps the payload they decode (the loop never holds it) until the decision is done; and
        one such decision at a time (its peak memory once), but for the in-process caller's own
        work, which never waits behind another caller's."""
        if sender is not self.publishing:
            return await self._extracted_on_lane(rules, msg, sender, traced, trace)
        async with self.lane.slot:
            return await self._extracted_on_lane(rules, msg, sender, traced, trace)

    async def _extracted_on_lane(
        self, rules: RouteRules, msg: Message, sender: Sender, traced: Traced, trace: str | None
    ) -> Done:
        self._admissible(rules, msg, sender)  # before the CPU: a message refused is refused at once
        ticket = self.lane.ticket()
        try:
            x = await self.lane.extract(rules, msg, ticket)
            return await self._decide_and_act(rules, msg, sender, traced, trace, x)
        finally:
            self.lane.forget(ticket)  # what the lane kept, freed there (also after a cancel mid-extract)

    async def turned_away(
        self, route_name: str, reason: str, *, trace: str | None = None, message_id: str | None = None
    ) -> DecisionRecord:
        """Record a message a surface did not take in (it was at its bound: `Cause.OVERLOADED`,
        answered as a retry); returns once the record is written, as `reject` does."""
        done = Done(Decision.FAILED, reason, cause=Cause.OVERLOADED)
        rec = self._finish(route_name, None, done, time.perf_counter(), trace, message_id)
        await self.recorded()
        return rec

    @staticmethod
    def _admissible(rules: RouteRules, msg: Message, sender: Sender) -> None:
        """Raises `PayloadError` for a message refused whatever it holds (the same on every delivery)."""
        route = rules.route
        if not rules.accepts_subscription(msg.subscription):
            raise PayloadError(f"pushed from subscription {msg.subscription!r}, route expects {route.subscription!r}")
        if sender.attribute_limits and (unforwardable := rules.unforwardable(msg.attributes)) is not None:
            raise PayloadError(unforwardable)  # rejected, not a failing publish

    async def _decide_and_act(
        self,
        rules: RouteRules,
        msg: Message,
        sender: Sender,
        traced: Traced,
        trace: str | None,
        x: Extracted | None = None,
    ) -> Done:
        """`x`: a large message's step 1, taken on the lane, where step 3 runs too (`_off_loop`).
        `trace`: the request's, which the decision's lifecycle lines carry (`Delivery.trace`)."""
        route = rules.route
        self._admissible(rules, msg, sender)
        # 1. extract
        payload: Any = None
        typed = None
        if x is None:
            try:
                payload, fp, message_fp, raw, typed = rules.extract(msg)
                key = rules.key_of(payload, msg.attributes)
            except MissingField as exc:
                return await self._keyless(rules, msg, sender, exc, traced, trace)
            bypass = rules.bypassed(payload, msg.attributes)
        else:
            if x.key is None:
                assert x.missing is not None
                if route.on_missing_key == "reject":
                    raise x.missing
                return await self._forward_keyless(rules, msg, sender, await self.lane.keyless(x, msg), traced, trace)
            fp, message_fp, raw, key, bypass = x.fp, x.message_fp, x.raw, x.key, x.bypass
        d = Delivery(route, msg, key, fp, message_fp, raw, None, traced, trace)
        if route.coalesce is not None and not bypass and (early := await self._coalesce(d, route.coalesce, sender)):
            return early  # superseded by a newer message of its burst (`pubsub_filter.core.engine.coalescing`)
        # 2. look
        try:
            state = self.failed_open.view(route.name, key, await self.store.read(route.name, key))
        except StoreUnavailable as exc:
            return await self._store_down(d, sender, exc)
        for _ in range(CLAIM_ATTEMPTS):
            now = self.clock.now()
            # 3. decide: each look at the state is decided afresh, and only the last one is recorded
            decided = (
                decide(rules, msg, fp, state, now, bypass, self.random, payload, typed)
                if x is None
                else await self.lane.decide(x, msg, state, now, bypass, self.random)
            )
            rules.keep_read(decided.read)  # what it decoded of the stored state, for the next decisions
            verdict = decided.verdict
            # 4. act
            if verdict.decision is not Decision.FORWARDED:
                if route.enforced:
                    return Done(verdict.decision, verdict.reason, d, decided)
                # shadow mode: publish what enforce mode would hold back, record what it would do
                return await self._forward_unleased(d, sender, verdict.decision, verdict.reason, decided)
            try:
                claim = await self._claim(d, decided.state, now)
            except StoreUnavailable as exc:
                return await self._store_down(d, sender, exc)
            if isinstance(claim, Beaten):
                # someone wrote first: decide again on what they wrote, no second read
                state = self.failed_open.view(route.name, key, claim.current)
                continue
            acted = await self._publish_and_commit(d, sender, decided, claim)
            if acted.failure is not None:
                return Done(not_sent(acted), acted.failure, d, decided, acted)
            if acted.committed:
                # what the forward stored, decoded, for the route's next decisions (the lane's, for a large one)
                rules.remember(decided.kept)
                if x is not None:
                    self.lane.remember(x, decided)
            return Done(Decision.FORWARDED, verdict.reason, d, decided, acted)
        return Done(Decision.CONTENDED, f"lost the claim race {CLAIM_ATTEMPTS} times", d, decided)

    async def _coalesce(self, d: Delivery, coalesce: Coalesce, sender: Sender) -> Done | None:
        """Wait while `d` is the newest of its key's burst; None: decide it now, as usual. What
        the stored state already answers (a redelivery, a stale message) is never held."""
        try:
            state = await self.store.read(d.route.name, d.key)
        except StoreUnavailable:
            return None  # the look that follows meets the outage and answers as the route says
        if decided_already(d.msg, d.fp, state, self.clock.now()):
            return None
        answer = await self.holding.hold(d.route.name, d.key, coalesce, d.msg)
        if answer is DECIDE:
            return None
        if answer is REPLACED:
            return Done(Decision.CONTENDED, "a later delivery of this message is held in its place", d)
        reason = f"superseded by message {answer.by}, newer in the same burst and held unacked"
        verdict = Verdict(Decision.SUPERSEDED, reason)
        decided = Decided(verdict, state, Outgoing(d.msg.data, {}), {"superseded_by": answer.by})
        if d.route.enforced:
            return Done(Decision.SUPERSEDED, reason, d, decided)
        return await self._forward_unleased(d, sender, Decision.SUPERSEDED, reason, decided)

    async def _claim(self, d: Delivery, state: KeyState | None, now: float) -> Claimed | Beaten:
        """Take the lease for `d`'s key, if the state is still `state`. Raises `StoreUnavailable`."""
        lease = Lease(
            holder=f"{self.instance}/{uuid.uuid4().hex[:8]}",
            fence=(state.fence if state is not None else 0) + 1,
            expires_at=now + self.config.lease.duration,
            fingerprint=d.fp,
            message_id=d.msg.message_id,
        )
        route, key = d.route.name, d.key
        # The claim runs in a task of its own, so that a cancel (a shutdown's) does not cut its
        # call short: a write sent lands or not whatever its caller does (a cancelled RPC the
        # store applies all the same), and only its answer tells which. A store whose calls
        # never suspend (SQLite) needs none: no cancel lands inside its call.
        claim = self.store.claim(route, key, state, claimed(state, lease, now + self._retention(d.route)))
        claiming = asyncio.ensure_future(claim) if not self._store_inline else None
        try:
            held = await (asyncio.shield(claiming) if claiming is not None else claim)
            if held is None:
                # A claim whose reply was lost may still have landed: ours if the holder token is.
                current = await self.store.read(route, key)
                if current is None or current.lease is None or current.lease.holder != lease.holder:
                    return Beaten(current)
                held = current
        except asyncio.CancelledError:
            # Cancelled with the claim on its way: its answer is waited for (the store bounds
            # it), and a claim that landed, even after the cancel, is released. The message is
            # nacked, so its redelivery (another worker's) must find the key free, not leased.
            if claiming is None:  # cancelled past the claim (in its read): it has its answer
                await to_the_end(self._release_if_ours(d, lease.holder))
            else:
                await to_the_end(self._release_claimed(d, claiming, lease.holder))
            raise
        self.failed_open.claimed(route, key)
        if state is not None and state.lease is not None and not state.lease.live(now):
            self.telemetry.lease_taken_over(route)  # telemetry
            log.warning(
                "lease_taken_over",
                route=route,
                key=key,
                fence=lease.fence,
                previous_holder=state.lease.holder,
                previous_fence=state.lease.fence,
                expired_for_s=round(now - state.lease.expires_at, 3),
                **trace_field(d.trace),
            )
        else:
            log.debug("lease_acquired", route=route, key=key, fence=lease.fence, **trace_field(d.trace))
        return Claimed(held, lease.fence)

    async def _publish_and_commit(self, d: Delivery, sender: Sender, decided: Decided, claim: Claimed) -> Acted:
        if not sender.lands_despite_cancel:
            # The caller's own work runs in the caller's task: its cancel (a timeout on a stuck
            # body) reaches the work and fails the forward; only the commit past a work that
            # returned is waited for through a cancel (`_commit`).
            return await self._publish_and_commit_now(d, sender, decided, claim)
        # Once the publish is handed over it may land whatever we do, so a shutdown's cancel
        # waits for its outcome and the commit: abandoned, the nacked copy is published again.
        return await despite_one_cancel(self._publish_and_commit_now(d, sender, decided, claim))

    async def _publish_and_commit_now(self, d: Delivery, sender: Sender, decided: Decided, claim: Claimed) -> Acted:
        route, key, msg, held = d.route, d.key, d.msg, claim.held
        lease = self.config.lease
        heartbeat = Heartbeat(
            self.store, route.name, key, held, lease, self.clock, self.sleep, d.traced, self.counts, d.trace
        )
        out = Outgoing(
            decided.out.data,
            {**decided.out.attributes, **fence_attributes(key, held.fence)},
            decided.out.rows,
            decided.out.full_fingerprint,
            decided.out.selection,
        )
        try:
            async with heartbeat:
                published = await self._publish(d, sender, out)
                published_id, result = sent_of(published)
        except PublishFailed as exc:
            await self._release(d, heartbeat.held)
            return send_failed(exc, sender, claim.fence)
        except asyncio.CancelledError:
            # Cancelled twice (a shutdown that will not wait): the message will be redelivered,
            # so free the key now rather than make the redelivery wait out the lease.
            await self._release(d, heartbeat.held)
            raise
        sent = Acted(published_id, claim.fence, heartbeats=heartbeat.extended, sent=published)
        now = self.clock.now()
        new = forwarded(decided.state, msg, d.fp, held.fence, out, now, now + self._retention(route), result)
        try:
            committed = await self._commit(d, sender, heartbeat.held, new)
        except Exception as exc:  # whatever the store raised: the publish landed, so this is an ack
            # Published but not recorded: the lease expires and the next copy of this
            # content is forwarded once more. Never nack here: that would publish twice now.
            log.error(
                "commit_failed",
                route=route.name,
                key=key,
                fence=held.fence,
                error=_describe(exc),
                **trace_field(d.trace),
            )
            return replace(sent, committed=False)
        if not committed:
            log.warning("commit_refused", route=route.name, key=key, fence=held.fence, **trace_field(d.trace))
            return replace(sent, committed=False)
        return sent

    def _commit(self, d: Delivery, sender: Sender, held: KeyState, new: KeyState) -> Awaitable[bool]:
        commit = self.store.commit(d.route.name, d.key, held, new)
        # The caller's work has run: its effect is done, so its commit is waited for through the
        # caller's cancel. A publish's commit already is (`_publish_and_commit`).
        return commit if sender.lands_despite_cancel else despite_one_cancel(commit)

    async def _release(self, d: Delivery, held: KeyState) -> None:
        """Free the key for the redelivery, to the end through any cancel (`cancels.to_the_end`)."""
        await to_the_end(self._release_now(d, held))

    async def _release_claimed(self, d: Delivery, claiming: asyncio.Future[KeyState | None], holder: str) -> None:
        """Once `claiming` has its answer: release the lease it took, if it took one (or may have).
        A claim still unanswered at the close's share for it (`stopping.CLAIMS`) is cut short."""
        if not claiming.done():
            cut = asyncio.ensure_future(self.claims_cut.wait())
            try:
                either: set[asyncio.Future[Any]] = {claiming, cut}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                cut.cancel()
            claiming.cancel()  # no-op once answered
        try:
            held = await claiming
        except (Exception, asyncio.CancelledError):  # no answer (failed, timed out, cut): it may have landed
            held = None
        if held is not None:
            await self._release_now(d, held)
        else:
            await self._release_if_ours(d, holder)

    async def _release_if_ours(self, d: Delivery, holder: str) -> None:
        try:
            current = await self.store.read(d.route.name, d.key)
        except Exception as exc:  # the lease then lapses by itself; the nack still goes out
            log.error(
                "lease_release_failed", route=d.route.name, key=d.key, error=_describe(exc), **trace_field(d.trace)
            )
            return
        if current is not None and current.lease is not None and current.lease.holder == holder:
            await self._release_now(d, current)

    async def _release_now(self, d: Delivery, held: KeyState) -> None:
        fence = held.lease.fence if held.lease else held.fence
        try:
            await self.store.release(d.route.name, d.key, held)
        except Exception as exc:  # the lease then lapses by itself; the nack still goes out
            error = _describe(exc)
            log.error(
                "lease_release_failed", route=d.route.name, key=d.key, fence=fence, error=error, **trace_field(d.trace)
            )
            return
        log.info("lease_released", route=d.route.name, key=d.key, fence=fence, **trace_field(d.trace))

    def _publish(self, d: Delivery, sender: Sender, out: Outgoing | None = None) -> Awaitable[str | Worked]:
        """Send what a forward sends through `sender`: its id where it went (and a result to keep)."""
        return send(d, sender, out, self._every_flag)

    async def _forward_unleased(
        self, d: Delivery, sender: Sender, decision: Decision, reason: str, decided: Decided | None = None
    ) -> Done:
        """Publish with no lease and no commit (shadow mode, fail-open): `decision` once it went out."""
        try:
            # as in `_publish_and_commit`: nothing but the ack would stop this copy's redelivery
            # (the caller's own work excepted: its cancel is the caller's)
            publish = self._publish(d, sender)
            published = await (despite_one_cancel(publish) if sender.lands_despite_cancel else publish)
            acted = Acted(sent_of(published)[0], sent=published)
        except PublishFailed as exc:
            acted = send_failed(exc, sender)
        if acted.failure is not None:
            return Done(not_sent(acted), f"{reason}; {acted.failure}", d, decided, acted)
        return Done(decision, reason, d, decided, acted)

    async def _store_down(self, d: Delivery, sender: Sender, exc: StoreUnavailable) -> Done:
        route = d.route
        log.error(
            "store_unavailable",
            route=route.name,
            key=d.key,
            error=str(exc),
            policy=route.on_store_error,
            **trace_field(d.trace),
        )
        reason = f"store unavailable: {exc}"
        if route.on_store_error == "retry":
            return Done(Decision.FAILED, reason, d, cause=Cause.STORE)
        done = await self._forward_unleased(d, sender, Decision.FAIL_OPEN, reason)
        if done.decision is Decision.FAIL_OPEN:
            self.failed_open.remember(route.name, d.key, d.fp, d.msg.publish_time, self.clock.now())
        return done

    async def _keyless(
        self,
        rules: RouteRules,
        msg: Message,
        sender: Sender,
        missing: MissingField,
        traced: Traced,
        trace: str | None,
    ) -> Done:
        """No key, so no state to decide on: forwarded without a lease, or rejected (`core.compare.keyless`)."""
        return await self._forward_keyless(rules, msg, sender, keyless(rules, msg.data, missing), traced, trace)

    async def _forward_keyless(
        self, rules: RouteRules, msg: Message, sender: Sender, k: Keyless, traced: Traced, trace: str | None
    ) -> Done:
        message_fp = message_fingerprint(msg.data, msg.attributes)
        d = Delivery(rules.route, msg, "", k.fingerprint, message_fp, k.raw, k.missing, traced, trace)
        return await self._forward_unleased(d, sender, Decision.FAIL_OPEN, k.reason)

    def _every_flag(self, route_name: str) -> Mapping[str, str]:
        rules = self.rules.get(route_name)
        return rules.tolerance.every_flag if rules is not None and rules.tolerance is not None else {}

    def _retention(self, route: Route) -> float:
        return max(self.config.state_ttl, route.window or 0.0)

    def _finish(
        self,
        route_name: str,
        msg: Message | None,
        done: Done,
        started: float,
        trace: str | None,
        message_id: str | None = None,
    ) -> DecisionRecord:
        """The decision's record, built once, here (`record.record_of`): recorded, counted and logged."""
        rules = self.rules.get(route_name)
        enforced = rules.route.enforced if rules else True
        rec = record_of(route_name, msg, done, started, trace, message_id, enforced, self.clock.now())
        self.recorder.record(rec)
        self.decided[rec.decision] += 1
        self.telemetry.decided(rec)  # telemetry: count it, describe it on its span
        log_decision(rec, self.quieting)
        return rec


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, StoreUnavailable) else str(exc)
