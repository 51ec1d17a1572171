"""`pubsub-filter replay`'s options, selection and exit status, without Pub/Sub."""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest

from pubsub_filter.core.config.names import PubsubNameError
from pubsub_filter.replay.command import Exit, outcome
from pubsub_filter.replay.deadletter import DL_PROJECT, DL_SUBSCRIPTION, DeadLetter, ReplayFailure
from pubsub_filter.replay.options import ReplayOptionError, ReplayOptions, options_from, parse_where_option
from pubsub_filter.replay.replayer import Replayer
from pubsub_filter.replay.selection import Selection


def args(*subscription: str, **given: Any) -> argparse.Namespace:
    defaults: dict[str, Any] = {
        "subscription": subscription[0] if subscription else None,
        "project": "p",
        "route": None,
        "to": None,
        "through_filter": False,
        "dry_run": False,
        "max": None,
        "where": [],
        "since": None,
        "until": None,
        "rate": None,
        "wait": 5.0,
    }
    return argparse.Namespace(**{**defaults, **given})


def dead_letter(data: bytes = b"{}", **attributes: str) -> DeadLetter:
    return DeadLetter("ack", "1", data, dict(attributes), "", 0.0, "1970-01-01T00:00:00Z")


# --- options -------------------------------------------------------------------------------


def test_ids_become_paths_in_the_project() -> None:
    opts = options_from(args("orders-dlq-sub", to="orders"), None)
    assert (opts.subscription, opts.to) == ("projects/p/subscriptions/orders-dlq-sub", "projects/p/topics/orders")


def test_a_topic_path_given_as_the_subscription_is_a_usage_error() -> None:
    with pytest.raises(PubsubNameError, match="is not a subscription id"):
        options_from(args("projects/p/topics/orders"), None)


def test_a_malformed_to_is_a_usage_error_with_the_rule() -> None:
    with pytest.raises(PubsubNameError, match=r"'ab' is not a topic id \(3-255 characters"):
        options_from(args("orders-dlq-sub", to="ab"), None)


def test_a_malformed_where_names_the_option() -> None:
    with pytest.raises(ReplayOptionError, match=r"--where 'payload\.n': write attributes\.NAME=VALUE"):
        parse_where_option("payload.n")


def test_through_filter_needs_a_config() -> None:
    with pytest.raises(ReplayOptionError, match="--through-filter needs a config"):
        options_from(args("orders-dlq-sub", through_filter=True), None)


# --- selection -------------------------------------------------------------------------------


def test_a_payload_nested_past_the_decoder_is_raw_bytes_to_where() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    where = Selection(where=(parse_where_option("payload.x=1"),))
    assert where.excluded(dead_letter(deep)) == "--where payload.x=1"
    assert Selection(where=(parse_where_option("payload.x!=1"),)).excluded(dead_letter(deep)) is None


def test_where_on_an_attribute_matches_its_text_as_a_number() -> None:
    where = Selection(where=(parse_where_option("attributes.n=2"),))
    assert where.excluded(dead_letter(n="2.0")) is None


def test_a_forged_source_subscription_fails_only_its_own_message() -> None:
    forged = dead_letter(**{DL_SUBSCRIPTION: "x/../../y", DL_PROJECT: "p"})
    with pytest.raises(ReplayFailure, match=DL_SUBSCRIPTION):
        forged.source_subscription()


# --- the exit status ---------------------------------------------------------------------------


def replayer() -> Replayer:
    opts = ReplayOptions(subscription="projects/p/subscriptions/s", project="p")
    return Replayer(opts, subscriber=None, out=io.StringIO(), err=io.StringIO())


def test_a_run_that_replayed_everything_exits_0() -> None:
    assert outcome(replayer()) is Exit.DONE


def test_a_run_with_a_failure_or_a_failed_ack_exits_1() -> None:
    failed, unacked = replayer(), replayer()
    failed.counts.failed = 1
    unacked.counts.ack_failed = 1
    assert outcome(failed) is outcome(unacked) is Exit.INCOMPLETE


def test_an_interrupted_run_exits_130_whatever_else_happened() -> None:
    r = replayer()
    r.counts.failed = 1
    r.interrupted = True
    assert outcome(r) is Exit.INTERRUPTED
