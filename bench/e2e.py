"""Messages/s through the Pub/Sub emulator's push path, pubsub-filter next to gcp-pubsub-idempotency.

    .venv/bin/python bench/e2e.py [--messages 1000] [--keys 50] [--unchanged 0.8] [--rounds 3]
                                  [--rows 40] [--store firestore|sqlite] [--systems ours,theirs,bare]

Needs `pip install "gcp-pubsub-idempotency[datastore]"` in the venv (the comparison; it is
not a dependency of the product), Java 17 and the Cloud SDK's Pub/Sub, Firestore and
Datastore emulators. Every process started here is stopped at the end, also on Ctrl-C.
Supersedes tests/e2e/bench_push.py (same stream and measurement, plus the comparison).

The stream: `--messages` injury reports (`--rows` players each, realistic fields from
tests/support/payloads.py) over `--keys` game dates, round robin, each published once by
the bench with the game date as ordering key (so each has its own message id, as a
scraper rerun has). A key's content (one player's status and reason) changes so that
`--unchanged` of the stream repeats what was last sent for its key; every message carries
new scrape metadata (run id, scrape times, confidence), which the route's include list
leaves out.

The systems, each its own subprocess under uvicorn with the same settings (lifespan on,
access log off, log level warning, loop and http "auto"), each fed by its own push
subscription (ack deadline 60 s, message ordering unless `--unordered`) from its own
source topic, each publishing what it forwards to its own destination topic:

* ours:   `pubsub-filter serve`, Firestore emulator state (production's backend; `--store
          sqlite` for the embedded one), Pub/Sub publisher, SQLite decision records, the
          injury-report route of examples/filter.yaml; one JSON decision line per message
          at info (product cost, measured);
* theirs: a minimal Starlette push endpoint that parses the envelope (the product's own
          `parse_envelope`, so parsing costs the same) and runs `gcp_pubsub_idempotency.lock`
          keyed on the message id (the library's default key) on its `DatastoreLock`
          (Datastore emulator in Firestore-in-Datastore mode) around a plain synchronous
          publish of the message to the destination topic; the guard is synchronous, so it
          runs in Starlette's thread pool. Acks are counted in the handler (GET /stats);
* bare:   the same endpoint answering 204 right after parsing: the emulator push path's
          own ceiling on this machine (a reference, not a competitor).

Per round and system: fresh topics, subscriptions and state; `--warmup` messages on other
keys first (not timed: lazy clients, JIT); then the stream. Measured from the first
publish of the stream to the last acked decision on it (ours: the decision log line's
time; theirs: the time the handler acked). Also: what each published downstream (drained
from a pull subscription on its destination topic), the time spent deciding in the handler
(ours: the engine's latency_ms; theirs: lock + publish), and the CPU time of the server
process, its store emulator and the Pub/Sub emulator per message (/proc, all threads),
steadier than wall time on a shared machine. The order of the systems rotates between
rounds; figures are medians over rounds, ratios are medians of per-round ratios.

`--profile DIR` runs ours under cProfile (the event loop's thread only, by its CPU time; not
gRPC's threads), one `ours-PID.prof` per server: read them with `pstats`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness  # bench/harness.py: this script's directory is on sys.path; puts the repository there too
from harness import free_port, quantile

from pubsub_filter.core.model import ACKED
from pubsub_filter.core.times import parse_time
from tests.support.emulators import (
    JVM_FLAGS,
    Emulator,
    EmulatorError,
    FirestoreEmulator,
    PubsubEmulator,
    java,
)
from tests.support.payloads import STATUSES, injury_report
from tests.support.pubsub_helpers import PubsubAdmin, unique
from tests.support.serve import ServeProcess, write_config

ROUTE = "injury-report"
Outcome = tuple[str, float, float]  # the acked decision, when (epoch s), ms spent deciding (in the handler)
FINAL = {str(d) for d in ACKED}
ACK_DEADLINE = 60
INCLUDE = ["player_lookup", "team", "game_date", "game_id", "injury_status", "reason", "reason_category"]
SYSTEMS = ("ours", "theirs", "bare")
LABELS = {
    "ours": "pubsub-filter",
    "theirs": "gcp-pubsub-idempotency (Datastore emu)",
    "bare": "bare push endpoint (parse, ack)",
}
POLL = 0.2  # seconds between completion checks (the same for both systems)
STOP_TIMEOUT = 15.0


# --- the Datastore emulator ---------------------------------------------------------------


class DatastoreEmulator(Emulator):
    """The Cloud SDK's Datastore emulator (platform/cloud-datastore-emulator), one JVM we own.

    Started like the others in tests/support/emulators.py: the JVM directly (the
    `cloud_datastore_emulator` script only wraps `java -cp CloudDatastore.jar`), in memory,
    in Firestore-in-Datastore mode (what the library calls production). Ready on GET /.
    """

    name = "datastore"
    env_var = "DATASTORE_EMULATOR_HOST"
    component = "google-cloud-cli-datastore-emulator"

    def command(self) -> list[str]:
        jar = self._jar("cloud-datastore-emulator/CloudDatastore.jar")
        return [
            java(), *JVM_FLAGS, "-cp", jar, "com.google.cloud.datastore.emulator.CloudDatastore", "start",
            "--host=127.0.0.1", f"--port={self.port}", "--store_on_disk=false", "--firestore_in_datastore_mode",
        ]  # fmt: skip

    def reset(self) -> None:
        self._request("POST", "/reset")


# --- theirs: the comparison server (run as `bench/e2e.py serve-theirs --port N ...`) --------


def serve_theirs(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/e2e.py serve-theirs")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--project", required=True)
    p.add_argument("--topic", required=True, help="destination topic id")
    p.add_argument("--kind", required=True, help="Datastore kind: one per run, so state starts empty")
    p.add_argument("--bare", action="store_true", help="no guard, no publish: parse the envelope and ack")
    p.add_argument("--window", type=float, required=True, help="the publisher's batch window, ms")
    args = p.parse_args(argv)

    import uvicorn
    from gcp_pubsub_idempotency import DatastoreLock, Duplicate, InProgress, lock
    from google.cloud import pubsub_v1
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from pubsub_filter.core.envelope import EnvelopeError, parse_envelope
    from pubsub_filter.core.model import Message

    backend = DatastoreLock(project=args.project, kind=args.kind)
    publisher = pubsub_v1.PublisherClient(
        # the settings the product's publisher had before it sent each forward on its own: latency-tuned batches
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=100, max_latency=args.window / 1000),
    )
    topic = publisher.topic_path(args.project, args.topic)
    outcomes: dict[str, list[Any]] = {}  # message id → [last outcome, time it was acked, ms in the guard]
    counts: Counter[str] = Counter()

    def handle(msg: Message) -> str:
        """The guarded side effect: at most once per message id (the library's default key)."""
        if args.bare:
            return "acked"
        try:
            with lock(msg.message_id, backend=backend):
                publisher.publish(topic, msg.data, **msg.attributes).result(timeout=30)
        except Duplicate:
            return "duplicate"
        except InProgress:
            return "in_progress"
        return "forwarded"

    async def push(request: Request) -> Response:
        try:
            msg = parse_envelope(await request.body())
        except EnvelopeError as exc:
            counts["rejected"] += 1
            return JSONResponse({"error": str(exc)}, 400)
        started = time.perf_counter()
        try:
            outcome = "acked" if args.bare else await run_in_threadpool(handle, msg)
        except Exception as exc:  # the lock was released: nack, Pub/Sub redelivers
            counts["error"] += 1
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, 500)
        counts[outcome] += 1
        if outcome == "in_progress":
            return Response(status_code=503, headers={"Retry-After": "1"})
        outcomes[msg.message_id] = [outcome, time.time(), round((time.perf_counter() - started) * 1000, 3)]
        return Response(status_code=204)  # an ack (202 is not one in the emulator)

    async def stats(_: Request) -> Response:
        return JSONResponse({"outcomes": outcomes, "counts": counts})

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    app = Starlette(
        routes=[
            Route("/push/{route}", push, methods=["POST"]),
            Route("/stats", stats),
            Route("/healthz", healthz),
        ]
    )
    uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=args.port,
            lifespan="on",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=10,
        )
    ).run()
    publisher.stop()
    return 0


