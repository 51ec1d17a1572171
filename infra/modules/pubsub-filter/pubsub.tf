# Per route: a push subscription on the route's source topic, a dead-letter topic and a
# pull subscription on it (so nothing dead-lettered is lost before `pubsub-filter
# replay` gets to it). Plus the destination topics.

resource "google_pubsub_topic" "dead_letter" {
  for_each = local.routes

  project                    = var.project
  name                       = each.value.dead_letter
  labels                     = merge(var.labels, { "pubsub-filter-route" = lower(replace(each.key, ".", "_")) })
  kms_key_name               = var.kms_key_name
  message_retention_duration = var.dead_letter_retention_duration
}

resource "google_pubsub_subscription" "dead_letter" {
  for_each = local.routes

  project                    = var.project
  name                       = "${each.value.dead_letter}-sub"
  topic                      = google_pubsub_topic.dead_letter[each.key].id
  labels                     = var.labels
  ack_deadline_seconds       = 60
  message_retention_duration = var.dead_letter_retention_duration
  retain_acked_messages      = false

  # A dead-letter subscription that expires after 31 idle days would silently drop
  # everything dead-lettered later.
  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_subscription" "push" {
  for_each = local.routes

  project                    = var.project
  name                       = each.value.subscription
  topic                      = each.value.source_topic
  labels                     = var.labels
  ack_deadline_seconds       = local.ack_deadline_seconds
  message_retention_duration = var.message_retention_duration
  # Messages published with an ordering key (one per entity) are then delivered in order, and
  # a nacked one (503 `contended`) is redelivered before any later one: which version ends up
  # last downstream is then the publish order (README, "Ordering"). No effect without keys.
  enable_message_ordering = var.enable_message_ordering

  push_config {
    push_endpoint = "${google_cloud_run_v2_service.this.uri}/push/${each.key}"

    oidc_token {
      service_account_email = local.push_sa_email
      # The config's auth.audience when set (the filter verifies it); else the service
      # URL, which Cloud Run itself checks.
      audience = coalesce(local.auth_audience, google_cloud_run_v2_service.this.uri)
    }

    # The route's push_format: payload unwrapping, the data as the body, with (unwrapped) or
    # without (unwrapped_no_metadata) the message id, publish time and attributes as headers.
    dynamic "no_wrapper" {
      for_each = each.value.push_format == "wrapped" ? [] : [each.value.push_format]
      content {
        write_metadata = no_wrapper.value == "unwrapped"
      }
    }
  }

  retry_policy {
    minimum_backoff = var.minimum_backoff
    maximum_backoff = var.maximum_backoff
  }

  # Rule (see config.tf and the README): contention answers 503 for at most one lease
  # duration, retried no sooner than minimum_backoff apart, so
  # max_delivery_attempts >= ceil(lease.duration / minimum_backoff) + margin, clamped to
  # Pub/Sub's 5..100.
  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter[each.key].id
    max_delivery_attempts = local.max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }

  lifecycle {
    precondition {
      condition     = each.value.source_topic != null
      error_message = "source_topics has no entry for route ${each.key}: map every route in the config to the raw topic that feeds it."
    }
    precondition {
      condition     = local.max_delivery_attempts > local.contention_attempts
      error_message = "max_delivery_attempts (${local.max_delivery_attempts}) does not cover lease contention for route ${each.key}: up to ceil(lease.duration / minimum_backoff) = ${local.contention_attempts} deliveries may be answered 503 while another version of the key is in flight. Raise minimum_backoff, shorten lease.duration, or raise max_delivery_attempts."
    }
    precondition {
      condition     = local.ack_deadline_seconds >= 10 && local.ack_deadline_seconds <= 600
      error_message = "lease.ack_deadline becomes ack_deadline_seconds and must be between 10s and 600s (got ${local.ack_deadline_seconds}s)."
    }
  }

  # The dead-letter forwarding permissions must be in place before the first delivery
  # that could exhaust its attempts.
  depends_on = [
    google_pubsub_topic_iam_member.service_agent_publishes_dead_letter,
    google_service_account_iam_member.service_agent_mints_push_tokens,
  ]
}

resource "google_pubsub_topic" "destination" {
  for_each = var.create_destination_topics ? local.destinations : {}

  project      = each.value.project
  name         = each.value.name
  labels       = var.labels
  kms_key_name = var.kms_key_name
}
