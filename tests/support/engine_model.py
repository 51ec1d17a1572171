"""A reference model of the README's decision table, and a state machine that drives the real engine with it.

`ReferenceModel` is the README's table in plain Python, written from the README and not
from `pubsub_filter.core.engine.engine`: per (route, key) the last forward, the recent message ids, the lease
and the fence, with contents named by small integers instead of fingerprints. It knows
nothing of SQLite, Firestore or the engine's code.

`EngineMachine` (a hypothesis `RuleBasedStateMachine`) sends the same random history to
the real `Engine` and to the model: new messages with a few contents per key, redeliveries
of old message ids, old message ids reused with other content (a caller's request id),
forwards held in flight while other deliveries arrive (two engine instances sharing one store),
in-flight forwards killed before or after their publish
landed, store outages, failing publishes, clock jumps past the window, the lease and the
state TTL, shadow, row-mode and bypass routes, messages without their key field, and a route
with a tolerance on a price that walks with jumps (`price_walk`). After every step it checks:

- the decision is the model's;
- nothing acked was lost: an acked forward was published, an acked suppression or
  duplicate names content that reached the destination, an acked stale message is older
  than what was forwarded;
- no message is published again once it was acked (except where the README says a copy
  may repeat: fail-open, a kill after the publish landed, a commit that could not land);
- a shadow route publishes each delivery it acks exactly once;
- a message without its key is forwarded fail-open (or fails, and comes back), never
  suppressed, never leased, and nothing is stored for it;
- on the tolerance route: no suppression hid a move beyond tolerance of what the destination
  holds, every forward of a change was needed (a field beyond tolerance of the previous
  forward's values, or another change), and a forward flags exactly the fields that changed
  (every field when it cannot know what the destination holds);
- after a drain (every unacked message redelivered in publish-time order, faults off), the
  destination ends on the newest content of every key.

`STEPS` counts the steps run, per backend; the suite prints it at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pubsub_filter.core.attributes import ATTR_ROUTE, ATTR_SOURCE_ID, CHANGED_PREFIX
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.transitions import RECENT
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from pubsub_filter.core.ports import PublishFailed, StateStore
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryRecorder, SwitchStore

STEPS: Counter[str] = Counter()
#: Suppressions as moved within tolerance, per backend: the suite checks the path was taken.
TOLERATED: Counter[str] = Counter()

#: The attribute a message reusing another's id carries (forwarded with it): its `Sent.token`.
MODEL_UID = "model_uid"

LEASE = 120.0
WINDOW = 3600.0
TTL = 86400.0
KEYS = ("a", "b")
#: The key of a message without its key field (a producer renamed it): no state, forwarded fail-open.
KEYLESS = ""
CONTENTS = (0, 1, 2)

#: The route with a tolerance on `price`: its contents are (price, status) pairs (`Values`).
TOLERANCE = "tolerance"
PRICE_TOLERANCE = 12
#: A tolerance route's first contents, as (price, status); price walks add more (`price_walk`).
FIRST_VALUES = {0: (100, "a"), 1: (106, "a"), 2: (100, "b")}

ROUTES: list[dict[str, Any]] = [
    {"name": "enforce", "destination": "out-enforce", "key": ["payload.k"], "exclude": ["noise"], "window": "1h"},
    {
        "name": "retry",
        "destination": "out-retry",
        "key": ["payload.k"],
        "exclude": ["noise"],
        "on_store_error": "retry",
    },
    {"name": "shadow", "destination": "out-shadow", "key": ["payload.k"], "exclude": ["noise"], "mode": "shadow"},
    {
        "name": "rows",
        "destination": "out-rows",
        "key": ["payload.k"],
        "rows": "payload.rows",
        "row_key": ["id"],
        "exclude": ["noise"],
        "rows_mode": "changed",
    },
    {
        "name": "bypass",
        "destination": "out-bypass",
        "key": ["payload.k"],
        "exclude": ["noise"],
        "bypass": {"field": "payload.live", "equals": True},
    },
    {
        "name": TOLERANCE,
        "destination": "out-tolerance",
        "key": ["payload.k"],
        "exclude": ["noise"],
        "tolerance": {"price": PRICE_TOLERANCE},
        "changed_attributes": ["price", "s"],
    },
]
ROUTE_NAMES = tuple(r["name"] for r in ROUTES)
#: Routes whose destination must end on the newest content: not shadow (publishes in delivery
#: order), not bypass (always forwards, older content too), not rows (forwards a part), not
#: tolerance (a move within tolerance of what the destination holds is not forwarded).
NEWEST_WINS = ("enforce", "retry")


def config() -> Config:
    return parse(
        {
            "routes": ROUTES,
            "lease": {"duration": f"{LEASE:g}s", "ack_deadline": "60s", "heartbeat": "50s"},
            "state_ttl": "1d",
            "store_errors": {"timeout": "2s", "budget": "4s"},
        }
    )


class Values(dict[int, tuple[int, str]]):
    """A tolerance route's contents: content number → (price, status), numbered as they appear."""

    def __init__(self) -> None:
        super().__init__(FIRST_VALUES)

    def content(self, value: tuple[int, str]) -> int:
        for c, v in self.items():
            if v == value:
                return c
        self[len(self)] = value
        return len(self) - 1

    def within(self, last: int, new: int) -> bool:
        """`new` differs from `last` only by a price move within tolerance (the README's rule)."""
        (p0, s0), (p1, s1) = self[last], self[new]
        return s0 == s1 and abs(p1 - p0) <= PRICE_TOLERANCE

    def changed(self, last: int | None, new: int) -> set[str]:
        """The flags a forward of `new` carries after a forward of `last` (None: unknown: all)."""
        if last is None:
            return {"price", "s"}
        (p0, s0), (p1, s1) = self[last], self[new]
        return ({"price"} if abs(p1 - p0) > PRICE_TOLERANCE else set()) | ({"s"} if s0 != s1 else set())


