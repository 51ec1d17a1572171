"""`pubsub-filter replay`: drain a dead-letter subscription back into the pipeline.

Messages are pulled from the dead-letter subscription in batches (synchronous `Pull` with a
short timeout; the run ends at the first pull that brings nothing new) and either

- **republished** (default) to the topic they originally came from: the attributes
  `CloudPubSubDeadLetterSourceSubscription` + `...SourceSubscriptionProject` name the
  subscription that gave up on the message, and that subscription's topic (looked up once
  per subscription) is the target; or to `--to TOPIC`; or
- run **through the filter** (`--through-filter --config FILE`): handed to `Engine.handle`
  for the route whose `subscription` is the source subscription (or `--route NAME`), so the
  engine decides as if the message had just arrived, with its original publish time:
  unchanged content is suppressed, content older than what was forwarded since is
  stopped by the stale guard, and nothing is re-published to the source topic (no
  re-cascade through the source topic's other subscribers).

**What a replayed message carries.** Data, ordering key and attributes are kept, plus:

- `filter_replay_original_message_id`: the id of the message as it sat in the dead-letter
  subscription, or the value already there if the message was replayed before. (Pub/Sub
  does not put the source message's id in the dead-letter attributes; the emulator gives
  the dead-lettered copy a new id.)
- `filter_replay_original_publish_time`: when the content was first published. The
  dead-lettered copy's own publish time is when it was dead-lettered, so this comes from
  an earlier `filter_replay_original_publish_time`, else `CloudPubSubDeadLetterSourceTopicPublishTime`,
  else (no better source) the copy's publish time. `effective_publish_time()` makes it the
  message's publish time for the stale guard, on every surface.
- `filter_replay_count`: 1, or one more than the value already there.

**The `CloudPubSubDeadLetter*` attributes are dropped from the republished message.** They
describe one past dead-lettering, not the message: left in place, a consumer of the source
topic would see a live message dressed as a dead letter, a key or bypass rule on attributes
could match them, and if the message is dead-lettered again Pub/Sub's fresh values would be
mixed with stale ones. What is worth keeping from them (the original publish time, the
dead-lettered id) is carried in the `filter_replay_*` attributes above.

**Nothing is lost.** A dead-lettered message is acked only after its republish is
confirmed by Pub/Sub (or, through the filter, after a decision the push endpoint would
ack). Everything else pulled in this run (filtered out by `--where`/`--since`/`--until`,
beyond `--max`, failed, listed by `--dry-run`) stays leased while the run lasts (so the
next pull brings new messages, not the same ones again) and is released with
`ModifyAckDeadline(0)` at the end. Interrupted at any point (Ctrl-C, SIGTERM, a crash, a
Pub/Sub error), what was not acked returns to the dead-letter subscription (at once if
the process could release it, otherwise after the subscription's ack deadline) and a
rerun carries on. The one window left is a crash between a confirmed republish and its
ack: that message is replayed once more on the next run (at-least-once, like Pub/Sub
itself; the filter then answers the copy as unchanged content).

Ctrl-C (or SIGTERM) once: stop starting new replays, finish the ones under way, ack what
was confirmed, release the rest, print the summary, exit 130. Twice: cancel what is under
way too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import structlog
from tqdm import tqdm

from filter.backends.gcp import NO_CREDENTIALS
from filter.core import times
from filter.core.envelope import ATTR_ORIGINAL_TIME, effective_publish_time
from filter.core.times import format_time, parse_time

log = structlog.get_logger("pubsub_filter.replay")


ATTR_ORIGINAL_ID = "filter_replay_original_message_id"
ATTR_COUNT = "filter_replay_count"

DEAD_LETTER_PREFIX = "CloudPubSubDeadLetter"
DL_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"
DL_PROJECT = "CloudPubSubDeadLetterSourceSubscriptionProject"
DL_PUBLISH_TIME = "CloudPubSubDeadLetterSourceTopicPublishTime"
DL_DELIVERY_COUNT = "CloudPubSubDeadLetterSourceDeliveryCount"

#: Messages per Pull request.
BATCH = 100
#: Republishes in flight at once (messages with the same ordering key go one after another).
CONCURRENCY = 32
#: Ack ids per Acknowledge / ModifyAckDeadline request.
ACK_BATCH = 1000
#: The lease on pulled messages when the subscription's own ack deadline cannot be read.
DEFAULT_ACK_DEADLINE = 60


# --- the original publish time, for every surface -----------------------------------------


def _parses(text: str | None) -> bool:
    if not text:
        return False
    try:
        parse_time(text)
    except ValueError:
        return False
    return True


# --- one dead-lettered message ---------------------------------------------------------------


@dataclass(slots=True)
class DeadLetter:
    ack_id: str
    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    publish_time: float  # when it was dead-lettered (its own publish time in the DLQ)
    publish_time_text: str

    @classmethod
    def from_received(cls, received: Any) -> DeadLetter:
        from filter.backends.gcp import timestamp

        m = received.message
        stamp = m.publish_time
        text = stamp.rfc3339() if hasattr(stamp, "rfc3339") else format_time(timestamp(stamp) or 0.0)
        return cls(
            ack_id=received.ack_id,
            message_id=str(m.message_id),
            data=bytes(m.data),
            attributes=dict(m.attributes),
            ordering_key=m.ordering_key or "",
            publish_time=timestamp(stamp) or 0.0,
            publish_time_text=text,
        )

    @property
    def original_time_text(self) -> str:
        for name in (ATTR_ORIGINAL_TIME, DL_PUBLISH_TIME):
            text = self.attributes.get(name)
            if _parses(text):
                assert text is not None
                return text
        return self.publish_time_text

    @property
    def original_time(self) -> float:
        return parse_time(self.original_time_text)

    @property
    def original_id(self) -> str:
        return self.attributes.get(ATTR_ORIGINAL_ID) or self.message_id

    @property
    def delivery_count(self) -> str | None:
        return self.attributes.get(DL_DELIVERY_COUNT)

    def source_subscription(self) -> str | None:
        """The subscription that dead-lettered it, as a full path (None when the attributes do not say)."""
        sub = self.attributes.get(DL_SUBSCRIPTION)
        if not sub:
            return None
        if sub.startswith("projects/"):
            return sub
        project = self.attributes.get(DL_PROJECT)
        return f"projects/{project}/subscriptions/{sub}" if project else None

    def replay_attributes(self) -> dict[str, str]:
        """The attributes to republish with (see the module docstring)."""
        out = {k: v for k, v in self.attributes.items() if not k.startswith(DEAD_LETTER_PREFIX)}
        out[ATTR_ORIGINAL_ID] = self.original_id
        out[ATTR_ORIGINAL_TIME] = self.original_time_text
        try:
            previous = int(self.attributes.get(ATTR_COUNT, "0"))
        except ValueError:
            previous = 0
        out[ATTR_COUNT] = str(max(previous, 0) + 1)
        return out


# --- filters ------------------------------------------------------------------------------


class UsageError(ValueError):
    """A bad option value: reported with the option's name, exit 2."""


