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

SIGTERM or SIGINT begins a stop inside one budget, `server.shutdown_budget` (pubsub_filter.core.engine.stopping):
nothing new is started; the messages in flight get the first half to finish, and what still
runs then is cancelled by the engine's close (lease released, message nacked, except that a
publish already handed over is waited for). The messages in flight are released from the
library's lease management at once, so their flow-control slots free and the library hands over
what it held past its flow control, not only as they finish. The streams stay open meanwhile,
and until what Pub/Sub had already sent on them has arrived; each message that arrives is
nacked at once, on its open stream, so another worker gets it within seconds (a stream
cancelled with messages on their way, or held by the library, loses them until their ack
deadline). Then the streams close, the engine's close ends; exit 0. A second signal gives up the
wait for the messages in flight. Once the streams are cancelled the library sends no more acks,
so the last acks and nacks go out as unary `Acknowledge` / `ModifyAckDeadline(0)` calls. The
client's channel is closed only once the library's stream threads have ended (a thread still
in an RPC would log `Cannot invoke RPC: Channel closed!`), and `stopped` is the last line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1

from pubsub_filter.core.config.schema import PullConfig, Route
from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.stopping import CLOSE, DRAIN, RECORDS, RELEASE, Stop
from pubsub_filter.core.logs import get_logger
from pubsub_filter.google.received import received_message
from pubsub_filter.google.shared import (
    acknowledge,
    describe_error,
    modify_ack_deadline,
    pubsub_path,
)
from pubsub_filter.pull.flow import flow_control
from pubsub_filter.pull.health import ConsumerDeaths, HealthServer, Watchdog, health_app, stream_failures
from pubsub_filter.pull.noise import shutdown_noise_filtered
from pubsub_filter.runtime import backstop

log = get_logger("pubsub_filter.pull")

