"""The replay loop: pull dead letters in batches, replay what is selected, ack what was confirmed.

Everything pulled stays leased while the run lasts (extended every third of the ack
deadline), so the next pull brings new messages; what was not acked is released with
`ModifyAckDeadline(0)` at the end, whatever ended the run (see the package docstring).
"""

from __future__ import annotations

import asyncio
import sys
from typing import IO, Any

from google.api_core import exceptions as gexc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_incrementing

from pubsub_filter.core.config.schema import Config
from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.errors import FilterError, FilterUsageError
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.ports import Publisher, PublishFailed
from pubsub_filter.google.received import received_message
from pubsub_filter.google.shared import TRANSIENT, acknowledge, modify_ack_deadline
from pubsub_filter.replay.deadletter import DeadLetter, ReplayFailure
from pubsub_filter.replay.options import ReplayOptions
from pubsub_filter.replay.progress import Counts, Progress
from pubsub_filter.replay.rate import Pace
from pubsub_filter.replay.targets import Targets

log = get_logger("pubsub_filter.replay")

#: Republishes in flight at once (messages with the same ordering key go one after another).
CONCURRENCY = 32
#: The lease on pulled messages when the subscription's own ack deadline cannot be read.
DEFAULT_ACK_DEADLINE = 60
#: Pull attempts on a transient error before the run stops early.
PULL_ATTEMPTS = 3


class PullFailed(FilterError):
    """The dead-letter subscription could not be read: the run stops early (exit 1)."""


def _log_pull_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning("pull_retry", attempt=state.attempt_number, error=str(error))


