"""Pub/Sub test helpers: topics and subscriptions on the emulator, bounded pulls, a delaying TCP proxy.

    admin = PubsubAdmin(pubsub_emulator)          # clients pointed at the emulator
    topic = admin.topic("dest")                    # unique id, deleted by admin.cleanup()
    sub = admin.pull_subscription(topic, ordered=True)
    msgs = admin.pull(sub, count=3, timeout=10)   # until 3 arrived or the deadline
    admin.assert_nothing_more(sub, period=2)      # bounded: "no more arrived"

`DelayProxy` sits between a client and the emulator and holds every byte going to the
emulator for `delay` seconds: a publish that takes as long as the test wants, without a
hook in production code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from .emulators import PubsubEmulator


def unique(prefix: str) -> str:
    """A topic/subscription id no other test uses (ids: 3-255 chars, starting with a letter)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def emulator_env(host: str) -> Iterator[None]:
    """PUBSUB_EMULATOR_HOST=host while the block runs (the client reads it when constructed)."""
    saved = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = saved


@dataclass
class Pulled:
    """One pulled message, flattened for assertions."""

    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    publish_time: float  # epoch seconds, as stamped by the emulator


class PubsubAdmin:
    """Create topics and subscriptions on the emulator; delete them all in `cleanup()`.

    Push subscriptions are deleted first: the emulator retries a push whose endpoint is
    gone every second forever.
    """

    def __init__(self, emulator: PubsubEmulator):
        self.emulator = emulator
        self.project = emulator.project
        with emulator_env(emulator.host):
            self.publisher = pubsub_v1.PublisherClient(
                batch_settings=pubsub_v1.types.BatchSettings(max_latency=0.005),
                publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
            )
            self.subscriber = pubsub_v1.SubscriberClient()
        self._topics: list[str] = []
        self._subs: list[str] = []
        self._push_subs: list[str] = []

    # --- names ------------------------------------------------------------------------

    def topic_path(self, topic_id: str) -> str:
        return f"projects/{self.project}/topics/{topic_id}"

    def subscription_path(self, sub_id: str) -> str:
        return f"projects/{self.project}/subscriptions/{sub_id}"

    # --- resources --------------------------------------------------------------------

    def topic(self, prefix: str = "topic") -> str:
        """Create a topic with a unique id; returns the id."""
        topic_id = unique(prefix)
        self.publisher.create_topic(name=self.topic_path(topic_id))
        self._topics.append(topic_id)
        return topic_id

    def pull_subscription(
        self,
        topic_id: str,
        prefix: str = "pull",
        ordered: bool = False,
        message_filter: str = "",
        ack_deadline: int = 30,
        backoff: tuple[int, int] | None = None,
    ) -> str:
        """`backoff`: the retry policy's (minimum, maximum) seconds; None: none (a nack comes back at once)."""
        sub_id = unique(prefix)
        request: dict[str, Any] = {
            "name": self.subscription_path(sub_id),
            "topic": self.topic_path(topic_id),
            "ack_deadline_seconds": ack_deadline,
            "enable_message_ordering": ordered,
            "filter": message_filter,  # a subscription filter on attributes (empty: every message)
        }
        if backoff is not None:
            low, high = backoff
            request["retry_policy"] = {"minimum_backoff": {"seconds": low}, "maximum_backoff": {"seconds": high}}
        self.subscriber.create_subscription(request=request)
        self._subs.append(sub_id)
        return sub_id

    def push_subscription(
        self,
        topic_id: str,
        endpoint: str,
        prefix: str = "push",
        ack_deadline: int = 10,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
        min_backoff: float | None = None,
        max_backoff: float | None = None,
        sub_id: str | None = None,
        write_metadata: bool | None = None,
    ) -> str:
        """`write_metadata` None: Pub/Sub's envelope; else payload unwrapping, with or without metadata."""
        sub_id = sub_id or unique(prefix)
        push_config: dict[str, Any] = {"push_endpoint": endpoint}
        if write_metadata is not None:
            push_config["no_wrapper"] = {"write_metadata": write_metadata}
        request: dict[str, Any] = {
            "name": self.subscription_path(sub_id),
            "topic": self.topic_path(topic_id),
            "ack_deadline_seconds": ack_deadline,
            "push_config": push_config,
        }
        if dead_letter_topic:
            request["dead_letter_policy"] = {
                "dead_letter_topic": self.topic_path(dead_letter_topic),
                "max_delivery_attempts": max_delivery_attempts,
            }
        if min_backoff is not None or max_backoff is not None:
            request["retry_policy"] = {
                "minimum_backoff": {"seconds": int(min_backoff or 0), "nanos": int((min_backoff or 0) % 1 * 1e9)},
                "maximum_backoff": {"seconds": int(max_backoff or 600)},
            }
        self.subscriber.create_subscription(request=request)
        self._push_subs.append(sub_id)
        return sub_id

    def delete_subscription(self, sub_id: str) -> None:
        with contextlib.suppress(gexc.NotFound):
            self.subscriber.delete_subscription(subscription=self.subscription_path(sub_id))
        for subs in (self._subs, self._push_subs):
            if sub_id in subs:
                subs.remove(sub_id)

    def cleanup(self) -> None:
        """Delete everything this admin created (push subscriptions first), then close the clients."""
        for sub_id in [*self._push_subs, *self._subs]:
            self.delete_subscription(sub_id)
        for topic_id in self._topics:
            with contextlib.suppress(gexc.NotFound):
                self.publisher.delete_topic(topic=self.topic_path(topic_id))
        self._topics.clear()
        self.publisher.stop()
        self.publisher.transport.close()
        self.subscriber.close()

    # --- messages ---------------------------------------------------------------------

    def publish(self, topic_id: str, data: bytes, ordering_key: str = "", **attributes: str) -> str:
        """Publish one message and wait for its id (the test's stand-in for a scraper)."""
        future = self.publisher.publish(self.topic_path(topic_id), data, ordering_key=ordering_key, **attributes)
        return str(future.result(timeout=30))

    def publish_many(
        self, topic_id: str, items: list[tuple[bytes, dict[str, str]]], ordering_keys: list[str] | None = None
    ) -> list[str]:
        """Publish without waiting one by one; returns the ids in the same order as `items`.

        Batches are committed concurrently, so without ordering keys the emulator may stamp a
        later message with an earlier (or the same) publish time; with `ordering_keys`, each
        key's messages keep their order.
        """
        topic = self.topic_path(topic_id)
        keys = ordering_keys or [""] * len(items)
        futures = [
            self.publisher.publish(topic, data, ordering_key=key, **attrs)
            for (data, attrs), key in zip(items, keys, strict=True)
        ]
        return [str(f.result(timeout=60)) for f in futures]

    def pull(self, sub_id: str, count: int, timeout: float = 20.0, ack: bool = True) -> list[Pulled]:
        """Synchronous pulls until `count` messages arrived or `timeout` passed (returns what came)."""
        out: list[Pulled] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            out.extend(self._pull_once(sub_id, min(remaining, 5.0), ack))
        return out

    def assert_nothing_more(self, sub_id: str, period: float = 2.0) -> None:
        """Pull for a bounded `period`; fail if anything arrives."""
        extra = self.drain(sub_id, period)
        assert not extra, f"{len(extra)} unexpected message(s) on {sub_id}: {[(m.data, m.attributes) for m in extra]}"

    def drain(self, sub_id: str, period: float) -> list[Pulled]:
        """Everything that arrives within `period` seconds (acked)."""
        out: list[Pulled] = []
        deadline = time.monotonic() + period
        while (remaining := deadline - time.monotonic()) > 0:
            out.extend(self._pull_once(sub_id, max(remaining, 0.2), True))
        return out

    def _pull_once(self, sub_id: str, timeout: float, ack: bool) -> list[Pulled]:
        path = self.subscription_path(sub_id)
        try:
            resp = self.subscriber.pull(
                request={"subscription": path, "max_messages": 1000}, timeout=max(timeout, 0.5), retry=None
            )
        except gexc.DeadlineExceeded:
            return []
        got = [
            Pulled(
                message_id=r.message.message_id,
                data=bytes(r.message.data),
                attributes=dict(r.message.attributes),
                ordering_key=r.message.ordering_key,
                publish_time=r.message.publish_time.timestamp(),
            )
            for r in resp.received_messages
        ]
        if ack and resp.received_messages:
            self.subscriber.acknowledge(
                request={"subscription": path, "ack_ids": [r.ack_id for r in resp.received_messages]}
            )
        return got


