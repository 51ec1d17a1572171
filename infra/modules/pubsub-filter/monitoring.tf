# Log-based metrics over the service's structured logs, and alerts on them.
#
# Every decision is one log line with jsonPayload.message = "decision" and the fields
# route, decision (forwarded|suppressed|duplicate|contended|stale|noise_only|superseded|fail_open|rejected|
# failed) and enforced, at the decision's level or, when the config's decision_logs quiets it,
# at DEBUG: no metric filter here names a severity, so every line counts whatever its level.
# Lifecycle lines carry jsonPayload.message = lease_taken_over, heartbeat_failed,
# store_unavailable or push_unauthorized, with a route field.

locals {
  log_source = join(" AND ", [
    "resource.type=\"cloud_run_revision\"",
    "resource.labels.service_name=\"${google_cloud_run_v2_service.this.name}\"",
  ])

  # Counters of one kind of line each, labelled by route.
  event_metrics = {
    contention = {
      match       = "jsonPayload.message=\"decision\" AND jsonPayload.decision=\"contended\""
      description = "Push requests answered 503 because another version of the same key was in flight (lease contention)."
    }
    fail_open = {
      match       = "jsonPayload.message=\"decision\" AND jsonPayload.decision=\"fail_open\""
      description = "Messages forwarded without a dedup decision because the state store was unreachable."
    }
    lease_takeovers = {
      match       = "jsonPayload.message=\"lease_taken_over\""
      description = "Expired leases taken over from a holder that stopped heartbeating."
    }
    heartbeat_failures = {
      match       = "jsonPayload.message=\"heartbeat_failed\""
      description = "Lease heartbeats (extensions) that failed while a publish was under way."
    }
    store_unavailable = {
      match       = "jsonPayload.message=\"store_unavailable\""
      description = "State store calls that failed or exceeded store_errors.budget."
    }
    records_dropped = {
      # decision records lost (buffer full, a batch given up after its retries); the decision itself stands
      match       = "(jsonPayload.message=\"records_dropped\" OR jsonPayload.message=\"records_write_failed\")"
      description = "Log lines reporting decision records dropped before they reached the decisions table."
    }
    push_unauthorized = {
      match       = "jsonPayload.message=\"push_unauthorized\""
      description = "Push requests refused by the filter's OIDC check (wrong audience or service account)."
    }
    publish_failures = {
      # the engine records a failed publish as decision "failed" with cause "publish"
      match       = "jsonPayload.message=\"decision\" AND jsonPayload.decision=\"failed\" AND jsonPayload.cause=\"publish\""
      description = "Publishes to a destination topic that were not confirmed (the source message was nacked)."
    }
    push_overloaded = {
      # the push endpoint turned a push away undecided (429, a retry): no room under
      # server.max_bytes_in_flight came within server.admission_wait
      match       = "jsonPayload.message=\"decision\" AND jsonPayload.decision=\"failed\" AND jsonPayload.cause=\"overloaded\""
      description = "Push requests answered 429 undecided because the instance had server.max_bytes_in_flight of bodies in flight for server.admission_wait."
    }
  }

  user_metric_prefix = "logging.googleapis.com/user"

  skipped_decisions = ["suppressed", "duplicate", "stale", "noise_only", "superseded"]
  passed_decisions  = ["forwarded", "fail_open"]
  # `decided` as in `pubsub-filter skip-rate`: every decision after which the source
  # message was acked. contended/failed come back and are counted when decided;
  # rejected ones were never understood.
  decided_decisions = concat(local.passed_decisions, local.skipped_decisions)

  skip_rate_routes = {
    for name, _ in local.routes : name => lookup(var.skip_rate_thresholds, name, var.skip_rate_threshold)
    if lookup(var.skip_rate_thresholds, name, var.skip_rate_threshold) > 0
  }
}

