"""The Publish request and channel the Pub/Sub publisher builds (no service needed: the channel
connects on its first call). What lands is tested against the emulator (tests/emulator)."""

from __future__ import annotations

from google.auth.credentials import AnonymousCredentials

from filter.backends.publishers.pubsub_wire import PublishWire, request
from filter.core.pubsub_limits import publish_request_bytes


def test_the_request_is_sized_as_the_filter_counts_a_publish() -> None:
    topic, data, attributes = "projects/p/topics/t", b"x" * 300, {"timeout": "5", "self": "v" * 200}
    req = request(topic, data, attributes, "game-1")
    assert req.ByteSize() == publish_request_bytes(topic, data, attributes, "game-1")
    assert dict(req.messages[0].attributes) == attributes  # any name, the client's keywords too


async def test_the_channel_to_pubsub_is_built_on_the_loop_from_the_credentials_given() -> None:
    wire = PublishWire(AnonymousCredentials(), emulator=None)
    await wire.close()
