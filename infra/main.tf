# Root example: one pubsub-filter deployment from one config file.
#
#   terraform init
#   terraform apply -var-file=prod.tfvars
#
# The config file is the one the service runs with: Terraform reads it here to provision
# per-route resources and stores it as the secret the service mounts.

provider "google" {
  project = var.project
  region  = var.region
}

locals {
  config_yaml = file(var.config_path)
  config      = yamldecode(local.config_yaml)
}

resource "google_project_service" "apis" {
  for_each = var.enable_apis ? toset([
    "bigquery.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
  ]) : toset([])

  project            = var.project
  service            = each.value
  disable_on_destroy = false
}

module "pubsub_filter" {
  source = "./modules/pubsub-filter"

  project       = var.project
  region        = var.region
  name          = var.name
  image         = var.image
  config_yaml   = local.config_yaml
  source_topics = var.source_topics
  labels        = var.labels

  concurrency               = var.concurrency
  min_instances             = var.min_instances
  max_instances             = var.max_instances
  cpu                       = var.cpu
  memory                    = var.memory
  ingress                   = var.ingress
  deletion_protection       = var.deletion_protection
  create_destination_topics = var.create_destination_topics

  minimum_backoff         = var.minimum_backoff
  enable_message_ordering = var.enable_message_ordering
  maximum_backoff         = var.maximum_backoff

  notification_channels                 = var.notification_channels
  skip_rate_threshold                   = var.skip_rate_threshold
  skip_rate_thresholds                  = var.skip_rate_thresholds
  contention_per_hour_threshold         = var.contention_per_hour_threshold
  push_overloaded_per_hour_threshold    = var.push_overloaded_per_hour_threshold
  heartbeat_failures_per_hour_threshold = var.heartbeat_failures_per_hour_threshold
  lease_takeovers_per_hour_threshold    = var.lease_takeovers_per_hour_threshold
  dead_letter_backlog_threshold         = var.dead_letter_backlog_threshold
  oldest_unacked_age_threshold_seconds  = var.oldest_unacked_age_threshold_seconds
  publish_failures_threshold            = var.publish_failures_threshold
  store_unavailable_threshold           = var.store_unavailable_threshold

  decision_log_sink    = var.decision_log_sink
  decision_log_dataset = var.decision_log_dataset

  depends_on = [google_project_service.apis]
}