# --- a TCP proxy that delays what goes to the server ------------------------------------


@dataclass
class DelayProxy:
    """127.0.0.1:port → target, holding every chunk bound for the target `delay` seconds.

    A pipeline delay (each chunk is due `delay` after it arrived, in order), so one RPC
    takes about `delay` longer however many frames it has. Replies pass straight through.
    `delay` may be changed while it runs. Runs its own event loop in a thread, so sync and
    async tests can both use it; `stop()` closes every connection and joins the thread.
    """

    target: str  # "127.0.0.1:P"
    delay: float = 0.0
    port: int = 0
    connections: int = 0
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _server: asyncio.Server | None = field(default=None, repr=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> DelayProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name="delay-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the delay proxy thread did not stop"
        self._thread = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        host, port = self.target.rsplit(":", 1)
        try:
            server_r, server_w = await asyncio.open_connection(host, int(port))
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def upstream_read() -> None:
            loop = asyncio.get_running_loop()
            while chunk := await client_r.read(65536):
                queue.put_nowait((loop.time() + self.delay, chunk))
            queue.put_nowait((loop.time() + self.delay, b""))

        async def upstream_write() -> None:
            loop = asyncio.get_running_loop()
            while True:
                due, chunk = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    server_w.write_eof()
                    return
                server_w.write(chunk)
                await server_w.drain()

        async def downstream() -> None:
            while chunk := await server_r.read(65536):
                client_w.write(chunk)
                await client_w.drain()
            with contextlib.suppress(OSError):
                client_w.write_eof()

        pumps = [asyncio.ensure_future(p) for p in (upstream_read(), upstream_write(), downstream())]
        try:
            await asyncio.gather(*pumps)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (client_w, server_w):
                w.close()
            self._tasks.discard(task)
