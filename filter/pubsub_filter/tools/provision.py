"""`pubsub-filter provision`: create the Pub/Sub resources a config needs, idempotently.

For every route:

- the **destination** topic (`destination`);
- the **source** topic that feeds it: `--source-topic ROUTE=TOPIC`; else, when the
  subscription already exists, the topic it is attached to; else the subscription id with
  a trailing `-sub` or a leading `sub-` removed (`injuries-sub` → `injuries`). Any other
  subscription id needs `--source-topic`;
- the **subscription**: the route's `subscription`, else (push only) `<NAME>-<route>` as infra/
  names it (`--name NAME`, infra/'s `name`, default `pubsub-filter`); a pull subscription must
  be named in the config, where `pubsub-filter pull` reads it. Push to `BASE_URL/push/ROUTE`
  (`--push-endpoint BASE_URL`, with
  the config's `auth.service_account`/`auth.audience` as its OIDC token when set) or pull
  (`--pull`), ack deadline `lease.ack_deadline`, retry policy 10 s to 600 s, a dead-letter
  policy after `--max-delivery-attempts` (default: ceil(lease.duration / 10 s) + 5, as infra/
  sizes it), message ordering on (docs/decisions.md, "Ordering"), never expiring;
- the **dead-letter topic** `<subscription id>-dlq` and its pull subscription
  `<subscription id>-dlq-sub` (ack deadline 60 s, 7 days' retention, never expiring),
  so what is dead-lettered waits for `pubsub-filter replay`.

Each resource is read first and only created or updated when it is missing or differs:
one line per resource says `created`, `exists` or `updated` (with what changed), and a
second run says `no changes`. `--dry-run` says what it would do and changes nothing. A
subscription attached to another topic than the one wanted is reported, never deleted
(a subscription's topic cannot change), and the command exits 1. A resource Pub/Sub
refuses to create or update is reported `FAILED` and the rest are still provisioned; the
summary counts the failures and the command exits 1.

A route's existing subscription without message ordering gets a WARNING: Pub/Sub cannot
turn ordering on for an existing subscription, and which version of a key ends up last
downstream depends on it (docs/decisions.md, "Ordering"); the way out is a new subscription.

On the real service (not `PUBSUB_EMULATOR_HOST`), dead-lettering also needs IAM for the
Pub/Sub service agent; that is printed as a reminder, and infra/ grants it in production.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pubsub_filter.core.config.names import PubsubNameError
from pubsub_filter.core.config.schema import Config
from pubsub_filter.core.errors import FilterError
from pubsub_filter.google.shared import NO_CREDENTIALS, pubsub_path, resolve_project
from pubsub_filter.tools.subscriptions import (
    DEFAULT_NAME,
    DLQ_ACK_DEADLINE_S,
    DLQ_RETENTION_S,
    MIN_BACKOFF_S,
    SubscriptionSpec,
    push_subscription_id,
    short_id,
)

#: Spare deliveries on top of what lease contention alone can use up (the same rule as infra/).
ATTEMPTS_MARGIN = 5


def delivery_attempts_for(cfg: Config) -> int:
    """Enough attempts that a message only waiting out another version's lease is never dead-lettered.

    A `contended` 503 lasts at most one lease and comes back no sooner than the minimum
    backoff apart: ceil(lease.duration / minimum_backoff) + margin, within Pub/Sub's 5..100.
    """
    return min(100, max(5, math.ceil(cfg.lease.duration / MIN_BACKOFF_S) + ATTEMPTS_MARGIN))


class ProvisionError(FilterError):
    """The config or the options cannot be provisioned as asked (exit 2)."""


# --- what the config needs ---------------------------------------------------------------------


@dataclass
class Plan:
    project: str
    topics: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    subscriptions: list[SubscriptionSpec] = field(default_factory=list)


def derive_source_topic(subscription_id: str) -> str | None:
    """`injuries-sub` → `injuries`, `sub-injuries` → `injuries`; None when neither affix is there."""
    if subscription_id.endswith("-sub") and len(subscription_id) > 4:
        return subscription_id[: -len("-sub")]
    if subscription_id.startswith("sub-") and len(subscription_id) > 4:
        return subscription_id[len("sub-") :]
    return None


def plan(
    cfg: Config,
    project: str,
    *,
    push_endpoint: str | None,
    max_delivery_attempts: int,
    source_topics: dict[str, str],
    existing_topic_of: Any,
    name: str = DEFAULT_NAME,
) -> Plan:
    """Everything the config needs. `existing_topic_of(subscription path)` → its topic, or None.
    `name` is infra/'s: a push route without `subscription` gets `<name>-<route>`, as there."""
    ack_deadline = _ack_deadline(cfg, max_delivery_attempts, source_topics, push=push_endpoint is not None)
    out = Plan(project)
    seen: set[str] = set()

    def topic(path: str, why: str) -> None:
        if path not in seen:
            seen.add(path)
            out.topics.append((path, why))

    base = push_endpoint.rstrip("/") if push_endpoint else None
    oidc_sa = cfg.auth.service_account or ""
    oidc_aud = cfg.auth.audience or ""
    for route in cfg.routes:
        named = route.subscription or push_subscription_id(None, route.name, name)
        sub = pubsub_path(named, "subscription", project)
        sub_id = short_id(sub)
        sub_project = sub.split("/")[1]
        topic(pubsub_path(route.destination, "topic", project), f"destination of route {route.name!r}")
        source = _source_topic(route.name, sub, source_topics, existing_topic_of)
        topic(source, f"source of route {route.name!r}")
        dlq = pubsub_path(f"{sub_id}-dlq", "topic", sub_project)
        topic(dlq, f"dead letters of route {route.name!r}")
        out.subscriptions.append(
            SubscriptionSpec(
                path=pubsub_path(f"{sub_id}-dlq-sub", "subscription", sub_project),
                topic=dlq,
                route=None,
                ack_deadline=DLQ_ACK_DEADLINE_S,
                retention_s=DLQ_RETENTION_S,
            )
        )
        out.subscriptions.append(
            SubscriptionSpec(
                path=sub,
                topic=source,
                route=route.name,
                push_endpoint=f"{base}/push/{route.name}" if base else "",
                oidc_service_account=oidc_sa if base else "",
                oidc_audience=(oidc_aud or base) if base and oidc_sa else "",
                ack_deadline=ack_deadline,
                dead_letter_topic=dlq,
                max_delivery_attempts=max_delivery_attempts,
                retry=True,
                ordered=True,
                push_format=route.push_format,
            )
        )
    return out


