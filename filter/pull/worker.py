"""`pubsub-filter pull`: a streaming-pull worker running the same `Engine.handle` as the push endpoint.

One process can serve several routes: each route's `subscription` is pulled with
google-cloud-pubsub's `SubscriberClient.subscribe`. The subscriber's callbacks run in its
thread pool; each message is handed to the asyncio loop of the main thread with
`asyncio.run_coroutine_threadsafe`, and the result decides: a decision push answers with
2xx (`DecisionRecord.acked`) is acked, every other one nacked, exactly as a
push subscription would treat the HTTP answer.

Leases agree with the engine's: the subscriber extends a message's ack deadline by
`lease.ack_deadline` at a time, for at most `max_lease_duration` (default
`lease.duration`), so a message is held for as long as the engine's lease on its key can
live (a push subscription holds it for `ack_deadline`, and the lease outlives that).

A nacked message is redelivered under the subscription's retry policy: give pull
subscriptions a retry policy (`pubsub-filter provision` sets 10 s to 600 s), or a
`contended` key is retried as fast as Pub/Sub redelivers.

SIGTERM or SIGINT: stop pulling (the streaming-pull futures are cancelled), wait up to
`server.shutdown_grace` for the messages in flight, cancel what is still running (the
engine releases its lease and the message is nacked, except that a publish already handed
over is waited for and recorded, then acked), ack/nack what finished, flush the decision
records, exit 0. A second signal skips the wait. After the streams are cancelled the
client library no longer sends acks, so the last acks and nacks go out as unary
`Acknowledge` / `ModifyAckDeadline(0)` calls on the same client. The client's channel is
closed only once the library's stream threads have ended (a thread still in an RPC would
log `Cannot invoke RPC: Channel closed!`), and `stopped` is the last line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import structlog

from filter.backends.gcp import (
    acknowledge,
    modify_ack_deadline,
    pubsub_path,
    timestamp,
)
from filter.core.answer import answer_for
from filter.core.config import LeaseConfig, PullConfig, Route
from filter.core.engine import Engine
from filter.core.envelope import effective_publish_time
from filter.core.model import Message
from filter.pull.health import ConsumerDeaths, HealthServer, Watchdog, health_app, stream_failures

log = structlog.get_logger("pubsub_filter.pull")

#: How long the library's stream threads get to end once their streams are closed, before
#: the channel is closed under them (a thread stuck reconnecting to an unreachable Pub/Sub
#: ends only then), and after.
STREAM_THREADS_TIMEOUT, STREAM_THREADS_AFTER_CLOSE = 5.0, 2.0
#: What the library logs when the worker closes a stream and then its channel, on purpose:
#: it joins its stream thread for 1 s and warns if the thread is still in an RPC (the
#: worker waits for that thread itself, `_join_stream_threads`); a stream that cannot reach
#: Pub/Sub is reopened until its channel closes, which it then reports as an error.
_SHUTDOWN_NOISE = {
    "google.api_core.bidi": ("Background thread did not exit.", "Cannot invoke RPC: Channel closed!"),
    "grpc._channel": ("Cannot invoke RPC: Channel closed!",),
}


class _ShutdownNoise(logging.Filter):
    def __init__(self, texts: tuple[str, ...]):
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


#: Pub/Sub's bounds on an ack deadline, in seconds.
MIN_ACK_DEADLINE, MAX_ACK_DEADLINE = 10, 600


def flow_control(pull: PullConfig, lease: LeaseConfig) -> Any:
    """The subscriber's flow control: `pull:` from the config, leases extended as the engine's live."""
    # An int: the client copies it into StreamingPullRequest.stream_ack_deadline_seconds.
    extension = int(min(max(round(lease.ack_deadline), MIN_ACK_DEADLINE), MAX_ACK_DEADLINE))
    return pubsub_v1.types.FlowControl(
        max_messages=pull.max_messages,
        max_bytes=pull.max_bytes,
        max_lease_duration=float(pull.max_lease_duration or lease.duration),
        min_duration_per_lease_extension=extension,
        max_duration_per_lease_extension=extension,
    )


def to_message(received: Any, subscription: str | None = None) -> Message:
    """A google-cloud-pubsub subscriber message → `filter.core.model.Message`."""
    attributes = dict(received.attributes)
    return Message(
        data=bytes(received.data),
        attributes=attributes,
        message_id=str(received.message_id),
        publish_time=effective_publish_time(attributes, timestamp(received.publish_time)),
        ordering_key=received.ordering_key or None,
        delivery_attempt=received.delivery_attempt,
        subscription=subscription,
    )


class PullWorker:
    """Streaming pull for some routes of one engine; `run()` returns when `stop()` was called."""

    def __init__(
        self,
        engine: Engine,
        routes: Sequence[Route],
        project: str,
        settings: PullConfig | None = None,
        subscriber: Any = None,
        health_port: int | None = None,
        health_host: str = "0.0.0.0",
        watch_every: float | None = None,
        close_subscriber: bool | None = None,
    ):
        self.engine = engine
        self.routes = list(routes)
        self.project = project
        self.settings = settings or engine.config.pull
        self.grace = engine.config.server.shutdown_grace
        self.subscriber: Any = subscriber if subscriber is not None else pubsub_v1.SubscriberClient()
        # closed at shutdown, after its threads ended: by default only a client made here
        self._close_subscriber = subscriber is None if close_subscriber is None else close_subscriber
        self._stream_threads: list[threading.Thread] = []
        self.paths = {r.name: pubsub_path(r.subscription or "", "subscription", project) for r in self.routes}
        self.handled = 0
        self.acked = 0
        self.nacked = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[bool]] = set()
        self._streams: dict[str, Any] = {}
        self._failure: BaseException | None = None
        self._failed_route: str | None = None
        self._closing = False  # streams cancelled: acks go out as unary calls from here on
        self._late: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"ack": [], "nack": []})
        self._late_lock = threading.Lock()
        self.ready = threading.Event()  # set once every stream is open (for in-process callers)
        ack_deadline = engine.config.lease.ack_deadline
        self.watchdog = Watchdog(self.paths, ack_deadline, self._probe)
        self.watch_every = watch_every if watch_every is not None else self.watchdog.quiet_after
        self.health: HealthServer | None = None
        if health_port is not None:
            self.health = HealthServer(health_app(self), health_host, health_port)

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def stream_failures(self) -> dict[str, str]:
        """Route → why its stream ended, for streams that ended before shutdown began."""
        return {} if self._closing else stream_failures(self._streams)

    def _probe(self, path: str, timeout: float) -> None:
        found = self.subscriber.get_subscription(request={"subscription": path}, timeout=timeout, retry=None)
        if getattr(found, "detached", False):  # it answers, and delivers nothing ever again
            raise RuntimeError("the subscription is detached from its topic")

    # --- control ------------------------------------------------------------------------

    def stop(self, hurry: bool = False) -> None:
        """Ask the worker to shut down (thread-safe); `hurry` skips the grace period."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def _set() -> None:
            assert self._stop is not None and self._hurry is not None
            if hurry or self._stop.is_set():
                self._hurry.set()
            self._stop.set()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_set)

    async def run(self, install_signals: bool = False) -> int:
        """Pull until stopped; 0 after a requested stop, 1 when a stream failed for good."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        flow = flow_control(self.settings, self.engine.config.lease)
        watch: asyncio.Task[None] | None = None
        consumers = ConsumerDeaths(self._consumer_died)
        consumers.attach()
        try:
            if self.health is not None:
                self.health.start()
            watch = asyncio.create_task(self.watchdog.run(self.watch_every))
            before = set(threading.enumerate())
            for route in self.routes:
                path = self.paths[route.name]
                future = self.subscriber.subscribe(path, callback=self._callback(route.name, path), flow_control=flow)
                self._streams[route.name] = future
                future.add_done_callback(self._stream_done(route.name))
            # `subscribe` starts each stream's threads before it returns: these are they.
            self._stream_threads = [t for t in threading.enumerate() if t not in before]
            log.info(
                "pulling",
                routes=[r.name for r in self.routes],
                subscriptions=sorted(self.paths.values()),
                instance=self.engine.instance,
                max_messages=flow.max_messages,
                max_lease_duration_s=flow.max_lease_duration,
                ack_extension_s=flow.max_duration_per_lease_extension,
                health_port=self.health.port if self.health is not None else None,
            )
            self.ready.set()
            await self._stop.wait()
        finally:
            if watch is not None:
                watch.cancel()
            consumers.detach()
            await self._shutdown()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        if self._failure is not None:
            log.error("pull_failed", route=self._failed_route, error=_describe(self._failure))
            return 1
        return 0

    def _on_signal(self, sig: int) -> None:
        assert self._stop is not None and self._hurry is not None
        if self._stop.is_set():
            log.warning("second_signal", signal=signal.Signals(sig).name, action="not waiting for in-flight messages")
            self._hurry.set()
        else:
            log.info("shutting_down", signal=signal.Signals(sig).name, in_flight=len(self._tasks))
        self._stop.set()

    def _stream_done(self, route: str) -> Any:
        def done(future: Any) -> None:  # a subscriber thread
            if self._closing:
                return
            exc = future.exception()
            if self._failure is None:
                self._failure = exc or RuntimeError("the streaming pull ended by itself")
                self._failed_route = route
            self.stop()

        return done

    def _consumer_died(self, reason: str) -> None:  # the dying consumer thread
        """A stream's consumer thread died and its future will never complete: fail as a failed stream does."""
        if self._closing:
            return
        if self._failure is None:
            self._failure = RuntimeError(f"a streaming pull's consumer thread died: {reason}")
        self.stop()

    # --- one message ------------------------------------------------------------------------

    def _callback(self, route: str, path: str) -> Any:
        def on_message(received: Any) -> None:  # runs in the subscriber's thread pool
            loop = self._loop
            try:
                assert loop is not None
                future = asyncio.run_coroutine_threadsafe(self._handle(route, path, received), loop)
            except (RuntimeError, AssertionError):  # the loop is gone: let Pub/Sub redeliver it
                received.nack()
                return
            future.add_done_callback(lambda f: self._settle(path, received, f))

        return on_message

    async def _handle(self, route: str, path: str, received: Any) -> bool:
        """Decide one message; True to ack it."""
        task = asyncio.current_task()
        assert task is not None
        if self._closing:  # arrived while the streams were being cancelled: not ours to decide
            return False
        self._tasks.add(task)
        self.watchdog.saw_message(route)
        try:
            rec = await self.engine.handle(route, to_message(received, path))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never ack what was not decided; never let it kill the worker
            log.exception("pull_handle_failed", route=route, message_id=received.message_id, error=_describe(exc))
            return False
        finally:
            self._tasks.discard(task)
        self.handled += 1
        return answer_for(rec).ack

    def _settle(self, path: str, received: Any, future: concurrent.futures.Future[bool]) -> None:
        """Ack or nack from the handling's result (runs on the loop's thread, or the caller's)."""
        ack = not future.cancelled() and future.exception() is None and bool(future.result())
        if ack:
            self.acked += 1
        else:
            self.nacked += 1
        if not self._closing:
            # Queued for the client's dispatcher, which sends everything queued before it stops.
            received.ack() if ack else received.nack()
            return
        with self._late_lock:
            self._late[path]["ack" if ack else "nack"].append(received.ack_id)

    # --- shutdown ---------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        quiet = {name: _ShutdownNoise(texts) for name, texts in _SHUTDOWN_NOISE.items()}
        for name, noise in quiet.items():
            logging.getLogger(name).addFilter(noise)
        try:
            await self._shut_down()
        finally:
            for name, noise in quiet.items():
                logging.getLogger(name).removeFilter(noise)
        log.info(
            "stopped",
            instance=self.engine.instance,
            handled=self.handled,
            acked=self.acked,
            nacked=self.nacked,
        )

    async def _shut_down(self) -> None:
        """Streams, in-flight messages, late acks, the library's threads, the engine, the client."""
        self._closing = True
        for future in self._streams.values():
            future.cancel()  # stop pulling; the client nacks what it had not handed to us yet
        in_flight = set(self._tasks)
        if in_flight:
            log.info("draining", in_flight=len(in_flight), grace_s=self.grace)
            assert self._hurry is not None and self._loop is not None
            hurry = asyncio.create_task(self._hurry.wait())
            deadline = self._loop.time() + self.grace
            pending: set[asyncio.Task[Any]] = set(in_flight)
            while pending and not hurry.done() and (remaining := deadline - self._loop.time()) > 0:
                done, _ = await asyncio.wait({*pending, hurry}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
            hurry.cancel()
            left = [t for t in in_flight if not t.done()]
            if left:
                log.warning("cancelling_in_flight", count=len(left), grace_s=self.grace)
                for t in left:
                    t.cancel()  # the engine releases its lease (nack), or finishes a publish under way
                await asyncio.wait(left, timeout=5.0)
        await asyncio.sleep(0)  # let the last done-callbacks run
        await asyncio.to_thread(self._send_late)
        await asyncio.to_thread(self._join_streams)
        await asyncio.to_thread(self._join_stream_threads, STREAM_THREADS_TIMEOUT)
        await self.engine.close(deadline=self.grace)
        if self._close_subscriber:  # its threads are gone (normally): nothing is left to call on the channel
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.subscriber.close)
            lingering = await asyncio.to_thread(self._join_stream_threads, STREAM_THREADS_AFTER_CLOSE)
            if lingering:
                log.warning("stream_threads_did_not_stop", threads=lingering)
        if self.health is not None:
            await self.health.stop()

    def _send_late(self) -> None:
        with self._late_lock:
            late = {p: dict(v) for p, v in self._late.items()}
            self._late.clear()
        for path, ids in late.items():
            # What is not settled here is redelivered later: an ack the engine answers as a
            # duplicate, a nack after its ack deadline.
            for count, exc in acknowledge(self.subscriber, path, ids["ack"], timeout=10):
                log.warning("late_ack_failed", subscription=path, count=count, error=_describe(exc))
            for count, exc in modify_ack_deadline(self.subscriber, path, ids["nack"], 0, timeout=10):
                log.warning("late_nack_failed", subscription=path, count=count, error=_describe(exc))

    def _join_streams(self) -> None:
        for route, future in self._streams.items():
            try:
                future.result(timeout=30)
            except concurrent.futures.TimeoutError:
                log.warning("stream_did_not_stop", route=route)
            except Exception as exc:  # already reported by _stream_done
                log.debug("stream_ended", route=route, error=_describe(exc))

    def _join_stream_threads(self, timeout: float) -> list[str]:
        """Wait for the threads `subscribe` started, which can outlive their closed streams; the names left."""
        deadline = time.monotonic() + timeout
        for thread in self._stream_threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._stream_threads if t.is_alive()]


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
