# --- what and where ------------------------------------------------------------------

variable "project" {
  description = "Project that hosts the Cloud Run service, the push and dead-letter subscriptions, the dead-letter topics, the secret, the service accounts and the monitoring. The config's own `project`, `store.project`, `publisher.project` and `records.project` (when set) say where Firestore, the destination topics and BigQuery live."
  type        = string
}

variable "region" {
  description = "Cloud Run region, e.g. us-west2. Also the BigQuery dataset location when the config's records.location is unset."
  type        = string
}

variable "name" {
  description = "Base name of everything created: the Cloud Run service, the `<name>-config` secret, the `<name>-run` and `<name>-push` service accounts, the `<name>/...` log-based metrics and the default subscription names `<name>-<route>`."
  type        = string
  default     = "pubsub-filter"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,20}[a-z0-9]$", var.name))
    error_message = "name must be 2-22 characters of lowercase letters, digits and hyphens (it prefixes service-account ids, which are at most 30 characters)."
  }
}

variable "config_yaml" {
  description = "Text of the pubsub-filter YAML config (pass `file(\"filter.yaml\")`). Terraform decodes it to provision one push subscription, dead-letter topic and dead-letter subscription per route, the destination topics, the Firestore TTL policy and the BigQuery table; the same text is stored as a Secret Manager secret version and mounted into the service at /etc/pubsub-filter/filter.yaml. Validate it first with `pubsub-filter check --for cloud-run filter.yaml`: Terraform only reads the keys it needs, and refuses the embedded backends (files inside the instance, lost on Cloud Run)."
  type        = string

  validation {
    condition     = can(yamldecode(var.config_yaml).routes[0].name)
    error_message = "config_yaml must be YAML with a non-empty `routes` list whose entries have a `name`."
  }

  # The embedded backends (the config's defaults) are files inside the instance: on Cloud Run they
  # are lost with it and never shared, and the outbox's forwards never reach Pub/Sub though their
  # messages are acked. `pubsub-filter serve` refuses them there (filter/pubsub_filter/runtime/durability.py),
  # and so does plan, before anything is deployed. A missing section or `backend` is the embedded one.
  validation {
    condition = !can(yamldecode(var.config_yaml).routes) || alltrue([
      coalesce(try(yamldecode(var.config_yaml).store.backend, null), "sqlite") == "firestore",
      coalesce(try(yamldecode(var.config_yaml).publisher.backend, null), "outbox") == "pubsub",
      coalesce(try(yamldecode(var.config_yaml).records.backend, null), "sqlite") == "bigquery",
    ])
    error_message = join(" ", concat(
      ["The config runs embedded backends, files inside the instance that Cloud Run loses with it (check it with: pubsub-filter check --for cloud-run)."],
      coalesce(try(yamldecode(var.config_yaml).store.backend, null), "sqlite") == "firestore" ? [] : ["The state in a SQLite file is lost and never shared between instances; fix: `store: {backend: firestore}`."],
      coalesce(try(yamldecode(var.config_yaml).publisher.backend, null), "outbox") == "pubsub" ? [] : ["The outbox's forwards never reach Pub/Sub, though their messages are acked; fix: `publisher: {backend: pubsub}`."],
      coalesce(try(yamldecode(var.config_yaml).records.backend, null), "sqlite") == "bigquery" ? [] : ["The decision records in a SQLite file are lost and unreadable; fix: `records: {backend: bigquery}`."],
      ["examples/cloud-run.yaml and infra/example-config.yaml have all three."],
    ))
  }
}

variable "source_topics" {
  description = "Route name -> the raw topic that feeds it: a topic name in `project`, or a full `projects/P/topics/T` id for a topic in another project. Every route in the config needs an entry. (The topics are not created here: the scrapers and raw processors own them.)"
  type        = map(string)
}

variable "labels" {
  description = "Labels put on every resource that takes labels."
  type        = map(string)
  default     = {}
}

# --- the Cloud Run service -------------------------------------------------------------

variable "image" {
  description = "Container image of pubsub-filter, preferably pinned by digest: REGION-docker.pkg.dev/PROJECT/REPO/pubsub-filter@sha256:..."
  type        = string
}

variable "concurrency" {
  description = "Maximum concurrent push requests per instance. Each one holds at most one lease while it publishes; the work is mostly waiting on Firestore and Pub/Sub, so one vCPU handles tens of requests. A route with coalesce holds one request per hot key open for up to its max_wait: add the hot keys an instance holds at once (docs/deploying.md, Held requests)."
  type        = number
  default     = 40

  validation {
    condition     = var.concurrency >= 1 && var.concurrency <= 1000
    error_message = "concurrency must be between 1 and 1000."
  }
}

variable "min_instances" {
  description = "Minimum instances kept warm. 1 avoids a cold start (and so a push timeout) after quiet periods."
  type        = number
  default     = 1
}

variable "max_instances" {
  description = "Maximum instances. Bounds the Firestore write rate and the cost of a redelivery storm."
  type        = number
  default     = 10
}

