"""PubsubPublisher against the Pub/Sub emulator: what lands, what fails, and that waiting never blocks the loop."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import pytest
from google.api_core import exceptions as gexc

from pubsub_filter.backends.publishers.pubsub import PubsubPublisher
from pubsub_filter.core.config.schema import ConfigError
from pubsub_filter.core.ports import PublishFailed, Unpublishable
from pubsub_filter.core.pubsub_limits import PUBLISH_REQUEST_LIMIT, publish_request_bytes
from tests.support.emulators import PubsubEmulator
from tests.support.faultrig import FaultProxy
from tests.support.net import free_port
from tests.support.polling import eventually
from tests.support.pubsub_helpers import DelayProxy, PubsubAdmin, emulator_env, unique

pytestmark = pytest.mark.emulator

T = TypeVar("T")


@contextlib.asynccontextmanager
async def publisher_at(host: str, project: str, budget: float = 10.0) -> AsyncIterator[PubsubPublisher]:
    with emulator_env(host):
        pub = PubsubPublisher(project=project, timeout=budget)
    try:
        yield pub
    finally:
        await pub.close()


@contextlib.asynccontextmanager
async def publisher_behind(
    emulator: PubsubEmulator, delay: float, budget: float = 10.0
) -> AsyncIterator[PubsubPublisher]:
    """A publisher whose every request reaches the emulator `delay` seconds late."""
    with DelayProxy(emulator.host, delay=delay) as proxy:
        async with publisher_at(proxy.host, emulator.project, budget) as pub:
            yield pub


@pytest.fixture
async def publisher(pubsub_emulator: PubsubEmulator) -> AsyncIterator[PubsubPublisher]:
    async with publisher_at(pubsub_emulator.host, pubsub_emulator.project) as pub:
        yield pub


async def with_loop_watch(aw: Awaitable[T]) -> tuple[T | BaseException, float, float]:
    """Run `aw` while a 10 ms ticker watches the loop: (result or exception, elapsed s, largest tick gap s)."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []

    async def tick() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)  # the thing under test: a tick every 10 ms shows how long the loop was held
            now = loop.time()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        result: T | BaseException = await aw
    except Exception as exc:
        result = exc
    finally:
        elapsed = time.monotonic() - started
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    return result, elapsed, max(gaps, default=0.0)


async def test_publish_lands_with_data_and_attributes_intact(publisher: PubsubPublisher, admin: PubsubAdmin) -> None:
    topic = admin.topic("dest")
    sub = admin.pull_subscription(topic)
    data = b'{"game_id": "0022500001", "status": "Out"}\x00\xff\xfe not utf-8'
    attributes = {"source": "nbacom", "filter_fingerprint": "sha256:" + "ab" * 32, "unicode": "Dončić ✓"}

    published_id = await publisher.publish(topic, data, attributes)

    [got] = await asyncio.to_thread(admin.pull, sub, 1)
    assert got.message_id == published_id
    assert got.data == data
    assert got.attributes == attributes
    assert got.ordering_key == ""
    await asyncio.to_thread(admin.assert_nothing_more, sub, 1.0)


async def test_full_topic_path_is_used_as_is(publisher: PubsubPublisher, admin: PubsubAdmin) -> None:
    other = f"projects/other-project/topics/{unique('elsewhere')}"
    admin.publisher.create_topic(name=other)
    sub = f"projects/other-project/subscriptions/{unique('pull')}"
    admin.subscriber.create_subscription(name=sub, topic=other)
    try:
        await publisher.publish(other, b"cross-project", {})
        resp = admin.subscriber.pull(request={"subscription": sub, "max_messages": 10}, timeout=10)
        assert [bytes(r.message.data) for r in resp.received_messages] == [b"cross-project"]
    finally:
        admin.subscriber.delete_subscription(subscription=sub)
        admin.publisher.delete_topic(topic=other)


