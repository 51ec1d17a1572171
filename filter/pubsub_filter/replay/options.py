"""`pubsub-filter replay`'s options: the command line checked into one typed `ReplayOptions`.

Every bad value is a `ReplayOptionError` naming its option (exit 2) before anything is pulled.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from dataclasses import dataclass, field

from pubsub_filter.core import times
from pubsub_filter.core.compare.conditions import parse_where
from pubsub_filter.core.config.schema import CONFIG_ENV, DEFAULT_CONFIG, Config, ConfigError, Route, load
from pubsub_filter.core.errors import FilterError
from pubsub_filter.google.shared import pubsub_path, resolve_project
from pubsub_filter.replay.selection import Selection, Where

#: Messages per Pull request.
BATCH = 100


class ReplayOptionError(FilterError, ValueError):
    """A bad option value: reported with the option's name, exit 2."""


@dataclass
class ReplayOptions:
    subscription: str  # full path of the dead-letter subscription
    project: str
    to: str | None = None  # full topic path
    dry_run: bool = False
    max: int | None = None
    selection: Selection = field(default_factory=Selection)
    rate: float | None = None
    wait: float = 5.0
    batch: int = BATCH
    through_filter: bool = False
    route: str | None = None


def parse_instant(text: str, now: float, option: str) -> float:
    """`--since`/`--until` → epoch seconds (the grammar of `pubsub_filter.core.times.parse_instant`)."""
    try:
        return times.parse_instant(text, now)
    except ValueError as exc:
        raise ReplayOptionError(f"{option} {exc}") from None


def parse_rate(text: str) -> float:
    """`50/s`, `300/m`, `10000/h` or a plain number (per second) → messages per second."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|m|min|h))?\s*$", text)
    if not m or float(m.group(1)) <= 0:
        raise ReplayOptionError(f"--rate {text!r}: write messages per second, e.g. 50/s (or 300/m, 10000/h)")
    per = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    return float(m.group(1)) / per


def parse_where_option(text: str) -> Where:
    try:
        return Where(text, parse_where(text))
    except ValueError as exc:
        raise ReplayOptionError(f"--where {text!r}: {exc}") from None


def config_of(args: argparse.Namespace) -> Config | None:
    """The config as every command finds it (--config, $PUBSUB_FILTER_CONFIG, ./filter.yaml), if any.

    Replaying a named subscription needs no config, so a missing ./filter.yaml is no error;
    `--route` and `--through-filter` need one and say where it was looked for.
    """
    if args.config or os.environ.get(CONFIG_ENV) or os.path.exists(DEFAULT_CONFIG):
        return load(args.config)
    for option, given in (("--route", args.route), ("--through-filter", args.through_filter)):
        if given:
            raise ReplayOptionError(
                f"{option} needs a config: --config, ${CONFIG_ENV} or ./{DEFAULT_CONFIG} (none of them is there)"
            )
    return None


def _project(given: str | None) -> str:
    try:
        return resolve_project(given)
    except ConfigError:  # its words are the publisher's; replay's fix is an option
        why = (
            "PUBSUB_EMULATOR_HOST is set, so no credentials name one"
            if os.environ.get("PUBSUB_EMULATOR_HOST")
            else "no default credentials name one"
        )
        raise ReplayOptionError(
            f"no project for the dead-letter subscription ({why}): pass --project, set GOOGLE_CLOUD_PROJECT, "
            "or set `project:` in the config"
        ) from None


def options_from(args: argparse.Namespace, cfg: Config | None) -> ReplayOptions:
    """The parsed command line (and `--config`, when given) → the run's options.

    ReplayOptionError for a bad option; PubsubNameError (also a usage error) for a name Pub/Sub would refuse.
    """
    project = _project(args.project or (cfg.project if cfg is not None else None))
    route = _route(args, cfg)
    subscription = args.subscription
    if not subscription:
        if route is None or not route.subscription:
            raise ReplayOptionError(
                "name the dead-letter subscription, or give --config and --route of a route with a subscription "
                "(its dead-letter subscription is <subscription>-dlq-sub, as `pubsub-filter provision` creates it)"
            )
        subscription = f"{route.subscription}-dlq-sub"
    if args.through_filter:
        if cfg is None:
            raise ReplayOptionError("--through-filter needs a config: the routes and backends the decisions use")
        if args.to:
            raise ReplayOptionError("--to and --through-filter exclude each other")
    if args.max is not None and args.max < 1:
        raise ReplayOptionError("--max must be at least 1")
    if args.wait <= 0:
        raise ReplayOptionError("--wait must be positive")
    now = time.time()
    return ReplayOptions(
        subscription=pubsub_path(subscription, "subscription", project),
        project=project,
        to=pubsub_path(args.to, "topic", project) if args.to else None,
        dry_run=args.dry_run,
        max=args.max,
        selection=Selection(
            where=tuple(parse_where_option(w) for w in args.where),
            since=parse_instant(args.since, now, "--since") if args.since else None,
            until=parse_instant(args.until, now, "--until") if args.until else None,
        ),
        rate=parse_rate(args.rate) if args.rate else None,
        wait=args.wait,
        through_filter=args.through_filter,
        route=route.name if route is not None else None,
    )


def _route(args: argparse.Namespace, cfg: Config | None) -> Route | None:
    if not args.route:
        return None
    if cfg is None:
        raise ReplayOptionError("--route needs a config: the route's subscription and rules")
    route = cfg.route(args.route)
    if route is None:
        raise ReplayOptionError(f"--route: no route {args.route!r} in the config")
    return route