_NOT_JSON: Any = object()


@dataclass(frozen=True, slots=True)
class Where:
    """`attributes.NAME=VALUE`, `payload.a.b=VALUE`, or the same with `!=`."""

    text: str
    path: Any  # filter.core.paths.Path
    value: str
    negate: bool

    @classmethod
    def parse(cls, text: str) -> Where:
        from filter.core.paths import Path, PathError

        m = re.match(r"^\s*([^!=\s]+)\s*(!=|=)(.*)$", text)
        if not m:
            raise UsageError(f"--where {text!r}: write attributes.NAME=VALUE or payload.a.b=VALUE (or !=)")
        try:
            path = Path.parse(m.group(1))
        except PathError as exc:
            raise UsageError(f"--where {text!r}: {exc}") from None
        return cls(text, path, m.group(3), m.group(2) == "!=")

    def holds(self, payload: Any, attributes: Mapping[str, str]) -> bool:
        from filter.core.paths import MISSING

        found = (
            MISSING
            if (self.path.root == "payload" and payload is _NOT_JSON)
            else self.path.resolve(payload, attributes)
        )
        equal = found is not MISSING and _equals(found, self.value)
        return not equal if self.negate else equal


def _equals(found: Any, text: str) -> bool:
    """A field value against the text of a --where: strings as they are, other JSON values as JSON."""
    if isinstance(found, str):
        return found == text
    if isinstance(found, bool) or found is None:
        return json.dumps(found) == text.strip().lower()
    if isinstance(found, (int, float)):
        try:
            return float(text) == float(found)
        except ValueError:
            return False
    try:
        return bool(json.loads(text) == found)
    except ValueError:
        return False