def _ack_deadline(cfg: Config, max_delivery_attempts: int, source_topics: dict[str, str], *, push: bool) -> int:
    """The routes' subscriptions' ack deadline in whole seconds, once the options and the config
    are ones Pub/Sub takes (`ProvisionError` otherwise, before anything is planned)."""
    if not 5 <= max_delivery_attempts <= 100:
        raise ProvisionError(
            f"--max-delivery-attempts must be between 5 and 100 (Pub/Sub's limits), not {max_delivery_attempts}"
        )
    ack_deadline = round(cfg.lease.ack_deadline)
    if not 10 <= ack_deadline <= 600:
        raise ProvisionError(
            f"lease.ack_deadline is {cfg.lease.ack_deadline:g}s; a subscription's ack deadline must be 10s to 600s"
        )
    unknown = sorted(set(source_topics) - {r.name for r in cfg.routes})
    if unknown:
        raise ProvisionError(f"--source-topic names unknown route(s): {', '.join(unknown)}")
    missing = [r.name for r in cfg.routes if not r.subscription]
    if missing and not push:  # `pull` reads the subscription from the config: no default would reach it
        raise ProvisionError(
            f"route(s) {', '.join(missing)} have no `subscription`: a pull subscription is named in the config, "
            "where `pubsub-filter pull` reads it; set one per route"
        )
    return ack_deadline


def _source_topic(
    route: str, sub: str, source_topics: dict[str, str], existing_topic_of: Callable[[str], str | None]
) -> str:
    """The topic feeding `route`'s subscription `sub`: `--source-topic`, else the topic `sub`
    is attached to, else the subscription id without its affix (`derive_source_topic`)."""
    sub_project = sub.split("/")[1]
    if route in source_topics:
        return pubsub_path(source_topics[route], "topic", sub_project)
    attached = existing_topic_of(sub)
    if attached:
        return attached
    derived = derive_source_topic(short_id(sub))
    if derived:
        return pubsub_path(derived, "topic", sub_project)
    raise ProvisionError(
        f"route {route!r}: cannot tell the source topic from subscription id {short_id(sub)!r} "
        f"(no -sub suffix or sub- prefix to remove): pass --source-topic {route}=TOPIC"
    )


# --- applying it -----------------------------------------------------------------------------------


