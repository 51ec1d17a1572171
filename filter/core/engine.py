"""The engine: for one message on one route, decide (forward, suppress, or say why not) and act on it.

Read `Engine._decide_and_act` top to bottom:

1. **extract** the entity key and the payload fingerprint (`filter.core.routes.RouteRules`);
2. **look** at the stored state for (route, key): one read, no write;
3. **decide** with `filter.core.judge.decide`, a pure function of its inputs;
4. **act**: a forward claims a fenced lease (one conditional write), publishes while a
   heartbeat keeps the lease, then commits the new fingerprint if the fence still holds
   (one conditional write); everything else acks or retries without writing;
5. **record** the decision (one log line, one row, off the request path).

The engine knows nothing of HTTP, Firestore or Pub/Sub: it talks to the interfaces in
`ports`. Push, pull and replay are thin surfaces that call `Engine.handle`. A forward sends
through one port, `ports.Sender`: the destination's publisher (`Publishing`), or the sender
the caller passes (the in-process API's: the caller's body in place of the publish).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec
from msgspec.structs import replace

from filter.core.attributes import fence_attributes, forward_attributes, unpublishable
from filter.core.canonical import MissingField
from filter.core.config import Config, Route
from filter.core.decision_line import Quieting, line_level, write_line
from filter.core.errors import FilterUsageError
from filter.core.fingerprint import NOT_JSON, PayloadError, message_fingerprint
from filter.core.heartbeat import Heartbeat
from filter.core.judge import Decided, Outgoing, decide
from filter.core.keyless import keyless
from filter.core.logs import get_logger
from filter.core.model import Cause, Decision, DecisionRecord, KeyState, Lease, Message
from filter.core.ports import (
    UNOBSERVED,
    Clock,
    DecisionObserver,
    DecisionRecorder,
    Publisher,
    PublishFailed,
    Sender,
    StateStore,
    StoreUnavailable,
    Unpublishable,
    Worked,
)
from filter.core.routes import RouteRules
from filter.core.stopping import CLOSE, DRAIN, PUBLISHER, RECORDS, RELEASE, Stop
from filter.core.transitions import claimed, forwarded
from filter.core.unsettled import FailedOpen

log = get_logger("pubsub_filter.engine")

#: How often a lost compare-and-set on the claim is retried before answering `contended`.
CLAIM_ATTEMPTS = 3

T = TypeVar("T")


class SystemClock:
    def now(self) -> float:
        return time.time()


# The values a decision passes between its steps are frozen msgspec Structs: as immutable as a
# frozen dataclass, and built in a tenth of the time (a frozen dataclass sets each field through
# `object.__setattr__`, ~0.25 µs a field; every message builds a `Delivery` and a `Done`).


class Delivery(msgspec.Struct, frozen=True):
    """One message on one route once its key and fingerprint are known: what each step of acting needs."""

    route: Route
    msg: Message
    key: str
    fp: str
    message_fp: str
    raw: bool  # the payload is not JSON
    missing: str | None = None  # the path that could not be read: no key, nothing stored (`keyless`)


class Acted(msgspec.Struct, frozen=True):
    """What acting on a decision came to: what went out, and whether its state was committed,
    or why it did not go out (`cause`, and `failure` in words)."""

    published_id: str | None = None
    fence: int | None = None  # the lease's, when one was claimed
    committed: bool = True
    heartbeats: int = 0
    cause: Cause | None = None
    failure: str | None = None
    error: PublishFailed | None = None  # what the send raised: the caller's to raise, for its own sender


NOT_ACTED = Acted()


class Done(msgspec.Struct, frozen=True):
    """How one message's decision ended, everything its record says but the timing."""

    decision: Decision
    reason: str
    delivery: Delivery | None = None  # the key and fingerprints, once extracted
    decided: Decided | None = None  # the look at the state the decision was taken on
    acted: Acted = NOT_ACTED
    cause: Cause | None = None


class Claimed(msgspec.Struct, frozen=True):
    """The lease is ours: `held` is the state the store wrote (the commit must present it)."""

    held: KeyState
    fence: int


