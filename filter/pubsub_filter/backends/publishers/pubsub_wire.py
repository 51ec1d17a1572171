"""Pub/Sub's Publish RPC as a plain protobuf call on the event loop's gRPC channel.

Why not google-cloud-pubsub's `PublisherClient`: for every batch it starts threads (the commit
timer's, then the batch's commit thread), and `Thread.start()` holds the calling thread, the
event loop, until the new thread runs: ~0.9 ms of loop time per forward under the Firestore
path's load (bench/README.md, P4), plus the batch window every forward waited out and the hop
back to the loop. Here one forward is one Publish RPC on a `grpc.aio` channel: no thread, no
window, the reply awaited on the loop.

The channel is the generated async transport's (`PublisherGrpcAsyncIOTransport`, what
`google.pubsub_v1.PublisherAsyncClient` uses): its endpoint, credentials, scopes and channel
options; to the emulator (`PUBSUB_EMULATOR_HOST` when the publisher was made), a plain channel,
as the generated client makes it. The request is built with the generated protobuf classes (public:
`Message.pb()`), as `stores.firestore_wire` does for the store: the proto-plus wrappers cost
more than the RPC's own encoding. Errors come back as google-api-core's exceptions
(`from_grpc_error`), as the library's calls raise them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.api_core.gapic_v1 import routing_header
from google.pubsub_v1.services.publisher.transports.grpc_asyncio import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.types import pubsub

PublishRequest = pubsub.PublishRequest.pb()
PublishResponse = pubsub.PublishResponse.pb()
PubsubMessage = pubsub.PubsubMessage.pb()

PUBLISH = "/google.pubsub.v1.Publisher/Publish"
#: The generated transport's message size options, for the emulator's channel too: no limit of
#: gRPC's own below Pub/Sub's (`PUBLISH_REQUEST_LIMIT`, checked by the publisher).
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def request(topic: str, data: bytes, attributes: Mapping[str, str], ordering_key: str) -> Any:
    """The Publish request for one message; its `ByteSize()` is what Pub/Sub's 10 MB limit counts."""
    message = PubsubMessage(data=data, attributes=attributes, ordering_key=ordering_key)
    return PublishRequest(topic=topic, messages=[message])


class PublishWire:
    """The Publish RPC on one channel, made (and to be used) on the running event loop."""

    def __init__(self, credentials: Any, emulator: str | None):
        # As the generated client builds it: to the emulator, a plain channel; to Pub/Sub, with
        # the credentials (and the scopes, endpoint and options of the generated transport).
        channel = grpc.aio.insecure_channel(emulator, options=CHANNEL_OPTIONS) if emulator else None
        self._transport = PublisherGrpcAsyncIOTransport(credentials=None if emulator else credentials, channel=channel)
        self._call = self._transport.grpc_channel.unary_unary(
            PUBLISH,
            request_serializer=PublishRequest.SerializeToString,
            response_deserializer=PublishResponse.FromString,
        )
        self._metadata: dict[str, tuple[tuple[str, str], ...]] = {}

    async def publish(self, req: Any, within: float) -> str:
        """Send `req` (one message) within `within` seconds (the RPC's deadline); the message id Pub/Sub gave it."""
        topic = req.topic
        metadata = self._metadata.get(topic)
        if metadata is None:  # the routing header the generated client sends: one per topic
            metadata = self._metadata[topic] = (routing_header.to_grpc_metadata((("topic", topic),)),)  # type: ignore[no-untyped-call]
        try:
            reply = await self._call(req, timeout=within, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise gexc.from_grpc_error(exc) from exc  # type: ignore[no-untyped-call]
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller's cancel
            # The call was cancelled under us (`close` closed the channel): a failure, never
            # a CancelledError our caller would take for its own cancel.
            raise gexc.Cancelled("the channel was closed") from None  # type: ignore[no-untyped-call]
        return str(reply.message_ids[0])

    async def close(self) -> None:
        """Close the channel: RPCs still under way end as cancelled."""
        await self._transport.close()  # type: ignore[no-untyped-call]
