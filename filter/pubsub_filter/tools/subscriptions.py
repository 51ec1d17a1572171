"""What one subscription `pubsub-filter provision` creates should look like, and how an
existing one differs from it (each difference with its update-mask path and a line for the
operator)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

#: infra/'s `name` by default: a push subscription the config does not name is `<name>-<route>`,
#: in Terraform (modules/pubsub-filter/config.tf) and in `provision` alike
DEFAULT_NAME = "pubsub-filter"
MIN_BACKOFF_S = 10
MAX_BACKOFF_S = 600
DLQ_ACK_DEADLINE_S = 60
DLQ_RETENTION_S = 7 * 86400


def push_subscription_id(subscription: str | None, route: str, name: str = DEFAULT_NAME) -> str:
    """A route's push subscription as infra/ names it: the route's `subscription` (its id, when a
    full path), else `<name>-<route>`."""
    if subscription:
        return short_id(subscription)
    return f"{name}-{route}"


@dataclass
class SubscriptionSpec:
    path: str
    topic: str
    route: str | None = None
    push_endpoint: str = ""
    oidc_service_account: str = ""
    oidc_audience: str = ""
    ack_deadline: int = DLQ_ACK_DEADLINE_S
    dead_letter_topic: str = ""
    max_delivery_attempts: int = 0
    retry: bool = False
    retention_s: int | None = None
    ordered: bool = False  # set at creation only: Pub/Sub cannot change it on an existing subscription
    push_format: str = "wrapped"  # the route's: wrapped, unwrapped (with metadata), unwrapped_no_metadata

    def request(self) -> dict[str, Any]:
        req: dict[str, Any] = {
            "name": self.path,
            "topic": self.topic,
            "ack_deadline_seconds": self.ack_deadline,
            "push_config": self._push_config(),
            "expiration_policy": {},  # no ttl: never expires
        }
        if self.dead_letter_topic:
            req["dead_letter_policy"] = {
                "dead_letter_topic": self.dead_letter_topic,
                "max_delivery_attempts": self.max_delivery_attempts,
            }
        if self.retry:
            req["retry_policy"] = {
                "minimum_backoff": {"seconds": MIN_BACKOFF_S},
                "maximum_backoff": {"seconds": MAX_BACKOFF_S},
            }
        if self.retention_s is not None:
            req["message_retention_duration"] = {"seconds": self.retention_s}
        if self.ordered:
            req["enable_message_ordering"] = True
        return req

    def _push_config(self) -> dict[str, Any]:
        if not self.push_endpoint:
            return {}
        cfg: dict[str, Any] = {"push_endpoint": self.push_endpoint}
        if self.push_format != "wrapped":
            cfg["no_wrapper"] = {"write_metadata": self.push_format == "unwrapped"}
        if self.oidc_service_account:
            cfg["oidc_token"] = {
                "service_account_email": self.oidc_service_account,
                "audience": self.oidc_audience,
            }
        return cfg

    def describe(self) -> str:
        how = f"push → {self.push_endpoint}" if self.push_endpoint else "pull"
        parts = [how, f"ack deadline {self.ack_deadline}s"]
        if self.push_endpoint and self.push_format != "wrapped":
            parts.append(_UNWRAPPING[self.push_format])
        if self.dead_letter_topic:
            parts.append(
                f"dead letters → {short_id(self.dead_letter_topic)} after {self.max_delivery_attempts} attempts"
            )
        return ", ".join(parts)

    def differences(self, current: Any) -> list[tuple[str, str]]:
        """(update-mask path, what changes) for every setting `current` lacks; [] when it matches."""
        diffs: list[tuple[str, str]] = []
        if int(current.ack_deadline_seconds) != self.ack_deadline:
            diffs.append(
                ("ack_deadline_seconds", f"ack deadline {current.ack_deadline_seconds}s → {self.ack_deadline}s")
            )
        push = current.push_config
        have_endpoint = str(push.push_endpoint or "")
        have_oidc = (
            (str(push.oidc_token.service_account_email), str(push.oidc_token.audience))
            if "oidc_token" in push
            else ("", "")
        )
        want_oidc = (self.oidc_service_account, self.oidc_audience) if self.push_endpoint else ("", "")
        if have_endpoint != self.push_endpoint or (self.push_endpoint and have_oidc != want_oidc):
            before = f"push → {have_endpoint}" if have_endpoint else "pull"
            after = f"push → {self.push_endpoint}" if self.push_endpoint else "pull"
            if before == after:
                before, after = f"OIDC {have_oidc[0] or 'none'}", f"OIDC {want_oidc[0] or 'none'}"
            diffs.append(("push_config", f"{before} → {after}"))
        elif self.push_endpoint and (sent := _push_format(push)) != self.push_format:
            diffs.append(("push_config", f"{_UNWRAPPING[sent]} → {_UNWRAPPING[self.push_format]}"))
        if self.dead_letter_topic:
            dlp = current.dead_letter_policy if "dead_letter_policy" in current else None
            have = (str(dlp.dead_letter_topic), int(dlp.max_delivery_attempts)) if dlp is not None else ("", 0)
            if have != (self.dead_letter_topic, self.max_delivery_attempts):
                was = f"{short_id(have[0])} after {have[1]}" if have[0] else "none"
                diffs.append(
                    (
                        "dead_letter_policy",
                        f"dead letters {was} → {short_id(self.dead_letter_topic)} after {self.max_delivery_attempts}",
                    )
                )
        if self.retry:
            rp = current.retry_policy if "retry_policy" in current else None
            have_rp = (_seconds(rp.minimum_backoff), _seconds(rp.maximum_backoff)) if rp is not None else None
            if have_rp != (MIN_BACKOFF_S, MAX_BACKOFF_S):
                was = f"{have_rp[0]:g}s-{have_rp[1]:g}s" if have_rp else "none"
                diffs.append(("retry_policy", f"retry backoff {was} → {MIN_BACKOFF_S}s-{MAX_BACKOFF_S}s"))
        if "expiration_policy" not in current or _seconds(current.expiration_policy.ttl):
            diffs.append(("expiration_policy", "expiry → never"))
        if self.retention_s is not None and _seconds(current.message_retention_duration) != self.retention_s:
            diffs.append(
                (
                    "message_retention_duration",
                    f"retention {_seconds(current.message_retention_duration):g}s → {self.retention_s}s",
                )
            )
        return diffs


_UNWRAPPING = {
    "wrapped": "push envelope",
    "unwrapped": "payload unwrapped, metadata in headers",
    "unwrapped_no_metadata": "payload unwrapped, no metadata",
}


def _push_format(push: Any) -> str:
    """What an existing subscription's push config sends, as a route's `push_format` says it."""
    if "no_wrapper" not in push:
        return "wrapped"
    return "unwrapped" if push.no_wrapper.write_metadata else "unwrapped_no_metadata"


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return float(getattr(value, "seconds", 0)) + float(getattr(value, "nanos", 0)) / 1e9


def short_id(path: str) -> str:
    """`projects/P/topics/T` → `T`."""
    return path.rsplit("/", 1)[-1]
