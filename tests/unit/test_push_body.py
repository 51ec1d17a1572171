"""The push path reads a request body straight from ASGI, within `server.max_body` and
`server.body_timeout`, and a shutdown's cancel is not a timeout."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pubsub_filter.push.admission import LoopLag
from pubsub_filter.push.app import _body, _Disconnected, _TooLarge

Message = dict[str, Any]


def parts(*chunks: bytes) -> Any:
    """A receive that hands over `chunks` at once, as uvicorn does with a body already received."""
    queue = list(chunks)

    async def receive() -> Message:
        chunk = queue.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(queue)}

    return receive


async def test_a_body_already_received_in_parts_is_read_in_full() -> None:
    assert await _body(parts(b"ab", b"", b"cd"), 10, "4", 5.0) == b"abcd"


async def test_a_body_over_the_limit_in_parts_is_too_large_whatever_its_declared_length() -> None:
    with pytest.raises(_TooLarge):
        await _body(parts(b"abcdef", b"ghijkl"), 10, "3", 5.0)


async def test_a_body_that_arrives_after_a_wait_is_read() -> None:
    arrived = asyncio.Event()

    async def receive() -> Message:
        await arrived.wait()
        return {"type": "http.request", "body": b"late", "more_body": False}

    reading = asyncio.create_task(_body(receive, 10, None, 5.0))
    await asyncio.sleep(0)  # the read is waiting now
    arrived.set()
    assert await reading == b"late"


async def test_a_body_that_never_arrives_is_a_timeout() -> None:
    never = asyncio.Event()

    async def receive() -> Message:
        await never.wait()
        raise AssertionError("unreachable")

    with pytest.raises(TimeoutError):
        await _body(receive, 10, None, 0.01)


async def test_a_rest_of_a_body_that_never_arrives_is_a_timeout() -> None:
    never = asyncio.Event()
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"part", "more_body": True}
        await never.wait()
        raise AssertionError("unreachable")

    with pytest.raises(TimeoutError):
        await _body(receive, 10, None, 0.01)


async def test_a_cancel_while_the_body_is_awaited_is_a_cancel_not_a_timeout() -> None:
    never = asyncio.Event()

    async def receive() -> Message:
        await never.wait()
        raise AssertionError("unreachable")

    reading = asyncio.create_task(_body(receive, 10, None, 60.0))
    await asyncio.sleep(0)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading


async def test_a_client_that_leaves_before_its_body_is_a_disconnect() -> None:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    with pytest.raises(_Disconnected):
        await _body(receive, 10, None, 5.0)


@pytest.mark.loop_may_block("holds its loop on purpose: the server's own delay, which the body timeout must not count")
async def test_a_body_whose_rest_waited_for_the_servers_held_loop_is_read_not_timed_out() -> None:
    rest = asyncio.Event()
    first = True

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"part", "more_body": True}
        await rest.wait()
        return {"type": "http.request", "body": b"rest", "more_body": False}

    reading = asyncio.create_task(_body(receive, 100, None, 0.2, LoopLag()))
    await asyncio.sleep(0)  # the read waits for the rest
    time.sleep(0.4)  # noqa: ASYNC251  the loop held past the body timeout (another request's work), on purpose
    await asyncio.sleep(0)  # the loop's next turn: the deadline is due
    rest.set()
    assert await reading == b"partrest"


async def test_a_sender_that_stalls_while_the_loop_is_free_is_still_a_timeout() -> None:
    never = asyncio.Event()
    first = True

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"part", "more_body": True}
        await never.wait()
        raise AssertionError("unreachable")

    lag = LoopLag()
    with pytest.raises(TimeoutError):
        await _body(receive, 10, None, 0.1, lag)
    assert lag.watchers == 0  # the watch ends with the read
