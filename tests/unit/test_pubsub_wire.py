"""The Publish request and channel the Pub/Sub publisher builds (no service needed: the channel
connects on its first call). What lands is tested against the emulator (tests/emulator)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials

from pubsub_filter.backends.publishers.pubsub import PubsubPublisher
from pubsub_filter.backends.publishers.pubsub_wire import PublishWire, request
from pubsub_filter.core.ports import PublishFailed, Unpublishable
from pubsub_filter.core.pubsub_limits import publish_request_bytes
from tests.support.pubsub_helpers import emulator_env


def test_the_request_is_sized_as_the_filter_counts_a_publish() -> None:
    topic, data, attributes = "projects/p/topics/t", b"x" * 300, {"timeout": "5", "self": "v" * 200}
    req = request(topic, data, attributes, "game-1")
    assert req.ByteSize() == publish_request_bytes(topic, data, attributes, "game-1")
    assert dict(req.messages[0].attributes) == attributes  # any name, the client's keywords too


@pytest.mark.parametrize("emulator", [None, "127.0.0.1:9"], ids=["pubsub", "emulator"])
async def test_the_channel_is_an_asyncio_channel_that_connects_on_its_first_call_and_closes_with_the_wire(
    emulator: str | None,
) -> None:
    wire = PublishWire(AnonymousCredentials(), emulator=emulator)
    channel = wire._transport.grpc_channel
    assert isinstance(channel, grpc.aio.Channel)  # awaited on the loop: no thread of the library's
    assert channel.get_state() == grpc.ChannelConnectivity.IDLE  # nothing dialled yet
    await wire.close()
    with pytest.raises(grpc.aio.UsageError, match="closed"):
        await wire.publish(request("projects/p/topics/t", b"x", {}, ""), within=1)


@pytest.mark.parametrize(
    ("error", "kind", "said"),
    [
        (gexc.NotFound("no topic"), PublishFailed, "topic projects/p/topics/t does not exist"),
        (
            gexc.PermissionDenied("no role"),
            PublishFailed,
            "permission denied publishing to projects/p/topics/t: the service account needs "
            "roles/pubsub.publisher on it (no role)",
        ),
        (
            gexc.InvalidArgument("too big"),
            Unpublishable,
            "Pub/Sub rejected the message for projects/p/topics/t: too big",
        ),
        (
            gexc.ServiceUnavailable("down"),
            PublishFailed,
            "publish to projects/p/topics/t failed after 3 attempt(s) in 30s: ServiceUnavailable: down",
        ),
        (gexc.Cancelled("gone"), PublishFailed, "publish to projects/p/topics/t failed: Cancelled: gone"),
        (gexc.FailedPrecondition("no"), PublishFailed, "publish to projects/p/topics/t failed: FailedPrecondition: no"),
    ],
)
def test_what_a_publish_that_failed_says_names_the_topic_and_what_to_do(
    error: Exception, kind: type[PublishFailed], said: str
) -> None:
    with emulator_env("127.0.0.1:1"):
        pub = PubsubPublisher(project="p")
    failure = pub._failure(error, "projects/p/topics/t", attempts=3)
    assert (type(failure), str(failure)) == (kind, said)


def test_a_cancelled_publish_of_a_closed_publisher_says_it_is_closed() -> None:
    with emulator_env("127.0.0.1:1"):
        pub = PubsubPublisher(project="p")
    asyncio.run(pub.close())
    assert str(pub._failure(gexc.Cancelled("gone"), "projects/p/topics/t", attempts=1)) == (
        "the publisher is closed (shutting down)"
    )
