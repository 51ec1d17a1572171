# The decisions table: one row per decision, partitioned by day on `time` (partitions
# expire after records.partition_expiration_days) and clustered by route and decision,
# so a skip-rate query over a few days reads a few partitions. The schema lives in
# decisions_schema.json, which the Python side reads too.

# Both datasets of the module are one resource (`local.datasets`, config.tf).
resource "google_bigquery_dataset" "dataset" {
  for_each = local.datasets

  project       = each.value.project
  dataset_id    = each.value.dataset_id
  location      = each.value.location
  friendly_name = each.value.name
  description   = each.value.description
  labels        = var.labels

  delete_contents_on_destroy = false

  dynamic "default_encryption_configuration" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      kms_key_name = default_encryption_configuration.value
    }
  }
}

# Deployments made before the two were one resource keep their datasets (and their data).
moved {
  from = google_bigquery_dataset.records[0]
  to   = google_bigquery_dataset.dataset["records"]
}

moved {
  from = google_bigquery_dataset.decision_lines[0]
  to   = google_bigquery_dataset.dataset["decision_lines"]
}

resource "google_bigquery_table" "decisions" {
  count = local.records_backend == "bigquery" ? 1 : 0

  project             = local.records_project
  dataset_id          = google_bigquery_dataset.dataset["records"].dataset_id
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