# --- the stream ---------------------------------------------------------------------------


@dataclass
class Item:
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    forward: bool  # new or changed content for its key: what a content filter should forward


def day(base: dt.date, k: int) -> str:
    return (base + dt.timedelta(days=k)).isoformat()


def stream(messages: int, keys: int, unchanged: float, rows: int, warmup: bool = False) -> list[Item]:
    """Round robin over `keys` game dates; the j-th report of a key is content version
    floor(j * (1 - unchanged)), so `unchanged` of each key's reports repeat the last content."""
    base = dt.date(2000 if warmup else 2026, 1, 1)
    out = []
    for i in range(messages):
        k, j = i % keys, i // keys
        version = math.floor(j * (1 - unchanged) + 1e-9)
        previous = math.floor((j - 1) * (1 - unchanged) + 1e-9) if j else -1
        rep = injury_report(rows, seed=i + 1, game_date=day(base, k))  # new scrape metadata every time
        rep["players"][0]["injury_status"] = STATUSES[version % len(STATUSES)]
        rep["players"][1 % rows]["reason"] = f"report revision {version}"
        attrs = {"warmup": str(i)} if warmup else {"n": str(i)}
        out.append(Item(json.dumps(rep).encode(), attrs, day(base, k), version != previous))
    return out


# --- processes ----------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far, all its threads."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TheirServer:
    """`bench/e2e.py serve-theirs` as a subprocess on a free port."""

    def __init__(
        self, work: Path, env: dict[str, str], project: str, topic: str, kind: str, window: float, bare: bool = False
    ):
        self.port = free_port()
        self.log_path = work / f"theirs-{kind}.log"
        cmd = [sys.executable, str(Path(__file__).resolve()), "serve-theirs", "--port", str(self.port)]
        cmd += ["--project", project, "--topic", topic, "--kind", kind, "--window", str(window)]
        cmd += ["--bare"] if bare else []
        with open(self.log_path, "ab") as log:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                cmd,
                cwd=work,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        return "(no log)"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the comparison server exited before it was ready:\n{self.tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url("/healthz"), timeout=1) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the comparison server was not ready within {timeout:g}s:\n{self.tail()}")

    def outcomes(self) -> dict[str, Outcome]:
        with urllib.request.urlopen(self.url("/stats"), timeout=10) as r:
            body = json.loads(r.read())
        return {k: (v[0], v[1], v[2]) for k, v in body["outcomes"].items()}

    def counts(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url("/stats"), timeout=10) as r:
            return dict(json.loads(r.read())["counts"])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def stop_ours(proc: ServeProcess) -> None:
    """SIGTERM (records flushed); a non-zero exit is reported by ServeProcess, then it is killed."""
    try:
        proc.stop(STOP_TIMEOUT)
    except AssertionError as exc:
        print(f"warning: pubsub-filter serve did not stop cleanly: {str(exc)[:400]}", file=sys.stderr)
        proc.kill()