def parse_instant(text: str, now: float, option: str) -> float:
    """`--since`/`--until` → epoch seconds (the grammar of `filter.core.times.parse_instant`)."""
    try:
        return times.parse_instant(text, now)
    except ValueError as exc:
        raise UsageError(f"{option} {exc}") from None


def parse_rate(text: str) -> float:
    """`50/s`, `300/m`, `10000/h` or a plain number (per second) → messages per second."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|m|min|h))?\s*$", text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--rate {text!r}: write messages per second, e.g. 50/s (or 300/m, 10000/h)")
    per = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    return float(m.group(1)) / per


class TokenBucket:
    """At most `rate` per second on average, bursts of up to max(1, rate) (one second's worth)."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.capacity = max(1.0, rate or 1.0)
        self.tokens = self.capacity if rate is None else 1.0
        self.clock = clock
        self.last = clock()

    async def take(self) -> None:
        if self.rate is None:
            return
        while True:
            now = self.clock()
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return
            await asyncio.sleep((1.0 - self.tokens) / self.rate)


# --- counts and progress ---------------------------------------------------------------------


@dataclass
class Counts:
    replayed: int = 0  # republished, or forwarded by the filter
    skipped: int = 0  # through the filter: acked without a publish (suppressed, duplicate, stale)
    filtered_out: int = 0  # --where / --since / --until: left in the dead-letter subscription
    left: int = 0  # beyond --max: left for a later run
    failed: int = 0  # not replayed now: left in the dead-letter subscription
    would_replay: int = 0  # --dry-run
    ack_failed: int = 0  # replayed, but the ack did not go through: may be replayed again
    skipped_by: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


class Progress:
    """On a terminal, a tqdm bar: done out of `total` (`--max`) with rate and ETA, or a
    counter with its rate when the total is unknown (Pub/Sub does not tell a subscription's
    backlog). Elsewhere (a pipe, a log file), a plain line every `interval` seconds."""

    def __init__(self, stream: IO[str], counts: Counts, dry_run: bool, interval: float = 5.0, total: int | None = None):
        self.stream = stream
        self.counts = counts
        self.dry_run = dry_run
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.interval = interval
        self.started = time.monotonic()
        self._last = 0.0
        self._bar: tqdm[Any] | None = None
        if self.tty:
            self._bar = tqdm(
                total=total,
                file=stream,
                desc="dry run" if dry_run else "replay",
                unit="msg",
                dynamic_ncols=True,
                mininterval=0.1,
                smoothing=0.1,
            )

    def _done(self) -> int:
        c = self.counts
        return c.would_replay if self.dry_run else c.replayed + c.skipped

    def _others(self) -> list[str]:
        c = self.counts
        parts = []
        if c.skipped:
            parts.append(f"{c.skipped} skipped by the filter")
        parts.append(f"{c.filtered_out} filtered out")
        parts.append(f"{c.failed} failed")
        return parts

    def line(self) -> str:
        c = self.counts
        elapsed = max(time.monotonic() - self.started, 1e-9)
        head = f"{c.would_replay} would be replayed" if self.dry_run else f"{c.replayed} replayed"
        parts = [head, *self._others()]
        return f"replay: {', '.join(parts)} | {self._done() / elapsed:.1f} msg/s | {elapsed:.0f}s"

    def update(self, force: bool = False) -> None:
        bar = self._bar
        if bar is not None:
            bar.set_postfix_str(", ".join(self._others()), refresh=False)
            bar.update(self._done() - bar.n)  # tqdm throttles redraws itself (mininterval)
            if force:
                bar.refresh()
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._bar is not None:
            self.update(force=True)
            self._bar.close()


# --- the replay --------------------------------------------------------------------------------


@dataclass
class ReplayOptions:
    subscription: str  # full path of the dead-letter subscription
    project: str
    to: str | None = None  # full topic path
    dry_run: bool = False
    max: int | None = None
    where: list[Where] = field(default_factory=list)
    since: float | None = None
    until: float | None = None
    rate: float | None = None
    wait: float = 5.0
    batch: int = BATCH
    through_filter: bool = False
    route: str | None = None


class ReplayFailure(Exception):
    """This message cannot be replayed now; the reason is counted and it stays dead-lettered."""


class PullFailed(Exception):
    """The dead-letter subscription could not be read: the run stops early (exit 1)."""


class Replayer:
    """One replay run. `publisher` (republish) or `engine` (through the filter) does the work."""

    def __init__(
        self,
        opts: ReplayOptions,
        subscriber: Any,
        publisher: Any = None,
        engine: Any = None,
        config: Any = None,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
    ):
        self.opts = opts
        self.subscriber = subscriber
        self.publisher = publisher
        self.engine = engine
        self.config = config if config is not None else getattr(engine, "config", None)
        self.out = out or sys.stdout
        self.counts = Counts()
        self.progress = Progress(err or sys.stderr, self.counts, opts.dry_run, total=opts.max)
        self.bucket = TokenBucket(opts.rate)
        self.concurrency = 1 if opts.through_filter else CONCURRENCY
        self.stopping = asyncio.Event()
        self.interrupted = False
        self.error: str | None = None  # why the run stopped early
        self.ack_deadline = DEFAULT_ACK_DEADLINE
        self._seen: set[str] = set()
        self._leased: dict[str, str] = {}  # ack id → message id: pulled here, neither acked nor released yet
        self._to_ack: list[str] = []
        self._topics: dict[str, asyncio.Future[str]] = {}
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
            work: list[DeadLetter] = []
            for r in fresh:
                self._seen.add(r.message.message_id)
                item = DeadLetter.from_received(r)
                why = self._excluded(item)
                if why is not None:
                    self.counts.filtered_out += 1
                    log.debug("filtered_out", message_id=item.message_id, why=why)
                    continue
                if opts.max is not None and self._taken >= opts.max:
                    self.counts.left += 1
                    continue
                self._taken += 1
                work.append(item)
            if opts.dry_run:
                for item in work:
                    await self._list(item)
            else:
                await self._replay_batch(work)
            await self._flush_acks()
            self.progress.update()

    async def _pull(self, want: int) -> list[Any]:
        """One Pull; [] when nothing came within `--wait`. Transient errors are tried 3 times;
        anything else ends the run (what was pulled so far is still acked or released)."""
        from google.api_core import exceptions as gexc

        from filter.backends.gcp import TRANSIENT

        request = {"subscription": self.opts.subscription, "max_messages": want}
        for attempt in range(1, 4):
            try:
                resp = await asyncio.to_thread(
                    self.subscriber.pull, request=request, timeout=self.opts.wait, retry=None
                )
            except gexc.DeadlineExceeded:
                return []
            except TRANSIENT as exc:
                if attempt == 3:
                    raise PullFailed(f"pull from {self.opts.subscription} failed 3 times: {exc}") from exc
                log.warning("pull_retry", attempt=attempt, error=str(exc))
                await asyncio.sleep(attempt)
            except gexc.GoogleAPICallError as exc:
                raise PullFailed(
                    f"pull from {self.opts.subscription} failed: {type(exc).__name__}: {exc.message}"
                ) from exc
            else:
                return list(resp.received_messages)
        return []

    def _excluded(self, item: DeadLetter) -> str | None:
        opts = self.opts
        if opts.since is not None or opts.until is not None:
            t = item.original_time
            if opts.since is not None and t < opts.since:
                return "--since"
            if opts.until is not None and t >= opts.until:
                return "--until"
        if opts.where:
            try:
                payload: Any = json.loads(item.data)
            except ValueError:
                payload = _NOT_JSON
            for w in opts.where:
                if not w.holds(payload, item.attributes):
                    return f"--where {w.text}"
        return None

    # --- one message ------------------------------------------------------------------------

    async def _list(self, item: DeadLetter) -> None:
        self.counts.would_replay += 1
        try:
            target = await self._describe_target(item)
        except ReplayFailure as exc:
            target = f"(cannot be replayed: {exc})"
        attempts = f", dead-lettered after {item.delivery_count} attempts" if item.delivery_count else ""
        self.out.write(
            f"would replay {item.message_id}  published {item.original_time_text}  to {target}  "
            f"({len(item.data)} bytes, {len(item.replay_attributes())} attributes{attempts})\n"
        )
        self.out.flush()

    async def _replay_batch(self, items: list[DeadLetter]) -> None:
        slots = asyncio.Semaphore(self.concurrency)
        tails: dict[str, asyncio.Task[None]] = {}
        tasks: list[asyncio.Task[None]] = []
        for item in items:
            await self.bucket.take()
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
        from filter.core.ports import PublishFailed

        target = await self._target(item)
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
        from filter.core.model import Decision, Message

        route = self._route_for(item)
        attributes = item.replay_attributes()
        msg = Message(
            data=item.data,
            attributes=attributes,
            message_id=item.message_id,
            publish_time=effective_publish_time(attributes, item.publish_time),
            ordering_key=item.ordering_key or None,
        )
        rec = await self.engine.handle(route, msg)
        if not rec.acked:
            raise ReplayFailure(f"{rec.decision}: {rec.reason}")
        self._to_ack.append(item.ack_id)
        if rec.published_id or rec.decision in (Decision.FORWARDED, Decision.FAIL_OPEN):
            self.counts.replayed += 1
        else:
            self.counts.skipped += 1
            self.counts.skipped_by[str(rec.decision)] += 1

    def _failed(self, item: DeadLetter, reason: str) -> None:
        self.counts.failed += 1
        self.counts.failures[reason] += 1
        log.warning("replay_failed", message_id=item.message_id, reason=reason)

    # --- where to ------------------------------------------------------------------------------

    def _route_for(self, item: DeadLetter) -> str:
        if self.opts.route:
            return self.opts.route
        source = item.source_subscription()
        if source is None:
            raise ReplayFailure(f"no {DL_SUBSCRIPTION} attribute to find its route: pass --route")
        routes = self.config.routes if self.config is not None else []
        for route in routes:
            sub = route.subscription
            if sub and (sub == source or ("/" not in sub and source.rsplit("/", 1)[-1] == sub)):
                return str(route.name)
        raise ReplayFailure(f"no route has subscription {source}: pass --route")

    async def _describe_target(self, item: DeadLetter) -> str:
        if self.opts.through_filter:
            return f"route {self._route_for(item)!r} (through the filter)"
        return await self._target(item)

    async def _target(self, item: DeadLetter) -> str:
        if self.opts.to:
            return self.opts.to
        source = item.source_subscription()
        if source is None:
            raise ReplayFailure(f"no {DL_SUBSCRIPTION}/{DL_PROJECT} attributes to find its topic: pass --to TOPIC")
        lookup = self._topics.get(source)
        if lookup is None:
            lookup = asyncio.ensure_future(self._topic_of(source))
            self._topics[source] = lookup
        return await asyncio.shield(lookup)

    async def _topic_of(self, subscription: str) -> str:
        from google.api_core import exceptions as gexc

        try:
            sub = await asyncio.to_thread(self.subscriber.get_subscription, subscription=subscription, timeout=30)
        except gexc.NotFound:
            raise ReplayFailure(f"source subscription {subscription} no longer exists: pass --to TOPIC") from None
        except gexc.GoogleAPICallError as exc:
            raise ReplayFailure(f"cannot read source subscription {subscription}: {exc.message}") from None
        topic = str(sub.topic)
        if not topic or topic == "_deleted-topic_":
            raise ReplayFailure(f"the topic of {subscription} was deleted: pass --to TOPIC")
        return topic

    # --- acks and leases ---------------------------------------------------------------------

    async def _subscription_ack_deadline(self) -> int:
        from google.api_core import exceptions as gexc

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
        for i in range(0, len(ids), ACK_BATCH):
            chunk = ids[i : i + ACK_BATCH]
            try:
                await asyncio.to_thread(
                    self.subscriber.acknowledge,
                    request={"subscription": self.opts.subscription, "ack_ids": chunk},
                    timeout=30,
                )
            except Exception as exc:
                self.counts.ack_failed += len(chunk)
                log.error("ack_failed", count=len(chunk), error=str(exc))
            for ack_id in chunk:
                self._leased.pop(ack_id, None)

    async def _release_all(self) -> None:
        ids = list(self._leased)
        self._leased.clear()
        if ids:
            await self._modack(ids, 0, "release_failed")

    async def _modack(self, ids: list[str], seconds: int, event: str) -> None:
        for i in range(0, len(ids), ACK_BATCH):
            chunk = ids[i : i + ACK_BATCH]
            try:
                await asyncio.to_thread(
                    self.subscriber.modify_ack_deadline,
                    request={
                        "subscription": self.opts.subscription,
                        "ack_ids": chunk,
                        "ack_deadline_seconds": seconds,
                    },
                    timeout=30,
                )
            except Exception as exc:  # they come back after their ack deadline instead
                log.warning(event, count=len(chunk), error=str(exc))


# --- the command ---------------------------------------------------------------------------------


def summary(counts: Counts, opts: ReplayOptions, elapsed: float, interrupted: bool, error: str | None = None) -> str:
    lines = []
    head = f"replay of {opts.subscription}"
    if interrupted:
        head += " (interrupted)"
    lines.append(head + f": {elapsed:.1f}s")
    if error:
        lines.append(f"  stopped early:         {error}")
    if opts.dry_run:
        lines.append(f"  would be replayed:     {counts.would_replay}")
    else:
        rate = counts.replayed / elapsed if elapsed > 0 else 0.0
        lines.append(f"  replayed:              {counts.replayed} ({rate:.1f} msg/s)")
        if opts.through_filter:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.skipped_by.items()))
            lines.append(f"  skipped by the filter: {counts.skipped}" + (f" ({detail})" if detail else ""))
    lines.append(f"  filtered out:          {counts.filtered_out} (--where/--since/--until: left in place)")
    if counts.left:
        lines.append(f"  not taken (--max):     {counts.left} (left for a later run)")
    lines.append(f"  failed:                {counts.failed}" + (" (left in place)" if counts.failed else ""))
    for reason, n in counts.failures.most_common(5):
        lines.append(f"    {n} x {reason}")
    if counts.ack_failed:
        lines.append(f"  ack failed:            {counts.ack_failed} (replayed; may be replayed again by a rerun)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """`pubsub-filter replay`: parse the options, replay, print the summary."""
    from filter.core.config import load
    from filter.observability.logsetup import configure

    prog = "pubsub-filter replay"
    configure(level=os.environ.get("LOG_LEVEL") or ("info" if args.verbose else "warning"), stream=sys.stderr)
    cfg = load(args.config) if args.config else None
    try:
        opts = _options(args, cfg)
    except UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    import google.cloud.pubsub_v1 as pubsub_v1
    from google.auth.exceptions import DefaultCredentialsError

    publisher: Any = None
    engine: Any = None
    try:
        subscriber = pubsub_v1.SubscriberClient()
        if opts.through_filter and not opts.dry_run:
            from filter.runtime.wiring import make_engine, make_telemetry

            assert cfg is not None
            engine = make_engine(cfg, make_telemetry(cfg))
        elif not opts.dry_run:
            from filter.backends.publishers.pubsub import PubsubPublisher

            timeout = cfg.publisher.timeout if cfg is not None and cfg.publisher.backend == "pubsub" else 30.0
            publisher = PubsubPublisher(project=opts.project, timeout=timeout)
    except DefaultCredentialsError as exc:
        print(f"{prog}: {NO_CREDENTIALS} ({exc})", file=sys.stderr)
        return 1
    replayer = Replayer(opts, subscriber, publisher=publisher, engine=engine, config=cfg)
    started = time.monotonic()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        work = asyncio.create_task(replayer.run())

        def on_signal() -> None:
            replayer.interrupted = True
            if replayer.stopping.is_set():
                work.cancel()
            replayer.stopping.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        try:
            await work
        except ReplayFailure as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        except asyncio.CancelledError:
            replayer.interrupted = True
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await _close(publisher, engine)
        return -1

    try:
        code = asyncio.run(main())
    finally:
        subscriber.close()
    if code == 2:
        return 2
    counts = replayer.counts
    print(summary(counts, opts, time.monotonic() - started, replayer.interrupted, replayer.error))
    if replayer.interrupted:
        return 130
    return 1 if counts.failed or counts.ack_failed or replayer.error else 0


async def _close(publisher: Any, engine: Any) -> None:
    if publisher is not None:
        await publisher.close()
    if engine is not None:
        await engine.close()  # replay's metrics and spans leave over OTLP, before exit


def _options(args: argparse.Namespace, cfg: Any) -> ReplayOptions:
    from filter.backends.gcp import resolve_project

    project = resolve_project(args.project or (cfg.project if cfg is not None else None))
    route = None
    if args.route:
        if cfg is None:
            raise UsageError("--route needs --config")
        r = cfg.route(args.route)
        if r is None:
            raise UsageError(f"--route: no route {args.route!r} in the config")
        route = r
    subscription = args.subscription
    if not subscription:
        if route is None or not route.subscription:
            raise UsageError(
                "name the dead-letter subscription, or give --config and --route of a route with a subscription "
                "(its dead-letter subscription is <subscription>-dlq-sub, as `pubsub-filter provision` creates it)"
            )
        subscription = f"{route.subscription}-dlq-sub"
    if args.through_filter:
        if cfg is None:
            raise UsageError("--through-filter needs --config: the routes and backends the decisions use")
        if args.to:
            raise UsageError("--to and --through-filter exclude each other")
    if args.max is not None and args.max < 1:
        raise UsageError("--max must be at least 1")
    if args.wait <= 0:
        raise UsageError("--wait must be positive")
    now = time.time()
    return ReplayOptions(
        subscription=_path(subscription, project, "subscriptions"),
        project=project,
        to=_path(args.to, project, "topics") if args.to else None,
        dry_run=args.dry_run,
        max=args.max,
        where=[Where.parse(w) for w in args.where],
        since=parse_instant(args.since, now, "--since") if args.since else None,
        until=parse_instant(args.until, now, "--until") if args.until else None,
        rate=parse_rate(args.rate) if args.rate else None,
        wait=args.wait,
        through_filter=args.through_filter,
        route=route.name if route is not None else None,
    )


def _path(name: str, project: str, kind: str) -> str:
    if name.startswith("projects/"):
        if not re.match(rf"^projects/[^/]+/{kind}/[^/]+$", name):
            raise UsageError(f"{name!r} is not a projects/PROJECT/{kind}/NAME path")
        return name
    if "/" in name:
        raise UsageError(f"{name!r}: give an id or a projects/PROJECT/{kind}/NAME path")
    return f"projects/{project}/{kind}/{name}"
