"""The production publisher: Google Cloud Pub/Sub through google-cloud-pubsub's `PublisherClient`.

The source message waits for this publish to be confirmed before it is acked, so the
client is tuned for latency (a 1 ms batch window), not throughput. Waiting never blocks
the event loop: the client's future is bridged into an asyncio future. Transient errors
are retried (tenacity) inside one time budget, `timeout`; everything else, and a budget
that runs out, becomes `PublishFailed` with a reason an operator can act on.

`PUBSUB_EMULATOR_HOST` is honoured by the client library itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from google import pubsub_v1 as gapic
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1 import types as pubsub_types
from google.cloud.pubsub_v1.publisher import exceptions as pub_exc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
    wait_random,
)

from filter.backends.gcp import TRANSIENT, pubsub_path, resolve_project
from filter.core.logs import get_logger
from filter.core.ports import PublishFailed, Unpublishable

log = get_logger("pubsub_filter.publisher")

#: `PublisherClient.publish(topic, data, ordering_key, retry, timeout, **attrs)` binds these
#: names itself, so a message attribute with one of them cannot be passed through it: such a
#: message goes in a `PubsubMessage` of its own, through the generated client's `publish`.
RESERVED_ATTRIBUTES = frozenset({"self", "topic", "data", "ordering_key", "retry", "timeout"})

#: How long the client may hold a message to batch it with others. Every forward waits it
#: out; 1 ms still lets a burst on the same ordering key share RPCs (bench/publish.py).
MAX_LATENCY = 0.001

_CLIENT_STOPPED = "Batch cancelled because the publisher client has been stopped."


class _KeyPaused(Exception):
    """The client refused the publish because an earlier one with the same ordering key failed."""


class PubsubPublisher:
    """Publish to Pub/Sub topics and wait for the server's confirmation.

    `destination` is a topic id (`phase3-injury-report`, in `project`) or a full
    `projects/P/topics/T` path. Ordering keys are kept (message ordering is enabled on the
    client); after a failed publish with a key the key is resumed, so one failure does
    not block every later message with that key.
    """

    def __init__(self, project: str | None = None, timeout: float = 30.0):
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.project = resolve_project(project)
        self.timeout = float(timeout)
        self._client: Any = pubsub_v1.PublisherClient(
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=100, max_latency=MAX_LATENCY),
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
        )
        self._direct: Any = None  # the generated client, on the same channel: made on first use
        self._topics: dict[str, str] = {}
        self._waiting: set[asyncio.Future[str]] = set()
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
            raise PublishFailed("the publisher is closed (shutting down)")
        topic = self.topic_path(destination)
        key = ordering_key or ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        attempts = 0

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "publish_retry",
                topic=topic,
                attempt=state.attempt_number,
                error=_describe(exc),
                wait_s=round(state.upcoming_sleep, 3),
            )

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda e: isinstance(e, (*TRANSIENT, _KeyPaused))),
                stop=stop_before_delay(self.timeout),
                wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
                before_sleep=log_retry,
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise TimeoutError
                    return await self._attempt(loop, topic, data, attributes, key, remaining)
        except TimeoutError:
            raise PublishFailed(
                f"publish to {topic} not confirmed within {self.timeout:g}s ({attempts} attempt(s))"
            ) from None
        except PublishFailed:
            raise
        except _KeyPaused:
            raise PublishFailed(
                f"publish to {topic} failed: ordering key {key!r} stayed paused after earlier failures"
            ) from None
        except TRANSIENT as exc:
            raise PublishFailed(
                f"publish to {topic} failed after {attempts} attempt(s) in {self.timeout:g}s: {_describe(exc)}"
            ) from exc
        except gexc.NotFound as exc:
            raise PublishFailed(f"topic {topic} does not exist") from exc
        except gexc.PermissionDenied as exc:
            raise PublishFailed(
                f"permission denied publishing to {topic}: the service account needs roles/pubsub.publisher "
                f"on it ({exc.message})"
            ) from exc
        # The message itself is refused: the same on every attempt, so the engine rejects it
        # (4xx, dead-lettered) rather than failing it (5xx) on every delivery.
        except gexc.InvalidArgument as exc:
            raise Unpublishable(f"Pub/Sub rejected the message for {topic}: {exc.message}") from exc
        except pub_exc.MessageTooLargeError as exc:
            raise Unpublishable(f"message too large for {topic}: {exc}") from exc
        except gexc.GoogleAPICallError as exc:
            raise PublishFailed(f"publish to {topic} failed: {_describe(exc)}") from exc
        raise AssertionError("unreachable: the retry loop returns or raises")  # pragma: no cover

    async def _attempt(
        self,
        loop: asyncio.AbstractEventLoop,
        topic: str,
        data: bytes,
        attributes: Mapping[str, str],
        key: str,
        remaining: float,
    ) -> str:
        if not RESERVED_ATTRIBUTES.isdisjoint(attributes):
            return await self._attempt_alone(topic, data, attributes, key, remaining)
        try:
            gfuture = self._client.publish(
                # the whole remaining budget: a slow publish is waited for, never sent twice
                topic,
                data,
                ordering_key=key,
                retry=None,
                timeout=max(remaining, 1.0),
                **attributes,
            )
        except RuntimeError as exc:  # the client was stopped under us
            raise PublishFailed(f"the publisher is closed (shutting down): {exc}") from exc
        waiter = _bridge(gfuture, loop)
        self._waiting.add(waiter)
        try:
            return await asyncio.wait_for(waiter, remaining)
        except pub_exc.PublishToPausedOrderingKeyException:
            self._resume(topic, key)
            raise _KeyPaused from None
        except RuntimeError as exc:  # a batch cancelled by the client
            if str(exc) == _CLIENT_STOPPED:
                raise PublishFailed("the publisher is closed (shutting down)") from exc
            self._resume(topic, key)
            raise _KeyPaused from exc
        except BaseException:
            self._resume(topic, key)
            raise
        finally:
            self._waiting.discard(waiter)

    async def _attempt_alone(
        self, topic: str, data: bytes, attributes: Mapping[str, str], key: str, remaining: float
    ) -> str:
        """One message in a Publish RPC of its own: for attributes `PublisherClient.publish` cannot
        take (`RESERVED_ATTRIBUTES`). Not batched (such names are rare). Its order among the
        batched publishes of its ordering key holds where the source delivers that key in order
        (an ordered subscription): the forward is confirmed before the source message is acked,
        so the key's next message, and its forward, come after."""
        message = pubsub_types.PubsubMessage(data=data, attributes=dict(attributes), ordering_key=key)
        if self._direct is None:
            self._direct = gapic.PublisherClient(transport=self._client.transport)
        direct = self._direct

        def call() -> str:
            # the whole remaining budget: a slow publish is waited for, never sent twice
            response = direct.publish(topic=topic, messages=[message], retry=None, timeout=max(remaining, 1.0))
            return str(response.message_ids[0])

        waiter = asyncio.ensure_future(asyncio.to_thread(call))
        self._waiting.add(waiter)
        try:
            return await asyncio.wait_for(waiter, remaining)
        finally:
            self._waiting.discard(waiter)

    def _resume(self, topic: str, key: str) -> None:
        """Unpause an ordering key after a failure; a no-op when it is not paused (yet)."""
        if key:
            with contextlib.suppress(RuntimeError, ValueError):
                self._client.resume_publish(topic, key)

    async def ping(self) -> None:
        """Ready while the client runs. Asking the service (`topics.get`) would need a permission
        a publisher is not otherwise given, and a brief outage is what the retries are for."""
        if self._closed:
            raise PublishFailed("the publisher is closed (shutting down)")

    async def close(self) -> None:
        """Stop the client: flush what is batched, wait briefly for it, close the channel."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self._client.stop()
        if self._waiting:
            await asyncio.wait(set(self._waiting), timeout=min(self.timeout, 10.0))
        started = time.monotonic()
        await asyncio.to_thread(self._client.transport.close)
        log.debug("publisher_closed", took_s=round(time.monotonic() - started, 3))


def _bridge(gfuture: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future[str]:
    """An asyncio future settled (on the loop's thread) when the client's future is."""
    waiter: asyncio.Future[str] = loop.create_future()

    def settle(done: Any) -> None:
        if waiter.done():  # timed out or cancelled meanwhile
            return
        exc = done.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(str(done.result()))

    def on_done(done: Any) -> None:  # runs on the client's commit thread (or right here)
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody waits
            loop.call_soon_threadsafe(settle, done)

    gfuture.add_done_callback(on_done)
    return waiter


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
