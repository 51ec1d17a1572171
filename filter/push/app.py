"""The Cloud Run push endpoint: a thin HTTP surface over `Engine.handle`.

Pub/Sub acks a push on 2xx and redelivers on anything else. The emulator does not treat
202 as an ack, so every acked decision answers 200.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from filter.core.answer import answer_for
from filter.core.counters import counts
from filter.core.engine import Engine
from filter.core.envelope import EnvelopeError, parse_envelope
from filter.core.model import Cause
from filter.core.numerals import bounded_int, digits_of
from filter.observability.probes import backend_problems, metrics_routes, telemetry_of
from filter.observability.tracing import REQUEST_HEADERS, REQUEST_PARENT, request_trace, trace_of

log = structlog.get_logger("pubsub_filter.push")

#: Characters of a made-up route name kept in its record and decision line (anyone may send one).
MAX_ROUTE_NAME = 200


class _TooLarge(Exception):
    pass


def cut(name: str) -> str:
    """A name a request made up, as its record and log lines keep it: at most `MAX_ROUTE_NAME` characters."""
    return name if len(name) <= MAX_ROUTE_NAME else name[:MAX_ROUTE_NAME] + "…"


def _json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(body), status, headers, media_type="application/json")


_READ_HEADERS = frozenset((b"content-length", *REQUEST_HEADERS))


def headers_of(request: Request) -> dict[bytes, str]:
    """The few headers the push path reads, in one pass over the raw list: the first of each,
    as `request.headers.get` gives it (ASGI names are lower case), without three scans and
    the KeyError each missing header costs there."""
    found: dict[bytes, str] = {}
    for name, value in request.scope["headers"]:
        if name in _READ_HEADERS and name not in found:
            found[name] = value.decode("latin-1")
    return found


async def _body(request: Request, limit: int, declared: str | None) -> bytes:
    if declared is not None and declared.isascii() and declared.isdigit():
        # more digits than `limit` has: larger, whatever they are (and never handed to int())
        size = bounded_int(declared, digits_of(limit))
        if size is None or size > limit:
            raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _cancelled(engine: Engine, route: str) -> Response:
    """The answer to a request cancelled by a shutdown that could not wait for it (uvicorn past
    `server.shutdown_grace`): a nack, which Pub/Sub redelivers, rather than the plain 500 and
    traceback an exception would give. A cancel that reached the engine has released the
    lease and recorded the decision (`failed`, cause `cancelled`, or the one just taken)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()  # taken: what is left of the request is writing this answer
    counts["push_cancelled"] += 1
    log.warning("push_cancelled", route=route)
    with contextlib.suppress(asyncio.CancelledError):  # one more cancel: answer all the same
        await engine.recorded()  # as every answer: once its decision's row is written
    return _json({"decision": "failed", "reason": "cancelled by the shutdown; sent again"}, 503, {"Retry-After": "1"})


def create_app(
    engine: Engine, authenticator: Any = None, lifespan: Any = None, body_timeout: float | None = None
) -> Starlette:
    max_body = engine.config.server.max_body
    # A client that sends part of a body and stalls would otherwise hold a request (and its memory) open for good.
    body_timeout = engine.config.server.body_timeout if body_timeout is None else body_timeout
    tel = telemetry_of(engine)
    tracing = tel is not None and tel.tracing

    async def push(request: Request) -> Response:
        try:
            return await answer(request)
        except asyncio.CancelledError:
            return await _cancelled(engine, request.path_params["route"])

    async def answer(request: Request) -> Response:
        route = request.path_params["route"]
        if authenticator is not None:
            from filter.push.auth import AuthError

            try:
                await authenticator.verify(request.headers.get("authorization"))
            except AuthError as exc:
                if exc.status == 503:  # Google's certificates out of reach: our outage, and Pub/Sub retries
                    log.warning("push_auth_unavailable", route=route, reason=exc.reason)
                    return _json({"error": exc.reason}, 503, {"Retry-After": "1"})
                counts["auth_rejected"] += 1
                log.warning("push_unauthorized", route=cut(route), status=exc.status, reason=exc.reason)
                return _json({"error": exc.reason}, exc.status)
        headers = headers_of(request)
        # the log line's trace, and the decision's parent (`tracing.request_trace`: one parse)
        trace, parent = request_trace(headers) if tracing else (trace_of(headers), None)
        if trace:
            # Lifecycle lines (lease taken over, heartbeat failed...) then carry the request's trace too.
            structlog.contextvars.bind_contextvars(trace=trace)
        if route not in engine.rules:
            route = cut(route)
            rec = await engine.reject(route, None, f"unknown route {route!r}", trace=trace, cause=Cause.UNKNOWN_ROUTE)
            return _json({"decision": "rejected", "reason": rec.reason}, 404)
        try:
            async with asyncio.timeout(body_timeout):
                body = await _body(request, max_body, headers.get(b"content-length"))
        except _TooLarge:
            rec = await engine.reject(route, None, f"body larger than {max_body} bytes", trace=trace)
            return _json({"decision": "rejected", "reason": rec.reason}, 413)
        except TimeoutError:
            rec = await engine.reject(route, None, f"body not received in full within {body_timeout:g}s", trace=trace)
            # the rest of the body may still arrive: it must not be read as the next request
            return _json({"decision": "rejected", "reason": rec.reason}, 408, {"Connection": "close"})
        except ClientDisconnect:
            # Nobody is left to answer, and no decision was taken: Pub/Sub sends it again.
            counts["client_disconnected"] += 1
            log.info("push_client_disconnected", route=route)
            return Response(status_code=499)
        try:
            msg = parse_envelope(body)
        except EnvelopeError as exc:
            rec = await engine.reject(route, None, str(exc), trace=trace, message_id=exc.message_id)
            return _json({"decision": "rejected", "reason": rec.reason}, 400)
        if parent is not None:
            token = REQUEST_PARENT.set(parent)  # the decision's parent: the push request's trace
            try:
                rec = await engine.handle(route, msg, trace)
            finally:
                REQUEST_PARENT.reset(token)
        else:
            rec = await engine.handle(route, msg, trace)
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
        return _json(out, answer.status, {"Retry-After": "1"} if answer.retry_after else None)

    async def healthz(_: Request) -> Response:
        return _json({"status": "ok", "in_flight": engine.in_flight, "counts": dict(counts)})

    async def readyz(_: Request) -> Response:
        problems = await backend_problems(engine)
        if problems:
            return _json({"status": "unavailable", **problems}, 503)
        return _json({"status": "ready"})

    routes = [
        Route("/push/{route}", push, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    routes += metrics_routes(engine)
    return Starlette(
        routes=routes,
        lifespan=lifespan,
    )


@contextlib.asynccontextmanager
async def engine_lifespan(engine: Engine) -> AsyncIterator[None]:
    """Close cleanly after uvicorn has drained in-flight requests on SIGTERM."""
    log.info("serving", routes=sorted(engine.rules), instance=engine.instance)
    try:
        yield
    finally:
        # A hung records backend must not hold up shutdown past the grace period.
        await engine.close()
        log.info("stopped", instance=engine.instance)
