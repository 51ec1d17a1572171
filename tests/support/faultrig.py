"""The fault rig: two `pubsub-filter serve` processes behind one push subscription, faults on demand.

    rig = rig_factory().start()                           # 2 backends behind a round-robin front (fixture)
    stream = change_stream(seed=7, messages=2100, keys=300)  # known content changes
    ids = rig.publish_stream(stream)                         # ordering key = entity key
    rig.kill(0, rng, in_flight=1.5)                          # SIGKILL mid-publish, restart on the same port
    decisions = rig.wait_decided(ids, timeout=240)           # every message acked by some process
    t = tally("kills", stream, rig.collect(stream, forwards))  # delivered / lost / duplicates downstream

What a rig is made of (one per test):

- a source topic with a push subscription (message ordering on unless `start(ordered=False)`)
  to a `RoundRobin` front, dead-lettering after 100 attempts (asserted empty: a long
  stall must not hide a message there); the front spreads pushes over the backends,
  optionally one push per backend at a time (`per_backend=1`);
- per backend a `FaultProxy` between the process and the Pub/Sub emulator (the
  process's publishes only: its pushes come from the emulator directly through the
  front) that can delay what goes to Pub/Sub or refuse connections;
- a destination topic with a pull subscription (the downstream phase), a Firestore
  collection of its own.

A backend slot is restarted on its own port after a kill, so the front keeps two
backends; every incarnation keeps its own log file and records, and decisions are read
from all of them. Serve processes log at debug level so their claims (`lease_acquired`,
`lease_taken_over`: key and fence) are visible: a claim without a decision in a killed
process's log is a forward that was interrupted between claim and commit.

`Figures` collects one row per scenario and prints the table at the end of the session
(through the capture manager, so it shows without `-s`) and writes it to
tests/faults/results/.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from pubsub_filter.backends.stores.firestore import from_document
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import ACKED, KeyState
from pubsub_filter.core.ports import StoreUnavailable
from pubsub_filter.core.times import format_time

from .balancer import RoundRobin
from .emulators import FirestoreEmulator, PubsubEmulator
from .jsonlogs import logs_into
from .net import free_port
from .polling import wait_until
from .pubsub_helpers import DelayProxy, PubsubAdmin, Pulled, unique
from .serve import ServeProcess, write_config

ROUTE = "faults"
#: duration > ack_deadline > heartbeat, with the push subscription's ack deadline (10 s, the
#: minimum Pub/Sub allows) as ack_deadline.
LEASE = {"duration": "11s", "ack_deadline": "10s", "heartbeat": "2s"}
LEASE_SECONDS = 11.0
ACK_DEADLINE = 10
MAX_DELIVERY_ATTEMPTS = 100
FINAL = {str(d) for d in ACKED}
CLAIMS = ("lease_acquired", "lease_taken_over")
RESULTS = Path(__file__).resolve().parents[1] / "faults" / "results"


rfc3339 = format_time  # the product's own formatter: publish times in envelopes the rig builds


def log_time(event: dict[str, Any]) -> float:
    """A log line's `time` (RFC 3339, microseconds, UTC) as epoch seconds."""
    from pubsub_filter.core.times import parse_time

    return parse_time(event["time"])


# --- a proxy that can also refuse ------------------------------------------------------


@dataclass
class FaultProxy(DelayProxy):
    """`DelayProxy` that can also refuse: `refuse()` aborts every open connection and every new one.

    A refused gRPC connection is what an unreachable Pub/Sub looks like to the publisher:
    UNAVAILABLE, retried inside its budget, then `PublishFailed`. `accept()` lets
    connections through again.
    """

    refusing: bool = False
    refused: int = 0
    _writers: set[asyncio.StreamWriter] = field(default_factory=set, repr=False)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.refusing:
            self.refused += 1
            client_w.transport.abort()
            return
        self._writers.add(client_w)
        try:
            await super()._serve(client_r, client_w)
        finally:
            self._writers.discard(client_w)

    def refuse(self) -> None:
        self.refusing = True
        assert self._loop is not None, "the proxy is not running"

        async def abort_all() -> None:
            for w in list(self._writers):
                w.transport.abort()

        asyncio.run_coroutine_threadsafe(abort_all(), self._loop).result(10)

    def accept(self) -> None:
        self.refusing = False


