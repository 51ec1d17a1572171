"""`pubsub-filter`: serve, check, fingerprint, skip-rate. Each command is a thin shell over a module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .config import CONFIG_ENV, Config, ConfigError, load


def _config(path: str | None) -> Config:
    return load(path)


def cmd_check(args: argparse.Namespace) -> int:
    source = args.file or args.config or os.environ.get(CONFIG_ENV) or "filter.yaml"
    cfg = _config(source)
    names = ", ".join(r.name for r in cfg.routes)
    print(f"{source}: ok ({len(cfg.routes)} routes: {names})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import serve

    return serve(_config(args.config), args.host, args.port or int(os.environ.get("PORT", "8080")))


def cmd_fingerprint(args: argparse.Namespace) -> int:
    from .engine import RouteRules
    from .fingerprint import NOT_JSON, message_fingerprint

    cfg = _config(args.config)
    route = cfg.route(args.route)
    if route is None:
        print(
            f"no route {args.route!r} in the config (routes: {', '.join(r.name for r in cfg.routes)})",
            file=sys.stderr,
        )
        return 2
    data = sys.stdin.buffer.read() if args.payload == "-" else Path(args.payload).read_bytes()
    attributes = dict(a.split("=", 1) for a in args.attribute)
    rules = RouteRules(route)
    payload, fp = rules.scheme(data)
    print(fp)
    if args.verbose:
        print(f"scheme: {route.scheme}{' (payload is not JSON: raw bytes)' if payload is NOT_JSON else ''}")
        try:
            print(f"key: {rules.key_of(payload, attributes)}")
        except ValueError as exc:
            print(f"key: cannot be extracted: {exc}")
        print(f"message fingerprint: {message_fingerprint(data, attributes)}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import run

    attributes = dict(a.split("=", 1) for a in args.attribute)
    return run(_config(args.config), args.route, args.payload, attributes, args.format)


def cmd_skip_rate(args: argparse.Namespace) -> int:
    from .skiprate import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pubsub-filter",
        description="Forward a Pub/Sub message downstream only when its content changed.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", "-c", help=f"config file (default: ${CONFIG_ENV}, then ./filter.yaml)")

    sp = sub.add_parser("serve", help="run the push endpoint (Cloud Run)")
    with_config(sp)
    sp.add_argument("--host", default=os.environ.get("HOST", "0.0.0.0"))
    sp.add_argument("--port", type=int, default=None, help="default: $PORT, then 8080")
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("check", help="validate a config file; exit 1 with every problem listed")
    sp.add_argument("file", nargs="?")
    with_config(sp)
    sp.set_defaults(func=cmd_check)

    sp = sub.add_parser("fingerprint", help="print the payload fingerprint of a JSON file for a route")
    with_config(sp)
    sp.add_argument("--route", "-r", required=True)
    sp.add_argument("--attribute", "-a", action="append", default=[], metavar="NAME=VALUE")
    sp.add_argument("--verbose", "-v", action="store_true", help="also print the key and message fingerprint")
    sp.add_argument("payload", help="the message data (a file, or - for stdin)")
    sp.set_defaults(func=cmd_fingerprint)

    sp = sub.add_parser("explain", help="what the filter would decide for a payload, and why (no side effects)")
    with_config(sp)
    sp.add_argument("--route", "-r", required=True)
    sp.add_argument("--attribute", "-a", action="append", default=[], metavar="NAME=VALUE")
    sp.add_argument("--format", choices=["text", "json"], default="text")
    sp.add_argument("payload", help="the message data (a file, or - for stdin)")
    sp.set_defaults(func=cmd_explain)

    sp = sub.add_parser("skip-rate", help="decisions and skip rate per route, hour or day")
    with_config(sp)
    sp.add_argument("--since", default="24h", help="how far back (e.g. 1h, 24h, 7d; default 24h)")
    sp.add_argument("--by", choices=["route", "hour", "day"], default="route")
    sp.add_argument("--format", choices=["table", "json", "csv"], default="table")
    sp.add_argument("--log", help="read decision log lines from FILE (- for stdin) instead of the records backend")
    sp.add_argument("--watch", type=float, metavar="N", help="refresh every N seconds")
    sp.add_argument("--chart", metavar="FILE.png", help="draw skip rate per route over time to a PNG (by hour)")
    sp.set_defaults(func=cmd_skip_rate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(
            f"{exc.source}: {len(exc.problems)} problem{'s' if len(exc.problems) != 1 else ''}",
            file=sys.stderr,
        )
        for problem in exc.problems:
            print(f"  {exc.source}: {problem}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