# --- one system, one round ----------------------------------------------------------------


@dataclass
class Result:
    system: str
    round: int
    messages: int
    elapsed: float  # first publish → last acked decision on the stream
    publish_s: float
    outcomes: Counter[str]  # the final (acked) outcome per stream message
    attempts: Counter[str] = field(default_factory=Counter)  # every answer, retries included
    downstream: int = 0
    server_cpu: float = 0.0
    store_cpu: float = 0.0
    pubsub_cpu: float = 0.0
    latency_ms: list[tuple[str, float]] = field(default_factory=list)  # (final decision, ms deciding it)

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed

    @property
    def forwarded(self) -> int:
        return self.outcomes["forwarded"] + self.outcomes["fail_open"]


@dataclass
class World:
    admin: PubsubAdmin
    pubsub: PubsubEmulator
    firestore: FirestoreEmulator | None  # started only where a system uses it (see `emulators`)
    datastore: DatastoreEmulator | None
    work: Path
    args: argparse.Namespace
    stream: list[Item]
    warm: list[Item]

    def publish(self, topic: str, items: list[Item]) -> list[str]:
        return self.admin.publish_many(
            topic, [(it.data, it.attributes) for it in items], [it.ordering_key for it in items]
        )

    def run(self, system: str, rnd: int) -> Result:
        source, dest = self.admin.topic("source"), self.admin.topic("dest")
        downstream = self.admin.pull_subscription(dest, "downstream")
        tag, sub_id = unique(f"r{rnd}"), unique("push")
        if system == "ours":
            started = self._start_ours(sub_id, dest, tag)
        else:
            started = self._start_theirs(dest, tag, bare=system == "bare")
        return self._run(system, rnd, source, sub_id, downstream, *started)

    def _start_ours(self, sub_id: str, dest: str, tag: str) -> tuple[Any, ...]:
        cfg = {
            "project": self.pubsub.project,
            "store": (
                {"backend": "firestore", "collection": f"bench-{tag}"}
                if self.args.store == "firestore"
                else {"backend": "sqlite", "path": str(self.work / f"{tag}-state.db")}
            ),
            "publisher": {"backend": "pubsub", "timeout": "30s"},
            "records": {"backend": "sqlite", "path": str(self.work / f"{tag}-decisions.db")},
            "routes": [
                {
                    "name": ROUTE,
                    "subscription": sub_id,
                    "destination": dest,
                    "key": ["payload.game_date"],
                    "rows": "payload.players",
                    "row_key": ["player_lookup", "game_id"],
                    "include": INCLUDE,
                }
            ],
        }
        proc = ServeProcess(
            write_config(self.work / f"{tag}.yaml", cfg),
            self.work / f"{tag}-serve.log",
            env={
                "PUBSUB_EMULATOR_HOST": self.pubsub.host,
                **({"FIRESTORE_EMULATOR_HOST": self.firestore.host} if self.firestore else {}),
                "GOOGLE_CLOUD_PROJECT": self.pubsub.project,
            },
            name="ours",
            command=[sys.executable, str(Path(__file__).resolve()), "serve-ours"],
        )
        proc.start(deadline=60)

        def outcomes() -> dict[str, Outcome]:
            out: dict[str, Outcome] = {}
            for d in proc.decisions():
                if d.get("decision") in FINAL:
                    out[d["message_id"]] = (d["decision"], parse_time(d["time"]), d.get("latency_ms") or 0.0)
            return out

        def attempts() -> Counter[str]:
            return Counter(str(d.get("decision")) for d in proc.decisions())

        endpoint = proc.url(f"/push/{ROUTE}")
        store_pid = self.firestore.pid if self.firestore and self.args.store == "firestore" else None
        return proc, endpoint, outcomes, attempts, proc.proc.pid if proc.proc else None, store_pid

    def _start_theirs(self, dest: str, tag: str, bare: bool = False) -> tuple[Any, ...]:
        assert self.datastore is not None, "started for theirs and bare"
        server = TheirServer(
            self.work,
            {
                "PUBSUB_EMULATOR_HOST": self.pubsub.host,
                "DATASTORE_EMULATOR_HOST": self.datastore.host,
                "GOOGLE_CLOUD_PROJECT": self.pubsub.project,
            },
            self.pubsub.project,
            dest,
            kind=tag.replace("-", "_"),
            window=self.args.window,
            bare=bare,
        )
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
        return (
            server,
            server.url(f"/push/{ROUTE}"),
            server.outcomes,
            lambda: Counter(server.counts()),
            server.pid,
            None if bare else self.datastore.pid,
        )

    def _run(
        self,
        system: str,
        rnd: int,
        source: str,
        sub_id: str,
        downstream: str,
        server: Any,
        endpoint: str,
        outcomes: Callable[[], dict[str, Outcome]],
        attempts: Callable[[], Counter[str]],
        server_pid: int | None,
        store_pid: int | None,
    ) -> Result:
        sub = None
        try:
            sub = self.subscribe(source, endpoint, sub_id)  # ours checks it is pushed from this one
            warm: dict[str, Outcome] = {}
            if self.warm:
                warm = self._wait(system, outcomes, set(self.publish(source, self.warm)))
            answers0 = attempts()
            cpu0, store0, ps0 = cpu_seconds(server_pid), cpu_seconds(store_pid), cpu_seconds(self.pubsub.pid)
            t0 = time.time()
            ids = self.publish(source, self.stream)
            published = time.time() - t0
            final = self._wait(system, outcomes, set(ids))
            cpu1, store1, ps1 = cpu_seconds(server_pid), cpu_seconds(store_pid), cpu_seconds(self.pubsub.pid)
            last = max(t for _, t, _ in final.values())
            counted = attempts()
            counted.subtract(answers0)  # the stream's answers only, redeliveries and retries included
        finally:
            if sub is not None:  # first: the emulator retries a vanished endpoint forever
                with contextlib.suppress(Exception):
                    self.admin.delete_subscription(sub)
            if isinstance(server, ServeProcess):
                stop_ours(server)
            else:
                server.stop()
        forwarded = Counter(o for o, _, _ in final.values())
        published_downstream = sum(o in ("forwarded", "fail_open") for o, _, _ in [*final.values(), *warm.values()])
        got = self.admin.pull(downstream, published_downstream, timeout=30)
        got += self.admin.drain(downstream, 1.0)  # anything beyond what was acked as forwarded
        n = len(self.stream)
        return Result(
            system=system,
            round=rnd,
            messages=n,
            elapsed=last - t0,
            publish_s=published,
            outcomes=forwarded,
            attempts=counted,
            downstream=sum(1 for m in got if "n" in m.attributes),
            latency_ms=[(o, ms) for o, _, ms in final.values()],
            server_cpu=(cpu1 - cpu0) / n,
            store_cpu=(store1 - store0) / n,
            pubsub_cpu=(ps1 - ps0) / n,
        )

    def subscribe(self, source: str, endpoint: str, sub_id: str) -> str:
        self.admin.subscriber.create_subscription(
            request={
                "name": self.admin.subscription_path(sub_id),
                "topic": self.admin.topic_path(source),
                "ack_deadline_seconds": ACK_DEADLINE,
                "push_config": {"push_endpoint": endpoint},
                "enable_message_ordering": self.args.ordered,
            }
        )
        self.admin._push_subs.append(sub_id)
        return sub_id

    def _wait(self, system: str, outcomes: Callable[[], dict[str, Outcome]], wanted: set[str]) -> dict[str, Outcome]:
        deadline = time.monotonic() + self.args.timeout
        while True:
            got = outcomes()
            if wanted <= got.keys():
                return {k: got[k] for k in wanted}
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{system}: only {len(wanted & got.keys())} of {len(wanted)} messages acked "
                    f"within {self.args.timeout:g}s"
                )
            time.sleep(POLL)