resource "google_logging_metric" "decisions" {
  project     = var.project
  name        = "${var.name}/decisions"
  description = "pubsub-filter decisions by route, decision and enforced (false in shadow mode)."
  filter      = "${local.log_source} AND jsonPayload.message=\"decision\""

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = "INT64"
    unit         = "1"
    display_name = "pubsub-filter decisions (${var.name})"

    labels {
      key         = "route"
      value_type  = "STRING"
      description = "Route name."
    }
    labels {
      key         = "decision"
      value_type  = "STRING"
      description = "forwarded, suppressed, duplicate, contended, stale, noise_only, superseded, fail_open, rejected or failed."
    }
    labels {
      key         = "enforced"
      value_type  = "BOOL"
      description = "False when the route runs in shadow mode."
    }
  }

  label_extractors = {
    route    = "EXTRACT(jsonPayload.route)"
    decision = "EXTRACT(jsonPayload.decision)"
    enforced = "EXTRACT(jsonPayload.enforced)"
  }
}

# Decision latency as a distribution, for the dashboard's p50/p95 (the line's latency_ms).
resource "google_logging_metric" "decision_latency" {
  project         = var.project
  name            = "${var.name}/decision_latency"
  description     = "pubsub-filter decision latency in milliseconds, by route and decision."
  filter          = "${local.log_source} AND jsonPayload.message=\"decision\""
  value_extractor = "EXTRACT(jsonPayload.latency_ms)"

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = "DISTRIBUTION"
    unit         = "ms"
    display_name = "pubsub-filter decision latency (${var.name})"

    labels {
      key         = "route"
      value_type  = "STRING"
      description = "Route name."
    }
    labels {
      key         = "decision"
      value_type  = "STRING"
      description = "The decision."
    }
  }

  label_extractors = {
    route    = "EXTRACT(jsonPayload.route)"
    decision = "EXTRACT(jsonPayload.decision)"
  }

  bucket_options {
    exponential_buckets {
      num_finite_buckets = 40
      growth_factor      = 1.5
      scale              = 0.05
    }
  }
}

# The dashboard (tiles in dashboard.tf): there when Terraform finishes.
resource "google_monitoring_dashboard" "this" {
  project        = var.project
  dashboard_json = jsonencode(local.dashboard)

  depends_on = [google_logging_metric.decisions, google_logging_metric.decision_latency, google_logging_metric.events]
}

resource "google_logging_metric" "events" {
  for_each = local.event_metrics

  project     = var.project
  name        = "${var.name}/${each.key}"
  description = each.value.description
  filter      = "${local.log_source} AND ${each.value.match}"

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = "INT64"
    unit         = "1"
    display_name = "pubsub-filter ${replace(each.key, "_", " ")} (${var.name})"

    labels {
      key         = "route"
      value_type  = "STRING"
      description = "Route name."
    }
  }

  label_extractors = {
    route = "EXTRACT(jsonPayload.route)"
  }
}

# The service's DEBUG entries, when the config quiets decision lines (config.tf): kept out
# of Cloud Logging's storage (and its ingestion charge) by an exclusion on the _Default
# sink. User-defined log-based metrics are computed from every entry Cloud Logging
# receives, excluded or not, so `decisions`, `decision_latency` and the counters above,
# whose filters name no severity, still count every decision for the dashboard and alerts.
resource "google_logging_project_exclusion" "debug_lines" {
  count = length(local.decision_lines_quieted) > 0 ? 1 : 0

  project     = var.project
  name        = "${var.name}-debug-lines"
  description = "pubsub-filter ${var.name}: DEBUG lines (quieted decisions: ${join(", ", local.decision_lines_quieted)}) are counted by the log-based metrics, not stored."
  filter      = "${local.log_source} AND severity=DEBUG"
}

# --- alerts --------------------------------------------------------------------------