# --- a stream with known content changes -----------------------------------------------

STATUSES = ("out", "questionable", "doubtful", "probable", "available")


@dataclass(frozen=True, slots=True)
class Item:
    """Message `n` of a stream: entity `key` at content `version` (0 = its first content)."""

    n: int
    key: str
    version: int

    def payload(self) -> bytes:
        # `run` and `scraped_at` change on every message and are excluded by the route:
        # a rerun of the same content differs in bytes but not in fingerprint.
        return json.dumps(
            {
                "key": self.key,
                "version": self.version,
                "status": STATUSES[(self.version + len(self.key)) % len(STATUSES)],
                "line": 10.5 + self.version,
                "run": f"run-{self.n:05d}",
                "scraped_at": rfc3339(1_767_225_600 + self.n),
            }
        ).encode()


@dataclass
class ChangeStream:
    items: list[Item]

    @property
    def changes(self) -> set[tuple[str, int]]:
        """Every (key, version) the stream ever carries: each is a content change that must reach downstream."""
        return {(i.key, i.version) for i in self.items}

    @property
    def final(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.items:
            out[i.key] = i.version
        return out


def change_stream(seed: int, messages: int, keys: int, p_change: float = 0.3, prefix: str = "k") -> ChangeStream:
    """`messages` messages over `keys` keys; each message changes its key's content with `p_change`.

    A key's versions only grow (0, 1, 2, ...), so no content ever comes back (no A→B→A): a
    (key, version) seen twice downstream is a duplicate, never a legitimate re-forward.
    """
    rng = random.Random(seed)
    names = [f"{prefix}{i:03d}" for i in range(keys)]
    version: dict[str, int] = {}
    items = []
    for n in range(messages):
        key = rng.choice(names)
        if key not in version:
            version[key] = 0
        elif rng.random() < p_change:
            version[key] += 1
        items.append(Item(n, key, version[key]))
    return ChangeStream(items)


# --- what reached downstream -----------------------------------------------------------


@dataclass
class Tally:
    """One scenario's figures: what had to reach downstream and what did."""

    scenario: str
    messages: int
    kills: int
    changes: int
    delivered: int  # distinct (key, version) changes downstream
    lost: int  # changes never delivered
    duplicates: int  # extra copies of a (key, version) already delivered
    downstream: int  # messages pulled from the destination for the stream's keys
    missing: list[tuple[str, int]]
    wrong_final: dict[str, tuple[int | None, int]]  # key → (last version downstream, final version)
    copies: Counter[tuple[str, int]]
    fingerprints: dict[tuple[str, int], str]
    notes: str = ""

    @property
    def duplicated(self) -> dict[tuple[str, int], int]:
        return {kv: n for kv, n in self.copies.items() if n > 1}

    def row(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "messages": self.messages,
            "kills": self.kills,
            "changes": self.changes,
            "delivered": self.delivered,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "notes": self.notes,
        }


def tally(scenario: str, stream: ChangeStream, downstream: list[Pulled], kills: int = 0) -> Tally:
    """Count, per (key, version) of the stream, the copies that reached downstream."""
    wanted = stream.changes
    copies: Counter[tuple[str, int]] = Counter()
    fingerprints: dict[tuple[str, int], str] = {}
    last: dict[str, tuple[float, int, int]] = {}
    keys = {k for k, _ in wanted}
    seen = 0
    for order, m in enumerate(downstream):
        body = json.loads(m.data)
        kv = (body["key"], body["version"])
        if kv[0] not in keys:
            continue
        seen += 1
        copies[kv] += 1
        fingerprints[kv] = m.attributes.get("filter_fingerprint", "")
        stamp = (m.publish_time, order, kv[1])
        if kv[0] not in last or stamp[:2] > last[kv[0]][:2]:
            last[kv[0]] = stamp
    missing = sorted(wanted - set(copies))
    final = stream.final
    wrong_final: dict[str, tuple[int | None, int]] = {}
    for key, version in final.items():
        got = last.get(key)
        if got is None or got[2] != version:
            wrong_final[key] = (got[2] if got else None, version)
    return Tally(
        scenario=scenario,
        messages=len(stream.items),
        kills=kills,
        changes=len(wanted),
        delivered=len(set(copies) & wanted),
        lost=len(missing),
        duplicates=sum(n - 1 for n in copies.values() if n > 1),
        downstream=seen,
        missing=missing,
        wrong_final=wrong_final,
        copies=copies,
        fingerprints=fingerprints,
    )


# --- the rig ---------------------------------------------------------------------------


@dataclass
class Kill:
    """One SIGKILL: which slot, when, and what the killed process had claimed but not decided."""

    slot: int
    victim: str
    decided_before: int  # messages acked across all processes when it was killed
    in_flight: bool  # aimed at a slow publish (claim seen, publish held by the proxy)
    offset: float  # seconds between seeing the claim and the kill
    uncommitted: list[tuple[str, int]]  # (key, fence) claimed, never decided
    restart_s: float = 0.0


@dataclass
class Backend:
    slot: int
    proxy: FaultProxy
    port: int
    incarnations: list[ServeProcess] = field(default_factory=list)

    @property
    def current(self) -> ServeProcess:
        return self.incarnations[-1]


class Rig:
    def __init__(
        self,
        pubsub: PubsubEmulator,
        firestore: FirestoreEmulator,
        tmp_path: Path,
        *,
        publisher_timeout: str = "30s",
        store_errors: dict[str, str] | None = None,
        lease: dict[str, str] | None = None,
        per_backend: int | None = None,
    ):
        self.pubsub = pubsub
        self.firestore = firestore
        self.tmp_path = tmp_path
        self.admin = PubsubAdmin(pubsub)
        self.project = pubsub.project
        self.publisher_timeout = publisher_timeout
        self.store_errors = store_errors
        self.lease = lease or dict(LEASE)
        self.per_backend = per_backend  # pushes per process at once (None: no limit), see RoundRobin
        self.source = self.admin.topic("fault-source")
        self.dest = self.admin.topic("fault-dest")
        self.dlq = self.admin.topic("fault-dlq")
        self.dest_sub = self.admin.pull_subscription(self.dest, "downstream")
        self.dlq_sub = self.admin.pull_subscription(self.dlq, "dead-letters")
        self.push_sub = unique("fault-push")
        self.collection = unique("faults")
        self.backends: list[Backend] = []
        self.front: RoundRobin | None = None
        self.kills: list[Kill] = []
        self.downstream: list[Pulled] = []
        self._subscribed = False
        self._cleanups: list[Callable[[], None]] = []

    # --- set-up ---------------------------------------------------------------------------

    def config(self, name: str) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "project": self.project,
            "store": {"backend": "firestore", "collection": self.collection},
            "publisher": {"backend": "pubsub", "timeout": self.publisher_timeout},
            "records": {"backend": "sqlite", "path": str(self.tmp_path / f"{name}-decisions.db")},
            "lease": dict(self.lease),
            "server": {"shutdown_budget": "15s"},
            "routes": [
                {
                    "name": ROUTE,
                    "subscription": self.push_sub,
                    "destination": self.dest,
                    "key": ["payload.key"],
                    "exclude": ["run", "scraped_at"],
                }
            ],
        }
        if self.store_errors:
            cfg["store_errors"] = dict(self.store_errors)
        return cfg

    def _spawn(self, backend: Backend) -> ServeProcess:
        n = len(backend.incarnations) + 1
        name = f"{'abcdefgh'[backend.slot]}{n}"
        path = write_config(self.tmp_path / f"{name}.yaml", self.config(name))
        proc = ServeProcess(
            path,
            self.tmp_path / f"{name}.log",
            env={
                "PUBSUB_EMULATOR_HOST": backend.proxy.host,
                "FIRESTORE_EMULATOR_HOST": self.firestore.host,
                "GOOGLE_CLOUD_PROJECT": self.project,
                "LOG_LEVEL": "debug",  # claims (lease_acquired) are debug lines
            },
            port=backend.port,
            name=name,
        )
        backend.incarnations.append(proc)
        return proc.start()

    def start(self, backends: int = 2, subscribe: bool = True, ordered: bool = True) -> Rig:
        for slot in range(backends):
            proxy = FaultProxy(self.pubsub.host).start()
            self._cleanups.append(proxy.stop)
            backend = Backend(slot, proxy, free_port())
            self.backends.append(backend)
            self._spawn(backend)
        self.front = RoundRobin([b.current.url() for b in self.backends], per_backend=self.per_backend).start()
        self._cleanups.append(self.front.stop)
        if subscribe:
            self.subscribe(ordered)
        return self

    def subscribe(self, ordered: bool = True) -> None:
        """The push subscription source → front (message ordering on if `ordered`), dead-lettering after 100 attempts.

        The emulator treats messages published WITHOUT an ordering key on an ordered
        subscription as one ordered group, and a nack there makes it redeliver the group's
        later messages even when they were acked: streams without ordering keys use an
        unordered subscription.
        """
        assert self.front is not None
        self.admin.subscriber.create_subscription(
            request={
                "name": self.admin.subscription_path(self.push_sub),
                "topic": self.admin.topic_path(self.source),
                "ack_deadline_seconds": ACK_DEADLINE,
                "push_config": {"push_endpoint": self.front.url(f"/push/{ROUTE}")},
                "enable_message_ordering": ordered,
                "dead_letter_policy": {
                    "dead_letter_topic": self.admin.topic_path(self.dlq),
                    "max_delivery_attempts": MAX_DELIVERY_ATTEMPTS,
                },
            }
        )
        self._subscribed = True

    def warm(self) -> None:
        """Forward one message through each current process directly, so each has its Pub/Sub channel open."""
        with httpx.Client(timeout=30) as client:
            for b in self.backends:
                proc = b.current
                mid = unique(f"warm-{proc.name}")
                body = make_envelope(
                    json.dumps({"key": f"warm-{proc.name}", "version": 0}).encode(),
                    mid,
                    subscription=self.admin.subscription_path(self.push_sub),
                    publish_time=rfc3339(time.time()),
                )
                resp = client.post(proc.url(f"/push/{ROUTE}"), content=body)
                assert resp.status_code == 200 and resp.json()["decision"] == "forwarded", resp.text

    def teardown(self) -> None:
        errors: list[BaseException] = []
        if self._subscribed:
            # First: the emulator retries a push whose endpoint is gone every second, forever.
            self.admin.delete_subscription(self.push_sub)
        for b in self.backends:
            proc = b.current
            try:
                if proc.running:
                    proc.stop()
                else:
                    proc.kill()
            except BaseException as exc:
                errors.append(exc)
        for fn in reversed(self._cleanups):
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
        self.admin.cleanup()
        if errors:
            raise errors[0]

    # --- messages -------------------------------------------------------------------------

    def publish_stream(self, stream: ChangeStream, ordered: bool = True, chunk: int = 500) -> list[str]:
        """Publish the stream in batches (ordering key = entity key when `ordered`); ids in stream order."""
        ids: list[str] = []
        items = stream.items
        for start in range(0, len(items), chunk):
            part = items[start : start + chunk]
            ids += self.admin.publish_many(
                self.source, [(i.payload(), {}) for i in part], [i.key for i in part] if ordered else None
            )
        return ids

    def publish(self, item: Item, ordering_key: str = "") -> str:
        return self.admin.publish(self.source, item.payload(), ordering_key=ordering_key)

    # --- what the processes said ------------------------------------------------------

    def procs(self) -> list[ServeProcess]:
        return [p for b in self.backends for p in b.incarnations]

    def events(self) -> list[dict[str, Any]]:
        return [dict(e, proc=p.name) for p in self.procs() for e in p.events()]

    def decisions(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("message") == "decision"]

    def acked(self) -> set[str]:
        """Message ids with an acked decision in any process's log."""
        return {d["message_id"] for p in self.procs() for d in p.decisions() if d["decision"] in FINAL}

    def wait_decided(self, ids: list[str], timeout: float) -> list[dict[str, Any]]:
        """Wait until every id has an acked decision in some process's log; name what is missing if not."""
        wanted = set(ids)

        def missing() -> str:
            ds = self.decisions()
            left = wanted - {d["message_id"] for d in ds if d["decision"] in FINAL}
            last = {d["message_id"]: d for d in ds if d["message_id"] in left}
            sample = sorted(left)[:15]
            story = [
                f"{m}: {last[m]['decision']} ({last[m].get('reason')})" if m in last else f"{m}: never" for m in sample
            ]
            tails = "\n".join(f"--- {b.current.name}\n{b.current.tail(15)}" for b in self.backends)
            return f"{len(left)} of {len(wanted)} messages never acked, e.g. {story}\n{tails}"

        wait_until(lambda: wanted <= self.acked(), timeout, missing, poll=0.2)
        return self.decisions()

    @staticmethod
    def claims(proc: ServeProcess) -> list[tuple[str, int]]:
        """(key, fence) of every lease `proc` took (`lease_acquired`, `lease_taken_over`)."""
        return [(e["key"], e["fence"]) for e in proc.events() if e.get("message") in CLAIMS]

    @staticmethod
    def uncommitted(proc: ServeProcess) -> list[tuple[str, int]]:
        """(key, fence) claimed by `proc` that it never logged a decision for."""
        decided = {(e.get("key"), e.get("fence")) for e in proc.events() if e.get("message") == "decision"}
        return [c for c in Rig.claims(proc) if c not in decided]

    # --- faults -----------------------------------------------------------------------------

    def kill(self, slot: int, rng: random.Random, in_flight: float | None = None) -> Kill:
        """SIGKILL the process in `slot` and restart it on its port.

        With `in_flight` (seconds), the process's publishes are first held that long by its
        proxy, the kill waits until it claims a key (a forward is under way, its publish
        held), the front stops sending it new pushes when it may take several at once (so the
        kill interrupts that forward and at most what was already there), and the kill lands
        at a random instant inside the held publish.
        """
        backend = self.backends[slot]
        assert self.front is not None
        victim = backend.current
        offset = 0.0
        if in_flight:
            backend.proxy.delay = in_flight
            earlier = set(self.claims(victim))  # their publishes may have left before the delay was set
            wait_until(
                lambda: set(self.uncommitted(victim)) - earlier, 60, f"{victim.name} never claimed a key to forward"
            )
            if self.per_backend is None:
                self.front.drain(slot)  # with one push per process, nothing more can reach it anyway
            offset = rng.uniform(0.0, in_flight)
            time.sleep(offset)  # a random kill instant inside the publish window, not a synchronisation
        decided = len(self.acked())
        victim.kill()  # SIGKILL, reaped
        backend.proxy.delay = 0.0
        kill = Kill(slot, victim.name, decided, bool(in_flight), offset, self.uncommitted(victim))
        self.front.undrain(slot)  # pushes to the dead port get 502 until it is back: nacked, redelivered
        started = time.monotonic()
        self._spawn(backend)
        kill.restart_s = time.monotonic() - started
        self.kills.append(kill)
        return kill

    # --- downstream and stored state ------------------------------------------------------

    def pull_downstream(
        self, done: Callable[[list[Pulled]], bool], timeout: float, settle: float = 2.0
    ) -> list[Pulled]:
        """Pull (and ack) from the destination until `done(everything so far)`, then for `settle` more seconds."""
        deadline = time.monotonic() + timeout
        while not done(self.downstream):
            if time.monotonic() > deadline:
                break
            self.downstream += self.admin.pull(self.dest_sub, 1000, timeout=1.0)
        self.downstream += self.admin.drain(self.dest_sub, settle)
        return self.downstream

    def collect(self, stream: ChangeStream, forwards: int, timeout: float = 60.0) -> list[Pulled]:
        """Everything downstream: at least every change of `stream` and `forwards` messages, then a settle."""
        wanted = stream.changes

        def done(got: list[Pulled]) -> bool:
            if len(got) < forwards:
                return False
            seen = set()
            for m in got:
                body = json.loads(m.data)
                seen.add((body.get("key"), body.get("version")))
            return wanted <= seen

        return self.pull_downstream(done, timeout)

    def assert_nothing_dead_lettered(self, period: float = 1.0) -> None:
        self.admin.assert_nothing_more(self.dlq_sub, period)

    def stored(self) -> dict[str, KeyState]:
        """Every document of the rig's collection, read back from the Firestore emulator."""
        from google.cloud import firestore as gfs

        with self.firestore.env():
            client = gfs.Client(project=self.project)
        try:
            return {
                (doc.to_dict() or {})["key"]: from_document(doc.to_dict() or {}, doc.update_time)
                for doc in client.collection(self.collection).stream()
            }
        finally:
            client.close()