class Replayer:
    """One replay run. `publisher` (republish) or `engine` (through the filter) does the work;
    the engine only through its face (`Engine.FACE`: `handle`), its routes from `config`."""

    def __init__(
        self,
        opts: ReplayOptions,
        subscriber: Any,
        publisher: Publisher | None = None,
        engine: Engine | None = None,
        config: Config | None = None,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
    ):
        self.opts = opts
        self.subscriber = subscriber
        self.publisher = publisher
        self.engine = engine
        self.targets = Targets(opts, subscriber, config)
        self.out = out or sys.stdout
        self.counts = Counts()
        self.progress = Progress(err or sys.stderr, self.counts, opts.dry_run, total=opts.max)
        self.pace = Pace(opts.rate)
        self.concurrency = 1 if opts.through_filter else CONCURRENCY
        self.stopping = asyncio.Event()
        self.interrupted = False
        self.error: str | None = None  # why the run stopped early
        self.ack_deadline = DEFAULT_ACK_DEADLINE
        self._seen: set[str] = set()
        self._leased: dict[str, str] = {}  # ack id → message id: pulled here, neither acked nor released yet
        self._to_ack: list[str] = []
        self._taken = 0

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> Counts:
        self.ack_deadline = await self._subscription_ack_deadline()
        helpers = [asyncio.create_task(self._keep_leases()), asyncio.create_task(self._ack_periodically())]
        try:
            await self._drain()
        except PullFailed as exc:
            self.error = str(exc)
            log.error("replay_stopped", error=self.error)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._flush_acks()
            await self._release_all()
            self.progress.finish()
        return self.counts

    async def _drain(self) -> None:
        opts = self.opts
        while not self.stopping.is_set():
            want = opts.batch if opts.max is None else min(opts.batch, opts.max - self._taken)
            if opts.rate is not None and not opts.dry_run:  # about two seconds of work per pull
                want = min(want, max(1, int(opts.rate * 2)))
            if want <= 0:
                break
            received = await self._pull(want)
            for r in received:
                self._leased[r.ack_id] = r.message.message_id
            if not received or self.stopping.is_set():
                break
            fresh = [r for r in received if r.message.message_id not in self._seen]
            if not fresh:  # only messages this run already looked at: nothing new is left
                break
            work = self._select(fresh)
            if opts.dry_run:
                for item in work:
                    await self._list(item)
            else:
                await self._replay_batch(work)
            await self._flush_acks()
            self.progress.update()

    def _select(self, fresh: list[Any]) -> list[DeadLetter]:
        work: list[DeadLetter] = []
        for r in fresh:
            self._seen.add(r.message.message_id)
            item = DeadLetter.from_received(r)
            why = self.opts.selection.excluded(item)
            if why is not None:
                self.counts.filtered_out += 1
                log.debug("filtered_out", message_id=item.message_id, why=why)
                continue
            if self.opts.max is not None and self._taken >= self.opts.max:
                self.counts.left += 1
                continue
            self._taken += 1
            work.append(item)
        return work

    async def _pull(self, want: int) -> list[Any]:
        """One Pull; [] when nothing came within `--wait`. Transient errors are tried PULL_ATTEMPTS
        times; anything else ends the run (what was pulled so far is still acked or released)."""
        request = {"subscription": self.opts.subscription, "max_messages": want}
        retrying = AsyncRetrying(
            stop=stop_after_attempt(PULL_ATTEMPTS),
            wait=wait_incrementing(start=1, increment=1),
            retry=retry_if_exception_type(TRANSIENT),
            before_sleep=_log_pull_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    resp = await asyncio.to_thread(
                        self.subscriber.pull, request=request, timeout=self.opts.wait, retry=None
                    )
        except gexc.DeadlineExceeded:
            return []
        except TRANSIENT as exc:
            raise PullFailed(f"pull from {self.opts.subscription} failed {PULL_ATTEMPTS} times: {exc}") from exc
        except gexc.GoogleAPICallError as exc:
            raise PullFailed(f"pull from {self.opts.subscription} failed: {type(exc).__name__}: {exc.message}") from exc
        return list(resp.received_messages)

    # --- one message ------------------------------------------------------------------------

    async def _list(self, item: DeadLetter) -> None:
        self.counts.would_replay += 1
        try:
            target = await self.targets.describe(item)
            attributes = f"{len(item.replay_attributes())} attributes"
        except ReplayFailure as exc:
            target = f"(cannot be replayed: {exc})"
            attributes = f"{len(item.attributes)} attributes as dead-lettered"
        attempts = f", dead-lettered after {item.delivery_count} attempts" if item.delivery_count else ""
        self.out.write(
            f"would replay {item.message_id}  published {item.original_time_text}  to {target}  "
            f"({len(item.data)} bytes, {attributes}{attempts})\n"
        )
        self.out.flush()

    async def _replay_batch(self, items: list[DeadLetter]) -> None:
        slots = asyncio.Semaphore(self.concurrency)
        tails: dict[str, asyncio.Task[None]] = {}
        tasks: list[asyncio.Task[None]] = []
        for item in items:
            await self.pace.take()
            await slots.acquire()
            if self.stopping.is_set():
                slots.release()
                break
            previous = tails.get(item.ordering_key) if item.ordering_key else None
            task = asyncio.create_task(self._replay_one(item, previous, slots))
            if item.ordering_key:
                tails[item.ordering_key] = task
            tasks.append(task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _replay_one(
        self, item: DeadLetter, previous: asyncio.Task[None] | None, slots: asyncio.Semaphore
    ) -> None:
        try:
            if previous is not None:  # same ordering key: keep the order it was dead-lettered in
                await asyncio.wait([previous])
            if self.opts.through_filter:
                await self._through_filter(item)
            else:
                await self._republish(item)
        except ReplayFailure as exc:
            self._failed(item, str(exc))
        except Exception as exc:  # a bug must not lose the message: it stays dead-lettered
            self._failed(item, f"{type(exc).__name__}: {exc}")
        finally:
            slots.release()
            self.progress.update()

    async def _republish(self, item: DeadLetter) -> None:
        target = await self.targets.topic(item)
        if self.publisher is None:
            raise FilterUsageError("a republishing replay needs a publisher")
        try:
            published = await self.publisher.publish(
                target, item.data, item.replay_attributes(), item.ordering_key or None
            )
        except PublishFailed as exc:
            raise ReplayFailure(str(exc)) from exc
        self.counts.replayed += 1
        self._to_ack.append(item.ack_id)
        log.info("replayed", message_id=item.message_id, target=target, published_id=published)

    async def _through_filter(self, item: DeadLetter) -> None:
        route = self.targets.route_for(item)
        msg = received_message(item, attributes=item.replay_attributes())
        if self.engine is None:
            raise FilterUsageError("a replay through the filter needs an engine")
        handled = await self.engine.handle(route, msg)
        rec = handled.record
        if not answer_for(rec).ack:
            raise ReplayFailure(f"{rec.decision}: {rec.reason}")
        self._to_ack.append(item.ack_id)
        if handled.sent is not None:  # forwarded, failed open, or sent in shadow mode
            self.counts.replayed += 1
        else:
            self.counts.skipped += 1
            self.counts.skipped_by[str(rec.decision)] += 1

    def _failed(self, item: DeadLetter, reason: str) -> None:
        self.counts.failed += 1
        self.counts.failures[reason] += 1
        log.warning("replay_failed", message_id=item.message_id, reason=reason)

    # --- acks and leases ---------------------------------------------------------------------

    async def _subscription_ack_deadline(self) -> int:
        try:
            sub = await asyncio.to_thread(
                self.subscriber.get_subscription, subscription=self.opts.subscription, timeout=30
            )
        except gexc.NotFound:
            raise ReplayFailure(f"dead-letter subscription {self.opts.subscription} does not exist") from None
        except gexc.GoogleAPICallError as exc:  # e.g. no pubsub.subscriptions.get: use a default
            log.warning("ack_deadline_unknown", subscription=self.opts.subscription, error=str(exc))
            return DEFAULT_ACK_DEADLINE
        return max(10, int(sub.ack_deadline_seconds or DEFAULT_ACK_DEADLINE))

    async def _keep_leases(self) -> None:
        """Extend every message this run holds, so none returns to the subscription mid-run."""
        period = max(self.ack_deadline / 3, 1.0)
        while True:
            await asyncio.sleep(period)
            ids = list(self._leased)
            if ids:
                await self._modack(ids, self.ack_deadline, "lease_extension_failed")

    async def _ack_periodically(self, period: float = 0.5) -> None:
        """Ack confirmed replays within `period`: a crash then replays as few as possible twice."""
        while True:
            await asyncio.sleep(period)
            if self._to_ack:
                await self._flush_acks()

    async def _flush_acks(self) -> None:
        ids, self._to_ack = self._to_ack, []
        if not ids:
            return
        failed = await asyncio.to_thread(acknowledge, self.subscriber, self.opts.subscription, ids, 30)
        for count, exc in failed:
            self.counts.ack_failed += count
            log.error("ack_failed", count=count, error=str(exc))
        for ack_id in ids:
            self._leased.pop(ack_id, None)

    async def _release_all(self) -> None:
        ids = list(self._leased)
        self._leased.clear()
        if ids:
            await self._modack(ids, 0, "release_failed")

    async def _modack(self, ids: list[str], seconds: int, event: str) -> None:
        failed = await asyncio.to_thread(modify_ack_deadline, self.subscriber, self.opts.subscription, ids, seconds, 30)
        for count, exc in failed:  # they come back after their ack deadline instead
            log.warning(event, count=count, error=str(exc))