def ordering_warning(spec: SubscriptionSpec, current: Any) -> str | None:
    """The WARNING for a route's existing subscription that lacks the message ordering `spec` wants."""
    if not spec.ordered or bool(current.enable_message_ordering):
        return None
    return (
        f"WARNING: subscription {spec.path} (route {spec.route!r}) has message ordering off, and Pub/Sub "
        "cannot turn it on for an existing subscription. Without it a key's versions can be delivered out of "
        "order, so an older version can be forwarded after a newer one and be what downstream ends up with "
        '(docs/decisions.md, "Ordering: which version ends up last"). What to do: create a new subscription '
        "with ordering (give the route a new `subscription` in the config and run provision again), move the "
        "push endpoint or the pull consumers to it, then delete this one."
    )


@dataclass(frozen=True)
class Failed:
    """A resource Pub/Sub refused to read, create or update."""

    kind: str
    path: str
    reason: str


def summary(
    created: int, updated: int, conflicts: int, failed: list[Failed], warnings: list[str], dry_run: bool
) -> tuple[list[str], list[str], int]:
    """(stdout lines, stderr lines, exit code) closing a run: what changed, then what needs a person."""
    out: list[str] = []
    err: list[str] = []
    verb = ("to create", "to update") if dry_run else ("created", "updated")
    if created or updated:
        out.append(f"{created} {verb[0]}, {updated} {verb[1]}" + (" (dry run: nothing changed)" if dry_run else ""))
    elif not conflicts and not failed and warnings:
        out.append("no changes that Pub/Sub can make: see the WARNING below")
    elif not conflicts and not failed:
        out.append("no changes: every resource exists as the config needs it")
    if conflicts:
        err.append(f"{conflicts} conflict(s): see CONFLICT above")
    if failed:
        err.append(
            f"{len(failed)} failed (the others were still provisioned): "
            + "; ".join(f"{f.kind} {f.path}: {f.reason}" for f in failed)
        )
    err += warnings
    return out, err, 1 if conflicts or failed else 0


class Provisioner:
    def __init__(self, publisher: Any, subscriber: Any, dry_run: bool = False, out: Any = None):
        self.publisher = publisher
        self.subscriber = subscriber
        self.dry_run = dry_run
        self.out = out or sys.stdout
        self.created = 0
        self.updated = 0
        self.conflicts = 0
        self.failed: list[Failed] = []
        self.warnings: list[str] = []
        self._subs: dict[str, Any] = {}

    def say(self, status: str, kind: str, path: str, detail: str = "") -> None:
        if self.dry_run and status in ("created", "updated"):
            status = "would " + ("create" if status == "created" else "update")
        tail = f"  ({detail})" if detail else ""
        self.out.write(f"{status:<15}{kind:<14}{path}{tail}\n")
        self.out.flush()

    def current_subscription(self, path: str) -> Any:
        from google.api_core import exceptions as gexc

        if path not in self._subs:
            try:
                self._subs[path] = self.subscriber.get_subscription(subscription=path, timeout=30)
            except gexc.NotFound:
                self._subs[path] = None
        return self._subs[path]

    def topic_of(self, path: str) -> str | None:
        current = self.current_subscription(path)
        return str(current.topic) if current is not None else None

    def ensure_topic(self, path: str, why: str) -> None:
        from google.api_core import exceptions as gexc

        try:
            self.publisher.get_topic(topic=path, timeout=30)
        except gexc.NotFound:
            pass
        else:
            self.say("exists", "topic", path, why)
            return
        if not self.dry_run:
            try:
                self.publisher.create_topic(name=path, timeout=30)
            except gexc.AlreadyExists:  # created meanwhile by someone else
                self.say("exists", "topic", path, why)
                return
        self.created += 1
        self.say("created", "topic", path, why)

    def ensure_subscription(self, spec: SubscriptionSpec) -> None:
        from google.api_core import exceptions as gexc

        what = f"route {spec.route!r}: {spec.describe()}" if spec.route else spec.describe()
        current = self.current_subscription(spec.path)
        if current is None:
            if not self.dry_run:
                try:
                    self.subscriber.create_subscription(request=spec.request(), timeout=30)
                except gexc.AlreadyExists:
                    self._subs.pop(spec.path, None)
                    current = self.current_subscription(spec.path)
            if current is None:
                self.created += 1
                self.say("created", "subscription", spec.path, what)
                return
        if str(current.topic) != spec.topic:
            self.conflicts += 1
            self.say(
                "CONFLICT",
                "subscription",
                spec.path,
                f"attached to {current.topic}, the config needs {spec.topic}: a subscription's topic cannot "
                "change; delete it or fix --source-topic",
            )
            return
        warning = ordering_warning(spec, current)
        if warning:
            self.warnings.append(warning)
        diffs = spec.differences(current)
        if not diffs:
            self.say("exists", "subscription", spec.path, what)
            return
        if not self.dry_run:
            self.subscriber.update_subscription(
                request={"subscription": spec.request(), "update_mask": {"paths": [p for p, _ in diffs]}},
                timeout=30,
            )
        self.updated += 1
        self.say("updated", "subscription", spec.path, "; ".join(d for _, d in diffs))

    def apply(self, p: Plan) -> None:
        """Every resource, each on its own: one that Pub/Sub refuses does not stop the others."""
        for path, why in p.topics:
            self._attempt("topic", path, partial(self.ensure_topic, path, why))
        for spec in p.subscriptions:  # each dead-letter subscription comes before its route's
            self._attempt("subscription", spec.path, partial(self.ensure_subscription, spec))

    def _attempt(self, kind: str, path: str, step: Callable[[], None]) -> None:
        from google.api_core import exceptions as gexc

        try:
            step()
        except gexc.GoogleAPICallError as exc:
            self._failed(kind, path, f"{type(exc).__name__}: {exc.message}")
        except gexc.RetryError as exc:
            self._failed(kind, path, f"gave up after retrying: {exc.cause or exc}")

    def _failed(self, kind: str, path: str, reason: str) -> None:
        reason = " ".join(reason.split())
        self.failed.append(Failed(kind, path, reason))
        self.say("FAILED", kind, path, reason)