@pytest.fixture
def rig_factory(pubsub_emulator: PubsubEmulator, firestore: FirestoreEmulator, tmp_path: Path) -> Iterator[Any]:
    """`rig_factory(**Rig options)` → a Rig (not started); every rig made is torn down after the test."""
    made: list[Rig] = []

    def make(**kwargs: Any) -> Rig:
        rig = Rig(pubsub_emulator, firestore, tmp_path, **kwargs)
        made.append(rig)
        return rig

    yield make
    errors: list[BaseException] = []
    for rig in made:
        try:
            rig.teardown()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


# --- in-process pieces (for what a config cannot express) ------------------------------


class DroppedExtends:
    """A `StateStore` whose `extend` never reaches the store (each one fails as unavailable).

    The heartbeat keeps beating and logging `heartbeat_failed`, but the lease is never
    pushed out: what a heartbeat that cannot write looks like. The config validator
    insists on duration > ack_deadline > heartbeat, so this cannot be set up in YAML.
    """

    def __init__(self, inner: Any):
        self.inner = inner
        self.dropped = 0

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        self.dropped += 1
        raise StoreUnavailable("extend dropped by the fault test")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class LogLines(io.StringIO):
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.getvalue().splitlines() if line.startswith("{")]


@contextlib.contextmanager
def json_logs() -> Iterator[LogLines]:
    """This process's structlog output as JSON lines in a buffer; the previous set-up put back after."""
    sink = LogLines()
    with logs_into(sink):
        yield sink