# --- the run ------------------------------------------------------------------------------


@contextlib.contextmanager
def emulators(
    work: Path, firestore: bool, datastore: bool
) -> Iterator[tuple[PubsubEmulator, FirestoreEmulator | None, DatastoreEmulator | None]]:
    """The Pub/Sub emulator, and the Firestore and Datastore ones where asked for; all stopped at the end."""
    fs = FirestoreEmulator(log_dir=work) if firestore else None
    ds = DatastoreEmulator(log_dir=work) if datastore else None
    pubsub = PubsubEmulator(log_dir=work)
    emus = [e for e in (pubsub, fs, ds) if e is not None]
    try:
        for emu in emus:
            emu.start()
        yield pubsub, fs, ds
    finally:
        for emu in emus:
            with contextlib.suppress(EmulatorError):
                emu.stop()


def check_comparison_installed() -> str | None:
    try:
        import gcp_pubsub_idempotency  # noqa: F401
        from google.cloud import datastore  # noqa: F401
    except ImportError as exc:
        return (
            f"the comparison needs gcp-pubsub-idempotency with its Datastore extra ({exc}): "
            f'.venv/bin/pip install "gcp-pubsub-idempotency[datastore]"'
        )
    return None


def pct(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def ratio(results: list[Result], num: str, den: str) -> tuple[float, list[float]] | None:
    """The median over rounds of num's msg/s over den's, measured in the same round."""
    per = [
        n.rate / d.rate for n in results for d in results if n.system == num and d.system == den and n.round == d.round
    ]
    return (statistics.median(per), [round(x, 2) for x in per]) if per else None


def latency(pairs: list[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """Per final decision: p50 and p95 of the time spent deciding it in the handler, all rounds pooled."""
    by: dict[str, list[float]] = {}
    for decision, ms in pairs:
        by.setdefault(decision, []).append(ms)
    return {
        d: {"p50": round(quantile(v, 0.5), 2), "p95": round(quantile(v, 0.95), 2), "n": len(v)} for d, v in by.items()
    }


def report(results: list[Result], args: argparse.Namespace, expected: int) -> dict[str, Any]:
    summary: dict[str, Any] = {"expected_forwards": expected, "messages": args.messages, "store": args.store}
    for name in SYSTEMS:
        rs = [r for r in results if r.system == name]
        if not rs:
            continue
        summary[name] = {
            "messages_per_s": statistics.median(r.rate for r in rs),
            "elapsed_s": statistics.median(r.elapsed for r in rs),
            "forwarded": statistics.median(r.forwarded for r in rs),
            "downstream": statistics.median(r.downstream for r in rs),
            "server_cpu_ms_per_msg": statistics.median(r.server_cpu for r in rs) * 1000,
            "store_cpu_ms_per_msg": statistics.median(r.store_cpu for r in rs) * 1000,
            "pubsub_cpu_ms_per_msg": statistics.median(r.pubsub_cpu for r in rs) * 1000,
            "latency_ms": latency([x for r in rs for x in r.latency_ms]),
            "rounds": [
                {
                    "messages_per_s": round(r.rate, 1),
                    "elapsed_s": round(r.elapsed, 2),
                    "publish_s": round(r.publish_s, 2),
                    "outcomes": dict(r.outcomes),
                    "answers": dict(r.attempts),
                    "downstream": r.downstream,
                }
                for r in rs
            ],
        }
    for num, den in (("ours", "theirs"), ("ours", "bare"), ("theirs", "bare")):
        if found := ratio(results, num, den):
            summary[f"{num}_over_{den}"], summary[f"{num}_over_{den}_rounds"] = found
    return summary


def table(summary: dict[str, Any]) -> str:
    n = summary["messages"]
    head = ["system", "msg/s", "s", "forwarded", "downstream", "CPU ms/msg: server", "store emu", "pubsub emu"]
    rows = []
    for name in SYSTEMS:
        s = summary.get(name)
        if not s:
            continue
        fwd = "-" if name == "bare" else f"{s['forwarded']:.0f} ({pct(int(s['forwarded']), n)})"
        rows.append(
            [
                LABELS[name]
                + (f" ({'Firestore emu' if summary['store'] == 'firestore' else 'SQLite'})" if name == "ours" else ""),
                f"{s['messages_per_s']:.0f}",
                f"{s['elapsed_s']:.1f}",
                fwd,
                f"{s['downstream']:.0f} ({pct(int(s['downstream']), n)})",
                f"{s['server_cpu_ms_per_msg']:.2f}",
                "-" if math.isnan(s["store_cpu_ms_per_msg"]) else f"{s['store_cpu_ms_per_msg']:.2f}",
                f"{s['pubsub_cpu_ms_per_msg']:.2f}",
            ]
        )
    return harness.markdown_table(head, rows)


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def serve_ours(argv: list[str]) -> int:
    """`pubsub-filter`, under cProfile when `--profile` asked for it."""
    from pubsub_filter.cli import main as filter_main

    profile_dir = os.environ.get("BENCH_E2E_PROFILE")
    if not profile_dir:
        return filter_main(argv)
    import cProfile  # the event loop's thread only: gRPC's and the records' threads are not in it

    # by the thread's CPU time: a coroutine awaiting a reply costs the loop nothing, and wall
    # time would charge the wait to whatever frame was suspended
    prof = cProfile.Profile(time.thread_time)
    try:
        return prof.runcall(filter_main, argv)
    finally:
        prof.dump_stats(Path(profile_dir) / f"ours-{os.getpid()}.prof")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve-theirs"]:
        return serve_theirs(argv[1:])
    if argv[:1] == ["serve-ours"]:
        return serve_ours(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=50)
    ap.add_argument("--unchanged", type=float, default=0.8, help="fraction repeating its key's last content")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=40, help="players per injury report")
    ap.add_argument("--warmup", type=int, default=100, help="messages on other keys before each timed stream")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for one stream to be acked")
    ap.add_argument(
        "--unordered",
        dest="ordered",
        action="store_false",
        help="push subscriptions without message ordering (default: ordered, as provision and infra/ set them)",
    )
    ap.add_argument(
        "--systems",
        default="ours,theirs,bare",
        help="comma-separated: ours, theirs, bare (the emulator push path's own ceiling: parse and ack only)",
    )
    ap.add_argument(
        "--store",
        choices=["firestore", "sqlite"],
        default="firestore",
        help="our state store: the Firestore emulator (production's backend) or the embedded SQLite file",
    )
    ap.add_argument(
        "--window",
        type=float,
        default=1.0,
        help="the peer's publisher batch window in ms (ours sends each forward as its own Publish RPC)",
    )
    ap.add_argument("--json", action="store_true", help="print the full summary as JSON too")
    ap.add_argument("--keep", type=Path, help="write logs, configs and records here (kept) instead of a temp dir")
    ap.add_argument(
        "--profile",
        type=Path,
        help="run ours under cProfile (the event loop's thread), one ours-PID.prof per server in this directory",
    )
    harness.add_smoke(ap)
    args = ap.parse_args(argv)
    harness.smoke(args, messages=6, keys=2, rounds=1, rows=2, warmup=2, timeout=120.0, systems="ours", store="sqlite")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["BENCH_E2E_PROFILE"] = str(args.profile.resolve())  # inherited by serve-ours
    if not 0 <= args.unchanged < 1:
        ap.error("--unchanged must be in [0, 1)")
    if args.rows < 2:
        ap.error("--rows must be at least 2")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or set(systems) - set(SYSTEMS):
        ap.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    if "theirs" in systems and (missing := check_comparison_installed()):
        print(missing, file=sys.stderr)
        return 2
    # Stop everything on Ctrl-C and SIGTERM (installed explicitly: a shell's background job
    # starts with SIGINT ignored, and Python then keeps it ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)

    items = stream(args.messages, args.keys, args.unchanged, args.rows)
    warm = stream(args.warmup, min(args.keys, max(1, args.warmup)), args.unchanged, args.rows, warmup=True)
    expected = sum(it.forward for it in items)
    results: list[Result] = []
    m = harness.machine()
    size = statistics.median(len(it.data) for it in items)
    print(
        f"{harness.machine_line()}\n"
        f"{args.messages} messages over {args.keys} keys, {expected} new or changed "
        f"({pct(expected, args.messages)}), {args.rows} players per report (~{size / 1024:.0f} KiB); "
        f"{args.rounds} rounds, push subscriptions {'with' if args.ordered else 'without'} message ordering, "
        f"the peer's publisher batch window {args.window:g} ms, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = args.keep.resolve()
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-e2e-")))
        try:
            needs_firestore = "ours" in systems and args.store == "firestore"
            needs_datastore = bool({"theirs", "bare"} & set(systems))
            with emulators(work, needs_firestore, needs_datastore) as (pubsub, firestore, datastore):
                admin = PubsubAdmin(pubsub)
                world = World(admin, pubsub, firestore, datastore, work, args, items, warm)
                try:
                    for rnd in range(args.rounds):
                        order = systems[rnd % len(systems) :] + systems[: rnd % len(systems)]
                        for system in order:
                            r = world.run(system, rnd)
                            results.append(r)
                            other = {k: v - r.outcomes[k] for k, v in r.attempts.items() if v - r.outcomes[k] > 0}
                            print(
                                f"round {rnd + 1} {system:<6} {r.rate:7.1f} msg/s  {r.elapsed:6.2f} s  "
                                f"forwarded {r.forwarded:4d}  downstream {r.downstream:4d}  CPU ms/msg: "
                                f"server {r.server_cpu * 1000:5.2f}  store {r.store_cpu * 1000:5.2f}  "
                                f"pubsub {r.pubsub_cpu * 1000:5.2f}  "
                                f"final {dict(r.outcomes)}  answers beyond one per message {other or '-'}",
                                flush=True,
                            )
                finally:
                    admin.cleanup()
        except EmulatorError as exc:
            print(f"cannot start the emulators: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: every process started here was stopped", file=sys.stderr)
            return 130
    if not results:
        return 1
    summary = report(results, args, expected)
    print()
    print(table(summary))
    print()
    for num, den in (("ours", "theirs"), ("ours", "bare"), ("theirs", "bare")):
        if f"{num}_over_{den}" in summary:
            print(
                f"{num}/{den} msg/s: {summary[f'{num}_over_{den}']:.2f}x "
                f"(per round: {summary[f'{num}_over_{den}_rounds']})"
            )
    for name in SYSTEMS:
        if name in summary and name != "bare":
            lat = ", ".join(
                f"{d} p50 {x['p50']:.1f} p95 {x['p95']:.1f} (n {x['n']})"
                for d, x in summary[name]["latency_ms"].items()
            )
            print(f"{name}: ms deciding in the handler (engine / guard + publish): {lat}")
    print(
        f"a content filter should forward {expected} of {args.messages} (new or changed content); "
        "keyed on the message id, every publish is new to gcp-pubsub-idempotency"
    )
    if args.json:
        print(json.dumps({"machine": m, **summary}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
