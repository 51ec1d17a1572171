"""What every Google-facing module shares: the credentials message and Pub/Sub's timestamps.

One place, so that pull, replay, provision and the operational error lines say the same
thing, and no surface imports another to reuse it.
"""

from __future__ import annotations

import calendar
from typing import Any

NO_CREDENTIALS = (
    "no Google credentials: run `gcloud auth application-default login` (or use a service account), "
    "or set PUBSUB_EMULATOR_HOST for the emulator"
)


def timestamp(value: Any) -> float | None:
    """A protobuf publish time as the client gives it (`DatetimeWithNanoseconds`) → epoch seconds.

    Computed like `envelope.parse_time` (whole seconds plus nanoseconds), so the same
    message has the same float publish time whether it was pushed or pulled.
    """
    if value is None:
        return None
    seconds = calendar.timegm(value.utctimetuple())
    nanos = getattr(value, "nanosecond", None)
    if nanos is None:
        nanos = value.microsecond * 1000
    return float(seconds + nanos / 1e9) if nanos else float(seconds)