def payload(route: str, key: str, content: int, noise: int, values: Values | None = None) -> bytes:
    """Three contents per key. On `rows`: distinct rows, rows sharing a key, a row that is not an object.
    On the tolerance route: a price and a status (`values`). A `KEYLESS` message has no key field.
    Every third message's noise is beyond double range (`4e400`)."""
    body: dict[str, Any]
    if route == TOLERANCE:
        price, status = (values or Values())[content]
        body = {"k": key, "price": price, "s": status, "noise": noise}
    elif route == "rows":
        rows: list[Any] = [
            [{"id": 1, "s": "a", "noise": noise}, {"id": 2, "s": "b", "noise": noise}],
            [{"id": 1, "s": "a", "noise": noise}, {"id": 1, "s": "x", "noise": noise}],
            [{"id": 1, "s": "a", "noise": noise}, "note"],
        ][content]
        body = {"k": key, "rows": rows, "noise": noise}
    else:
        body = {"k": key, "v": content, "noise": noise}
        if route == "bypass":
            body["live"] = content == 2
    if key == KEYLESS:
        del body["k"]
    data = json.dumps(body).encode()
    if noise % 3 == 1:
        # now and then the noise is a number beyond double range (valid JSON no double holds):
        # left out by every route, it counts no more than other noise (`fingerprint._by_value`)
        data = data.replace(b'"noise": %d' % noise, b'"noise": %de400' % noise)
    return data


# --- the reference model ---------------------------------------------------------------------


@dataclass
class MLease:
    fence: int
    content: int
    message_id: str
    expires_at: float


@dataclass
class MKey:
    content: int | None = None
    forwarded_at: float | None = None
    publish_time: float | None = None
    recent: list[tuple[str, int]] = field(default_factory=list)  # (message id, content): a redelivery is both
    fence: int = 0
    lease: MLease | None = None
    expires_at: float | None = None
    # Expired state may have been deleted (SQLite purge, Firestore TTL): then the store's fence
    # starts again from 1. The model follows the store's numbering at the next forward.
    renumbered: bool = False


@dataclass
class Sent:
    id: str
    route: str
    key: str
    content: int
    data: bytes
    publish_time: float
    acked: bool = False
    retired: bool = False  # older than the state TTL: Pub/Sub no longer redelivers it
    uid: str = ""  # set on a message that reuses another's id: what tells their publishes apart

    @property
    def token(self) -> str:
        """This message among all sent, even when its id is another's (what the publisher records)."""
        return self.uid or self.id


