"""What every Google-facing module shares: resource paths, the project, the credentials
message, which errors are transient, chunked acks, and Pub/Sub's timestamps.

One place, so that pull, replay, provision, the publisher and the operational error lines
say the same thing, and no surface imports another to reuse it.
"""

from __future__ import annotations

import calendar
import logging
import os
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc

from pubsub_filter.core.config.names import Kind, PubsubNameError, check_name, is_full
from pubsub_filter.core.config.schema import ConfigError

#: how to get credentials, whichever backend needs them
NO_CREDENTIALS_HOW = "run `gcloud auth application-default login` (or use a service account)"
NO_CREDENTIALS = f"no Google credentials: {NO_CREDENTIALS_HOW}, or set PUBSUB_EMULATOR_HOST for the emulator"

#: Errors worth another attempt: the service (or the path to it) is briefly unhappy and did not
#: take the request. Not DeadlineExceeded: a publish that timed out may still have landed, and
#: publishing is not idempotent, so a retry would put a second copy downstream.
TRANSIENT: tuple[type[BaseException], ...] = (
    gexc.ServiceUnavailable,
    gexc.InternalServerError,
    gexc.Aborted,
    gexc.Unknown,
    gexc.ResourceExhausted,
    auth_exc.TransportError,
)

#: Ack ids per unary Acknowledge / ModifyAckDeadline request (Pub/Sub caps a request's size).
ACK_BATCH = 1000


def pubsub_path(name: str, kind: Kind, project: str) -> str:
    """A topic or subscription given as an id (in `project`) or as `projects/P/{kind}s/ID` → the full path.

    PubsubNameError, in the config's words, for a malformed name, a path of another kind, or
    a project id Pub/Sub would refuse.
    """
    check_name(name, kind)
    if name.startswith("projects/"):
        return name
    path = f"projects/{project}/{kind}s/{name}"
    if not is_full(path, kind):
        raise PubsubNameError(
            f"{project!r} is not a project id (lowercase letters, digits, - . :, starting with a letter)"
        )
    return path


def resolve_project(project: str | None) -> str:
    """The project for short topic ids: the argument, $GOOGLE_CLOUD_PROJECT, then the credentials'."""
    if project:
        return project
    env = os.environ.get("GOOGLE_CLOUD_PROJECT")
    if env:
        return env
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        raise ConfigError(
            "publisher",
            [
                "no project for the Pub/Sub publisher: PUBSUB_EMULATOR_HOST is set, so there are no "
                "credentials to take one from. Set `project:` in the config (top level or under "
                "publisher:) or GOOGLE_CLOUD_PROJECT"
            ],
        )
    try:
        _, found = quiet_default_credentials()
    except auth_exc.DefaultCredentialsError as exc:
        raise ConfigError(
            "publisher",
            [
                f"no project for the Pub/Sub publisher and no default credentials to take one from ({exc}): "
                "set `project:` in the config"
            ],
        ) from None
    if not found:
        raise ConfigError(
            "publisher",
            ["no project for the Pub/Sub publisher: the default credentials name none; set `project:` in the config"],
        )
    return str(found)


PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "GCP_PROJECT", "CLOUDSDK_CORE_PROJECT")
_METADATA_PROJECT = "http://metadata.google.internal/computeMetadata/v1/project/project-id"


def detect_project() -> str | None:
    """The project for the log lines' trace names: the usual env vars, else (on Cloud Run, which
    sets none of them) the metadata server, asked once with a short timeout."""
    for name in PROJECT_ENVS:
        if os.environ.get(name):
            return os.environ[name]
    if os.environ.get("K_SERVICE"):
        req = urllib.request.Request(_METADATA_PROJECT, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(req, timeout=1.0) as resp:
                return resp.read().decode().strip() or None
        except OSError:
            return None
    return None


def quiet_default_credentials() -> tuple[Any, str | None]:
    """`google.auth.default()` without its warning that the metadata server is not there.

    Asked at start-up, where no credentials becomes the command's own one line; the warning
    before it (a JSON log line once logging is set up) only confuses. Start-up is
    single-threaded, so a brief global disable hides nothing else.
    """
    import google.auth

    logging.disable(logging.WARNING)
    try:
        return google.auth.default()
    finally:
        logging.disable(logging.NOTSET)


#: A chunk of ack ids that a call could not settle, and why: the caller logs or counts it.
Unsettled = tuple[int, Exception]


def acknowledge(subscriber: Any, subscription: str, ack_ids: Sequence[str], timeout: float) -> list[Unsettled]:
    """Ack `ack_ids` in unary requests of at most ACK_BATCH; the chunks that failed."""
    return _chunked(
        ack_ids,
        lambda chunk: subscriber.acknowledge(request={"subscription": subscription, "ack_ids": chunk}, timeout=timeout),
    )


def modify_ack_deadline(
    subscriber: Any, subscription: str, ack_ids: Sequence[str], seconds: int, timeout: float
) -> list[Unsettled]:
    """Set the ack deadline of `ack_ids` (0 releases them for redelivery now); the chunks that failed."""
    return _chunked(
        ack_ids,
        lambda chunk: subscriber.modify_ack_deadline(
            request={"subscription": subscription, "ack_ids": chunk, "ack_deadline_seconds": seconds},
            timeout=timeout,
        ),
    )


def _chunked(ack_ids: Sequence[str], call: Callable[[list[str]], Any]) -> list[Unsettled]:
    failed: list[Unsettled] = []
    for i in range(0, len(ack_ids), ACK_BATCH):
        chunk = list(ack_ids[i : i + ACK_BATCH])
        try:
            call(chunk)
        except Exception as exc:  # one chunk failing must not keep the others from being settled
            failed.append((len(chunk), exc))
    return failed


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


def describe_error(exc: BaseException | None) -> str:
    """An error for a log line: its type and what it says (a Google API error's own `message`,
    without the status details its `str` repeats)."""
    if exc is None:
        return "unknown error"
    text = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