async def test_ordering_key_is_kept_in_order(publisher: PubsubPublisher, admin: PubsubAdmin) -> None:
    topic = admin.topic("ordered")
    sub = admin.pull_subscription(topic, ordered=True)
    sent = [(f"game-{i % 2}", f"{i:02d}".encode()) for i in range(12)]

    for key, data in sent:
        await publisher.publish(topic, data, {"n": data.decode()}, ordering_key=key)
    # An unordered publish on the same (ordering-enabled) client still works.
    await publisher.publish(topic, b"no-key", {}, None)

    got = await asyncio.to_thread(admin.pull, sub, len(sent) + 1)
    assert len(got) == len(sent) + 1
    for key in ("game-0", "game-1"):
        assert [m.data for m in got if m.ordering_key == key] == [d for k, d in sent if k == key]
    assert [m.data for m in got if m.ordering_key == ""] == [b"no-key"]


async def test_publishes_of_one_key_asked_at_once_land_in_the_order_asked(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    """Publishes of a key asked for together (an unordered source, a pull worker's batch) go out
    one at a time, each once the one before it is confirmed; other keys do not wait for them."""
    topic = admin.topic("ordered-burst")
    sub = admin.pull_subscription(topic, ordered=True)
    sent = [(f"game-{i % 3}", f"{i:02d}".encode()) for i in range(30)]
    async with publisher_behind(pubsub_emulator, 0.02) as pub:  # every RPC in flight a while
        ids = await asyncio.gather(*(pub.publish(topic, data, {}, ordering_key=key) for key, data in sent))
    assert len(set(ids)) == len(sent)
    got = await asyncio.to_thread(admin.pull, sub, len(sent))
    for key in ("game-0", "game-1", "game-2"):
        assert [m.data for m in got if m.ordering_key == key] == [d for k, d in sent if k == key]


async def test_a_publish_starts_no_thread(
    publisher: PubsubPublisher, admin: PubsubAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Thread.start()` holds the event loop until the new thread runs (~0.9 ms a forward under
    load, bench/README.md P4): a publish, keyed or not, one or many at once, starts none."""
    topic = admin.topic("threads")
    await publisher.publish(topic, b"first", {}, ordering_key="k")  # the channel is made once
    started: list[str] = []
    start = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for i in range(3):
        await publisher.publish(topic, b"one", {}, ordering_key=f"k{i}")
        await publisher.publish(topic, b"one", {})
    await asyncio.gather(*(publisher.publish(topic, b"many", {}, ordering_key=f"k{i % 2}") for i in range(6)))
    assert started == []


async def test_missing_topic_fails_naming_the_topic(
    publisher: PubsubPublisher, pubsub_emulator: PubsubEmulator
) -> None:
    missing = unique("missing")
    started = time.monotonic()
    with pytest.raises(PublishFailed) as err:
        await publisher.publish(missing, b"x", {})
    assert str(err.value) == f"topic projects/{pubsub_emulator.project}/topics/{missing} does not exist"
    assert time.monotonic() - started < 5, "NotFound is not transient: it must not be retried"


async def test_ordering_key_is_not_stuck_after_a_failed_publish(publisher: PubsubPublisher, admin: PubsubAdmin) -> None:
    topic_id = unique("late")
    with pytest.raises(PublishFailed, match="does not exist"):
        await publisher.publish(topic_id, b"first", {}, ordering_key="k")
    # The topic appears (an operator fixed the infra); the same key publishes again at once.
    admin.publisher.create_topic(name=admin.topic_path(topic_id))
    try:
        sub = admin.pull_subscription(topic_id, ordered=True)
        started = time.monotonic()
        await publisher.publish(topic_id, b"second", {}, ordering_key="k")
        assert time.monotonic() - started < 2
        got = await asyncio.to_thread(admin.pull, sub, 1)
        assert [(m.data, m.ordering_key) for m in got] == [(b"second", "k")]
    finally:
        with contextlib.suppress(gexc.NotFound):
            admin.publisher.delete_topic(topic=admin.topic_path(topic_id))


async def test_publish_after_close_fails_instead_of_hanging(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    topic = admin.topic("closed")
    async with publisher_at(pubsub_emulator.host, pubsub_emulator.project) as pub:
        await pub.publish(topic, b"before", {}, ordering_key="k")
    started = time.monotonic()
    for key in ("k", None):
        with pytest.raises(PublishFailed, match="closed"):
            await asyncio.wait_for(pub.publish(topic, b"after", {}, ordering_key=key), 5)
    assert time.monotonic() - started < 1
    await pub.close()  # closing twice is harmless


async def test_slow_confirmation_does_not_block_the_event_loop(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    topic = admin.topic("slow")
    sub = admin.pull_subscription(topic)
    async with publisher_behind(pubsub_emulator, 0.6, budget=10) as pub:
        result, elapsed, gap = await with_loop_watch(pub.publish(topic, b"slow", {"a": "b"}, ordering_key="k"))
    assert isinstance(result, str), result
    assert elapsed >= 0.6
    assert gap < 0.3, f"the event loop stalled for {gap:.3f}s while a publish was being confirmed"
    got = await asyncio.to_thread(admin.pull, sub, 1)
    assert [m.message_id for m in got] == [result]


async def test_unconfirmed_publish_fails_within_the_timeout(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    topic = admin.topic("hung")
    async with publisher_behind(pubsub_emulator, 5.0, budget=1.0) as pub:
        result, elapsed, gap = await with_loop_watch(pub.publish(topic, b"x", {}, ordering_key="k"))
        assert isinstance(result, PublishFailed), result
        assert topic in str(result)
        assert 0.9 <= elapsed < 2.5, elapsed
        assert gap < 0.3


async def test_a_publish_waiting_behind_a_hung_one_of_its_key_fails_within_its_own_timeout(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    topic = admin.topic("hung-key")
    async with publisher_behind(pubsub_emulator, 5.0, budget=1.0) as pub:
        started = time.monotonic()
        both = await asyncio.gather(
            pub.publish(topic, b"a", {}, ordering_key="k"),
            pub.publish(topic, b"b", {}, ordering_key="k"),
            return_exceptions=True,
        )
        elapsed = time.monotonic() - started
    assert [type(r) for r in both] == [PublishFailed, PublishFailed], both
    assert all("not confirmed within 1s" in str(r) for r in both), both
    assert 0.9 <= elapsed < 2.5, elapsed


async def test_a_close_cut_short_by_its_share_of_the_stop_ends_the_publishes_under_way(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    """`Engine.close` gives the publisher's close a share of the stop budget and cancels it there:
    a publish that hangs then ends at once as failed (its source message nacked), rather than
    running on to its own timeout past the stop."""
    topic = admin.topic("hung-close")
    with DelayProxy(pubsub_emulator.host, delay=30.0) as proxy:
        async with publisher_at(proxy.host, pubsub_emulator.project, budget=30.0) as pub:
            await asyncio.wait_for(pub.ping(), 1)
            hung = asyncio.create_task(pub.publish(topic, b"x", {}, ordering_key="k"))
            await eventually(lambda: proxy.connections, 5, "the publish's RPC on its way through the proxy")
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):  # what `closing.within` does at the share's end
                    await pub.close()
            started = time.monotonic()
            result = await asyncio.wait_for(asyncio.gather(hung, return_exceptions=True), 5)
            assert time.monotonic() - started < 1
    assert isinstance(result[0], PublishFailed) and "closed" in str(result[0]), result


async def test_a_publish_refused_for_a_while_is_retried_and_lands_once(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    topic = admin.topic("refused")
    sub = admin.pull_subscription(topic, ordered=True)
    with FaultProxy(pubsub_emulator.host) as proxy:
        async with publisher_at(proxy.host, pubsub_emulator.project, budget=20) as pub:
            await pub.publish(topic, b"before", {}, ordering_key="k")  # the channel is up
            proxy.refuse()
            refused = asyncio.create_task(pub.publish(topic, b"during", {}, ordering_key="k"))
            await eventually(lambda: proxy.refused >= 2, 10, "a second attempt after the first was refused")
            assert not refused.done()
            proxy.accept()
            published_id = await asyncio.wait_for(refused, 10)
    got = await asyncio.to_thread(admin.pull, sub, 2)
    assert [(m.data, m.message_id) for m in got][1:] == [(b"during", published_id)]
    assert [m.data for m in got] == [b"before", b"during"]
    await asyncio.to_thread(admin.assert_nothing_more, sub, 1.0)


async def test_unreachable_service_is_retried_then_fails_within_the_timeout(pubsub_emulator: PubsubEmulator) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    async with publisher_at(nowhere, pubsub_emulator.project, budget=1.5) as pub:
        result, elapsed, gap = await with_loop_watch(pub.publish("anything", b"x", {}, ordering_key="k"))
    assert isinstance(result, PublishFailed), result
    assert "ServiceUnavailable" in str(result) or "not confirmed" in str(result), str(result)
    assert f"projects/{pubsub_emulator.project}/topics/anything" in str(result)
    # Retried (the log shows each attempt) until another attempt would not fit in the budget.
    attempts = re.search(r"(\d+) attempt\(s\)", str(result))
    assert attempts is None or int(attempts.group(1)) > 1, str(result)
    assert 0.5 <= elapsed < 2.5, elapsed
    assert gap < 0.3


@pytest.mark.parametrize("name", ["timeout", "data", "topic", "retry", "ordering_key", "self"])
async def test_an_attribute_named_as_a_publish_parameter_lands_intact(
    publisher: PubsubPublisher, admin: PubsubAdmin, name: str
) -> None:
    topic = admin.topic("reserved")
    sub = admin.pull_subscription(topic, ordered=True)
    attributes = {name: "5", "source": "nbacom"}
    published_id = await publisher.publish(topic, b"payload", attributes, ordering_key="game-1")
    [got] = await asyncio.to_thread(admin.pull, sub, 1)
    assert (got.message_id, got.data, got.attributes, got.ordering_key) == (
        published_id,
        b"payload",
        attributes,
        "game-1",
    )


async def test_every_publish_parameter_name_at_once_lands_intact_and_in_order_with_the_rest(
    publisher: PubsubPublisher, admin: PubsubAdmin
) -> None:
    topic = admin.topic("reserved")
    sub = admin.pull_subscription(topic, ordered=True)
    every = {n: n.upper() for n in ("timeout", "data", "topic", "retry", "ordering_key", "self")}
    sent = [({"n": "0"}, b"0"), ({**every, "n": "1"}, b"1"), ({"n": "2"}, b"2")]
    for attributes, data in sent:
        await publisher.publish(topic, data, attributes, ordering_key="game-1")
    got = await asyncio.to_thread(admin.pull, sub, 3)
    assert [(g.attributes, g.data) for g in got] == sent


def test_bad_destination_is_named() -> None:
    with emulator_env("127.0.0.1:1"):
        pub = PubsubPublisher(project="p")
    with pytest.raises(PublishFailed, match="neither a topic id"):
        pub.topic_path("topics/x")
    assert pub.topic_path("phase3-injuries") == "projects/p/topics/phase3-injuries"
    assert pub.topic_path("projects/q/topics/t") == "projects/q/topics/t"
    asyncio.run(pub.close())


def test_project_is_required_under_the_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    with pytest.raises(ConfigError, match="project:"):
        PubsubPublisher(project=None)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    pub = PubsubPublisher(project=None)
    assert pub.project == "from-env"
    asyncio.run(pub.close())


async def test_ping_passes_while_the_client_runs_and_fails_once_closed(pubsub_emulator: PubsubEmulator) -> None:
    async with publisher_at(pubsub_emulator.host, pubsub_emulator.project) as pub:
        await pub.ping()
        await pub.close()
        with pytest.raises(PublishFailed, match="closed"):
            await pub.ping()


@pytest.mark.loop_may_block("10 MB messages: the client library sizes and copies them on the calling thread")
async def test_a_message_over_the_publish_request_limit_is_unpublishable_at_exactly_the_size_the_filter_counts(
    publisher: PubsubPublisher, admin: PubsubAdmin
) -> None:
    """The emulator takes any size; the client library refuses a Publish request over 10,000,000
    bytes before sending it. The filter's count (`publish_request_bytes`) is that limit to the byte,
    and a refusal is `Unpublishable` (the engine rejects it) rather than a failure retried as 5xx."""
    topic = admin.topic("big")
    path = admin.topic_path(topic)
    attributes = {"a": "v" * 1000}
    size = PUBLISH_REQUEST_LIMIT - publish_request_bytes(path, b"", attributes, None)
    while publish_request_bytes(path, b"x" * size, attributes, None) > PUBLISH_REQUEST_LIMIT:
        size -= 1  # the lengths' varints grow with the data
    assert publish_request_bytes(path, b"x" * size, attributes, None) == PUBLISH_REQUEST_LIMIT
    assert await publisher.publish(topic, b"x" * size, attributes)  # confirmed by the emulator
    # (not pulled back: through the emulator the client receives at most 4 MiB a message)
    with pytest.raises(Unpublishable, match="message too large"):
        await publisher.publish(topic, b"x" * (size + 1), attributes)
