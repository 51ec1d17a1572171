variable "project" {
  description = "Project to deploy into (Cloud Run, subscriptions, dead-letter topics, secret, service accounts, monitoring)."
  type        = string
}

variable "region" {
  description = "Cloud Run region."
  type        = string
  default     = "us-west2"
}

variable "name" {
  description = "Base name of the service and of everything created for it."
  type        = string
  default     = "pubsub-filter"
}

variable "config_path" {
  description = "Path to the pubsub-filter YAML config, relative to this directory (the one the service will run with)."
  type        = string
  default     = "example-config.yaml"
}

variable "image" {
  description = "pubsub-filter container image, pinned by digest (see README: build and push)."
  type        = string
}

variable "source_topics" {
  description = "Route name -> raw topic feeding it (a name in `project` or projects/P/topics/T). One entry per route in the config."
  type        = map(string)
}

variable "labels" {
  description = "Labels for every resource that takes them."
  type        = map(string)
  default     = { app = "pubsub-filter" }
}

variable "enable_apis" {
  description = "Enable the Google APIs the deployment uses (never disabled on destroy)."
  type        = bool
  default     = true
}

variable "concurrency" {
  description = "Maximum concurrent push requests per instance."
  type        = number
  default     = 40
}

variable "min_instances" {
  description = "Minimum Cloud Run instances (1 avoids cold starts)."
  type        = number
  default     = 1
}

variable "max_instances" {
  description = "Maximum Cloud Run instances."
  type        = number
  default     = 10
}

variable "cpu" {
  description = "vCPU limit per instance."
  type        = string
  default     = "1"
}

variable "memory" {
  description = "Memory limit per instance."
  type        = string
  default     = "512Mi"
}

variable "ingress" {
  description = "Cloud Run ingress (internal-only still admits same-project Pub/Sub push)."
  type        = string
  default     = "INGRESS_TRAFFIC_INTERNAL_ONLY"
}

variable "deletion_protection" {
  description = "Protect the service and the decisions table from destroy."
  type        = bool
  default     = true
}

variable "create_destination_topics" {
  description = "Create the routes' destination topics (false when downstream already owns them)."
  type        = bool
  default     = true
}

variable "minimum_backoff" {
  description = "Push retry minimum backoff, e.g. \"10s\" (also sizes max_delivery_attempts)."
  type        = string
  default     = "10s"
}

variable "maximum_backoff" {
  description = "Push retry maximum backoff, e.g. \"600s\"."
  type        = string
  default     = "600s"
}

variable "notification_channels" {
  description = "Monitoring notification channel ids for the alerts."
  type        = list(string)
  default     = []
}

variable "skip_rate_threshold" {
  description = "Alert when a route's skip rate stays below this fraction over the window (6 h)."
  type        = number
  default     = 0.3
}

variable "skip_rate_thresholds" {
  description = "Per-route skip-rate thresholds (route -> fraction; 0 disables the alert for that route)."
  type        = map(number)
  default     = {}
}

variable "contention_per_hour_threshold" {
  description = "Alert when a route has more contended (503) decisions than this in an hour."
  type        = number
  default     = 10
}

variable "push_overloaded_per_hour_threshold" {
  description = "Alert when a route has more pushes answered 429 undecided (the instance at server.max_bytes_in_flight for server.admission_wait) than this in an hour."
  type        = number
  default     = 30
}

variable "heartbeat_failures_per_hour_threshold" {
  description = "Alert when more lease heartbeats than this fail in an hour."
  type        = number
  default     = 5
}

variable "enable_message_ordering" {
  description = "Deliver each entity's messages in publish order on the push subscriptions (needs an ordering key per entity on the source messages)."
  type        = bool
  default     = true
}

variable "lease_takeovers_per_hour_threshold" {
  description = "Alert when more than this many leases are taken over (held past their expiry) in an hour."
  type        = number
  default     = 3
}

variable "dead_letter_backlog_threshold" {
  description = "Alert when a route's dead-letter subscription holds more than this many messages (0 = any)."
  type        = number
  default     = 0
}

variable "oldest_unacked_age_threshold_seconds" {
  description = "Alert when a route's source subscription has an unacked message older than this many seconds for 5 minutes."
  type        = number
  default     = 1800
}

variable "publish_failures_threshold" {
  description = "Alert when a route has more unconfirmed publishes than this in 5 minutes."
  type        = number
  default     = 5
}

variable "store_unavailable_threshold" {
  description = "Alert when a route logs more store_unavailable lines than this in 5 minutes."
  type        = number
  default     = 5
}

variable "decision_log_sink" {
  description = "Also route every decision log line to BigQuery with a Cloud Logging sink, so that no decision row is lost to a SIGKILL or out-of-memory kill (see the module's variable)."
  type        = bool
  default     = false
}

variable "decision_log_dataset" {
  description = "The dataset the decision-line sink writes to. Null: <name>_decision_lines, with dashes as underscores."
  type        = string
  default     = null
}
