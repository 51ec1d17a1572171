"""`pubsub-filter replay`: options, clients, the run under SIGINT/SIGTERM, the summary, the exit status."""

from __future__ import annotations

import argparse
import asyncio
import enum
import os
import signal
import sys
import time
from collections.abc import Callable

import google.cloud.pubsub_v1 as pubsub_v1
from google.auth.exceptions import DefaultCredentialsError

from pubsub_filter.core.config.names import PubsubNameError
from pubsub_filter.core.config.schema import Config
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.ports import Publisher
from pubsub_filter.google.shared import NO_CREDENTIALS, detect_project
from pubsub_filter.observability.logsetup import configure
from pubsub_filter.replay.deadletter import ReplayFailure
from pubsub_filter.replay.options import ReplayOptionError, ReplayOptions, config_of, options_from
from pubsub_filter.replay.progress import summary
from pubsub_filter.replay.replayer import Replayer

PROG = "pubsub-filter replay"


class Exit(enum.IntEnum):
    DONE = 0  # everything selected was replayed (or listed)
    INCOMPLETE = 1  # some failed or were not acked, no credentials, or the pulls failed
    USAGE = 2  # a bad option, or no dead-letter subscription to read
    INTERRUPTED = 130  # SIGINT/SIGTERM: what was confirmed is acked, the rest released


def outcome(replayer: Replayer) -> Exit:
    if replayer.interrupted:
        return Exit.INTERRUPTED
    counts = replayer.counts
    return Exit.INCOMPLETE if counts.failed or counts.ack_failed or replayer.error else Exit.DONE


def run(args: argparse.Namespace, probe: Callable[[Config | None], None] = lambda cfg: None) -> int:
    """Parse the options, replay, print the summary; the exit status is an `Exit`.

    `probe` checks that the backends the run will use answer, once the options are known good.
    """
    try:
        cfg = config_of(args)
        opts = options_from(args, cfg)
    except (ReplayOptionError, PubsubNameError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return Exit.USAGE
    # logging is set up for a run, not for a usage error (and never by a command that stops there)
    configure(
        level=os.environ.get("LOG_LEVEL") or ("info" if args.verbose else "warning"),
        stream=sys.stderr,
        find_project=detect_project,
    )
    probe(cfg)
    try:
        subscriber = pubsub_v1.SubscriberClient()
        publisher, engine = _workers(opts, cfg)
    except DefaultCredentialsError as exc:
        print(f"{PROG}: {NO_CREDENTIALS} ({exc})", file=sys.stderr)
        return Exit.INCOMPLETE
    replayer = Replayer(opts, subscriber, publisher=publisher, engine=engine, config=cfg)
    started = time.monotonic()
    try:
        asyncio.run(_until_stopped(replayer, publisher, engine))
    except ReplayFailure as exc:  # the dead-letter subscription itself cannot be read
        print(f"{PROG}: {exc}", file=sys.stderr)
        return Exit.USAGE
    finally:
        subscriber.close()
    print(summary(replayer.counts, opts, time.monotonic() - started, replayer.interrupted, replayer.error))
    return outcome(replayer)


def _workers(opts: ReplayOptions, cfg: Config | None) -> tuple[Publisher | None, Engine | None]:
    """(publisher, engine): the one that does the run's work; neither for a dry run."""
    if opts.dry_run:
        return None, None
    if opts.through_filter:
        from pubsub_filter.runtime.wiring import make_engine, make_telemetry

        assert cfg is not None  # options_from refuses --through-filter without --config
        return None, make_engine(cfg, make_telemetry(cfg))
    from pubsub_filter.backends.publishers.pubsub import PubsubPublisher

    timeout = cfg.publisher.timeout if cfg is not None and cfg.publisher.backend == "pubsub" else 30.0
    return PubsubPublisher(project=opts.project, timeout=timeout), None


async def _until_stopped(replayer: Replayer, publisher: Publisher | None, engine: Engine | None) -> None:
    """The run; the first signal stops taking new messages, the second cancels what is under way."""
    loop = asyncio.get_running_loop()
    work = asyncio.create_task(replayer.run())

    def on_signal() -> None:
        replayer.interrupted = True
        if replayer.stopping.is_set():
            work.cancel()
        replayer.stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        await work
    except asyncio.CancelledError:
        replayer.interrupted = True
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if publisher is not None:
            await publisher.close()
        if engine is not None:
            await engine.close()  # replay's metrics and spans leave over OTLP, before exit
