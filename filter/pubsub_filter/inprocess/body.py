"""The caller's body as the forward's sender: what it runs on, how it ends, and the result it keeps.

`BodySender` stands where the sidecar's publisher stands (`Engine.handle(..., via=...)`): the
engine claims the lease, sends (runs the body), and commits only once the send returned. A
body that returned has done its work, so it is committed whatever became of its result: a
result `cache_result` cannot keep (not JSON-encodable, too large) is left out of the commit
and what the send returns says why (`Worked.unkept`), rather than failing a forward whose effect is done (the
redelivery would run the body again, every time, until the message is dead-lettered).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec

from pubsub_filter.core.attributes import ATTR_FENCE, ATTR_KEY, ATTR_KEY_SHA256
from pubsub_filter.core.engine.transitions import RESULTS_MAX_BYTES
from pubsub_filter.core.errors import FilterTypeError, ResultNotStored
from pubsub_filter.core.model import Cause
from pubsub_filter.core.ports import PublishFailed, Traced, Worked

T = TypeVar("T")

#: What a decision record shows as `published_id` when the caller's work ran in place of a publish.
IN_PROCESS = "in-process"


@dataclass(frozen=True, slots=True)
class Forward:
    """What the body runs on: what the sidecar would have published for this forward.

    `data` is the payload forwarded (only the new and changed rows on a `rows_mode: changed`
    route); `attributes` carry the filter's own (`filter_fingerprint`, `filter_fence`, ...).
    """

    route: str
    data: bytes
    attributes: Mapping[str, str]

    @property
    def key(self) -> str | None:
        return self.attributes.get(ATTR_KEY)

    @property
    def key_sha256(self) -> str | None:
        return self.attributes.get(ATTR_KEY_SHA256)

    @property
    def fence(self) -> int | None:
        """The lease's fencing token; None when the body runs without a lease (shadow mode, fail-open)."""
        fence = self.attributes.get(ATTR_FENCE)
        return int(fence) if fence is not None else None


class WorkFailed(PublishFailed):
    """The caller's body (in place of the publish) did not return: the lease is released, the
    decision recorded `failed` (cause work), and the caller gets `raised`, what the body raised."""

    def __init__(self, description: str, raised: BaseException | None = None):
        super().__init__(description)
        self.raised: BaseException = self if raised is None else raised


class BodySender(Generic[T]):
    """The forward's sender in-process: the caller's body runs in place of the publish.

    Every way of the body not returning is a failed forward (`WorkFailed`): what is not an
    `Exception` too (a `KeyboardInterrupt`, a `SystemExit`, a `GeneratorExit`), and the caller's
    own cancel of the body. None may leave the key leased, the decision unrecorded, or the loop
    stopped; the engine raises the `WorkFailed` once the decision is recorded. A body that
    returned is a forward that went out: its `Worked` carries what the body returned, and the
    result kept with it when it can be (`unkept` says why not). The sender holds nothing of a
    call: the engine hands its `Worked` back (`Handled.sent`).
    """

    cause = Cause.WORK
    lands_despite_cancel = False  # the caller's cancel (a timeout on a stuck body) reaches the body
    attribute_limits = False  # nothing goes to Pub/Sub

    def __init__(self, route: str, body: Callable[[Forward], Awaitable[T]], cache: bool):
        self.route = route
        self.body = body
        self.cache = cache  # keep the result with the forward (`cache_result`)

    async def send(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None, traced: Traced
    ) -> Worked:
        try:
            result = await awaitable(self.body(Forward(self.route, data, attributes)))
        except WorkFailed:
            raise  # the body said why itself (`SyncFilter`'s, from the caller's thread)
        except asyncio.CancelledError as exc:
            raise WorkFailed("cancelled while it ran", exc) from exc
        except BaseException as exc:  # see the docstring: the caller raises it again
            raise WorkFailed(f"{type(exc).__name__}: {exc}", exc) from exc
        if not self.cache:
            return Worked(IN_PROCESS, returned=result)
        try:
            return Worked(IN_PROCESS, result_json(result), returned=result)
        except ResultNotStored as exc:
            return Worked(IN_PROCESS, returned=result, unkept=str(exc))


def result_json(result: object) -> str:
    """`result` as the JSON text kept with the forward, or `ResultNotStored` saying why it cannot be."""
    try:
        text = msgspec.json.encode(result).decode()
    except (TypeError, msgspec.EncodeError, OverflowError, RecursionError) as exc:
        raise ResultNotStored(
            f"cache_result: the body's result ({type(result).__name__}) is not JSON-encodable: {exc}"
        ) from exc
    if (size := len(text.encode())) > RESULTS_MAX_BYTES:
        raise ResultNotStored(
            f"cache_result: the body's result is {size} bytes as JSON, more than the {RESULTS_MAX_BYTES} kept"
        )
    return text


def awaitable(work: Awaitable[T]) -> Awaitable[T]:
    """`work`, or `FilterTypeError` when a `Filter` body returned something that cannot be awaited."""
    if not inspect.isawaitable(work):
        raise FilterTypeError(
            f"the body returned {type(work).__name__}, not an awaitable: Filter runs an async def body; "
            "use SyncFilter for a plain function"
        )
    return work
