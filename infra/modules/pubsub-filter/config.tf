# Everything Terraform derives from the pubsub-filter YAML config. These locals read only
# variables (no resource attributes), so they can be evaluated with `terraform console`
# without providers (tests/unit/test_infra_wiring.py does exactly that).

locals {
  config = yamldecode(var.config_yaml)

  # Durations in the config are numbers of seconds or strings like 90s, 15m, 24h, 7d,
  # 500ms: the same grammar as pubsub_filter.core.config.schema.parse_duration.
  duration_units   = { ms = 0.001, s = 1, m = 60, h = 3600, d = 86400 }
  duration_pattern = "^\\s*([0-9]+(?:\\.[0-9]+)?)\\s*(ms|s|m|h|d)?\\s*$"
  lease_raw = {
    duration     = try(local.config.lease.duration, 120)
    heartbeat    = try(local.config.lease.heartbeat, 20)
    ack_deadline = try(local.config.lease.ack_deadline, 60)
  }
  lease = {
    for k, v in local.lease_raw : k => (
      can(tonumber(v)) ? tonumber(v) :
      tonumber(regex(local.duration_pattern, tostring(v))[0]) *
      local.duration_units[coalesce(regex(local.duration_pattern, tostring(v))[1], "s")]
    )
  }

  # Where the backends live: their own `project`, else the config's `project`, else ours.
  app_project      = coalesce(try(local.config.project, null), var.project)
  store_backend    = try(local.config.store.backend, "sqlite")
  store_project    = coalesce(try(local.config.store.project, null), local.app_project)
  store_database   = coalesce(try(local.config.store.database, null), "(default)")
  store_collection = coalesce(try(local.config.store.collection, null), "pubsub-filter")

  records_backend                   = try(local.config.records.backend, "sqlite")
  records_project                   = coalesce(try(local.config.records.project, null), local.app_project)
  records_dataset                   = coalesce(try(local.config.records.dataset, null), "pubsub_filter")
  records_table                     = coalesce(try(local.config.records.table, null), "decisions")
  records_location                  = coalesce(try(local.config.records.location, null), var.region)
  records_partition_expiration_days = coalesce(try(local.config.records.partition_expiration_days, null), 90)

  # The module's BigQuery datasets, one resource (bigquery.tf): the decisions table's when the
  # records go to BigQuery, and the decision lines' when the optional sink is on (decision_sink.tf).
  decision_lines_dataset = coalesce(var.decision_log_dataset, "${replace(var.name, "-", "_")}_decision_lines")
  datasets = merge(
    local.records_backend == "bigquery" ? {
      records = {
        project     = local.records_project
        dataset_id  = local.records_dataset
        location    = local.records_location
        name        = "pubsub-filter decisions"
        description = "Decision records written by pubsub-filter (${var.name})."
      }
    } : {},
    var.decision_log_sink ? {
      decision_lines = {
        project     = var.project
        dataset_id  = local.decision_lines_dataset
        location    = var.region
        name        = "pubsub-filter decision lines"
        description = "Decision log lines of pubsub-filter (${var.name}), routed by a Cloud Logging sink."
      }
    } : {},
  )

  publisher_project = coalesce(try(local.config.publisher.project, null), local.app_project)

  # Decisions whose lines the filter writes at debug, all or a share of them (the config's
  # decision_logs: `level: debug`, or `sample` below 1). The dashboard and alerts count
  # decision lines with log-based metrics, so those lines must still reach Cloud Logging:
  # the service then runs at LOG_LEVEL=debug (main.tf) and its DEBUG entries are excluded
  # from storage (monitoring.tf): not stored, not charged, still counted by the log-based
  # metrics, which Cloud Logging computes before exclusions. Keep in sync with
  # pubsub_filter.core.engine.decision_line.level_of (tests/unit/test_infra_wiring.py compares).
  decision_logs = try({ for d, v in local.config.decision_logs : d => v if v != null }, {})
  decision_lines_quieted = sort([
    for d, v in local.decision_logs : d if try(v.level, null) == "debug" || try(tonumber(v.sample), 1) < 1
  ])
  service_log_level = length(local.decision_lines_quieted) > 0 ? "debug" : null

  # OIDC: the audience Pub/Sub puts in the push token. The filter verifies tokens only
  # when auth.audience is set; Cloud Run always verifies them, against the service URL
  # or one of its custom audiences, so a configured audience is also made a custom
  # audience of the service (main.tf).
  auth_audience        = try(local.config.auth.audience, null)
  auth_service_account = try(local.config.auth.service_account, null)

  # The Firestore field the store writes a document's expiry to. Keep in sync with
  # pubsub_filter.backends.stores.TTL_FIELD (tests/unit/test_infra_wiring.py checks it).
  ttl_field = "expires_at"

  # Every other top-level field the store writes to a key's document. The store reads
  # documents by id only, so none of them needs an index, and an indexed monotonically
  # increasing value (forwarded_at, publish_time, lease.expires_at) caps the collection
  # near 500 writes/s. Each is exempt from indexing (firestore.tf); a map's exemption
  # covers its subfields. Keep in sync with pubsub_filter.backends.stores.firestore.to_document
  # (tests/unit/test_infra_wiring.py writes a document and compares).
  store_unindexed_fields = [
    "route", "key", "fingerprint", "forwarded_at", "message_id", "publish_time", "recent", "fence", "lease", "rows",
    "full_fingerprint", "results", "selection",
  ]

  # One entry per route. The subscription name is the route's `subscription` (the filter
  # rejects pushes from any other subscription when it is set), else `<name>-<route>`.
  subscriptions = {
    for r in local.config.routes : r.name => (
      try(r.subscription, null) != null ? element(split("/", r.subscription), length(split("/", r.subscription)) - 1) : "${var.name}-${r.name}"
    )
  }
  # Dead letters are `<subscription>-dlq` with a pull subscription `<subscription>-dlq-sub`: the
  # names `pubsub-filter provision` uses and `pubsub-filter replay --config --route` looks for.
  routes = {
    for r in local.config.routes : r.name => {
      name         = r.name
      subscription = local.subscriptions[r.name]
      source_topic = lookup(var.source_topics, r.name, null)
      destination  = r.destination
      dead_letter  = "${local.subscriptions[r.name]}-dlq"
      push_format  = try(r.push_format, null) != null ? r.push_format : "wrapped"
    }
  }

  # Destination topics, deduplicated (several routes may feed one topic). A destination
  # is a topic name in publisher.project, or a full projects/P/topics/T id.
  destinations = {
    for d in distinct([for r in local.config.routes : r.destination]) : d => {
      project = can(regex("^projects/[^/]+/topics/[^/]+$", d)) ? split("/", d)[1] : local.publisher_project
      name    = can(regex("^projects/[^/]+/topics/[^/]+$", d)) ? split("/", d)[3] : d
    }
  }

  # --- timing rules ------------------------------------------------------------------
  #
  # ack deadline: the subscription's ack_deadline_seconds is the config's
  # lease.ack_deadline (Pub/Sub accepts 10..600). The config already guarantees
  # lease.duration > lease.ack_deadline > lease.heartbeat.
  ack_deadline_seconds = ceil(local.lease.ack_deadline)

  # max delivery attempts: while another version of the same key is in flight the filter
  # answers 503 (`contended`), and it keeps doing so for at most one lease duration (the
  # holder commits, releases, or its lease expires and is taken over). Pub/Sub spaces
  # retries by at least minimum_backoff, so contention alone can use up
  # ceil(lease.duration / minimum_backoff) attempts. The dead-letter policy must allow
  # that many plus a margin for ordinary failures, or a message that was merely waiting
  # its turn would be dead-lettered. Pub/Sub accepts 5..100, hence the clamp; a
  # configuration whose floor exceeds 100 fails a precondition (pubsub.tf; raise minimum_backoff).
  minimum_backoff_seconds        = tonumber(trimsuffix(var.minimum_backoff, "s"))
  contention_attempts            = ceil(local.lease.duration / local.minimum_backoff_seconds)
  required_delivery_attempts     = local.contention_attempts + var.delivery_attempts_margin
  computed_max_delivery_attempts = min(100, max(5, local.required_delivery_attempts))
  max_delivery_attempts          = coalesce(var.max_delivery_attempts, local.computed_max_delivery_attempts)

  # Cloud Run request timeout: a push request may hold its lease (heartbeat-extended)
  # for up to lease.duration while the publish is retried; the request must be allowed
  # to live that long, plus room to commit and answer. Cloud Run allows up to 3600s.
  request_timeout_seconds = min(3600, max(var.request_timeout_seconds, ceil(local.lease.duration) + 30))
}
