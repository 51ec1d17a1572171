"""`pubsub-filter provision`'s plan, without Pub/Sub: names follow the one Pub/Sub name rule."""

from __future__ import annotations

import pytest

from filter.core.config import Config, parse
from filter.core.pubsub_names import PubsubNameError
from filter.tools.provision import plan


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
