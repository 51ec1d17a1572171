"""The optional extras the Google backends' clients come from, and the one line when one is missing.

`pip install pubsub-filter` brings the Pub/Sub client (the sidecar's own) and the embedded
backends; Firestore state and BigQuery records each need their client, an extra of its own
(`pubsub-filter[firestore]`, `pubsub-filter[bigquery]`, both as `pubsub-filter[gcp]`), so an
install that uses neither does not pay for them. Whoever picks such a backend without its
extra is told so when the config is checked or a command starts (`missing`, `require`), in
one line naming the install: never an ImportError at the first message.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pubsub_filter.core.config.schema import Config
from pubsub_filter.core.ports import Failure

#: both Google backends' clients: what the image and the Cloud Run docs install
GCP = "gcp"


@dataclass(frozen=True)
class Extra:
    name: str  # pubsub-filter[<name>]
    client: str  # the distribution it brings
    module: str  # what the backend imports from it

    @property
    def install(self) -> str:
        return install((self,))


FIRESTORE = Extra("firestore", "google-cloud-firestore", "google.cloud.firestore")
BIGQUERY = Extra("bigquery", "google-cloud-bigquery", "google.cloud.bigquery")

#: a config's choice of a Google backend, as its errors say it (`key value`), and the extra it needs
Choice = tuple[str, Extra]
FIRESTORE_STORE: Choice = ("store.backend firestore", FIRESTORE)
BIGQUERY_RECORDS: Choice = ("records.backend bigquery", BIGQUERY)


def install(extras: Sequence[Extra]) -> str:
    """The command that brings `extras`: one extra by its name, both by `gcp`."""
    name = extras[0].name if len(extras) == 1 else GCP
    return f"pip install 'pubsub-filter[{name}]'"


def importable(module: str) -> bool:
    """Whether `module` can be imported here, without importing it (a client costs ~0.5 s)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def needed(cfg: Config) -> list[Choice]:
    """The Google backends `cfg` picks that come with an extra."""
    found = []
    if cfg.store.backend == "firestore":
        found.append(FIRESTORE_STORE)
    if cfg.records.backend == "bigquery":
        found.append(BIGQUERY_RECORDS)
    return found


def missing_line(choices: Sequence[Choice]) -> str:
    """One line for backends chosen without their extras, naming the one install that brings them all."""
    wanted = [extra for _, extra in choices]
    clients = " and ".join(extra.client for extra in wanted)
    if len(choices) == 1:
        return f"{choices[0][0]} needs the {clients} client, which is not installed: {install(wanted)}"
    said = " and ".join(choice for choice, _ in choices)
    return f"{said} need the {clients} clients, which are not installed: {install(wanted)}"


def missing(cfg: Config, found: Callable[[str], bool] = importable) -> list[str]:
    """The config's problem, as one line, when a backend it picks lacks its client (`found` says
    whether a module can be imported); nothing when every one is there."""
    lacking = [(choice, extra) for choice, extra in needed(cfg) if not found(extra.module)]
    return [missing_line(lacking)] if lacking else []


def require(choice: Choice, found: Callable[[str], bool] = importable) -> None:
    """Raise `Failure` (one line) unless the client of the backend `choice` picks is installed;
    called where that backend is built, so no path reaches the client's ImportError."""
    if not found(choice[1].module):
        raise Failure(missing_line([choice]))


def import_error(extra: Extra, cause: ImportError) -> ImportError:
    """What a backend module raises when imported without its extra (the library's users import
    `FirestoreFences` themselves): the ImportError, worded with the install that fixes it."""
    return ImportError(
        f"{cause} (the {extra.client} client, not installed: {extra.install})", name=cause.name, path=cause.path
    )
