"""Can the backends a config names be durable where the filter runs? (contract 5)

The embedded backends are files on one machine, lasting as long as its disk and shared by its
processes. On Cloud Run a file is neither: an instance's filesystem is in memory, gone when the
instance stops (every scale-down, every new revision, every crash), and every instance has its
own. So there

- the SQLite **state** is lost with each instance and never shared: each instance judges
  changes against its own history, and two instances' leases do not exclude each other;
- the **outbox** publisher appends each forward to a file inside the container: the message is
  acked, and its content never reaches Pub/Sub (contract 1 broken on every forward);
- the SQLite **records** are per instance, unreadable by `skip-rate`, lost with the instance,
  and grow in the instance's memory. Refused too, not merely warned about: a warning at start
  is read by nobody, and shadow mode's whole answer (what would have been suppressed) is in
  these records. The decision log lines still reach Cloud Logging either way.

Each is refused (by the commands, and by the in-process API for its state and records), with
the one YAML line that fixes it. Cloud Run is recognised by what it sets in every container:
`K_SERVICE` (services) and `CLOUD_RUN_JOB` (jobs); `check --for cloud-run` asks the same
question from anywhere (CI, before a deploy).

A deliberate single-instance experiment may start anyway with `UNSAFE_ENV` set to exactly
`UNSAFE_VALUE`: a name and a value nobody writes by accident. `serve`, `pull` and the
in-process API then log one ERROR line at start naming what is lost (`loss_line`); `check`
never accepts it, since it says whether the config is fit for Cloud Run, and it is not.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pubsub_filter.core.config.schema import Config

CLOUD_RUN = "cloud-run"
#: what Cloud Run sets in every container it runs: services (as Knative does), and jobs
CLOUD_RUN_ENVS = ("K_SERVICE", "CLOUD_RUN_JOB")
UNSAFE_ENV = "PUBSUB_FILTER_UNSAFE_EMBEDDED_ON_CLOUD_RUN"
UNSAFE_VALUE = "lose-forwards-state-and-records"
#: the backend sections; the in-process API has no publisher (each call's body sends)
PARTS = ("store", "publisher", "records")
#: the Cloud Run-ready example config (Firestore, Pub/Sub, BigQuery), named in every refusal
EXAMPLE = "examples/cloud-run.yaml"


@dataclass(frozen=True)
class Runtime:
    """Where the filter runs (or is checked for), and how that is known."""

    name: str  # "Cloud Run"
    sign: str  # "K_SERVICE is set", "check --for cloud-run"


def detect(environ: Mapping[str, str] = os.environ) -> Runtime | None:
    """Cloud Run when it set its variables, else None (a machine whose files last)."""
    for name in CLOUD_RUN_ENVS:
        if environ.get(name):
            return Runtime("Cloud Run", f"{name} is set")
    return None


def target(name: str) -> Runtime:
    """The runtime `check --for NAME` checks for."""
    if name != CLOUD_RUN:
        raise ValueError(f"unknown target {name!r}: {CLOUD_RUN}")
    return Runtime("Cloud Run", f"check --for {CLOUD_RUN}")


def lost(cfg: Config, runtime: Runtime, parts: Collection[str] = PARTS) -> list[str]:
    """One problem per embedded backend among `parts`, each saying what `runtime` loses and the
    line that fixes it."""
    on = f"on {runtime.name} ({runtime.sign})"
    found = []
    if "store" in parts and cfg.store.backend == "sqlite":
        found.append(
            f"store: backend sqlite keeps the state in a file inside the instance; {on} it is lost with the "
            "instance and each instance has its own, so changes are judged against nothing and leases do not "
            f"exclude each other. Fix: `store: {{backend: firestore}}` (as {EXAMPLE} has it)"
        )
    if "publisher" in parts and cfg.publisher.backend == "outbox":
        found.append(
            f"publisher: backend outbox appends each forward to a file inside the instance; {on} the forwards "
            "never reach Pub/Sub and are lost with the instance, though their messages are acked. "
            f"Fix: `publisher: {{backend: pubsub}}` (as {EXAMPLE} has it)"
        )
    if "records" in parts and cfg.records.backend == "sqlite":
        found.append(
            f"records: backend sqlite writes the decision records to a file inside the instance; {on} each "
            "instance has its own, skip-rate cannot read them, they use the instance's memory and are lost "
            f"with it. Fix: `records: {{backend: bigquery}}` (as {EXAMPLE} has it)"
        )
    return found


def opted_out(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the deliberate experiment's variable is set to its one accepted value."""
    return environ.get(UNSAFE_ENV) == UNSAFE_VALUE


def refusal(
    cfg: Config, runtime: Runtime | None, environ: Mapping[str, str] = os.environ, parts: Collection[str] = PARTS
) -> list[str]:
    """What stops `serve` and `pull` (or the in-process API, `parts` store and records) from
    starting with `cfg` on `runtime`: [] when nothing is lost there, or when the experiment's
    variable says to start anyway (`loss_line` then logs it)."""
    if runtime is None:
        return []
    found = lost(cfg, runtime, parts)
    if not found or opted_out(environ):
        return []
    written = environ.get(UNSAFE_ENV)
    if written:  # set, but not to the value that says the loss is understood
        found.append(f"{UNSAFE_ENV}={written!r} is set, but only {UNSAFE_VALUE!r} starts the embedded backends anyway")
    return found


def loss_line(
    cfg: Config, environ: Mapping[str, str] = os.environ, parts: Collection[str] = PARTS
) -> dict[str, object] | None:
    """The ERROR line's fields when the filter starts with embedded backends on Cloud Run, else
    None. The commands let that happen only with `UNSAFE_ENV`; the API (an engine started from
    code) is told too."""
    runtime = detect(environ)
    if runtime is None:
        return None
    found = lost(cfg, runtime, parts)
    if not found:
        return None
    return {
        "runtime": runtime.name,
        "sign": runtime.sign,
        "lost": found,
        "started_anyway_by": UNSAFE_ENV if opted_out(environ) else None,
    }
