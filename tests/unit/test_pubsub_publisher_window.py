"""The Pub/Sub publisher's batch window: every forward waits for it before it is sent
(the engine awaits each publish), so it is as short as still lets a burst share RPCs
(bench/publish.py: 1 ms keeps the batching of 64 forwards in flight on 4 ordering keys,
and one forward at a time goes ~5x faster than at 10 ms)."""

from __future__ import annotations

import asyncio

import pytest

from filter.backends.publishers.pubsub import PubsubPublisher


def test_a_forward_waits_at_most_a_millisecond_for_others_to_batch_with(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:9")  # no credentials; nothing is sent
    publisher = PubsubPublisher(project="p")
    try:
        assert publisher._client.batch_settings.max_latency <= 0.001
    finally:
        asyncio.run(publisher.close())
