"""The production publisher: Google Cloud Pub/Sub, one Publish RPC per message on the event loop.

The source message waits for this publish to be confirmed before it is acked, so it is made for
latency: each publish is its own RPC, sent at once (no batch window) on a `grpc.aio` channel
(`pubsub_wire`), awaited on the loop without a thread. Ordering keys are kept here
(`turns`): a key's publishes are sent one at a time, in the order they were asked for.
Transient errors are retried (tenacity) inside one time budget, `timeout`; everything else,
and a budget that runs out, becomes `PublishFailed` with a reason an operator can act on.

`PUBSUB_EMULATOR_HOST`, when set as the publisher is made, sends every publish to the emulator
(a plain channel, no credentials), as the client library does.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from typing import Any

import google.auth
import grpc
from google.api_core import exceptions as gexc
from google.pubsub_v1.services.publisher.transports.grpc_asyncio import PublisherGrpcAsyncIOTransport
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
    wait_random,
)

from pubsub_filter.backends.publishers.pubsub_wire import PublishWire, request
from pubsub_filter.backends.publishers.turns import Turns
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.ports import PublishFailed, Unpublishable
from pubsub_filter.core.pubsub_limits import PUBLISH_REQUEST_LIMIT
from pubsub_filter.google.shared import TRANSIENT, describe_error, pubsub_path, resolve_project

log = get_logger("pubsub_filter.publisher")

#: How long `close` waits for the publishes under way before it closes the channel under them
#: (and `Engine.close` gives it at most its share of the stop budget).
CLOSE_WAIT = 10.0
#: What a publish to a closed (or closing) publisher fails with.
CLOSED = "the publisher is closed (shutting down)"


class PubsubPublisher:
    """Publish to Pub/Sub topics and wait for the server's confirmation.

    `destination` is a topic id (`phase3-injury-report`, in `project`) or a full
    `projects/P/topics/T` path. Ordering keys are kept: a key's next publish is sent once the
    one before it has ended; a failed one does not block every later message with that key.
    """

    def __init__(self, project: str | None = None, timeout: float = 30.0):
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.project = resolve_project(project)
        self.timeout = float(timeout)
        # Found now, where blocking is fine (a file, the metadata server), not on the loop at the
        # first publish; the emulator takes none.
        self._emulator = os.environ.get("PUBSUB_EMULATOR_HOST") or None
        self._credentials: Any = (
            None if self._emulator else google.auth.default(default_scopes=PublisherGrpcAsyncIOTransport.AUTH_SCOPES)[0]
        )
        self._wire: PublishWire | None = None  # made on the loop by the first publish
        self._wire_loop: asyncio.AbstractEventLoop | None = None
        self._turns = Turns()
        self._topics: dict[str, str] = {}
        self._under_way: set[asyncio.Future[None]] = set()
        self._closed = False

    # --- destinations -------------------------------------------------------------

    def topic_path(self, destination: str) -> str:
        path = self._topics.get(destination)
        if path is not None:
            return path
        try:
            # A full path was checked where it was written (the config, `replay --to`) or comes
            # from Pub/Sub itself (a subscription's topic): only an id needs the rules here.
            path = (
                destination if destination.startswith("projects/") else pubsub_path(destination, "topic", self.project)
            )
        except ValueError:
            raise PublishFailed(
                f"destination {destination!r} is neither a topic id nor a projects/PROJECT/topics/TOPIC path"
            ) from None
        self._topics[destination] = path
        return path

    # --- publishing ---------------------------------------------------------------

    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        if self._closed:
            raise PublishFailed(CLOSED)
        topic = self.topic_path(destination)
        key = ordering_key or ""
        req = request(topic, data, attributes, key)
        size = req.ByteSize()
        if size > PUBLISH_REQUEST_LIMIT:  # what the client library refused before sending, and Pub/Sub would
            raise Unpublishable(
                f"message too large for {topic}: a Publish request of {size} bytes (at most {PUBLISH_REQUEST_LIMIT})"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        ended = loop.create_future()
        self._under_way.add(ended)
        try:
            async with asyncio.timeout_at(deadline):
                if not key:
                    return await self._send(req, deadline)
                async with self._turns.turn((topic, key)):
                    return await self._send(req, deadline)
        except TimeoutError:
            raise PublishFailed(f"publish to {topic} not confirmed within {self.timeout:g}s") from None
        finally:
            self._under_way.discard(ended)
            ended.set_result(None)

    async def _send(self, req: Any, deadline: float) -> str:
        """The Publish RPC, retried while the error is transient and the budget lasts."""
        topic = req.topic
        retrying: AsyncRetrying | None = None
        try:
            try:  # most publishes take one attempt: only one that failed pays for the retry policy
                return await self._once(req, deadline)
            except TRANSIENT as exc:
                retrying = self._retrying(req.topic, deadline)
                return await self._retried(retrying, req, deadline, exc)
        except PublishFailed:
            raise
        except gexc.DeadlineExceeded:
            raise PublishFailed(
                f"publish to {topic} not confirmed within {self.timeout:g}s ({_attempts(retrying)} attempt(s))"
            ) from None
        except (grpc.aio.UsageError, gexc.GoogleAPICallError, *TRANSIENT) as exc:
            raise self._failure(exc, topic, _attempts(retrying)) from exc
        raise AssertionError("unreachable: the retry loop returns or raises")  # pragma: no cover

    def _failure(self, exc: BaseException, topic: str, attempts: int) -> PublishFailed:
        """What a publish that ended in `exc` fails with, in words an operator can act on
        (`Unpublishable`: the message itself is refused)."""
        if isinstance(exc, (grpc.aio.UsageError, gexc.Cancelled)) and self._closed:  # `close` closed the channel
            return PublishFailed(CLOSED)
        if isinstance(exc, TRANSIENT):
            return PublishFailed(
                f"publish to {topic} failed after {attempts} attempt(s) in {self.timeout:g}s: {describe_error(exc)}"
            )
        if isinstance(exc, gexc.NotFound):
            return PublishFailed(f"topic {topic} does not exist")
        if isinstance(exc, gexc.PermissionDenied):
            return PublishFailed(
                f"permission denied publishing to {topic}: the service account needs roles/pubsub.publisher "
                f"on it ({exc.message})"
            )
        # The message itself is refused: the same on every attempt, so the engine rejects it
        # (4xx, dead-lettered) rather than failing it (5xx) on every delivery.
        if isinstance(exc, gexc.InvalidArgument):
            return Unpublishable(f"Pub/Sub rejected the message for {topic}: {exc.message}")
        return PublishFailed(f"publish to {topic} failed: {describe_error(exc)}")

    async def _once(self, req: Any, deadline: float) -> str:
        loop = asyncio.get_running_loop()
        # the whole remaining budget: a slow publish is waited for, never sent twice
        return await self._wire_on(loop).publish(req, within=max(deadline - loop.time(), 0.001))

    def _retrying(self, topic: str, deadline: float) -> AsyncRetrying:
        """The retry policy of one publish, within what is left of its budget."""

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "publish_retry",
                topic=topic,
                attempt=state.attempt_number,
                error=describe_error(exc),
                wait_s=round(state.upcoming_sleep, 3),
            )

        return AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, TRANSIENT)),
            stop=stop_before_delay(max(deadline - asyncio.get_running_loop().time(), 0.0)),
            wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
            before_sleep=log_retry,
            reraise=True,
        )

    async def _retried(self, retrying: AsyncRetrying, req: Any, deadline: float, failed: BaseException) -> str:
        """The attempts after a first one that failed with a transient error, under the retry
        policy: its first turn raises that failure again, so the waits, the log lines and its
        attempt count (`_attempts`) count it."""
        first: BaseException | None = failed
        async for attempt in retrying:
            with attempt:
                if first is not None:
                    again, first = first, None
                    raise again
                if self._closed:
                    raise PublishFailed(CLOSED)
                return await self._once(req, deadline)
        raise AssertionError("unreachable: the retry loop returns or raises")  # pragma: no cover

    def _wire_on(self, loop: asyncio.AbstractEventLoop) -> PublishWire:
        """The channel of this loop: a `grpc.aio` channel belongs to the loop it was made on."""
        if self._wire is None or self._wire_loop is not loop:
            if self._closed:
                raise PublishFailed(CLOSED)
            self._wire, self._wire_loop = PublishWire(self._credentials, self._emulator), loop
        return self._wire

    async def ping(self) -> None:
        """Ready while the publisher is open. Asking the service (`topics.get`) would need a permission
        a publisher is not otherwise given, and a brief outage is what the retries are for."""
        if self._closed:
            raise PublishFailed(CLOSED)

    async def close(self) -> None:
        """Wait briefly for the publishes under way, then close the channel (cancelling what is left)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._under_way:
                await asyncio.wait(set(self._under_way), timeout=min(self.timeout, CLOSE_WAIT))
        finally:
            wire, self._wire = self._wire, None
            if wire is not None and self._wire_loop is asyncio.get_running_loop():
                started = time.monotonic()
                await wire.close()
                log.debug("publisher_closed", took_s=round(time.monotonic() - started, 3))


def _attempts(retrying: AsyncRetrying | None) -> int:
    """Attempts made: one, or as many as the retry policy counted (the first included)."""
    return 1 if retrying is None else int(retrying.statistics.get("attempt_number", 1))