class Beaten(msgspec.Struct, frozen=True):
    """Another writer changed the state between our read and our claim: `current` is what it wrote."""

    current: KeyState | None


class Publishing:
    """The forward port over the destination's publisher."""

    cause = Cause.PUBLISH
    lands_despite_cancel = True  # Pub/Sub may deliver what it was handed, whatever we do
    attribute_limits = True

    def __init__(self, publisher: Publisher):
        self.publisher = publisher

    async def send(self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None) -> str:
        return await self.publisher.publish(destination, data, attributes, ordering_key)


class Engine:
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
    ):
        self.config = config
        self.store = store
        self.publisher = publisher
        self.publishing = Publishing(publisher) if publisher is not None else None
        self.recorder = recorder
        self.clock = clock or SystemClock()
        self.quieting = config.decision_logs.quieting()  # `decision_logs`: this engine's lines only
        self.sleep = sleep
        self.instance = instance or uuid.uuid4().hex[:12]
        self.rules = {r.name: RouteRules(r) for r in config.routes}
        self.random = random.Random()
        self.in_flight = 0
        self.failed_open = FailedOpen()  # keys whose destination a fail-open forward of ours moved
        # every decision under way (its `handle` call), by the task running it: `close` waits for them
        self._deciding: dict[asyncio.Future[None], asyncio.Task[Any] | None] = {}
        self.telemetry = telemetry or UNOBSERVED  # telemetry: metrics and the decision's span

    async def close(self, stop: Stop | None = None) -> None:
        """The one close sequence, for every surface, inside one budget: `stop` (by default
        `server.shutdown_budget` from now), each step ending at its share of it
        (`filter.core.stopping`). Nothing is closed under a decision still using it while its
        step lasts: the decisions under way finish first; then the publisher closes (what it
        still holds lands or fails, and its decision finishes); the decisions still left are
        cancelled, and release their lease and record why; then the records still waiting, the
        store and the last telemetry batches. Each step runs even when one before it failed or
        ran out of time; a step past its share is given up (logged as `close_step_cut`)."""
        stop = stop or Stop.begin(self.config.server.shutdown_budget)
        async with contextlib.AsyncExitStack() as steps:  # run last to first
            steps.callback(self.telemetry.shutdown)
            steps.push_async_callback(_within, "store", self.store.close, stop, CLOSE)
            steps.push_async_callback(lambda: self.recorder.close(stop.left(RECORDS)))
            steps.push_async_callback(self._abandon_deciding, stop)
            # Pub/Sub's close flushes what it holds: a stalled publish lands or fails now, and its
            # decision commits or releases, rather than be abandoned and published again.
            if self.publisher is not None:
                steps.push_async_callback(_within, "publisher", self.publisher.close, stop, PUBLISHER)
            # A surface may have cancelled them once already: past their publish a cancel is taken
            # back (`_despite_one_cancel`), so their commits and records come first.
            await self._wait_deciding(stop.left(DRAIN))

    async def _abandon_deciding(self, stop: Stop) -> None:
        """Cancel the decisions still under way; wait for their releases until the stop's share for them."""
        if await self._wait_deciding(stop.left(PUBLISHER)):
            return
        current = asyncio.current_task()
        left = [task for task in self._deciding.values() if task is not None and task is not current]
        log.warning("cancelling_decisions", count=len(left), budget_s=stop.budget)
        for task in left:
            task.cancel()  # a publish that does not end: release the lease, record it, nack
        await asyncio.sleep(0)  # the cancels land; one past its publish is taken back...
        for task in left:
            if not task.done() and not task.cancelling():
                task.cancel()  # ...unless a surface's cancel was that one: this one goes through
        # a release slower than this (a store outage at the stop) is left to lapse by itself
        if not await self._wait_deciding(stop.left(RELEASE)):
            log.error("decisions_abandoned", count=len(self._deciding))

    async def _wait_deciding(self, grace: float) -> bool:
        """Wait up to `grace` seconds for the decisions under way; whether none is left."""
        current = asyncio.current_task()
        pending = {done for done, task in self._deciding.items() if task is not current}
        if pending:
            await asyncio.wait(pending, timeout=grace)
        return not any(task is not current for task in self._deciding.values())

    async def handle(
        self, route_name: str, msg: Message, trace: str | None = None, via: Sender | None = None
    ) -> DecisionRecord:
        """Decide `msg` and act on it: a forward sends through `via`, by default the publisher.

        The record is written (or on its way, as the recorder promises) when this returns. With
        `via`, the caller's own sender, a send that failed is recorded and then raised here."""
        sender = via or self.publishing
        if sender is None:
            raise FilterUsageError("this engine has no publisher: pass the sender a forward sends through")
        finished = asyncio.get_running_loop().create_future()
        self._deciding[finished] = asyncio.current_task()
        try:
            with self.telemetry.decision(route_name, msg):  # telemetry: the decision's span
                rec, done = await self._handle(route_name, msg, trace, sender)
                await self.recorded()
        finally:
            del self._deciding[finished]
            finished.set_result(None)
        if via is not None and done.acted.error is not None:
            raise done.acted.error
        return rec

    async def recorded(self) -> None:
        """Wait for the commit that holds the records made so far (`handle` and `reject` wait for
        their own; a surface answering a cancelled `handle` waits for the record it made). An
        answer goes out only once its decision is recorded.

        As `_despite_one_cancel`, without its shield and the loop step it adds: the recorder gives
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
        self, route_name: str, msg: Message, trace: str | None, sender: Sender
    ) -> tuple[DecisionRecord, Done]:
        started = time.perf_counter()
        rules = self.rules.get(route_name)
        if rules is None:
            done = Done(Decision.REJECTED, f"unknown route {route_name!r}", cause=Cause.UNKNOWN_ROUTE)
            return self._finish(route_name, msg, done, started, trace), done
        self.in_flight += 1
        try:
            done = await self._decide_and_act(rules, msg, sender)
        except PayloadError as exc:
            done = Done(Decision.REJECTED, str(exc))
        except asyncio.CancelledError:
            # Abandoned (a shutdown that could not wait): any lease is released by now; the
            # message is answered with no decision, so say so in its record and log line.
            self._finish(route_name, msg, CANCELLED, started, trace)
            raise
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

    async def _decide_and_act(self, rules: RouteRules, msg: Message, sender: Sender) -> Done:
        route = rules.route
        if not rules.accepts_subscription(msg.subscription):
            raise PayloadError(f"pushed from subscription {msg.subscription!r}, route expects {route.subscription!r}")
        if sender.attribute_limits and (unforwardable := rules.unforwardable(msg.attributes)) is not None:
            raise PayloadError(unforwardable)  # the same on every delivery: rejected, not a failing publish
        # 1. extract
        try:
            payload, fp = rules.scheme(msg.data)
            key = rules.key_of(payload, msg.attributes)
        except MissingField as exc:
            return await self._keyless(rules, msg, sender, exc)
        bypass = rules.bypassed(payload, msg.attributes)
        d = Delivery(route, msg, key, fp, message_fingerprint(msg.data, msg.attributes), payload is NOT_JSON)
        # 2. look
        try:
            state = self.failed_open.view(route.name, key, await self.store.read(route.name, key))
        except StoreUnavailable as exc:
            return await self._store_down(d, sender, exc)
        for _ in range(CLAIM_ATTEMPTS):
            now = self.clock.now()
            # 3. decide: each look at the state is decided afresh, and only the last one is recorded
            decided = decide(rules, msg, fp, state, now, bypass, self.random, payload)
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
                return Done(_not_sent(acted), acted.failure, d, decided, acted)
            return Done(Decision.FORWARDED, verdict.reason, d, decided, acted)
        return Done(Decision.CONTENDED, f"lost the claim race {CLAIM_ATTEMPTS} times", d, decided)

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
        try:
            held = await self.store.claim(route, key, state, claimed(state, lease, now + self._retention(d.route)))
            if held is None:
                # A claim whose reply was lost may still have landed: ours if the holder token is.
                current = await self.store.read(route, key)
                if current is None or current.lease is None or current.lease.holder != lease.holder:
                    return Beaten(current)
                held = current
        except asyncio.CancelledError:
            # Cancelled with the claim on its way: it may have landed all the same. The message
            # is nacked, so free the key rather than make its redelivery wait out the lease.
            await _to_the_end(self._release_if_ours(d, lease.holder))
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
            )
        else:
            log.debug("lease_acquired", route=route, key=key, fence=lease.fence)
        return Claimed(held, lease.fence)

    async def _publish_and_commit(self, d: Delivery, sender: Sender, decided: Decided, claim: Claimed) -> Acted:
        if not sender.lands_despite_cancel:
            # The caller's own work runs in the caller's task: its cancel (a timeout on a stuck
            # body) reaches the work and fails the forward; only the commit past a work that
            # returned is waited for through a cancel (`_commit`).
            return await self._publish_and_commit_now(d, sender, decided, claim)
        # Once the publish is handed over it may land whatever we do, so a shutdown's cancel
        # waits for its outcome and the commit: abandoned, the nacked copy is published again.
        return await self._despite_one_cancel(self._publish_and_commit_now(d, sender, decided, claim))

    async def _publish_and_commit_now(self, d: Delivery, sender: Sender, decided: Decided, claim: Claimed) -> Acted:
        route, key, msg, held = d.route, d.key, d.msg, claim.held
        heartbeat = Heartbeat(self.store, route.name, key, held, self.config.lease, self.clock, self.sleep)
        out = Outgoing(
            decided.out.data,
            {**decided.out.attributes, **fence_attributes(key, held.fence)},
            decided.out.rows,
            decided.out.full_fingerprint,
        )
        try:
            async with heartbeat:
                published_id, result = _sent(await self._publish(d, sender, out))
        except PublishFailed as exc:
            await self._release(d, heartbeat.held)
            return _failed(exc, sender, claim.fence)
        except asyncio.CancelledError:
            # Cancelled twice (a shutdown that will not wait): the message will be redelivered,
            # so free the key now rather than make the redelivery wait out the lease.
            await self._release(d, heartbeat.held)
            raise
        sent = Acted(published_id, claim.fence, heartbeats=heartbeat.extended)
        now = self.clock.now()
        new = forwarded(decided.state, msg, d.fp, held.fence, out, now, now + self._retention(route), result)
        try:
            committed = await self._commit(d, sender, heartbeat.held, new)
        except Exception as exc:  # whatever the store raised: the publish landed, so this is an ack
            # Published but not recorded: the lease expires and the next copy of this
            # content is forwarded once more. Never nack here: that would publish twice now.
            log.error("commit_failed", route=route.name, key=key, fence=held.fence, error=_describe(exc))
            return replace(sent, committed=False)
        if not committed:
            log.warning("commit_refused", route=route.name, key=key, fence=held.fence)
            return replace(sent, committed=False)
        return sent

    def _commit(self, d: Delivery, sender: Sender, held: KeyState, new: KeyState) -> Awaitable[bool]:
        commit = self.store.commit(d.route.name, d.key, held, new)
        # The caller's work has run: its effect is done, so its commit is waited for through the
        # caller's cancel. A publish's commit already is (`_publish_and_commit`).
        return commit if sender.lands_despite_cancel else self._despite_one_cancel(commit)

    async def _release(self, d: Delivery, held: KeyState) -> None:
        """Free the key for the redelivery, to the end through any cancel (`_to_the_end`)."""
        await _to_the_end(self._release_now(d, held))

    async def _release_if_ours(self, d: Delivery, holder: str) -> None:
        try:
            current = await self.store.read(d.route.name, d.key)
        except Exception as exc:  # the lease then lapses by itself; the nack still goes out
            log.error("lease_release_failed", route=d.route.name, key=d.key, error=_describe(exc))
            return
        if current is not None and current.lease is not None and current.lease.holder == holder:
            await self._release_now(d, current)

    async def _release_now(self, d: Delivery, held: KeyState) -> None:
        fence = held.lease.fence if held.lease else held.fence
        try:
            await self.store.release(d.route.name, d.key, held)
        except Exception as exc:  # the lease then lapses by itself; the nack still goes out
            log.error("lease_release_failed", route=d.route.name, key=d.key, fence=fence, error=_describe(exc))
            return
        log.info("lease_released", route=d.route.name, key=d.key, fence=fence)

    async def _publish(self, d: Delivery, sender: Sender, out: Outgoing | None = None) -> str | Worked:
        """Send what a forward sends through `sender`: its id where it went (and a result to keep)."""
        # Everything inside the try: any failure here must become PublishFailed, so the caller
        # releases the lease and the message is nacked, never left holding the key.
        try:
            # with no decision's outgoing (fail-open, shadow) what the destination holds is not
            # known: every `changed_attributes` field is flagged
            own = out.attributes if out is not None else self._every_flag(d.route.name)
            attributes = forward_attributes(d.route.name, d.msg, d.fp, own)
            data = out.data if out is not None else d.msg.data
            if sender.attribute_limits and (
                too_large := unpublishable(d.route.destination, data, attributes, d.msg.ordering_key)
            ):
                raise Unpublishable(too_large)  # the same on every delivery: rejected, never a failing publish
            return await sender.send(d.route.destination, data, attributes, d.msg.ordering_key)
        except PublishFailed:
            raise
        except Exception as exc:  # a publisher bug must still nack, never lose the message
            raise PublishFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _forward_unleased(
        self, d: Delivery, sender: Sender, decision: Decision, reason: str, decided: Decided | None = None
    ) -> Done:
        """Publish with no lease and no commit (shadow mode, fail-open): `decision` once it went out."""
        try:
            # as in `_publish_and_commit`: nothing but the ack would stop this copy's redelivery
            # (the caller's own work excepted: its cancel is the caller's)
            publish = self._publish(d, sender)
            acted = Acted(
                _sent(await (self._despite_one_cancel(publish) if sender.lands_despite_cancel else publish))[0]
            )
        except PublishFailed as exc:
            acted = _failed(exc, sender)
        if acted.failure is not None:
            return Done(_not_sent(acted), f"{reason}; {acted.failure}", d, decided, acted)
        return Done(decision, reason, d, decided, acted)

    async def _store_down(self, d: Delivery, sender: Sender, exc: StoreUnavailable) -> Done:
        route = d.route
        log.error("store_unavailable", route=route.name, key=d.key, error=str(exc), policy=route.on_store_error)
        reason = f"store unavailable: {exc}"
        if route.on_store_error == "retry":
            return Done(Decision.FAILED, reason, d, cause=Cause.STORE)
        done = await self._forward_unleased(d, sender, Decision.FAIL_OPEN, reason)
        if done.decision is Decision.FAIL_OPEN:
            self.failed_open.remember(route.name, d.key, d.fp, d.msg.publish_time, self.clock.now())
        return done

    async def _keyless(self, rules: RouteRules, msg: Message, sender: Sender, missing: MissingField) -> Done:
        """No key, so no state to decide on: forwarded without a lease, or rejected (`filter.core.keyless`)."""
        k = keyless(rules, msg.data, missing)
        message_fp = message_fingerprint(msg.data, msg.attributes)
        d = Delivery(rules.route, msg, "", k.fingerprint, message_fp, k.raw, k.missing)
        return await self._forward_unleased(d, sender, Decision.FAIL_OPEN, k.reason)

    async def _despite_one_cancel(self, work: Awaitable[T]) -> T:
        """`work`'s result, even when cancelled meanwhile: the first cancel is taken back and
        `work` waited for; a second cancel goes through to `work`.

        For what has been acted on, or is being: a publish handed to the publisher (it may land
        after a cancel; the publisher's close flushes it), the commit that records it (the
        commit holding a decision's record is waited for so too, by `recorded`, without a
        shield: its wait is the caller's own). A shutdown's cancel landing there would nack a
        message whose copy is published, or published again on redelivery. Each is bounded by
        its own timeout (the publisher's, the store's), so the wait ends; a shutdown that cannot
        wait cancels twice. `close` waits for such decisions before it closes anything.
        """
        task = asyncio.ensure_future(work)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() or (current := asyncio.current_task()) is None:
                raise
            current.uncancel()
            return await task

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
        """The decision's record, built once, here: recorded, counted and logged."""
        rules = self.rules.get(route_name)
        d, decided, acted = done.delivery, done.decided, done.acted
        rec = DecisionRecord(
            time=self.clock.now(),
            route=route_name,
            decision=done.decision,
            enforced=rules.route.enforced if rules else True,
            message_id=msg.message_id if msg is not None else (message_id or ""),
            key=d.key if d and d.missing is None else None,
            reason=done.reason,
            fingerprint=d.fp if d else None,
            message_fingerprint=d.message_fp if d else None,
            previous_fingerprint=decided.previous_fingerprint if decided else None,
            destination=d.route.destination if d else None,
            published_id=acted.published_id,
            fence=acted.fence,
            # a message not understood is recorded without the time it was published
            publish_time=msg.publish_time if msg is not None and done.decision is not Decision.REJECTED else None,
            delivery_attempt=msg.delivery_attempt if msg is not None else None,
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            trace=trace,
            details=_details(d, decided),
            heartbeats=acted.heartbeats,
            committed=acted.committed,
            cause=done.cause or acted.cause,
        )
        self.recorder.record(rec)
        self.telemetry.decided(rec)  # telemetry: count it, describe it on its span
        _log_decision(rec, self.quieting)
        return rec


def _sent(published: str | Worked) -> tuple[str, str | None]:
    """(the id the record shows, the result to keep with the forward)."""
    return (published.published_id, published.result) if isinstance(published, Worked) else (published, None)


async def _to_the_end(work: Awaitable[None]) -> None:
    """Run `work` to its end through any cancel, then let the cancel go on. For a release: the
    store call is bounded by the store's own budget, and a cancel that cut it short would
    answer (and let a shutdown close the store) with the key still leased."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled or task.cancelled():
        raise asyncio.CancelledError
    task.result()


async def _within(step: str, close: Callable[[], Awaitable[None]], stop: Stop, share: float) -> None:
    """`close()`, given up at the stop's `share`: a step that hangs costs only its own share."""
    try:
        async with asyncio.timeout(stop.left(share)):
            await close()
    except TimeoutError:
        log.error("close_step_cut", step=step, budget_s=stop.budget)


#: A decision abandoned to a cancel: nothing acted on stays (a lease is released).
CANCELLED = Done(
    Decision.FAILED,
    "cancelled before the decision was carried out (a shutdown past its budget, or the caller): nack",
    cause=Cause.CANCELLED,
)


def _failed(exc: PublishFailed, sender: Sender, fence: int | None = None) -> Acted:
    """A publish (or the caller's work) that failed: nack, saying which."""
    failure = f"cannot be forwarded: {exc}" if isinstance(exc, Unpublishable) else f"{sender.cause} failed: {exc}"
    return Acted(fence=fence, cause=sender.cause, failure=failure, error=exc)


def _not_sent(acted: Acted) -> Decision:
    """A forward that did not go out: `rejected` when Pub/Sub could never take it (every delivery
    is answered the same, 4xx), else `failed` (5xx: retried)."""
    return Decision.REJECTED if isinstance(acted.error, Unpublishable) else Decision.FAILED


def _details(d: Delivery | None, decided: Decided | None) -> Mapping[str, Any]:
    """The record's details: the payload's kind, then what the last look at the state found."""
    found = decided.details if decided is not None else {}
    if d is not None and d.missing is not None:
        found = {"missing_field": d.missing, **found}
    if d is None or not d.raw:
        return found
    return {"payload_kind": "raw", **found}


_LEVELS = {
    Decision.FORWARDED: "info",
    Decision.SUPPRESSED: "info",
    Decision.DUPLICATE: "info",
    Decision.CONTENDED: "info",
    Decision.STALE: "warning",
    Decision.NOISE_ONLY: "info",
    Decision.FAIL_OPEN: "error",
    Decision.REJECTED: "warning",
    Decision.FAILED: "error",
}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, StoreUnavailable) else str(exc)


def _log_decision(rec: DecisionRecord, quieting: Mapping[str, Quieting] | None = None) -> None:
    level = line_level(str(rec.decision), _LEVELS[rec.decision], rec.message_id, quieting)
    write_line(log, level, rec)
