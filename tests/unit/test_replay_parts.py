"""The pieces of `pubsub-filter replay` that need no emulator: replay attributes, pacing, progress."""

from __future__ import annotations

import asyncio
import io
import re
import time

import pytest

from pubsub_filter.core.envelope import ATTR_ORIGINAL_TIME, effective_publish_time
from pubsub_filter.core.model import Message
from pubsub_filter.core.times import parse_time
from pubsub_filter.replay.deadletter import ATTR_COUNT, ATTR_ORIGINAL_ID, DeadLetter, ReplayFailure
from pubsub_filter.replay.options import parse_rate
from pubsub_filter.replay.progress import Counts, Progress
from pubsub_filter.replay.rate import Pace


def test_effective_publish_time_prefers_the_original() -> None:
    assert effective_publish_time({}, 100.0) == 100.0
    assert effective_publish_time({ATTR_ORIGINAL_TIME: "1970-01-01T00:00:10.5Z"}, 100.0) == 10.5
    assert effective_publish_time({ATTR_ORIGINAL_TIME: "yesterday"}, 100.0) == 100.0
    assert effective_publish_time({}, None) is None


def test_replay_attributes_keep_the_first_origin_and_count() -> None:
    class Stamp:
        def rfc3339(self) -> str:
            return "2026-01-02T00:00:00.123Z"

        def utctimetuple(self) -> time.struct_time:
            return time.gmtime(parse_time("2026-01-02T00:00:00Z"))

        nanosecond = 123_000_000

    class Received:
        ack_id = "a"

        class message:
            message_id = "77"
            data = b"{}"
            attributes = {
                "k": "v",
                ATTR_ORIGINAL_ID: "5",
                ATTR_ORIGINAL_TIME: "2026-01-01T00:00:00Z",
                ATTR_COUNT: "2",
                "CloudPubSubDeadLetterSourceTopicPublishTime": "2026-01-01T12:00:00Z",
                "CloudPubSubDeadLetterSourceDeliveryCount": "5",
            }
            ordering_key = ""
            publish_time = Stamp()

    d = DeadLetter.from_received(Received)
    assert d.replay_attributes() == {
        "k": "v",
        ATTR_ORIGINAL_ID: "5",
        ATTR_ORIGINAL_TIME: "2026-01-01T00:00:00Z",
        ATTR_COUNT: "3",
    }
    msg = Message(b"{}", d.replay_attributes(), "77", effective_publish_time(d.replay_attributes(), d.publish_time))
    assert msg.publish_time == parse_time("2026-01-01T00:00:00Z")


def dead_letter(attributes: dict[str, str]) -> DeadLetter:
    return DeadLetter("a", "77", b"{}", attributes, "", 1.0, "2026-01-02T00:00:00Z")


def test_a_message_replayed_before_at_100_attributes_is_replayed_again_within_them() -> None:
    own = {f"a{i:03d}": "v" for i in range(97)}
    ours = {ATTR_ORIGINAL_ID: "5", ATTR_ORIGINAL_TIME: "2026-01-01T00:00:00Z", ATTR_COUNT: "1"}
    dead = {**own, **ours, "CloudPubSubDeadLetterSourceDeliveryCount": "5"}
    assert dead_letter(dead).replay_attributes() == {**own, **ours, ATTR_COUNT: "2"}  # replaced, not added


def test_a_message_with_100_attributes_of_its_own_cannot_be_replayed() -> None:
    own = {f"a{i:03d}": "v" for i in range(100)}
    with pytest.raises(ReplayFailure, match=f"it has 100 attributes of its own.*must add {ATTR_ORIGINAL_TIME}"):
        dead_letter({**own, "CloudPubSubDeadLetterSourceDeliveryCount": "5"}).replay_attributes()


def test_rate_paces_replays_after_the_first() -> None:
    async def take(n: int, rate: float) -> float:
        bucket = Pace(rate)
        started = time.monotonic()
        for _ in range(n):
            await bucket.take()
        return time.monotonic() - started

    assert asyncio.run(take(11, 50.0)) >= 0.19  # the first is free, then 10 at 50/s
    assert parse_rate("300/m") == 5.0 and parse_rate("2/s") == 2.0 and parse_rate("10") == 10.0
    with pytest.raises(ValueError, match="--rate"):
        parse_rate("fast")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_with_max_is_a_bar_with_total_rate_and_eta() -> None:
    counts = Counts(replayed=3, filtered_out=1)
    tty = _Tty()
    progress = Progress(tty, counts, dry_run=False, total=10)
    progress.update(force=True)
    counts.replayed = 4
    progress.finish()
    text = tty.getvalue()
    last = text.rsplit("\r", 1)[-1]
    assert re.search(r"replay:\s+40%\|.*\| 4/10 \[", last), last  # the bar, done/total
    assert re.search(r"\d\d:\d\d<\d\d:\d\d", last) and "msg/s" in last, last  # elapsed<ETA, rate
    assert "1 filtered out, 0 failed" in last
    assert text.endswith("\n")


def test_progress_on_a_terminal_without_a_total_counts_with_a_rate() -> None:
    counts = Counts(would_replay=7)
    tty = _Tty()
    progress = Progress(tty, counts, dry_run=True)
    progress.finish()
    last = tty.getvalue().rsplit("\r", 1)[-1]
    assert last.startswith("dry run: 7msg [") and "msg/s" in last and "%" not in last, last


def test_progress_off_a_terminal_is_plain_lines() -> None:
    counts = Counts(replayed=3, filtered_out=1)
    plain = io.StringIO()
    progress = Progress(plain, counts, dry_run=False, interval=0, total=10)
    progress.update()
    progress.update()
    progress.finish()
    text = plain.getvalue()
    assert "\r" not in text and "%|" not in text
    assert text.count("\n") == 2 and text.startswith("replay: 3 replayed, 1 filtered out, 0 failed | ")
