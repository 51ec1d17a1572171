"""The filter counts a Publish request's bytes exactly as the client library does (protobuf's
`ByteSize`, which the library compares with 10,000,000 before sending)."""

from __future__ import annotations

import pytest
from google.pubsub_v1 import types

from pubsub_filter.core.pubsub_limits import publish_request_bytes

CASES = [
    ("projects/p/topics/t", b"x" * 10, {"a": "b"}, "key"),
    ("projects/p/topics/t", b"", {"": "", "z": ""}, None),
    ("", b"", {}, None),
    ("projects/" + "p" * 30 + "/topics/" + "t" * 255, b"\xff" * 200_000, {"é" * 128: "✓" * 300}, "k" * 1024),
    ("projects/p/topics/t", b"y" * 9_999_000, {f"a{i:03d}": "v" * 1000 for i in range(99)}, None),
]


@pytest.mark.parametrize(("topic", "data", "attributes", "ordering_key"), CASES)
def test_a_publish_request_is_sized_as_protobuf_sizes_it(
    topic: str, data: bytes, attributes: dict[str, str], ordering_key: str | None
) -> None:
    message = types.PubsubMessage(data=data, attributes=attributes, ordering_key=ordering_key or "")
    request = types.PublishRequest(topic=topic, messages=[message])
    expected = types.PublishRequest.pb(request).ByteSize()
    assert publish_request_bytes(topic, data, attributes, ordering_key) == expected