# Skip rate below the threshold, per route. Written as its complement so that a route
# that skips nothing at all still alerts: a ratio condition has no value where its
# numerator has no time series, and a log-based counter has no series for a label value
# it never saw. So instead of
#     skipped / decided < X        (silent when skipped has no series)
# the condition is
#     (forwarded + fail_open) / decided > 1 - X
# which is the same test (decided = forwarded + fail_open + skipped), and whose
# numerator only lacks a series when nothing was forwarded, i.e. skip rate 1.
resource "google_monitoring_alert_policy" "skip_rate" {
  for_each = local.skip_rate_routes

  project      = var.project
  display_name = "pubsub-filter ${var.name}: skip rate of ${each.key} below ${each.value}"
  combiner     = "OR"
  severity     = "WARNING"
  user_labels  = var.labels

  conditions {
    display_name = "${each.key}: (suppressed + duplicate + stale + noise_only + superseded) / decided < ${each.value} over ${var.skip_rate_window}"

    condition_threshold {
      filter = join(" AND ", [
        "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.decisions.name}\"",
        "resource.type=\"cloud_run_revision\"",
        "metric.label.route=\"${each.key}\"",
        "metric.label.decision=one_of(${join(",", formatlist("\"%s\"", local.passed_decisions))})",
      ])
      denominator_filter = join(" AND ", [
        "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.decisions.name}\"",
        "resource.type=\"cloud_run_revision\"",
        "metric.label.route=\"${each.key}\"",
        "metric.label.decision=one_of(${join(",", formatlist("\"%s\"", local.decided_decisions))})",
      ])
      comparison      = "COMPARISON_GT"
      threshold_value = 1 - each.value
      duration        = "0s"

      aggregations {
        alignment_period     = var.skip_rate_window
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.route"]
      }
      denominator_aggregations {
        alignment_period     = var.skip_rate_window
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.route"]
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: ${each.key} skip rate below ${each.value}"
    content   = <<-EOT
      Route **${each.key}** forwarded more than ${1 - each.value} of what it decided over ${var.skip_rate_window}.

      Usually a field that changes on every scrape (a timestamp, a run id, an odds price)
      is being fingerprinted. Compare two consecutive forwards for one key:
      `pubsub-filter skip-rate --by hour` to see when it started, then
      `pubsub-filter fingerprint` on two payloads and add the changing field to the
      route's `exclude` list. Shadow routes (enforced=false) report what enforce mode
      would have skipped.
    EOT
  }
}