class ReferenceModel:
    """The README's decision table over (route, key) → MKey.

    `MKey.content` None with a forward on record means what the destination holds is
    unknown. Each engine remembers the keys it forwarded fail-open (`failed_open`) and
    decides them as unknown until a claim of its own on the key lands.
    """

    def __init__(self, values: Values | None = None) -> None:
        self.values = values or Values()
        #: On the tolerance route, the content the last decision compared with when it was a
        #: change the destination is known not to hold (None: not known; a forward flags all).
        self.known: int | None = None
        self.keys: dict[tuple[str, str], MKey] = {}
        self.failed_open: dict[int, dict[tuple[str, str], tuple[int, float]]] = {0: {}, 1: {}}

    def fail_open(self, engine: int, route: str, key: str, content: int, publish_time: float) -> None:
        known = self.failed_open[engine].get((route, key))
        self.failed_open[engine][(route, key)] = (content, max(publish_time, known[1]) if known else publish_time)

    def view(self, engine: int, route: str, key: str, now: float) -> tuple[int | None, float | None]:
        """The stored content and publish time as `engine` decides on them: after its fail-open,
        the fail-open's publish time if newer, and content None (unknown) if it was other content."""
        k = self.state(route, key, now)
        sent = self.failed_open[engine].get((route, key))
        if sent is None:
            return k.content, k.publish_time
        publish_time = k.publish_time if k.publish_time is not None and k.publish_time >= sent[1] else sent[1]
        return (None if k.content is not None and sent[0] != k.content else k.content), publish_time

    def state(self, route: str, key: str, now: float) -> MKey:
        k = self.keys.get((route, key))
        if k is None:
            k = self.keys[(route, key)] = MKey()
        elif k.expires_at is not None and k.expires_at <= now:  # expired: only the fence and lease remain
            k = self.keys[(route, key)] = MKey(fence=k.fence, lease=k.lease, renumbered=True)
        return k

    def judge(self, route: str, m: Sent, now: float, engine: int) -> Decision:
        self.known = None
        content, publish_time = self.view(engine, route, m.key, now)
        k = self.state(route, m.key, now)
        if (m.id, m.content) in k.recent:  # a redelivery: this id, forwarded with this content
            return Decision.DUPLICATE
        if k.lease is not None and k.lease.expires_at > now:
            if k.lease.message_id == m.id:
                return Decision.CONTENDED
            return Decision.DUPLICATE if k.lease.content == m.content else Decision.CONTENDED
        if route == "bypass" and m.content == 2:
            return Decision.FORWARDED
        if content is None and k.forwarded_at is None:
            return Decision.FORWARDED
        older = publish_time is not None and m.publish_time < publish_time
        # A holder whose lease lapsed may have published its content: the destination may not
        # hold what the state says, so equal content is no reason to suppress.
        dead_other = k.lease is not None and k.lease.content != content
        if dead_other and m.content == content:
            return Decision.FORWARDED
        if m.content == content:
            if route != "enforce" or k.forwarded_at is None or now - k.forwarded_at < WINDOW:
                return Decision.SUPPRESSED
            if not older:
                return Decision.FORWARDED
        if older:
            return Decision.STALE
        if route == TOLERANCE and content is not None and not dead_other:
            # the destination holds the last forward: a move within tolerance of it is no change
            self.known = content
            if self.values.within(content, m.content):
                return Decision.SUPPRESSED
        return Decision.FORWARDED

    def claim(self, route: str, m: Sent, now: float, engine: int) -> int:
        content, publish_time = self.view(engine, route, m.key, now)
        k = self.state(route, m.key, now)
        k.publish_time = publish_time
        # Taking over a lease of other content (or after our fail-open): downstream is unknown.
        k.content = None if k.lease is not None and k.lease.content != content else content
        self.failed_open[engine].pop((route, m.key), None)
        k.fence += 1
        k.lease = MLease(k.fence, m.content, m.id, now + LEASE)
        k.expires_at = max(k.expires_at or 0.0, now + TTL)
        return k.fence

    def commit(self, route: str, m: Sent, fence: int, now: float) -> bool:
        k = self.keys[(route, m.key)]
        if k.lease is None or k.lease.fence != fence:
            return False
        k.content, k.forwarded_at, k.publish_time = m.content, now, m.publish_time
        k.recent = [*k.recent, (m.id, m.content)][-RECENT:]
        k.lease, k.expires_at = None, now + TTL
        return True

    def release(self, route: str, m: Sent, fence: int) -> None:
        k = self.keys[(route, m.key)]
        if k.lease is not None and k.lease.fence == fence:
            k.lease = None


# --- the engine's collaborators for the machine ---------------------------------------------


class Killed(BaseException):
    """The process died here: nothing after this line of the engine runs (no release, no record)."""


