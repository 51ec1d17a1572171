"""What the client library logs when the pull worker stops its streams on purpose, and the filter
that keeps those lines out of the log while the worker shuts down."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: What the library logs when the worker closes a stream and then its channel, on purpose:
#: it joins its stream thread for 1 s and warns if the thread is still in an RPC (the
#: worker waits for that thread itself, `_join_stream_threads`); a stream that cannot reach
#: Pub/Sub is reopened until its channel closes, which it then reports as an error.
#: A stream that did not stop in time (`stream_did_not_stop`) still has its dispatcher's
#: callback thread, which reports its last ack or modack call on the channel closed under it
#: as an error: such a message is redelivered and answered `duplicate` (nothing is lost or
#: published twice).
_SHUTDOWN_NOISE = {
    "google.api_core.bidi": ("Background thread did not exit.", "Cannot invoke RPC: Channel closed!"),
    "grpc._channel": ("Cannot invoke RPC: Channel closed!",),
    "google.cloud.pubsub_v1.subscriber._protocol.helper_threads": ("Cannot invoke RPC on closed channel!",),
}


class _ShutdownNoise(logging.Filter):
    def __init__(self, texts: tuple[str, ...]):
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


@contextlib.contextmanager
def shutdown_noise_filtered() -> Iterator[None]:
    """While the worker shuts down: the library's lines about streams closed on purpose are dropped."""
    quiet = {name: _ShutdownNoise(texts) for name, texts in _SHUTDOWN_NOISE.items()}
    for name, noise in quiet.items():
        logging.getLogger(name).addFilter(noise)
    try:
        yield
    finally:
        for name, noise in quiet.items():
            logging.getLogger(name).removeFilter(noise)
