# The decisions table: one row per decision, partitioned by day on `time` (partitions
# expire after records.partition_expiration_days) and clustered by route and decision,
# so a skip-rate query over a few days reads a few partitions. The schema lives in
# decisions_schema.json, which the Python side reads too.

resource "google_bigquery_dataset" "records" {
  count = local.records_backend == "bigquery" ? 1 : 0

  project       = local.records_project
  dataset_id    = local.records_dataset
  location      = local.records_location
  friendly_name = "pubsub-filter decisions"
  description   = "Decision records written by pubsub-filter (${var.name})."
  labels        = var.labels

  delete_contents_on_destroy = false

  dynamic "default_encryption_configuration" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      kms_key_name = default_encryption_configuration.value
    }
  }
}

resource "google_bigquery_table" "decisions" {
  count = local.records_backend == "bigquery" ? 1 : 0

  project             = local.records_project
  dataset_id          = google_bigquery_dataset.records[0].dataset_id
  table_id            = local.records_table
  description         = "One row per pubsub-filter decision (route, decision, fingerprints, latency)."
  labels              = var.labels
  deletion_protection = var.deletion_protection

  schema = file("${path.module}/decisions_schema.json")

  time_partitioning {
    type          = "DAY"
    field         = "time"
    expiration_ms = local.records_partition_expiration_days * 86400000
  }

  clustering = ["route", "decision"]

  dynamic "encryption_configuration" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      kms_key_name = encryption_configuration.value
    }
  }
}