variable "cpu" {
  description = "vCPU limit per instance (Cloud Run syntax: \"1\", \"2\", \"1000m\")."
  type        = string
  default     = "1"
}

variable "memory" {
  description = "Memory limit per instance (Cloud Run syntax: \"512Mi\", \"1Gi\"). The BigQuery record buffer holds up to records.max_buffer rows. 512Mi fits the config's default server.max_bytes_in_flight (64 MiB) with messages of up to 10 MB at any concurrency: raise both together (docs/deploying.md, \"Large messages\")."
  type        = string
  default     = "512Mi"
}

variable "cpu_always_allocated" {
  description = "Keep CPU allocated between requests (instance-based billing). The lease heartbeat and the batched BigQuery writes run off the request path and starve when CPU is throttled, so this is true unless records are not on BigQuery and you accept late heartbeats."
  type        = bool
  default     = true
}

variable "request_timeout_seconds" {
  description = "Lower bound for the Cloud Run request timeout. The timeout actually set is max(this, ceil(lease.duration) + 30), capped at 3600: a request must be able to live as long as the lease it holds, or Cloud Run would cut a publish that the lease still protects."
  type        = number
  default     = 60
}

variable "ingress" {
  description = "Cloud Run ingress. INGRESS_TRAFFIC_INTERNAL_ONLY still admits push requests from Pub/Sub subscriptions in the same project (or VPC-SC perimeter), which is all the filter needs."
  type        = string
  default     = "INGRESS_TRAFFIC_INTERNAL_ONLY"

  validation {
    condition     = contains(["INGRESS_TRAFFIC_ALL", "INGRESS_TRAFFIC_INTERNAL_ONLY", "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"], var.ingress)
    error_message = "ingress must be INGRESS_TRAFFIC_ALL, INGRESS_TRAFFIC_INTERNAL_ONLY or INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER."
  }
}

variable "service_account_email" {
  description = "Existing service account the service runs as. Null creates `<name>-run@<project>.iam.gserviceaccount.com`."
  type        = string
  default     = null
}

variable "push_service_account_email" {
  description = "Existing service account whose OIDC token Pub/Sub attaches to push requests. Null creates `<name>-push@<project>.iam.gserviceaccount.com`. When the config sets auth.service_account it must be this account."
  type        = string
  default     = null
}

variable "deletion_protection" {
  description = "Protect the Cloud Run service and the BigQuery table from `terraform destroy`. Set false (and apply) before destroying a test deployment."
  type        = bool
  default     = true
}

# --- subscriptions -------------------------------------------------------------------

variable "minimum_backoff" {
  description = "Pub/Sub retry policy minimum backoff for the push subscriptions (a duration such as \"10s\", 0-600s). Also the unit of the max-delivery-attempts rule: a 503 for a contended key comes back no sooner than this."
  type        = string
  default     = "10s"

  validation {
    condition     = try(endswith(var.minimum_backoff, "s") && tonumber(trimsuffix(var.minimum_backoff, "s")) >= 1 && tonumber(trimsuffix(var.minimum_backoff, "s")) <= 600, false)
    error_message = "minimum_backoff must be seconds with an s suffix, between 1s and 600s (below 1s the delivery-attempt rule cannot be met)."
  }
}

variable "maximum_backoff" {
  description = "Pub/Sub retry policy maximum backoff for the push subscriptions (a duration such as \"600s\", at most 600s)."
  type        = string
  default     = "600s"

  validation {
    condition     = try(endswith(var.maximum_backoff, "s") && tonumber(trimsuffix(var.maximum_backoff, "s")) > 0 && tonumber(trimsuffix(var.maximum_backoff, "s")) <= 600, false)
    error_message = "maximum_backoff must be seconds with an s suffix, at most 600s."
  }
}

variable "delivery_attempts_margin" {
  description = "Attempts added on top of ceil(lease.duration / minimum_backoff) in max_delivery_attempts, for failures that are not contention (a publish that failed, a store that timed out under on_store_error = retry, an instance that stopped)."
  type        = number
  default     = 5
}

variable "max_delivery_attempts" {
  description = "Override of the computed max_delivery_attempts (null = computed; see the rule in config.tf and the README). Pub/Sub accepts 5 to 100; a value below the contention floor is refused by a check."
  type        = number
  default     = null

  validation {
    condition     = var.max_delivery_attempts == null ? true : (var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100)
    error_message = "max_delivery_attempts must be between 5 and 100 (Pub/Sub's limits)."
  }
}

variable "message_retention_duration" {
  description = "How long the push subscriptions keep unacked messages (at most 604800s = 7 days)."
  type        = string
  default     = "604800s"
}

variable "dead_letter_retention_duration" {
  description = "How long the dead-letter subscriptions keep what they hold, for `pubsub-filter replay` (at most 604800s = 7 days on a subscription)."
  type        = string
  default     = "604800s"
}

variable "create_destination_topics" {
  description = "Create the destination topics (routes[].destination). False when the downstream phases already own them: the service account is then only granted publish on them."
  type        = bool
  default     = true
}

