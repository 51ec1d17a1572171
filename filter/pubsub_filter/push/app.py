"""The Cloud Run push endpoint: a thin HTTP surface over `Engine.handle`.

Pub/Sub acks a push on 2xx and redelivers on anything else. The emulator does not treat
202 as an ack, so every acked decision answers 200.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.offload import OFF_LOOP_BYTES
from pubsub_filter.core.engine.stopping import Stop
from pubsub_filter.core.envelope import EnvelopeError
from pubsub_filter.core.logs import get_logger, trace_field
from pubsub_filter.core.model import Cause, DecisionRecord, Message
from pubsub_filter.core.numerals import bounded_int, digits_of
from pubsub_filter.push.admission import BytesInFlight, LoopLag, SenderDeadline
from pubsub_filter.push.trace_headers import REQUEST_HEADERS, request_parent_of, trace_of
from pubsub_filter.push.turns import Turns
from pubsub_filter.push.unwrapped import MESSAGE_ID, parse_push
from pubsub_filter.runtime.probes import probe_routes, telemetry_of

log = get_logger("pubsub_filter.push")

#: Characters of a made-up route name kept in its record and decision line (anyone may send one).
MAX_ROUTE_NAME = 200


class _TooLarge(Exception):
    pass


def bounded_route_name(name: str) -> str:
    """A name a request made up, as its record and log lines keep it: at most `MAX_ROUTE_NAME` characters."""
    return name if len(name) <= MAX_ROUTE_NAME else name[:MAX_ROUTE_NAME] + "…"


Headers = tuple[tuple[bytes, bytes], ...]
#: An answer as the push path sends it: status, headers besides the length and type, body.
Answer = tuple[int, Headers, bytes]

_RETRY = ((b"retry-after", b"1"),)
_CLOSE = ((b"connection", b"close"),)
_JSON_TYPE = (b"content-type", b"application/json")


def _json(body: dict[str, Any], status: int = 200, headers: Headers = ()) -> Answer:
    return status, headers, msgspec.json.encode(body)


async def _send(send: Send, answer: Answer) -> None:
    """`answer` as Starlette's `Response(body, status, headers, media_type="application/json")`
    sends it: the given headers, then the length, then the type (none for an empty answer)."""
    status, headers, body = answer
    raw = [*headers, (b"content-length", str(len(body)).encode())]
    if body:
        raw.append(_JSON_TYPE)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


# the message id: a push with payload unwrapping and its metadata (`pubsub_filter.push.unwrapped`)
_READ_HEADERS = frozenset((b"content-length", MESSAGE_ID, *REQUEST_HEADERS))
_READ_WITH_AUTH = _READ_HEADERS | {b"authorization"}


def _headers(raw: Any, names: frozenset[bytes]) -> dict[bytes, str]:
    found: dict[bytes, str] = {}
    for name, value in raw:
        if name in names and name not in found:
            found[name] = value.decode("latin-1")
    return found


def headers_of(request: Request) -> dict[bytes, str]:
    """The few headers the push path reads, in one pass over the raw list: the first of each,
    as `request.headers.get` gives it (ASGI names are lower case)."""
    return _headers(request.scope["headers"], _READ_HEADERS)


class _Disconnected(Exception):
    pass


def declared_size(declared: str | None, limit: int) -> int | None:
    """The body's declared length (`content-length`), None when there is none; `_TooLarge` over `limit`."""
    if declared is None or not declared.isascii() or not declared.isdigit():
        return None
    # more digits than `limit` has: larger, whatever they are (and never handed to int())
    size = bounded_int(declared, digits_of(limit))
    if size is None or size > limit:
        raise _TooLarge
    return size


#: The server's own delays while bodies are read (`pubsub_filter.push.admission.LoopLag`).
LAG = LoopLag()

#: Bytes from which a body is decoded in a turn of the loop of its own (`pubsub_filter.push.turns`):
#: the engine's large messages' (`core.engine.offload.OFF_LOOP_BYTES`), which its body is at least.
LARGE_BODY = OFF_LOOP_BYTES


