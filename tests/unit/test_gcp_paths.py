"""`pubsub_filter.google.shared.pubsub_path`: the one way an id or a full path becomes a Pub/Sub resource path."""

from __future__ import annotations

import pytest

from pubsub_filter.core.config.schema import ConfigError, parse
from pubsub_filter.google.shared import pubsub_path


def test_an_id_becomes_a_path_in_the_project() -> None:
    assert pubsub_path("injuries-sub", "subscription", "proj-1") == "projects/proj-1/subscriptions/injuries-sub"
    assert pubsub_path("phase3", "topic", "proj-1") == "projects/proj-1/topics/phase3"


def test_a_full_path_is_kept_whatever_the_project() -> None:
    assert pubsub_path("projects/other/topics/phase3", "topic", "proj-1") == "projects/other/topics/phase3"


def test_a_path_of_the_other_kind_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"'projects/p/topics/t' is not a subscription id .* projects/PROJECT/subscriptions/ID"
    ):
        pubsub_path("projects/p/topics/t", "subscription", "p")


@pytest.mark.parametrize(
    "name",
    [
        "topics/x",  # a slash, but not a full path
        "projects/p/topics/t/extra",  # a path with a tail
        "projects/P/topics/t",  # a project id with capitals
        "ab",  # shorter than 3
        "1abc",  # not starting with a letter
        "google-things",  # starting with goog
        "a b c",  # a space
        "x" * 256,  # longer than 255
    ],
)
def test_a_malformed_name_is_refused_with_the_rule(name: str) -> None:
    with pytest.raises(ValueError, match=r"is not a topic id \(3-255 characters"):
        pubsub_path(name, "topic", "p")


def test_a_project_id_pubsub_would_refuse_is_named() -> None:
    with pytest.raises(ValueError, match="'My Project' is not a project id"):
        pubsub_path("phase3", "topic", "My Project")


def test_the_config_refuses_what_the_path_function_refuses_in_the_same_words() -> None:
    base = {"routes": [{"name": "r", "destination": "topics/x", "key": ["payload.id"]}]}
    with pytest.raises(ValueError) as by_path:
        pubsub_path("topics/x", "topic", "p")
    with pytest.raises(ConfigError) as by_config:
        parse(base)
    assert str(by_path.value) in str(by_config.value)
