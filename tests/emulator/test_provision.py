"""`pubsub-filter provision` against the Pub/Sub emulator: creates what the config needs,
reports one line per resource, and changes nothing on a second run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.api_core import exceptions as gexc

from pubsub_filter.cli import main
from tests.support.emulators import PubsubEmulator
from tests.support.pubsub_helpers import PubsubAdmin, unique
from tests.support.serve import write_config

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

BASE = "http://127.0.0.1:9"  # nothing listens there; nothing is published, so nothing is pushed


class Names:
    def __init__(self) -> None:
        stem = unique("orders")
        self.orders_sub = f"{stem}-sub"  # → source topic `stem` (the -sub rule)
        self.orders_topic = stem
        self.odds_sub = unique("odds-feed")  # no affix: needs --source-topic
        self.odds_topic = unique("raw-odds")
        self.dest = unique("phase3")

    def subscriptions(self) -> list[str]:
        return [self.orders_sub, self.odds_sub, f"{self.orders_sub}-dlq-sub", f"{self.odds_sub}-dlq-sub"]

    def topics(self) -> list[str]:
        return [self.orders_topic, self.odds_topic, self.dest, f"{self.orders_sub}-dlq", f"{self.odds_sub}-dlq"]


@pytest.fixture
def admin(pubsub_emulator: PubsubEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[PubsubAdmin]:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", pubsub_emulator.project)
    a = PubsubAdmin(pubsub_emulator)
    yield a
    a.cleanup()


@pytest.fixture
def names(admin: PubsubAdmin) -> Iterator[Names]:
    n = Names()
    yield n
    for sub in n.subscriptions():  # push subscriptions first: the emulator retries a dead endpoint forever
        admin.delete_subscription(sub)
    for topic in n.topics():
        with contextlib.suppress(gexc.NotFound):
            admin.publisher.delete_topic(topic=admin.topic_path(topic))


def config(tmp_path: Path, n: Names, project: str, **top: Any) -> Path:
    cfg = {
        "project": project,
        "lease": {"duration": "120s", "ack_deadline": "30s", "heartbeat": "10s"},
        "routes": [
            {"name": "orders", "subscription": n.orders_sub, "destination": n.dest, "key": ["payload.id"]},
            {"name": "odds", "subscription": n.odds_sub, "destination": n.dest, "key": ["payload.line"]},
        ],
        **top,
    }
    return write_config(tmp_path / "filter.yaml", cfg)


def provision(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    code = main(["provision", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def statuses(lines: list[str]) -> dict[str, str]:
    """resource path → status word(s), from the one-line-per-resource report."""
    out = {}
    for line in lines:
        parts = line.split()
        for i, p in enumerate(parts):
            if p.startswith("projects/"):
                out[p] = " ".join(parts[: i - 1])
                break
    return out


def test_provision_creates_then_changes_nothing(
    admin: PubsubAdmin, names: Names, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(config(tmp_path, names, admin.project))
    odds = f"--source-topic=odds={names.odds_topic}"
    sub = admin.subscription_path

    # Dry run first: says what it would create, creates nothing.
    code, lines, _ = provision(capsys, "--config", cfg, "--push-endpoint", BASE, odds, "--dry-run")
    assert code == 0, lines
    assert set(statuses(lines).values()) == {"would create"}
    assert len(statuses(lines)) == 9  # 5 topics (the destination once), 4 subscriptions
    assert lines[-1] == "9 to create, 0 to update (dry run: nothing changed)"
    with pytest.raises(gexc.NotFound):
        admin.subscriber.get_subscription(subscription=sub(names.orders_sub))

    code, lines, _ = provision(capsys, "--config", cfg, "--push-endpoint", BASE, odds)
    assert code == 0, lines
    assert set(statuses(lines).values()) == {"created"}, lines
    assert lines[-1] == "9 created, 0 updated"
    assert not any(line.startswith("reminder:") for line in lines)  # no IAM reminder on the emulator

    code, lines, _ = provision(capsys, "--config", cfg, "--push-endpoint", BASE, odds)
    assert code == 0, lines
    assert set(statuses(lines).values()) == {"exists"}, lines
    assert len(statuses(lines)) == 9
    assert lines[-1] == "no changes: every resource exists as the config needs it"

    for route, sub_id, topic in (
        ("orders", names.orders_sub, names.orders_topic),
        ("odds", names.odds_sub, names.odds_topic),
    ):
        s = admin.subscriber.get_subscription(subscription=sub(sub_id))
        assert s.topic == admin.topic_path(topic)
        assert s.push_config.push_endpoint == f"{BASE}/push/{route}"
        assert s.ack_deadline_seconds == 30  # lease.ack_deadline
        assert s.dead_letter_policy.dead_letter_topic == admin.topic_path(f"{sub_id}-dlq")
        assert s.dead_letter_policy.max_delivery_attempts == 17  # ceil(120s lease / 10s backoff) + 5
        assert s.enable_message_ordering  # README, "Ordering"
        assert s.retry_policy.minimum_backoff.total_seconds() == 10
        assert s.retry_policy.maximum_backoff.total_seconds() == 600
        dlq = admin.subscriber.get_subscription(subscription=sub(f"{sub_id}-dlq-sub"))
        assert dlq.topic == admin.topic_path(f"{sub_id}-dlq")
        assert not dlq.push_config.push_endpoint
    admin.publisher.get_topic(topic=admin.topic_path(names.dest))

    # The second run found the source topic from the existing subscription: no --source-topic needed.
    code, lines, _ = provision(capsys, "--config", cfg, "--pull", "--max-delivery-attempts", "7")
    assert code == 0, lines
    changed = {k: v for k, v in statuses(lines).items() if v != "exists"}
    assert changed == {sub(names.orders_sub): "updated", sub(names.odds_sub): "updated"}, lines
    [orders_line] = [line for line in lines if sub(names.orders_sub) + " " in line]
    assert f"push → {BASE}/push/orders → pull" in orders_line
    assert "after 17 → " in orders_line and "after 7" in orders_line
    s = admin.subscriber.get_subscription(subscription=sub(names.orders_sub))
    assert (s.push_config.push_endpoint, s.dead_letter_policy.max_delivery_attempts) == ("", 7)
    code, lines, _ = provision(capsys, "--config", cfg, "--pull", "--max-delivery-attempts", "7")
    assert (code, lines[-1]) == (0, "no changes: every resource exists as the config needs it")


def test_provision_says_what_it_cannot_do(
    admin: PubsubAdmin, names: Names, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(config(tmp_path, names, admin.project))
    # No -sub/sub- affix and no --source-topic: the source topic is unknown.
    code, lines, err = provision(capsys, "--config", cfg, "--pull")
    assert code == 2
    assert f"subscription id {names.odds_sub!r}" in err and "--source-topic odds=TOPIC" in err
    assert not lines  # nothing was touched
    code, _, err = provision(capsys, "--config", cfg, "--pull", "--source-topic", "nope=x")
    assert code == 2 and "unknown route(s): nope" in err
    code, _, err = provision(
        capsys, "--config", cfg, "--pull", f"--source-topic=odds={names.odds_topic}", "--max-delivery-attempts", "3"
    )
    assert code == 2 and "between 5 and 100" in err
    # A subscription attached to another topic is reported, never replaced.
    other = admin.topic("other")
    admin.subscriber.create_subscription(name=admin.subscription_path(names.orders_sub), topic=admin.topic_path(other))
    code, lines, err = provision(capsys, "--config", cfg, "--pull", f"--source-topic=orders={names.orders_topic}",
                                 f"--source-topic=odds={names.odds_topic}")  # fmt: skip
    assert code == 1
    [conflict] = [line for line in lines if line.startswith("CONFLICT")]
    assert admin.topic_path(other) in conflict and "cannot change" in conflict
    assert admin.subscriber.get_subscription(subscription=admin.subscription_path(names.orders_sub)).topic == (
        admin.topic_path(other)
    )


def test_provision_goes_on_past_a_failure_and_warns_of_a_subscription_without_ordering(
    admin: PubsubAdmin, names: Names, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(config(tmp_path, names, admin.project))
    # made by hand: unordered (it cannot be changed now) and expiring (the emulator refuses that update)
    admin.publisher.create_topic(name=admin.topic_path(names.orders_topic))
    admin.subscriber.create_subscription(
        request={
            "name": admin.subscription_path(names.orders_sub),
            "topic": admin.topic_path(names.orders_topic),
            "expiration_policy": {"ttl": {"seconds": 2 * 86400}},
        }
    )
    code, lines, err = provision(capsys, "--config", cfg, "--pull", f"--source-topic=odds={names.odds_topic}")
    orders = admin.subscription_path(names.orders_sub)
    assert code == 1
    [failed] = [line for line in lines if line.startswith("FAILED")]
    assert orders in failed and "InvalidArgument" in failed  # the emulator cannot update an expiration policy
    # every resource after the failure was still provisioned, and the summary says what failed
    for sub_id in (names.odds_sub, f"{names.odds_sub}-dlq-sub"):
        assert admin.subscriber.get_subscription(subscription=admin.subscription_path(sub_id))
    assert lines[-1] == "7 created, 0 updated"  # all but the source topic and subscription made by hand
    summary, warning = err.splitlines()
    assert summary.startswith(f"1 failed (the others were still provisioned): subscription {orders}: InvalidArgument")
    assert warning.startswith(f"WARNING: subscription {orders} (route 'orders') has message ordering off")
    assert "create a new subscription with ordering" in warning


def test_provision_creates_and_updates_subscriptions_with_payload_unwrapping(
    admin: PubsubAdmin, names: Names, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A route's `push_format` is its subscription's: no_wrapper with or without write metadata."""

    def write(orders: str, odds: str) -> str:
        path = config(tmp_path, names, admin.project)
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        raw["routes"][0]["push_format"], raw["routes"][1]["push_format"] = orders, odds
        return str(write_config(path, raw))

    def unwrapping(sub_id: str) -> tuple[bool, bool]:
        push = admin.subscriber.get_subscription(subscription=admin.subscription_path(sub_id)).push_config
        return "no_wrapper" in push, bool(push.no_wrapper.write_metadata)

    cfg = write("unwrapped", "unwrapped_no_metadata")
    args = ["--config", cfg, "--push-endpoint", BASE, f"--source-topic=odds={names.odds_topic}"]
    code, lines, _ = provision(capsys, *args)
    assert (code, lines[-1]) == (0, "9 created, 0 updated"), lines
    assert (unwrapping(names.orders_sub), unwrapping(names.odds_sub)) == ((True, True), (True, False))
    [orders_line] = [line for line in lines if admin.subscription_path(names.orders_sub) + " " in line]
    assert "payload unwrapped, metadata in headers" in orders_line
    code, lines, _ = provision(capsys, *args)
    assert (code, lines[-1]) == (0, "no changes: every resource exists as the config needs it"), lines

    write("wrapped", "unwrapped")
    code, lines, _ = provision(capsys, *args)
    assert (code, lines[-1]) == (0, "0 created, 2 updated"), lines
    [orders_line] = [line for line in lines if admin.subscription_path(names.orders_sub) + " " in line]
    assert "payload unwrapped, metadata in headers → push envelope" in orders_line
    assert (unwrapping(names.orders_sub), unwrapping(names.odds_sub)) == ((False, False), (True, True))
    code, lines, _ = provision(capsys, *args)
    assert (code, lines[-1]) == (0, "no changes: every resource exists as the config needs it"), lines