class HeldPublisher:
    """Publishes at once, fails the next publish when armed, or holds one message's publish
    until the test says how it ends: `ok`, `fail`, `kill_before` or `kill_after` (it landed)."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, bytes]] = []  # (route, source message id, data)
        self.flags: list[set[str]] = []  # the `filter_changed_*` flags of each of `published`
        self.fail_next = False
        self.hold: set[str] = set()
        self.held: dict[str, asyncio.Future[str]] = {}
        self.reached = asyncio.Event()
        self._ids = itertools.count(1)

    def _land(self, data: bytes, attributes: Mapping[str, str]) -> str:
        source = attributes.get(MODEL_UID) or attributes[ATTR_SOURCE_ID]  # a reused id: the message's own token
        self.published.append((attributes[ATTR_ROUTE], source, data))
        self.flags.append({k.removeprefix(CHANGED_PREFIX) for k in attributes if k.startswith(CHANGED_PREFIX)})
        return str(next(self._ids))

    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        source = attributes[ATTR_SOURCE_ID]
        if source in self.hold:
            self.hold.discard(source)
            future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self.held[source] = future
            self.reached.set()
            outcome = await future
            if outcome == "fail":
                raise PublishFailed("held publish failed")
            if outcome == "kill_before":
                raise Killed
            published = self._land(data, attributes)
            if outcome == "kill_after":
                raise Killed
            return published
        if self.fail_next:
            self.fail_next = False
            raise PublishFailed("injected publish failure")
        return self._land(data, attributes)

    async def ping(self) -> None:
        pass

    async def close(self) -> None:
        pass


@dataclass
class InFlight:
    sent: Sent
    task: asyncio.Task[DecisionRecord]
    fence: int


#: Builds the store for one run: (config, clock, scratch dir) → (the engine's store, the fault switch in it).
StoreFactory = Callable[[Config, ManualClock, Path], tuple[StateStore, SwitchStore]]


class EngineMachine(RuleBasedStateMachine):
    """Subclassed per backend with `backend` and `make_store` set."""

    backend = "sqlite"
    make_store: StoreFactory

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="engine-model-"))
        self.config = config()
        self.clock = ManualClock()
        self.publisher = HeldPublisher()
        self.recorder = MemoryRecorder()
        self.engine_store, self.store = type(self).make_store(self.config, self.clock, self.dir)
        self.engines = [
            Engine(self.config, self.engine_store, self.publisher, self.recorder, self.clock, instance)
            for instance in ("one", "two")
        ]
        self.values = Values()
        self.model = ReferenceModel(self.values)
        self.sent: list[Sent] = []
        self.in_flight: list[InFlight] = []
        self.exempt: set[str] = set()  # ids the README allows to be published once more
        # Keys one engine decided while the other remembered a fail-open on them (only the engine
        # that forwarded fail-open knows the destination moved, and when the content it sent was
        # published), or where an older message failed open after a newer one (README: fail-open),
        # until a committed forward of the key's newest message.
        self.failed_open: set[tuple[str, str]] = set()
        # Keys where a message was acked while an older one was not: Pub/Sub with message ordering
        # never does that, and without it the newest content need not win (README: ordering).
        self.out_of_order: set[tuple[str, str]] = set()
        self._ids = itertools.count(1)
        self._noise = itertools.count()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        for held in self.publisher.held.values():
            held.cancel()  # a publish abandoned: a forward's first cancel waits for its publish
        for f in self.in_flight:
            f.task.cancel()
        if self.in_flight:
            self.run(asyncio.gather(*(f.task for f in self.in_flight), return_exceptions=True))
        self.run(self.engine_store.close())
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------------

    def _new(self, route: str, key: str, content: int) -> Sent:
        self.clock.advance(0.001)  # every message has its own publish time: "newest" is well defined
        mid = f"m{next(self._ids)}"
        data = payload(route, key, content, next(self._noise), self.values)
        sent = Sent(mid, route, key, content, data, self.clock.now())
        self.sent.append(sent)
        return sent

    def _message(self, sent: Sent) -> Message:
        return Message(sent.data, {MODEL_UID: sent.uid} if sent.uid else {}, sent.id, publish_time=sent.publish_time)

    def _publishes(self, mid: str) -> int:
        return sum(1 for _, source, _ in self.publisher.published if source == mid)

    def _expect(self, sent: Sent, engine: int) -> tuple[Decision, int | None]:
        """The model's decision for a delivery that runs to its end now, applied to the model."""
        now = self.clock.now()
        route = sent.route
        if sent.key == KEYLESS:  # no key, no state: forwarded without a lease, whatever the store
            return (Decision.FAILED if self.publisher.fail_next else Decision.FAIL_OPEN), None
        if self.store.down:
            if route == "retry":
                return Decision.FAILED, None
            if self.publisher.fail_next:
                return Decision.FAILED, None
            self.model.fail_open(engine, route, sent.key, sent.content, sent.publish_time)
            return Decision.FAIL_OPEN, None
        verdict = self.model.judge(route, sent, now, engine)
        if verdict is not Decision.FORWARDED:
            if route == "shadow" and self.publisher.fail_next:
                return Decision.FAILED, None
            return verdict, None
        fence = self.model.claim(route, sent, now, engine)
        if self.publisher.fail_next:
            self.model.release(route, sent, fence)
            return Decision.FAILED, fence
        assert self.model.commit(route, sent, fence, self.clock.now())
        return Decision.FORWARDED, fence

    def _deliver(self, sent: Sent, engine: int) -> DecisionRecord:
        STEPS[self.backend] += 1
        if (sent.route, sent.key) in self.model.failed_open[1 - engine]:
            self.failed_open.add((sent.route, sent.key))
        before = len(self.publisher.published)
        expected, fence = self._expect(sent, engine)
        rec = self.run(self.engines[engine].handle(sent.route, self._message(sent))).record
        published = len(self.publisher.published) - before
        assert rec.decision is expected, f"{sent}: engine {rec.decision} ({rec.reason}), model {expected}"
        if sent.key == KEYLESS:
            self._check_keyless(sent, rec)
        if expected is Decision.FORWARDED:
            k = self.model.keys[(sent.route, sent.key)]
            if k.renumbered and rec.fence is not None and rec.fence <= (fence or 0):
                k.fence, k.renumbered = rec.fence, False
            else:
                assert rec.fence == fence, f"{sent}: fence {rec.fence}, model {fence}"
        self._check_ack(sent, rec, published)
        if sent.route == TOLERANCE:
            self._check_tolerance(sent, rec, published)
        return rec

    def _check_keyless(self, sent: Sent, rec: DecisionRecord) -> None:
        """Never suppressed, never leased, nothing stored for it: the store holds no state for an empty key."""
        assert (rec.key, rec.fence, rec.extra.get("missing_field")) == (None, None, "payload.k"), f"{sent}: {rec}"
        assert (rec.reason or "").startswith("key field payload.k is missing"), f"{sent}: {rec.reason}"
        assert self.run(self.store.inner.read(sent.route, KEYLESS)) is None, f"{sent}: state stored without a key"

    def _check_tolerance(self, sent: Sent, rec: DecisionRecord, published: int) -> None:
        """No suppression hid a move beyond tolerance of what the destination holds; every forward
        of a change was needed; a forward flags what changed (all, when it cannot know)."""
        key = (sent.route, sent.key)
        by_id = {s.token: s for s in self.sent}
        landed = [
            by_id[mid] for r, mid, _ in self.publisher.published if r == sent.route and by_id[mid].key == sent.key
        ]
        if rec.decision is Decision.SUPPRESSED and _tolerated(rec):
            TOLERATED[self.backend] += 1
        if rec.decision is Decision.SUPPRESSED and _tolerated(rec) and key not in self.failed_open:
            assert landed and self.values.within(landed[-1].content, sent.content), (
                f"{sent} {self.values[sent.content]}: suppressed, but the destination holds "
                f"{self.values[landed[-1].content] if landed else None}"
            )
        if rec.decision in (Decision.FORWARDED, Decision.FAIL_OPEN) and published == 1:
            known = self.model.known if rec.decision is Decision.FORWARDED else None
            if known is not None:
                assert not self.values.within(known, sent.content), f"{sent}: forwarded, yet within tolerance"
            expected = self.values.changed(known, sent.content)
            assert self.publisher.flags[-1] == expected, f"{sent}: flags {self.publisher.flags[-1]}, model {expected}"

    def _check_ack(self, sent: Sent, rec: DecisionRecord, published: int) -> None:
        """Nothing acked is lost; nothing acked is published again; shadow publishes once per delivery."""
        if sent.route == "shadow":
            assert published == (1 if rec.acked else 0), f"{sent}: shadow delivery published {published} copies"
            if rec.acked:
                self._ack(sent)
            return
        if rec.decision is Decision.FAIL_OPEN:
            self.exempt.add(sent.token)
            newer = (s for s in self.sent if s.route == sent.route and s.key == sent.key)
            if any(s.publish_time > sent.publish_time for s in newer):
                # No state, no stale check: an older message failed open after a newer one.
                self.failed_open.add((sent.route, sent.key))
        if not rec.acked:
            assert published == 0, f"{sent}: {rec.decision}, not acked, yet published"
            return
        if rec.decision in (Decision.FORWARDED, Decision.FAIL_OPEN):
            assert published == 1, f"{sent}: {rec.decision} published {published} copies"
            if rec.decision is Decision.FORWARDED and rec.extra.get("committed", True) and self._newest(sent):
                # The newest content is downstream and stored: the key is right again. A forward
                # of an older message is not enough: another instance, which knows nothing of a
                # fail-open of newer content, forwards one redelivered after the outage (README).
                self.failed_open.discard((sent.route, sent.key))
        else:
            assert published == 0, f"{sent}: {rec.decision} but published"
        if rec.decision is Decision.SUPPRESSED and not _tolerated(rec):  # see `_check_tolerance`
            assert self._reached(sent.route, sent.key, sent.content), f"{sent}: suppressed, never delivered"
        if rec.decision is Decision.DUPLICATE:
            # Forwarded before, or the same content is in flight: that message is not acked and comes back.
            coming_back = any(
                not s.acked and not s.retired and (s.route, s.key, s.content) == (sent.route, sent.key, sent.content)
                for s in self.sent
                if s is not sent
            )
            assert self._publishes(sent.token) or coming_back or self._reached(sent.route, sent.key, sent.content), (
                f"{sent}: duplicate of nothing that was or will be published"
            )
        self._ack(sent)

    def _newest(self, sent: Sent) -> bool:
        """No message for its key was published after it."""
        return not any(
            s.route == sent.route and s.key == sent.key and s.publish_time > sent.publish_time for s in self.sent
        )

    def _ack(self, sent: Sent) -> None:
        older_unacked = any(
            s.route == sent.route and s.key == sent.key and not s.acked and not s.retired
            for s in self.sent
            if s.publish_time < sent.publish_time
        )
        if older_unacked:
            self.out_of_order.add((sent.route, sent.key))
        sent.acked = True

    def _reached(self, route: str, key: str, content: int) -> bool:
        """Some copy of this content for this key reached the destination (ever)."""
        by_id = {s.token: s for s in self.sent}
        return any(
            r == route and by_id[mid].key == key and by_id[mid].content == content
            for r, mid, _ in self.publisher.published
        )

    def _live_lease_expiry(self) -> float | None:
        live = [f for f in self.in_flight if not f.task.done()]
        if not live:
            return None
        return min(self.model.keys[(f.sent.route, f.sent.key)].lease.expires_at for f in live)  # type: ignore[union-attr]

    # --- rules -----------------------------------------------------------------------------

    @rule(
        route=st.sampled_from(ROUTE_NAMES),
        key=st.sampled_from(KEYS),
        content=st.sampled_from(CONTENTS),
        engine=st.integers(0, 1),
    )
    def new_message(self, route: str, key: str, content: int, engine: int) -> None:
        self._deliver(self._new(route, key, content), engine)

    @rule(
        route=st.sampled_from(ROUTE_NAMES),
        key=st.sampled_from(KEYS),
        content=st.sampled_from(CONTENTS),
        engine=st.integers(0, 1),
    )
    def another_new_message(self, route: str, key: str, content: int, engine: int) -> None:
        self.new_message(route, key, content, engine)  # the commonest event: twice the weight

    @rule(route=st.sampled_from(ROUTE_NAMES), content=st.sampled_from(CONTENTS), engine=st.integers(0, 1))
    def keyless_message(self, route: str, content: int, engine: int) -> None:
        """A message without its key field (a producer renamed it): forwarded fail-open, on every delivery."""
        self._deliver(self._new(route, KEYLESS, content), engine)

    @rule(
        key=st.sampled_from(KEYS),
        step=st.sampled_from((-5, -3, 0, 3, 5, 12, 13, -20, 40)),
        flip=st.sampled_from((False, False, False, True)),
        engine=st.integers(0, 1),
    )
    def price_walk(self, key: str, step: int, flip: bool, engine: int) -> None:
        """The tolerance route's price walks from the last message sent for its key, with jumps;
        now and then its status changes too."""
        last = next((s.content for s in reversed(self.sent) if s.route == TOLERANCE and s.key == key), 0)
        price, status = self.values[last]
        content = self.values.content((price + step, ("b" if status == "a" else "a") if flip else status))
        self._deliver(self._new(TOLERANCE, key, content), engine)

    @precondition(lambda self: any(k.content is not None or k.lease is not None for k in self.model.keys.values()))
    @rule(data=st.data(), engine=st.integers(0, 1))
    def unchanged_message(self, data: st.DataObject, engine: int) -> None:
        """A new message with the content last forwarded for its key, or the content a lease holds:
        the suppress and duplicate paths, which uniform contents reach too rarely."""
        candidates = sorted(
            {(r, k, m.content) for (r, k), m in self.model.keys.items() if m.content is not None}
            | {(r, k, m.lease.content) for (r, k), m in self.model.keys.items() if m.lease is not None}
        )
        route, key, content = data.draw(st.sampled_from(candidates), label="unchanged")
        self._deliver(self._new(route, key, content), engine)

    @precondition(lambda self: any(not s.retired for s in self.sent))
    @rule(data=st.data(), engine=st.integers(0, 1))
    def redelivery(self, data: st.DataObject, engine: int) -> None:
        candidates = [s for s in self.sent if not s.retired]
        # Includes a message whose first push still runs (Pub/Sub pushes again past the ack deadline).
        self._deliver(data.draw(st.sampled_from(candidates), label="redelivered"), engine)

    @precondition(lambda self: any(not s.retired for s in self.sent))
    @rule(data=st.data(), content=st.sampled_from(CONTENTS), engine=st.integers(0, 1))
    def reused_id(self, data: st.DataObject, content: int, engine: int) -> None:
        """A new message under an old message's id (a caller's request id reused): the same id with
        other content is decided as that content, and says its id was reused; with the content
        that id was forwarded with, it is that message's redelivery."""
        old = data.draw(st.sampled_from([s for s in self.sent if not s.retired]), label="id of")
        self.clock.advance(0.001)
        data_ = payload(old.route, old.key, content, next(self._noise), self.values)
        sent = Sent(old.id, old.route, old.key, content, data_, self.clock.now(), uid=f"{old.id}~{next(self._ids)}")
        self.sent.append(sent)
        k = self.model.state(sent.route, sent.key, self.clock.now())
        contents = {c for mid, c in k.recent if mid == sent.id}
        reused = bool(contents) and content not in contents and not self.store.down
        # Content this id was forwarded with is that forward's redelivery, even after the id was
        # reused for other content: the destination need not end on the newest content then.
        self.out_of_order.add((sent.route, sent.key))
        rec = self._deliver(sent, engine)
        assert bool(rec.extra.get("id_reused")) is reused, f"{sent}: id_reused {rec.extra}, model {reused}"

    @precondition(lambda self: len(self.in_flight) < 2 and not self.store.down)
    @rule(
        route=st.sampled_from(ROUTE_NAMES),
        key=st.sampled_from(KEYS),
        content=st.sampled_from(CONTENTS),
        engine=st.integers(0, 1),
    )
    def forward_held_in_flight(self, route: str, key: str, content: int, engine: int) -> None:
        STEPS[self.backend] += 1
        sent = self._new(route, key, content)
        verdict = self.model.judge(route, sent, self.clock.now(), engine)
        if verdict is not Decision.FORWARDED or self.publisher.fail_next:
            self._deliver(sent, engine)  # not a forward that publishes: it ends now
            STEPS[self.backend] -= 1
            return
        fence = self.model.claim(route, sent, self.clock.now(), engine)
        self.publisher.hold.add(sent.id)
        self.publisher.reached.clear()
        task = self.loop.create_task(self.engines[engine].handle(route, self._message(sent)))
        reached = self.loop.create_task(self.publisher.reached.wait())
        self.run(asyncio.wait([task, reached], return_when=asyncio.FIRST_COMPLETED))
        reached.cancel()
        assert not task.done() and sent.id in self.publisher.held, f"{sent}: the forward did not reach its publish"
        self.in_flight.append(InFlight(sent, task, fence))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), outcome=st.sampled_from(("ok", "ok", "fail", "kill_before", "kill_after", "cancelled")))
    def in_flight_ends(self, data: st.DataObject, outcome: str) -> None:
        self._end(data.draw(st.sampled_from(self.in_flight), label="in flight"), outcome)

    def _end(self, f: InFlight, outcome: str) -> None:
        STEPS[self.backend] += 1
        self.in_flight.remove(f)
        before = len(self.publisher.published)
        if outcome == "cancelled":
            # A shutdown past its grace cancels the forward; its publish, handed over, lands: the
            # forward ends as if nothing was cancelled (its record, its commit, the ack).
            f.task.cancel()
            outcome = "ok"
        self.publisher.held.pop(f.sent.id).set_result(outcome)
        try:
            rec: DecisionRecord | None = self.run(f.task).record
        except Killed:
            rec = None
        published = len(self.publisher.published) - before
        route, sent = f.sent.route, f.sent
        if outcome in ("kill_before", "kill_after"):
            assert rec is None
            assert published == (1 if outcome == "kill_after" else 0)
            if outcome == "kill_after":
                self.exempt.add(sent.token)  # landed, never acked: its redelivery publishes again
            return  # the lease stays until it expires
        assert rec is not None
        if outcome == "fail":
            assert rec.decision is Decision.FAILED and not rec.acked and published == 0
            if not self.store.down:
                self.model.release(route, sent, f.fence)
            return
        committed = not self.store.down and self.model.commit(route, sent, f.fence, self.clock.now())
        assert rec.decision is Decision.FORWARDED and rec.acked and published == 1
        assert rec.extra.get("committed", True) is committed, f"{sent}: committed {rec.extra}, model {committed}"
        if not committed:
            self.exempt.add(sent.token)  # published but not recorded: one more copy may follow
        self._ack(sent)

    @rule(seconds=st.sampled_from((1.0, 30.0, 61.0, LEASE + 1, WINDOW + 1)))
    def clock_moves(self, seconds: float) -> None:
        STEPS[self.backend] += 1
        # A live holder's heartbeat keeps its lease: time may pass, but not past a live lease.
        limit = self._live_lease_expiry()
        if limit is not None:
            seconds = min(seconds, limit - self.clock.now() - 1.0)  # room for the 1 ms between messages
        if seconds > 0:
            self.clock.advance(seconds)

    @rule(down=st.booleans())
    def store_outage(self, down: bool) -> None:
        STEPS[self.backend] += 1
        self.store.down = down

    @rule()
    def next_publish_fails(self) -> None:
        STEPS[self.backend] += 1
        self.publisher.fail_next = True

    @precondition(lambda self: not self.in_flight)
    @rule()
    def state_outlives_its_ttl(self) -> None:
        """Everything settles, then a day passes: the state expires and old ids are no longer redelivered."""
        self.drain()
        self.clock.advance(TTL + 1)
        for s in self.sent:
            s.retired = True
        self.failed_open.clear()
        self.out_of_order.clear()

    @rule()
    def drain(self) -> None:
        """Faults end, leases lapse, and every unacked message comes back, oldest first."""
        STEPS[self.backend] += 1
        while self.in_flight:
            self._end(self.in_flight[0], "ok")
        self.store.down = False
        self.publisher.fail_next = False
        self.clock.advance(LEASE + 1)
        for _ in range(3):
            pending = sorted((s for s in self.sent if not s.acked and not s.retired), key=lambda s: s.publish_time)
            if not pending:
                break
            for sent in pending:
                self._deliver(sent, 0)
        assert all(s.acked or s.retired for s in self.sent), "messages still unacked after a drain"
        self._check_newest()

    def _check_newest(self) -> None:
        by_id = {s.token: s for s in self.sent}
        for route in NEWEST_WINS:
            for key in KEYS:
                if (route, key) in self.failed_open or (route, key) in self.out_of_order:
                    continue  # README: a fail-open, or delivery out of order, may leave other content last
                live = [s for s in self.sent if s.route == route and s.key == key and not s.retired]
                if not live:
                    continue
                newest = max(live, key=lambda s: s.publish_time)
                last = [by_id[mid] for r, mid, _ in self.publisher.published if r == route and by_id[mid].key == key]
                assert last, f"{route}/{key}: nothing reached the destination"
                assert last[-1].content == newest.content, (
                    f"{route}/{key}: the destination ends on content {last[-1].content} ({last[-1].id}), "
                    f"the newest message {newest.id} has {newest.content}"
                )

    @invariant()
    def no_message_is_published_twice(self) -> None:
        counts = Counter(mid for route, mid, _ in self.publisher.published if route != "shadow")
        twice = {mid: n for mid, n in counts.items() if n > 1 and mid not in self.exempt}
        assert not twice, f"published more than once: {twice}"

    @invariant()
    def engine_holds_nothing_for_settled_work(self) -> None:
        assert sum(e.in_flight for e in self.engines) == sum(1 for f in self.in_flight if not f.task.done())


def _tolerated(rec: DecisionRecord) -> bool:
    """Suppressed as moved within tolerance (a reused id adds to the reason)."""
    return (rec.reason or "").startswith("moved within tolerance")