# --- figures --------------------------------------------------------------------------------

COLUMNS = ("scenario", "messages", "kills", "changes", "delivered", "lost", "duplicates", "notes")


class Figures:
    """One row per scenario; printed as a table at the end of the session and written to RESULTS."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S")
        self._lock = threading.Lock()

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.rows.append(row)
        print(" | ".join(f"{c}={row.get(c, '')}" for c in COLUMNS))
        with contextlib.suppress(OSError):
            RESULTS.mkdir(parents=True, exist_ok=True)
            with open(RESULTS / "history.tsv", "a", encoding="utf-8") as f:
                f.write("\t".join([self.started, *(str(row.get(c, "")) for c in COLUMNS)]) + "\n")

    def table(self) -> str:
        cells = [list(COLUMNS)] + [[str(r.get(c, "")) for c in COLUMNS] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
        lines = [" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        return "\n".join(lines)


@pytest.fixture(scope="session")
def fault_figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    figures = Figures()
    yield figures
    if not figures.rows:
        return
    table = figures.table()
    with contextlib.suppress(OSError):
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "figures.txt").write_text(f"fault suite, {figures.started}\n{table}\n", encoding="utf-8")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n\nfault suite figures ({RESULTS / 'figures.txt'}):\n{table}\n")


def counts(decisions: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(d["decision"] for d in decisions))


def by_message(decisions: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in decisions:
        out[d["message_id"]].append(d)
    return out


def push_concurrency(front: RoundRobin, key_of: dict[str, str]) -> tuple[int, int]:
    """From the front's log: (most pushes of one key ever in flight at once, keys that ever had two).

    Measures whether the emulator honours message ordering on a push subscription (one
    outstanding push per ordering key) even though its envelopes carry no ordering key.
    """
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in list(front.log):
        key = key_of.get(f.message_id or "")
        if key is not None:
            spans[key].append((f.started, f.ended))
    most, overlapping = 0, 0
    for intervals in spans.values():
        points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
        now = peak = 0
        for _, step in points:
            now += step
            peak = max(peak, now)
        most = max(most, peak)
        overlapping += peak > 1
    return most, overlapping