variable "kms_key_name" {
  description = "Optional Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) for customer-managed encryption of the topics this module creates and of the BigQuery dataset and table. Null keeps Google-managed encryption."
  type        = string
  default     = null
}

# --- Firestore / BigQuery ----------------------------------------------------------------

variable "manage_firestore_ttl" {
  description = "Create the Firestore TTL policy on `expires_at` in store.collection when the config's store is Firestore. The Firestore database itself must already exist."
  type        = bool
  default     = true
}

# --- monitoring ------------------------------------------------------------------------

variable "notification_channels" {
  description = "Monitoring notification channel ids (projects/P/notificationChannels/N) that the alert policies notify."
  type        = list(string)
  default     = []
}

variable "skip_rate_threshold" {
  description = "Alert when a route's skip rate ((suppressed + duplicate + stale) / decided, as in `pubsub-filter skip-rate`) stays below this fraction over skip_rate_window. The seed notes target 0.6-0.9 for injury reports and props; a sharp drop usually means a new volatile field is being fingerprinted."
  type        = number
  default     = 0.3

  validation {
    condition     = var.skip_rate_threshold >= 0 && var.skip_rate_threshold <= 1
    error_message = "skip_rate_threshold is a fraction between 0 and 1."
  }
}

variable "skip_rate_thresholds" {
  description = "Per-route override of skip_rate_threshold (route name -> fraction). 0 turns the skip-rate alert off for that route, e.g. one whose bypass rules forward most messages by design."
  type        = map(number)
  default     = {}
}

variable "skip_rate_window" {
  description = "Window over which the skip rate is computed for the alert, in seconds with an s suffix (e.g. \"21600s\" = 6 h; long enough to hold several scrape cycles)."
  type        = string
  default     = "21600s"

  validation {
    condition     = try(endswith(var.skip_rate_window, "s") && tonumber(trimsuffix(var.skip_rate_window, "s")) >= 60 && tonumber(trimsuffix(var.skip_rate_window, "s")) <= 86400, false)
    error_message = "skip_rate_window must be seconds with an s suffix, between 60s and 86400s."
  }
}

variable "contention_per_hour_threshold" {
  description = "Alert when one route has more than this many `contended` decisions (503: another version of the key in flight) in an hour."
  type        = number
  default     = 10
}

variable "push_overloaded_per_hour_threshold" {
  description = "Alert when one route has more than this many pushes answered 429 undecided (`failed`, cause `overloaded`: the instance at server.max_bytes_in_flight for server.admission_wait) in an hour."
  type        = number
  default     = 30
}

variable "heartbeat_failures_per_hour_threshold" {
  description = "Alert when the service logs more than this many `heartbeat_failed` lines in an hour."
  type        = number
  default     = 5
}

variable "lease_takeovers_per_hour_threshold" {
  description = "Alert when the service logs more than this many `lease_taken_over` lines (leases held past their expiry) in an hour."
  type        = number
  default     = 3
}

variable "fail_open_threshold" {
  description = "Alert when a route has more than this many `fail_open` decisions (forwarded because the store was unreachable) in 5 minutes. 0 = any."
  type        = number
  default     = 0
}

variable "alert_auto_close" {
  description = "How long an open incident stays open after its condition stops being met."
  type        = string
  default     = "3600s"
}

variable "enable_message_ordering" {
  description = "Deliver each entity's messages in publish order on the push subscriptions (needs an ordering key per entity on the source messages). Recommended: it is what makes the newest version the last one downstream."
  type        = bool
  default     = true
}

variable "dead_letter_backlog_threshold" {
  description = "Alert when a route's dead-letter subscription (<subscription>-dlq-sub) holds more than this many messages. 0 = any: each one ran out of delivery attempts and waits for `pubsub-filter replay`."
  type        = number
  default     = 0
}

variable "oldest_unacked_age_threshold_seconds" {
  description = "Alert when the oldest unacked message on a route's source subscription has been older than this many seconds for 5 minutes (the service is not keeping up, or a message is retried again and again)."
  type        = number
  default     = 1800
}

variable "publish_failures_threshold" {
  description = "Alert when a route has more than this many unconfirmed publishes to its destination topic in 5 minutes (log-based metric publish_failures)."
  type        = number
  default     = 5
}

variable "store_unavailable_threshold" {
  description = "Alert when a route logs more than this many `store_unavailable` lines (store calls failed or over store_errors.budget) in 5 minutes."
  type        = number
  default     = 5
}

variable "decision_log_sink" {
  description = "Also route every decision log line to BigQuery with a Cloud Logging sink (a dataset of its own). Cloud Logging has each line once the process wrote it, before its answer: a SIGKILL or out-of-memory kill, which can lose the decision rows still batched for BigQuery (at most records.flush_interval of them), loses none of these."
  type        = bool
  default     = false
}

variable "decision_log_dataset" {
  description = "The dataset the decision-line sink writes to (created in var.project and var.region). Null: <name>_decision_lines, with dashes as underscores."
  type        = string
  default     = null
}