async def _body(
    receive: Receive, limit: int, declared: str | None, within: float, lag: LoopLag = LAG
) -> bytes | bytearray:
    """The request body, at most `limit` bytes (`_TooLarge`), within `within` seconds of the
    sender's (`TimeoutError`); `_Disconnected` when the client left.

    The time the event loop was held meanwhile (`lag`) is the server's, not the sender's: the
    deadline moves by it. A body that came whole in its first message (any small push) never
    waits, and never starts the watch."""
    declared_size(declared, limit)
    async with asyncio.timeout(within) as timeout:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if len(chunk) > limit:
            raise _TooLarge
        if not message.get("more_body", False):
            return bytes(chunk)
        sender = SenderDeadline(timeout, lag, within)  # from here on, the sender's time decides
        try:
            # Gathered into one buffer part by part, as the parts come: a join when the last came
            # would copy all of a 10 MB body (onto pages touched for the first time) in one step
            # of the loop, and bodies that end together would be joined back to back.
            body = bytearray(chunk)
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected
                chunk = message.get("body", b"")
                if len(body) + len(chunk) > limit:
                    raise _TooLarge
                body += chunk
                if not message.get("more_body", False):
                    return body
        finally:
            sender.close()


async def _drained(receive: Receive, within: float, lag: LoopLag = LAG) -> bool:
    """Whether the rest of a body that is not wanted was read and dropped, a chunk at a time, by its
    end (or its client's leaving), within `within` seconds of the sender's.

    An answer given before its body is read (a 429 past the bytes in flight, a 413, a 404, a
    refused caller) still has the body coming: left to uvicorn, it would be read and dropped as
    fast as it arrives, up to 32 reads a connection in one turn of the loop. A burst of large
    pushes answered 429 and sent again at once made that 7 GB in 8 s, and `/healthz` waited
    behind turns of 200 MB. Read here, each body takes one chunk a turn, as a body being read
    does (uvicorn's flow control), and one chunk is all that is held."""
    try:
        async with asyncio.timeout(within) as timeout:
            sender = SenderDeadline(timeout, lag, within)
            try:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect" or not message.get("more_body", False):
                        return True
            finally:
                sender.close()
    except TimeoutError:
        return False


def _cancelled_answer() -> Answer:
    return _json({"decision": "failed", "reason": "cancelled by the shutdown; sent again"}, 503, _RETRY)


async def _cancelled(engine: Engine, route: str, trace: str | None) -> Answer:
    """The answer to a request cancelled by a shutdown that could not wait for it (uvicorn past
    its share of `server.shutdown_budget`): a nack, which Pub/Sub redelivers, rather than the plain 500 and
    traceback an exception would give. A cancel that reached the engine has released the
    lease and recorded the decision (`failed`, cause `cancelled`, or the one just taken)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()  # taken: what is left of the request is writing this answer
    engine.note("push_cancelled")
    log.warning("push_cancelled", route=route, **trace_field(trace))
    with contextlib.suppress(asyncio.CancelledError):  # one more cancel: answer all the same
        await engine.recorded()  # as every answer: once its decision's row is written
    return _cancelled_answer()


class PushApp:
    """The filter's HTTP surface: `POST /push/{route}` as one plain ASGI callable, everything
    else (the probes, `/metrics`, lifespan, 404 and 405 answers) by a Starlette app beside it.

    Starlette's routing and request objects cost about as much as the rest of a suppressed
    request's HTTP handling; the push path reads a few headers and the body straight from ASGI."""

    def __init__(self, push: Callable[[str, Scope, Receive, Send], Awaitable[None]], probes: Starlette) -> None:
        self.push = push
        self.probes = probes
        #: the probes app's router (its lifespan is the app's)
        self.router = probes.router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path: str = scope["path"]
            if path.startswith("/push/"):
                route = path[6:]
                if route and "/" not in route:
                    await self.push(route, scope, receive, send)
                    return
        await self.probes(scope, receive, send)


