"""`pubsub-filter provision`'s plan, without Pub/Sub: names follow the one Pub/Sub name rule."""

from __future__ import annotations

import pytest
from google.pubsub_v1.types import Subscription

from pubsub_filter.core.config.names import PubsubNameError
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.tools.provision import Failed, ProvisionError, ordering_warning, plan, summary
from pubsub_filter.tools.subscriptions import SubscriptionSpec


def config() -> Config:
    return parse(
        {"routes": [{"name": "orders", "subscription": "orders-sub", "destination": "out", "key": ["payload.id"]}]}
    )


def test_a_source_topic_pubsub_would_refuse_is_refused_before_anything_is_created() -> None:
    with pytest.raises(PubsubNameError, match=r"'ab' is not a topic id"):
        plan(
            config(),
            "p",
            push_endpoint=None,
            max_delivery_attempts=10,
            source_topics={"orders": "ab"},
            existing_topic_of=lambda _: None,
        )


def test_dead_letter_names_follow_the_subscription() -> None:
    wanted = plan(
        config(), "p", push_endpoint=None, max_delivery_attempts=10, source_topics={}, existing_topic_of=lambda _: None
    )
    assert [s.path for s in wanted.subscriptions] == [
        "projects/p/subscriptions/orders-sub-dlq-sub",
        "projects/p/subscriptions/orders-sub",
    ]
    assert ("projects/p/topics/orders", "source of route 'orders'") in wanted.topics


# --- a push route without `subscription`: the name infra/ gives it ----------------------------------


def unnamed() -> Config:
    return parse({"routes": [{"name": "orders", "destination": "out", "key": ["payload.id"]}]})


@pytest.mark.parametrize(("name", "expected"), [({}, "pubsub-filter-orders"), ({"name": "shop"}, "shop-orders")])
def test_a_push_route_without_a_subscription_gets_infras_name_for_it(name: dict[str, str], expected: str) -> None:
    wanted = plan(
        unnamed(),
        "p",
        push_endpoint="https://filter.example.invalid",
        max_delivery_attempts=10,
        source_topics={"orders": "raw-orders"},
        existing_topic_of=lambda _: None,
        **name,
    )
    assert [s.path for s in wanted.subscriptions] == [
        f"projects/p/subscriptions/{expected}-dlq-sub",
        f"projects/p/subscriptions/{expected}",
    ]
    assert wanted.subscriptions[1].push_endpoint == "https://filter.example.invalid/push/orders"


def test_a_pull_route_without_a_subscription_is_refused_since_pull_reads_it_from_the_config() -> None:
    with pytest.raises(ProvisionError, match=r"orders have no `subscription`: a pull subscription is named in the co"):
        plan(
            unnamed(),
            "p",
            push_endpoint=None,
            max_delivery_attempts=10,
            source_topics={"orders": "raw-orders"},
            existing_topic_of=lambda _: None,
        )


# --- an existing subscription without ordering: a WARNING that says why and what to do ------------


def route_subscription() -> SubscriptionSpec:
    wanted = plan(
        config(), "p", push_endpoint=None, max_delivery_attempts=10, source_topics={}, existing_topic_of=lambda _: None
    )
    [spec] = [s for s in wanted.subscriptions if s.route == "orders"]
    return spec


def test_an_existing_subscription_without_ordering_gets_a_warning_naming_it_why_and_what_to_do() -> None:
    spec = route_subscription()
    current = Subscription(name=spec.path, topic=spec.topic, enable_message_ordering=False)
    warning = ordering_warning(spec, current)
    assert warning is not None
    assert warning.startswith("WARNING: subscription projects/p/subscriptions/orders-sub (route 'orders') ")
    assert "cannot turn it on for an existing subscription" in warning  # why updating will not do
    assert "an older version can be forwarded after a newer one" in warning  # why it matters
    assert "create a new subscription with ordering" in warning and "move the push endpoint" in warning


def test_an_ordered_subscription_and_a_dead_letter_subscription_get_no_ordering_warning() -> None:
    spec = route_subscription()
    assert ordering_warning(spec, Subscription(name=spec.path, topic=spec.topic, enable_message_ordering=True)) is None
    dead_letters = SubscriptionSpec(path="projects/p/subscriptions/orders-sub-dlq-sub", topic="projects/p/topics/x")
    assert ordering_warning(dead_letters, Subscription(name=dead_letters.path, topic=dead_letters.topic)) is None


# --- the closing summary: failures counted and named, the exit code, the warnings last ---------------


def test_the_summary_counts_and_names_what_failed_and_exits_1() -> None:
    failed = [Failed("subscription", "projects/p/subscriptions/a", "InvalidArgument: no")]
    out, err, code = summary(3, 1, 0, failed, ["WARNING: w"], dry_run=False)
    assert out == ["3 created, 1 updated"]
    assert err == [
        "1 failed (the others were still provisioned): subscription projects/p/subscriptions/a: InvalidArgument: no",
        "WARNING: w",
    ]
    assert code == 1


def test_the_summary_of_nothing_to_do_claims_no_changes_only_when_nothing_failed() -> None:
    assert summary(0, 0, 0, [], [], dry_run=False) == (
        ["no changes: every resource exists as the config needs it"],
        [],
        0,
    )
    out, _, code = summary(0, 0, 0, [Failed("topic", "projects/p/topics/t", "PermissionDenied: no")], [], False)
    assert (out, code) == ([], 1)


def test_a_warning_alone_does_not_fail_the_run() -> None:
    out, err, code = summary(0, 0, 0, [], ["WARNING: w"], dry_run=True)
    assert (out, err, code) == (["no changes that Pub/Sub can make: see the WARNING below"], ["WARNING: w"], 0)
