"""A round-robin HTTP front for Pub/Sub pushes: one subscription, several `serve` instances.

    front = RoundRobin(["http://127.0.0.1:P1", "http://127.0.0.1:P2"]).start()
    admin.push_subscription(topic, front.url("/push/route"))
    front.drain(0)      # new pushes skip backend 0 (requests already there continue)
    front.undrain(0)
    front.stop()

`per_backend=1` gives each backend one push at a time, like Cloud Run with
`--concurrency=1`: a push goes to the next backend in turn that has a free slot (when none
has, to the next one anyway, counted in `overflows`: the front never holds a push back).

Each push goes to the next backend in turn, like Cloud Run spreading requests over
instances. A backend that is down (killed, restarting) answers nothing: the front
answers 502, which Pub/Sub treats as a nack and redelivers, as it would when an instance
dies under a request. Backends are addressed by URL, so a process restarted on the same
port is picked up again without telling the front.

uvicorn runs in a thread (no signal handlers off the main thread) with its own event
loop; `stop()` joins it. `log` has one `Forwarded` per push, in completion order.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .net import free_port

START_DEADLINE = 15.0


@dataclass(frozen=True)
class Forwarded:
    backend: int
    message_id: str | None
    ordering_key: str | None  # as the push envelope carried it (the emulator sends none)
    status: int  # the backend's answer; 502 when it could not be reached
    started: float  # time.time()
    ended: float


class RoundRobin:
    """Hand each POST to the next backend that is not drained; answer 502 when it cannot be reached."""

    def __init__(self, backends: list[str], timeout: float = 60.0, per_backend: int | None = None):
        self.backends = list(backends)
        self.port = free_port()
        self.timeout = timeout
        self.per_backend = per_backend
        self.overflows = 0
        self.log: list[Forwarded] = []
        self.in_flight = [0] * len(self.backends)
        self.max_in_flight = [0] * len(self.backends)
        self._drained: set[int] = set()
        self._next = 0
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            # One fresh connection per push: a pooled keep-alive connection to a killed backend
            # would turn the next push into a 502 that says nothing about the restarted one.
            limits = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:
                self._client = client
                yield

        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["POST"])], lifespan=lifespan)
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self._thread = threading.Thread(target=self._server.run, name="round-robin", daemon=True)

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    # --- steering -----------------------------------------------------------------------

    def drain(self, backend: int) -> None:
        """Send new pushes to the other backends (at least one must stay)."""
        with self._lock:
            self._drained.add(backend)
            assert len(self._drained) < len(self.backends), "draining every backend"

    def undrain(self, backend: int) -> None:
        with self._lock:
            self._drained.discard(backend)

    def _pick(self) -> int:
        with self._lock:
            n = len(self.backends)
            order = [(self._next + k) % n for k in range(n)]
            open_ = [i for i in order if i not in self._drained]
            free = [i for i in open_ if self.per_backend is None or self.in_flight[i] < self.per_backend]
            if not free:
                self.overflows += 1
            i = (free or open_)[0]
            self._next = i + 1
            self.in_flight[i] += 1
            self.max_in_flight[i] = max(self.max_in_flight[i], self.in_flight[i])
            return i

    # --- forwarding ---------------------------------------------------------------------

    async def _forward(self, request: Request) -> Response:
        started = time.time()
        i = self._pick()
        body = await request.body()
        assert self._client is not None
        try:
            resp = await self._client.post(
                self.backends[i] + request.url.path, content=body, headers={"content-type": "application/json"}
            )
            status, content = resp.status_code, resp.content
        except httpx.HTTPError:
            status, content = 502, b""
        finally:
            with self._lock:
                self.in_flight[i] -= 1
        message_id, ordering_key = _message_fields(body)
        self.log.append(Forwarded(i, message_id, ordering_key, status, started, time.time()))
        return Response(content, status, media_type="application/json")

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> RoundRobin:
        self._thread.start()
        deadline = time.monotonic() + START_DEADLINE
        while not self._server.started:
            if not self._thread.is_alive():
                raise AssertionError("the round-robin front did not start")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the round-robin front did not start within {START_DEADLINE:g}s")
            self._thread.join(0.02)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._server.should_exit = True
        self._thread.join(15)
        assert not self._thread.is_alive(), "the round-robin front did not stop"

    def __enter__(self) -> RoundRobin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _message_fields(body: bytes) -> tuple[str | None, str | None]:
    """(message id, ordering key) of a push envelope, None for what it does not carry."""
    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
        message = json.loads(body)["message"]
        mid = message.get("messageId") or message.get("message_id")
        key = message.get("orderingKey") or message.get("ordering_key")
        return (str(mid) if mid else None), (str(key) if key else None)
    return None, None