resource "google_monitoring_alert_policy" "contention" {
  project      = var.project
  display_name = "pubsub-filter ${var.name}: lease contention above ${var.contention_per_hour_threshold}/h"
  combiner     = "OR"
  severity     = "WARNING"
  user_labels  = var.labels

  conditions {
    display_name = "contended decisions per route per hour > ${var.contention_per_hour_threshold}"

    condition_threshold {
      filter          = "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.events["contention"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.contention_per_hour_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "3600s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.route"]
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: lease contention"
    content   = <<-EOT
      Different versions of the same key keep arriving while one is being published, and
      the later ones are answered 503 until the first commits. A few are normal (a rerun
      racing a scrape); many mean publishes are slow (see publish latency and
      `publish_failures`) or a producer emits several versions per key at once. If it
      persists, messages may reach the dead-letter topic: check that
      max_delivery_attempts still covers lease.duration / minimum_backoff.
    EOT
  }
}

resource "google_monitoring_alert_policy" "push_overloaded" {
  project      = var.project
  display_name = "pubsub-filter ${var.name}: pushes turned away at the bound on bytes in flight above ${var.push_overloaded_per_hour_threshold}/h"
  combiner     = "OR"
  severity     = "WARNING"
  user_labels  = var.labels

  conditions {
    display_name = "overloaded (429) pushes per route per hour > ${var.push_overloaded_per_hour_threshold}"

    condition_threshold {
      filter          = "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.events["push_overloaded"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.push_overloaded_per_hour_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "3600s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.route"]
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: pushes turned away (429) at the bound on bytes in flight"
    content   = <<-EOT
      An instance had `server.max_bytes_in_flight` of push bodies in flight for longer than
      `server.admission_wait` and answered more pushes 429 undecided: Pub/Sub backs off and sends them again, nothing is lost, but they wait
      and count towards max_delivery_attempts. Bursts of large messages (megabytes each) do
      this. Raise memory and max_bytes_in_flight together (docs/deploying.md, "Large messages:
      memory and concurrency"), or raise max_instances so the burst spreads over more instances.
    EOT
  }
}

resource "google_monitoring_alert_policy" "heartbeat_failures" {
  project      = var.project
  display_name = "pubsub-filter ${var.name}: heartbeat failures above ${var.heartbeat_failures_per_hour_threshold}/h"
  combiner     = "OR"
  severity     = "ERROR"
  user_labels  = var.labels

  conditions {
    display_name = "heartbeat_failed lines per hour > ${var.heartbeat_failures_per_hour_threshold}"

    condition_threshold {
      filter          = "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.events["heartbeat_failures"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.heartbeat_failures_per_hour_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "3600s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: lease heartbeats failing"
    content   = <<-EOT
      Leases could not be extended while publishes were under way. A lease that lapses can
      be taken over by another instance (see `lease_takeovers`); the fencing token keeps
      the late holder from overwriting the result, but the key may be published twice.
      Check Firestore latency and errors and the `store_unavailable` metric; check that
      the service has CPU between requests (cpu_always_allocated).
    EOT
  }
}

resource "google_monitoring_alert_policy" "lease_takeovers" {
  project      = var.project
  display_name = "pubsub-filter ${var.name}: lease takeovers above ${var.lease_takeovers_per_hour_threshold}/h"
  combiner     = "OR"
  severity     = "WARNING"
  user_labels  = var.labels

  conditions {
    display_name = "lease_taken_over lines per hour > ${var.lease_takeovers_per_hour_threshold}"

    condition_threshold {
      filter          = "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.events["lease_takeovers"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.lease_takeovers_per_hour_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "3600s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: leases held past their expiry and taken over"
    content   = <<-EOT
      An instance held a key's lease past its expiry (it died, or its heartbeat could not
      reach Firestore) and another instance took the key over with a higher fence. The
      late holder's commit is refused, but its publish may already have gone out: the
      content can reach downstream twice. The default threshold: more than 3 an hour.
    EOT
  }
}

resource "google_monitoring_alert_policy" "fail_open" {
  project      = var.project
  display_name = "pubsub-filter ${var.name}: failing open"
  combiner     = "OR"
  severity     = "ERROR"
  user_labels  = var.labels

  conditions {
    display_name = "fail_open decisions per route in 5 minutes > ${var.fail_open_threshold}"

    condition_threshold {
      filter          = "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.events["fail_open"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.fail_open_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.route"]
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: failing open"
    content   = <<-EOT
      The state store (Firestore) was unreachable or slower than store_errors.budget, and
      routes with on_store_error = forward are forwarding every message without dedup.
      Nothing is lost, but downstream phases recompute. Check Firestore status and the
      `store_unavailable` metric; routes that must never forward blindly can set
      on_store_error = retry (they are then nacked and retried instead).
      With the store up, a fail_open is a message whose key cannot be read
      (on_missing_key = forward): its decision line names the path in missing_field.
      Fix the producer (or the route's key); on_missing_key = reject stops such messages instead.
    EOT
  }
}

# --- backlog, publishing and the store ---------------------------------------------------

# Anything in a dead-letter subscription ran out of delivery attempts: it waits there for
# `pubsub-filter replay` (the subscription keeps it for dead_letter_retention_duration).
resource "google_monitoring_alert_policy" "dead_letter_backlog" {
  for_each = local.routes

  project      = var.project
  display_name = "pubsub-filter ${var.name}: dead letters waiting for ${each.key}"
  combiner     = "OR"
  severity     = "ERROR"
  user_labels  = var.labels

  conditions {
    display_name = "${each.value.dead_letter}-sub holds more than ${var.dead_letter_backlog_threshold} message(s)"

    condition_threshold {
      filter = join(" AND ", [
        "metric.type=\"pubsub.googleapis.com/subscription/num_undelivered_messages\"",
        "resource.type=\"pubsub_subscription\"",
        "resource.label.subscription_id=\"${google_pubsub_subscription.dead_letter[each.key].name}\"",
      ])
      comparison      = "COMPARISON_GT"
      threshold_value = var.dead_letter_backlog_threshold
      duration        = "0s"

      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_MAX"
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: dead letters waiting for route ${each.key}"
    content   = <<-EOT
      Messages of route **${each.key}** ran out of delivery attempts and were moved to
      `${each.value.dead_letter}`; they wait in `${each.value.dead_letter}-sub`. Find why
      (the decision lines with decision `rejected` or `failed` for the route, the
      `publish_failures` and `store_unavailable` metrics), fix it, then republish them:
      `pubsub-filter replay --config filter.yaml --route ${each.key}` (add `--dry-run` to
      look first; `--through-filter` to decide each one again instead of republishing to
      the source topic).
    EOT
  }
}

# A source subscription whose oldest unacked message keeps ageing: the service is not
# keeping up, or one message is retried over and over (with ordering on, it holds back
# every later message of its key).
resource "google_monitoring_alert_policy" "oldest_unacked_age" {
  for_each = local.routes

  project      = var.project
  display_name = "pubsub-filter ${var.name}: ${each.key} backlog older than ${var.oldest_unacked_age_threshold_seconds}s"
  combiner     = "OR"
  severity     = "WARNING"
  user_labels  = var.labels

  conditions {
    display_name = "${each.value.subscription}: oldest unacked message older than ${var.oldest_unacked_age_threshold_seconds}s for 5 minutes"

    condition_threshold {
      filter = join(" AND ", [
        "metric.type=\"pubsub.googleapis.com/subscription/oldest_unacked_message_age\"",
        "resource.type=\"pubsub_subscription\"",
        "resource.label.subscription_id=\"${google_pubsub_subscription.push[each.key].name}\"",
      ])
      comparison      = "COMPARISON_GT"
      threshold_value = var.oldest_unacked_age_threshold_seconds
      duration        = "300s"

      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: route ${each.key} is falling behind"
    content   = <<-EOT
      The oldest message not yet acked on `${each.value.subscription}` is older than
      ${var.oldest_unacked_age_threshold_seconds}s. Either the service does not keep up
      (Cloud Run at max_instances, slow publishes: see the decision latency tile) or
      messages are answered 5xx again and again: `contended` (see the contention alert),
      `failed` (publish failures, or the store down under on_store_error = retry). With
      message ordering a message retried holds back the later ones of its key until it
      is acked or dead-lettered.
    EOT
  }
}

resource "google_monitoring_alert_policy" "publish_failures" {
  project      = var.project
  display_name = "pubsub-filter ${var.name}: publishes failing"
  combiner     = "OR"
  severity     = "ERROR"
  user_labels  = var.labels

  conditions {
    display_name = "unconfirmed publishes per route in 5 minutes > ${var.publish_failures_threshold}"

    condition_threshold {
      filter          = "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.events["publish_failures"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.publish_failures_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.route"]
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: publishes to destination topics failing"
    content   = <<-EOT
      Forwards to a destination topic were not confirmed within publisher.timeout. The
      source message was answered 5xx, its lease released, and Pub/Sub retries it; once
      its delivery attempts run out it is dead-lettered (see the dead-letter alert). Check
      that the destination topic exists, that the service account may publish to it
      (roles/pubsub.publisher), and Pub/Sub's status.
    EOT
  }
}

resource "google_monitoring_alert_policy" "store_unavailable" {
  project      = var.project
  display_name = "pubsub-filter ${var.name}: state store unavailable"
  combiner     = "OR"
  severity     = "ERROR"
  user_labels  = var.labels

  conditions {
    display_name = "store_unavailable lines per route in 5 minutes > ${var.store_unavailable_threshold}"

    condition_threshold {
      filter          = "metric.type=\"${local.user_metric_prefix}/${google_logging_metric.events["store_unavailable"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.store_unavailable_threshold
      duration        = "0s"

      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.route"]
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = var.notification_channels

  alert_strategy {
    auto_close = var.alert_auto_close
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "pubsub-filter: the state store does not answer"
    content   = <<-EOT
      Calls to the state store (Firestore) failed or took longer than store_errors.budget.
      Routes with on_store_error = forward fail open (forward without dedup: see the
      fail_open alert); routes with on_store_error = retry answer 503 and are retried, and
      their backlog grows. Check Firestore's status, quota and latency, and that the
      service account has roles/datastore.user on the store's project.
    EOT
  }
}
