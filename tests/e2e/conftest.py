"""End-to-end fixtures: the Pub/Sub emulator pushing to real `pubsub-filter serve` processes.

A `Pipeline` is one test's world: a source topic, a destination topic with an ordered pull
subscription (the downstream phase), a dead-letter topic with a pull subscription, a
Firestore collection of its own, and the serve processes and push subscriptions it
started. Teardown deletes push subscriptions first (the emulator retries a vanished
endpoint forever), then stops every process with SIGTERM (asserting a clean exit), then
deletes topics and subscriptions.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.emulators import FirestoreEmulator, PubsubEmulator
from tests.support.net import free_port
from tests.support.pubsub_helpers import DelayProxy, PubsubAdmin, Pulled, unique
from tests.support.serve import ServeProcess, write_config

ROUTE = "injury"
#: Lease timing for the tests: duration > ack_deadline > heartbeat, with the push
#: subscriptions' ack deadline (10 s, the minimum Pub/Sub allows) as ack_deadline.
LEASE = {"duration": "20s", "ack_deadline": "10s", "heartbeat": "2s"}
ACK_DEADLINE = 10


def route_config(subscription: str, destination: str) -> dict[str, Any]:
    """The injury-report route of examples/filter.yaml: what counts is the players' status."""
    return {
        "name": ROUTE,
        "subscription": subscription,
        "destination": destination,
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["player_lookup", "game_id"],
        "include": ["player_lookup", "team", "game_date", "game_id", "injury_status", "reason", "reason_category"],
    }


@dataclass
class Pipeline:
    admin: PubsubAdmin
    pubsub: PubsubEmulator
    firestore: FirestoreEmulator
    tmp_path: Path
    source: str = ""
    dest: str = ""
    dlq: str = ""
    dest_sub: str = ""
    dlq_sub: str = ""
    collection: str = ""
    push_subs: list[str] = field(default_factory=list)
    procs: list[ServeProcess] = field(default_factory=list)
    _cleanups: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source = self.admin.topic("source")
        self.dest = self.admin.topic("dest")
        self.dlq = self.admin.topic("dlq")
        self.dest_sub = self.admin.pull_subscription(self.dest, "downstream", ordered=True)
        self.dlq_sub = self.admin.pull_subscription(self.dlq, "dead-letters")
        self.collection = unique("e2e")
        self.push_sub_id = unique("push")

    @property
    def project(self) -> str:
        return self.pubsub.project

    # --- filter processes -------------------------------------------------------------

    def config(self, name: str, publisher_timeout: str = "60s", **top: Any) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "project": self.project,
            "store": {"backend": "firestore", "collection": self.collection},
            "publisher": {"backend": "pubsub", "timeout": publisher_timeout},
            "records": {"backend": "sqlite", "path": str(self.tmp_path / f"{name}-decisions.db")},
            "lease": dict(LEASE),
            "server": {"shutdown_budget": "15s"},
            "routes": [route_config(self.push_sub_id, self.dest)],
        }
        cfg.update(top)
        return cfg

    def start_filter(self, name: str = "serve", pubsub_host: str | None = None, **config: Any) -> ServeProcess:
        """Start `pubsub-filter serve` against the emulators (Pub/Sub via `pubsub_host` if given)."""
        path = write_config(self.tmp_path / f"{name}.yaml", self.config(name, **config))
        proc = ServeProcess(
            path,
            self.tmp_path / f"{name}.log",
            env={
                "PUBSUB_EMULATOR_HOST": pubsub_host or self.pubsub.host,
                "FIRESTORE_EMULATOR_HOST": self.firestore.host,
                "GOOGLE_CLOUD_PROJECT": self.project,
            },
            name=name,
        )
        self.procs.append(proc)
        return proc.start()

    def records_path(self, name: str = "serve") -> Path:
        return self.tmp_path / f"{name}-decisions.db"

    # --- subscriptions ----------------------------------------------------------------

    def subscribe(self, endpoint: str, **kwargs: Any) -> str:
        """The push subscription the route expects, source → `endpoint`, dead-lettering to `dlq`."""
        kwargs.setdefault("dead_letter_topic", self.dlq)
        kwargs.setdefault("ack_deadline", ACK_DEADLINE)
        sub = self.admin.push_subscription(self.source, endpoint, sub_id=self.push_sub_id, **kwargs)
        self.push_subs.append(sub)
        return sub

    # --- messages ---------------------------------------------------------------------

    def publish(self, payload: dict[str, Any], **attributes: str) -> str:
        return self.admin.publish(self.source, json.dumps(payload).encode(), **attributes)

    def downstream(self, count: int, timeout: float = 30.0) -> list[Pulled]:
        return self.admin.pull(self.dest_sub, count, timeout)

    def assert_no_more_downstream(self, period: float = 2.0) -> None:
        self.admin.assert_nothing_more(self.dest_sub, period)

    def assert_nothing_dead_lettered(self, period: float = 1.0) -> None:
        self.admin.assert_nothing_more(self.dlq_sub, period)

    def on_teardown(self, fn: Any) -> None:
        self._cleanups.append(fn)

    def teardown(self) -> None:
        errors: list[BaseException] = []
        for sub in self.push_subs:
            self.admin.delete_subscription(sub)
        for proc in self.procs:
            try:
                proc.stop()
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


@pytest.fixture
def pipeline(pubsub_emulator: PubsubEmulator, firestore: FirestoreEmulator, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(PubsubAdmin(pubsub_emulator), pubsub_emulator, firestore, tmp_path)
    try:
        yield p
    finally:
        p.teardown()


@pytest.fixture
def delay_proxy(pubsub_emulator: PubsubEmulator) -> Iterator[DelayProxy]:
    """A TCP proxy in front of the Pub/Sub emulator that can hold publishes (`.delay`).

    Request it before `pipeline` so it outlives the serve processes that talk through it.
    """
    with DelayProxy(pubsub_emulator.host) as proxy:
        yield proxy


# --- a round-robin push forwarder: one subscription, several instances ----------------------


@dataclass
class Forwarded:
    backend: int
    message_id: str | None
    status: int


class RoundRobin:
    """An HTTP front that hands each push to the next backend in turn, like Cloud Run across instances.

    Runs uvicorn in a thread (no signal handlers off the main thread); `stop()` joins it.
    """

    def __init__(self, backends: list[str]):
        self.backends = backends
        self.port = free_port()
        self.log: list[Forwarded] = []
        self._next = 0
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            async with httpx.AsyncClient(timeout=60) as client:
                self._client = client
                yield

        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["POST"])], lifespan=lifespan)
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self._thread = threading.Thread(target=self._server.run, name="round-robin", daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _forward(self, request: Request) -> Response:
        with self._lock:
            i = self._next % len(self.backends)
            self._next += 1
        assert self._client is not None
        body = await request.body()
        try:
            resp = await self._client.post(
                self.backends[i] + request.url.path, content=body, headers={"content-type": "application/json"}
            )
        except httpx.HTTPError:
            self.log.append(Forwarded(i, _message_id(body), 502))
            return Response(status_code=502)
        self.log.append(Forwarded(i, _message_id(body), resp.status_code))
        return Response(resp.content, resp.status_code, media_type="application/json")

    def start(self) -> RoundRobin:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise AssertionError("the round-robin forwarder did not start")
            self._thread.join(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(15)
        assert not self._thread.is_alive(), "the round-robin forwarder did not stop"


def _message_id(body: bytes) -> str | None:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        message = json.loads(body)["message"]
        return str(message.get("messageId") or message.get("message_id"))
    return None