#: How long the library's stream threads get to end once their streams are closed, before
#: the channel is closed under them (a thread stuck reconnecting to an unreachable Pub/Sub
#: ends only then), and after; each within what is left of the stop's budget. Its own
#: shutdown (the streaming-pull futures done) normally takes about a second.
STREAM_THREADS_TIMEOUT, STREAM_THREADS_AFTER_CLOSE, STREAMS_TIMEOUT = 5.0, 2.0, 2.0
#: The time limit of one late ack or nack call: within what is left of the stop, but at least
#: the minimum (a call cut shorter than that would fail where it could have landed).
LATE_TIMEOUT, MIN_LATE_TIMEOUT = 10.0, 0.5
#: How long a stream must bring nothing new, after a round trip to Pub/Sub (given ten times as
#: long), to count as settled.
QUIET = 0.2


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
        facts = engine.facts
        self.settings = settings or facts.pull
        self.budget = facts.shutdown_budget
        self.stopping: Stop | None = None  # begun at the first signal (else when the shutdown starts)
        self.subscriber: Any = subscriber if subscriber is not None else pubsub_v1.SubscriberClient()
        # closed at shutdown, after its threads ended: by default only a client made here
        self._close_subscriber = subscriber is None if close_subscriber is None else close_subscriber
        self._stream_threads: list[threading.Thread] = []
        self.paths = {r.name: pubsub_path(r.subscription or "", "subscription", project) for r in self.routes}
        self.handled = 0
        self.acked = 0
        self.nacked = 0
        self.returned = 0  # received while stopping, never started: nacked at once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._streams: dict[str, Any] = {}
        self._failure: BaseException | None = None
        self._failed_route: str | None = None
        self._refusing = False  # stopping: what the library hands over is held, not started
        self._closing = False  # streams cancelled: acks go out as unary calls from here on
        self.arrived = 0  # messages the library handed over (counted on its threads, under the lock)
        self._arrived_lock = threading.Lock()
        # the messages handed to the engine and not settled yet, by ack id: released from the
        # library's lease management when the stop begins
        self._deciding: dict[str, Any] = {}
        self._late_ready: asyncio.Event | None = None  # set when a late ack or nack is waiting
        self._late: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"ack": [], "nack": []})
        self._late_lock = threading.Lock()
        self.ready = threading.Event()  # set once every stream is open (for in-process callers)
        self.watchdog = Watchdog(self.paths, facts.ack_deadline, self._probe)
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
        """Ask the worker to shut down (thread-safe); `hurry` gives up the wait for the messages in flight."""
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
        facts = self.engine.facts
        flow = flow_control(self.settings, facts.ack_deadline, facts.lease_duration)
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
                # Callbacks queued at the stop still run, so what they bring is nacked by the
                # worker once the stream is closed, not by the library as its stream closes.
                future = self.subscriber.subscribe(
                    path,
                    callback=self._callback(route.name, path),
                    flow_control=flow,
                    await_callbacks_on_shutdown=True,
                )
                self._streams[route.name] = future
                future.add_done_callback(self._stream_done(route.name))
            # `subscribe` starts each stream's threads before it returns: these are they. The client
            # names no handle to them (the future's `cancel()` does not wait for them, and nothing
            # public joins them), yet the stop must wait for them before it closes the channel
            # they read from: so they are told apart by diffing the threads around `subscribe`.
            self._stream_threads = [t for t in threading.enumerate() if t not in before]
            log.info(
                "pulling",
                routes=[r.name for r in self.routes],
                subscriptions=sorted(self.paths.values()),
                instance=facts.instance,
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
            log.error("pull_failed", route=self._failed_route, error=describe_error(self._failure))
            return 1
        return 0

    def _on_signal(self, sig: int) -> None:
        assert self._stop is not None and self._hurry is not None
        if self._stop.is_set():
            log.warning("second_signal", signal=signal.Signals(sig).name, action="not waiting for in-flight messages")
            self._hurry.set()
        else:
            log.info("shutting_down", signal=signal.Signals(sig).name, in_flight=len(self.engine.under_way()))
            self.stopping = Stop.begin(self.budget)
            backstop.arm(self.stopping)
            self.engine.decide_held()  # held messages (`coalesce`) are decided now, inside the drain
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
            with self._arrived_lock:  # several callback threads: `+=` is a read and a write
                self.arrived += 1
            if self._refusing:
                self._give_back(path, received)
                return
            loop = self._loop
            self._deciding[received.ack_id] = received
            try:
                assert loop is not None
                future = asyncio.run_coroutine_threadsafe(self._handle(route, path, received), loop)
            except (RuntimeError, AssertionError):  # the loop is gone: let Pub/Sub redeliver it
                self._deciding.pop(received.ack_id, None)
                received.nack()
                return
            future.add_done_callback(lambda f: self._settle(path, received, f))

        return on_message

    def _give_back(self, path: str, received: Any) -> None:
        """A message received while stopping is not started: nacked at once, on the stream while
        it is open (Pub/Sub sends it on at once, to another worker's stream or back to this one,
        given back again), else with the late ones once the streams are closed."""
        with self._late_lock:
            self.returned += 1
            if self._closing:
                self._late[path]["nack"].append(received.ack_id)
                closing = True
            else:
                closing = False
        if closing:
            self._late_waiting()
        else:
            received.nack()

    async def _handle(self, route: str, path: str, received: Any) -> bool | None:
        """Decide one message; True to ack it, None when it was not started (the worker is stopping)."""
        if self._refusing:  # scheduled just before the stop began: not ours to decide
            return None
        self.watchdog.saw_message(route)
        try:
            handled = await self.engine.handle(route, received_message(received, path))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never ack what was not decided; never let it kill the worker
            log.exception("pull_handle_failed", route=route, message_id=received.message_id, error=describe_error(exc))
            return False
        self.handled += 1
        return answer_for(handled.record).ack

    def _settle(self, path: str, received: Any, future: concurrent.futures.Future[bool | None]) -> None:
        """Ack or nack from the handling's result (runs on the loop's thread, or the caller's)."""
        self._deciding.pop(received.ack_id, None)
        ran = not future.cancelled() and future.exception() is None
        if ran and future.result() is None:
            self._give_back(path, received)
            return
        ack = ran and bool(future.result())
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
        self._late_waiting()

    def _late_waiting(self) -> None:
        """Wake the flusher of the late acks and nacks (thread-safe)."""
        loop, ready = self._loop, self._late_ready
        if loop is not None and ready is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the last flush sent it
                loop.call_soon_threadsafe(ready.set)

    # --- shutdown ---------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        with shutdown_noise_filtered():
            await self._shut_down()
        log.info(
            "stopped",
            instance=self.engine.facts.instance,
            handled=self.handled,
            acked=self.acked,
            nacked=self.nacked,
            returned=self.returned,
        )

    async def _shut_down(self) -> None:
        """In-flight messages, the streams, late acks and nacks, the engine, the library's threads, the client."""
        stop = self.stopping or Stop.begin(self.budget)
        self._refusing = True
        self._late_ready = asyncio.Event()
        # The messages in flight are released from the library's lease management (their
        # decisions go on, and ack or nack them): their flow-control slots free, so the library
        # hands over at once what it holds past its flow control, to be given back.
        for received in list(self._deciding.values()):
            received.drop()
        # The streams settle and close while the messages in flight drain and the engine closes:
        # what they bring is given back, and the decisions get the engine's shares of the stop
        # (the drain, the publisher's flush, the cancels and their releases).
        streams = asyncio.create_task(self._close_streams(stop))
        try:
            await self._drain(stop)
            if self._hurry is not None and self._hurry.is_set():  # the messages in flight get no more time
                stop = Stop(min(stop.started, time.monotonic() - stop.budget * DRAIN), stop.budget)
            await self.engine.close(stop)  # cancels what still runs: its lease released, its message nacked
        finally:
            reached, stuck = await streams
        await asyncio.sleep(0)  # let the last done-callbacks run
        await asyncio.to_thread(self._send_late, stop)
        if reached and not stuck and not self.watchdog.stalled:
            # (a stream thread cut off from Pub/Sub ends only once its channel is closed: no use waiting)
            await asyncio.to_thread(self._join_stream_threads, min(STREAM_THREADS_TIMEOUT, stop.left(RECORDS)))
        if self._close_subscriber:  # its threads are gone (normally): nothing is left to call on the channel
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.subscriber.close)
            lingering = await asyncio.to_thread(
                self._join_stream_threads, min(STREAM_THREADS_AFTER_CLOSE, stop.left(CLOSE))
            )
            if lingering:
                log.warning("stream_threads_did_not_stop", threads=lingering)
        if self.health is not None:
            await self.health.stop()

    async def _close_streams(self, stop: Stop) -> tuple[bool, bool]:
        """Settle the streams, cancel them, then send the acks and nacks that come late, as they
        come, while decisions are under way: (whether Pub/Sub answered the settle, whether a
        stream did not stop in time)."""
        # The messages in flight hold no flow-control slot any more (`_shut_down`), so what the
        # library holds past its flow control is handed over (and given back) meanwhile. The
        # streams close only once no message is in flight (or at the cancels' share): a nack on
        # an open stream is sent on at once, to another worker's stream or back to this one
        # (given back again), while the emulator sends a nack that comes after its stream closed
        # to no stream before the message's ack deadline (the real service does). Then the settle
        # reads what Pub/Sub still had on its way, until the cancels' share; a stop that took it
        # whole still leaves it a round trip to Pub/Sub.
        await self._in_flight_settled(stop)
        reached = await self._settle_streams(stop, RELEASE)
        with self._late_lock:
            self._closing = True
        for future in self._streams.values():
            future.cancel()  # stop pulling; the client nacks what it still held itself
        # the library's own shutdown hands over what it had read (nacked with the late ones),
        # and nacks what it held; a stream that cannot reach Pub/Sub ends only with its channel
        stuck = await asyncio.to_thread(self._join_streams, min(STREAMS_TIMEOUT, max(stop.left(RECORDS), QUIET)))
        await asyncio.to_thread(self._send_late, stop)
        # The decisions still under way ack or nack once the streams are closed: sent as they come.
        ready = self._late_ready
        assert ready is not None
        while self.engine.under_way() and stop.left() > 0:
            waiting = asyncio.create_task(ready.wait())
            pending: set[asyncio.Future[Any]] = {waiting, *self.engine.under_way()}
            await asyncio.wait(pending, timeout=stop.left(), return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            ready.clear()
            await asyncio.sleep(0)  # the done-callbacks that queue them
            await asyncio.to_thread(self._send_late, stop)
        return reached, stuck

    async def _in_flight_settled(self, stop: Stop) -> None:
        """Wait until no message is in flight (each acked or nacked on its open stream), or the
        stop's share for the cancels has passed."""
        while (in_flight := self.engine.under_way()) and (remaining := stop.left(RELEASE)) > 0:
            await asyncio.wait(in_flight, timeout=remaining)
        await asyncio.sleep(0)  # the done-callbacks that ack or nack them

    async def _drain(self, stop: Stop) -> None:
        """Wait for the messages in flight (the engine's decisions under way) until the stop's
        share for them (or a second signal)."""
        if not (in_flight := self.engine.under_way()):
            return
        log.info("draining", in_flight=len(in_flight), budget_s=stop.budget)
        assert self._hurry is not None
        hurry = asyncio.create_task(self._hurry.wait())
        try:
            while in_flight and not hurry.done() and (remaining := stop.left(DRAIN)) > 0:
                waiting: set[asyncio.Future[Any]] = {*in_flight, hurry}
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                in_flight = self.engine.under_way()
        finally:
            hurry.cancel()
        if in_flight:
            log.warning("in_flight_past_drain", count=len(in_flight), budget_s=stop.budget)

    async def _settle_streams(self, stop: Stop, share: float) -> bool:
        """Keep reading the streams, giving back what comes, until what Pub/Sub already sent on
        them has arrived: a round trip to Pub/Sub on the same channel, then as long again (the
        library confirms what it receives before it hands it over) with nothing new, within the
        drain's share. A stream cancelled with messages on their way loses them: Pub/Sub sends
        those again only once their ack deadline has passed (the emulator pushes a stream all it
        has, whatever the flow control). Within the stop's `share`, but never less than a
        round trip and a quiet pause. Whether Pub/Sub answered."""
        if any(future.done() for future in self._streams.values()) or (self._hurry and self._hurry.is_set()):
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(stop.left(share), QUIET * 4)):
                while True:
                    seen, started = self.arrived, time.monotonic()
                    for path in self.paths.values():
                        try:
                            await asyncio.to_thread(
                                self._probe, path, max(QUIET * 2, min(stop.left(share), QUIET * 10))
                            )
                        except Exception:  # unreachable: it cannot be sending either
                            return False
                    await asyncio.sleep(max(QUIET, time.monotonic() - started))
                    if self.arrived == seen or (self._hurry is not None and self._hurry.is_set()):
                        return True
        return True

    def _send_late(self, stop: Stop) -> None:
        timeout = min(LATE_TIMEOUT, max(stop.left(CLOSE), MIN_LATE_TIMEOUT))
        with self._late_lock:
            late = {p: dict(v) for p, v in self._late.items()}
            self._late.clear()
        for path, ids in late.items():
            # What is not settled here is redelivered later: an ack the engine answers as a
            # duplicate, a nack after its ack deadline.
            for count, exc in acknowledge(self.subscriber, path, ids["ack"], timeout=timeout):
                log.warning("late_ack_failed", subscription=path, count=count, error=describe_error(exc))
            for count, exc in modify_ack_deadline(self.subscriber, path, ids["nack"], 0, timeout=timeout):
                log.warning("late_nack_failed", subscription=path, count=count, error=describe_error(exc))

    def _join_streams(self, timeout: float) -> bool:
        """Wait for the streaming-pull futures; whether one did not stop in time."""
        deadline, stuck = time.monotonic() + timeout, False
        for route, future in self._streams.items():
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                stuck = True
                log.warning("stream_did_not_stop", route=route)
            except Exception as exc:  # already reported by _stream_done
                log.debug("stream_ended", route=route, error=describe_error(exc))
        return stuck

    def _join_stream_threads(self, timeout: float) -> list[str]:
        """Wait for the threads `subscribe` started, which can outlive their closed streams; the names left."""
        deadline = time.monotonic() + timeout
        for thread in self._stream_threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._stream_threads if t.is_alive()]
