"""`pubsub-filter`: serve, pull, replay, provision, check, fingerprint, explain, skip-rate, tune.

Each command is a thin shell over the module that does the work.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pubsub_filter import __version__
from pubsub_filter.core.config.coalesce import held_note
from pubsub_filter.core.config.lines import Located
from pubsub_filter.core.config.schema import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    Config,
    ConfigError,
    Route,
    load,
    load_located,
)
from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.model import Message
from pubsub_filter.runtime import durability, preflight
from pubsub_filter.runtime.operational import BIGQUERY, FIRESTORE, PUBSUB, Backend, describe, require
from pubsub_filter.tools.subscriptions import DEFAULT_NAME

ATTRIBUTE_HELP = "a message attribute (repeatable), for keys and bypass rules that read attributes"
#: exit codes (the "Exit codes" table of docs/cli.md)
OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130


class CommandLineError(FilterError):
    """A bad argument or environment value: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the usage itself is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _config(path: str | None) -> Config:
    return load(path)


def _key_of(problem: str) -> tuple[str, ...]:
    """The key a problem of the config's files or backends names first (`store.path: cannot
    create ...`), as a path to place it by: each of them starts with the key it is about."""
    return tuple(problem.partition(": ")[0].split("."))


def _attribute(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def _backends(cfg: Config) -> list[Backend]:
    """The Google backends a config's store, publisher and records use."""
    used = []
    if cfg.store.backend == "firestore":
        used.append(FIRESTORE)
    if cfg.publisher.backend == "pubsub":
        used.append(PUBSUB)
    if cfg.records.backend == "bigquery":
        used.append(BIGQUERY)
    return used


def _source(args: argparse.Namespace) -> str:
    """The config file a command loaded, as its errors name it."""
    return str(args.config or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def _startable(cfg: Config, source: str) -> None:
    """Raise `ConfigError` unless `serve` or `pull` can start with `cfg` here: its files open, and
    no embedded backend loses what it holds where this runs (Cloud Run: `pubsub_filter.runtime.durability`)."""
    preflight.check(cfg, source)
    refused = durability.refusal(cfg, durability.detect())
    if refused:
        raise ConfigError(source, refused)


def _port(args: argparse.Namespace) -> int:
    port: int
    if args.port is not None:
        port, where = args.port, f"--port {args.port}"
    else:
        text = os.environ.get("PORT", "8080")
        where = f"PORT={text!r}"
        try:
            port = int(text)
        except ValueError:
            raise CommandLineError(f"{where} is not a port number (1-65535)") from None
    if not 0 < port < 65536:
        raise CommandLineError(f"{where} is not a port number (1-65535)")
    return port


Command = Callable[[argparse.Namespace], int]
#: each command's help: the line `--help` lists it with, and what its own `--help` says first. Not its
#: docstring: `python -OO` (PYTHONOPTIMIZE=2) strips those, and the help with them
_HELP: dict[Command, tuple[str, str | None]] = {}


def _says(line: str, more: str | None = None) -> Callable[[Command], Command]:
    def registered(run: Command) -> Command:
        _HELP[run] = (line, more)
        return run

    return registered


@_says("validate a config file; exit 1 with every problem listed")
def cmd_check(args: argparse.Namespace) -> int:
    source = args.file or args.config or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG
    cfg, lines = load_located(source)
    # the files it names, as `serve` will open them from here; and what the runtime it is checked
    # for (--for, else the one this runs on) would lose. The experiment's opt-out is not asked:
    # `check` says whether the config is fit to run there, and with embedded files it is not.
    runtime = durability.target(args.target) if args.target else durability.detect()
    found = preflight.problems(cfg) + (durability.lost(cfg, runtime) if runtime is not None else [])
    if found:
        raise ConfigError(source, [Located(text, lines.of(_key_of(text))) for text in found])
    names = ", ".join(r.name for r in cfg.routes)
    fit = f" for {runtime.name}" if runtime is not None else ""
    print(f"{source}: ok{fit} ({len(cfg.routes)} route{'s' if len(cfg.routes) != 1 else ''}: {names})")
    from pubsub_filter.tools.plan import selection_notes

    for note in selection_notes(cfg, source):  # where the state can be listed cheaply (SQLite)
        print(note)
    for route in cfg.routes:
        if route.coalesce is not None:
            print(f"{source}: note: {held_note(route.name, route.coalesce)}")
    return 0


@_says("run the push endpoint (Cloud Run)")
def cmd_serve(args: argparse.Namespace) -> int:
    from pubsub_filter.push.serve import serve

    port = _port(args)
    cfg = _config(args.config)
    _startable(cfg, _source(args))
    preflight.credentials(_backends(cfg))
    return serve(cfg, args.host, port)


def _route(cfg: Config, name: str) -> Route:
    route = cfg.route(name)
    if route is None:
        raise CommandLineError(f"no route {name!r} in the config (routes: {', '.join(r.name for r in cfg.routes)})")
    return route


def _message(args: argparse.Namespace) -> Message:
    """The payload file, or the data of the push envelope it holds (said on stderr)."""
    from pubsub_filter.tools.payload import read_message

    read = read_message(args.payload, dict(args.attribute))
    if read.note is not None:
        print(f"pubsub-filter {args.command}: {read.note}", file=sys.stderr)
    return read.message


@_says("print the payload fingerprint of a message's data for a route (a file, - for stdin, or a push envelope)")
def cmd_fingerprint(args: argparse.Namespace) -> int:
    from pubsub_filter.core.compare.fingerprint import NOT_JSON, message_fingerprint
    from pubsub_filter.core.compare.routes import RouteRules

    cfg = _config(args.config)
    route = _route(cfg, args.route)
    msg = _message(args)
    rules = RouteRules(route)
    payload, fp = rules.scheme(msg.data)
    print(fp)
    if args.verbose:
        readable = rules.scheme.readable(msg.data) if payload is NOT_JSON else payload
        raw = "" if payload is not NOT_JSON else " (payload is not JSON: raw bytes)"
        if readable is not NOT_JSON:
            raw, payload = (raw and " (raw bytes: a number beyond double range)"), readable
        print(f"scheme: {route.scheme}{raw}")
        try:
            print(f"key: {rules.key_of(payload, msg.attributes)}")
        except ValueError as exc:
            print(f"key: cannot be extracted: {exc}")
        print(f"message fingerprint: {message_fingerprint(msg.data, msg.attributes)}")
    return 0


@_says("what the filter would decide for a payload, and why (no side effects)")
def cmd_explain(args: argparse.Namespace) -> int:
    from pubsub_filter.tools.explain import run

    cfg = _config(args.config)
    route = _route(cfg, args.route)
    msg = _message(args)
    if cfg.store.backend == "firestore":
        from pubsub_filter.backends import extras

        extras.require(extras.FIRESTORE_STORE)  # before the probe: without the client nothing else matters
        require(FIRESTORE)
    return run(cfg, route, msg, args.format)


@_says("decisions and skip rate per route, hour or day")
def cmd_skip_rate(args: argparse.Namespace) -> int:
    from pubsub_filter.tools.skiprate import run

    return run(args)


@_says("which fields churn, and what another selection would have skipped")
def cmd_tune(args: argparse.Namespace) -> int:
    from pubsub_filter.tools.tune import run

    return run(args)


@_says(
    "what a config deploy changes in what each route compares, and how many keys it would forward; writes nothing",
    "Exit 0 when nothing would forward that did not change, 2 when something would, 1 on an error.",
)
def cmd_plan(args: argparse.Namespace) -> int:
    from pubsub_filter.tools.plan import run

    return run(args, args.config or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


# --- pull, replay, provision ---------------------------------------------------------------------


@_says("run the streaming-pull worker (beside a workload) until SIGTERM")
def cmd_pull(args: argparse.Namespace) -> int:
    from pubsub_filter.pull.command import run

    cfg = _config(args.config)
    _startable(cfg, _source(args))
    preflight.credentials([PUBSUB, *(b for b in _backends(cfg) if b is not PUBSUB)])  # it pulls from Pub/Sub
    return run(cfg, args.route, health_port=args.health_port)


@_says(
    "republish what a dead-letter subscription holds (or run it through the filter)",
    "Pull a dead-letter subscription and republish each message to the topic it came from (or --to TOPIC, or "
    "--through-filter). A message is acked only after its republish is confirmed; whatever is not replayed stays "
    "in the dead-letter subscription for a rerun.",
)
def cmd_replay(args: argparse.Namespace) -> int:
    from pubsub_filter.replay.command import run

    def probe(cfg: Config | None) -> None:
        if args.through_filter and cfg is not None and not args.dry_run:  # it acks what its backends took
            preflight.clients(cfg, _source(args))
            refused = durability.refusal(cfg, durability.detect())
            if refused:
                raise ConfigError(_source(args), refused)
        require(PUBSUB, *(_backends(cfg) if args.through_filter and cfg is not None else ()))

    return run(args, probe)


@_says(
    "create the topics and subscriptions the config needs (idempotent)",
    "Create each route's destination topic, source topic, subscription (push or pull, ack deadline = "
    "lease.ack_deadline, retry 10s-600s, dead-letter policy) and dead-letter topic <subscription>-dlq with its "
    "pull subscription <subscription>-dlq-sub. A push route without `subscription` gets NAME-ROUTE, the name "
    "infra/ gives it. A second run changes nothing.",
)
def cmd_provision(args: argparse.Namespace) -> int:
    from pubsub_filter.tools.provision import run

    cfg = _config(args.config)
    if not args.dry_run:
        require(PUBSUB)
    return run(cfg, args)


CONFIG_HELP = f"config file (default: ${CONFIG_ENV}, then ./filter.yaml)"


# Each `_add_*` adds one command to `sub`, what add_subparsers returns (argparse's type for it is private).


def _command(sub: Any, run: Command, config_help: str = CONFIG_HELP) -> argparse.ArgumentParser:
    """The parser of the command `run` answers, with its `--config` and its help (`_says`):
    `cmd_skip_rate` is `skip-rate`."""
    line, more = _HELP[run]
    name = run.__name__.removeprefix("cmd_").replace("_", "-")
    sp: argparse.ArgumentParser = sub.add_parser(name, help=line, description=more)
    sp.add_argument("--config", "-c", metavar="F", help=config_help)
    sp.set_defaults(func=run)
    return sp


def _one_of(sp: argparse.ArgumentParser, option: str, choices: Sequence[str], help: str) -> None:
    """An option that takes one of `choices`, the first by default (`--help` lists them as its value)."""
    sp.add_argument(option, choices=choices, default=choices[0], metavar="|".join(choices), help=help)


def _add_pull(sub: Any) -> None:
    sp = _command(sub, cmd_pull)
    sp.add_argument(
        "--route", "-r", action="append", default=[], metavar="NAME", help="pull only this route (repeatable)"
    )
    sp.add_argument(
        "--health-port",
        type=int,
        default=None,
        metavar="P",
        help="serve /healthz, /readyz and /metrics on this port (default: pull.health_port; off when unset)",
    )


def _add_replay(sub: Any) -> None:
    sp = _command(
        sub,
        cmd_replay,
        config_help=f"config file (default: ${CONFIG_ENV}, then ./filter.yaml when there); "
        "needed by --through-filter and --route",
    )
    sp.add_argument(
        "subscription",
        nargs="?",
        metavar="SUBSCRIPTION",
        help="the dead-letter subscription (id or projects/P/subscriptions/S); "
        "default with --config and --route: <route subscription>-dlq-sub",
    )
    sp.add_argument("--project", metavar="P", help="default: the config's project, then $GOOGLE_CLOUD_PROJECT")
    sp.add_argument("--route", "-r", metavar="NAME", help="the route whose dead letters these are")
    sp.add_argument("--to", metavar="TOPIC", help="republish here instead of to each message's source topic")
    sp.add_argument(
        "--through-filter",
        action="store_true",
        help="decide each message with its route (unchanged → suppressed, older → stale) instead of "
        "republishing it to the source topic",
    )
    sp.add_argument("--dry-run", action="store_true", help="list what would be replayed; ack nothing")
    sp.add_argument("--max", type=int, metavar="N", help="replay at most N messages")
    sp.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="EXPR",
        help="only messages with attributes.NAME=VALUE or payload.a.b=VALUE (also !=); repeatable, all must hold",
    )
    sp.add_argument("--rate", metavar="N/s", help="at most N messages a second (also N/m, N/h)")
    when = "24h, 7d, a date (2026-01-10) or an RFC 3339 time"
    sp.add_argument("--since", metavar="WHEN", help=f"originally published at or after WHEN ({when})")
    sp.add_argument("--until", metavar="WHEN", help=f"originally published before WHEN ({when})")
    sp.add_argument(
        "--wait", type=float, default=5.0, metavar="S", help="how long a pull waits for messages (default 5)"
    )
    sp.add_argument("--verbose", "-v", action="store_true", help="log every replayed message to stderr")


def _add_provision(sub: Any) -> None:
    sp = _command(sub, cmd_provision)
    how = sp.add_mutually_exclusive_group(required=True)
    how.add_argument("--push-endpoint", metavar="BASE_URL", help="push subscriptions to BASE_URL/push/ROUTE")
    how.add_argument("--pull", action="store_true", help="pull subscriptions (for pubsub-filter pull)")
    sp.add_argument("--project", metavar="P", help="default: the config's project, then $GOOGLE_CLOUD_PROJECT")
    sp.add_argument(
        "--name",
        default=DEFAULT_NAME,
        metavar="NAME",
        help=f"infra/'s `name`: a push route without `subscription` gets NAME-ROUTE, as Terraform names it "
        f"(default {DEFAULT_NAME})",
    )
    sp.add_argument(
        "--source-topic",
        action="append",
        default=[],
        metavar="ROUTE=TOPIC",
        help="the topic feeding ROUTE (repeatable). Default: the topic an existing subscription is attached "
        "to, else the subscription id without its -sub suffix or sub- prefix (injuries-sub → injuries)",
    )
    sp.add_argument(
        "--max-delivery-attempts",
        type=int,
        default=None,
        metavar="N",
        help="before dead-lettering (5-100; default ceil(lease.duration / 10s) + 5, the rule infra/ uses)",
    )
    sp.add_argument("--dry-run", action="store_true", help="print what would be created or updated; change nothing")


def _add_serve(sub: Any) -> None:
    sp = _command(sub, cmd_serve)
    sp.add_argument(
        "--host",
        default=os.environ.get("HOST", "0.0.0.0"),
        metavar="H",
        help="address to listen on (default: $HOST, then 0.0.0.0)",
    )
    sp.add_argument("--port", type=int, default=None, metavar="P", help="port to listen on (default: $PORT, then 8080)")


def _add_check(sub: Any) -> None:
    sp = _command(sub, cmd_check)
    sp.add_argument(
        "file", nargs="?", metavar="F", help="the config file (default: --config, $PUBSUB_FILTER_CONFIG, ./filter.yaml)"
    )
    sp.add_argument(
        "--for",
        dest="target",
        choices=[durability.CLOUD_RUN],
        default=None,
        metavar=durability.CLOUD_RUN,
        help="also refuse what cannot be durable there: on cloud-run, the embedded files (SQLite state and "
        "records, the outbox). Default: where this runs (Cloud Run when $K_SERVICE or $CLOUD_RUN_JOB is set)",
    )


def _add_fingerprint(sub: Any) -> None:
    sp = _command(sub, cmd_fingerprint)
    _message_arguments(sp, "the route whose rules apply")
    sp.add_argument("--verbose", "-v", action="store_true", help="also print the key and message fingerprint")


def _message_arguments(sp: Any, route_help: str) -> None:
    """The message a command looks at, as `fingerprint` and `explain` take it: route, attributes, data."""
    sp.add_argument("--route", "-r", required=True, metavar="NAME", help=route_help)
    sp.add_argument(
        "--attribute", "-a", action="append", default=[], type=_attribute, metavar="NAME=VALUE", help=ATTRIBUTE_HELP
    )
    sp.add_argument(
        "payload",
        metavar="PAYLOAD",
        help="the message data: a file, - for stdin, or a Pub/Sub push envelope (its message.data is used)",
    )


def _log_lines(sp: Any) -> None:
    """Where `skip-rate` and `tune` read decisions from, when not from the records backend."""
    sp.add_argument(
        "--log", metavar="FILE|-", help="read decision log lines from FILE (- for stdin) instead of the records backend"
    )


def _add_explain(sub: Any) -> None:
    sp = _command(sub, cmd_explain)
    _message_arguments(sp, "the route whose rules and state apply")
    _one_of(sp, "--format", ["text", "json"], help="text (default) or json")


def _add_skip_rate(sub: Any) -> None:
    sp = _command(sub, cmd_skip_rate)
    sp.add_argument("--since", default="24h", metavar="WHEN", help="how far back (e.g. 1h, 24h, 7d; default 24h)")
    _one_of(sp, "--by", ["route", "hour", "day"], help="one row per route (default), or per route and hour or day")
    _one_of(sp, "--format", ["table", "json", "csv"], help="table (default), json or csv")
    _log_lines(sp)
    sp.add_argument("--watch", type=float, metavar="N", help="refresh every N seconds until Ctrl-C (not with --log -)")
    sp.add_argument(
        "--chart",
        metavar="FILE.png",
        help="also draw the skip rate per route over time to a PNG (by hour unless --by day; needs the chart extra)",
    )


def _add_tune(sub: Any) -> None:
    sp = _command(sub, cmd_tune)
    sp.add_argument("--route", required=True, metavar="R", help="the route to look at")
    sp.add_argument("--since", default="7d", metavar="WHEN", help="how far back (e.g. 24h, 7d; default 7d)")
    sp.add_argument(
        "--exclude", action="append", default=[], metavar="F", help="what if field F were excluded too (repeatable)"
    )
    sp.add_argument(
        "--include", action="append", default=[], metavar="F", help="what if only these fields counted (repeatable)"
    )
    sp.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="F=AMOUNT",
        help="what if number F had this tolerance: a number, or N%% of the last forwarded value (repeatable)",
    )
    sp.add_argument(
        "--coalesce",
        metavar="QUIET/MAX_WAIT",
        help="what if the route coalesced its bursts (e.g. 500ms/2s): the forwards it would have saved",
    )
    _one_of(sp, "--format", ["table", "json"], help="table (default) or json")
    _log_lines(sp)


def _add_plan(sub: Any) -> None:
    sp = _command(sub, cmd_plan, config_help=f"the config to deploy (default: ${CONFIG_ENV}, then ./filter.yaml)")
    sp.add_argument(
        "--from",
        dest="old",
        metavar="OLD",
        help="the config deployed now (default: the selections the state was written under, on the SQLite store)",
    )
    sp.add_argument(
        "--records",
        metavar="FILE",
        help="count keys from this embedded records file (default: the config's records backend)",
    )
    _one_of(sp, "--format", ["table", "json"], help="table (default) or json")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pubsub-filter",
        description="Forward a Pub/Sub message downstream only when its content changed.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order `--help` lists them
    for add in (
        _add_serve,
        _add_check,
        _add_fingerprint,
        _add_explain,
        _add_skip_rate,
        _add_tune,
        _add_plan,
        _add_pull,
        _add_replay,
        _add_provision,
    ):
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = f"pubsub-filter {args.command}"
    try:
        return int(args.func(args))
    except CommandLineError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return USAGE
    except ConfigError as exc:
        said = exc.said()
        if len(said) == 1:  # one problem, one line
            print(said[0], file=sys.stderr)
            return 1
        print(f"{exc.source}: {len(said)} problem{'s' if len(said) != 1 else ''}", file=sys.stderr)
        for problem in said:
            print(f"  {problem}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as exc:
        line = describe(exc)
        if line is None:
            raise  # not foreseeable: a bug, and its traceback is what a report needs
        print(f"{prog}: {line}", file=sys.stderr)
        return FAILED