def parse_source_topics(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        route, sep, topic = item.partition("=")
        if not sep or not route or not topic:
            raise ProvisionError(f"--source-topic {item!r}: write ROUTE=TOPIC")
        out[route] = topic
    return out


def run(cfg: Config, args: argparse.Namespace) -> int:
    """`pubsub-filter provision`: plan, apply (or only print with --dry-run), summarise."""
    import google.cloud.pubsub_v1 as pubsub_v1
    from google.auth.exceptions import DefaultCredentialsError

    prog = "pubsub-filter provision"
    emulator = bool(os.environ.get("PUBSUB_EMULATOR_HOST"))
    project = resolve_project(args.project or cfg.project)
    try:
        publisher = pubsub_v1.PublisherClient()
        subscriber = pubsub_v1.SubscriberClient()
    except DefaultCredentialsError as exc:
        print(f"{prog}: {NO_CREDENTIALS} ({exc})", file=sys.stderr)
        return 1
    prov = Provisioner(publisher, subscriber, dry_run=args.dry_run)
    try:
        try:
            wanted = plan(
                cfg,
                project,
                push_endpoint=args.push_endpoint,
                max_delivery_attempts=args.max_delivery_attempts or delivery_attempts_for(cfg),
                source_topics=parse_source_topics(args.source_topic),
                existing_topic_of=prov.topic_of,
                name=args.name,
            )
        except (ProvisionError, PubsubNameError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        where = f"the emulator at {os.environ['PUBSUB_EMULATOR_HOST']}" if emulator else "Pub/Sub"
        dry = "dry run: " if args.dry_run else ""
        print(f"{dry}provisioning {len(cfg.routes)} route(s) in project {project} on {where}")
        prov.apply(wanted)
    finally:
        publisher.stop()
        publisher.transport.close()
        subscriber.close()
    out, err, code = summary(prov.created, prov.updated, prov.conflicts, prov.failed, prov.warnings, args.dry_run)
    for line in out:
        print(line)
    sys.stdout.flush()  # the summary before the warnings when both go to one terminal
    for line in err:
        print(line, file=sys.stderr)
    if not emulator:
        dead_letter_topics = sorted({s.dead_letter_topic for s in wanted.subscriptions if s.dead_letter_topic})
        print(
            "reminder: dead-lettering on Pub/Sub needs IAM for the Pub/Sub service agent "
            "(service-PROJECT_NUMBER@gcp-sa-pubsub.iam.gserviceaccount.com): roles/pubsub.publisher on "
            f"{', '.join(dead_letter_topics)} and roles/pubsub.subscriber on each route's subscription. "
            "infra/ grants these in production; without them messages are never dead-lettered."
        )
    return code