class _PushHandler:
    """`POST /push/{route}`: the request's few headers, its caller checked, its body read, its
    message decided by the engine, and the decision answered (`answer_for`)."""

    __slots__ = (
        "admission_wait",
        "authenticator",
        "body_timeout",
        "decoding",
        "engine",
        "in_flight",
        "max_body",
        "no_metadata",
        "read_headers",
        "routes",
        "tracing",
    )

    def __init__(self, engine: Engine, authenticator: Any, body_timeout: float) -> None:
        facts = engine.facts
        self.engine = engine
        self.authenticator = authenticator
        self.max_body = facts.max_body
        self.body_timeout = body_timeout
        self.in_flight = BytesInFlight(facts.max_bytes_in_flight)
        self.admission_wait = facts.admission_wait
        self.decoding = Turns()  # large bodies, one per turn of the loop
        tel = telemetry_of(engine)
        self.tracing = tel is not None and tel.tracing
        self.read_headers = _READ_HEADERS if authenticator is None else _READ_WITH_AUTH
        self.routes = frozenset(facts.routes)  # any other is answered 404
        # routes whose subscription pushes the data without metadata: a body there is never an envelope
        self.no_metadata = frozenset(n for n, r in facts.routes.items() if r.push_format == "unwrapped_no_metadata")

    async def __call__(self, route: str, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope["headers"], self.read_headers)
        try:
            answer = await self.answer(route, scope, receive, headers)
        except asyncio.CancelledError:
            answer = await _cancelled(self.engine, route, trace_of(headers))
        await _send(send, answer)

    async def answer(self, route: str, scope: Scope, receive: Receive, headers: dict[bytes, str]) -> Answer:
        """`headers`: the request's few (`_headers`). The request's trace travels as a parameter
        to every line that tells of it: the decision's and its lifecycle lines (`Engine.handle`)."""
        engine = self.engine
        if self.authenticator is not None:
            refused = await self._refused(route, headers.get(b"authorization"))
            if refused is not None:
                return await self._unheard(receive, refused)
        trace = trace_of(headers)  # the log lines'
        parent = request_parent_of(headers) if self.tracing else None  # the decision's
        if route not in self.routes:
            route = bounded_route_name(route)
            rec = await engine.reject(route, None, f"unknown route {route!r}", trace=trace, cause=Cause.UNKNOWN_ROUTE)
            return await self._unheard(receive, _json({"decision": "rejected", "reason": rec.reason}, 404))
        try:
            size = declared_size(headers.get(b"content-length"), self.max_body)
        except _TooLarge as exc:
            return await self._unheard(receive, await self._unread(route, exc, trace))
        held = size or 0  # a body of no declared length is counted once read
        in_flight = self.in_flight
        if not in_flight.admit(held) and not await in_flight.admit_within(held, self.admission_wait):
            return await self._unheard(receive, await self._overloaded(route, held, headers, trace))
        try:
            try:
                body = await _body(receive, self.max_body, None, self.body_timeout)
            except _TooLarge as exc:
                return await self._unheard(receive, await self._unread(route, exc, trace))
            except (TimeoutError, _Disconnected) as exc:
                return await self._unread(route, exc, trace)
            if size is None:
                if not self.in_flight.admit(len(body)):
                    return await self._overloaded(route, len(body), headers, trace)
                held = len(body)
            try:
                if len(body) < LARGE_BODY:
                    msg = parse_push(body, scope["headers"], MESSAGE_ID in headers, route in self.no_metadata)
                else:
                    async with self.decoding.turn():
                        msg = parse_push(body, scope["headers"], MESSAGE_ID in headers, route in self.no_metadata)
            except EnvelopeError as exc:
                rec = await engine.reject(route, None, str(exc), trace=trace, message_id=exc.message_id)
                return _json({"decision": "rejected", "reason": rec.reason}, 400)
            del body  # the message holds what is needed: a large body is not kept twice while it waits
            return await self._decide(route, msg, trace, parent)
        finally:
            self.in_flight.release(held)

    async def _unheard(self, receive: Receive, answer: Answer) -> Answer:
        """`answer`, given before its body was read, once the body has been dropped (`_drained`);
        with the connection closed when it did not end in time (what is left of it must not be
        read as the next request)."""
        if await _drained(receive, self.body_timeout):
            return answer
        status, headers, body = answer
        return status, headers + _CLOSE, body

    async def _decide(self, route: str, msg: Message, trace: str | None, parent: Any) -> Answer:
        return _decided((await self.engine.handle(route, msg, trace, parent=parent)).record)

    async def _overloaded(self, route: str, size: int, headers: dict[bytes, str], trace: str | None) -> Answer:
        """The answer to a push past the bound on bytes in flight: a prompt retry, recorded and counted."""
        self.engine.note("push_overloaded")
        bound = self.in_flight.bound
        waited = f" after {self.admission_wait:g}s of waiting for room" if self.admission_wait and size else ""
        reason = (
            f"{self.in_flight.held} bytes of pushes in flight, and this one's {size} would pass "
            f"server.max_bytes_in_flight ({bound}){waited}: sent again later"
        )
        mid = headers.get(MESSAGE_ID)
        rec = await self.engine.turned_away(route, reason, trace=trace, message_id=mid[:256] if mid else None)
        return _decided(rec)

    async def _refused(self, route: str, authorization: str | None) -> Answer | None:
        """The answer to a caller the authenticator does not let in; None for one it does."""
        from pubsub_filter.push.auth import AuthError

        try:
            await self.authenticator.verify(authorization)
        except AuthError as exc:
            if exc.status == 503:  # Google's certificates out of reach: our outage, and Pub/Sub retries
                log.warning("push_auth_unavailable", route=route, reason=exc.reason)
                return _json({"error": exc.reason}, 503, _RETRY)
            self.engine.note("auth_rejected")
            log.warning("push_unauthorized", route=bounded_route_name(route), status=exc.status, reason=exc.reason)
            return _json({"error": exc.reason}, exc.status)
        return None

    async def _unread(self, route: str, exc: Exception, trace: str | None) -> Answer:
        """The answer to a body that was not read: too large, too slow, or its client gone."""
        if isinstance(exc, _Disconnected):
            # Nobody is left to answer, and no decision was taken: Pub/Sub sends it again.
            self.engine.note("client_disconnected")
            log.info("push_client_disconnected", route=route, **trace_field(trace))
            return 499, (), b""
        if isinstance(exc, _TooLarge):
            rec = await self.engine.reject(route, None, f"body larger than {self.max_body} bytes", trace=trace)
            return _json({"decision": "rejected", "reason": rec.reason}, 413)
        reason = f"body not received in full within {self.body_timeout:g}s"
        rec = await self.engine.reject(route, None, reason, trace=trace)
        # the rest of the body may still arrive: it must not be read as the next request
        return _json({"decision": "rejected", "reason": rec.reason}, 408, _CLOSE)


