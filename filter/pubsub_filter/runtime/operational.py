"""What goes wrong around a command rather than in it: missing credentials, a backend that
does not answer, a file that is not there. Each becomes one line on stderr and exit 1
(`describe`), and a one-shot command checks first that the backends it needs answer
(`require`), so an unreachable emulator or API costs seconds, not the client libraries'
60 s retry budget followed by a traceback.

Long-running surfaces (`serve`, `pull`) are not probed: they must start and ride out a
backend outage (fail open, nack and retry), as in production.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from pubsub_filter.core.ports import Failure

__all__ = ["BIGQUERY", "FIRESTORE", "PUBSUB", "Backend", "describe", "require"]

#: how long a backend has to accept a connection before a command gives up on it
PROBE_DEADLINE = 3.0
#: with a proxy the client libraries reach the API through it: a direct probe would say nothing
_PROXY_ENVS = ("https_proxy", "HTTPS_PROXY", "grpc_proxy", "all_proxy", "ALL_PROXY")


@dataclass(frozen=True)
class Backend:
    name: str
    emulator_env: str
    api: str  # host:port of the Google API


PUBSUB = Backend("Pub/Sub", "PUBSUB_EMULATOR_HOST", "pubsub.googleapis.com:443")
FIRESTORE = Backend("Firestore", "FIRESTORE_EMULATOR_HOST", "firestore.googleapis.com:443")
BIGQUERY = Backend("BigQuery", "BIGQUERY_EMULATOR_HOST", "bigquery.googleapis.com:443")


def _host_port(address: str) -> tuple[str, int]:
    parts = urlsplit(address if "//" in address else f"//{address}")
    if not parts.hostname:
        raise Failure(f"{address!r} is not a host:port")
    try:
        port = parts.port
    except ValueError:
        raise Failure(f"{address!r} is not a host:port") from None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _connect(host: str, port: int, deadline: float) -> str | None:
    """None when host:port accepts a TCP connection within `deadline`, else why not.

    In a thread, because name resolution ignores socket timeouts."""
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=deadline).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc) or type(exc).__name__)

    thread = threading.Thread(target=attempt, name=f"probe-{host}:{port}", daemon=True)
    thread.start()
    thread.join(deadline)
    return outcome[0] if outcome else f"no answer within {deadline:g}s"


def require(*backends: Backend, deadline: float = PROBE_DEADLINE) -> None:
    """Raise `Failure` naming the first backend that does not accept a connection in time."""
    for backend in dict.fromkeys(backends):
        emulator = os.environ.get(backend.emulator_env)
        if not emulator and any(os.environ.get(name) for name in _PROXY_ENVS):
            continue
        host, port = _host_port(emulator or backend.api)
        why = _connect(host, port, deadline)
        if why is None:
            continue
        if emulator:
            raise Failure(
                f"the {backend.name} emulator at {emulator} ({backend.emulator_env}) is not reachable: {why}; "
                "is it running?"
            )
        raise Failure(f"{backend.name} ({backend.api}) is not reachable: {why}")


def describe(exc: BaseException) -> str | None:
    """One line for a foreseeable operational failure; None for anything else (a bug: let it raise)."""
    from google.api_core.exceptions import GoogleAPICallError, RetryError
    from google.auth.exceptions import DefaultCredentialsError

    from pubsub_filter.core.compare.fingerprint import PayloadError
    from pubsub_filter.core.ports import StoreUnavailable
    from pubsub_filter.google.shared import NO_CREDENTIALS  # the line pull, replay and provision already print

    if isinstance(exc, Failure):
        text = str(exc)
    elif isinstance(exc, DefaultCredentialsError):
        text = f"{NO_CREDENTIALS} ({exc})"
    elif isinstance(exc, StoreUnavailable):
        text = f"the state store did not answer: {exc}"
    elif isinstance(exc, PayloadError):
        text = f"payload rejected: {exc}"
    elif isinstance(exc, RetryError):
        text = f"gave up after retrying: {exc.cause or exc}"
    elif isinstance(exc, GoogleAPICallError):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        return None
    return " ".join(text.split())