def _decided(rec: DecisionRecord) -> Answer:
    """A decision's answer: its status and retry hint (`answer_for`), and the record's gist as JSON."""
    answer = answer_for(rec)
    out: dict[str, Any] = {
        "decision": str(rec.decision),
        "reason": rec.reason,
        "message_id": rec.message_id,
    }
    if rec.key is not None:
        out["key"] = rec.key
        out["fingerprint"] = rec.fingerprint
    if not rec.enforced:
        out["enforced"] = False
    if rec.published_id:
        out["published_id"] = rec.published_id
    return _json(out, answer.status, _RETRY if answer.retry_after else ())


def _probes(engine: Engine, push: _PushHandler, lifespan: Any) -> Starlette:
    """Everything but a direct `POST /push/{route}`: the probes, `/metrics`, the push endpoint
    under a mounted root path, lifespan, and Starlette's 404 and 405 answers."""

    async def routed(scope: Scope, receive: Receive, send: Send) -> None:
        """The push endpoint as Starlette reaches it (a mounted root path): the same handler."""
        await push(scope["path_params"]["route"], scope, receive, send)

    routes = [Route("/push/{route}", routed, methods=["POST"]), *probe_routes(engine)]
    return Starlette(routes=routes, lifespan=lifespan)


def create_app(
    engine: Engine, authenticator: Any = None, lifespan: Any = None, body_timeout: float | None = None
) -> PushApp:
    # A client that sends part of a body and stalls would otherwise hold a request (and its memory) open for good.
    body_timeout = engine.facts.body_timeout if body_timeout is None else body_timeout
    push = _PushHandler(engine, authenticator, body_timeout)
    return PushApp(push, _probes(engine, push, lifespan))


@contextlib.asynccontextmanager
async def engine_lifespan(engine: Engine, stopping: Callable[[], Stop | None] = lambda: None) -> AsyncIterator[None]:
    """Close cleanly after uvicorn has drained in-flight requests on SIGTERM: within what is
    left of the stop `stopping()` gives (the one begun at the signal), else a budget from now."""
    facts = engine.facts
    log.info("serving", routes=sorted(facts.routes), instance=facts.instance)
    try:
        yield
    finally:
        await engine.close(stopping())
        log.info("stopped", instance=facts.instance)
